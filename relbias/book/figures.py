"""Figures and tables for the chapters on ALiBi and Sandwich, T5's far buckets, Kerple and
FIRE (the comparison of every method lives in :mod:`relbias.book.overview`, the forget
gate's in :mod:`relbias.book.forgetting`).

Every function here only *reads* the library (slopes, bias modules, result dicts) and
draws or tabulates it, so that the notebook cells stay short. Figures are built with
:func:`relbias.book.plots.figure` (no pyplot, nothing displayed twice) and returned;
tables are returned as ``(rows, headers)`` for :func:`relbias.book.display.show_table`.
A bias against the offset is drawn by :func:`relbias.book.plots.plot_bias_by_offset`
and read by :func:`relbias.lab.readback.learned_bias`, for every chapter.
"""

from __future__ import annotations

import math
import re

import numpy as np
import torch

from relbias import FIRE, KerpleLog, KerplePower, RelativeBias, alibi_slopes
from relbias.biases.t5 import t5_bucket
from relbias.book.plots import figure
from relbias.lab.ablations import far_buckets_to_min
from relbias.lab.readback import learned_bias

# --- ALiBi --------------------------------------------------------------------------------


def book_alibi_betas(num_heads: int) -> torch.Tensor:
    r"""The slopes as the book's Eq. 2.84 prints them, :math:`\beta_k = 1/2^{8/k}`, float64.

    Kept only to show the erratum: the printed rule ignores the head count and grows
    with :math:`k` towards 1, while Press et al.'s slopes shrink geometrically.
    """
    k = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return 2.0 ** (-8.0 / k)


def power_of_two(x: float, *, tex: bool = False) -> str:
    """``x`` written as a power of two, e.g. ``2^-1.5`` (exact for ALiBi's slopes).

    ``tex=True`` gives inline maths for a Markdown table or prose, e.g. ``$2^{-1.5}$``.
    """
    exponent = f"{math.log2(x):g}"
    return f"$2^{{{exponent}}}$" if tex else f"2^{exponent}"


def alibi_slope_table(num_heads: int, *, head_dim: int | None = None):
    """Per head: the book's printed beta_k, the paper's m_k (and, with ``head_dim``,
    the book's equivalent beta_k = m_k sqrt(d)). Returns ``(rows, headers)``."""
    book = book_alibi_betas(num_heads).tolist()
    paper = alibi_slopes(num_heads).double().tolist()
    headers = ["head $k$", "Eq. 2.84 as printed: $1/2^{8/k}$", "paper: $m_k$", "$m_k$"]
    if head_dim is not None:
        headers.append(f"book's $\\beta_k = m_k \\sqrt{{{head_dim}}}$")
    rows = []
    for k in range(num_heads):
        row = [k + 1, book[k], paper[k], power_of_two(paper[k], tex=True)]
        if head_dim is not None:
            row.append(paper[k] * math.sqrt(head_dim))
        rows.append(row)
    return rows, headers


