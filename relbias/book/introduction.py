"""Chapter 1's readings of the stored trained models: where their attention goes past the
training length, and the library's number (PE(i, j)/sqrt(d)) named on a figure's axis.

- :func:`far_attention_share`: per layer and head, the attention weight a trained
  :class:`~relbias.lab.model.TinyLM` puts on keys at least ``train_len`` bytes back, for the
  queries past the training length (the mechanism behind "no use of the far context").
- :func:`stored_far_attention`: that share for the stored weights of one method, every seed,
  read on the same held-out windows.
- :func:`held_out_windows`: the windows of held-out bytes they are read on;
- :func:`plot_far_attention`: the shares of several methods, one point per seed and head;
- :func:`uniform_far_share`: the share that uniform attention would give (the reference);
- :func:`lab_setting_box`: the setting box as the lab notes show it;
- :func:`context_readings`, :func:`plot_context_readings`: a stored sweep's two readings of
  the bytes past the training length (the context measure), seed by seed;
- :func:`label_library_number`: relabel a bias figure's colour bar or y axis as the
  library's number, PE(i, j)/sqrt(d).
"""

from __future__ import annotations

from pathlib import Path

import torch

from relbias import biased_attention
from relbias.lab.model import Attention, TinyLM
from relbias.lab.plots import figure

__all__ = [
    "LIBRARY_NUMBER",
    "context_readings",
    "far_attention_share",
    "held_out_windows",
    "lab_setting_box",
    "label_library_number",
    "plot_context_readings",
    "plot_far_attention",
    "stored_far_attention",
    "uniform_far_share",
]

#: How a figure names the number the library adds to a score (after the 1/sqrt(d) scaling).
LIBRARY_NUMBER = "PE(i, j)/√d"

WEIGHTS = Path(__file__).resolve().parents[1] / "lab" / "results" / "weights"


