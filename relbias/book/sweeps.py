"""The stored sweeps as the chapters show them: tables of mean and 95 % interval over seeds.

The numbers come from :mod:`relbias.lab.results` (the stored sweeps:
:func:`~relbias.lab.results.load_stored`) and :mod:`relbias.lab.stats` (intervals and
verdicts); the figures from
:mod:`relbias.lab.plots`. This module only lays the intervals out for
:func:`relbias.book.show_table`.
"""

from __future__ import annotations

import math

from relbias.book.display import glue, show_table
from relbias.lab.readings import (
    accuracy_at,
    at_factor,
    context_verdict,
    method_curve,
    seed_accuracies,
)
from relbias.lab.results import describe, load_stored, seed_count
from relbias.lab.stats import probe_error

__all__ = [
    "accuracy_table",
    "bpb_table",
    "beside_stored",
    "bpb_table_by_length",
    "context_sweep_steps",
    "curve_context_table",
    "curve_table",
    "curve_words",
    "distance_pair",
    "far_accuracy_table",
    "gap_by_seed",
    "glue_sweep",
    "pooled_accuracies",
    "probe_accuracies",
    "probe_distances",
    "records_context",
    "show_interval",
    "show_mean",
    "stored_once",
    "strongest_with_context",
]


def show_interval(iv: dict, digits: int = 2) -> str:
    """``mean [low, high]`` with ``digits`` decimals; ``mean (one seed)`` where one seed
    leaves no interval."""
    if math.isnan(iv["low"]) or math.isnan(iv["high"]):
        return f"{iv['mean']:.{digits}f} (one seed)"
    return f"{iv['mean']:.{digits}f} [{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


def show_mean(x: float) -> str:
    """A mean in few digits, as the answer boxes print them: three decimals below 0.1 in size
    (a small far-bytes difference), one from there on; never ``-0.000``."""
    text = f"{x:.3f}" if abs(x) < 0.1 else f"{x:.1f}"
    return "0.000" if text == "-0.000" else text


def bpb_table(results: dict, methods, *, digits: int = 2):
    """Rows and headers of a table: each method's mean bits per byte and 95 % interval per
    evaluation length (``mean [low, high]``), for :func:`relbias.book.show_table`."""
    factors = [row["factor"] for row in results["methods"][methods[0]]["eval"]]
    lengths = [row["length"] for row in results["methods"][methods[0]]["eval"]]
    headers = ["method", *(f"{n} ({f}x)" for n, f in zip(lengths, factors))]
    rows = [
        [m, *(show_interval(at_factor(results, m, f), digits) for f in factors)] for m in methods
    ]
    return rows, headers


def accuracy_table(results: dict, methods, length: int, *, digits: int = 2):
    """Rows and headers: each method's recall accuracy (mean [low, high] over seeds, the
    interval clipped to [0, 1]) per distance, at sequence length ``length``."""
    distances = [
        r["distance"] for r in results["methods"][methods[0]]["eval"] if r["length"] == length
    ]
    if not distances:
        raise ValueError(f"length {length} is not among the stored lengths")
    headers = ["method", *(f"d = {d}" for d in distances)]
    rows = [
        [m, *(show_interval(accuracy_at(results, m, length, d), digits) for d in distances)]
        for m in methods
    ]
    return rows, headers


def far_accuracy_table(far: dict, *, digits: int = 2):
    """Rows and headers of a table of :func:`~relbias.lab.readings.far_accuracy`'s ``far``: each
    method's recall accuracy at the farthest distance of every tested length, mean [95 %
    interval, clipped to [0, 1]] over seeds."""
    if not far:
        raise ValueError("far must hold at least one method (relbias.lab.readings.far_accuracy)")
    methods = list(far)
    lengths = list(far[methods[0]])
    headers = ["method", *(f"{n} tokens, d = {far[methods[0]][n]['distance']}" for n in lengths)]
    rows = [[m, *(show_interval(far[m][n], digits) for n in lengths)] for m in methods]
    return rows, headers


def curve_words(curve: dict) -> str:
    """A curve verdict (:func:`~relbias.lab.stats.curve_verdict`) as a table cell: its answer,
    with the length where it turns or levels off (``"improves, then degrades (512)"``)."""
    at = curve.get("turns_at") or curve.get("levels_from")
    return f"{curve['answer']} ({at})" if at else curve["answer"]


