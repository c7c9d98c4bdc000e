"""Chapter 8's library changes: which run each number comes from, the context measure's
table, Table 2.4 read on whole curves, and figures whose labels say bytes and whose legends
sit off the data."""

from __future__ import annotations

import matplotlib
import pytest

from relbias.book import overview, side_by_side, sweeps
from relbias.lab import get_config, readings
from relbias.lab import plots as lab_plots
from relbias.lab.experiments import summarize_extrapolation
from relbias.lab.results import only

matplotlib.use("Agg")

FACTORS = (1, 2, 4)


def _record(bpbs, seed):
    curve = [{"step": s, "bpb": 3.0 - s / 1000 + 0.01 * seed} for s in (0, 500, 1000)]
    return {
        "params": 10,
        "train": {
            "steps": 1000,
            "final_loss_bits": 2.0,
            "wall_s": 1.0,
            "tokens_per_s": 1.0,
            "val_curve": curve,
        },
        "eval": [
            {
                "factor": f,
                "length": 16 * f,
                "bytes": 131072,
                "files": 20,
                "bpb": b,
                "loss_by_position": [b] * (16 * f),
            }
            for f, b in zip(FACTORS, bpbs)
        ],
    }


def _results(per_method, steps=1000):
    """A stored-format sweep from ``{method: [[bpb per factor] per seed]}``."""
    methods = {
        m: summarize_extrapolation({s: _record(b, s) for s, b in enumerate(seeds)})
        for m, seeds in per_method.items()
    }
    return {
        "kind": "extrapolation",
        "methods": methods,
        "seeds": [0, 1, 2],
        "provenance": {
            "config": {"name": "medium", "train_len": 16, "steps": steps},
            "wall_s": 60.0,
            "commit": "abc1234",
        },
    }


def _sweep(steps=1000):
    return _results(
        {
            "alibi": [[2.0, 1.9, 1.8], [2.1, 2.0, 1.9], [2.2, 2.1, 2.0]],  # improves
            "rope": [[1.0, 2.0, 3.0], [1.1, 2.2, 3.3], [0.9, 2.1, 3.1]],  # degrades
            "nope": [[2.0, 2.1, 1.9], [2.0, 1.9, 2.1], [2.0, 2.0, 2.0]],  # neither
        },
        steps,
    )


def _with_context(results, differences):
    """``results`` with every seed's longest row holding a context-use record whose
    long - sliding difference is ``differences[method][seed]`` (64 spans around it)."""
    for m, per_seed in differences.items():
        for s, diff in enumerate(per_seed):
            row = results["methods"][m]["seeds"][str(s)]["eval"][-1]
            spans = [diff + 0.01 * ((k % 5) - 2) for k in range(64)]
            row["context"] = {
                "window": 16,
                "stride": 2,
                "bytes": 1024,
                "long_bpb": 2.0 + diff,
                "sliding_bpb": 2.0,
                "difference": diff,
                "difference_by_span": spans,
            }
    return results


def test_run_rows_say_which_run_each_number_comes_from():
    res = _sweep(steps=5000)
    rows, headers = side_by_side.runs_rows(
        [
            side_by_side.live_row("live run", get_config("quick"), ["alibi", "t5"], "the demo"),
            side_by_side.run_row("longer sweep", res, "the curves"),
        ]
    )
    assert headers == side_by_side.RUN_HEADERS
    live, longer = rows
    assert live[:6] == ["live run", "quick", 64, "1,000", 1, 2]
    assert longer[3] == "5,000" and longer[4] == 3 and longer[5] == 3
    assert longer[6] == "no" and longer[-1] == "the curves"
    _with_context(res, {"alibi": [0.01, 0.02, 0.0]})
    assert side_by_side.run_row("x", res, "y")[6] == "1 of 3 methods"
    with pytest.raises(ValueError, match="columns"):
        side_by_side.runs_rows([["too short"]])


def test_context_rows_give_the_verdict_of_each_methods_sweep():
    res = _with_context(_sweep(), {"alibi": [0.001, -0.002, 0.0005], "rope": [0.9, 1.1, 1.0]})
    rows, headers = side_by_side.context_rows(["alibi", "rope"], sweep_for=lambda m: res)
    assert headers[0] == "method" and headers[-1] == "verdict"
    words = {r[0]: r[-1] for r in rows}
    assert words == {
        "alibi": "no use of the far context shown",
        "rope": "reads the far bytes worse",
    }
    assert rows[0][1] == "1,000"  # the steps of the sweep each row was read on
    assert rows[1][4] == sweeps.show_interval(readings.context_verdict(res, "rope"), 3)


def test_table_2_4_curves_read_the_whole_curve():
    res = _sweep()
    rows, headers = side_by_side.table_2_4_curves(only(res, ["rope", "alibi"]), get_config("quick"))
    assert headers[-1] == "the whole curve"
    assert [r[0] for r in rows] == ["rope", "alibi"]
    assert rows[0][-1] == sweeps.curve_words(readings.method_curve(res, "rope"))
    assert rows[0][-1] == "degrades" and rows[1][-1] == "improves"


