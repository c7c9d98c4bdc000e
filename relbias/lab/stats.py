"""The statistics of the lab: intervals over seeds, the one verdict function, and the one
"levelled off" rule.

- :func:`interval`, :func:`paired_interval`: mean and 95 % Student-t interval of one number
  per seed, or of the differences of paired runs (SciPy's ``scipy.stats``);
  :func:`median_interval`: a median and its distribution-free interval (a timing's repeats);
- :func:`verdict`: **the one rule** every ordering and every verdict of the book goes
  through (below); :func:`curve_verdict` applies it to every pair of lengths of a curve;
- :func:`text_error`, :func:`probe_error`: the evaluation's own sampling error (the spans
  of text read, the test sequences of the probe), which decides "at the edge";
- :func:`last_fifth_fall`, :func:`levelled_verdict`: **the one "levelled off" rule** for
  training curves (below).

A stored sweep's numbers are handed to these by :mod:`relbias.lab.readings`; a sweep's
records are summarised over seeds, as a result file stores them, by
:mod:`relbias.lab.summaries`.

A result over seeds is summarised by :func:`interval`: the mean of the per-seed values and
the two-sided ``confidence`` interval ``mean +- t_{(1+confidence)/2, n-1} * sd / sqrt(n)``.
With one seed there is no spread to measure: the interval is ``[nan, nan]`` and no verdict
is given.

**The verdict** (:func:`verdict`) compares ``a`` with ``b`` (or with 0) and answers one of
:data:`ANSWERS`:

- runs that share seeds, weights or batches (two methods trained on the same seed's batches,
  a fine-tuned variant and its base, one model read two ways) are **paired**: the interval of
  the per-seed differences ``a_s - b_s`` must exclude 0 (the paired t-test at 5 %);
  runs that share nothing are compared by their two intervals, which must not overlap;
- ``"lower"`` / ``"higher"``: ``a`` lies below / above ``b``, beyond the interval, and by
  more than the evaluation's own sampling error;
- ``"at the edge"``: the intervals separate, but by less than that sampling error (the gap
  between the interval and 0, or between the two intervals, is smaller than one standard
  error of the compared number over the spans of text or the test sequences): another
  sample of text could close it, so no ordering is claimed;
- ``"cannot be told apart"``: the intervals do not separate. This is not "equal";
- ``"one seed"``: fewer than two runs, no interval, no verdict.

Curves over lengths are read whole (:func:`curve_verdict`): every pair of lengths is a
paired comparison, and each pair that separates is reported, so that a curve that falls to
4x and rises after it is not summarised by its two ends.

**Levelled off** (:func:`levelled_verdict`): a training run's validation curve at the
training length has *levelled off* when its fall over the last fifth of training (the value
where the last fifth starts minus the last value, :func:`last_fifth_fall`), one number per
seed, cannot be told apart from 0 by :func:`verdict` (each seed's curve compared with
itself: paired); it is *still improving* where the fall's interval lies above 0. This is the
only rule: there is no threshold in bits, and "levelled off" means that no further fall is
shown, not that none is left.
"""

from __future__ import annotations

import math
import statistics

from scipy import stats as _scipy_stats

#: The answers of :func:`verdict`.
ANSWERS = ("lower", "higher", "at the edge", "cannot be told apart", "one seed")
#: The answers of :func:`curve_verdict`, from the separated changes between lengths.
CURVE_ANSWERS = (
    "improves",
    "degrades",
    "improves, then levels off",
    "degrades, then levels off",
    "improves, then degrades",
    "degrades, then improves",
    "improves and degrades",
    "at the edge",
    "cannot be told apart",
    "one seed",
)


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


def t_quantile(confidence: float, df: int) -> float:
    """The ``t`` with ``P(|T| <= t) = confidence`` (two-sided; ``scipy.stats.t``): 12.706
    for 0.95 and 1 degree of freedom."""
    confidence = _check_confidence(confidence)
    df = _check_df(df)
    return float(_scipy_stats.t.ppf((1 + confidence) / 2, df))


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


