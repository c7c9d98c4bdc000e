"""Chapter 4's mechanism on trained models: where the stored ALiBi and Sandwich models attend.

A fixed bias learns nothing, so what training changed is the content score that competes
with it. This module reads the attention of the stored 3,000-step models
(``relbias/lab/results/weights/extrapolation_medium_a``) on held-out text, by offset:

- :func:`stored_model`: one stored model (read from the checkout; in an install without the
  weights, fetched once from the repository into a cache folder);
- :func:`attention_by_offset`: a model's mean attention weight at each offset, per layer
  and head, over the queries of a window that have at least ``first_query`` keys before
  them;
- :func:`trained_attention`: that reading for several methods and seeds, on windows of
  held-out text; :func:`far_share`: the weight on keys at offsets ``>= train_len``;
- :func:`plot_attention_by_offset`: the figure; :func:`recency_explorer_figure`: the
  chapter's explorer, with legend entries that name the slopes.
"""

from __future__ import annotations

import os
import urllib.request
from pathlib import Path

import numpy as np
import torch

from relbias.attention import biased_attention
from relbias.book.figures import attention_span, recency_weights
from relbias.book.plots import figure
from relbias.lab.data import load_corpus
from relbias.lab.weights import load_weights, weights_path

__all__ = [
    "attention_by_offset",
    "content_free_share",
    "far_share",
    "label_after_scaling",
    "plot_attention_by_offset",
    "recency_explorer_figure",
    "stored_model",
    "trained_attention",
]

#: The stored 3,000-step sweep whose weights are kept (ALiBi and Sandwich are in its part a).
WEIGHTS_RESULT = "extrapolation_medium_a"
_WEIGHTS = Path(__file__).resolve().parents[1] / "lab" / "results" / "weights"
_RAW = "https://raw.githubusercontent.com/relbias/relbias/main/relbias/lab/results/weights"


def stored_model(method: str, seed: int, result: str = WEIGHTS_RESULT):
    """The stored trained :class:`~relbias.lab.model.TinyLM` of ``method`` and ``seed``
    (evaluation mode, CPU). The weights live in the repository, not in the wheel: an
    install without them fetches the one file into ``~/.cache/relbias/weights``."""
    path = weights_path(_WEIGHTS / result, method, seed)
    if not path.is_file():
        cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
        path = weights_path(cache / "relbias" / "weights" / result, method, seed)
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            urllib.request.urlretrieve(f"{_RAW}/{result}/{path.name}", path)
    return load_weights(path)


@torch.no_grad()
def attention_by_offset(model, idx: torch.Tensor, first_query: int) -> torch.Tensor:
    """Mean attention weight of ``model`` at each offset ``i - j``, per layer and head:
    float64 ``[layers, heads, len]`` over the queries ``i >= first_query`` of the windows
    ``idx`` ``[batch, len]`` (so every offset up to ``first_query`` is averaged over the same
    queries). Each layer's weights are recomputed from its input with
    :func:`relbias.biased_attention` and the layer's bias, as the model computes them."""
    captured = []

    def hook(module, args, _output):
        h, bias = args[0], args[1]
        q, k, v = _split(module, h)
        if module.rotary is not None:
            q, k = module.rotary(q, k)
        _, w = biased_attention(q, k, v, bias=bias, causal=True, return_weights=True)
        captured.append(w.double())

    handles = [block.attn.register_forward_hook(hook) for block in model.blocks]
    try:
        model(idx)
    finally:
        for handle in handles:
            handle.remove()
    t = idx.shape[1]
    rows = torch.arange(first_query, t)
    keys = rows[:, None] - torch.arange(t)[None, :]  # [queries, offsets]: the key j = i - offset
    valid = keys >= 0
    out = []
    for w in captured:
        w = w[:, :, first_query:, :]  # [batch, heads, queries, keys]
        index = keys.clamp(min=0).expand(*w.shape[:2], -1, -1)
        by_offset = torch.gather(w, -1, index) * valid  # [batch, heads, queries, offsets]
        out.append(by_offset.mean(2).mean(0))
    out = torch.stack(out)
    return out


def _split(module, h: torch.Tensor):
    b, t, c = h.shape
    qkv = module.qkv(h).view(b, t, 3, module.heads, c // module.heads).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def trained_attention(
    methods=("alibi", "sandwich"),
    seeds=(0, 1, 2),
    *,
    windows: int = 4,
    length: int = 2048,
    first_query: int | None = None,
) -> dict:
    """:func:`attention_by_offset` of each stored model, on ``windows`` windows of
    ``length`` bytes spread evenly over the validation text of the models' corpus:
    ``{method: float64 [seeds, layers, heads, length]}``; queries from ``first_query``
    (default ``length // 2``) on."""
    first_query = length // 2 if first_query is None else first_query
    out = {}
    for method in methods:
        per_seed = []
        for seed in seeds:
            model = stored_model(method, seed)
            cfg = model.lab_config
            val = load_corpus(max_bytes=cfg.corpus_bytes).val
            starts = np.linspace(0, len(val) - length - 1, windows).astype(int)
            idx = torch.stack([val[s : s + length] for s in starts]).long()
            per_seed.append(attention_by_offset(model, idx, first_query))
        out[method] = torch.stack(per_seed)
    return out


