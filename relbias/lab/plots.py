"""Every plot of the lab's results, and the figure factory the book draws with.

- :func:`figure`: a :class:`matplotlib.figure.Figure` and its axes built without pyplot
  (nothing is auto-displayed), at most :data:`PAGE_WIDTH` inches wide;
- :func:`plot_results`: the figure written beside a result file (bits per byte by length
  and by position, the validation curves; or accuracy by distance);
- one panel each: :func:`plot_extrapolation`, :func:`plot_val_curves`,
  :func:`plot_loss_by_position`, :func:`plot_retrieval`, with the 95 % interval over
  seeds shaded where a sweep has one;
- the stored sweeps as the chapters show them: :func:`plot_sweep`, :func:`plot_probe`,
  :func:`plot_longer_training`, :func:`plot_bpb_by_length` (several sweeps side by side),
  :func:`plot_position_loss`, an ablation's :func:`plot_interventions`, and the
  interpolation experiment's :func:`plot_interpolation`.
"""

from __future__ import annotations

import math

import numpy as np
from matplotlib.figure import Figure

from relbias.lab.interpolation import FINETUNE_VARIANTS, SCALINGS
from relbias.lab.interventions import intervention_at
from relbias.lab.model import BASELINE_POSITIONS, POSITION_NAMES
from relbias.lab.readings import at_factor, paired_seeds
from relbias.lab.results import only

# The widest figure, in inches: a page shows figures about 780 px wide (100 dpi).
PAGE_WIDTH = 8.0

__all__ = [
    "PAGE_WIDTH",
    "figure",
    "method_style",
    "plot_bpb_by_length",
    "plot_extrapolation",
    "plot_interpolation",
    "plot_interventions",
    "plot_longer_training",
    "plot_loss_by_position",
    "plot_position_loss",
    "plot_probe",
    "plot_results",
    "plot_retrieval",
    "plot_sweep",
    "plot_val_curves",
    "shade_interval",
]


def figure(
    width: float = 7.0, height: float = 3.2, *, nrows: int = 1, ncols: int = 1, **subplot_kw
):
    """A matplotlib Figure and its axes, built without pyplot (nothing is auto-displayed).

    Returns ``(fig, axes)``; ``axes`` is a single Axes for 1 x 1, else a 2-D array.
    """
    # The book's pages show a figure about 780 px wide: wider figures would be shrunk,
    # and their 9-pt labels with them, so no figure is wider than PAGE_WIDTH inches.
    fig = Figure(figsize=(min(width, PAGE_WIDTH), height), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=nrows * ncols == 1, **subplot_kw)
    return fig, axes


def plot_results(results: dict, path=None, *, factor: int | None = None):
    """Plot any result of :mod:`relbias.lab.experiments`; save to ``path`` if given.

    Extrapolation: bits per byte against evaluation length, and the loss by position
    at the longest (or given) length. Retrieval: accuracy against distance per length.
    Returns a :class:`matplotlib.figure.Figure` (not registered with pyplot, so nothing
    is left open behind it).
    """
    kind = results.get("kind")
    if kind == "ablation":
        kind = "retrieval" if results.get("ablation") == "alibi_probe" else "extrapolation"
    if kind == "extrapolation":
        curves = any(_val_curves(rec) for rec in results["methods"].values())
        fig = Figure(figsize=(18 if curves else 12, 4.2))
        axes = fig.subplots(1, 3 if curves else 2)
        plot_extrapolation(results, ax=axes[0])
        plot_loss_by_position(results, factor=factor, ax=axes[1])
        if curves:
            plot_val_curves(results, ax=axes[2])
    elif kind == "retrieval":
        lengths = sorted({r["length"] for m in results["methods"].values() for r in m["eval"]})
        fig = Figure(figsize=(6 * len(lengths), 4.2))
        axes = fig.subplots(1, len(lengths), squeeze=False)
        for ax, length in zip(axes[0], lengths):
            plot_retrieval(results, length=length, ax=ax)
    else:
        raise ValueError(f"results kind must be 'extrapolation' or 'retrieval', got {kind!r}")
    fig.suptitle(_title(results), fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _new_axes():
    return Figure(figsize=(6, 4.2)).subplots()


def _title(results: dict) -> str:
    prov = results.get("provenance", {})
    cfg = prov.get("config", {})
    return (
        f"{results.get('kind')} - config {cfg.get('name')}, train_len {cfg.get('train_len')}, "
        f"{cfg.get('steps')} steps, {prov.get('device')}"
    )


def shade_interval(ax, xs, rows, key: str, color) -> None:
    """Shade the 95 % interval over seeds (``<key>_low`` .. ``<key>_high``) where rows have it."""
    lows = [r.get(f"{key}_low") for r in rows]
    highs = [r.get(f"{key}_high") for r in rows]
    if any(v is None or not math.isfinite(v) for v in lows + highs):
        return
    ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0)


