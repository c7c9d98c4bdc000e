"""Intervals over seeds: the t quantile (SciPy's), the t-interval, the one "levelled off" rule
(the verdict itself: test_verdict.py)."""

import math

import pytest
from scipy import stats as scipy_stats

from relbias.lab.stats import (
    interval,
    last_fifth_fall,
    levelled_verdict,
    median_interval,
    t_quantile,
    verdict,
)

# Two-sided 95 % quantiles of Student's t from printed tables (e.g. NIST/SEMATECH).
TABLE_95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 10: 2.228, 30: 2.042}


@pytest.mark.parametrize("df", sorted(TABLE_95))
def test_t_quantile_matches_printed_tables(df):
    assert t_quantile(0.95, df) == pytest.approx(TABLE_95[df], abs=1e-3)


def test_t_quantile_tends_to_the_normal_and_inverts_the_cdf():
    assert t_quantile(0.95, 2000) == pytest.approx(1.96, abs=2e-3)
    for df in (1, 2, 5, 9):
        for conf in (0.5, 0.9, 0.99):
            t = t_quantile(conf, df)
            central = scipy_stats.t.cdf(t, df) - scipy_stats.t.cdf(-t, df)
            assert central == pytest.approx(conf, abs=1e-9)
    assert t_quantile(0.99, 4) > t_quantile(0.95, 4) > t_quantile(0.95, 40)


def test_interval_of_three_seeds():
    iv = interval([1.0, 2.0, 3.0])
    half = t_quantile(0.95, 2) * 1.0 / math.sqrt(3)
    assert iv["mean"] == pytest.approx(2.0) and iv["sd"] == pytest.approx(1.0) and iv["n"] == 3
    assert iv["low"] == pytest.approx(2.0 - half) and iv["high"] == pytest.approx(2.0 + half)
    wider = interval([0.0, 2.0, 4.0])  # twice the spread, twice the width
    assert wider["high"] - wider["low"] == pytest.approx(2 * (iv["high"] - iv["low"]))
    narrow = interval([1.0, 2.0, 3.0], confidence=0.5)
    assert narrow["low"] > iv["low"] and narrow["high"] < iv["high"]


def test_one_seed_has_no_interval_and_separates_nothing():
    iv = interval([1.5])
    assert iv["mean"] == 1.5 and math.isnan(iv["low"]) and math.isnan(iv["high"])
    assert verdict([1.5], [9.0, 9.1, 9.2], paired=False)["answer"] == "one seed"


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: interval([]), "values"),
        (lambda: interval([1.0, float("nan")]), "finite"),
        (lambda: interval([1.0, 2.0], confidence=1.5), "confidence"),
        (lambda: t_quantile(0.95, 0), "df"),
        (lambda: last_fifth_fall([{"step": 1, "bpb": 2.0}]), "two points"),
        (lambda: last_fifth_fall([], fraction=2), "fraction"),
        (lambda: levelled_verdict([]), "drops"),
        (lambda: levelled_verdict([0.1, float("nan")]), "drops"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_last_fifth_fall():
    flat = [{"step": s, "bpb": 2.0 + 1.0 / s} for s in range(100, 3001, 100)]
    falling = [{"step": s, "bpb": 5.0 - s / 1000} for s in range(100, 3001, 100)]
    assert last_fifth_fall(flat)["drop"] == pytest.approx(1 / 2400 - 1 / 3000)
    result = last_fifth_fall(falling)
    assert result["drop"] == pytest.approx(0.6, abs=0.05) and result["to_step"] == 3000
    assert "levelled" not in result  # one run's fall decides nothing by itself


def test_levelled_verdict_is_the_verdict_of_the_falls_against_zero():
    falling = levelled_verdict([0.05, 0.04, 0.06])
    assert falling["words"] == "still improving" and falling["levelled_off"] is False
    assert falling["seeds"] == 3 and falling["largest_drop"] == pytest.approx(0.06)
    assert falling == {**falling, **verdict([-0.05, -0.04, -0.06])}
    flat = levelled_verdict([0.01, -0.012, 0.003])
    assert flat["words"] == "levels off" and flat["levelled_off"] is True
    rising = levelled_verdict([-0.05, -0.04, -0.06])
    assert rising["words"] == "rising again" and rising["levelled_off"] is False
    one = levelled_verdict([0.001])
    assert one["words"] == "one seed" and one["levelled_off"] is None


def test_no_threshold_in_bits():
    """Falls of a few hundredths of a bit, all below the old 0.02-bit threshold, are still
    improving when every seed falls alike; large falls that disagree in sign are not."""
    assert levelled_verdict([0.011, 0.013, 0.018])["words"] == "still improving"
    assert levelled_verdict([0.3, -0.25, 0.1])["words"] == "levels off"


def test_median_interval_is_the_order_statistics_binomial_ranks_give():
    """15 values: the 4th and the 12th smallest (2 P(B <= 3) = 0.035, 2 P(B <= 4) = 0.118
    for B ~ Binomial(15, 1/2)); 6 values: the extremes; whatever order they come in."""
    values = [float(v) for v in range(15, 0, -1)]
    iv = median_interval(values)
    assert (iv["median"], iv["low"], iv["high"], iv["n"]) == (8.0, 4.0, 12.0, 15)
    assert 2 * scipy_stats.binom.cdf(3, 15, 0.5) <= 0.05 < 2 * scipy_stats.binom.cdf(4, 15, 0.5)
    assert median_interval([3, 1, 2, 6, 5, 4]) == {"median": 3.5, "low": 1.0, "high": 6.0, "n": 6}
    wider = median_interval(values, confidence=0.99)
    assert wider["low"] < iv["low"] and wider["high"] > iv["high"]


def test_median_interval_covers_the_median_at_least_as_often_as_it_says():
    """Over many samples of a skewed distribution (log-normal, median 1), the interval holds
    the true median in at least 95 % of them (less the simulation's own error)."""
    import random

    rng = random.Random(0)
    trials = 4000
    for n in (7, 15, 40):
        held = 0
        for _ in range(trials):
            iv = median_interval([rng.lognormvariate(0.0, 1.0) for _ in range(n)])
            held += iv["low"] <= 1.0 <= iv["high"]
        assert held / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials), (n, held / trials)


@pytest.mark.parametrize(
    ("values", "confidence", "match"),
    [
        ([1, 2, 3, 4, 5], 0.95, "6 at 0.95"),
        ([1, 2, float("nan"), 4, 5, 6], 0.95, "finite"),
        ("123456", 0.95, "list of numbers"),
        ([1, 2, 3, 4, 5, 6], 1.5, "confidence"),
    ],
)
def test_median_interval_names_bad_input(values, confidence, match):
    with pytest.raises(ValueError, match=match):
        median_interval(values, confidence)
