"""Chapter 5's reading of what Kerple's trained heads learned, from the stored records.

Every stored record of a bias family keeps its trained bias read back at offsets
``0 .. max_offset`` (``learned_bias``): the library's number, the bias after the attention
scaling, which in the book's notation is :math:`\\mathrm{PE}(i, j)/\\sqrt{d}`. A Kerple head
is two numbers, so the read-back gives them back exactly, and with them the head's penalty
at any offset, also past the read-back (the probe's far targets):

- :func:`head_parameters`: ``(r1, r2)`` of every head of a read-back (power or log form), and
  :func:`stored_heads`: those of every seed of a stored sweep, checked against the read-back;
- :func:`penalty_at`: each head's penalty :math:`-\\mathrm{PE}(i, j)/\\sqrt{d}` at given offsets;
- :func:`initial_parameters`: the values a stored run started from (its configuration and
  seed rebuild the untrained model), for "which exponents training moved";
- :func:`readback_reach`: the first offset of the read-back where a head's penalty reaches a
  threshold (5: a key's weight cut by :math:`e^5`), or None; :func:`formula_reach`: the same
  from ``(r1, r2)`` by the head's formula, at any offset (the heads at their start), and
  :func:`reach_moves`: whether each trained head reaches farther or nearer than at its start;
- :func:`plot_penalties`: the trained heads' penalties against the offset, the probe's far
  targets marked (the mechanism of the recall finding, made visible);
- :func:`show_difference`: a paired difference's ``mean [low, high]``, a number that would
  print as zero given the digits that show its sign.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from relbias.book.plots import figure

__all__ = [
    "FORMS",
    "formula_reach",
    "head_parameters",
    "initial_parameters",
    "penalty_at",
    "penalty_table",
    "provenance_rows",
    "plot_penalties",
    "reach_moves",
    "readback_reach",
    "stored_heads",
]

#: The stored methods and the form of their bias.
FORMS = {"kerple_power": "power", "kerple_log": "log", "alibi": "power"}


def _table(values) -> torch.Tensor:
    return torch.as_tensor(values, dtype=torch.float64)


def _log_ratio(r2: torch.Tensor, far: int, near: int) -> torch.Tensor:
    return torch.log1p(far * r2) / torch.log1p(near * r2)


def head_parameters(values, form: str, *, far: int | None = None, near: int = 16):
    """``(r1, r2)`` per head (float64 tensors) of a read-back ``values`` ``[heads, offsets]``
    of the library's number :math:`-r_1 |i-j|^{r_2}` (``form="power"``) or
    :math:`-r_1 \\log(1 + r_2 |i-j|)` (``"log"``) at offsets ``0, 1, ...``.

    Read from the offsets ``near`` and ``far`` (default the last): the power form's exponent
    is the slope of the log penalty against the log offset; the log form's ``r2`` solves
    ``log(1 + far r2) / log(1 + near r2)`` = the read ratio (a bisection in ``log r2``: the
    ratio falls from ``far / near`` towards 1 as ``r2`` grows)."""
    table = _table(values)
    far = table.shape[1] - 1 if far is None else far
    if not 1 <= near < far < table.shape[1]:
        raise ValueError(f"need 1 <= near < far < {table.shape[1]}, got {near} and {far}")
    a, b = -table[:, far], -table[:, near]
    if torch.any(a <= 0) or torch.any(b <= 0):
        raise ValueError("a Kerple read-back is negative past offset 0")
    if form == "power":
        r2 = torch.log(a / b) / math.log(far / near)
        return a / far**r2, r2
    if form != "log":
        raise ValueError(f"form must be 'power' or 'log', got {form!r}")
    ratio = a / b
    lo = torch.full_like(ratio, -30.0)
    hi = torch.full_like(ratio, 30.0)
    for _ in range(200):
        mid = (lo + hi) / 2
        too_flat = _log_ratio(torch.exp(mid), far, near) > ratio  # r2 too small
        lo, hi = torch.where(too_flat, mid, lo), torch.where(too_flat, hi, mid)
    r2 = torch.exp((lo + hi) / 2)
    return a / torch.log1p(far * r2), r2


def penalty_at(r1, r2, form: str, offsets) -> torch.Tensor:
    """The penalty :math:`-\\mathrm{PE}(i, j)/\\sqrt{d}` of heads ``(r1, r2)`` at ``offsets``,
    ``[heads, len(offsets)]`` (float64)."""
    d = torch.as_tensor(offsets, dtype=torch.float64)[None, :]
    r1, r2 = _table(r1)[:, None], _table(r2)[:, None]
    if form == "power":
        return r1 * d**r2
    if form == "log":
        return r1 * torch.log1p(r2 * d)
    raise ValueError(f"form must be 'power' or 'log', got {form!r}")


def stored_heads(results: dict, method: str, *, tolerance: float = 1e-3) -> dict:
    """``{seed: (r1, r2)}`` of every stored run of ``method`` (a Kerple form, or ALiBi as the
    power form with ``r2 = 1``), each checked to give back its read-back at every offset
    within ``tolerance`` (relative to the largest penalty of the head, plus the read-back's
    rounding) so that what it says past the read-back is the head's own formula."""
    form = FORMS[method]
    out = {}
    for seed, rec in results["methods"][method]["seeds"].items():
        table = _table(rec["learned_bias"]["values"])
        r1, r2 = head_parameters(table, form)
        again = -penalty_at(r1, r2, form, range(table.shape[1]))
        allowed = tolerance * table.abs().amax(1, keepdim=True) + 1e-4
        if not torch.all((again - table).abs() <= allowed):
            raise ValueError(f"{method} seed {seed}: its read-back is not a {form}-form bias")
        out[seed] = (r1, r2)
    return out


