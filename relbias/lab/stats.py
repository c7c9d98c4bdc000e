"""Intervals over seeds: the mean, a Student-t confidence interval, and whether two separate.

A result over seeds is summarised by :func:`interval`: the mean of the per-seed values and
the two-sided ``confidence`` interval ``mean +- t_{(1+confidence)/2, n-1} * sd / sqrt(n)``
(the t-interval of the mean; ``sd`` the sample standard deviation). With one seed there is
no spread to measure, so the interval is ``[nan, nan]`` and nothing separates from it.
:func:`separates` is the rule the chapters use before claiming an ordering: two methods are
told apart at a length only when their intervals do not overlap.

Standard library only (no SciPy): the t quantile is found by bisection on the exact
distribution function for integer degrees of freedom (Abramowitz and Stegun 26.7.3-4).
"""

from __future__ import annotations

import math
import statistics


def _check_df(df) -> int:
    if isinstance(df, bool) or not isinstance(df, int) or df < 1:
        raise ValueError(f"df (degrees of freedom) must be an integer >= 1, got {df!r}")
    return df


def _check_confidence(confidence) -> float:
    if isinstance(confidence, bool) or not isinstance(confidence, (int, float)):
        raise ValueError(f"confidence must be a number in (0, 1), got {confidence!r}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence!r}")
    return float(confidence)


def t_central_probability(t: float, df: int) -> float:
    """``P(|T| <= t)`` for Student's t with ``df`` (integer) degrees of freedom, ``t >= 0``."""
    df = _check_df(df)
    if t < 0:
        raise ValueError(f"t must be >= 0, got {t!r}")
    theta = math.atan(t / math.sqrt(df))
    s, c = math.sin(theta), math.cos(theta)
    if df % 2:  # odd: 2/pi (theta + sin(theta) (cos + 2/3 cos^3 + ...))
        total, term = 0.0, c
        for k in range(1, (df - 1) // 2 + 1):
            total += term
            term *= c * c * (2 * k) / (2 * k + 1)
        return min(1.0, 2 / math.pi * (theta + s * total)) if df > 1 else 2 * theta / math.pi
    total, term = 0.0, 1.0  # even: sin(theta) (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...)
    for k in range(1, df // 2 + 1):
        total += term
        term *= c * c * (2 * k - 1) / (2 * k)
    return min(1.0, s * total)


def t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with ``P(|T| <= t) = confidence`` (two-sided): 12.706 for 0.95 and 1 df."""
    confidence = _check_confidence(confidence)
    df = _check_df(df)
    lo, hi = 0.0, 1.0
    while t_central_probability(hi, df) < confidence:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if t_central_probability(mid, df) < confidence:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


def interval(values, confidence: float = 0.95) -> dict:
    """Mean and t-interval of ``values`` (one number per seed).

    Returns ``{"mean", "low", "high", "sd", "n"}``; ``low``/``high`` are NaN for one value.
    """
    confidence = _check_confidence(confidence)
    values = [float(v) for v in values]
    if not values:
        raise ValueError("values must hold at least one number (one per seed)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"values must be finite numbers, got {values}")
    n = len(values)
    mean = statistics.fmean(values)
    if n == 1:
        return {"mean": mean, "low": math.nan, "high": math.nan, "sd": math.nan, "n": 1}
    sd = statistics.stdev(values)
    half = t_quantile(confidence, n - 1) * sd / math.sqrt(n)
    return {"mean": mean, "low": mean - half, "high": mean + half, "sd": sd, "n": n}


def separates(a: dict, b: dict) -> bool:
    """True when the intervals ``a`` and ``b`` (from :func:`interval`) do not overlap.

    An interval with NaN ends (a single seed) never separates.
    """
    for name, iv in (("a", a), ("b", b)):
        if not isinstance(iv, dict) or "low" not in iv or "high" not in iv:
            raise ValueError(f"{name} must be an interval dict with 'low' and 'high', got {iv!r}")
    ends = (a["low"], a["high"], b["low"], b["high"])
    if any(math.isnan(v) for v in ends):
        return False
    return a["high"] < b["low"] or b["high"] < a["low"]


def levelled_off(curve, *, fraction: float = 0.2, tolerance: float = 0.02) -> dict:
    """Whether a validation curve ``[{"step", "bpb"}, ...]`` has levelled off.

    Compares the value at the start of the last ``fraction`` of the steps with the last
    value: ``drop`` (bits) is how much it still fell; ``levelled`` is ``drop <= tolerance``.
    """
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction!r}")
    if not tolerance >= 0:
        raise ValueError(f"tolerance must be >= 0, got {tolerance!r}")
    points = sorted((int(p["step"]), float(p["bpb"])) for p in curve)
    if len(points) < 2:
        raise ValueError("curve must hold at least two points to tell whether it levelled off")
    last_step, last = points[-1]
    cut = last_step - fraction * (last_step - points[0][0])
    earlier = [v for s, v in points if s <= cut]
    start = earlier[-1] if earlier else points[0][1]
    drop = start - last
    return {"drop": drop, "levelled": drop <= tolerance, "from_step": cut, "to_step": last_step}