def plot_alibi_slopes(head_counts=(4, 6, 8, 12, 16), *, erratum_heads: int = 8):
    """Left: the book's printed slopes against the paper's for ``erratum_heads`` heads.

    Right: the paper's slopes for several head counts, one row per count (log scale):
    filled dots are the geometric slopes of the largest power of two ``p <= n``, open
    dots the every-other slopes of ``2p`` heads that a count which is not a power of two
    adds between them. Each row is drawn on its own, so no count hides another, and the
    legends sit below the panels.
    """
    fig, axes = figure(8, 3.8, ncols=2)
    ax0, ax1 = axes.flat
    k = np.arange(1, erratum_heads + 1)
    ax0.plot(
        k,
        book_alibi_betas(erratum_heads).numpy(),
        "s--",
        color="tab:red",
        label=r"Eq. 2.84 as printed: $1/2^{8/k}$",
    )
    ax0.plot(
        k,
        alibi_slopes(erratum_heads).numpy(),
        "o-",
        color="tab:blue",
        label=r"Press et al.: $m_k = 2^{-8k/n}$",
    )
    ax0.set_yscale("log", base=2)
    ax0.set_xlabel(f"head k ({erratum_heads} heads)")
    ax0.set_ylabel("slope (log scale)")
    ax0.set_title("the printed slopes grow with k; the paper's shrink", fontsize=9)
    ax0.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    for row, n in enumerate(head_counts):
        slopes = alibi_slopes(n).numpy()
        p = 2 ** int(math.floor(math.log2(n)))
        ax1.plot(
            slopes[:p],
            [row] * p,
            "o",
            color="tab:blue",
            ms=5,
            label=r"the $p$ slopes of $2^{\lfloor \log_2 n \rfloor}$ heads" if row == 0 else None,
        )
        ax1.plot(
            slopes[p:],
            [row] * (n - p),
            "o",
            mfc="white",
            color="tab:orange",
            ms=6,
            label=r"added: every other slope of $2p$ heads" if n > p else None,
        )
    ax1.set_xscale("log", base=2)
    ax1.set_yticks(range(len(head_counts)), [f"n = {n}" for n in head_counts])
    ax1.set_ylim(-0.6, len(head_counts) - 0.4)
    ax1.set_xlabel("slope $m_k$ (log scale)")
    ax1.set_title("the paper's slopes for several head counts n", fontsize=9)
    handles, labels = ax1.get_legend_handles_labels()
    unique = dict(zip(labels, handles))
    ax1.legend(
        unique.values(),
        unique.keys(),
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.2),
        ncol=1,
    )
    return fig


def recency_weights(slopes: torch.Tensor, length: int) -> torch.Tensor:
    r"""Attention of a content-free query (``q = 0``) at position ``length - 1``, per slope.

    With no content score the weights are the softmax of the bias alone,
    :math:`\alpha(i, j) \propto e^{-m (i-j)}`. Returns float64 ``[len(slopes), length]``
    indexed by the offset ``i - j = 0 .. length - 1``.
    """
    offsets = torch.arange(length, dtype=torch.float64)
    return torch.softmax(-torch.as_tensor(slopes).double()[:, None] * offsets[None, :], dim=-1)


def attention_span(slopes: torch.Tensor, length: int, mass: float = 0.9) -> list[int]:
    """Per slope: how many of the nearest keys hold ``mass`` of a content-free query's weight."""
    cumulative = recency_weights(slopes, length).cumsum(-1)
    return [int((row < mass).sum()) + 1 for row in cumulative]


def plot_recency_weights(slopes_by_label: dict, length: int = 64, *, ax=None):
    """Content-free attention weights against the offset, one line per slope.

    ``slopes_by_label`` maps a label to a 1-D tensor of slopes; each slope's legend entry,
    below its panel, gives its head and the number of nearest keys that hold 90 % of the
    weight.
    """
    if ax is None:
        fig, axes = figure(5.6 * len(slopes_by_label), 3.6, ncols=len(slopes_by_label))
        axes = [axes] if len(slopes_by_label) == 1 else list(axes.flat)
    else:
        fig, axes = ax.figure, [ax]
    offsets = np.arange(length)
    for ax_, (label, slopes) in zip(axes, slopes_by_label.items()):
        slopes = torch.as_tensor(slopes).double()
        weights = recency_weights(slopes, length)
        spans = attention_span(slopes, length)
        for k in range(len(slopes)):
            ax_.plot(
                offsets,
                weights[k].numpy(),
                lw=1.2,
                label=f"k={k + 1}: 90 % in {spans[k]} keys",
            )
        ax_.set_yscale("log")
        ax_.set_ylim(1e-6, 1.5)
        ax_.set_xlabel("offset i - j")
        ax_.set_ylabel("attention weight (q = 0)")
        ax_.set_title(label, fontsize=9)
        ax_.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return fig


