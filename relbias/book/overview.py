"""The comparison of every method at a glance (chapters 1 and 8): the book's Table 2.4
extended with what each method learns and computes, the rows of a sweep, the loss by
position inside a long window, and the sweep's methods grouped by family.

Figures are built with :func:`relbias.book.plots.figure` and returned; tables are returned
as ``(rows, headers)`` for :func:`relbias.book.display.show_table`.
"""

from __future__ import annotations

import numpy as np

from relbias import make_bias
from relbias.book.plots import figure
from relbias.lab.model import BIAS_POSITIONS, default_bias_kwargs
from relbias.lab.plots import shade_interval
from relbias.lab.training import build_model

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

    ``evals`` maps a label to the rows of :func:`relbias.lab.evaluation.evaluate_lengths`; the
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
