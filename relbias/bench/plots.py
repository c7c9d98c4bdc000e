"""Figures of a report, drawn on :class:`matplotlib.figure.Figure` (no pyplot).

matplotlib is imported inside the functions: ``import relbias.bench`` does not need it.
"""

from __future__ import annotations

from relbias.bench.goals import index

METHOD_STYLE = {
    "sdpa": ("no bias (floor)", "black", "-"),
    "materialize": ("materialise", "tab:red", "-"),
    "table": ("O(n) table (strided)", "tab:green", "-"),
    "flex": ("FlexAttention", "tab:blue", "-"),
    "fused": ("fused C++ kernel", "tab:cyan", "-"),
    "xt": ("x-transformers", "tab:orange", "--"),
    "hf_t5": ("HF T5 compute_bias", "tab:purple", "--"),
}


def _figure(width: float, height: float, ncols: int = 1, **subplot_kw):
    """A constrained-layout Figure and its row of axes (a list)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    axes = fig.subplots(1, ncols, squeeze=False, **subplot_kw)
    return fig, list(axes[0])


def _line(ax, pts, method) -> None:
    label, color, style = METHOD_STYLE[method]
    ax.plot(*zip(*pts), marker="o", ms=3, color=color, ls=style, label=label)


def _length_axis(ax, lengths) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda n, _: f"{n / 1024:g}k" if n >= 1024 else f"{n:g}")
    )
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.set_xlabel("sequence length n")


def _figure_legend(fig) -> None:
    seen = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    per_row = max(2, int(fig.get_figwidth() / 1.7))
    fig.legend(
        list(seen.values()),
        list(seen),
        loc="outside lower center",
        ncols=min(len(seen), per_row),
        fontsize=8,
        frameon=False,
    )


def plot_forward(report, families, *, methods=None, pass_="forward"):
    """Time per length, as a ratio to the floor, one panel per family (log scales)."""
    rows = index(report, pass_)
    methods = methods or [m for m in report["config"]["methods"] if m != "sdpa"]
    fig, axes = _figure(2.7 * len(families) + 0.5, 3.4, ncols=len(families), sharey=True)
    for ax, family in zip(axes, families):
        lengths = set()
        for method in methods:
            pts = sorted(
                (n, r["ratio_to_floor"])
                for (f, n, m), r in rows.items()
                if f == family and m == method and r.get("ratio_to_floor")
            )
            if pts:
                lengths.update(n for n, _ in pts)
                _line(ax, pts, method)
        ax.axhline(1.0, color="black", lw=0.8, label=METHOD_STYLE["sdpa"][0])
        _length_axis(ax, lengths)
        ax.set_title(family, fontsize=9)
    axes[0].set_ylabel("time / no-bias attention")
    _figure_legend(fig)
    return fig


def plot_memory(report, family, *, methods=None):
    """Peak memory of one family's forward pass against n, with the floor (log scales)."""
    rows = index(report, "memory")
    methods = methods or list(report["config"]["methods"])
    fig, (ax,) = _figure(5.0, 3.6)
    lengths = set()
    for method in methods:
        key_family = None if method == "sdpa" else family
        pts = sorted(
            (n, r["peak_bytes"] / 2**20)
            for (f, n, m), r in rows.items()
            if f == key_family and m == method and r.get("peak_bytes")
        )
        if pts:
            lengths.update(n for n, _ in pts)
            _line(ax, pts, method)
    _length_axis(ax, lengths)
    ax.set_ylabel("peak memory, MiB (inputs included)")
    ax.set_title(f"{family}: forward pass", fontsize=9)
    _figure_legend(fig)
    return fig
