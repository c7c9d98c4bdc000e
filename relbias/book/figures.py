"""Figures and tables for the chapters on ALiBi and Sandwich, Kerple, FIRE, the comparison
and the forget gate.

Every function here only *reads* the library (slopes, bias modules, result dicts) and
draws or tabulates it, so that the notebook cells stay short. Figures are built with
:func:`relbias.book.plots.figure` (no pyplot, nothing displayed twice) and returned;
tables are returned as ``(rows, headers)`` for :func:`relbias.book.display.show_table`.
A bias against the offset is drawn by :func:`relbias.book.plots.plot_bias_by_offset`
and read by :func:`relbias.lab.training.learned_bias`, for every chapter.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from relbias import FIRE, KerpleLog, KerplePower, RelativeBias, alibi_slopes, make_bias
from relbias.book.plots import figure
from relbias.lab.model import BIAS_POSITIONS, default_bias_kwargs
from relbias.lab.training import build_model, learned_bias, shade_interval

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
    ax.set_title("-|i-j|^r2 is conditionally positive definite exactly when r2 <= 2", fontsize=9)
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


# --- results ------------------------------------------------------------------------------


def extrapolation_rows(results: dict, *, methods=None):
    """Per method: parameters, bits per byte at each length, and longest / training ratio.

    Returns ``(rows, headers)`` for :func:`relbias.book.display.show_table`.
    """
    names = list(results["methods"]) if methods is None else list(methods)
    first = results["methods"][names[0]]["eval"]
    headers = ["method", "params"] + [f"bpb @ {r['length']}" for r in first]
    headers.append(f"bpb @ {first[-1]['length']} / bpb @ {first[0]['length']}")
    rows = []
    for name in names:
        rec = results["methods"][name]
        bpb = [r["bpb"] for r in rec["eval"]]
        rows.append([name, rec["params"], *bpb, bpb[-1] / bpb[0]])
    return rows, headers


# --- the book's Table 2.4, extended --------------------------------------------------------

#: PE(i, j) of each method in the book's notation (Table 2.4 and Eqs. 2.78-2.84), and what
#: the book calls its hyper-parameters; the baselines add no bias.
TABLE_2_4 = {
    "offset": (r"$u_{\min(i-j,\,K)}$", r"$K$ (here $m_l - 1$)"),
    "t5": (r"$u_{b(i-j)}$", r"$n_b$, $\mathrm{dist}_{\max}$"),
    "alibi": (r"$-\beta\,(i-j)$", r"$\beta$ per head (fixed)"),
    "sandwich": (r"$\sum_{k=1}^{d'/2}\cos\big((i-j)/10000^{2k/d'}\big)$", r"$d'$"),
    # \lvert, not |: a table cell escapes "|" to "\|", which TeX reads as a double bar
    "kerple_power": (
        r"$-\beta_1 \lvert i-j\rvert^{\beta_2}$",
        r"none ($\beta_1, \beta_2$ learned)",
    ),
    "kerple_log": (
        r"$-\beta_1 \log(1 + \beta_2\,\lvert i-j\rvert)$",
        r"none ($\beta_1, \beta_2$ learned)",
    ),
    "fire": (
        r"$f_\theta\big(\psi(i-j)/\psi(\max(m_{len}, i))\big)$",
        r"MLP size ($c$, $m_{len}$ learned)",
    ),
    "nope": ("none", "none"),
    "sinusoidal": ("absolute, sinusoidal (learned scale)", "none"),
    "learned": ("absolute, learned", r"$m_l$"),
    "rope": ("rotates $q$, $k$", "base"),
}


def positional_parameters(name: str, config) -> int:
    """Learnable positional parameters of a :class:`~relbias.lab.model.TinyLM` built from
    ``config``.

    The difference between the model's parameter count and that of the same model with
    no positional information (``nope``): the bias module (shared by the layers, as
    TinyLM does by default), the learned absolute table, or the sinusoid's scale.
    """

    def count(position: str) -> int:
        return sum(p.numel() for p in build_model(position, config).parameters() if p.requires_grad)

    return count(name) - count("nope")


def bias_values_computed(name: str, config, length: int) -> str:
    """How much work one ``length x length`` causal bias takes, as a short description.

    Offset-only families compute one value per head for each of the ``2 length - 1``
    offsets of the square (then gather); FIRE runs its MLP at all ``length^2`` (query, key)
    pairs. Short enough for a table column.
    """
    if name not in BIAS_POSITIONS:
        return {
            "rope": "rotation, O(nd)",
            "learned": "lookup, O(nd)",
            "sinusoidal": "O(nd) once",
            "nope": "none",
        }[name]
    bias = make_bias(name, config.heads, **default_bias_kwargs(name, config.train_len))
    if bias.offset_only:
        return f"{2 * length - 1:,} per head"
    return f"MLP at {length * length:,} pairs"


def table_2_4_rows(results: dict, config, *, cost_length: int = 1024):
    """The book's Table 2.4, extended with measurements: ``(rows, headers)``.

    For every method in ``results`` (an extrapolation result): PE(i, j) in the book's
    notation, what the book calls hyper-parameters, learnable positional parameters of the
    TinyLM of ``config``, the work to build a ``cost_length`` bias, and the extrapolation
    measured in ``results``: bits per byte at the longest length minus those at the
    training length (mean over seeds; below 0, more context helped). Short headers and
    cells, so that the table fits a page's text column.
    """
    first = next(iter(results["methods"].values()))["eval"]
    headers = [
        "method",
        r"$\mathrm{PE}(i,j)$",
        "hyper-parameters",
        "learned",
        f"work, {cost_length} tokens",
        f"{first[-1]['factor']}x − {first[0]['factor']}x",
    ]
    rows = []
    for name, rec in results["methods"].items():
        formula, hyper = TABLE_2_4[name]
        bpb = [r["bpb"] for r in rec["eval"]]
        rows.append(
            [
                name,
                formula,
                hyper,
                positional_parameters(name, config),
                bias_values_computed(name, config, cost_length),
                round(bpb[-1] - bpb[0], 2) + 0.0,  # + 0.0: no "-0.00"
            ]
        )
    return rows, headers


def plot_window_loss(evals: dict, train_len: int, *, ax=None, window: int = 32):
    """Loss by position inside the longest window, one line per entry of ``evals``.

    ``evals`` maps a label to the rows of :func:`relbias.lab.training.evaluate_lengths`; the
    longest length's ``loss_by_position`` is smoothed by a running mean over ``window``.
    """
    if ax is None:
        fig, ax = figure(6.4, 3.4)
    else:
        fig = ax.figure
    for name, rows in evals.items():
        row = rows[-1]
        y = np.convolve(row["loss_by_position"], np.ones(window) / window, mode="valid")
        ax.plot(np.arange(len(y)) + window - 1, y, lw=1.1, label=name)
    ax.axvline(train_len, color="grey", lw=0.8)
    ax.set_xlabel(f"position in the window of {row['length']} (running mean of {window})")
    ax.set_ylabel("bits per byte")
    ax.legend(fontsize=9)
    return fig


# The stored sweep's methods in three groups, one panel each: what the book predicts for them.
SWEEP_GROUPS = {
    "distance penalties": ("alibi", "sandwich", "kerple_power", "kerple_log"),
    "learned tables, FIRE": ("offset", "t5", "fire"),
    "absolute, rotary, none": ("learned", "sinusoidal", "rope", "nope"),
}


def plot_sweep_groups(results: dict, groups: dict | None = None):
    """Bits per byte against the evaluation length, one panel per group of methods.

    ``results`` is a stored extrapolation sweep (``results["methods"][m]["eval"]`` rows
    with ``length`` and ``bpb``); ``groups`` maps a panel title to method names (default
    :data:`SWEEP_GROUPS`; methods missing from the results are skipped). The panels share
    their y axis, a grey line marks the training length, and a sweep of several seeds has
    its 95 % interval shaded; each panel's legend sits below it. Returns the Figure.
    """
    groups = SWEEP_GROUPS if groups is None else groups
    train_len = results["provenance"]["config"]["train_len"]
    fig, axes = figure(8, 3.9, ncols=len(groups), sharey=True)
    for ax, (title, methods) in zip(np.atleast_1d(axes).flat, groups.items()):
        lengths = []
        for method in methods:
            if method not in results["methods"]:
                continue
            rows = results["methods"][method]["eval"]
            lengths = [r["length"] for r in rows]
            (line,) = ax.plot(lengths, [r["bpb"] for r in rows], "o-", ms=3, label=method)
            shade_interval(ax, lengths, rows, "bpb", line.get_color())  # several seeds
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        if lengths:  # ticks at the evaluated lengths, in bytes
            ax.set_xticks(lengths[::2], [str(n) for n in lengths[::2]])
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("evaluation length (bytes)", fontsize=9)
        ax.tick_params(labelsize=9)
        # below the panel: a legend on it would cover lines or bands
        ax.legend(fontsize=8, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    np.atleast_1d(axes).flat[0].set_ylabel("bits per byte", fontsize=9)
    return fig


# --- the Forgetting Transformer's gate (chapter 9) ------------------------------------------


def difference_errors(cumulative: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> dict:
    r"""How far :math:`\mathrm{PE}(i, j) = F_i - F_j` computed in float32 lies from float64.

    ``cumulative`` is one sequence's float64 :math:`F` (1-D), ``i`` and ``j`` index tensors
    of query and key positions. Returns float64 absolute errors against the float64
    difference: ``"naive"`` (float32 :math:`F_i - F_j`), ``"split"`` (the library's
    :meth:`~relbias.attention.prepared.ForgettingBias.parts`, as every backend adds them:
    :math:`(hi_i - hi_j) + (lo_i - lo_j)` in float32) and ``"rounding"`` (float32's own
    rounding of the true difference, the least any float32 result can be off).
    """
    from relbias.attention.prepared import ForgettingBias

    exact = cumulative[i] - cumulative[j]
    f32 = cumulative.float()
    naive = (f32[i] - f32[j]).double()
    hi, lo = (p[0, 0] for p in ForgettingBias(cumulative[None, None]).parts())
    split = ((hi[i] - hi[j]) + (lo[i] - lo[j])).double()
    return {
        "naive": (naive - exact).abs(),
        "split": (split - exact).abs(),
        "rounding": (exact.float().double() - exact).abs(),
    }


def plot_difference_errors(offsets, errors: dict, *, floor: float = 1e-10):
    """The worst error per offset (``errors[name]``: one value per offset) on log axes;
    zeros are drawn at ``floor``. Returns the Figure."""
    fig, ax = figure(6.4, 3.3)
    styles = {"naive": "o-", "split": "s-", "rounding": "k--"}
    labels = {
        "naive": "float32 $F_i - F_j$",
        "split": "library: $(hi_i - hi_j) + (lo_i - lo_j)$",
        "rounding": "float32 rounding of the true PE",
    }
    for name, values in errors.items():
        ys = [max(float(v), floor) for v in values]
        ax.plot(offsets, ys, styles.get(name, "o-"), ms=3, lw=1, label=labels.get(name, name))
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("offset i - j")
    ax.set_ylabel("worst |error| of PE(i, j)")
    ax.legend(fontsize=8)
    return fig


def float32_cumulative(log_f: torch.Tensor) -> torch.Tensor:
    r""":math:`F_i = \sum_{t \le i} \log f_t` summed in float32, one addition after another
    (NumPy's float32 ``cumsum``), for one sequence's ``log_f`` (1-D): float32, each
    :math:`F_i` rounded to float32 after every addition, as a float32 cumulative sum on a
    GPU rounds (the order of its additions aside). PyTorch's CPU ``cumsum`` of a float32
    tensor accumulates in float64, so it is not used here."""
    values = log_f.detach().float().cpu().numpy()
    return torch.from_numpy(np.cumsum(values, dtype=np.float32))


#: The ways :func:`trap_errors` computes :math:`\mathrm{PE}(i, j) = F_i - F_j` in float32.
TRAP_WAYS = {
    "float32 sum": r"$F$ summed in float32 (reference code)",
    "float32 F": r"$F$ summed in float64, stored in float32",
    "split": r"library: $(hi_i - hi_j) + (lo_i - lo_j)$",
    "rounding": "float32 rounding of the true PE",
}


def trap_errors(log_f: torch.Tensor, offsets, *, queries: int = 256, seed: int = 0) -> dict:
    r"""The worst error of :math:`\mathrm{PE}(i, j) = F_i - F_j` per offset, against
    float64, for one head's ``log_f`` over one sequence (1-D, float32 values).

    For each offset ``d`` in ``offsets``, ``queries`` query positions ``i`` drawn at random
    from ``d .. n-1`` (``torch.Generator`` seeded with ``seed``) and keys ``j = i - d``.
    Returns ``{way: [worst |error| per offset]}`` for the ways of :data:`TRAP_WAYS`:
    ``"float32 sum"`` (:func:`float32_cumulative`, then the float32 difference),
    ``"float32 F"`` (the float64 sum rounded to float32, then the difference),
    ``"split"`` (the library's :meth:`~relbias.attention.prepared.ForgettingBias.parts`)
    and ``"rounding"`` (float32's rounding of the true difference: no float32 result can
    do better). The reference is the float64 sum of the float32 ``log_f``.
    """
    n = log_f.numel()
    exact_F = torch.cumsum(log_f.detach().float().double().cpu(), dim=0)
    summed = float32_cumulative(log_f).double()
    stored = exact_F.float().double()
    generator = torch.Generator().manual_seed(seed)
    worst = {way: [] for way in TRAP_WAYS}
    for d in offsets:
        if not 0 < d < n:
            raise ValueError(f"every offset must lie in 1 .. {n - 1}, got {d}")
        i = torch.randint(d, n, (queries,), generator=generator)
        j = i - d
        exact = exact_F[i] - exact_F[j]
        split = difference_errors(exact_F, i, j)
        worst["float32 sum"].append(float(((summed[i] - summed[j]) - exact).abs().max()))
        worst["float32 F"].append(float(((stored[i] - stored[j]) - exact).abs().max()))
        worst["split"].append(float(split["split"].max()))
        worst["rounding"].append(float(split["rounding"].max()))
    return worst


def first_query_off_by(log_f: torch.Tensor, threshold: float, *, near: int = 64):
    r"""The first query position at which :math:`F` summed in float32
    (:func:`float32_cumulative`) puts the bias of one of the ``near`` nearest keys
    (offsets 1 .. ``near``) more than ``threshold`` from the float64 sum's, for one head's
    ``log_f`` (1-D); None if no query of the sequence does."""
    exact_F = torch.cumsum(log_f.detach().float().double().cpu(), dim=0)
    summed = float32_cumulative(log_f).double()
    n = exact_F.numel()
    worst = torch.zeros(n, dtype=torch.float64)
    for d in range(1, min(near, n - 1) + 1):
        error = ((summed[d:] - summed[:-d]) - (exact_F[d:] - exact_F[:-d])).abs()
        worst[d:] = torch.maximum(worst[d:], error)
    over = (worst > threshold).nonzero().flatten()
    return int(over[0]) if over.numel() else None


def plot_trap_errors(offsets, panels: dict, *, floor: float = 1e-9):
    """One panel per entry of ``panels`` (``{title: trap_errors(...)}``), the worst error
    against the offset on log axes, one shared y axis and one legend below the panels (none
    on them). Errors of 0 are drawn at ``floor``. Returns the Figure."""
    fig, axes = figure(8.0, 3.6, ncols=len(panels), sharey=True)
    axes = list(np.atleast_1d(axes).flat)
    styles = {"float32 sum": "o-", "float32 F": "^-", "split": "s-", "rounding": "k--"}
    for ax, (title, errors) in zip(axes, panels.items()):
        for way, values in errors.items():
            ys = [max(float(v), floor) for v in values]
            ax.plot(offsets, ys, styles.get(way, "o-"), ms=3, lw=1, label=TRAP_WAYS.get(way, way))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("offset i - j (tokens)", fontsize=9)
        ax.set_title(title, fontsize=9)
        ax.grid(True, which="major", lw=0.3, alpha=0.5)
    axes[0].set_ylabel("worst |error| of PE(i, j) (nats)", fontsize=9)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=8)
    return fig


def gate_row(log_f: torch.Tensor) -> torch.Tensor:
    r""":math:`\mathrm{PE}(n-1, j) = \sum_{t=j+1}^{n-1} \log f_t` for every key ``j`` of the
    last query, from one sequence's ``log_f`` (1-D, float64)."""
    F_all = torch.cumsum(log_f.double(), dim=0)
    return F_all[-1] - F_all


def plot_gate_row(log_f: torch.Tensor, alibi_slope: float, *, reset_at: int | None = None):
    """The last query's bias and content-free attention for per-token ``log_f``, next to
    ALiBi with ``alibi_slope`` (the constant gate ``log f = -slope``). Returns the Figure."""
    n = log_f.numel()
    keys = np.arange(n)
    rows = {
        "forget gate": gate_row(log_f),
        f"ALiBi, slope {alibi_slope:g}": gate_row(torch.full((n,), -float(alibi_slope))),
    }
    fig, axes = figure(7.0, 3.0, ncols=2)
    ax0, ax1 = axes.flat
    for (label, row), style in zip(rows.items(), ("-", "--")):
        ax0.plot(keys, row.clamp(min=-60).numpy(), style, label=label)
        ax1.plot(keys, torch.softmax(row, dim=0).numpy(), style, label=label)
    for ax in (ax0, ax1):
        if reset_at is not None:
            ax.axvline(reset_at, color="grey", lw=0.8, ls=":")
        ax.set_xlabel("key position j")
    ax0.set_ylabel(f"PE({n - 1}, j)")
    ax0.set_ylim(bottom=max(float(ax0.get_ylim()[0]), -60))
    ax1.set_ylabel("content-free attention")
    ax0.legend(fontsize=8)
    return fig


@torch.no_grad()
def gate_log_forget(model, data: torch.Tensor, seq_len: int, windows: int):
    r"""Every layer's and head's :math:`\log f_t` of a ``position="forgetting"`` model on
    ``windows`` consecutive windows of ``seq_len`` bytes from ``data`` (read from the start).

    The windows go through :meth:`~relbias.lab.model.TinyLM.gate_log_forget` (each layer's
    gate on the normalised input it reads in the model). Returns ``(log_f, byte_ids)``: float32
    ``[layers, heads, windows * seq_len]`` and int64 ``[windows * seq_len]``, on the CPU.
    """
    device = next(model.parameters()).device
    idx = data[: windows * seq_len].long().view(windows, seq_len).to(device)
    per_layer = model.gate_log_forget(idx)  # [layers, windows, heads, seq_len]
    log_f = per_layer.permute(0, 2, 1, 3).flatten(2)  # [layers, heads, tokens]
    return log_f.float().cpu(), idx.flatten().cpu()


def byte_name(b: int) -> str:
    """A byte as the book's tables show it: ``newline``, ``space``, ``tab`` or the character."""
    names = {10: "newline", 32: "space", 9: "tab"}
    if b in names:
        return names[b]
    return chr(b) if 33 <= b < 127 else f"0x{b:02x}"


def forget_by_byte(log_f: torch.Tensor, byte_ids: torch.Tensor, *, min_count: int = 20):
    """Mean ``log_f`` (one head's, 1-D) per byte value seen at least ``min_count`` times:
    a list of ``(byte, count, mean log f)``, the most forgetting byte first."""
    counts = torch.bincount(byte_ids, minlength=256)
    sums = torch.bincount(byte_ids, weights=log_f.double(), minlength=256)
    seen = (counts >= min_count).nonzero().flatten().tolist()
    rows = [(b, int(counts[b]), float(sums[b] / counts[b])) for b in seen]
    return sorted(rows, key=lambda r: r[2])


def gate_head_rows(log_f: torch.Tensor, byte_ids: torch.Tensor, *, top: int = 3):
    """One row per layer and head: mean f, mean -log f, the half-life ln 2 / mean(-log f)
    in tokens, the share of tokens whose gate stays open (f > 0.9), the spread (std) of
    log f over tokens, and the ``top`` bytes that make the
    head forget most. Returns ``(rows, headers)``."""
    rows = []
    for layer, heads in enumerate(log_f):
        for head, values in enumerate(heads):
            rate = float(-values.double().mean())
            worst = forget_by_byte(values, byte_ids)[:top]
            rows.append(
                [
                    layer,
                    head,
                    float(values.double().exp().mean()),
                    rate,
                    math.log(2) / rate,
                    float((values.double().exp() > 0.9).double().mean()),
                    float(values.double().std()),
                    ", ".join(byte_name(b) for b, _, _ in worst),
                ]
            )
    headers = [
        "layer",
        "head",
        "mean $f_t$",
        r"mean $-\log f_t$",
        "half-life (tokens)",
        r"share with $f_t > 0.9$",
        r"std of $\log f_t$",
        "bytes that forget most",
    ]
    return rows, headers


def plot_gate_readback(
    log_f: torch.Tensor,
    byte_ids: torch.Tensor,
    layer: int,
    head: int,
    *,
    start: int = 0,
    length: int = 48,
):
    """Left: the half-life of every layer's and head's mean forget rate. Right: one head's
    log f_t over ``length`` bytes of the text from ``start``, each byte under its value."""
    fig, axes = figure(8.0, 3.4, ncols=2, width_ratios=[1, 2.2])
    ax0, ax1 = axes.flat
    rates = -log_f.double().mean(dim=-1)  # [layers, heads]
    labels = [f"L{a} H{h}" for a in range(rates.shape[0]) for h in range(rates.shape[1])]
    ax0.bar(range(len(labels)), (math.log(2) / rates).flatten().numpy(), color="tab:blue")
    ax0.set_xticks(range(len(labels)), labels, rotation=90, fontsize=8)
    ax0.set_ylabel("half-life (tokens)")
    values = log_f[layer, head, start : start + length].numpy()
    shown = byte_ids[start : start + length].tolist()
    ax1.plot(range(len(values)), values, "o-", ms=3, lw=0.8, color="tab:red")
    marks = {10: "\u21b5", 32: "\u00b7"}
    ax1.set_xticks(
        range(len(shown)),
        [marks.get(b, byte_name(b)[:1]) for b in shown],
        fontsize=7,
        family="monospace",
    )
    ax1.set_ylabel(r"$\log f_t$")
    ax1.set_title(
        f"layer {layer}, head {head} over the text (\u21b5 newline, \u00b7 space)", fontsize=9
    )
    ax0.set_title("every head's mean forget rate", fontsize=9)
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
