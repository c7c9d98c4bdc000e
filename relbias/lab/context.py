"""Does a model use the context past its training length? The sliding-window reading.

A window of ``16 m_l`` bytes has a smaller share of positions with little context than a
window of ``m_l``, so its average loss falls even for a model that never looks further back
than ``m_l`` bytes (Press et al., 2022, discuss the same effect). The measure here tells
the two apart: every byte of an evaluation span is read twice by the same model,

- **long**: inside the whole span, with every earlier byte of the span as context;
- **sliding**: by a window of ``window`` (= ``m_l``) bytes that slides along the span with
  stride ``stride``; each byte is scored in the window where it has the most context,
  so every byte at position ``p >= window`` has between ``window - stride`` and
  ``window - 1`` earlier bytes as context, never more than training gave.

The paired difference ``long - sliding`` on the bytes at positions ``p >= window`` is the
bits per byte that the context past ``m_l`` adds (below 0: it helps, the model *uses* the
far context) or costs (above 0: the long window reads the same bytes worse, the far
context *hurts*; a small cost is not a break, which the whole curve decides). The default
stride 1 gives every such byte exactly ``window - 1`` bytes of context in the sliding
reading, the most a training window ever gave, so nothing but the bytes past ``m_l``
differs between the two readings.

``forward`` is any causal language model as a function of token ids ``[batch, n]`` to
logits ``[batch, n, vocab]``: a :class:`~relbias.lab.model.TinyLM`, or a Hugging Face model
wrapped as ``lambda ids: model(input_ids=ids).logits``. Each window is read as a sequence
of its own, from position 0.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from relbias._checks import check_positive_ints

LN2 = math.log(2.0)

__all__ = ["context_use", "sliding_positions", "span_loss", "sliding_loss"]


def _check_spans(x: torch.Tensor, y: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape != y.shape:
        raise ValueError(
            f"x and y must be token ids of the same shape [spans, span_len], got "
            f"{tuple(x.shape)} and {tuple(y.shape)}"
        )


def _bits(forward, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Loss in bits at every position of the sequences ``x`` (targets ``y``), float64 CPU."""
    logits = forward(x)
    if logits.shape[:2] != x.shape:
        raise ValueError(
            f"forward must return logits [batch, n, vocab] for ids {tuple(x.shape)}, "
            f"got {tuple(logits.shape)}"
        )
    nats = F.cross_entropy(logits.float().transpose(1, 2), y, reduction="none")
    if not torch.isfinite(nats).all():
        raise FloatingPointError("the model produced a non-finite loss")
    return nats.double().cpu() / LN2


@torch.no_grad()
def span_loss(forward, x: torch.Tensor, y: torch.Tensor, *, batch_size: int = 8) -> torch.Tensor:
    """The long reading: bits at every position of each span ``[spans, span_len]``, each span
    read whole (``batch_size`` spans per call of ``forward``)."""
    _check_spans(x, y)
    check_positive_ints(batch_size=batch_size)
    device = x.device
    parts = [
        _bits(forward, x[i : i + batch_size].to(device), y[i : i + batch_size].to(device))
        for i in range(0, x.shape[0], batch_size)
    ]
    return torch.cat(parts)


def sliding_positions(span_len: int, window: int, stride: int) -> list[tuple[int, int, int]]:
    """The sliding reading's windows over a span: ``(start, first_scored, end)`` each, the
    window ``[start, start + window)`` scoring positions ``[first_scored, end)``. Every
    position is scored once; a position ``p >= window`` in a window with at least
    ``window - stride`` bytes before it (the last window may hold more)."""
    check_positive_ints(span_len=span_len, window=window, stride=stride)
    if window > span_len:
        raise ValueError(f"window ({window}) must be at most span_len ({span_len})")
    if stride > window:
        raise ValueError(f"stride ({stride}) must be at most window ({window})")
    out = [(0, 0, window)]
    scored = window
    while scored < span_len:
        end = min(scored + stride, span_len)
        out.append((end - window, scored, end))
        scored = end
    return out


@torch.no_grad()
def sliding_loss(
    forward,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    window: int,
    stride: int = 1,
    batch_size: int = 256,
) -> torch.Tensor:
    """The sliding reading: bits at every position of each span ``[spans, span_len]``, each
    byte scored in a window of ``window`` bytes (:func:`sliding_positions`); ``batch_size``
    windows per call of ``forward``."""
    _check_spans(x, y)
    check_positive_ints(batch_size=batch_size)
    spans, span_len = x.shape
    plan = sliding_positions(span_len, window, stride)
    out = torch.empty(spans, span_len, dtype=torch.float64)
    starts = torch.tensor([start for start, _, _ in plan])
    idx = starts[:, None] + torch.arange(window)  # [windows, window]
    for s in range(spans):
        xs, ys = x[s][idx], y[s][idx]
        bits = torch.cat(
            [
                _bits(forward, xs[i : i + batch_size], ys[i : i + batch_size])
                for i in range(0, len(plan), batch_size)
            ]
        )
        for w, (start, first, end) in enumerate(plan):
            out[s, first:end] = bits[w, first - start : end - start]
    return out


def context_use(long: torch.Tensor, sliding: torch.Tensor, window: int) -> dict:
    """The paired difference of the two readings on the bytes past ``window``.

    ``long``, ``sliding``: bits ``[spans, span_len]`` of the same bytes (:func:`span_loss`,
    :func:`sliding_loss`). Returns ``long_bpb`` and ``sliding_bpb`` (mean bits of the bytes
    at positions ``>= window``), ``difference`` (``long_bpb - sliding_bpb``: below 0 the
    far context helps), ``difference_by_span`` (the same per span, for the text's own
    sampling error), ``bytes`` (how many bytes were compared) and ``window``.
    """
    if long.shape != sliding.shape or long.dim() != 2:
        raise ValueError(
            f"long and sliding must be bits of the same spans [spans, span_len], got "
            f"{tuple(long.shape)} and {tuple(sliding.shape)}"
        )
    check_positive_ints(window=window)
    if not window < long.shape[1]:
        raise ValueError(f"window ({window}) must be shorter than the spans ({long.shape[1]})")
    far_long, far_sliding = long[:, window:], sliding[:, window:]
    by_span = (far_long - far_sliding).mean(1)
    return {
        "window": window,
        "bytes": int(far_long.numel()),
        "long_bpb": float(far_long.mean()),
        "sliding_bpb": float(far_sliding.mean()),
        "difference": float(by_span.mean()),
        "difference_by_span": [round(v, 5) for v in by_span.tolist()],
    }
