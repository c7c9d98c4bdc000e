"""Chapter 6's helpers: reading an ablation's interventions (relbias.lab.interventions)."""

from __future__ import annotations

import statistics

import pytest

from relbias.lab import interventions
from relbias.lab import plots as lab_plots
from relbias.lab.stats import interval


def _rows(values_by_factor: dict) -> list[dict]:
    return [{"factor": f, "length": 128 * f, "bpb": v} for f, v in values_by_factor.items()]


def _summary_rows(per_seed: list[dict]) -> list[dict]:
    out = []
    for f in per_seed[0]:
        iv = interval([seed[f] for seed in per_seed])
        out.append(
            {
                "factor": f,
                "length": 128 * f,
                "bpb": iv["mean"],
                "bpb_low": iv["low"],
                "bpb_high": iv["high"],
                "n": iv["n"],
            }
        )
    return out


def ablation(plain: list[dict], changed: list[dict]) -> dict:
    """A stored ablation of one method, seeds 0.., with one intervention ``clamp``."""
    seeds = {
        str(s): {"eval": _rows(p), "interventions": {"clamp": {"eval": _rows(c)}}}
        for s, (p, c) in enumerate(zip(plain, changed))
    }
    return {
        "methods": {
            "fire": {
                "eval": _summary_rows(plain),
                "seeds": seeds,
                "interventions": {"clamp": {"eval": _summary_rows(changed)}},
            }
        }
    }


PLAIN = [{1: 2.0, 16: 3.0}, {1: 2.1, 16: 3.2}, {1: 1.9, 16: 2.9}]


def test_intervention_at_reads_the_summary():
    changed = [{1: 2.0, 16: 2.1}, {1: 2.1, 16: 2.2}, {1: 1.9, 16: 2.0}]
    results = ablation(PLAIN, changed)
    got = interventions.intervention_at(results, "fire", "clamp", 16)
    want = interval([2.1, 2.2, 2.0])
    assert got["mean"] == pytest.approx(want["mean"]) and got["n"] == 3
    assert got["low"] == pytest.approx(want["low"]) and got["high"] == pytest.approx(want["high"])
    with pytest.raises(ValueError, match="intervention must be one of"):
        interventions.intervention_at(results, "fire", "nothing", 16)


def test_intervention_effect_is_paired_by_seed():
    # every seed lowered by about 0.9-1.0: the change's interval lies below 0
    changed = [{1: 2.0, 16: 2.1}, {1: 2.1, 16: 2.2}, {1: 1.9, 16: 2.0}]
    effect = interventions.intervention_effect(ablation(PLAIN, changed), "fire", "clamp", 16)
    assert effect["answer"] == "lower" and effect["paired"]
    assert effect["mean"] == pytest.approx(-0.9333333, abs=1e-6)
    # no change at 1x: the interval is a point at 0, neither side
    same = interventions.intervention_effect(ablation(PLAIN, changed), "fire", "clamp", 1)
    assert same["answer"] == "cannot be told apart"
    # raised by seed-dependent amounts that all exceed 0
    raised = [{1: 2.0, 16: 3.5}, {1: 2.1, 16: 3.6}, {1: 1.9, 16: 3.3}]
    raised_effect = interventions.intervention_effect(ablation(PLAIN, raised), "fire", "clamp", 16)
    assert raised_effect["answer"] == "higher"
    # one seed: no verdict
    one = ablation(PLAIN[:1], changed[:1])
    assert interventions.intervention_effect(one, "fire", "clamp", 16)["answer"] == "one seed"


def test_plot_interventions_draws_one_point_per_reading():
    changed = [{1: 2.0, 16: 2.1}, {1: 2.1, 16: 2.2}, {1: 1.9, 16: 2.0}]
    fig = lab_plots.plot_interventions(ablation(PLAIN, changed), ["fire"], ["clamp"], 16)
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["as trained", "clamp"]
    means = ax.containers[0].lines[0].get_ydata()
    assert list(means) == pytest.approx([interval([3.0, 3.2, 2.9])["mean"], 2.1])


