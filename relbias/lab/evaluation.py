"""Evaluation of a trained :class:`~relbias.lab.model.TinyLM`: bits per byte at every length,
the validation curve's windows, recall accuracy on the probe, and read-back of what a
positional bias or a forget gate learned.
"""

from __future__ import annotations

import math

import torch

from relbias.lab.config import Config
from relbias.lab.context import context_use, sliding_loss, span_loss
from relbias.lab.data import eval_windows, files_touched, spread_eval_windows
from relbias.lab.device import autocast
from relbias.lab.model import TinyLM
from relbias.lab.probe import (
    default_distances,
    probe_batch,
    probe_max_distance,
    probe_min_distance,
)

LN2 = math.log(2.0)

__all__ = [
    "bias_readback",
    "default_context_stride",
    "evaluate_lengths",
    "evaluate_retrieval",
    "gate_readback",
    "learned_bias",
    "loss_by_position",
    "read_context",
    "validation_bpb",
    "validation_windows",
]


@torch.no_grad()
def evaluate_lengths(
    model: TinyLM,
    data: torch.Tensor,
    config: Config,
    *,
    factors=None,
    device=None,
    progress: bool = False,
    file_offsets=None,
    amp_dtype="auto",
    context: bool = True,
    context_stride: int | None = None,
) -> list[dict]:
    """Bits per byte on validation text at each length ``factor * train_len``.

    Every length reads the same bytes, cut into non-overlapping windows, so lengths differ
    only in how much context each prediction has:

    - ``config.eval_spread=False`` (``quick``): the first ``config.eval_tokens`` bytes
      (rounded down to whole windows of the longest length);
    - ``config.eval_spread=True`` (``medium``, ``full``): ``config.eval_tokens`` bytes
      (rounded up to whole windows of the longest length) in spans of the longest length
      spread evenly across the whole split (:func:`~relbias.lab.data.spread_eval_windows`).

    A span is one window of the longest length. With ``context`` (and a longest length
    above the training length) the longest length's row also holds the context-use measure
    (:mod:`relbias.lab.context`): the same spans read again by a sliding window of
    ``train_len`` bytes with stride ``context_stride`` (default :func:`default_context_stride`).

    ``amp_dtype``: the autocast dtype on CUDA (:func:`~relbias.lab.device.autocast_dtype`).
    Returns one dict per factor: ``factor``, ``length``, ``windows``, ``bytes`` (bytes
    predicted), ``bpb``, ``loss_by_position`` (mean bits at each position inside the
    window) and ``bpb_by_span`` (mean bits of each span's bytes at this length: the text's
    own sampling error is read from it); with ``file_offsets``
    (:meth:`~relbias.lab.data.ByteCorpus.split_offsets`) also ``files``, how many
    validation files those bytes come from; the longest length's row ``context``.
    """
    factors = tuple(config.eval_factors if factors is None else factors)
    if not factors or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in factors):
        raise ValueError(f"factors must be integers >= 1, got {factors!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    longest = max(factors) * config.train_len
    num_tokens = max(config.eval_tokens // longest, 1) * longest
    model.to(device).eval()
    forward = _reader(model, device, amp_dtype)
    rows = []
    for factor in _progress_iter(factors, "eval", progress):
        length = factor * config.train_len
        if config.eval_spread:
            x, y, starts = spread_eval_windows(data, length, config.eval_tokens, span_len=longest)
        else:
            x, y = eval_windows(data, length, num_tokens)
            starts = torch.arange(0, x.numel(), longest)
        bits = span_loss(forward, x, y, batch_size=config.eval_batch_size)
        per_pos = bits.mean(0)
        row = {
            "factor": factor,
            "length": length,
            "windows": int(x.shape[0]),
            "bytes": int(x.numel()),
            "bpb": float(per_pos.mean()),
            "loss_by_position": [round(v, 4) for v in per_pos.tolist()],
            "bpb_by_span": [round(v, 5) for v in bits.reshape(len(starts), -1).mean(1).tolist()],
        }
        if file_offsets is not None:
            row["files"] = files_touched(starts, longest, file_offsets)
        if context and length == longest and longest > config.train_len:
            row["context"] = read_context(
                forward, x, y, bits, config.train_len, stride=context_stride
            )
        rows.append(row)
    return rows


def default_context_stride(train_len: int) -> int:
    """The sliding reading's stride: an eighth of the training length (at least 1), so that
    every byte past ``train_len`` is read with ``7/8 train_len`` to ``train_len - 1`` bytes
    of context (16 bytes for the medium sweeps' 128; stride 1 costs 16 times as much)."""
    return max(train_len // 8, 1)


def read_context(forward, x, y, long_bits, train_len: int, *, stride: int | None = None) -> dict:
    """The context-use measure of spans ``x`` (targets ``y``) whose long reading is
    ``long_bits`` ``[spans, span_len]``: :func:`relbias.lab.context.context_use` with the
    sliding window of ``train_len`` bytes, its ``stride`` and the sliding reading's mean
    bits at each position (``sliding_loss_by_position``)."""
    stride = default_context_stride(train_len) if stride is None else stride
    sliding = sliding_loss(forward, x, y, window=train_len, stride=stride)
    return {
        **context_use(long_bits, sliding, train_len),
        "stride": stride,
        "sliding_loss_by_position": [round(v, 4) for v in sliding.mean(0).tolist()],
    }


def _reader(model, device, amp_dtype):
    """``model`` as a function of token ids to logits, on ``device`` under its autocast."""

    def forward(ids):
        with autocast(device, amp_dtype):
            return model(ids.to(device))

    return forward


def _progress_iter(items, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, leave=False)


def loss_by_position(model, x, y, batch_size, device, amp_dtype="auto") -> torch.Tensor:
    """Mean loss in bits at each window position, over all windows."""
    forward = _reader(model, torch.device(device), amp_dtype)
    return span_loss(forward, x, y, batch_size=batch_size).mean(0)


def validation_windows(data: torch.Tensor, config: Config):
    """The validation windows of the training-length curve: ``config.val_tokens`` bytes in
    windows of ``config.train_len``, drawn evenly across the split."""
    x, y, _ = spread_eval_windows(data, config.train_len, config.val_tokens)
    return x, y


@torch.no_grad()
def validation_bpb(model, x, y, config: Config, device, amp_dtype="auto") -> float:
    model.eval()
    per_pos = loss_by_position(model, x, y, config.eval_batch_size, device, amp_dtype)
    return round(float(per_pos.mean()), 5)


@torch.no_grad()
def evaluate_retrieval(
    model: TinyLM,
    config: Config,
    *,
    seq_len: int,
    distances=None,
    samples: int | None = None,
    device=None,
    seed: int = 1234,
    amp_dtype="auto",
) -> list[dict]:
    """Recall accuracy at each distance, in sequences of ``seq_len`` tokens.

    ``samples`` sequences per distance (default ``config.probe_eval_samples``), from a
    generator seeded with ``seed`` (different from training). Returns one dict per
    distance: ``length``, ``distance``, ``accuracy``, ``samples``.
    """
    low, high = probe_min_distance(config), probe_max_distance(config, seq_len)
    if distances is None:
        distances = [d for d in default_distances(seq_len) if low <= d <= high]
        if high >= low:
            distances = sorted({low, *distances, high})
    distances = list(distances)
    samples = config.probe_eval_samples if samples is None else samples
    device = torch.device(device) if device is not None else next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    model.to(device).eval()
    rows = []
    for d in distances:
        x, y = probe_batch(config, samples, seq_len, d, gen)
        correct = 0
        for start in range(0, samples, config.eval_batch_size * 4):
            xb = x[start : start + config.eval_batch_size * 4].to(device)
            with autocast(device, amp_dtype):
                pred = model(xb)[:, -1].argmax(-1).cpu()
            correct += int((pred == y[start : start + xb.shape[0], -1]).sum())
        rows.append(
            {"length": seq_len, "distance": d, "accuracy": correct / samples, "samples": samples}
        )
    return rows


@torch.no_grad()
def learned_bias(
    model_or_bias,
    max_offset: int,
    *,
    min_offset: int = 0,
    query_position: int | None = None,
    layer: int = 0,
) -> torch.Tensor:
    """PE at offsets ``min_offset .. max_offset`` for each head, as a float32 CPU tensor
    ``[num_heads, max_offset - min_offset + 1]``: the one read-back of a bias by offset.

    ``model_or_bias`` is any :class:`~relbias.RelativeBias` (learned or fixed) or a
    :class:`TinyLM` with a bias (its shared module, or layer ``layer``'s when biases are
    per layer). Offset-only families give their offset table
    (:meth:`~relbias.RelativeBias.offset_table`). FIRE depends on the query position
    too: it is read at query position ``query_position`` (default ``max_offset``, which
    must be ``>= max_offset``) against keys ``query_position - offset``, so its offsets
    are those of keys at or before the query (``0 <= min_offset``).
    """
    from relbias import RelativeBias

    bias = model_or_bias
    if isinstance(model_or_bias, TinyLM):
        modules = model_or_bias.bias_modules()
        if not modules:
            raise ValueError(f"position {model_or_bias.position!r} has no additive bias to read")
        if not 0 <= layer < len(modules):
            raise ValueError(f"layer must be in 0..{len(modules) - 1}, got {layer}")
        bias = modules[layer]
    if not isinstance(bias, RelativeBias):
        raise TypeError(f"expected a TinyLM or RelativeBias, got {type(bias).__name__}")
    for name, value in (("min_offset", min_offset), ("max_offset", max_offset)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not min_offset <= max_offset:
        raise ValueError(f"need min_offset <= max_offset, got {min_offset} and {max_offset}")
    if bias.offset_only:
        return bias.offset_table(min_offset, max_offset).float().cpu()
    if min_offset < 0:
        raise ValueError(f"{type(bias).__name__} reads offsets >= 0 only, got {min_offset}")
    i = max_offset if query_position is None else query_position
    if i < max_offset:
        raise ValueError(f"query_position ({i}) must be >= max_offset ({max_offset})")
    row = bias(1, i + 1, q_start=i)[:, 0, :]  # keys j = 0..i, offsets i..0
    return row.flip(-1)[:, min_offset : max_offset + 1].float().cpu()


def bias_readback(model, config: Config) -> dict | None:
    """The learned bias at offsets 0..2*train_len-1 (FIRE: query at 2*train_len-1)."""
    if not model.uses_bias:
        return None
    max_offset = 2 * config.train_len - 1
    table = learned_bias(model, max_offset)
    return {
        "max_offset": max_offset,
        "query_position": max_offset,
        "module": repr(model.bias_modules()[0]),
        "values": [[round(v, 5) for v in row] for row in table.tolist()],
    }


def gate_readback(model, idx: torch.Tensor, distance: int | None = None) -> dict:
    """What a forget-gate model's gates learned, read on the token ids ``idx`` ``[batch, len]``.

    Per layer and head (lists ``[layers][heads]``): the mean :math:`\\log f_t` over the
    tokens and its 10 %, 50 % and 90 % quantiles; with ``distance`` also the mean bias
    the gates put between the last position and the token ``distance`` back (the sum of
    :math:`\\log f_t` over the last ``distance`` tokens: the probe's far key).
    """
    log_f = model.gate_log_forget(idx).double()  # [layers, batch, heads, len]
    per_head = log_f.permute(0, 2, 1, 3).flatten(2)  # [layers, heads, tokens]
    qs = torch.quantile(per_head, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), dim=-1)

    def rounded(t):
        return [[round(v, 5) for v in row] for row in t.tolist()]

    out = {
        "module": repr(model.gates()[0]),
        "tokens": idx.numel(),
        "mean_log_forget": rounded(per_head.mean(-1)),
        "log_forget_quantiles": {q: rounded(qs[i]) for i, q in enumerate(("0.1", "0.5", "0.9"))},
    }
    if distance is not None:
        if not 1 <= distance < idx.shape[1]:
            raise ValueError(f"distance must be in 1..{idx.shape[1] - 1}, got {distance}")
        out["distance"] = distance
        out["bias_at_distance"] = rounded(log_f[..., -distance:].sum(-1).mean(1))
    return out