def far_share(by_offset: torch.Tensor, train_len: int) -> torch.Tensor:
    """The attention weight on keys at offsets ``>= train_len`` (past the training length):
    ``by_offset[..., train_len:].sum(-1)``."""
    return by_offset[..., train_len:].sum(-1)


def plot_attention_by_offset(readings: dict, train_len: int, *, layer: int | None = None):
    """One panel per method (and layer): each head's mean attention weight against the
    offset (log-log), the mean over seeds; grey line at the training length; the legend
    gives each head's weight past it. ``layer``: one layer only (default every layer)."""
    methods = list(readings)
    layers = range(next(iter(readings.values())).shape[1]) if layer is None else [layer]
    fig, axes = figure(3.4 * len(methods), 2.8 * len(layers), nrows=len(layers), ncols=len(methods))
    axes = np.asarray(axes).reshape(len(layers), len(methods))
    for col, method in enumerate(methods):
        mean = readings[method].mean(0)  # [layers, heads, offsets]
        far = far_share(readings[method], train_len).mean(0)
        offsets = np.arange(mean.shape[-1])
        for row, lay in enumerate(layers):
            ax = axes[row, col]
            for h in range(mean.shape[1]):
                ax.plot(
                    offsets[1:],
                    mean[lay, h, 1:].numpy(),
                    lw=1.1,
                    label=f"head {h + 1}: {float(far[lay, h]):.2f} past {train_len}",
                )
            ax.axvline(train_len, color="grey", lw=0.8)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_ylim(1e-9, 1.0)
            ax.set_title(f"{method}, layer {lay + 1}", fontsize=9)
            ax.set_xlabel("offset i - j (bytes)")
            if col == 0:
                ax.set_ylabel("mean attention weight")
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=1)
    return fig


def recency_explorer_figure(log2_slope: float = -1.0, length: int = 64, heads: int = 8):
    """The explorer's drawing: content-free attention (``q = 0``) by offset for a slope
    ``2^log2_slope`` beside the steepest and the flattest of ``heads`` heads (Press et al.'s
    slopes); each legend entry names its slope and how many nearest keys hold 90 % of the
    weight."""
    from relbias import alibi_slopes

    paper = alibi_slopes(heads)
    slopes = torch.tensor([2.0**log2_slope, float(paper[0]), float(paper[-1])]).double()
    names = [f"your slope 2^{log2_slope:g}", f"head 1 of {heads}", f"head {heads} of {heads}"]
    weights = recency_weights(slopes, length)
    spans = attention_span(slopes, length)
    fig, ax = figure(6.4, 3.8)
    for name, w, span, style in zip(names, weights, spans, ("-", "--", ":")):
        ax.plot(np.arange(length), w.numpy(), style, lw=1.4, label=f"{name}: 90 % in {span} keys")
    ax.set_yscale("log")
    ax.set_ylim(1e-6, 1.5)
    ax.set_xlabel("offset i - j")
    ax.set_ylabel("attention weight (q = 0)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=1)
    return fig


@torch.no_grad()
def content_free_share(bias, length: int, first_query: int, train_len: int) -> torch.Tensor:
    """Per head, the weight a content-free query (``q = 0``: the softmax of the bias alone)
    puts on keys at offsets ``>= train_len``, averaged over the queries
    ``first_query .. length - 1`` of a window of ``length``: the formula's share, to set
    beside :func:`far_share` of a trained model."""
    table = bias.offset_table(0, length - 1).double()  # [heads, offsets]
    shares = []
    for i in range(first_query, length):
        w = torch.softmax(table[:, : i + 1], dim=-1)
        shares.append(w[:, train_len:].sum(-1))
    return torch.stack(shares).mean(0)


def label_after_scaling(fig):
    """Relabel every axis and colour bar of ``fig`` that reads ``PE(i, j)`` as the library's
    number after the scaling, ``PE(i, j)/√d``; returns ``fig``. For ALiBi only: the library's
    Sandwich value is shifted and divided per head, not Table 2.4's sum over √d."""
    for ax in fig.axes:
        for get, put in ((ax.get_ylabel, ax.set_ylabel), (ax.get_xlabel, ax.set_xlabel)):
            text = get()
            if text.startswith("PE(i, j)") and "√d" not in text:
                put(text.replace("PE(i, j)", "PE(i, j)/√d", 1))
    return fig
