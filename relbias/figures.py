"""Figures and small tables for the chapters on ALiBi and Sandwich, Kerple, FIRE and the comparison.

Every function here only *reads* the library (slopes, bias modules, result dicts)
and draws or tabulates it, so that the notebook cells stay short. Plots return the
matplotlib figure; tables return a list of row dicts (see :func:`markdown_table`).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .alibi import alibi_slopes
from .base import RelativeBias
from .fire import FIRE

# --- tables -------------------------------------------------------------------------------


def markdown_table(rows: list[dict], columns: list[str] | None = None, *, digits: int = 4):
    """Render ``rows`` (dicts with the same keys) as an IPython Markdown table.

    Floats are shown with ``digits`` significant digits; every other value with ``str``.
    """
    from IPython.display import Markdown

    columns = list(rows[0]) if columns is None else list(columns)

    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:.{digits}g}"
        return str(value)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r[c]) for c in columns) + " |" for r in rows]
    return Markdown("\n".join(lines))


# --- ALiBi --------------------------------------------------------------------------------


def book_alibi_betas(num_heads: int) -> torch.Tensor:
    r"""The slopes as the book's Eq. 2.84 prints them, :math:`\beta_k = 1/2^{8/k}`, float64.

    Kept only to show the erratum: the printed rule ignores the head count and grows
    with :math:`k` towards 1, while Press et al.'s slopes shrink geometrically.
    """
    k = torch.arange(1, num_heads + 1, dtype=torch.float64)
    return 2.0 ** (-8.0 / k)


def alibi_slope_rows(num_heads: int, *, head_dim: int | None = None) -> list[dict]:
    """One row per head: the book's printed beta_k, the paper's m_k (and m_k sqrt(d))."""
    book = book_alibi_betas(num_heads)
    paper = alibi_slopes(num_heads).double()
    rows = []
    for k in range(num_heads):
        row = {
            "head k": k + 1,
            "book: 1/2^(8/k)": float(book[k]),
            "paper: m_k": float(paper[k]),
            "m_k as 2^x": f"2^{math.log2(float(paper[k])):g}",
        }
        if head_dim is not None:
            row[f"beta_k = m_k sqrt({head_dim})"] = float(paper[k]) * math.sqrt(head_dim)
        rows.append(row)
    return rows


def plot_alibi_slopes(head_counts=(4, 6, 8, 12, 16), *, erratum_heads: int = 8):
    """Left: the book's printed slopes against the paper's for ``erratum_heads`` heads.

    Right: the paper's slopes for several head counts (log scale). For a count that is
    not a power of two the slopes of the lower power of two are followed by every other
    slope of the next one, so the set interleaves instead of forming one geometric run.
    """
    import matplotlib.pyplot as plt

    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(11, 3.8))
    k = np.arange(1, erratum_heads + 1)
    ax0.plot(k, book_alibi_betas(erratum_heads).numpy(), "s--", color="tab:red",
             label=r"book's Eq. 2.84 as printed: $1/2^{8/k}$")
    ax0.plot(k, alibi_slopes(erratum_heads).numpy(), "o-", color="tab:blue",
             label=r"Press et al.: $m_k = 2^{-8k/n}$")
    ax0.set_yscale("log", base=2)
    ax0.set_xlabel(f"head k ({erratum_heads} heads)")
    ax0.set_ylabel("slope (log scale)")
    ax0.set_title("the printed slopes grow with k; the paper's shrink", fontsize=9)
    ax0.legend(fontsize=8)
    for n in head_counts:
        slopes = alibi_slopes(n).numpy()
        ax1.plot(np.arange(1, n + 1), slopes, "o-", ms=4, label=f"n = {n}")
    ax1.set_yscale("log", base=2)
    ax1.set_xlabel("head k")
    ax1.set_ylabel("slope m_k (log scale)")
    ax1.set_title("paper's slopes for several head counts", fontsize=9)
    ax1.legend(fontsize=8)
    fig.tight_layout()
    return fig


def bias_matrix(bias: RelativeBias, length: int, *, causal: bool = True) -> torch.Tensor:
    """PE(i, j) as ``[heads, length, length]`` float32, with NaN where the causal mask blocks."""
    with torch.no_grad():
        pe = bias(length).float().cpu().clone()
    if causal:
        future = torch.ones(length, length, dtype=torch.bool).triu(1)
        pe[:, future] = float("nan")
    return pe


def plot_bias_heatmaps(bias: RelativeBias, length: int, *, heads=None, title: str = "",
                       causal: bool = True):
    """One heat map of PE(i, j) per head (query i down, key j across; masked cells blank)."""
    import matplotlib.pyplot as plt

    pe = bias_matrix(bias, length, causal=causal)
    heads = list(range(pe.shape[0])) if heads is None else list(heads)
    fig, axes = plt.subplots(1, len(heads), figsize=(2.7 * len(heads) + 0.6, 2.8),
                             squeeze=False)
    for ax, h in zip(axes[0], heads):
        image = ax.imshow(pe[h].numpy(), cmap="viridis")
        ax.set_title(f"head {h}", fontsize=9)
        ax.set_xlabel("key j")
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    axes[0, 0].set_ylabel("query i")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def offset_profile(bias: RelativeBias, max_offset: int, *, query_position=None) -> torch.Tensor:
    """PE at offsets ``0..max_offset`` per head, ``[heads, max_offset + 1]`` float32.

    For FIRE (which also depends on the query position) the row of the query at
    ``query_position`` (default ``max_offset``) is read.
    """
    with torch.no_grad():
        if bias.offset_only:
            return bias.offset_table(0, max_offset).float().cpu()
        i = max_offset if query_position is None else query_position
        row = bias(1, i + 1, q_start=i)[:, 0, :].float().cpu()
    return row.flip(-1)[:, : max_offset + 1]


def plot_offset_profiles(biases: dict, max_offset: int, *, reference: dict | None = None,
                         train_len: int | None = None, query_position=None, ncols: int = 4,
                         ylim=None):
    """One panel per entry of ``biases``: PE against the offset i - j, a line per head.

    ``biases`` maps a title to a :class:`RelativeBias` or a tensor ``[heads, offsets]``.
    ``reference`` (title to bias or tensor) is drawn in every panel as thin grey dashed
    lines, e.g. ALiBi's fixed slopes next to what a learnable family learned.
    ``train_len`` marks the last offset seen in training.
    """
    import matplotlib.pyplot as plt

    def table(item):
        if isinstance(item, torch.Tensor):
            return item.float().cpu()
        return offset_profile(item, max_offset, query_position=query_position)

    n = len(biases)
    cols = min(n, ncols)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.5 * cols, 2.9 * rows), squeeze=False)
    offsets = np.arange(max_offset + 1)
    for ax, (name, item) in zip(axes.flat, biases.items()):
        for ref_name, ref in (reference or {}).items():
            for h, line in enumerate(table(ref)):
                ax.plot(offsets, line.numpy(), color="grey", lw=0.8, ls="--",
                        label=ref_name if h == 0 else None)
        for h, line in enumerate(table(item)):
            ax.plot(offsets, line.numpy(), lw=1.3, label=f"head {h}")
        if train_len is not None:
            ax.axvline(train_len - 1, color="black", lw=0.6, ls=":")
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("offset i - j")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    for row in axes:
        row[0].set_ylabel("PE(i, j)")
    axes.flat[0].legend(fontsize=6)
    fig.tight_layout()
    return fig


def word_pair_penalties(words: list[str], slope: float) -> list[dict]:
    """Every causal (query, key) pair of ``words`` with its ALiBi bias ``-slope * (i - j)``.

    Rows are sorted by penalty, smallest first (ties in reading order).
    """
    rows = []
    for i, query in enumerate(words):
        for j in range(i + 1):
            rows.append({"query i": f"{i}:{query}", "key j": f"{j}:{words[j]}",
                         "offset i-j": i - j, "PE(i,j)": 0.0 - slope * (i - j)})
    return sorted(rows, key=lambda r: r["offset i-j"])


# --- Kerple -------------------------------------------------------------------------------


def projected_min_eigenvalue(kernel: torch.Tensor) -> float:
    """The smallest eigenvalue of ``P K P`` over its largest (absolute), in float64.

    ``P = I - 11^T / n`` projects onto vectors whose entries sum to zero, so the value
    is >= 0 (up to rounding) exactly when ``K`` is conditionally positive definite on
    these points: ``c^T K c >= 0`` for every ``c`` with ``sum(c) = 0``.
    """
    k = kernel.double()
    n = k.shape[0]
    proj = torch.eye(n, dtype=torch.float64) - 1.0 / n
    eig = torch.linalg.eigvalsh(proj @ k @ proj)
    return float(eig.min() / eig.abs().max())


def distance_matrix(n: int) -> torch.Tensor:
    """``|i - j|`` for positions ``0..n-1``, float64 ``[n, n]``."""
    x = torch.arange(n, dtype=torch.float64)
    return (x[:, None] - x[None, :]).abs()


def plot_cpd_scan(exponents, values, *, tolerance: float = 1e-9):
    """The relative smallest eigenvalue of the projected power kernel against r2."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.4))
    values = np.asarray(values)
    ok = values >= -tolerance
    ax.plot(exponents, values, color="grey", lw=0.8)
    ax.plot(np.asarray(exponents)[ok], values[ok], "o", color="tab:green", ms=4,
            label="CPD (min eigenvalue >= 0)")
    ax.plot(np.asarray(exponents)[~ok], values[~ok], "x", color="tab:red", ms=5,
            label="not CPD")
    ax.axvline(2.0, color="black", lw=0.6, ls=":")
    ax.set_xlabel("exponent r2 in -|i-j|^r2")
    ax.set_ylabel("min eigenvalue of P K P / max |eigenvalue|")
    ax.set_title("the power kernel is conditionally positive definite exactly for r2 <= 2",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


# --- FIRE ---------------------------------------------------------------------------------


def plot_fire_inputs(fire: FIRE, short_len: int, long_len: int, *, rows=None):
    """What FIRE's MLP sees: psi(i-j) / psi(max(L, i)) for a short and a long sequence.

    Left and middle: the normalised input over the causal (query, key) grid for
    ``short_len`` (below the threshold L) and ``long_len`` (far above it), on one colour
    scale. Right: the input against the offset i - j for a few query positions ``rows``:
    below L the curves coincide (offset only), above L each is squeezed into [0, 1].
    """
    import matplotlib.pyplot as plt

    L = float(fire.L.detach())
    rows = rows or sorted({int(L) // 4, int(L) // 2, int(L) - 1, long_len // 2, long_len - 1})
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.7))
    with torch.no_grad():
        for ax, n in zip(axes[:2], (short_len, long_len)):
            x = fire.normalized_input(n).float().cpu()
            x[torch.ones(n, n, dtype=torch.bool).triu(1)] = float("nan")
            image = ax.imshow(x.numpy(), vmin=0, vmax=1, cmap="magma")
            ax.set_title(f"{n} tokens (L = {L:g})", fontsize=9)
            ax.set_xlabel("key j")
            ax.set_ylabel("query i")
            fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
        x = fire.normalized_input(long_len).float().cpu()
        for i in rows:
            ax = axes[2]
            offsets = np.arange(i + 1)
            ax.plot(offsets, x[i, : i + 1].flip(0).numpy(), lw=1.2,
                    label=f"i = {i}" + (" (< L)" if i < L else ""))
        axes[2].axvline(L, color="grey", lw=0.6, ls=":")
        axes[2].set_xlabel("offset i - j")
        axes[2].set_ylabel("MLP input")
        axes[2].set_title("input by offset, one line per query", fontsize=9)
        axes[2].legend(fontsize=7)
    fig.tight_layout()
    return fig


# --- results ------------------------------------------------------------------------------


def extrapolation_summary(results: dict) -> list[dict]:
    """Per method: params, bits per byte at each length and the ratio longest / training."""
    rows = []
    for name, rec in results["methods"].items():
        evals = rec["eval"]
        row = {"method": name, "params": rec["params"]}
        for r in evals:
            row[f"bpb@{r['length']}"] = round(r["bpb"], 3)
        row["ratio"] = round(evals[-1]["bpb"] / evals[0]["bpb"], 3)
        rows.append(row)
    return rows