def _legends_on_axes(fig):
    return [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]


def test_plot_sweep_says_bytes_and_keeps_its_legend_off_the_panels():
    fig = lab_plots.plot_sweep(_sweep(), ["alibi", "rope"])
    left, right = fig.axes
    assert "bytes" in left.get_xlabel()
    assert [t.get_text() for t in left.get_xticklabels()] == ["16", "32", "64"]
    assert not _legends_on_axes(fig), "no legend on a panel"
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["alibi", "rope"]
    assert len(right.get_ylabel()) < 40  # short enough not to run into the left panel


def test_plot_longer_training_labels_the_left_panel_only():
    short, longer = _sweep(), _sweep(steps=5000)
    fig = lab_plots.plot_longer_training(short, longer, [["alibi"], ["rope", "nope"]])
    assert fig.axes[0].get_ylabel() and not fig.axes[1].get_ylabel()


def test_plot_probe_puts_one_legend_below_the_panels():
    from relbias.lab.experiments import summarize_retrieval

    def rec(acc):
        return {
            "params": 1,
            "train": {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0},
            "eval": [
                {"length": n, "distance": d, "accuracy": acc, "samples": 10}
                for n in (16, 64)
                for d in (3, n - 2)
            ],
        }

    method = summarize_retrieval({0: rec(1.0), 1: rec(0.9), 2: rec(0.8)})
    res = {
        "kind": "retrieval",
        "methods": {"alibi": method, "nope": method},
        "seeds": [0, 1, 2],
        "provenance": {"config": {"train_len": 16, "steps": 1, "probe_steps": 5}},
    }
    fig = lab_plots.plot_probe(res, ["alibi", "nope"])
    assert len(fig.axes) == 2 and not _legends_on_axes(fig) and len(fig.legends) == 1


def test_plot_sweep_groups_says_bytes_and_puts_each_legend_below_its_panel():
    fig = overview.plot_sweep_groups(_sweep(), {"a": ("alibi",), "b": ("rope", "nope")})
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_xlabel() == "evaluation length (bytes)"
        legend = ax.get_legend()
        assert legend is not None
        below = legend.get_window_extent().y1 <= ax.get_window_extent().y0
        assert below, "the legend sits below its panel, off the data"


@pytest.mark.parametrize(
    ("name", "expected"),
    [("alibi", "2,047 per head"), ("fire", "MLP at 1,048,576 pairs"), ("nope", "none")],
)
def test_bias_values_computed_is_short(name, expected):
    assert overview.bias_values_computed(name, get_config("medium"), 1024) == expected


def test_table_2_4_reports_the_change_in_bits_with_short_headers():
    res = _sweep()
    res = {**res, "methods": {"alibi": res["methods"]["alibi"], "nope": res["methods"]["nope"]}}
    rows, headers = overview.table_2_4_rows(res, get_config("quick"))
    assert headers[-1] == "4x − 1x" and all(len(h) <= 20 for h in headers)
    alibi = rows[0]
    bpb = [r["bpb"] for r in res["methods"]["alibi"]["eval"]]
    assert alibi[0] == "alibi" and alibi[-1] == round(bpb[-1] - bpb[0], 2)
    assert alibi[3] == 0 and rows[1][3] == 0  # no learned positional parameters


# --- the split: the lesson's answer box, its figures, and what lives on which page ---------------

LABELS = {"curve": "sec-curve", "context": "sec-context", "recall": "sec-recall"}


def _probe(accuracy):
    from relbias.lab.experiments import summarize_retrieval

    def rec(acc, seed):
        return {
            "params": 1,
            "train": {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0},
            "eval": [
                {"length": n, "distance": d, "accuracy": acc + 0.01 * seed, "samples": 100}
                for n in (16, 64)
                for d in (3, n - 2)
            ],
        }

    return {
        "kind": "retrieval",
        "methods": {
            m: summarize_retrieval({s: rec(a, s) for s in range(3)}) for m, a in accuracy.items()
        },
        "seeds": [0, 1, 2],
        "provenance": {"config": {"train_len": 16, "steps": 1, "probe_steps": 5}},
    }


def test_answer_rows_link_every_verdict_and_give_a_mechanism():
    text = _with_context(
        _sweep(),
        {"alibi": [0.001, -0.002, 0.0005], "rope": [0.9, 1.1, 1.0], "nope": [0.5, 0.6, 0.55]},
    )
    probe = _probe({"alibi": 0.2, "rope": 0.85, "nope": 0.85})
    rows, headers = side_by_side.answer_rows(
        text, probe, ["alibi", "rope", "nope"], labels=LABELS, sweep_for=lambda m: text
    )
    assert headers[0] == "method" and len(headers) == 5
    by = {r[0]: r for r in rows}
    assert by["alibi"][1] == side_by_side.MECHANISM["alibi"]
    assert by["alibi"][2] == "{ref}`improves <sec-curve>`"
    assert by["rope"][2] == "{ref}`degrades <sec-curve>`"
    assert by["alibi"][3] == "{ref}`not shown: read as well without them <sec-context>`"
    assert by["rope"][3] == "{ref}`no: read worse with them <sec-context>`"
    assert by["alibi"][4] == "{ref}`lower than NoPE <sec-recall>`"
    assert by["rope"][4] == "{ref}`not told apart from NoPE <sec-recall>`"
    assert by["nope"][4] == "{ref}`(the reference) <sec-recall>`"


