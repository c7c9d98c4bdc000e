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
from relbias.lab.results import describe, load_stored, seed_count
from relbias.lab.stats import accuracy_at, at_factor, context_verdict, method_curve

__all__ = [
    "accuracy_table",
    "bpb_table",
    "beside_stored",
    "bpb_table_by_length",
    "curve_table",
    "curve_words",
    "far_accuracy_table",
    "glue_sweep",
    "records_context",
    "show_interval",
    "strongest_with_context",
]


def show_interval(iv: dict, digits: int = 2) -> str:
    """``mean [low, high]`` with ``digits`` decimals; ``mean (one seed)`` where one seed
    leaves no interval."""
    if math.isnan(iv["low"]) or math.isnan(iv["high"]):
        return f"{iv['mean']:.{digits}f} (one seed)"
    return f"{iv['mean']:.{digits}f} [{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


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
    """Rows and headers of a table of :func:`~relbias.lab.stats.far_accuracy`'s ``far``: each
    method's recall accuracy at the farthest distance of every tested length, mean [95 %
    interval, clipped to [0, 1]] over seeds."""
    if not far:
        raise ValueError("far must hold at least one method (relbias.lab.stats.far_accuracy)")
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
    whole curve's verdict (:func:`~relbias.lab.stats.method_curve`, :func:`curve_words`) and,
    with ``context`` (where the sweep records it), the context-use measure: the long window
    minus the sliding one on the bytes past the training length, with its verdict
    (:func:`~relbias.lab.stats.context_verdict`)."""
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
