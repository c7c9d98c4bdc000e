"""The context-use measure as the chapters draw it: one model's bytes read twice.

:mod:`relbias.lab.context` reads every byte of an evaluation span twice with the same model:
in the whole span (the *long* reading) and by a sliding window of ``m_l`` bytes (the
*sliding* one). :func:`plot_context_reading` draws both readings position by position for a
few models, so that a reader sees where they part: at the training length, for a model that
breaks past it; nowhere, for a model that reads the far bytes no better and no worse.
"""

from __future__ import annotations

import numpy as np

from relbias.book.plots import figure

__all__ = ["plot_context_reading", "running_mean"]


def running_mean(values, window: int) -> np.ndarray:
    """The mean of every ``window`` consecutive ``values`` (a shorter array: ``len(values) -
    window + 1`` means), for a loss by position that is noisy position by position."""
    values = np.asarray(values, dtype=float)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be an integer >= 1, got {window!r}")
    if window > len(values):
        raise ValueError(f"window ({window}) must not exceed the {len(values)} values")
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def plot_context_reading(rows: dict, *, window: int = 8, width: float = 8.0, height: float = 3.0):
    """One panel per model of ``rows`` (``{label: row}``, each the evaluation row of the
    longest length from :func:`relbias.lab.evaluation.evaluate_lengths`, which holds
    ``loss_by_position`` and ``context``): bits per byte at each position of the window read
    in the whole window (solid) and by the sliding window of the training length (dashed),
    each a running mean over ``window`` positions, drawn at the window's centre; a grey line
    at the training length. The panels share the y axis; one legend below them."""
    if not rows:
        raise ValueError("rows must hold at least one model's evaluation row")
    missing = [label for label, row in rows.items() if "context" not in row]
    if missing:
        raise ValueError(f"these rows have no context-use measure: {missing}")
    fig, axes = figure(width, height, ncols=len(rows), sharey=True)
    axes = [axes] if len(rows) == 1 else list(axes.flat)
    for ax, (label, row) in zip(axes, rows.items()):
        readings = {
            "whole window": row["loss_by_position"],
            f"sliding window of {row['context']['window']} bytes": row["context"][
                "sliding_loss_by_position"
            ],
        }
        for (name, losses), style in zip(readings.items(), ("-", "--")):
            smooth = running_mean(losses, window)
            x = np.arange(len(smooth)) + (window - 1) / 2
            ax.plot(
                x, smooth, ls=style, lw=1.3, color="black" if style == "-" else "C1", label=name
            )
        ax.axvline(row["context"]["window"], color="grey", lw=0.8)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("position in the window (bytes)")
    axes[0].set_ylabel("bits per byte")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8)
    return fig
