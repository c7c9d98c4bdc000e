"""The statistics of the lab: intervals over seeds, the one verdict function, and a sweep's
summaries.

- :func:`interval`, :func:`paired_interval`: mean and 95 % Student-t interval of one number
  per seed, or of the differences of paired runs (SciPy's ``scipy.stats``);
- :func:`verdict`: **the one rule** every ordering and every verdict of the book goes
  through (below); :func:`curve_verdict` applies it to every pair of lengths of a curve;
- :func:`text_error`, :func:`probe_error`: the evaluation's own sampling error (the spans
  of text read, the test sequences of the probe), which decides "at the edge";
- :func:`method_curve`, :func:`methods_verdict`, :func:`context_verdict`,
  :func:`accuracy_verdict`: a stored sweep's numbers handed to it;
- :func:`summarize_extrapolation`, :func:`summarize_retrieval`: a method's records over
  seeds as the summary a result file stores; :func:`levelled_off`: a training curve.

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
#: What :func:`context_verdict`'s answers mean: the long window against the sliding one.
CONTEXT_WORDS = {
    "lower": "uses the far context",
    "higher": "reads the far bytes worse",
    "at the edge": "at the edge",
    "cannot be told apart": "no use of the far context shown",
    "one seed": "one seed",
}


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


# --- summaries of a sweep over seeds ---------------------------------------------------------


def summarize_extrapolation(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's records ``{seed: record}`` as a summary over seeds.

    ``eval`` rows hold the mean ``bpb`` and its t-interval (``bpb_low``, ``bpb_high``,
    ``bpb_sd``, ``n``) per length, the bytes and files read, and the mean loss by
    position (None where a record lacks its own: a compact file's); ``learned_bias`` is
    the first seed's; ``seeds`` keeps every record.
    """
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        values = [per_seed[s]["eval"][i]["bpb"] for s in seeds]
        iv = interval(values, confidence)
        positions = [per_seed[s]["eval"][i].get("loss_by_position") for s in seeds]
        summary = {k: row[k] for k in ("factor", "length", "windows", "bytes") if k in row}
        if "files" in row:
            summary["files"] = row["files"]
        summary.update(
            bpb=iv["mean"],
            bpb_low=iv["low"],
            bpb_high=iv["high"],
            bpb_sd=iv["sd"],
            n=iv["n"],
            loss_by_position=(
                None
                if any(p is None for p in positions)
                else [round(statistics.fmean(at), 4) for at in zip(*positions)]
            ),
        )
        contexts = [per_seed[s]["eval"][i].get("context") for s in seeds]
        if all(c is not None for c in contexts):
            summary["context"] = _context_summary(contexts, confidence)
        rows.append(summary)
    return {
        "params": first["params"],
        "train": train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def _context_summary(contexts: list, confidence: float) -> dict:
    """The context-use measure of one length over seeds: intervals of the long and the
    sliding reading and of their paired difference, and the sliding reading's mean loss by
    position (the verdict itself: :func:`context_verdict`)."""
    sliding = [c.get("sliding_loss_by_position") for c in contexts]
    return {
        "window": contexts[0]["window"],
        "stride": contexts[0]["stride"],
        "long_bpb": interval([c["long_bpb"] for c in contexts], confidence),
        "sliding_bpb": interval([c["sliding_bpb"] for c in contexts], confidence),
        "difference": paired_interval([c["difference"] for c in contexts], None, confidence),
        "sliding_loss_by_position": (
            None
            if any(p is None for p in sliding)
            else [round(statistics.fmean(at), 4) for at in zip(*sliding)]
        ),
    }


def summarize_retrieval(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's probe records ``{seed: record}``: mean accuracy and t-interval per
    (length, distance), every seed's record under ``"seeds"``."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        iv = interval([per_seed[s]["eval"][i]["accuracy"] for s in seeds], confidence)
        rows.append(
            {
                "length": row["length"],
                "distance": row["distance"],
                "samples": row["samples"],
                "accuracy": iv["mean"],
                "accuracy_low": iv["low"],
                "accuracy_high": iv["high"],
                "accuracy_sd": iv["sd"],
                "n": iv["n"],
            }
        )
    return {
        "params": first["params"],
        "train": train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def train_summary(per_seed: dict) -> dict:
    trains = [rec["train"] for rec in per_seed.values()]
    out = {
        "steps": trains[0]["steps"],
        "final_loss_bits": statistics.fmean(t["final_loss_bits"] for t in trains),
        "wall_s": sum(t["wall_s"] for t in trains),
        "tokens_per_s": statistics.fmean(t["tokens_per_s"] for t in trains),
    }
    curves = [t["val_curve"] for t in trains if len(t.get("val_curve", ())) >= 2]
    if curves:
        out["val_levelled"] = [levelled_off(c) for c in curves]
    return out


def summarize_interventions(per_seed: dict, summarize) -> dict:
    """Each intervention of the records ``{seed: record}`` over seeds: its evaluation rows
    summarised as the plain ones (``summarize``), and a t-interval of every number it
    holds per seed (``within_train_len_bpb``, ...)."""
    records = list(per_seed.values())
    out = {}
    for name, first in records[0].get("interventions", {}).items():
        as_plain = {s: {**r, "eval": r["interventions"][name]["eval"]} for s, r in per_seed.items()}
        summary = {"eval": summarize(as_plain)["eval"]}
        for key, value in first.items():
            if isinstance(value, float):
                summary[key] = interval([r["interventions"][name][key] for r in records])
        out[name] = summary
    return out


# --- reading a summary -------------------------------------------------------------------------


def row_at(record: dict, factor: int) -> dict:
    """The evaluation row of ``record`` (a method's summary or one seed's record) at
    ``factor`` x the training length."""
    for row in record["eval"]:
        if row.get("factor") == factor:
            return row
    raise ValueError(f"factor must be one of {[r.get('factor') for r in record['eval']]}")


def at_factor(results: dict, method: str, factor: int) -> dict:
    """Mean and interval of ``method``'s bits per byte at ``factor`` x the training length."""
    row = row_at(results["methods"][method], factor)
    return {"mean": row["bpb"], "low": row["bpb_low"], "high": row["bpb_high"], "n": row["n"]}


def accuracy_at(results: dict, method: str, length: int, distance: int | None = None) -> dict:
    """Recall accuracy of ``method`` at one sequence ``length`` and ``distance`` (default:
    the farthest), mean and 95 % interval over seeds, the interval clipped to [0, 1]."""
    rows = [r for r in results["methods"][method]["eval"] if r["length"] == length]
    if not rows:
        raise ValueError(f"length {length} is not among the stored lengths")
    row = (
        rows[-1] if distance is None else next((r for r in rows if r["distance"] == distance), None)
    )
    if row is None:
        raise ValueError(f"distance must be one of {[r['distance'] for r in rows]}")
    return {
        "mean": row["accuracy"],
        "low": max(0.0, row["accuracy_low"]),
        "high": min(1.0, row["accuracy_high"]),
        "distance": row["distance"],
    }


def probe_lengths(results: dict) -> list[int]:
    """The sequence lengths a stored probe was tested at, shortest first."""
    return sorted({r["length"] for rec in results["methods"].values() for r in rec["eval"]})


def far_accuracy(results: dict, methods) -> dict:
    """``{method: {length: interval}}``: each method's recall accuracy at the farthest
    distance of every tested length (:func:`accuracy_at`)."""
    return {m: {n: accuracy_at(results, m, n) for n in probe_lengths(results)} for m in methods}


# --- training curves and longer training ----------------------------------------------------


def _per_seed_bpb(results: dict, method: str, factor: int, seeds=None) -> list[float]:
    """``method``'s bits per byte at ``factor`` x, one per seed (all, or ``seeds``)."""
    records = results["methods"][method]["seeds"]
    chosen = sorted(records, key=int) if seeds is None else [str(s) for s in seeds]
    return [row_at(records[s], factor)["bpb"] for s in chosen]


#: What :func:`levelled`'s verdict means for a training curve.
TRAINING_WORDS = {
    "lower": "still improving",
    "higher": "rising again",
    "at the edge": "levels off",
    "cannot be told apart": "levels off",
    "one seed": "one seed",
}


def levelled(results: dict, method: str) -> dict:
    """Whether ``method``'s validation curve at the training length levelled off: the
    per-seed change over the last 20 % of training (the curve's last value minus its value
    there) handed to :func:`verdict` against 0 (``answer``; ``words``: "still improving"
    where it still falls beyond the interval, "levels off" where it cannot be told apart
    from 0, :data:`TRAINING_WORDS`), and per run ``seeds`` (how many), ``levelled`` (how many
    fell by at most 0.02 bits there, :func:`levelled_off`) and ``largest_drop`` (bits, the
    most any seed still fell)."""
    per_seed = results["methods"][method]["train"].get("val_levelled", [])
    if not per_seed:
        raise ValueError(f"{method} has no validation curve in these results")
    v = verdict([-s["drop"] for s in per_seed])
    return {
        **v,
        "words": TRAINING_WORDS[v["answer"]],
        "seeds": len(per_seed),
        "levelled": sum(bool(s["levelled"]) for s in per_seed),
        "largest_drop": max(s["drop"] for s in per_seed),
    }


def spread_by_step(results: dict, methods) -> list[dict]:
    """How far apart ``methods`` are at the training length as training goes on: at each
    step of the validation curves, every method's mean over seeds and the ``spread``
    (largest mean minus smallest). Tells whether the differences close with training."""
    curves = {}
    for m in methods:
        per_seed = results["methods"][m]["seeds"].values()
        for record in per_seed:
            for point in record["train"].get("val_curve", []):
                curves.setdefault(point["step"], {}).setdefault(m, []).append(point["bpb"])
    rows = []
    for step in sorted(curves):
        means = {m: sum(v) / len(v) for m, v in curves[step].items()}
        if len(means) == len(methods):
            rows.append(
                {"step": step, "means": means, "spread": max(means.values()) - min(means.values())}
            )
    if not rows:
        raise ValueError(f"no validation curve common to {list(methods)}")
    return rows


def gap_by_step(results: dict, method: str, others) -> dict:
    """``{step: gap}``: along the validation curves at the training length, ``method``'s
    mean over seeds minus the mean of ``others``' means (:func:`spread_by_step`), e.g.
    whether one method's deficit is still closing when training ends."""
    others = [m for m in others if m != method]
    if not others:
        raise ValueError(f"others must hold a method besides {method!r}")
    rows = spread_by_step(results, [method, *others])
    return {
        r["step"]: r["means"][method] - sum(r["means"][m] for m in others) / len(others)
        for r in rows
    }


def nearest_step(by_step: dict, step: int) -> int:
    """The key of ``by_step`` (training steps) nearest to ``step``."""
    return min(by_step, key=lambda s: abs(s - step))


def longer_training(short: dict, longer: dict, methods) -> dict:
    """The same methods trained ``short`` and ``longer`` (more steps, otherwise the same
    configuration), compared per method on the seeds both runs hold of it (``seeds``):
    bits per byte at the training length and at the longest length after each
    (``short_1x``, ``longer_1x``, ``short_end``, ``longer_end``: mean and 95 % interval
    over those seeds, no interval for one seed); the longer run's largest fall over the
    last fifth of training (``drop``), how many of its seeds levelled off (``levelled``,
    :func:`levelled`) of how many (``runs``). ``"steps"`` gives both step counts."""
    configs = [r["provenance"]["config"] for r in (short, longer)]
    differ = sorted(
        k for k in {**configs[0], **configs[1]} if configs[0].get(k) != configs[1].get(k)
    )
    if differ != ["steps"] or not configs[1]["steps"] > configs[0]["steps"]:
        raise ValueError(
            "longer must be short's configuration with more steps; they differ in "
            f"{differ} (steps {configs[0]['steps']} and {configs[1]['steps']})"
        )
    end = max(row["factor"] for row in short["methods"][methods[0]]["eval"])
    rows = {}
    for m in methods:
        seeds = [int(s) for s in paired_seeds(short, m, m, longer)]
        lev = levelled(longer, m)
        rows[m] = {
            "seeds": seeds,
            "drop": lev["largest_drop"],
            "levelled": lev["levelled"],
            "runs": lev["seeds"],
        }
        for name, results in (("short", short), ("longer", longer)):
            for at, factor in (("1x", 1), ("end", end)):
                rows[m][f"{name}_{at}"] = interval(_per_seed_bpb(results, m, factor, seeds))
    return {"steps": [c["steps"] for c in configs], "end": end, "methods": rows}


# --- the loss past the training length, and a learned table's far edge -----------------


def loss_within_and_past(results: dict, method: str) -> dict:
    """``method``'s mean loss at the longest length, split at the training length ``m_l``:
    the first ``m_l`` positions of a window (``"within"``) and the rest (``"past"``), each
    per seed from the loss by position (or the two means a compact copy keeps in its place),
    then mean and 95 % interval over seeds; with
    ``"length"`` (the window) and ``"train_len"``."""
    train_len = results["provenance"]["config"]["train_len"]
    within, past, length = [], [], None
    for rec in results["methods"][method]["seeds"].values():
        row = max(rec["eval"], key=lambda r: r["length"])
        length = row["length"]
        if "within_train_len_bpb" in row:  # a compact copy keeps the two means
            within.append(row["within_train_len_bpb"])
            past.append(row["past_train_len_bpb"])
        else:
            pos = row["loss_by_position"]
            within.append(sum(pos[:train_len]) / train_len)
            past.append(sum(pos[train_len:]) / (len(pos) - train_len))
    return {
        "within": interval(within),
        "past": interval(past),
        "length": length,
        "train_len": train_len,
    }


# --- a stored sweep's numbers handed to the verdict --------------------------------------------


def _seeds_of(results: dict, method: str, seeds=None) -> list[str]:
    records = results["methods"][method]["seeds"]
    if seeds is None:
        return sorted(records, key=int)
    missing = [s for s in map(str, seeds) if s not in records]
    if missing:
        raise ValueError(f"{method} has no seed {missing} in these results (has {list(records)})")
    return [str(s) for s in seeds]


def _rows_at(results: dict, method: str, factor: int, seeds) -> list[dict]:
    records = results["methods"][method]["seeds"]
    return [row_at(records[s], factor) for s in seeds]


def _spans(rows: list[dict]):
    """The rows' ``bpb_by_span`` (``[seeds][spans]``), or None where a row lacks it."""
    spans = [row.get("bpb_by_span") for row in rows]
    return None if any(s is None for s in spans) else spans


def paired_seeds(results: dict, a: str, b: str, other: dict | None = None) -> list[str]:
    """The seeds that method ``a`` of ``results`` and method ``b`` (of ``other``, default the
    same results) both hold: the pairs of a paired comparison."""
    other = results if other is None else other
    held = [set(r["methods"][m]["seeds"]) for r, m in ((results, a), (other, b))]
    seeds = sorted(held[0] & held[1], key=int)
    if not seeds:
        raise ValueError(f"{a} and {b} share no seed: {sorted(held[0])} and {sorted(held[1])}")
    return seeds


def method_curve(results: dict, method: str, *, seeds=None, factors=None) -> dict:
    """:func:`curve_verdict` of ``method``'s bits per byte over the stored lengths (or
    ``factors`` x the training length), every seed's model read at every length; the text's
    error from the spans where the records keep them. Adds ``method`` and ``by_length``
    (mean and interval at each length)."""
    chosen = _seeds_of(results, method, seeds)
    factors = factors or [r["factor"] for r in results["methods"][method]["eval"]]
    values, by_span, by_length = {}, {}, {}
    for factor in factors:
        rows = _rows_at(results, method, factor, chosen)
        length = rows[0]["length"]
        values[length] = [r["bpb"] for r in rows]
        by_span[length] = _spans(rows)
        by_length[length] = interval(values[length])
    spans = None if any(v is None for v in by_span.values()) else by_span
    return {"method": method, "by_length": by_length, **curve_verdict(values, by_span=spans)}


def methods_verdict(results: dict, a: str, b: str, factor: int, *, other: dict | None = None):
    """:func:`verdict` of method ``a``'s bits per byte against ``b``'s at ``factor`` x the
    training length: paired on their shared seeds (the same seed trains every method on the
    same batches), the text's error from their spans. ``other``: ``b``'s results, when they
    come from another sweep of the same text (runs still paired by seed)."""
    other = results if other is None else other
    seeds = paired_seeds(results, a, b, other)
    rows_a, rows_b = _rows_at(results, a, factor, seeds), _rows_at(other, b, factor, seeds)
    spans_a, spans_b = _spans(rows_a), _spans(rows_b)
    err = None if spans_a is None or spans_b is None else text_error(spans_a, spans_b)
    v = verdict([r["bpb"] for r in rows_a], [r["bpb"] for r in rows_b], paired=True, error=err)
    return {**v, "seeds": [int(s) for s in seeds], "factor": factor}


def context_verdict(results: dict, method: str, *, seeds=None) -> dict:
    """Does ``method`` use the context past the training length? :func:`verdict` of the
    per-seed context-use differences (the long window minus the sliding one on the bytes
    past ``m_l``: :mod:`relbias.lab.context`) against 0, the text's error from the spans.
    Adds ``words`` (:data:`CONTEXT_WORDS`), ``long`` and ``sliding`` (intervals of the two
    readings' bits per byte) and ``stride``."""
    chosen = _seeds_of(results, method, seeds)
    records = results["methods"][method]["seeds"]
    found = []
    for s in chosen:
        rows = [r for r in records[s]["eval"] if "context" in r]
        if not rows:
            raise ValueError(f"{method} seed {s} has no context-use measure in these results")
        found.append(rows[-1]["context"])
    v = verdict(
        [c["difference"] for c in found],
        error=text_error([c["difference_by_span"] for c in found]),
    )
    return {
        **v,
        "words": CONTEXT_WORDS[v["answer"]],
        "long": interval([c["long_bpb"] for c in found]),
        "sliding": interval([c["sliding_bpb"] for c in found]),
        "stride": found[0]["stride"],
        "window": found[0]["window"],
    }


def accuracy_verdict(results: dict, a: str, b: str, length: int, distance=None) -> dict:
    """:func:`verdict` of method ``a``'s recall accuracy against ``b``'s at one length and
    distance (default the farthest): paired by seed (the same seed's probe batches and the
    same test sequences for every method), the probe's error from its test sequences."""
    seeds = paired_seeds(results, a, b)
    per = {}
    for m in (a, b):
        records = results["methods"][m]["seeds"]
        accs = []
        for s in seeds:
            rows = [r for r in records[s]["eval"] if r["length"] == length]
            if not rows:
                raise ValueError(f"length {length} is not among {m}'s stored lengths")
            row = (
                rows[-1]
                if distance is None
                else next((r for r in rows if r["distance"] == distance), None)
            )
            if row is None:
                raise ValueError(f"distance must be one of {[r['distance'] for r in rows]}")
            accs.append(row["accuracy"])
        per[m] = (accs, row["samples"], row["distance"])
    err = probe_error(per[a][0], per[a][1], minus=per[b][0])
    v = verdict(per[a][0], per[b][0], paired=True, error=err)
    return {**v, "seeds": [int(s) for s in seeds], "length": length, "distance": per[a][2]}