def median_interval(values, confidence: float = 0.95) -> dict:
    """Median of ``values`` and a distribution-free interval for it: the order statistics
    ``x_(k)`` and ``x_(n+1-k)`` of the sorted values, with ``k`` the largest rank such that
    ``2 P(B <= k - 1) <= 1 - confidence`` for ``B ~ Binomial(n, 1/2)`` (so the interval
    covers the true median with at least ``confidence``, whatever the distribution; 15
    values: the 4th and the 12th). For a timing's repeats, whose noise has no known shape.

    Returns ``{"median", "low", "high", "n"}``. Raises for fewer values than any interval at
    ``confidence`` needs (6 at 0.95).
    """
    confidence = _check_confidence(confidence)
    values = sorted(_finite_list("values", values))
    n = len(values)
    k = 0  # the largest rank whose interval keeps the confidence; 0: none does
    while k < n // 2 and 2 * _scipy_stats.binom.cdf(k, n, 0.5) <= 1 - confidence:
        k += 1
    if k == 0:
        raise ValueError(
            f"values must hold enough numbers for a {confidence:g} interval of the median "
            f"(6 at 0.95), got {n}"
        )
    median = statistics.median(values)
    return {"median": median, "low": values[k - 1], "high": values[n - k], "n": n}


def paired_interval(a, b=None, confidence: float = 0.95) -> dict:
    """Mean and t-interval of the paired differences ``a_s - b_s`` (``b`` omitted: ``a``
    holds the differences already), from SciPy's one-sample t-test of the differences
    (equivalently its paired test, ``scipy.stats.ttest_rel``). Adds ``p``, the two-sided
    p-value of "no difference"; with one pair ``low``, ``high`` and ``p`` are NaN."""
    confidence = _check_confidence(confidence)
    a = _finite_list("a", a)
    if b is not None:
        b = _finite_list("b", b)
        if len(a) != len(b):
            raise ValueError(
                f"paired runs need as many values in a as in b (one per shared seed), got "
                f"{len(a)} and {len(b)}"
            )
        diffs = [x - y for x, y in zip(a, b)]
    else:
        diffs = a
    iv = interval(diffs, confidence)
    if iv["n"] < 2:
        return {**iv, "p": math.nan}
    if iv["sd"] <= 1e-12 * max(1.0, abs(iv["mean"])):  # every pair differs alike: a point
        p = 1.0 if iv["mean"] == 0 else 0.0
        return {**iv, "low": iv["mean"], "high": iv["mean"], "p": p}
    test = _scipy_stats.ttest_1samp(diffs, 0.0)
    ci = test.confidence_interval(confidence)
    return {**iv, "low": float(ci.low), "high": float(ci.high), "p": float(test.pvalue)}


def _finite_list(name: str, values) -> list[float]:
    if isinstance(values, (str, bytes, dict)) or not hasattr(values, "__iter__"):
        raise ValueError(f"{name} must be a list of numbers (one per seed), got {values!r}")
    values = [float(v) for v in values]
    if not values:
        raise ValueError(f"{name} must hold at least one number (one per seed)")
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"{name} must hold finite numbers, got {values}")
    return values


def verdict(
    a,
    b=None,
    *,
    paired: bool | None = None,
    error: float | None = None,
    confidence: float = 0.95,
) -> dict:
    """The one verdict: is ``a`` lower or higher than ``b`` (or than 0)?

    ``a``, ``b``: one number per seed. With ``b`` omitted, ``a`` holds paired differences
    already and is compared with 0. ``paired=True`` (runs sharing seeds, weights or batches,
    in the same seed order) compares the interval of ``a_s - b_s`` with 0;
    ``paired=False`` compares the two intervals. ``error``: the evaluation's own sampling
    error of the compared difference (one standard error: :func:`text_error`,
    :func:`probe_error`), or None where it is unknown (then "at the edge" is never
    answered).

    Returns ``answer`` (one of :data:`ANSWERS`: see the module's docstring), ``mean`` (the
    mean difference ``a - b``), ``low``, ``high`` (its interval when paired; else each
    side's interval under ``a`` and ``b``), ``gap`` (how far the intervals clear each
    other or 0; negative when they overlap), ``error``, ``paired``, ``n`` and ``p`` (the
    paired test's p-value).
    """
    if paired is not None and not isinstance(paired, bool):
        raise ValueError(f"paired must be True or False, got {paired!r}")
    if b is None:
        if paired is False:
            raise ValueError("paired=False needs b: with b omitted, a holds paired differences")
        paired = True
    elif paired is None:
        raise ValueError(
            "say whether a and b are paired (paired=True: they share seeds, weights or "
            "batches; paired=False: independent runs)"
        )
    if error is not None and (isinstance(error, bool) or not math.isfinite(error) or error < 0):
        raise ValueError(f"error must be a finite number >= 0 or None, got {error!r}")
    out = {"paired": paired, "error": error}
    if paired:
        d = paired_interval(a, b, confidence)
        out.update(mean=d["mean"], low=d["low"], high=d["high"], n=d["n"], p=d["p"])
        gap = max(d["low"], -d["high"]) if d["n"] > 1 else math.nan
    else:
        ia, ib = (
            interval(_finite_list("a", a), confidence),
            interval(_finite_list("b", b), confidence),
        )
        out.update(mean=ia["mean"] - ib["mean"], a=ia, b=ib, n=min(ia["n"], ib["n"]))
        out.update(low=math.nan, high=math.nan, p=math.nan)
        gap = max(ib["low"] - ia["high"], ia["low"] - ib["high"]) if out["n"] > 1 else math.nan
    out["gap"] = gap
    if out["n"] < 2:
        answer = "one seed"
    elif gap <= 0:
        answer = "cannot be told apart"
    elif error is not None and gap < error:
        answer = "at the edge"
    else:
        answer = "lower" if out["mean"] < 0 else "higher"
    out["answer"] = answer
    return out


