"""The one verdict function: synthetic cases where each answer is known.

Every ordering and every "improves / degrades / levels off / cannot be told apart / uses the
far context" of the book goes through :func:`relbias.lab.stats.verdict`; these tests build
per-seed numbers whose answer is known by construction and check that it is given, and
check the paired interval and the sampling errors against SciPy and closed forms.
"""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats as scipy_stats

from relbias.lab import readings
from relbias.lab.stats import (
    ANSWERS,
    CURVE_ANSWERS,
    curve_verdict,
    paired_interval,
    probe_error,
    text_error,
    verdict,
)


# --- paired and unpaired ------------------------------------------------------------------------
def test_pairing_removes_what_the_seeds_share():
    """Three seeds whose levels differ a lot, and a second run that is always 0.1 lower:
    unpaired the intervals overlap, paired the difference is certain."""
    base = [1.0, 2.0, 3.0]
    lower = [b - 0.1 + e for b, e in zip(base, (0.001, -0.002, 0.001))]
    assert verdict(lower, base, paired=False)["answer"] == "cannot be told apart"
    paired = verdict(lower, base, paired=True)
    assert paired["answer"] == "lower"
    assert paired["mean"] == pytest.approx(-0.1, abs=1e-3) and paired["high"] < 0
    assert verdict(base, lower, paired=True)["answer"] == "higher"


def test_paired_interval_is_scipys_paired_t_test():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(2, 8)
        a = [rng.gauss(0, 1) for _ in range(n)]
        b = [x + rng.gauss(0.3, 0.5) for x in a]
        got = paired_interval(a, b)
        ref = scipy_stats.ttest_rel(a, b)
        ci = ref.confidence_interval(0.95)
        assert got["p"] == pytest.approx(ref.pvalue, rel=1e-9)
        assert (got["low"], got["high"]) == pytest.approx((ci.low, ci.high), rel=1e-9)
        # the verdict separates exactly when the paired test rejects at 5 %
        answer = verdict(a, b, paired=True)["answer"]
        assert (answer in ("lower", "higher")) == (ref.pvalue < 0.05)


def test_unpaired_needs_the_two_intervals_apart():
    a, b = [1.0, 1.1, 0.9], [5.0, 5.1, 4.9]
    assert verdict(a, b, paired=False)["answer"] == "lower"
    assert verdict(b, a, paired=False)["answer"] == "higher"
    touching = [1.05, 1.2, 0.95]
    assert verdict(a, touching, paired=False)["answer"] == "cannot be told apart"


def test_at_the_edge_when_the_gap_is_below_the_sampling_error():
    diffs = [-0.10, -0.11, -0.09]  # interval about [-0.125, -0.075]: clears 0 by ~0.075
    clear = verdict(diffs, error=0.01)
    assert clear["answer"] == "lower" and clear["gap"] == pytest.approx(0.0752, abs=1e-3)
    assert verdict(diffs, error=0.2)["answer"] == "at the edge"
    assert verdict(diffs)["answer"] == "lower"  # error unknown: no edge is answered
    # unpaired: the gap between the intervals against the error
    a, b = [1.0, 1.01, 0.99], [1.2, 1.21, 1.19]
    gap = verdict(a, b, paired=False)["gap"]
    assert verdict(a, b, paired=False, error=gap * 0.9)["answer"] == "lower"
    assert verdict(a, b, paired=False, error=gap * 1.1)["answer"] == "at the edge"


def test_one_seed_gives_no_verdict():
    assert verdict([0.5], [0.1], paired=True)["answer"] == "one seed"
    assert verdict([0.5], [0.1, 0.2], paired=False)["answer"] == "one seed"
    assert curve_verdict({1: [2.0], 2: [9.0]})["answer"] == "one seed"


def test_equal_differences_are_a_point_not_nan():
    v = verdict([0.2, 0.2, 0.2])
    assert v["answer"] == "higher" and v["low"] == v["high"] == pytest.approx(0.2)
    assert verdict([0.0, 0.0])["answer"] == "cannot be told apart"


def test_every_answer_is_named():
    for answer in ("lower", "higher", "at the edge", "cannot be told apart", "one seed"):
        assert answer in ANSWERS
    assert set(readings.CONTEXT_WORDS) == set(ANSWERS)