def curve_table(results: dict, methods, *, context: bool = True):
    """Rows and headers of a narrow table, one row per method of ``methods``: bits per byte
    at the training length and at the longest length (mean [95 % interval] over seeds), the
    whole curve's verdict (:func:`~relbias.lab.readings.method_curve`, :func:`curve_words`) and,
    with ``context`` (where the sweep records it), the context-use measure: the long window
    minus the sliding one on the bytes past the training length, with its verdict
    (:func:`~relbias.lab.readings.context_verdict`)."""
    first = results["methods"][methods[0]]["eval"]
    start, end = first[0]["factor"], first[-1]["factor"]
    rows = []
    for m in methods:
        row = [
            m,
            show_interval(at_factor(results, m, start)),
            show_interval(at_factor(results, m, end)),
            curve_words(method_curve(results, m)),
        ]
        if context:
            ctx = context_verdict(results, m)
            row += [show_interval(ctx, 3), ctx["words"]]
        rows.append(row)
    headers = ["method", f"{start}x", f"{end}x", "the whole curve"]
    if context:
        headers += ["far context: long - sliding", "verdict"]
    return rows, headers


#: The stored text sweeps, longest-trained first (the order a finding looks for evidence in).
TEXT_SWEEPS = ("extrapolation_15000", "extrapolation")


def records_context(results: dict, method: str) -> bool:
    """Whether every seed of ``method`` in ``results`` records the context-use measure."""
    seeds = results["methods"].get(method, {}).get("seeds", {})
    return bool(seeds) and all(
        any("context" in row for row in rec["eval"]) for rec in seeds.values()
    )


def strongest_with_context(method: str, kinds=TEXT_SWEEPS) -> tuple[str, dict]:
    """The longest-trained stored sweep of ``kinds`` whose runs of ``method`` record the
    context-use measure: ``(kind, results)``. A finding about the context past the training
    length states it on these, and says which (its steps)."""
    for kind in kinds:
        results = load_stored(kind)
        if records_context(results, method):
            return kind, results
    raise ValueError(f"no stored sweep of {list(kinds)} records the context measure of {method}")


def bpb_table_by_length(runs: dict, *, digits: int = 2):
    """Rows and headers of a narrow table of bits per byte, one row per evaluation length
    and one column per entry of ``runs`` (``{column title: (results, method)}``, e.g. one
    method of two sweeps, or a model as trained and with an intervention): mean [95 %
    interval] over seeds. Every entry must hold the same lengths."""
    columns = list(runs.items())
    first_results, first_method = columns[0][1]
    evals = first_results["methods"][first_method]["eval"]
    rows = []
    for row in evals:
        f = row["factor"]
        rows.append(
            [f"{row['length']} ({f}x)"]
            + [show_interval(at_factor(r, m, f), digits) for _, (r, m) in columns]
        )
    return rows, ["window (bytes)", *(title for title, _ in columns)]


def glue_sweep(prefix: str, results: dict, methods) -> dict:
    """Glue what a chapter's prose says about ``methods`` in a stored sweep, and return it.

    For the sweep: ``{prefix}_seeds``, ``_steps``, ``_train_len``, ``_commit`` (and
    ``_eval_kb``, ``_files`` for text). For each method ``m`` and each evaluation factor
    ``f``: ``{prefix}_{m}_bpb{f}`` (``mean [low, high]``) and ``{prefix}_{m}_curve`` (the
    whole curve's verdict, :func:`curve_words`). Returns ``{"describe": ..., "curve": {m:
    ...}}`` for the chapter's checks.
    """
    info = describe(results)
    for key, value in info.items():
        glue(f"{prefix}_{key}", value)
    curves = {}
    for m in methods:
        for row in results["methods"][m]["eval"]:
            f = row["factor"]
            glue(f"{prefix}_{m}_bpb{f}", show_interval(at_factor(results, m, f)))
        curves[m] = method_curve(results, m)
        glue(f"{prefix}_{m}_curve", curve_words(curves[m]))
    return {"describe": info, "curve": curves}


# --- a chapter's live run beside the stored sweep (issue 30) ---------------------------------

#: The settings that make two runs of one method the same experiment (besides the seed).
SAME_RUN = ("train_len", "steps", "batch_size", "dim", "depth", "heads", "lr", "corpus_bytes")