def test_intervention_effect_against_the_training_length():
    # clamped at 16x against the model's own 1x reading: per seed +0.1, +0.1, +0.1
    changed = [{1: 2.0, 16: 2.1}, {1: 2.1, 16: 2.2}, {1: 1.9, 16: 2.0}]
    effect = interventions.intervention_effect(
        ablation(PLAIN, changed), "fire", "clamp", 16, against=1
    )
    assert effect["mean"] == pytest.approx(0.1) and effect["n"] == 3
    # a constant change has no spread: the interval is the point 0.1, above 0
    assert effect["answer"] == "higher"


# --- relbias.book.fire: FIRE's inputs and which clamps move any -----------------------------

from relbias.book import fire as fire_book  # noqa: E402


def test_trained_offset_alike_is_the_offset_in_the_last_row_and_nearer_past_it():
    c, L = 0.35, 120.0
    # in the last training row itself: the same offset
    assert fire_book.trained_offset_alike(c, L, 10, 127, 128) == pytest.approx(10)
    # past L the same key reads the input of a nearer key of the last training row
    alike = fire_book.trained_offset_alike(c, L, 100, 2047, 128)
    assert 1 < alike < 100
    want = fire_book.psi(c, 100) / fire_book.psi(c, 2047)
    assert fire_book.psi(c, alike) / fire_book.psi(c, 127) == pytest.approx(want)
    with pytest.raises(ValueError, match="offset and query"):
        fire_book.trained_offset_alike(c, L, -1, 10, 128)


def _clamp_ablation(min_trained: float, max_trained: float) -> dict:
    """One FIRE variant, three seeds; each clamp raises the 16x reading by 0.1, 0.2, 0.3."""

    def plain(s):
        return {1: 2.0 + 0.01 * s, 16: 3.0 + 0.02 * s}

    def clamped(k, s):
        return {1: 2.0 + 0.01 * s, 16: 3.0 + 0.1 * (k + 1) + 0.02 * s}

    seeds = {
        str(s): {
            "c": 0.35,
            "L": 120.0,
            "min_trained_input": min_trained,
            "max_trained_input": max_trained,
            "eval": _rows(plain(s)),
            "interventions": {
                name: {"eval": _rows(clamped(k, s))} for k, name in enumerate(fire_book.FIRE_CLAMPS)
            },
        }
        for s in range(3)
    }
    inter = {
        name: {"eval": _summary_rows([clamped(k, s) for s in range(3)])}
        for k, name in enumerate(fire_book.FIRE_CLAMPS)
    }
    summary = _summary_rows([plain(s) for s in range(3)])
    return {"methods": {"fire": {"eval": summary, "seeds": seeds, "interventions": inter}}}


def test_clamp_applies_only_where_the_reading_leaves_the_trained_range():
    low, high = fire_book.eval_input_range({"c": 0.35, "L": 120.0}, 2048)
    assert high == pytest.approx(1.0)
    assert low == pytest.approx(fire_book.psi(0.35, 1) / fire_book.psi(0.35, 2047))
    # trained up to 1 and down to offset 1 at query 127: a near gap, no far end
    plain = _clamp_ablation(fire_book.psi(0.35, 1) / fire_book.psi(0.35, 127), 1.0)
    assert fire_book.clamp_applies(plain, "fire", "clamp_near", 16)
    assert not fire_book.clamp_applies(plain, "fire", "clamp_far", 16)
    assert fire_book.clamp_applies(plain, "fire", "clamp_both", 16)
    assert fire_book.clamp_cell(plain, "fire", "clamp_far", 16) == "n/a (changes no input)"
    assert fire_book.clamp_cell(plain, "fire", "clamp_near", 16).endswith(": higher")
    # trained at every query (the smallest input already seen), rows short of 1: a far end
    shifted = _clamp_ablation(low, 0.85)
    assert not fire_book.clamp_applies(shifted, "fire", "clamp_near", 16)
    assert fire_book.clamp_applies(shifted, "fire", "clamp_far", 16)
    with pytest.raises(ValueError, match="clamp must be one of"):
        fire_book.clamp_applies(plain, "fire", "clamp_middle", 16)


