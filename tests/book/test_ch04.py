"""The helpers of the chapter on ALiBi and Sandwich (book/04): figures whose legends hide
no data, heads numbered from 1, and the readers its findings go through (the probe distance
by distance, the whole curve beside the context measure, a gap per seed)."""

from __future__ import annotations

import pytest
import torch
from conftest import legends_off_the_panels

import relbias
from relbias.book import figures as fg
from relbias.book import plots, sweeps
from relbias.lab import readings, stats
from relbias.lab.results import describe


def test_alibi_slopes_figure_keeps_legends_off_the_panels_and_draws_every_count():
    fig = fg.plot_alibi_slopes(head_counts=(4, 6, 8, 12, 16))
    assert legends_off_the_panels(fig)
    right = fig.axes[1]
    # one row per head count: every slope of every count is a point of its own row
    points = {}
    for line in right.get_lines():
        xs, ys = line.get_data()
        for x, y in zip(xs, ys):
            points.setdefault(int(y), []).append(float(x))
    for row, n in enumerate((4, 6, 8, 12, 16)):
        assert sorted(points[row]) == sorted(relbias.alibi_slopes(n).tolist())


def test_recency_weights_label_each_head_with_its_reach():
    slopes = relbias.alibi_slopes(8)
    fig = fg.plot_recency_weights({"paper": slopes}, 64)
    spans = fg.attention_span(slopes, 64)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == [f"k={k + 1}: 90 % in {s} keys" for k, s in enumerate(spans)]
    assert legends_off_the_panels(fig)


def test_legend_below_moves_every_legend_off_the_panels():
    fig = plots.plot_bias_by_offset(
        {"a": relbias.Sandwich(4, dim=16), "b": relbias.ALiBi(4)},
        64,
        reference={"ALiBi": relbias.ALiBi(2)},
    )
    assert fig.axes[0].get_legend() is not None
    assert fg.legend_below(fig, ncol=5) is fig
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "ALiBi",
        "head 0",
        "head 1",
        "head 2",
        "head 3",
    ]
    assert legends_off_the_panels(fig)


def test_legend_below_each_keeps_one_legend_per_panel():
    fig, axes = plots.figure(6, 3, ncols=2)
    for ax, name in zip(axes.flat, ("x", "y")):
        ax.plot(torch.arange(5), torch.arange(5), label=f"{name} line")
        ax.legend()
    fg.legend_below(fig, each=True)
    assert not fig.legends
    assert [ax.get_legend().get_texts()[0].get_text() for ax in axes.flat] == ["x line", "y line"]
    assert legends_off_the_panels(fig)


def test_describe_reads_a_probe_ablation():
    """An ablation on the recall probe has no text bytes: describe gives its probe fields."""
    config = {"steps": 3000, "train_len": 128, "probe_steps": 3000}
    rows = [{"length": 128, "distance": 3, "accuracy": 0.8, "samples": 100}]
    results = {
        "kind": "ablation",
        "ablation": "alibi_probe",
        "seeds": [0, 1, 2],
        "methods": {"alibi": {"eval": rows}},
        "provenance": {"config": config, "commit": "abcdef0123", "wall_s": 600},
    }
    info = describe(results)
    assert info["samples"] == 100 and info["probe_steps"] == 3000 and "eval_kb" not in info


# --- the helpers the chapter's findings read (relbias.book.sweeps) -----------------------------


def _probe(accuracies: dict) -> dict:
    """A stored probe in the sweeps' shape: ``{method: {seed: {(length, distance): acc}}}``."""
    methods = {}
    for method, seeds in accuracies.items():
        records = {
            str(s): {
                "eval": [
                    {"length": n, "distance": d, "accuracy": a, "samples": 100}
                    for (n, d), a in sorted(table.items())
                ]
            }
            for s, table in seeds.items()
        }
        first = next(iter(records.values()))["eval"]
        methods[method] = {"eval": first, "seeds": records}
    return {"kind": "retrieval", "methods": methods}


def test_probe_readers_pair_one_model_read_at_two_distances():
    results = _probe(
        {
            "a": {
                0: {(8, 1): 0.9, (8, 2): 0.8, (8, 6): 0.2},
                1: {(8, 1): 1.0, (8, 2): 0.7, (8, 6): 0.3},
                2: {(8, 1): 0.8, (8, 2): 0.9, (8, 6): 0.1},
            }
        }
    )
    assert sweeps.probe_distances(results, "a", 8) == [1, 2, 6]
    values, samples, distance = sweeps.probe_accuracies(results, "a", 8)
    assert values == [0.2, 0.3, 0.1] and samples == 100 and distance == 6
    far, near, error = sweeps.distance_pair(results, "a", 8, None, 1)
    assert far == [0.2, 0.3, 0.1] and near == [0.9, 1.0, 0.8]
    assert error == pytest.approx(stats.probe_error(far, 100, minus=near))
    assert stats.verdict(far, near, paired=True, error=error)["answer"] == "lower"
    pooled, n = sweeps.pooled_accuracies(results, "a", 8, max_distance=2)
    assert pooled == pytest.approx([0.85, 0.85, 0.85]) and n == 200
    with pytest.raises(ValueError, match="distance must be one of"):
        sweeps.probe_accuracies(results, "a", 8, 3)
    with pytest.raises(ValueError, match="length 16"):
        sweeps.probe_distances(results, "a", 16)


