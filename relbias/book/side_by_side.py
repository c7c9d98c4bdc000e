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

For the lesson: :func:`answer_rows` builds its answer table (a mechanism per method, and the
whole curve, the far bytes and far recall, each verdict linked to its lab-notes section);
:func:`curve_groups` and :func:`plot_curves` draw the curves grouped by their shape, each panel
on its own scale; :func:`plot_t5_bias` draws T5's trained bias from the stored read-back;
:func:`rezoom_late` keeps a shorter run's training curve in view beside a longer one.
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
    "MECHANISM",
    "QUICK_RUNS",
    "RUN_HEADERS",
    "answer_rows",
    "context_rows",
    "curve_groups",
    "live_row",
    "plot_curves",
    "plot_t5_bias",
    "rezoom_late",
    "run_row",
    "runs_box",
    "runs_rows",
    "t5_tables",
    "table_2_4_curves",
]

#: The stored quick-configuration runs Chapter 8's pages read (every other finding rests on
#: medium-configuration sweeps): the explorer's sweep, Chapter 7's interpolation runs and the
#: first, single-key recall probe.
QUICK_RUNS = ("extrapolation_quick", "interpolation_quick", "retrieval_quick")

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


# --- the lesson's answer box and its figures -------------------------------------------------

#: One line per method: how it tells the model where a key is (the lesson's answer box).
MECHANISM = {
    "offset": "one learned value per offset and head; offsets past m_l − 1 read the last one's",
    "t5": "one learned value per bucket of offsets; buckets widen with the distance",
    "alibi": "a fixed penalty per step of distance, one slope per head",
    "sandwich": "a fixed penalty: the inner product of two sinusoidal embeddings",
    "kerple_power": "a power-law penalty whose rate and exponent each head learns",
    "kerple_log": "a logarithmic penalty whose rate and scale each head learns",
    "fire": "an MLP of the log offset divided by the log of the query position, or of a "
    "learned threshold L while the query position is below L",
    "nope": "no positions: only the causal mask",
    "sinusoidal": "a fixed sinusoidal vector, times one learned scale, added at each position",
    "learned": "a learned vector per position up to m_l; later positions reuse the last",
    "rope": "queries and keys rotated by angles that grow with the position",
}

_CONTEXT_SHORT = {
    "reads the far bytes worse": "no: read worse with them",
    "no use of the far context shown": "not shown: read as well without them",
    "uses the far context": "yes",
    "at the edge": "at the edge",
}
_RECALL_SHORT = {
    "lower": "lower than NoPE",
    "higher": "higher than NoPE",
    "cannot be told apart": "not told apart from NoPE",
    "at the edge": "at the edge",
}


def _link(words: str, label: str) -> str:
    return f"{{ref}}`{words} <{label}>`"


def answer_rows(longer: dict, probe: dict, methods, *, labels: dict, sweep_for=None):
    """The lesson's answer table, one row per method of ``methods``: its mechanism
    (:data:`MECHANISM`), the whole curve of ``longer`` (:func:`relbias.lab.readings.method_curve`),
    the context-use verdict on the longest-trained sweep that records it
    (:func:`relbias.book.sweeps.strongest_with_context`, or ``sweep_for(method)``) and recall
    at the farthest distance of the longest probe window against NoPE
    (:func:`relbias.lab.readings.accuracy_verdict`), each verdict a MyST link to
    ``labels["curve"]``, ``labels["context"]`` or ``labels["recall"]``: ``(rows, headers)``."""
    from relbias.lab.readings import accuracy_verdict, probe_lengths

    if sweep_for is None:

        def sweep_for(method):
            return strongest_with_context(method)[1]

    longest = probe_lengths(probe)[-1]
    rows = []
    for m in methods:
        curve = curve_words(method_curve(longer, m))
        context = _CONTEXT_SHORT[context_verdict(sweep_for(m), m)["words"]]
        if m == "nope":
            recall = "(the reference)"
        else:
            recall = _RECALL_SHORT[accuracy_verdict(probe, m, "nope", longest)["answer"]]
        rows.append(
            [
                m,
                MECHANISM[m],
                _link(curve, labels["curve"]),
                _link(context, labels["context"]),
                _link(recall, labels["recall"]),
            ]
        )
    headers = [
        "method",
        "how it places a key",
        "whole curve",
        "far bytes help? (3,000 steps)",
        "far recall (farthest answer)",
    ]
    return rows, headers