def word_pair_table(words: list[str], slope: float):
    """Every causal (query, key) pair of ``words`` grouped by offset, with ALiBi's bias.

    Returns ``(rows, headers)``: one row per offset i - j with the number of pairs, an
    example pair and the bias after the scaling, -slope * (i - j), smallest penalty first.
    """
    rows = []
    for offset in range(len(words)):
        pairs = [(i, i - offset) for i in range(offset, len(words))]
        i, j = pairs[0]
        example = f"q={words[i]} ({i}), k={words[j]} ({j})"
        rows.append([offset, len(pairs), example, 0.0 - slope * offset])
    return rows, ["offset $i - j$", "pairs", "first pair", "bias $-m\\,(i-j)$"]


def penalty_reach(bias: RelativeBias, threshold: float = 5.0, *, max_offset: int = 100_000):
    """Per head: the first offset whose bias is at or below ``-threshold``, or None.

    A penalty of 5 cuts a key's attention weight by a factor e^5 (about 150) against a
    key at offset 0 with the same content score: a rough measure of how far a head sees.
    Only for offset-only families.
    """
    table = learned_bias(bias, max_offset)
    reach = []
    for row in table:
        hits = (row <= -threshold).nonzero()
        reach.append(int(hits[0]) if hits.numel() else None)
    return reach


# --- Kerple -------------------------------------------------------------------------------


def distance_matrix(n: int) -> torch.Tensor:
    """``|i - j|`` for positions ``0..n-1``, float64 ``[n, n]``."""
    x = torch.arange(n, dtype=torch.float64)
    return (x[:, None] - x[None, :]).abs()


def projected_min_eigenvalue(kernel: torch.Tensor) -> float:
    """The smallest eigenvalue of ``P K P`` over its largest absolute one, in float64.

    ``P = I - 11^T / n`` projects onto vectors whose entries sum to zero, so the value
    is >= 0 (up to rounding) exactly when ``K`` is conditionally positive definite on
    these points: ``c^T K c >= 0`` for every ``c`` with ``sum(c) = 0``.
    """
    k = kernel.double()
    n = k.shape[0]
    proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
    eig = torch.linalg.eigvalsh(proj @ k @ proj)
    return float(eig.min() / eig.abs().max())


def plot_cpd_scan(exponents, values, *, tolerance: float = 1e-9):
    """The relative smallest eigenvalue of the projected power kernel against r2."""
    fig, ax = figure(6.4, 3.4)
    exponents, values = np.asarray(exponents), np.asarray(values)
    ok = values >= -tolerance
    ax.plot(exponents, values, color="grey", lw=0.8)
    ax.plot(
        exponents[ok],
        values[ok],
        "o",
        color="tab:green",
        ms=4,
        label="conditionally positive definite",
    )
    ax.plot(exponents[~ok], values[~ok], "x", color="tab:red", ms=5, label="not CPD")
    ax.axvline(2.0, color="black", lw=0.6, ls=":")
    ax.set_xlabel("exponent r2 of the kernel -|i-j|^r2")
    ax.set_ylabel("min eig(P K P) / max |eig|")
    ax.set_title(
        "-|i-j|^r2 at the exponents scanned: CPD up to r2 = 2, not above\n"
        "(Schoenberg: CPD exactly when r2 <= 2)",
        fontsize=8,
    )
    ax.legend(fontsize=9)
    return fig


# --- FIRE ---------------------------------------------------------------------------------


