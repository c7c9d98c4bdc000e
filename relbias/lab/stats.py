"""The statistics of the lab: intervals over seeds, a sweep's summaries, and verdicts.

- :func:`interval`, :func:`separates`, :func:`order`, :func:`levelled_off`: the numbers;
- :func:`summarize_extrapolation`, :func:`summarize_retrieval`: a method's records over
  seeds as the summary a result file stores (mean and interval per length);
- :func:`at_factor`, :func:`accuracy_at`, ...: one interval read from a summary;
- :func:`compare`, :func:`trend`, :func:`longer_training`, ...: the verdicts a chapter
  states, each claiming a difference only where the intervals say so.

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
        rows.append(summary)
    return {
        "params": first["params"],
        "train": train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
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


# --- verdicts: an order only where the intervals separate ----------------------------------------


def compare(results: dict, a: str, b: str, factor: int) -> str:
    """``"lower"`` or ``"higher"`` when ``a``'s interval at ``factor`` lies wholly below or
    above ``b``'s, else ``"overlapping"``: the rule before a chapter claims an ordering."""
    return order(at_factor(results, a, factor), at_factor(results, b, factor))


def order(ia: dict, ib: dict) -> str:
    """``"lower"``, ``"higher"`` or ``"overlapping"``: interval ``ia`` against ``ib`` (from
    :func:`at_factor`, :func:`accuracy_at` or two different sweeps)."""
    if not separates(ia, ib):
        return "overlapping"
    return "lower" if ia["high"] < ib["low"] else "higher"


def _per_seed_bpb(results: dict, method: str, factor: int, seeds=None) -> list[float]:
    """``method``'s bits per byte at ``factor`` x, one per seed (all, or ``seeds``)."""
    records = results["methods"][method]["seeds"]
    chosen = sorted(records, key=int) if seeds is None else [str(s) for s in seeds]
    return [row_at(records[s], factor)["bpb"] for s in chosen]


def trend(results: dict, method: str, *, start: int = 1, end: int | None = None) -> dict:
    """How ``method``'s bits per byte change from ``start`` x to ``end`` x (default the
    longest) the training length, over seeds: the interval of the per-seed change
    (``mean``, ``low``, ``high``) and the ``verdict``: ``"degrades"`` (the whole interval
    above 0), ``"improves"`` (below 0) or ``"neither degrades nor improves beyond the
    interval"``; with one seed there is no interval and the verdict is ``"one seed, no
    verdict"``."""
    end = end or max(row["factor"] for row in results["methods"][method]["eval"])
    first = _per_seed_bpb(results, method, start)
    last = _per_seed_bpb(results, method, end)
    change = interval([b - a for a, b in zip(first, last)])
    if change["n"] < 2:
        verdict = "one seed, no verdict"
    elif change["low"] > 0:
        verdict = "degrades"
    elif change["high"] < 0:
        verdict = "improves"
    else:
        verdict = "neither degrades nor improves beyond the interval"
    return {**change, "verdict": verdict, "start": start, "end": end}


