"""Chapter 8's helpers: which run each number comes from, and the book's Table 2.4 read on
whole curves.

A chapter that reads several stored sweeps says which number comes from which in one box:
:func:`runs_rows` lays out, for each run, its configuration, training length, steps, seeds,
methods and whether its records hold the context-use measure (:mod:`relbias.lab.context`),
beside what the chapter uses it for; :func:`runs_box` shows them as a MyST admonition (a
Markdown output: MyST in the built book). :func:`table_2_4_curves` is
:func:`relbias.book.overview.table_2_4_rows` with its last column, the change from the
training length to the longest, replaced by the whole curve's verdict
(:func:`relbias.lab.readings.method_curve`); :func:`context_rows` tabulates the context-use
measure of each method on the longest-trained sweep that records it.
"""

from __future__ import annotations

from IPython.display import Markdown
from IPython.display import display as _display

from relbias.book.display import show_table
from relbias.book.overview import table_2_4_rows
from relbias.book.sweeps import (
    TEXT_SWEEPS,
    curve_words,
    records_context,
    show_interval,
    strongest_with_context,
)
from relbias.lab.config import Config
from relbias.lab.readings import context_verdict, method_curve
from relbias.lab.results import describe, seed_count

__all__ = [
    "RUN_HEADERS",
    "context_rows",
    "live_row",
    "run_row",
    "runs_box",
    "runs_rows",
    "table_2_4_curves",
]

#: The columns of :func:`runs_rows`.
RUN_HEADERS = [
    "run",
    "configuration",
    "$m_l$ (bytes)",
    "training steps",
    "seeds",
    "methods",
    "context measure",
    "in this chapter",
]


def _context_words(results: dict, methods: list[str]) -> str:
    held = [m for m in methods if records_context(results, m)]
    if not held:
        return "no"
    if len(held) == len(methods):
        return "every method"
    return f"{len(held)} of {len(methods)} methods"


def run_row(name: str, results: dict, used: str) -> list:
    """One row of :func:`runs_rows` for a stored sweep ``results`` (text or probe, as
    :func:`relbias.lab.results.load_stored` or :func:`~relbias.lab.results.load_results`
    return it): ``name`` as the chapter calls it, ``used`` what the chapter uses it for."""
    if "methods" not in results or "provenance" not in results:
        raise ValueError(f"{name}: results must be a stored sweep (with methods and provenance)")
    config = results["provenance"]["config"]
    methods = list(results["methods"])
    probe = results.get("kind") == "retrieval"
    steps = f"{config['probe_steps']:,} (probe)" if probe else f"{config['steps']:,}"
    seeds = max(seed_count(results, m) for m in methods)
    context = "n/a (probe)" if probe else _context_words(results, methods)
    return [name, config["name"], config["train_len"], steps, seeds, len(methods), context, used]


def live_row(name: str, config: Config, methods, used: str) -> list:
    """The row of a chapter's live run: ``config`` trained now, on ``methods``, one seed
    (every evaluation of the lab records the context measure)."""
    return [
        name,
        config.name,
        config.train_len,
        f"{config.steps:,}",
        1,
        len(list(methods)),
        "every method",
        used,
    ]


def runs_rows(rows) -> tuple[list, list[str]]:
    """Rows and headers (:data:`RUN_HEADERS`) for :func:`relbias.book.show_table`, from rows
    of :func:`run_row` and :func:`live_row`."""
    rows = [list(r) for r in rows]
    if not rows:
        raise ValueError("rows must hold at least one run")
    bad = [r[0] for r in rows if len(r) != len(RUN_HEADERS)]
    if bad:
        raise ValueError(f"every row must have {len(RUN_HEADERS)} columns (run_row): {bad}")
    return rows, list(RUN_HEADERS)


def runs_box(rows, *, title: str = "Which run each number comes from", note: str = "") -> None:
    """Display the runs of :func:`runs_rows` as a MyST admonition, ``note`` (Markdown) below
    the table."""
    body = show_table(*runs_rows(rows), display=False).markdown
    text = f":::{{admonition}} {title}\n:class: tip\n\n{body.strip()}\n"
    if note:
        text += f"\n{note.strip()}\n"
    _display(Markdown(text + ":::\n"))


def table_2_4_curves(results: dict, config, *, cost_length: int = 1024):
    """The book's Table 2.4 extended (:func:`relbias.book.overview.table_2_4_rows`), its last
    column the whole curve's verdict over the stored lengths of ``results``
    (:func:`relbias.lab.readings.method_curve`, :func:`relbias.book.sweeps.curve_words`)
    instead of the change between the two ends: ``(rows, headers)``."""
    rows, headers = table_2_4_rows(results, config, cost_length=cost_length)
    rows = [[*row[:-1], curve_words(method_curve(results, row[0]))] for row in rows]
    return rows, [*headers[:-1], "the whole curve"]


def context_rows(methods, kinds=TEXT_SWEEPS, *, digits: int = 3, sweep_for=None):
    """Rows and headers of a narrow table of the context-use measure, one row per method of
    ``methods``, each read on the longest-trained stored sweep of ``kinds`` that records it
    for that method (:func:`relbias.book.sweeps.strongest_with_context`; ``sweep_for``, a
    function of the method returning the results to read, replaces that choice): the
    sweep's training steps, the long and the sliding reading of the bytes past the training
    length and their paired difference (mean [95 % interval] over seeds) with its verdict
    (:func:`relbias.lab.readings.context_verdict`)."""
    if sweep_for is None:

        def sweep_for(method):
            return strongest_with_context(method, kinds)[1]

    rows = []
    for m in methods:
        results = sweep_for(m)
        v = context_verdict(results, m)
        rows.append(
            [
                m,
                f"{describe(results)['steps']:,}",
                show_interval(v["long"], 2),
                show_interval(v["sliding"], 2),
                show_interval(v, digits),
                v["words"],
            ]
        )
    headers = ["method", "steps", "long", "sliding", "long − sliding", "verdict"]
    return rows, headers