def test_every_method_of_the_sweeps_has_a_mechanism():
    from relbias.lab.model import BASELINE_POSITIONS, BIAS_POSITIONS

    assert set(side_by_side.MECHANISM) >= set(BIAS_POSITIONS) - {"forgetting"} | set(
        BASELINE_POSITIONS
    )


def test_curve_groups_follow_the_whole_curve():
    groups = side_by_side.curve_groups(_sweep(), ["rope", "alibi", "nope"])
    assert list(groups)[:2] == ["improves", "degrades"]
    assert groups["improves"] == ["alibi"] and groups["degrades"] == ["rope"]


def test_plot_curves_gives_each_panel_its_own_scale_and_says_bytes():
    res = _sweep()
    fig = side_by_side.plot_curves(res, {"a": ["alibi"], "b": ["rope"]})
    left, right = fig.axes
    assert "bytes" in left.get_xlabel() and left.get_ylabel() == "bits per byte"
    assert left.get_ylim()[1] < right.get_ylim()[1]  # not shared: the small one is not flattened


def test_rezoom_late_keeps_the_shorter_run_in_view():
    short, longer = _sweep(), _sweep(steps=5000)
    for res, top in ((short, 1000), (longer, 5000)):
        for m in res["methods"]:
            for rec in res["methods"][m]["seeds"].values():
                rec["train"]["val_curve"] = [
                    {"step": s, "bpb": 3.0 - s / top} for s in range(0, top + 1, top // 10)
                ]
    fig = lab_plots.plot_longer_training(short, longer, [["alibi"], ["rope", "nope"]])
    side_by_side.rezoom_late(fig)
    for ax in fig.axes:
        low, high = ax.get_ylim()
        assert high >= 3.0 - 0.2 and low <= 2.0  # the shorter run after its first fifth


def test_plot_t5_bias_draws_every_head_below_its_largest():
    def record(values):
        return {"learned_bias": {"values": values, "max_offset": len(values[0]) - 1}}

    res = {"methods": {"t5": {"seeds": {"0": record([[0.0, -1.0, -2.0], [1.0, 0.5, -1.0]])}}}}
    assert side_by_side.t5_tables(res) == [[[0.0, -1.0, -2.0], [0.0, -0.5, -2.0]]]
    fig = side_by_side.plot_t5_bias({"a": res, "b": res}, train_len=2, last_bucket=1)
    assert len(fig.axes) == 2 and "PE(i, j)" in fig.axes[0].get_ylabel()


def _markdown(name):
    import json
    from pathlib import Path

    nb = json.loads((Path(__file__).resolve().parents[2] / "book" / name).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def test_the_lesson_leads_with_the_answer_and_says_which_run():
    text = _markdown("08_side_by_side.ipynb")
    assert text.index("The answer") < text.index("## Learning goals")
    assert "{glue:md} ch8_answer" in text
    summary = text[text.index("## What to remember") : text.index("## Exercises")]
    far = next(b for b in summary.split("\n- ") if "far context" in b)
    assert "3,000 steps" in far  # the far-context bullet names the run it was measured on


def test_the_lab_notes_hold_every_label_of_the_old_page():
    text = _markdown("08_side_by_side_lab.ipynb")
    for label in ("sec-ch8-finding", "sec-ch8-context", "sec-ch8-longer", "sec-ch8-probe"):
        assert f"({label})=" in text


def test_the_quick_runs_the_pages_read_are_the_ones_the_runs_section_lists():
    import json
    import re
    from pathlib import Path

    from relbias.lab import load_results

    book = Path(__file__).resolve().parents[2] / "book"
    names = set()
    for page in ("08_side_by_side.ipynb", "08_side_by_side_lab.ipynb"):
        cells = json.loads((book / page).read_text())["cells"]
        code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        names |= set(re.findall(r'load_results\("([a-z0-9_]+)"\)', code))
    quick = {n for n in names if load_results(n)["provenance"]["config"]["name"] == "quick"}
    assert quick == set(side_by_side.QUICK_RUNS)


def test_show_mean_keeps_few_digits_and_no_negative_zero():
    # the answer boxes' means (chapters 1 and 8): a small far-bytes difference in thousandths,
    # a large one in tenths, and a mean that rounds to zero without a sign
    assert sweeps.show_mean(0.0081) == "0.008"
    assert sweeps.show_mean(0.0004) == "0.000"
    assert sweeps.show_mean(-0.0004) == "0.000"
    assert sweeps.show_mean(-0.02) == "-0.020"
    assert sweeps.show_mean(3.458) == "3.5"
    assert sweeps.show_mean(-1.04) == "-1.0"