def levelled(results: dict, method: str) -> dict:
    """Whether ``method``'s validation curve at the training length levelled off, per seed:
    ``seeds`` (how many), ``levelled`` (how many fell by at most 0.02 bits over the last
    20 % of training) and ``largest_drop`` (bits, the most any seed still fell there)."""
    per_seed = results["methods"][method]["train"].get("val_levelled", [])
    if not per_seed:
        raise ValueError(f"{method} has no validation curve in these results")
    return {
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


def spread_of(intervals: dict) -> dict:
    """How far apart methods are, from one interval each (``{method: interval}``, e.g.
    their bits per byte at one length): ``highest`` and ``lowest`` (by mean), ``spread``
    (the difference of those means), ``rest_spread`` (the spread without the highest),
    ``apart`` (the pairs, in the given order, whose intervals separate: :func:`order`)
    and ``pairs`` (how many pairs there are)."""
    if len(intervals) < 2:
        raise ValueError(f"intervals must hold at least two methods, got {list(intervals)}")
    names = list(intervals)
    by_mean = sorted(names, key=lambda m: intervals[m]["mean"])
    rest = [intervals[m]["mean"] for m in by_mean[:-1]]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    return {
        "highest": by_mean[-1],
        "lowest": by_mean[0],
        "spread": intervals[by_mean[-1]]["mean"] - intervals[by_mean[0]]["mean"],
        "rest_spread": max(rest) - min(rest),
        "apart": [(a, b) for a, b in pairs if order(intervals[a], intervals[b]) != "overlapping"],
        "pairs": len(pairs),
    }


def shared_seeds(short: dict, longer: dict, method: str) -> list[int]:
    """The seeds of ``method`` that both runs hold."""
    held = [set(map(int, r["methods"][method]["seeds"])) for r in (short, longer)]
    seeds = sorted(held[0] & held[1])
    if not seeds:
        raise ValueError(
            f"the runs share no seed of {method}: {sorted(held[0])} and {sorted(held[1])}"
        )
    return seeds


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
        seeds = shared_seeds(short, longer, m)
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


def gate_summary(results: dict, method: str) -> dict:
    """What ``method``'s forget gates learned, over seeds (the records' ``learned_gate``):
    ``mean_log_forget`` (the mean of :math:`\\log f_t` over seeds, layers, heads and
    tokens), ``half_life`` (``ln 2`` over its negative, in tokens), ``most_open`` (the
    head mean closest to 0) and, on probe sequences, ``bias_at_distance`` (the mean
    bias the gates put on the answer, ``distance`` back; ``least_bias``, the head closest
    to 0; ``least_bias_per_run``, that head's bias in each seed's run)."""
    seeds = results["methods"][method].get("seeds", {})
    gates = [rec["learned_gate"] for rec in seeds.values() if rec.get("learned_gate")]
    if not gates:
        raise ValueError(f"{method} has no gate read-back in these results")

    def flat(key):
        return [v for g in gates for row in g[key] for v in row]

    heads = flat("mean_log_forget")
    mean = sum(heads) / len(heads)
    out = {
        "seeds": len(gates),
        "mean_log_forget": mean,
        "half_life": math.log(2) / -mean if mean < 0 else math.inf,
        "most_open": max(heads),
    }
    if "bias_at_distance" in gates[0]:
        bias = flat("bias_at_distance")
        out.update(
            distance=gates[0]["distance"],
            bias_at_distance=sum(bias) / len(bias),
            least_bias=max(bias),
            least_bias_per_run=[max(max(row) for row in g["bias_at_distance"]) for g in gates],
        )
    return out


def far_penalty(results: dict, method: str) -> dict:
    """How hard ``method``'s learned table (the records' ``learned_bias``: one row per head,
    offsets 0 to the farthest read back) penalises the farthest offset, over seeds: the
    per-seed mean over heads of the farthest offset's bias minus the head's largest
    (``mean``, ``low``, ``high``: 0 is no penalty at all), and ``lowest_far`` (heads, over
    all seeds, whose farthest offset has their lowest bias: a table falling to the end)
    of ``heads``."""
    seeds = results["methods"][method].get("seeds", {})
    tables = [rec["learned_bias"]["values"] for rec in seeds.values() if rec.get("learned_bias")]
    if not tables:
        raise ValueError(f"{method} has no learned-bias read-back in these results")
    per_seed = [sum(row[-1] - max(row) for row in t) / len(t) for t in tables]
    rows = [row for t in tables for row in t]
    return {
        **interval(per_seed),
        "lowest_far": sum(row[-1] <= min(row) for row in rows),
        "heads": len(rows),
        "offset": len(rows[0]) - 1,
    }


def compare_accuracy(results: dict, a: str, b: str, length: int, distance=None) -> str:
    """``"lower"``, ``"higher"`` or ``"overlapping"``: ``a``'s recall accuracy against
    ``b``'s at one length and distance (default the farthest), by their intervals."""
    return order(*(accuracy_at(results, m, length, distance) for m in (a, b)))


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


def edge_above_min(results: dict, method: str = "offset", offset: int | None = None) -> dict:
    """How far a learned table's value at ``offset`` sits above the table's minimum up to
    that offset, per head and seed, from the records' read-back (``learned_bias``, offsets
    0 onwards). The default offset is the clipped offset table's edge ``u_{m_l-1}``, the
    value every farther offset reads; for T5 pass the farthest offset read back (``-1``).
    Returns ``values`` (every head of every seed), ``low`` and ``high`` (their range),
    ``above`` (heads whose value lies above the minimum: those keys favoured over the
    middle ones) of ``heads``, and ``below_max``, the range of the value minus the table's
    largest."""
    if offset is None:
        offset = results["provenance"]["config"]["train_len"] - 1
    values, below = [], []
    for rec in results["methods"][method]["seeds"].values():
        for row in rec["learned_bias"]["values"]:
            table = row[: offset + 1] if offset >= 0 else row[: len(row) + offset + 1]
            values.append(table[-1] - min(table))
            below.append(table[-1] - max(table))
    return {
        "values": values,
        "low": min(values),
        "high": max(values),
        "above": sum(v > 0 for v in values),
        "heads": len(values),
        "below_max": (min(below), max(below)),
    }
