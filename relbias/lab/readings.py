"""Readings of a stored sweep (a result file of :mod:`relbias.lab.results`): its numbers at a
length, its training curves, and its comparisons handed to the one verdict function.

- :func:`row_at`, :func:`at_factor`, :func:`accuracy_at`, :func:`probe_lengths`,
  :func:`far_accuracy`, :func:`seed_accuracies`, :func:`loss_within_and_past`: numbers of a
  summary;
- :func:`levelled` (the one "levelled off" rule, :func:`relbias.lab.stats.levelled_verdict`),
  :func:`spread_by_step`, :func:`gap_by_step`, :func:`longer_training`: training curves and
  longer training;
- :func:`method_curve`, :func:`methods_verdict`, :func:`context_verdict`,
  :func:`accuracy_verdict`: the sweep's per-seed numbers handed to
  :func:`relbias.lab.stats.verdict` (paired by seed where the runs are).
"""

from __future__ import annotations

from relbias.lab.probe import chance_among_present
from relbias.lab.stats import (
    curve_verdict,
    interval,
    levelled_verdict,
    probe_error,
    text_error,
    verdict,
)

#: What :func:`context_verdict`'s answers mean: the long window against the sliding one.
CONTEXT_WORDS = {
    "lower": "uses the far context",
    "higher": "reads the far bytes worse",
    "at the edge": "at the edge",
    "cannot be told apart": "no use of the far context shown",
    "one seed": "one seed",
}


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


def probe_chance(results: dict) -> float:
    """A stored probe's chance, a random pick among the digits present:
    :func:`relbias.lab.probe.chance_among_present` of the file's ``num_competitors``
    (5/12 for the stored competing probe)."""
    return chance_among_present(results["probe"]["num_competitors"])


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


def levelled(results: dict, method: str) -> dict:
    """Whether ``method``'s validation curves at the training length levelled off, by the one
    rule (:func:`relbias.lab.stats.levelled_verdict`: each seed's fall over the last fifth of
    training, handed to the verdict against 0)."""
    per_seed = results["methods"][method]["train"].get("val_levelled", [])
    if not per_seed:
        raise ValueError(f"{method} has no validation curve in these results")
    return levelled_verdict([s["drop"] for s in per_seed])


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
    last fifth of training (``drop``), whether it levelled off by the one rule
    (``levelled_off``, ``words``: :func:`levelled`) and over how many runs (``runs``).
    ``"steps"`` gives both step counts."""
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
            "levelled_off": lev["levelled_off"],
            "words": lev["words"],
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


def seed_accuracies(results: dict, method: str, length: int, distance=None, seeds=None):
    """``method``'s recall accuracy in windows of ``length`` at ``distance`` (default the
    farthest), one number per seed (all in order, or ``seeds``): ``(values, samples,
    distance)``, ``samples`` the test sequences per seed."""
    records = results["methods"][method]["seeds"]
    values, samples, found = [], None, None
    for s in sorted(records, key=int) if seeds is None else seeds:
        rows = [r for r in records[s]["eval"] if r["length"] == length]
        if not rows:
            raise ValueError(f"length {length} is not among {method}'s stored lengths")
        row = (
            rows[-1]
            if distance is None
            else next((r for r in rows if r["distance"] == distance), None)
        )
        if row is None:
            raise ValueError(f"distance must be one of {[r['distance'] for r in rows]}")
        values.append(row["accuracy"])
        samples, found = row["samples"], row["distance"]
    return values, samples, found


def accuracy_verdict(results: dict, a: str, b: str, length: int, distance=None) -> dict:
    """:func:`verdict` of method ``a``'s recall accuracy against ``b``'s at one length and
    distance (default the farthest): paired by seed (the same seed's probe batches and the
    same test sequences for every method), the probe's error from its test sequences."""
    seeds = paired_seeds(results, a, b)
    per = {m: seed_accuracies(results, m, length, distance, seeds) for m in (a, b)}
    err = probe_error(per[a][0], per[a][1], minus=per[b][0])
    v = verdict(per[a][0], per[b][0], paired=True, error=err)
    return {**v, "seeds": [int(s) for s in seeds], "length": length, "distance": per[a][2]}


def recall_above_chance(results: dict, method: str, length: int) -> dict:
    """:func:`verdict` of ``method``'s recall at the farthest distance of ``length`` minus the
    probe's chance (:func:`probe_chance`: a random pick among the digits present), per seed,
    with the probe's own binomial error."""
    chance = probe_chance(results)
    values, samples, _ = seed_accuracies(results, method, length)
    return verdict(
        [a - chance for a in values], None, paired=True, error=probe_error(values, samples)
    )