def text_error(by_span, minus=None) -> float:
    """The text's own sampling error of a mean over spans: one standard error over the
    spans of text read (the standard deviation of the per-span values, over ``sqrt`` of
    their number: what resampling the spans would give).

    ``by_span``: per seed, the mean loss of each span (``[seeds][spans]``, the records'
    ``bpb_by_span``); ``minus``: the same of what is subtracted (another length, another
    method, a second reading). Seeds are averaged span by span first, so the error is that
    of the compared difference of means over seeds."""
    rows = [_finite_list("by_span", r) for r in by_span]
    if minus is not None:
        other = [_finite_list("minus", r) for r in minus]
        width = {len(r) for r in rows} | {len(r) for r in other}
        if len(width) != 1:
            raise ValueError(f"by_span and minus must hold the same spans, got widths {width}")
        mean_a = [statistics.fmean(c) for c in zip(*rows)]
        mean_b = [statistics.fmean(c) for c in zip(*other)]
        per_span = [x - y for x, y in zip(mean_a, mean_b)]
    else:
        if len({len(r) for r in rows}) != 1:
            raise ValueError("every seed's by_span must hold the same spans")
        per_span = [statistics.fmean(c) for c in zip(*rows)]
    if len(per_span) < 2:
        raise ValueError("by_span must hold at least two spans to estimate their spread")
    return statistics.stdev(per_span) / math.sqrt(len(per_span))


def probe_error(accuracies, samples: int, minus=None) -> float:
    """The probe's own sampling error of a mean accuracy over seeds: one standard error
    from the binomial spread of ``samples`` test sequences per seed
    (``sqrt(sum_s p_s (1 - p_s) / samples) / seeds``); with ``minus`` (the other run's
    accuracies, same seeds) that of the difference, the two counted as independent."""
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise ValueError(f"samples must be an integer >= 1, got {samples!r}")
    acc = _finite_list("accuracies", accuracies)
    if any(not 0 <= p <= 1 for p in acc):
        raise ValueError(f"accuracies must lie in [0, 1], got {acc}")
    var = [p * (1 - p) / samples for p in acc]
    if minus is not None:
        other = _finite_list("minus", minus)
        if len(other) != len(acc):
            raise ValueError(f"minus must hold one accuracy per seed ({len(acc)}), got {other}")
        var = [v + q * (1 - q) / samples for v, q in zip(var, other)]
    return math.sqrt(sum(var)) / len(acc)