def initial_parameters(results: dict, method: str) -> dict:
    """``{seed: (r1, r2)}`` at the start of each stored run of ``method``: the untrained
    model that the sweep's configuration and the seed build (the lab's ``new_model``)."""
    from relbias.lab.config import Config
    from relbias.lab.experiments import new_model

    config = Config(**results["provenance"]["config"])
    out = {}
    for seed in results["methods"][method]["seeds"]:
        bias = new_model(method, config.replace(seed=int(seed)), "cpu").bias
        out[seed] = (bias.r1.detach().double().clone(), bias.r2.detach().double().clone())
    return out


def readback_reach(results: dict, method: str, threshold: float = 5.0) -> list:
    """For every seed and head of ``method`` (seed by seed), the first offset of the stored
    read-back where the penalty :math:`-\\mathrm{PE}(i, j)/\\sqrt{d}` reaches ``threshold``,
    or None if it does not within the read-back."""
    reach = []
    for rec in results["methods"][method]["seeds"].values():
        for row in rec["learned_bias"]["values"]:
            reach.append(next((o for o, v in enumerate(row) if v <= -threshold), None))
    return reach


def formula_reach(r1, r2, form: str, threshold: float = 5.0) -> list[int]:
    """For every head ``(r1, r2)``, the first offset ``>= 1`` where its penalty
    :math:`-\\mathrm{PE}(i, j)/\\sqrt{d}` reaches ``threshold``, by the head's formula (no
    read-back, so no farthest offset): the power form's penalty reaches it at
    ``(threshold / r1) ** (1 / r2)``, the log form's at ``(exp(threshold / r1) - 1) / r2``."""
    r1, r2 = _table(r1), _table(r2)
    if form == "power":
        at = (threshold / r1) ** (1 / r2)
    elif form == "log":
        at = torch.expm1(threshold / r1) / r2
    else:
        raise ValueError(f"form must be 'power' or 'log', got {form!r}")
    reach = []
    for h, x in enumerate(at.tolist()):

        def penalty(o, h=h):
            return float(penalty_at(r1[h : h + 1], r2[h : h + 1], form, [o])[0, 0])

        o = max(1, math.ceil(x))
        if o < 2**50:  # an offset met exactly may round either way: check its neighbours
            for _ in range(3):
                if o > 1 and penalty(o - 1) >= threshold:
                    o -= 1
                elif penalty(o) < threshold:
                    o += 1
        reach.append(o)
    return reach


def reach_moves(results: dict, method: str, threshold: float = 5.0) -> list[int]:
    """Per head of every seed of a stored sweep (seeds in the sweep's order, heads in
    order): +1 where the trained head reaches ``threshold`` farther than at its start, -1
    nearer, 0 at the same offset, both by the head's formula (:func:`formula_reach`, from
    :func:`stored_heads` and :func:`initial_parameters`)."""
    form = FORMS[method]
    start = initial_parameters(results, method)
    moves = []
    for seed, trained in stored_heads(results, method).items():
        after = formula_reach(*trained, form, threshold)
        before = formula_reach(*start[seed], form, threshold)
        moves += [(a > b) - (a < b) for a, b in zip(after, before, strict=True)]
    return moves