def beside_stored(live: dict, stored: dict, config, *, display: bool = True):
    """A chapter's live runs beside the stored sweep's interval for the same methods.

    ``live``: ``{method: rows}``, the rows of :func:`relbias.lab.evaluation.evaluate_lengths`
    (``factor``, ``bpb``) of each model the chapter trained with ``config``; ``stored``: a
    sweep of :func:`relbias.lab.results.load_stored` that holds every method. One row per
    method and factor the two share: the live bits per byte and the stored mean [95 %
    interval] over seeds. The caption says whether the two ran the same configuration (then
    the live run is one more seed of the stored experiment, as on a GPU, which trains the
    stored sweeps' configuration) or not (as on a CPU: compare how each changes with the
    length, not the numbers). Shows the table (or returns it with ``display=False``)."""
    kept = stored["provenance"]["config"]
    rows = []
    for method, live_rows in live.items():
        if method not in stored["methods"]:
            raise ValueError(
                f"live methods must be among the stored {sorted(stored['methods'])}, got {method!r}"
            )
        bpb = {row["factor"]: row["bpb"] for row in live_rows}
        shared = [r["factor"] for r in stored["methods"][method]["eval"] if r["factor"] in bpb]
        if not shared:
            raise ValueError(f"the live rows of {method!r} share no factor with the stored sweep")
        rows += [
            [method, f"{f}x", bpb[f], show_interval(at_factor(stored, method, f))] for f in shared
        ]
    same = all(getattr(config, k, None) == kept.get(k) for k in SAME_RUN)
    headers = [
        "method",
        "window",
        f"live: {config.name}, seed {config.seed}",
        f"stored: {kept.get('name', '?')}, {seed_count(stored, next(iter(live)))} seeds",
    ]
    if same:
        why = "the same configuration: the live run is one more seed of the stored sweep"
    else:
        why = (
            f"not the same configuration (live: training length {config.train_len}, "
            f"{config.steps} steps; stored: {kept['train_len']}, {kept['steps']} steps), so "
            "compare how each changes with the length, not the numbers"
        )
    caption = f"Bits per byte, the live run beside the stored sweep: {why}."
    return show_table(rows, headers, floatfmt=".2f", caption=caption, display=display)


# --- a finding about extrapolation: the whole curve and the far context (chapters 4, 5) ---------


#: The stored text sweeps :func:`context_sweep_steps` has read, by kind: each is read once per
#: process (a chapter asks for several methods, and the stored files do not change under it).
_READ: dict = {}


def stored_once(kind: str) -> dict:
    """:func:`~relbias.lab.results.load_stored` of ``kind``, read once per process: a chapter
    that reads one sweep in several cells (its claims, its tables, the context measure) reads
    the files once. The result is shared: read it, do not change it."""
    if kind not in _READ:
        _READ[kind] = load_stored(kind)
    return _READ[kind]


def context_sweep_steps(method: str, kinds=TEXT_SWEEPS) -> tuple[str, dict, int]:
    """:func:`strongest_with_context` of ``method`` with the number of training steps its
    runs had: ``(kind, results, steps)``, so that a chapter says which training its context
    finding rests on. Each sweep of ``kinds`` is read once per process."""
    for kind in kinds:
        results = stored_once(kind)
        if records_context(results, method):
            return kind, results, int(results["provenance"]["config"]["steps"])
    raise ValueError(f"no stored sweep of {list(kinds)} records the context measure of {method}")


def curve_context_table(results: dict, methods, *, digits: int = 2, kinds=TEXT_SWEEPS):
    """Rows and headers of a narrow table, one row per method of ``methods``: bits per byte
    at the training length and at the longest length of ``results`` (the longest-trained
    sweep; mean [95 % interval] over seeds), the whole curve's verdict there
    (:func:`~relbias.lab.readings.method_curve`), and the context-use measure (the long window
    minus the sliding one on the bytes past the training length, mean [95 % interval], and
    its verdict, :func:`~relbias.lab.readings.context_verdict`) on the longest-trained sweep that
    records it for the method (of ``kinds``: :func:`context_sweep_steps`), with that sweep's
    steps.

    Unlike :func:`curve_table`, the two readings may come from different sweeps: the
    longest-trained text sweep need not record the context measure."""
    first = results["methods"][methods[0]]["eval"]
    start, end = first[0]["factor"], first[-1]["factor"]
    rows = []
    for m in methods:
        _, ctx_results, steps = context_sweep_steps(m, kinds)
        ctx = context_verdict(ctx_results, m)
        rows.append(
            [
                m,
                show_interval(at_factor(results, m, start), digits),
                show_interval(at_factor(results, m, end), digits),
                curve_words(method_curve(results, m)),
                f"{show_interval(ctx, 3)} ({steps:,} steps)",
                ctx["words"],
            ]
        )
    headers = [
        "method",
        f"{start}x",
        f"{end}x",
        "the whole curve",
        "far bytes: long - sliding",
        "far context",
    ]
    return rows, headers