def curve_verdict(values: dict, *, by_span: dict | None = None, confidence=0.95) -> dict:
    """Read a whole curve: ``values`` ``{length: [one number per seed]}`` (the same seeds,
    in the same order, at every length: one model read at each length, so every pair of
    lengths is paired) and, for the text's sampling error, ``by_span`` ``{length:
    [seeds][spans]}`` (None: unknown).

    Every pair of lengths ``(i, j)``, ``i < j``, is a :func:`verdict` of ``values[j]``
    against ``values[i]``: ``"higher"`` is a rise (the longer window reads worse),
    ``"lower"`` a fall. Returns ``changes`` (one row per pair: ``start``, ``end`` and the
    verdict), ``rises``, ``falls`` and ``edges`` (the pairs that separated, or separated at
    the edge) and ``answer`` (one of :data:`CURVE_ANSWERS`): "degrades" / "improves" when
    the separated changes go one way only; "..., then levels off" when, besides, no pair
    among the last three or more lengths separates (``levels_from``: the first of them);
    "improves, then degrades" (or the reverse) when the curve turns once, at its lowest
    (highest) mean: separated falls end there, separated rises start there, and no rise
    lies before it nor fall after it (``turns_at``);
    "improves and degrades" otherwise; "at the edge" when nothing
    separates but at the edge; "cannot be told apart" when nothing separates."""
    lengths = sorted(values)
    if len(lengths) < 2:
        raise ValueError(f"values must hold at least two lengths, got {lengths}")
    seeds = {len(values[n]) for n in lengths}
    if len(seeds) != 1:
        raise ValueError(f"every length must hold one value per seed, got counts {seeds}")
    changes = []
    for i, start in enumerate(lengths):
        for end in lengths[i + 1 :]:
            err = None
            if by_span is not None:
                err = text_error(by_span[end], by_span[start])
            v = verdict(values[end], values[start], paired=True, error=err, confidence=confidence)
            changes.append({"start": start, "end": end, **v})
    rises = [c for c in changes if c["answer"] == "higher"]
    falls = [c for c in changes if c["answer"] == "lower"]
    edges = [c for c in changes if c["answer"] == "at the edge"]
    out = {"changes": changes, "rises": rises, "falls": falls, "edges": edges}
    out["levels_from"] = out["turns_at"] = None
    if seeds == {1}:
        answer = "one seed"
    elif not rises and not falls:
        answer = "at the edge" if edges else "cannot be told apart"
    elif rises and falls:
        means = {n: statistics.fmean(values[n]) for n in lengths}
        lowest, highest = min(means, key=means.get), max(means, key=means.get)
        if _turns_at(lowest, falls, rises):
            answer = "improves, then degrades"
            out["turns_at"] = lowest
        elif _turns_at(highest, rises, falls):
            answer = "degrades, then improves"
            out["turns_at"] = highest
        else:
            answer = "improves and degrades"
    else:
        answer = "degrades" if rises else "improves"
        for k in range(1, len(lengths) - 2):
            tail = set(lengths[k:])
            quiet = all(
                c["answer"] == "cannot be told apart"
                for c in changes
                if c["start"] in tail and c["end"] in tail
            )
            if quiet:
                answer += ", then levels off"
                out["levels_from"] = lengths[k]
                break
    out["answer"] = answer
    return out


def _turns_at(length, before: list, after: list) -> bool:
    """Whether the curve turns once, at ``length``: a separated change of ``before`` ends
    there and one of ``after`` starts there, no change of ``after`` lies wholly before it
    and none of ``before`` wholly after it."""
    return (
        any(c["end"] == length for c in before)
        and any(c["start"] == length for c in after)
        and not any(c["end"] <= length for c in after)
        and not any(c["start"] >= length for c in before)
    )


#: What :func:`levelled_verdict`'s answers mean for a training curve.
TRAINING_WORDS = {
    "lower": "still improving",
    "higher": "rising again",
    "at the edge": "levels off",
    "cannot be told apart": "levels off",
    "one seed": "one seed",
}


def last_fifth_fall(curve, *, fraction: float = 0.2) -> dict:
    """How much a validation curve ``[{"step", "bpb"}, ...]`` still fell over the last
    ``fraction`` of its steps: ``drop`` (bits), its value at the last step at or before
    ``from_step`` minus its last value (at ``to_step``). One run's input to the one
    "levelled off" rule, :func:`levelled_verdict`; it decides nothing by itself."""
    if not 0 < fraction < 1:
        raise ValueError(f"fraction must lie in (0, 1), got {fraction!r}")
    points = sorted((int(p["step"]), float(p["bpb"])) for p in curve)
    if len(points) < 2:
        raise ValueError("curve must hold at least two points to tell whether it levelled off")
    last_step, last = points[-1]
    cut = last_step - fraction * (last_step - points[0][0])
    earlier = [v for s, v in points if s <= cut]
    start = earlier[-1] if earlier else points[0][1]
    return {"drop": start - last, "from_step": cut, "to_step": last_step}


def levelled_verdict(drops) -> dict:
    """**The one "levelled off" rule** (module docstring): ``drops`` are one method's falls
    over the last fifth of training, one per seed (:func:`last_fifth_fall`), handed to
    :func:`verdict` as the change ``-drop`` against 0. Returns the verdict with ``words``
    (:data:`TRAINING_WORDS`: "still improving", "levels off", "rising again", "one seed"),
    ``levelled_off`` (True where no fall or rise is shown, False where one is, None for one
    seed), ``seeds`` (how many runs) and ``largest_drop`` (bits, the most any seed still
    fell)."""
    drops = _finite_list("drops", drops)
    if not drops:
        raise ValueError("drops must hold one fall per seed, got none")
    v = verdict([-d for d in drops])
    answer = v["answer"]
    return {
        **v,
        "words": TRAINING_WORDS[answer],
        "levelled_off": None if answer == "one seed" else answer not in ("lower", "higher"),
        "seeds": len(drops),
        "largest_drop": max(drops),
    }