def method_style(name: str, index: int = 0) -> dict:
    """A fixed colour per method (tab10 plus black); dashed lines for the baselines.
    Names that are not methods (ablation variants) take the colour of their ``index``."""
    from matplotlib import colormaps

    colors = [*colormaps["tab10"].colors, "black"]
    index = POSITION_NAMES.index(name) if name in POSITION_NAMES else index
    return {
        "linestyle": "--" if name in BASELINE_POSITIONS else "-",
        "marker": "o",
        "markersize": 3,
        "color": colors[index % len(colors)],
    }


def plot_extrapolation(results: dict, ax=None):
    """Bits per byte against evaluation length (log scale), one line per method."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        lengths = [r["length"] for r in res["eval"]]
        style = method_style(name, i)
        ax.plot(lengths, [r["bpb"] for r in res["eval"]], label=name, **style)
        shade_interval(ax, lengths, res["eval"], "bpb", style["color"])
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens); grey line: training length")
    ax.set_ylabel("validation bits per byte")
    ax.legend(fontsize=7, ncol=2)
    return ax


def _val_curves(record: dict) -> list:
    """The validation curves of a method's record: one, or one per seed."""
    if "seeds" in record:
        return [
            r["train"]["val_curve"] for r in record["seeds"].values() if "val_curve" in r["train"]
        ]
    curve = record.get("train", {}).get("val_curve")
    return [curve] if curve else []