def plot_fire_inputs(fire: FIRE, short_len: int, long_len: int, *, rows=None):
    """What FIRE's MLP sees: psi(i-j) / psi(max(L, i)) for a short and a long sequence.

    Left and middle: the normalised input over the causal (query, key) grid for
    ``short_len`` (below the threshold L) and ``long_len`` (far above it), on one colour
    scale. Right: the input against the offset i - j for a few query positions ``rows``:
    below L the curves lie on one another (offset only), above L each query's whole
    range of offsets is squeezed into [0, 1].
    """
    L = float(fire.L.detach())
    if rows is None:
        rows = sorted({int(L) // 4, int(L) // 2, int(L) - 1, long_len // 4, long_len - 1})
    fig, axes = figure(13, 3.8, ncols=3)
    axes = list(axes.flat)
    with torch.no_grad():
        for ax, n in zip(axes[:2], (short_len, long_len)):
            x = fire.normalized_input(n).float().cpu()
            x[torch.ones(n, n, dtype=torch.bool).triu(1)] = float("nan")
            image = ax.imshow(x.numpy(), vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"{n} tokens (L = {L:g})", fontsize=9)
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
        fig.colorbar(image, ax=axes[:2], shrink=0.8, label="MLP input")
        x = fire.normalized_input(long_len).float().cpu()
        styles = ["-", "--", ":", "-.", "-"]
        for n, i in enumerate(rows):
            offsets = np.arange(i + 1)
            axes[2].plot(
                offsets,
                x[i, : i + 1].flip(0).numpy(),
                lw=1.4 + 0.6 * (i < L),
                ls=styles[n % len(styles)],
                label=f"i = {i}" + (" (< L)" if i < L else ""),
            )
    axes[2].axvline(L, color="grey", lw=0.6, ls=":")
    axes[2].set_xlabel("offset i - j")
    axes[2].set_ylabel("MLP input")
    axes[2].set_title("by offset, per query", fontsize=9)
    axes[2].legend(fontsize=9)
    return fig


# --- T5's far buckets (chapter 3) ---------------------------------------------------------


def plot_t5_far_end(
    ablation: dict,
    longer: dict,
    *,
    variant: str = "t5_d128_b32",
    seed: str = "0",
    width: float = 8.0,
    height: float = 3.0,
):
    """The learned T5 bias of every head of one seed against the offset (log scale): left,
    ``ablation``'s ``variant`` as trained (solid) and with the buckets past each head's
    minimum set to it (``far_to_min``: :func:`~relbias.lab.ablations.far_buckets_to_min`,
    dashed); right, the sweep ``longer``'s ``t5`` of the same seed (its read-back per
    offset). Both panels share the y axis and read the offsets of the longer read-back; a
    dashed grey line marks the last offset of a training window; one colour per head, and
    one legend below the panels."""
    import matplotlib
    from matplotlib.lines import Line2D

    spec = ablation["methods"][variant]["variant"]
    record = ablation["methods"][variant]["seeds"][seed]
    read = longer["methods"]["t5"]["seeds"][seed]["learned_bias"]["values"]
    offsets = torch.arange(len(read[0]))
    buckets = t5_bucket(
        offsets, num_buckets=spec["num_buckets"], max_distance=spec["dist_max"], bidirectional=False
    )
    trained = torch.tensor(record["bucket_table"])[:, buckets]
    changed = far_buckets_to_min(torch.tensor(record["bucket_table"]))[:, buckets]
    panels = {
        f"{ablation['provenance']['config']['steps']:,} steps, seed {seed}": (trained, changed),
        f"{longer['provenance']['config']['steps']:,} steps, seed {seed}": (torch.tensor(read),),
    }
    colors = matplotlib.colormaps["tab10"].colors
    fig, axes = figure(width, height, ncols=2, sharey=True)
    for ax, (title, tables) in zip(axes.flat, panels.items()):
        for table, style in zip(tables, ("-", "--")):
            for h, row in enumerate(table.tolist()):
                ax.step(offsets.numpy(), row, where="post", color=colors[h], ls=style, lw=1)
        ax.axvline(ablation["provenance"]["config"]["train_len"] - 1, color="grey", ls=":", lw=1)
        ax.set(xscale="symlog", xlim=(0, len(read[0]) - 1), xlabel="offset i - j (bytes)")
        ax.set_title(title, fontsize=10)
    axes.flat[0].set_ylabel("learned bias $u_{b(i-j)}$")
    heads = len(read)
    handles = [Line2D([], [], color=colors[h], lw=1) for h in range(heads)]
    handles += [Line2D([], [], color="black", lw=1), Line2D([], [], color="black", ls="--", lw=1)]
    names = [f"head {h}" for h in range(heads)] + ["as trained", "far buckets set to the minimum"]
    fig.legend(handles, names, loc="outside lower center", ncol=3, fontsize=8)
    return fig


# --- legends that hide no data (chapters 4 and 5) ------------------------------------------


def legend_below(fig, *, each: bool = False, ncol: int = 2, fontsize: int = 8):
    """Move a figure's legends off its panels, so that no legend covers a line, and return
    ``fig``.

    By default one legend below all panels names every labelled line once (the labels of
    all panels, in the order they first appear). With ``each=True`` every panel that had a
    legend keeps its own, moved below that panel (panels whose labels differ, such as one
    line per head with its own numbers)."""
    axes = list(fig.axes)
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if each:
        for ax in axes:
            handles, labels = ax.get_legend_handles_labels()
            if handles:
                ax.legend(
                    handles,
                    labels,
                    loc="upper center",
                    bbox_to_anchor=(0.5, -0.2),
                    ncol=ncol,
                    fontsize=fontsize,
                )
        return fig
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        fig.legend(
            list(seen.values()),
            list(seen),
            loc="outside lower center",
            ncol=min(ncol, len(seen)),
            fontsize=fontsize,
        )
    return fig


def heads_from_one(fig):
    """Number the heads of a figure from 1, as the book's formulas and prose do (head
    :math:`k = 1, \\dots, n`): every "head N" in its titles and legends becomes
    "head N+1" (the library's plots number heads from 0, the tensor index). Returns
    ``fig``."""

    def shift(text: str) -> str:
        return re.sub(r"\bhead (\d+)\b", lambda m: f"head {int(m.group(1)) + 1}", text)

    texts = [t for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
    legends = [ax.get_legend() for ax in fig.axes] + list(fig.legends)
    texts += [t for legend in legends if legend is not None for t in legend.get_texts()]
    if fig._suptitle is not None:
        texts.append(fig._suptitle)
    for t in texts:
        t.set_text(shift(t.get_text()))
    return fig


# --- Kerple (chapter 5) ---------------------------------------------------------------------


def kerple_settings_biases(settings: dict) -> dict:
    """``{form: {(r1, r2): bias}}``: one single-head Kerple bias per setting of
    ``settings`` (``{"power" or "log": [(r1, r2), ...]}``), each holding exactly its
    ``(r1, r2)``: the floor ``eps`` is lowered below the smallest value given, so that no
    setting is clamped to another (the default floor is 1e-2)."""
    classes = {"power": KerplePower, "log": KerpleLog}
    unknown = sorted(set(settings) - set(classes))
    if unknown:
        raise ValueError(f"forms must be 'power' or 'log', got {unknown}")
    out = {}
    for form, pairs in settings.items():
        out[form] = {}
        for r1, r2 in pairs:
            eps = min(1e-2, r1 / 2, r2 / 2)
            out[form][(r1, r2)] = classes[form](1, eps=eps, r1_init=r1, r2_init=r2)
    return out


def plot_kerple_settings(
    settings: dict, max_offset: int, *, reference: dict | None = None, ylim=(-20, 0.5)
):
    """One panel per Kerple form, one line per ``(r1, r2)`` setting (labelled with it),
    PE against the offset 0 .. ``max_offset``; ``reference`` (label to bias, e.g. ALiBi)
    drawn as grey dashed lines in every panel; each panel's legend below it."""
    biases = kerple_settings_biases(settings)
    fig, axes = figure(8.0, 3.9, ncols=len(biases))
    axes = [axes] if len(biases) == 1 else list(axes.flat)
    offsets = np.arange(max_offset + 1)
    for ax, (form, by_setting) in zip(axes, biases.items()):
        with torch.no_grad():
            for label, ref in (reference or {}).items():
                for h, line in enumerate(ref.offset_table(0, max_offset)):
                    ax.plot(
                        offsets,
                        line.numpy(),
                        color="grey",
                        lw=0.8,
                        ls="--",
                        label=label if h == 0 else None,
                    )
            for (r1, r2), bias in by_setting.items():
                values = bias.offset_table(0, max_offset)[0].numpy()
                ax.plot(offsets, values, lw=1.4, label=f"$r_1 = {r1:g}$, $r_2 = {r2:g}$")
        ax.set_ylim(*ylim)
        ax.set_title(f"{form} form", fontsize=9)
        ax.set_xlabel("offset i - j")
        ax.set_ylabel("PE(i, j)")
        ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    return fig