@torch.no_grad()
def far_attention_share(model: TinyLM, idx: torch.Tensor, train_len: int) -> torch.Tensor:
    """``[layers, heads]``: the attention weight that ``model`` puts on keys ``j`` with
    ``i - j >= train_len``, summed over those keys and averaged over the queries
    ``i >= train_len`` of the windows ``idx`` ``[batch, length]`` (and over the batch).
    0 means the queries past the training length look no farther back than training did."""
    if idx.dim() != 2 or idx.shape[1] <= train_len:
        raise ValueError(f"idx must be [batch, length] with length > {train_len}")
    shares = []

    def grab(module, args):
        h, bias = args[0], args[1] if len(args) > 1 else None
        b, t, c = h.shape
        q, k, v = (
            module.qkv(h).view(b, t, 3, module.heads, c // module.heads).permute(2, 0, 3, 1, 4)
        )
        if module.rotary is not None:
            q, k = module.rotary(q, k)
        _, weights = biased_attention(q, k, v, bias=bias, causal=True, return_weights=True)
        offsets = torch.arange(t)[:, None] - torch.arange(t)[None, :]
        far = (offsets >= train_len).to(weights.dtype)  # [t, t]
        per_query = (weights * far).sum(-1)[..., train_len:]  # [b, heads, queries past m_l]
        shares.append(per_query.mean((0, 2)).cpu())

    hooks = [m.register_forward_pre_hook(grab) for m in model.modules() if isinstance(m, Attention)]
    try:
        model.eval()
        model(idx)
    finally:
        for hook in hooks:
            hook.remove()
    return torch.stack(shares).float()


def stored_far_attention(method: str, idx: torch.Tensor, *, sweep: str | None = None) -> dict:
    """``{seed: [layers, heads] share}`` (:func:`far_attention_share`) for every stored model
    of ``method`` in the weights of the stored 3,000-step sweep (``sweep``: a folder name
    under ``relbias/lab/results/weights``, default the one that holds ``method``), read on
    the windows ``idx``. Each model's training length is its stored configuration's."""
    from relbias.lab.weights import load_weights

    folders = [WEIGHTS / sweep] if sweep else sorted(p for p in WEIGHTS.iterdir() if p.is_dir())
    found = {}
    for folder in folders:
        for path in sorted(folder.glob(f"{method}_seed*.pt.xz")):
            seed = int(path.name.removeprefix(f"{method}_seed").split(".")[0])
            model = load_weights(path)
            found[seed] = far_attention_share(model, idx, model.lab_config.train_len)
    if not found:
        raise ValueError(f"no stored weights of {method!r}")
    return dict(sorted(found.items()))


def held_out_windows(val: torch.Tensor, count: int, length: int) -> torch.Tensor:
    """The first ``count`` windows of ``length`` bytes of the held-out bytes ``val``, as a
    ``[count, length]`` batch of token ids."""
    if count * length > val.numel():
        raise ValueError(f"{count} windows of {length} bytes need more than {val.numel()} bytes")
    return val[: count * length].view(count, length).long()


def uniform_far_share(length: int, train_len: int) -> float:
    """The share :func:`far_attention_share` would read for uniform attention: each query
    ``i >= train_len`` of a ``length``-byte window spreads its weight evenly over its keys
    ``0..i``, of which ``i - train_len + 1`` are ``train_len`` or more back; the mean over
    those queries."""
    if not 0 < train_len < length:
        raise ValueError(f"need 0 < train_len < length, got {train_len} and {length}")
    queries = torch.arange(train_len, length, dtype=torch.float64)
    return float(((queries - train_len + 1) / (queries + 1)).mean())


def plot_far_attention(
    shares: dict,
    *,
    head_labels: dict | None = None,
    reference: float | None = None,
    width: float = 7.0,
    height: float = 2.8,
):
    """One panel per method of ``shares`` (``{label: {seed: [layers, heads]}}``, as
    :func:`stored_far_attention` gives): each head's share (x: the head, numbered from 0),
    one point per seed, a colour per layer (numbered from 0); the panels share the y axis,
    0 to 1. ``head_labels``: ``{label: [tick label per head]}`` (e.g. ALiBi's slopes).
    ``reference``: a dashed line at that share, labelled "uniform attention" (e.g.
    :func:`uniform_far_share`)."""
    fig, axes = figure(width, height, ncols=len(shares), sharey=True)
    axes = [axes] if len(shares) == 1 else list(axes.flat)
    for ax, (label, per_seed) in zip(axes, shares.items()):
        values = torch.stack(list(per_seed.values()))  # [seeds, layers, heads]
        _, layers, heads = values.shape
        for layer in range(layers):
            shift = (layer - (layers - 1) / 2) * 0.2
            for h in range(heads):
                pts = values[:, layer, h]
                ax.scatter(
                    [h + shift] * len(pts),
                    pts.tolist(),
                    s=16,
                    color=f"C{layer}",
                    alpha=0.8,
                    label=f"layer {layer}" if h == 0 else None,
                )
        if reference is not None:
            ax.axhline(
                reference,
                color="grey",
                ls="--",
                lw=1,
                zorder=0,
                label="uniform attention" if ax is axes[0] else None,
            )
        ticks = (head_labels or {}).get(label) or [f"head {h}" for h in range(heads)]
        ax.set_xticks(range(heads), ticks, fontsize=8)
        ax.set_xlim(-0.6, heads - 0.4)
        ax.set_ylim(-0.03, 1.0)
        ax.set_title(label, fontsize=10)
    axes[0].set_ylabel("weight on keys m_l or more back", fontsize=9)
    axes[0].legend(fontsize=8, loc="center left")
    return fig


def context_readings(results: dict, method: str) -> dict:
    """Per seed (in order), ``method``'s bits per byte at the longest length of a stored sweep
    that records the context measure: on the first ``m_l`` bytes of the windows
    (``"within"``), and on the bytes past ``m_l`` read with the whole window (``"long"``) and
    by the sliding window (``"sliding"``): ``{reading: [one value per seed]}``."""
    records = results["methods"][method]["seeds"]
    out = {"within": [], "long": [], "sliding": []}
    for s in sorted(records, key=int):
        row = max(records[s]["eval"], key=lambda r: r["length"])
        if "context" not in row:
            raise ValueError(f"{method} seed {s} has no context-use measure in these results")
        out["within"].append(row["within_train_len_bpb"])
        out["long"].append(row["context"]["long_bpb"])
        out["sliding"].append(row["context"]["sliding_bpb"])
    return out


def plot_context_readings(
    readings: dict, *, train_len: int, width: float = 7.0, height: float = 2.8
):
    """One panel per model of ``readings`` (``{label: context_readings(...)}``): bits per byte
    on the first ``train_len`` bytes of the longest windows, and on the bytes past it read
    with the whole window and by the sliding one; one point per seed. A grey line joins each
    seed's two readings of the same bytes (past ``train_len``); the first point, other bytes,
    stands alone, so that no trend is drawn across positions. The panels share the y axis."""
    names = [f"first {train_len}\nbytes", "past: whole\nwindow", "past: sliding\nwindow"]
    fig, axes = figure(width, height, ncols=len(readings), sharey=True)
    axes = [axes] if len(readings) == 1 else list(axes.flat)
    for ax, (label, values) in zip(axes, readings.items()):
        per_seed = list(zip(values["within"], values["long"], values["sliding"]))
        for seed, points in enumerate(per_seed):
            ax.plot([1, 2], points[1:], color="grey", lw=0.8, zorder=1)  # the same bytes
            ax.scatter(
                range(3),
                points,
                color=["C0", "C3", "C1"],
                s=22,
                zorder=2,
                label=None if seed else "one seed",
            )
        ax.set_xticks(range(3), names, fontsize=8)
        ax.set_xlim(-0.4, 2.4)
        ax.set_title(label, fontsize=10)
    axes[0].set_ylabel("bits per byte")
    return fig


def label_library_number(fig, *, what: str = "colour bar") -> None:
    """Name the library's number on ``fig``: the colour bar of
    :func:`relbias.book.plots.plot_bias_gallery` (its last axes) or, with ``what="y axis"``,
    the y axis of every panel of :func:`relbias.book.plots.plot_bias_by_offset`."""
    if what == "colour bar":
        fig.axes[-1].set_ylabel(f"{LIBRARY_NUMBER}, one scale for all panels")
    elif what == "y axis":
        for ax in fig.axes:
            if ax.get_ylabel():
                ax.set_ylabel(LIBRARY_NUMBER)
    else:
        raise ValueError(f"what must be 'colour bar' or 'y axis', got {what!r}")


def lab_setting_box(config, findings=("extrapolation_15000",)) -> None:
    """The setting box (:func:`relbias.book.setting.setting_text`) as a chapter's lab notes
    show it: the live demo it names is the lesson's, not a cell below."""
    from IPython.display import Markdown, display

    from relbias.book.setting import setting_text

    text = setting_text(config, findings)
    below = "the live demo below trains"
    if below not in text:
        raise ValueError("the setting box no longer names 'the live demo below'")
    text = text.replace(below, "the lesson's live demo trains")
    display(Markdown(text.replace(" {ref}`Chapter 1 <sec-setting>` says more.", "")))