# --- the recall probe read distance by distance (chapters 4, 5) --------------------------------


def probe_accuracies(results: dict, method: str, length: int, distance: int | None = None):
    """``method``'s recall accuracy in windows of ``length`` tokens at ``distance`` (default
    the farthest), one number per seed (seeds in order): ``(values, samples, distance)``,
    ``samples`` the test sequences per seed (:func:`relbias.lab.readings.seed_accuracies`)."""
    return seed_accuracies(results, method, length, distance)


def distance_pair(results: dict, method: str, length: int, far: int | None, near: int):
    """One model's recall at two distances, for a paired verdict of ``far`` against ``near``
    (the same seed's model read at both; ``far=None``: the farthest of the window):
    ``(far values, near values, error)``, ``error`` the probe's own sampling error of the
    difference (:func:`~relbias.lab.stats.probe_error`: the test sequences at the two
    distances are drawn independently). Hand them to :func:`relbias.book.claims.paired`
    (``error=``) or :func:`relbias.lab.stats.verdict`."""
    a, samples, _ = probe_accuracies(results, method, length, far)
    b, _, _ = probe_accuracies(results, method, length, near)
    return a, b, probe_error(a, samples, minus=b)


def pooled_accuracies(results: dict, method: str, length: int, *, max_distance: int):
    """``method``'s recall accuracy in windows of ``length`` tokens averaged over every
    tested distance up to ``max_distance`` (e.g. the trained ones), one number per seed
    (seeds in order): ``(values, samples)``, ``samples`` the test sequences per seed behind
    each mean (for :func:`~relbias.lab.stats.probe_error`)."""
    records = results["methods"][method]["seeds"]
    values, samples = [], None
    for s in sorted(records, key=int):
        rows = [
            r for r in records[s]["eval"] if r["length"] == length and r["distance"] <= max_distance
        ]
        if not rows:
            raise ValueError(f"no distance up to {max_distance} at length {length} for {method}")
        values.append(sum(r["accuracy"] for r in rows) / len(rows))
        samples = sum(r["samples"] for r in rows)
    return values, samples


def gap_by_seed(results: dict, method: str, others, step: int | None = None) -> list[float]:
    """Per seed (in order), ``method``'s validation bits per byte at the training length minus
    the mean of ``others``' at training step ``step`` (default: the last), from the runs'
    validation curves: the per-seed form of :func:`~relbias.lab.readings.gap_by_step`, for a
    paired verdict (one seed's runs share their batches)."""
    others = [m for m in others if m != method]
    if not others:
        raise ValueError(f"others must hold a method besides {method!r}")

    def at(m: str, seed: str) -> float:
        curve = results["methods"][m]["seeds"][seed]["train"].get("val_curve", [])
        if not curve:
            raise ValueError(f"{m} seed {seed} has no validation curve")
        if step is None:
            return curve[-1]["bpb"]
        point = next((p for p in curve if p["step"] == step), None)
        if point is None:
            raise ValueError(f"step must be one of the curve's steps, got {step}")
        return point["bpb"]

    seeds = sorted(
        set.intersection(*(set(results["methods"][m]["seeds"]) for m in [method, *others])),
        key=int,
    )
    return [at(method, s) - sum(at(m, s) for m in others) / len(others) for s in seeds]


def probe_distances(results: dict, method: str, length: int) -> list[int]:
    """The distances ``method`` was tested at in windows of ``length`` tokens, nearest
    first."""
    found = sorted(
        r["distance"] for r in results["methods"][method]["eval"] if r["length"] == length
    )
    if not found:
        raise ValueError(f"length {length} is not among {method}'s stored lengths")
    return found