def plot_penalties(
    heads: dict,
    marks=(),
    *,
    trained: int,
    max_offset: int | None = None,
    level: float | None = None,
):
    """One panel per method: every head's penalty :math:`-\\mathrm{PE}(i, j)/\\sqrt{d}`
    against the offset (both on log scales, one colour per seed), with the offsets ``marks``
    (the probe's farthest targets) as dotted lines, the training length ``trained`` as a
    dashed one and the penalty ``level`` (if given) as a dotted horizontal line.
    ``heads``: ``{title: (form, {seed: (r1, r2)})}``; a key that is not a seed number (e.g.
    ``"every seed"`` for ALiBi's fixed slopes) is drawn in black under that name. All panels
    share the axes."""
    max_offset = max_offset or max([*marks, trained])
    offsets = np.unique(np.geomspace(1, max_offset, 200).round().astype(int))
    fig, axes = figure(3.1 * len(heads), 3.4, ncols=len(heads), sharey=True)
    axes = [axes] if len(heads) == 1 else list(axes.flat)
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")
    for ax, (title, (form, by_seed)) in zip(axes, heads.items()):
        for k, (seed, (r1, r2)) in enumerate(by_seed.items()):
            lines = penalty_at(r1, r2, form, offsets).numpy()
            named = str(seed).isdigit()  # a seed, or one line set for all (e.g. "every seed")
            for h, line in enumerate(lines):
                ax.plot(
                    offsets,
                    line,
                    color=colours[k % len(colours)] if named else "black",
                    lw=1.0,
                    label=(f"seed {seed}" if named else str(seed)) if h == 0 else None,
                )
        for m in marks:
            ax.axvline(m, color="black", lw=0.6, ls=":")
        ax.axvline(trained, color="grey", lw=0.8, ls="--")
        if level is not None:
            ax.axhline(level, color="black", lw=0.6, ls=":")
        ax.set(xscale="log", yscale="log", title=title, xlabel="offset i - j")
        ax.title.set_fontsize(9)
    axes[0].set_ylabel("penalty $-\\mathrm{PE}(i, j)/\\sqrt{d}$")
    shown = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            shown.setdefault(label, handle)
    handles, labels = list(shown.values()), list(shown)
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels), fontsize=8)
    return fig


def _signed(x: float, digits: int) -> str:
    "``x`` with ``digits`` decimals; a nonzero ``x`` that would read 0 with its sign and more."
    if x == 0 or math.isnan(x) or round(x, digits) != 0:
        return f"{x:.{digits}f}"
    more = digits
    while round(x, more) == 0:
        more += 1
    return f"{x:+.{more}f}"


def show_difference(iv: dict, digits: int = 3) -> str:
    """``mean [low, high]`` of a difference (a verdict or an interval) with ``digits``
    decimals, like :func:`relbias.book.sweeps.show_interval`, except that a number which
    would round to zero is printed with its sign and the digits it needs (``+0.0001``):
    whether the interval includes 0 stays readable."""
    mean = _signed(iv["mean"], digits)
    if math.isnan(iv["low"]) or math.isnan(iv["high"]):
        return f"{mean} (one seed)"
    low, high = (_signed(iv[k], digits) for k in ("low", "high"))
    return f"{mean} [{low}, {high}]"


def _short(x: float) -> str:
    return f"{x:,.0f}" if x >= 100 else f"{x:.2g}"


def penalty_table(penalties: dict, flattest: dict) -> list[list[str]]:
    """Rows of the penalty at each offset (the columns of :func:`penalty_at`), smallest to
    largest over heads and seeds: the power form's flattest head of each model (``flattest``:
    ``{seed: head}``), its other heads, every log head, every ALiBi head. ``penalties``:
    ``{method: {seed: [heads, offsets] tensor}}`` for ``kerple_power``, ``kerple_log`` and
    ``alibi``."""
    power = penalties["kerple_power"]
    groups = {
        "power: each model's flattest head": [t[flattest[s]] for s, t in power.items()],
        "power: its other heads": [
            t[h] for s, t in power.items() for h in range(t.shape[0]) if h != flattest[s]
        ],
        "log: every head": [row for t in penalties["kerple_log"].values() for row in t],
        "ALiBi: every head": [row for t in penalties["alibi"].values() for row in t],
    }
    rows = []
    for name, lines in groups.items():
        table = torch.stack(list(lines))
        lo, hi = table.min(0).values.tolist(), table.max(0).values.tolist()
        rows.append([name, *(f"{_short(a)} to {_short(b)}" for a, b in zip(lo, hi))])
    return rows


def provenance_rows(kinds) -> list[list[str]]:
    """One row per stored sweep kind of ``kinds`` (:data:`relbias.lab.results.STORED`): its
    files, steps, seeds and the commits that made it (:func:`relbias.lab.results.describe`)."""
    from relbias.lab.results import STORED, describe, load_stored

    rows = []
    for kind in kinds:
        info = describe(load_stored(kind))
        names = STORED[kind] if isinstance(STORED[kind], tuple) else (STORED[kind],)
        files = ", ".join(n if isinstance(n, str) else n[0] for n in names)
        steps = info.get("probe_steps", info["steps"])
        rows.append([kind, files, f"{steps:,}", str(info["seeds"]), str(info["commit"])])
    return rows