def curve_groups(results: dict, methods) -> dict:
    """``methods`` grouped by the whole curve of ``results``: ``{words: [methods]}``, the
    groups in the order improves, improves then degrades, degrades, anything else."""
    order = ("improves", "improves, then degrades", "degrades")
    groups: dict = {}
    for m in methods:
        words = method_curve(results, m)["answer"]
        groups.setdefault(words, []).append(m)
    return {w: groups[w] for w in sorted(groups, key=lambda w: (order + (w,)).index(w))}


def plot_curves(results: dict, groups: dict, *, width: float = 8.0, height: float = 3.6):
    """Bits per byte against the window length, one panel per group of ``groups``
    (``{title: methods}``), each panel with its own y range (so that a small turn shows),
    the 95 % interval over seeds shaded, a grey line at the training length and the legend
    below each panel. Returns the Figure."""
    import numpy as np

    from relbias.book.plots import figure
    from relbias.lab.plots import shade_interval

    train_len = results["provenance"]["config"]["train_len"]
    fig, axes = figure(width, height, ncols=len(groups))
    panels = list(np.atleast_1d(axes).flat)
    for ax, (title, methods) in zip(panels, groups.items()):
        lengths = []
        for m in methods:
            rows = results["methods"][m]["eval"]
            lengths = [r["length"] for r in rows]
            (line,) = ax.plot(lengths, [r["bpb"] for r in rows], "o-", ms=3, label=m)
            shade_interval(ax, lengths, rows, "bpb", line.get_color())
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths[::2], [str(n) for n in lengths[::2]])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("window length (bytes)", fontsize=9)
        ax.tick_params(labelsize=8)
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    panels[0].set_ylabel("bits per byte", fontsize=9)
    return fig


def rezoom_late(fig, *, fifth: float = 0.2) -> None:
    """Set each panel's y range to hold every line after the first ``fifth`` of that line's
    own steps (a shorter run's curve is not cut off by a longer run's range)."""
    for ax in fig.axes:
        ys = []
        for line in ax.get_lines():
            xs, yv = line.get_data()
            if len(xs) == 0:
                continue
            last = max(xs)
            ys += [y for x, y in zip(xs, yv) if x >= fifth * last]
        if ys:
            low, high = min(ys), max(ys)
            pad = 0.05 * (high - low + 1e-9)
            ax.set_ylim(low - pad, high + pad)


def t5_tables(results: dict) -> list:
    """T5's stored read-back per seed (offsets 0 onwards), each head's row minus its largest
    value: ``[seeds][heads][offsets]``."""
    seeds = results["methods"]["t5"]["seeds"]
    tables = [seeds[s]["learned_bias"]["values"] for s in sorted(seeds, key=int)]
    return [[[v - max(row) for v in row] for row in t] for t in tables]


def plot_t5_bias(runs: dict, *, train_len: int, last_bucket: int, width: float = 8.0):
    """T5's learned bias by offset, every head of every seed, one panel per run of ``runs``
    (``{title: results}``), sharing the y axis; grey: the training length; dotted: the first
    offset of the last bucket. Returns the Figure."""
    import numpy as np

    from relbias.book.plots import figure

    fig, axes = figure(width, 3.2, ncols=len(runs), sharey=True)
    panels = list(np.atleast_1d(axes).flat)
    for ax, (title, results) in zip(panels, runs.items()):
        for k, table in enumerate(t5_tables(results)):
            for row in table:
                ax.plot(range(len(row)), row, color=f"C{k}", lw=0.8, alpha=0.8)
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.axvline(last_bucket, color="black", ls=":", lw=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("offset i − j (bytes)", fontsize=9)
        ax.tick_params(labelsize=8)
    panels[0].set_ylabel("PE(i, j)/√d minus the head's largest", fontsize=8)
    return fig