def _text(curves: dict, context: dict | None = None) -> dict:
    """A stored text sweep: ``{method: {seed: ([bpb at 1x, 2x], [(step, val bpb)])}}`` and,
    per method and seed, a context-use difference (long minus sliding) at 2x."""
    methods = {}
    for method, seeds in curves.items():
        records = {}
        for s, (bpbs, val) in seeds.items():
            rows = [{"factor": f, "length": 8 * f, "bpb": b} for f, b in zip((1, 2), bpbs)]
            if context is not None:
                diff = context[method][s]
                rows[-1]["context"] = {
                    "difference": diff,
                    "difference_by_span": [diff - 0.01, diff + 0.01, diff],
                    "long_bpb": 1.0,
                    "sliding_bpb": 1.0 - diff,
                    "stride": 1,
                    "window": 8,
                }
            records[str(s)] = {
                "eval": rows,
                "train": {"val_curve": [{"step": t, "bpb": v} for t, v in val]},
            }
        summary = [
            {
                "factor": f,
                "length": 8 * f,
                "bpb": sum(r["eval"][i]["bpb"] for r in records.values()) / len(records),
                "bpb_low": 0.0,
                "bpb_high": 9.0,
                "n": len(records),
            }
            for i, f in enumerate((1, 2))
        ]
        methods[method] = {"eval": summary, "seeds": records}
    return {"kind": "extrapolation", "methods": methods, "provenance": {"config": {"steps": 7}}}


def test_gap_by_seed_pairs_the_validation_curves_of_one_seed():
    curves = {
        "a": {0: ([2.0, 1.9], [(1, 3.0), (2, 2.5)]), 1: ([2.1, 2.0], [(1, 3.2), (2, 2.6)])},
        "b": {0: ([1.9, 1.8], [(1, 2.8), (2, 2.4)]), 1: ([2.0, 1.9], [(1, 3.0), (2, 2.4)])},
    }
    results = _text(curves)
    assert sweeps.gap_by_seed(results, "a", ["b"]) == pytest.approx([0.1, 0.2])
    assert sweeps.gap_by_seed(results, "a", ["b"], 1) == pytest.approx([0.2, 0.2])
    with pytest.raises(ValueError, match="step must be one of"):
        sweeps.gap_by_seed(results, "a", ["b"], 5)
    with pytest.raises(ValueError, match="besides"):
        sweeps.gap_by_seed(results, "a", ["a"])


def test_curve_context_table_reads_the_context_from_its_own_sweep(monkeypatch):
    seeds = {s: ([2.0 + 0.01 * s, 1.9 + 0.02 * s], [(1, 3.0)]) for s in range(3)}
    longest = _text({"a": seeds})
    with_context = _text({"a": seeds}, context={"a": {0: 0.2, 1: 0.25, 2: 0.22}})
    monkeypatch.setattr(sweeps, "_READ", {"long": longest, "short": with_context})
    assert sweeps.context_sweep_steps("a", ("long", "short")) == ("short", with_context, 7)
    with pytest.raises(ValueError, match="records the context measure of a"):
        sweeps.context_sweep_steps("a", ("long",))
    rows, headers = sweeps.curve_context_table(longest, ["a"], kinds=("long", "short"))
    assert headers[-1] == "far context" and rows[0][0] == "a"
    assert rows[0][3] == readings.method_curve(longest, "a")["answer"] == "improves"
    assert rows[0][-1] == "reads the far bytes worse" and rows[0][-2].endswith("(7 steps)")


def test_heads_from_one_numbers_titles_and_legends_from_one():
    fig = fg.heads_from_one(plots.plot_bias_matrix(relbias.ALiBi(4), 6, title="x"))
    assert [ax.get_title() for ax in fig.axes if ax.get_title()] == [
        "head 1",
        "head 2",
        "head 3",
        "head 4",
    ]
    fig = fg.heads_from_one(
        fg.legend_below(
            plots.plot_bias_by_offset(
                {"a": relbias.ALiBi(2)}, 8, reference={"ALiBi": relbias.ALiBi(2)}
            )
        )
    )
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["ALiBi", "head 1", "head 2"]


def test_stored_once_reads_each_sweep_once(monkeypatch):
    calls = []

    def load(kind):
        calls.append(kind)
        return {"kind": kind}

    monkeypatch.setattr(sweeps, "_READ", {})
    monkeypatch.setattr(sweeps, "load_stored", load)
    assert sweeps.stored_once("x") is sweeps.stored_once("x")
    assert sweeps.stored_once("y") == {"kind": "y"} and calls == ["x", "y"]


# --- the mechanism on trained models (relbias.book.heuristic_attention) -------------------------


def test_attention_by_offset_is_a_distribution_and_matches_the_formula_without_content():
    """With the query-key weights at zero every head attends by its bias alone: the reading
    by offset sums to 1 per head and equals the content-free share of the formula."""
    from relbias.book import heuristic_attention as ha
    from relbias.lab.config import get_config
    from relbias.lab.training import build_model

    cfg = get_config("quick").replace(train_len=16)
    model = build_model("alibi", cfg).eval()
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight[: 2 * cfg.dim].zero_()  # q = k = 0: no content score
    idx = torch.randint(0, 256, (2, 64), generator=torch.Generator().manual_seed(0))
    reading = ha.attention_by_offset(model, idx, 32)
    assert reading.shape == (cfg.depth, cfg.heads, 64)
    torch.testing.assert_close(reading.sum(-1), torch.ones(cfg.depth, cfg.heads).double())
    alone = ha.content_free_share(relbias.ALiBi(cfg.heads), 64, 32, 16)
    torch.testing.assert_close(ha.far_share(reading, 16)[0], alone)


def test_label_after_scaling_names_the_librarys_number():
    from relbias.book import heuristic_attention as ha

    fig = ha.label_after_scaling(plots.plot_bias_matrix(relbias.ALiBi(2), 6, title="x"))
    assert "PE(i, j)/√d" in [ax.get_ylabel() for ax in fig.axes]
    assert all(ax.get_ylabel() != "PE(i, j)" for ax in fig.axes)