def plot_val_curves(results: dict, ax=None):
    """Validation bits per byte at the training length against training step, one line per
    method and seed (``config.val_every``): shows whether training levelled off."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        style = method_style(name, i)
        for k, curve in enumerate(_val_curves(res)):
            ax.plot(
                [p["step"] for p in curve],
                [p["bpb"] for p in curve],
                label=name if k == 0 else None,
                lw=1,
                linestyle=style["linestyle"],
                color=style["color"],
            )
    ax.set_xlabel("training step")
    ax.set_ylabel("validation bits per byte at the training length")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_loss_by_position(results: dict, factor: int | None = None, ax=None, *, window: int = 16):
    """Loss (bits) against position in the window at one length, smoothed over ``window``."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        rows = res["eval"]
        row = rows[-1] if factor is None else next(r for r in rows if r["factor"] == factor)
        y = np.convolve(row["loss_by_position"], np.ones(window) / window, mode="valid")
        style = method_style(name, i)
        ax.plot(
            np.arange(len(y)) + window - 1,
            y,
            label=name,
            lw=1,
            linestyle=style["linestyle"],
            color=style["color"],
        )
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xlabel(f"position in the window (length {row['length']}, mean of {window})")
    ax.set_ylabel("bits per byte")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_retrieval(results: dict, length: int | None = None, ax=None):
    """Recall accuracy against distance at one sequence length, one line per method."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        rows = [r for r in res["eval"] if length is None or r["length"] == length]
        style = method_style(name, i)
        distances = [r["distance"] for r in rows]
        ax.plot(distances, [r["accuracy"] for r in rows], label=name, **style)
        shade_interval(ax, distances, rows, "accuracy", style["color"])
    ax.axvline(results["provenance"]["config"]["train_len"] - 2, color="grey", lw=0.8)
    ax.axhline(0.1, color="grey", lw=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("distance back to the answer (grey: farthest trained; dotted: chance)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"sequence length {length}" if length else "", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_interpolation(results: dict, *, steps: str | None = None, axes=None):
    """Mean bits per byte (band: 95 % interval over seeds) against length: zero-shot (left),
    fine-tuned ``steps`` steps (right; default the most). Returns the figure."""
    summary = results["summary"]
    if axes is None:
        fig = Figure(figsize=(11, 3.8))
        axes = fig.subplots(1, 2, sharey=True)
    fig = axes[0].figure
    steps = steps or list(next(iter(summary["finetuned"].values())))[-1]
    panels = (
        (axes[0], summary["zero_shot"], "zero-shot (scaling set for each length)"),
        (
            axes[1],
            {name: by_steps[steps] for name, by_steps in summary["finetuned"].items()},
            f"fine-tuned {steps} steps at {results['setup']['finetune_length']} tokens",
        ),
    )
    train_len = results["provenance"]["config"]["train_len"]
    for ax, cells_by_name, title in panels:
        for name, cells in cells_by_name.items():
            x = [int(n) for n in cells]
            scaling = FINETUNE_VARIANTS.get(name, (name,))[0]
            color = f"C{SCALINGS.index(scaling)}" if scaling in SCALINGS else None
            # dashed: dynamic (NTK and dynamic coincide when whole windows are read) and the
            # variants that share a scaling's colour
            dashed = name in ("dynamic", "yarn_no_temp", "linear_lr10")
            ax.plot(
                x,
                [c["mean"] for c in cells.values()],
                marker="o",
                ms=3,
                ls="--" if dashed else "-",
                color=color,
                label=name,
            )
            lows, highs = [c["low"] for c in cells.values()], [c["high"] for c in cells.values()]
            ax.fill_between(x, lows, highs, color=color, alpha=0.2)
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (grey: training length)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("validation bits per byte")
    return fig


def plot_sweep(results: dict, methods, *, width: float = 11.0, height: float = 3.6):
    """Bits per byte against evaluation length with the 95 % interval shaded (left) and the
    validation curve of every seed at the training length (right), for ``methods``."""
    chosen = only(results, methods)
    fig, axes = figure(width, height, ncols=2)
    left, right = axes.flat
    plot_extrapolation(chosen, ax=left)
    plot_val_curves(chosen, ax=right)
    _zoom_on_late_steps(right)
    # the book's units (bytes), short labels that fit beside each other, and one legend
    # below both panels, so that no legend covers a line or a band
    lengths = [row["length"] for row in next(iter(chosen["methods"].values()))["eval"]]
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.set_xlabel("evaluation length (bytes); grey: training length")
    left.set_ylabel("bits per byte")
    right.set_xlabel("training step")
    right.set_ylabel("bits per byte at the training length")
    _legend_below(fig, left, [left, right])
    return fig


def _legend_below(fig, source, axes) -> None:
    """One legend for ``axes``, from ``source``'s lines, below the panels (none on them)."""
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    handles, labels = source.get_legend_handles_labels()
    if handles:
        fig.legend(
            handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8
        )


def _zoom_on_late_steps(ax) -> None:
    """Limit the y axis to the curves after the first fifth of training (the first steps
    start several bits higher and would flatten the part that tells whether they levelled)."""
    points = [(x, y) for line in ax.get_lines() for x, y in zip(*line.get_data())]
    if not points:
        return
    last = max(x for x, _ in points)
    late = [y for x, y in points if x >= last / 5]
    low, high = min(y for _, y in points), max(late)
    ax.set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))


def plot_probe(results: dict, methods, *, width: float = 12.0, height: float = 3.4):
    """Recall accuracy against distance (interval shaded), one panel per sequence length."""
    chosen = only(results, methods)
    lengths = sorted({r["length"] for m in methods for r in results["methods"][m]["eval"]})
    fig, axes = figure(width, height, ncols=len(lengths))
    panels = list(getattr(axes, "flat", [axes]))
    for ax, length in zip(panels, lengths):
        plot_retrieval(chosen, length=length, ax=ax)
        ax.set_xlabel("distance (grey: longest trained)", fontsize=8)
    _legend_below(fig, panels[0], panels)  # a legend on a panel would cover the bands
    return fig