def test_plot_fire_clamps_draws_only_the_clamps_that_move_an_input():
    plain = _clamp_ablation(fire_book.psi(0.35, 1) / fire_book.psi(0.35, 127), 1.0)
    fig = fire_book.plot_fire_clamps(plain, ["fire"], 16)
    ax = fig.axes[0]
    assert len(ax.containers) == 2  # as trained and clamp_near; clamp_far is n/a
    assert [t.get_text() for t in ax.texts] == ["n/a"]


# --- relbias.book.fire: the learned c and L, the near gap, the trained rows -------------------


def test_learned_c_L_reads_the_record_or_the_module_description():
    assert fire_book.learned_c_L({"c": 0.35, "L": 120.5}) == (0.35, 120.5)
    module = "FIRE(\n  num_heads=4, hidden=32, c=0.4145, L=126.1\n  (hidden_layer): ...)"
    assert fire_book.learned_c_L({"learned_bias": {"module": module}}) == (0.4145, 126.1)
    with pytest.raises(ValueError, match="no learned c and L"):
        fire_book.learned_c_L({"learned_bias": {"module": "ALiBi(num_heads=4)"}})


def test_near_gap_holds_the_offsets_below_the_smallest_trained_input():
    c, L = 0.34, 121.0
    # the last training row itself has no near gap; a row 16 times as far puts offset 1 there
    assert fire_book.near_gap_offsets(c, L, 127, 128) == []
    assert fire_book.near_gap_offsets(c, L, 2047, 128) == [1]
    # a far larger query squeezes more offsets below it
    assert len(fire_book.near_gap_offsets(c, L, 10**6, 128)) > 1
    with pytest.raises(ValueError, match="query must be"):
        fire_book.near_gap_offsets(c, L, 0, 128)


def test_trained_rows_and_their_figure_match_the_module():
    import torch

    import relbias

    torch.manual_seed(0)
    bias = relbias.FIRE(4, c=0.3, L=40)
    rows = fire_book.trained_rows(bias, (39, 200))
    x, v = rows[200]
    assert x.shape == (201,) and v.shape == (4, 201)
    assert float(x[0]) == 0.0 and float(x[-1]) == pytest.approx(1.0, rel=1e-4)
    with torch.no_grad():
        full = bias(201)
    torch.testing.assert_close(v, full[:, 200].flip(-1))
    fig = fire_book.plot_trained_rows(bias, (39, 200), key=50, train_len=40)
    left, right = fig.axes[:2]
    assert [t.get_text() for t in left.get_legend().get_texts()][:2] == ["query 39", "query 200"]
    assert len(right.lines) == 8  # 4 heads at two queries


def _context_results(differences: dict) -> dict:
    """A stored-sweep stand-in whose methods hold one context measure per seed."""

    def record(diffs):
        return {
            "eval": [
                {"context": {"difference": sum(diffs) / len(diffs), "difference_by_span": diffs}}
            ]
        }

    return {
        "methods": {
            m: {"seeds": {str(s): record(d) for s, d in enumerate(per_seed)}}
            for m, per_seed in differences.items()
        }
    }


def test_context_against_pairs_the_seeds_and_uses_the_difference_error():
    results = _context_results(
        {
            "a": [[1.0, 1.2], [0.8, 1.0], [1.1, 1.3]],
            "b": [[0.1, 0.1], [0.2, 0.0], [0.0, 0.2]],
        }
    )
    got = fire_book.context_against(results, "a", "b")
    assert got["paired"] and got["n"] == 3
    assert got["mean"] == pytest.approx(statistics.fmean([1.0, 0.8, 1.1]))
    assert got["answer"] == "higher"
