r"""The Forgetting Transformer's gate (chapter 9): the float32 trap of
:math:`\mathrm{PE}(i, j) = F_i - F_j` and the library's split that avoids it, a gate's row
beside ALiBi's, and the trained gate read back by byte and by head.

Figures are built with :func:`relbias.book.plots.figure` and returned; tables are returned
as ``(rows, headers)`` for :func:`relbias.book.display.show_table`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from relbias.book.plots import figure

# --- the Forgetting Transformer's gate (chapter 9) ------------------------------------------


def difference_errors(cumulative: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> dict:
    r"""How far :math:`\mathrm{PE}(i, j) = F_i - F_j` computed in float32 lies from float64.

    ``cumulative`` is one sequence's float64 :math:`F` (1-D), ``i`` and ``j`` index tensors
    of query and key positions. Returns float64 absolute errors against the float64
    difference: ``"naive"`` (float32 :math:`F_i - F_j`), ``"split"`` (the library's
    :meth:`~relbias.biases.prepared.ForgettingBias.parts`, as every backend adds them:
    :math:`(hi_i - hi_j) + (lo_i - lo_j)` in float32) and ``"rounding"`` (float32's own
    rounding of the true difference, the least any float32 result can be off).
    """
    from relbias.biases.prepared import ForgettingBias

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
    :math:`F_i` rounded to float32 after every addition. A GPU's float32 ``cumsum`` (a
    parallel scan) rounds after its additions too, in another order; PyTorch's CPU
    ``cumsum`` of a float32 tensor accumulates in float64 and rounds each :math:`F_i` once
    (the ``"float32 F"`` way of :func:`trap_errors`), so it is not used here."""
    values = log_f.detach().float().cpu().numpy()
    return torch.from_numpy(np.cumsum(values, dtype=np.float32))


#: The ways :func:`trap_errors` computes :math:`\mathrm{PE}(i, j) = F_i - F_j` in float32.
TRAP_WAYS = {
    "float32 sum": r"$F$ summed in float32, one addition after another",
    "float32 F": r"$F$ summed in float64, stored in float32 (torch.cumsum on a CPU)",
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
    ``"split"`` (the library's :meth:`~relbias.biases.prepared.ForgettingBias.parts`)
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
        f"ALiBi, m = {alibi_slope:g}": gate_row(torch.full((n,), -float(alibi_slope))),
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
    ax0.set_title("every head's half-life", fontsize=9)
    return fig


# --- the gates that the stored runs learned (no training: the records' read-back) ------------


def stored_gate_heads(results: dict, method: str = "forgetting") -> list[dict]:
    """Every head of every seed of ``method`` in a stored sweep, from the records'
    ``learned_gate`` (:func:`relbias.lab.readback.gate_readback`, read on held-out tokens after
    training): one dict per head with ``seed``, ``layer``, ``head``, ``mean`` (the mean
    :math:`\\log f_t`), ``half_life`` (``ln 2`` over its negative, in tokens), and ``q10``,
    ``q50``, ``q90`` (the quantiles of :math:`\\log f_t` over the tokens read), in seed, layer,
    head order."""
    heads = []
    seeds = results["methods"][method]["seeds"]
    for seed in sorted(seeds, key=int):
        gate = seeds[seed].get("learned_gate")
        if not gate:
            raise ValueError(f"{method} seed {seed} has no gate read-back")
        quantiles = gate["log_forget_quantiles"]
        for layer, row in enumerate(gate["mean_log_forget"]):
            for head, mean in enumerate(row):
                heads.append(
                    {
                        "seed": seed,
                        "layer": layer,
                        "head": head,
                        "mean": mean,
                        "half_life": math.log(2) / -mean if mean < 0 else math.inf,
                        **{
                            name: quantiles[q][layer][head]
                            for name, q in (("q10", "0.1"), ("q50", "0.5"), ("q90", "0.9"))
                        },
                    }
                )
    return heads


def plot_stored_gates(results: dict, method: str = "forgetting"):
    """One column per trained head (grouped by seed): the range of :math:`\\log f_t` over the
    tokens read, from its 10 % to its 90 % quantile (bar), its median (dot) and its mean
    (cross), on one shared axis in nats per token."""
    heads = stored_gate_heads(results, method)
    fig, ax = figure(8.0, 3.2)
    xs, seeds = [], sorted({h["seed"] for h in heads}, key=int)
    for k, h in enumerate(heads):
        x = k + seeds.index(h["seed"])  # a gap between seeds
        xs.append(x)
        ax.plot(
            [x, x],
            [h["q10"], h["q90"]],
            color="tab:blue",
            lw=4,
            alpha=0.45,
            solid_capstyle="butt",
            label="10 % to 90 % of tokens" if k == 0 else None,
        )
        ax.plot(x, h["q50"], "o", color="tab:blue", ms=4, label="median" if k == 0 else None)
        ax.plot(x, h["mean"], "x", color="tab:red", ms=6, label="mean" if k == 0 else None)
    ax.set_xticks(xs, [f"L{h['layer']}H{h['head']}" for h in heads], rotation=90, fontsize=7)
    ax.axhline(math.log(0.5), color="grey", lw=0.8, ls="--", label=r"$\log\frac{1}{2}$ (the start)")
    for seed in seeds:
        at = [x for x, h in zip(xs, heads) if h["seed"] == seed]
        ax.text(
            sum(at) / len(at),
            1.02,
            f"seed {seed}",
            transform=ax.get_xaxis_transform(),
            ha="center",
            fontsize=8,
        )
    ax.set_ylabel(r"$\log f_t$ (nats per token)")
    # outside the axes, right of them: inside it would cover the longest bars' lower ends
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
    return fig


def unpaired_accuracy(results: dict, a: str, b: str, length: int, distance=None) -> dict:
    """:func:`relbias.lab.stats.verdict` of ``a``'s recall against ``b``'s at one length
    and distance (default the farthest), **unpaired**: for runs whose pairing is not shown
    (trained at different commits, where nothing records that the probe drew the same
    sequences), each side's interval over its own seeds. ``error``: the probe's own
    sampling error of the difference of the two means (each side's
    :func:`~relbias.lab.stats.probe_error`, the two independent)."""
    from relbias.lab import readings, stats

    va, samples_a, d = readings.seed_accuracies(results, a, length, distance)
    vb, samples_b, _ = readings.seed_accuracies(results, b, length, distance)
    error = math.hypot(stats.probe_error(va, samples_a), stats.probe_error(vb, samples_b))
    return {**stats.verdict(va, vb, paired=False, error=error), "length": length, "distance": d}