def plot_longer_training(short: dict, longer: dict, groups, *, width: float = 11.0):
    """The validation curves at the training length, each the mean over the seeds both runs
    hold of the method: the longer run solid, the shorter dotted, one panel per group of
    methods (a legend entry, below the panel, gives the number of seeds)."""
    fig, axes = figure(width, 4.4, ncols=len(groups))
    for ax, methods in zip(getattr(axes, "flat", [axes]), groups):
        for i, m in enumerate(methods):
            seeds = paired_seeds(short, m, m, longer)
            color = method_style(m, i)["color"]
            label = f"{m} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
            for results, style in ((longer, "-"), (short, ":")):
                curves = [results["methods"][m]["seeds"][s]["train"]["val_curve"] for s in seeds]
                xs = [p["step"] for p in curves[0]]
                ys = [sum(c[j]["bpb"] for c in curves) / len(curves) for j in range(len(xs))]
                ax.plot(xs, ys, style, color=color, lw=1, label=label if style == "-" else None)
        ax.set_xlabel("training step (dotted: the shorter run)")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        _zoom_on_late_steps(ax)
    # one y label, on the left panel only: a second one would sit between the panels
    first = next(iter(getattr(axes, "flat", [axes])))
    first.set_ylabel("bits per byte at the training\nlength, mean over seeds")
    return fig


def plot_interventions(
    results: dict, methods, interventions, factor: int, *, width: float = 8.0, height: float = 3.4
):
    """Bits per byte at ``factor`` x for each of ``methods`` as trained and with each of
    ``interventions`` (mean over seeds, bar: 95 % interval), one group of points per
    reading; a dotted line per method marks its bits per byte at the training length."""
    fig, ax = figure(width, height)
    readings = ["as trained", *interventions]
    spread = 0.8 / max(len(methods), 1)
    for k, m in enumerate(methods):
        color = method_style(m, k)["color"]
        ivs = [at_factor(results, m, factor)]
        ivs += [intervention_at(results, m, name, factor) for name in interventions]
        xs = [i - 0.4 + spread * (k + 0.5) for i in range(len(readings))]
        means = [iv["mean"] for iv in ivs]
        below = [iv["mean"] - iv["low"] for iv in ivs]
        above = [iv["high"] - iv["mean"] for iv in ivs]
        ax.errorbar(xs, means, yerr=[below, above], fmt="o", ms=4, capsize=3, color=color, label=m)
        ax.axhline(at_factor(results, m, 1)["mean"], color=color, ls=":", lw=1)
    ax.set_xticks(range(len(readings)), readings)
    ax.set_ylabel(f"bits per byte at {factor}x")
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(methods), fontsize=8
    )
    return fig


def plot_bpb_by_length(runs: dict, methods, *, width: float = 8.0, height: float = 3.0):
    """Bits per byte against the window length in bytes (log scale), the 95 % interval over
    seeds shaded, one panel per entry of ``runs`` (``{title: results}``, sharing the y
    axis) with ``methods`` in each; a grey line marks the training length, and one legend
    below the panels names every method (no legend covers a curve)."""
    fig, axes = figure(width, height, ncols=len(runs), sharey=True)
    axes = list(getattr(axes, "flat", [axes]))
    for ax, (title, results) in zip(axes, runs.items()):
        plot_extrapolation(only(results, methods), ax=ax)
        ax.get_legend().remove()
        ax.set_xlabel("window length (bytes); grey: training length")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("bits per byte")
    for ax in axes[1:]:
        ax.set_ylabel("")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 5), fontsize=8)
    return fig


def plot_position_loss(
    results: dict, methods, *, window: int = 32, width: float = 8.0, height: float = 3.0
):
    """Loss (bits per byte) against the position in the window at the longest length, the
    mean over seeds smoothed over ``window`` positions, one line per method of ``methods``
    (log-scaled positions, in bytes); a grey line marks the training length, and the legend
    sits below the axes."""
    fig, ax = figure(width, height)
    for i, m in enumerate(methods):
        row = max(results["methods"][m]["eval"], key=lambda r: r["length"])
        y = np.convolve(row["loss_by_position"], np.ones(window) / window, mode="valid")
        style = method_style(m, i)
        ax.plot(
            np.arange(len(y)) + window,
            y,
            label=m,
            lw=1.2,
            color=style["color"],
            linestyle=style["linestyle"],
        )
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"position in a {row['length']}-byte window (bytes; mean of {window})")
    ax.set_ylabel("bits per byte")
    fig.legend(loc="outside lower center", ncol=min(len(methods), 4), fontsize=8)
    return fig
