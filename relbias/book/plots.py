"""The book's figure helper and the figures of any bias.

- :func:`figure` (from :mod:`relbias.lab.plots`) builds a :class:`matplotlib.figure.Figure`
  and its axes directly (not pyplot), so a helper never leaves a figure behind that
  Jupyter would display a second time; every figure of the book is drawn through it.
- :func:`plot_bias_matrix`: PE(i, j) as a matrix per head; :func:`plot_bias_gallery`:
  one head of several biases side by side; :func:`plot_index_matrix`: every cell of an
  offset or bucket matrix labelled (u_5, ...).
- :func:`plot_bias_by_offset`: PE against the offset i - j, a line per head, for one
  bias or a panel per bias; the book's only figure of a bias by offset. The values come
  from :func:`relbias.lab.readback.learned_bias`, the one read-back by offset.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from matplotlib import colormaps
from matplotlib.figure import Figure

from relbias import RelativeBias
from relbias.lab.plots import figure
from relbias.lab.readback import learned_bias

__all__ = [
    "figure",
    "plot_bias_by_offset",
    "plot_bias_gallery",
    "plot_bias_matrix",
    "plot_index_matrix",
]


def _bias_tensor(bias, q_len: int, k_len: int | None, q_start: int | None) -> torch.Tensor:
    if isinstance(bias, RelativeBias):
        with torch.no_grad():
            return bias(q_len, k_len, q_start=q_start).detach().float().cpu()
    if isinstance(bias, torch.Tensor):
        t = bias.detach().float().cpu()
        return t[None] if t.dim() == 2 else t
    raise TypeError(f"bias must be a relbias.RelativeBias or a tensor, got {type(bias).__name__}")


def plot_bias_matrix(
    bias,
    q_len: int = 16,
    k_len: int | None = None,
    *,
    q_start=None,
    heads: Sequence[int] | None = None,
    causal: bool = True,
    title: str | None = None,
    annotate: bool | None = None,
    cmap: str = "viridis",
    width: float | None = None,
):
    """PE(i, j) as a matrix per head: rows are queries i, columns keys j.

    ``bias`` is a :class:`~relbias.RelativeBias` (called with the lengths) or a tensor
    ``[heads, q_len, k_len]`` (or ``[q_len, k_len]``). With ``causal=True`` the future
    keys (j > i), which the mask removes, are left blank. ``annotate`` writes the values
    in the cells (default: for at most 10 x 10 cells and two heads). Returns the Figure.
    """
    values = _bias_tensor(bias, q_len, k_len, q_start)
    n_heads, rows, cols = values.shape
    first = (cols - rows) if q_start is None else q_start
    heads = list(range(min(n_heads, 4))) if heads is None else list(heads)
    if annotate is None:
        annotate = rows <= 10 and cols <= 10 and len(heads) <= 2
    i = torch.arange(first, first + rows)[:, None]
    j = torch.arange(cols)[None, :]
    future = j > i
    panel = 2.4 if len(heads) > 1 else 3.6
    fig, axes = figure(
        width or panel * len(heads) + 0.6,
        0.3 + panel * min(rows / cols, 1.4) + 0.5,
        ncols=len(heads),
    )
    axes = [axes] if len(heads) == 1 else list(axes.flat)
    shown = values[heads].clone()
    if causal:
        shown[:, future] = float("nan")
    finite = shown[torch.isfinite(shown)]
    vmin, vmax = (float(finite.min()), float(finite.max())) if finite.numel() else (0.0, 1.0)
    if vmin == vmax:
        vmin, vmax = vmin - 1.0, vmax + 1.0
    image = None
    for ax, h, mat in zip(axes, heads, shown):
        image = ax.imshow(
            mat.numpy(),
            cmap=cmap,
            vmin=vmin,
            vmax=vmax,
            aspect="equal",
            extent=(-0.5, cols - 0.5, first + rows - 0.5, first - 0.5),
        )
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("key position j")
        if annotate:
            for r in range(rows):
                for c in range(cols):
                    v = float(mat[r, c])
                    if math.isfinite(v):
                        ax.text(
                            c,
                            first + r,
                            f"{v + 0.0:.2g}",
                            ha="center",
                            va="center",
                            fontsize=9,
                            color="white" if v < (vmin + vmax) / 2 else "black",
                        )
    axes[0].set_ylabel("query position i")
    fig.colorbar(image, ax=axes, shrink=0.8, label="PE(i, j)")
    if title:
        fig.suptitle(title, fontsize=10)
    return fig


def _offset_lines(item, max_offset, min_offset, query_position):
    """``(offsets, table [heads, offsets])`` of a bias, a TinyLM or a read-back tensor."""
    if isinstance(item, torch.Tensor):
        table = item.detach().float().cpu()
        table = table[None] if table.dim() == 1 else table
    else:
        if max_offset is None:
            raise ValueError("max_offset is needed to read a bias module or a model")
        table = learned_bias(item, max_offset, min_offset=min_offset, query_position=query_position)
    return np.arange(min_offset, min_offset + table.shape[1]), table.numpy()


def plot_bias_by_offset(
    bias,
    max_offset: int | None = None,
    *,
    min_offset: int = 0,
    query_position: int | None = None,
    heads: Sequence[int] | None = None,
    reference: dict | None = None,
    mark: Sequence[int] = (),
    step: bool = False,
    label: str = "head {head}",
    ylim=None,
    title: str | None = None,
    ax=None,
    ncols: int = 4,
    width: float | None = None,
    height: float | None = None,
) -> Figure:
    """PE against the offset i - j, one line per head: the book's figure of a bias by offset.

    ``bias`` is a :class:`~relbias.RelativeBias`, a :class:`~relbias.lab.model.TinyLM`
    with a bias, or a tensor ``[heads, offsets]`` (or ``[offsets]``) holding offsets
    ``min_offset ..``; or a dict of such, title to bias, for one panel each. Modules and
    models are read by :func:`relbias.lab.readback.learned_bias` at offsets
    ``min_offset .. max_offset``; FIRE, which also depends on the query position, at the
    query ``query_position`` (default ``max_offset``).

    ``heads`` picks the heads drawn; ``label`` is each line's legend label, formatted with
    ``head``. ``reference`` (label to bias or tensor) is drawn in every panel as thin grey
    dashed lines, all heads (e.g. ALiBi's fixed slopes next to what a family learned).
    ``mark`` draws vertical dashed lines at these offsets (e.g. the last trained offset);
    ``step=True`` draws a staircase (bucketed biases). ``width`` and ``height`` size one
    panel. ``title`` heads the panel, or the figure when there are several. Draws a single
    panel into ``ax`` if given. Returns the Figure.
    """
    panels = bias if isinstance(bias, dict) else {title: bias}
    n = len(panels)
    if ax is not None:
        if n != 1:
            raise ValueError(f"ax takes one panel, got {n} biases")
        fig, axes = ax.figure, [ax]
    else:
        cols = min(n, ncols)
        rows = math.ceil(n / cols)
        single = not isinstance(bias, dict)
        width = width or (6.4 if single else 3.5)
        height = height or (3.2 if single else 3.0)
        fig, axes = figure(width * cols, height * rows, nrows=rows, ncols=cols)
        axes = [axes] if n == 1 else list(axes.flat)
        for extra in axes[n:]:
            extra.axis("off")
    draw = "step" if step else "plot"
    style = {"where": "mid"} if step else {}
    for panel, (name, item) in zip(axes, panels.items()):
        for ref_name, ref in (reference or {}).items():
            offsets, table = _offset_lines(ref, max_offset, min_offset, query_position)
            for h, line in enumerate(table):
                ref_label = ref_name if h == 0 else None
                getattr(panel, draw)(
                    offsets, line, color="grey", lw=0.8, ls="--", label=ref_label, **style
                )
        offsets, table = _offset_lines(item, max_offset, min_offset, query_position)
        for h in range(table.shape[0]) if heads is None else heads:
            getattr(panel, draw)(offsets, table[h], lw=1.2, label=label.format(head=h), **style)
        for x in mark:
            panel.axvline(x, color="grey", lw=0.8, ls="--")
        if ylim is not None:
            panel.set_ylim(*ylim)
        if name:
            panel.set_title(name, fontsize=10 if n == 1 else 9)
        panel.set_xlabel("offset i - j")
        panel.set_ylabel("PE(i, j)")
    _, labels = axes[0].get_legend_handles_labels()
    if len(labels) > 1:
        axes[0].legend(fontsize=9 if n == 1 else 8, ncol=2 if n == 1 else 1)
    if title and isinstance(bias, dict):
        fig.suptitle(title, fontsize=10)
    return fig


def plot_index_matrix(
    index,
    *,
    first_query: int = 0,
    label: str = "u",
    highlight=None,
    causal: bool = True,
    title: str | None = None,
    ax=None,
    size: float | None = None,
):
    """An integer matrix ``[q_len, k_len]`` (offsets, buckets) with each cell labelled.

    Every cell shows ``label_value`` (e.g. :math:`u_5`), coloured by its value. Queries sit
    at positions ``first_query ..`` and keys at ``0 ..``. ``highlight`` is a boolean matrix
    of cells to stress (the others are faded); ``causal=True`` blanks the future keys.
    Draws into ``ax`` if given; returns the Figure.
    """
    index = torch.as_tensor(index)
    rows, cols = index.shape
    i = torch.arange(first_query, first_query + rows)[:, None]
    j = torch.arange(cols)[None, :]
    future = (j > i) if causal else torch.zeros(rows, cols, dtype=torch.bool)
    if ax is None:
        size = size or max(4.2, 0.42 * rows)
        fig, ax = figure(size * min(cols / rows, 1.6) + 0.4, size)
    else:
        fig = ax.figure
    values = index.numpy().astype(float)
    low, high = float(values.min()), float(values.max())
    span = high - low or 1.0
    cmap = colormaps["viridis"]
    rgba = cmap((values - low) / span)
    if highlight is not None:
        fade = ~torch.as_tensor(highlight, dtype=torch.bool).numpy()
        rgba[fade] = 0.25 * rgba[fade] + 0.75
    rgba[future.numpy()] = (1.0, 1.0, 1.0, 1.0)
    ax.imshow(rgba, extent=(-0.5, cols - 0.5, first_query + rows - 0.5, first_query - 0.5))
    fontsize = 8 if max(rows, cols) <= 16 else 6
    for r in range(rows):
        for c in range(cols):
            if future[r, c]:
                continue
            v = int(index[r, c])
            shade = np.asarray(rgba[r, c][:3]).mean()
            ax.text(
                c,
                first_query + r,
                f"${label}_{{{v}}}$",
                ha="center",
                va="center",
                fontsize=fontsize,
                color="black" if shade > 0.5 else "white",
            )
    ax.set_xticks(range(cols))
    ax.set_yticks(range(first_query, first_query + rows))
    ax.tick_params(labelsize=7)
    ax.set_xlabel("key position j")
    ax.set_ylabel("query position i")
    if title:
        ax.set_title(title, fontsize=10)
    return fig


def plot_bias_gallery(
    biases: dict,
    q_len: int = 12,
    *,
    head: int = 0,
    ncols: int = 4,
    causal: bool = True,
    title: str | None = None,
    shared: bool = True,
):
    """PE(i, j) of one head for several biases side by side, one panel each.

    ``biases`` maps a panel title to a :class:`~relbias.RelativeBias` or a tensor
    ``[heads, q_len, k_len]``. With ``shared=True`` (default) every panel uses one colour
    scale, drawn once as a single colour bar, so that a panel's colours compare with any
    other's (a bias of size 0.004 looks flat beside one of size 2.5); with
    ``shared=False`` each panel has its own scale and its own colour bar. Either way each
    panel's title gives its range of values (visible pairs only). Returns the Figure.
    """
    n = len(biases)
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig, axes = figure(
        1.9 * ncols + (0.9 if shared else 0.4), 2.2 * nrows + 0.3, nrows=nrows, ncols=ncols
    )
    flat = [axes] if n == 1 else list(axes.flat)
    i = torch.arange(q_len)[:, None]
    j = torch.arange(q_len)[None, :]
    mats = {}
    for name, bias in biases.items():
        mat = _bias_tensor(bias, q_len, None, None)[head].clone()
        if causal:
            mat[j > i] = float("nan")
        mats[name] = mat
    finite = torch.cat([m[torch.isfinite(m)] for m in mats.values()])
    low, high = float(finite.min()), float(finite.max())
    if low == high:
        low, high = low - 1.0, high + 1.0
    image = None
    for ax, (name, mat) in zip(flat, mats.items()):
        seen = mat[torch.isfinite(mat)]
        vmin, vmax = (low, high) if shared else (float(seen.min()), float(seen.max()))
        if vmin == vmax:
            vmin, vmax = vmin - 1.0, vmax + 1.0
        image = ax.imshow(mat.numpy(), cmap="viridis", vmin=vmin, vmax=vmax)
        ax.set_title(
            f"{name}\n{float(seen.min()) + 0.0:.3g} to {float(seen.max()) + 0.0:.3g}", fontsize=9
        )
        ax.set_xticks([0, q_len - 1])
        ax.set_yticks([0, q_len - 1])
        ax.tick_params(labelsize=9)
        ax.set_xlabel("key j", fontsize=9, labelpad=-8)
        ax.set_ylabel("query i", fontsize=9, labelpad=-8)
        if not shared:
            fig.colorbar(image, ax=ax, shrink=0.75).ax.tick_params(labelsize=9)
    for ax in flat[n:]:
        ax.axis("off")
    if shared:
        bar = fig.colorbar(image, ax=flat, shrink=0.8, label="PE(i, j), one scale for all panels")
        bar.ax.tick_params(labelsize=9)
    if title:
        fig.suptitle(title, fontsize=10)
    return fig