# --- the evaluation's own sampling error -----------------------------------------------------
def test_text_error_is_the_standard_error_over_spans():
    spans = [[1.0, 2.0, 3.0, 4.0], [1.2, 2.2, 3.2, 4.2]]  # two seeds, four spans
    per_span = [1.1, 2.1, 3.1, 4.1]
    expected = scipy_stats.sem(per_span)
    assert text_error(spans) == pytest.approx(expected)
    # a difference: the same spans read twice; a constant shift has no error
    assert text_error(spans, [[v - 0.3 for v in r] for r in spans]) == pytest.approx(0, abs=1e-12)
    with pytest.raises(ValueError, match="same spans"):
        text_error(spans, [[1.0, 2.0]])
    with pytest.raises(ValueError, match="two spans"):
        text_error([[1.0]])


def test_probe_error_is_binomial():
    assert probe_error([0.5], 100) == pytest.approx(0.05)
    assert probe_error([0.5, 0.5], 100) == pytest.approx(math.sqrt(2 * 0.0025) / 2)
    assert probe_error([1.0, 0.0], 50) == 0.0
    assert probe_error([0.5], 100, minus=[0.5]) == pytest.approx(math.sqrt(0.005))
    with pytest.raises(ValueError, match="samples"):
        probe_error([0.5], 0)
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        probe_error([1.5], 10)


# --- curves read whole ----------------------------------------------------------------------------
def _curve(means, noise=(0.002, -0.001, -0.001)):
    """Three seeds' values around each mean: seed s is offset by a level of its own (shared
    by the lengths: one model is read at every length) and by a small noise that changes
    sign from length to length, so that no change smaller than it separates."""
    levels = (0.3, -0.2, 0.1)
    return {
        2**k * 64: [m + lv + (e if k % 2 else -e) for lv, e in zip(levels, noise)]
        for k, m in enumerate(means)
    }


@pytest.mark.parametrize(
    "means, answer",
    [
        ([2.0, 2.1, 2.3, 2.6, 3.0], "degrades"),
        ([2.0, 1.9, 1.85, 1.8, 1.75], "improves"),
        ([2.0, 1.9, 1.8, 1.8, 1.8], "improves, then levels off"),
        ([2.0, 2.5, 3.0, 3.0, 3.0], "degrades, then levels off"),
        ([2.0, 1.9, 1.8, 1.9, 2.0], "improves, then degrades"),
        ([2.0, 2.2, 2.4, 2.2, 2.0], "degrades, then improves"),
        ([2.0, 1.8, 2.2, 1.7, 2.4], "improves and degrades"),
        ([2.0, 2.0, 2.0, 2.0, 2.0], "cannot be told apart"),
    ],
)
def test_curve_answers(means, answer):
    got = curve_verdict(_curve(means))
    assert got["answer"] == answer
    assert answer in CURVE_ANSWERS


def test_a_curve_is_not_read_by_its_ends():
    """Level from 1x to 16x, but a rise in between: the endpoints alone would say
    'cannot be told apart'."""
    values = _curve([2.0, 2.0, 2.4, 2.0, 2.0])
    ends = verdict(values[1024], values[64], paired=True)
    assert ends["answer"] == "cannot be told apart"
    got = curve_verdict(values)
    assert got["answer"] == "degrades, then improves" and got["turns_at"] == 256
    assert {(c["start"], c["end"]) for c in got["rises"]} >= {(64, 256), (128, 256)}


def test_a_curve_at_the_edge():
    """A rise of 0.02 that every seed shows, read on eight spans of text whose own spread
    from length to length is far larger: another sample of text could close it."""
    values = _curve([2.0, 2.02, 2.02, 2.02, 2.02])
    assert curve_verdict(values)["answer"].startswith("degrades")
    rng = random.Random(2)
    by_span = {
        n: [[v + rng.gauss(0, 0.5) for _ in range(8)] for v in vals] for n, vals in values.items()
    }
    got = curve_verdict(values, by_span=by_span)
    assert got["answer"] == "at the edge" and got["edges"] and not got["rises"]


def test_curve_bad_input():
    with pytest.raises(ValueError, match="two lengths"):
        curve_verdict({64: [1.0, 2.0]})
    with pytest.raises(ValueError, match="one value per seed"):
        curve_verdict({64: [1.0, 2.0], 128: [1.0]})


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: verdict([1.0, 2.0], [1.0, 2.0]), "paired"),
        (lambda: verdict([1.0, 2.0], paired=False), "needs b"),
        (lambda: verdict([1.0, 2.0], [1.0], paired=True), "as many values"),
        (lambda: verdict([1.0, math.nan], [1.0, 2.0], paired=True), "finite"),
        (lambda: verdict([1.0, 2.0], error=-1.0), "error"),
        (lambda: verdict("12", paired=True), "list of numbers"),
        (lambda: verdict([1.0, 2.0], paired="yes"), "paired must be"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()
