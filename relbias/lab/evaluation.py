"""Evaluation of a trained :class:`~relbias.lab.model.TinyLM`: bits per byte at every length
with the context-use measure, the validation curve's windows and recall accuracy on the
probe (what a bias or gate learned is read back by :mod:`relbias.lab.readback`).
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
    "default_context_stride",
    "evaluate_lengths",
    "evaluate_retrieval",
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
    span_factor: int | None = None,
) -> list[dict]:
    """Bits per byte on validation text at each length ``factor * train_len``.

    Every length reads the same bytes, cut into non-overlapping windows, so lengths differ
    only in how much context each prediction has:

    - ``config.eval_spread=False`` (``quick``): the first ``config.eval_tokens`` bytes
      (rounded down to whole windows of the longest length);
    - ``config.eval_spread=True`` (``medium``, ``full``): ``config.eval_tokens`` bytes
      (rounded up to whole windows of the longest length) in spans of the longest length
      spread evenly across the whole split (:func:`~relbias.lab.data.spread_eval_windows`).

    A span is one window of the longest length (or of ``span_factor * train_len``: calls
    that read one length each then read the same spans). With ``context`` (and spans longer
    than the training length) the row of the span's own length also holds the context-use
    measure
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
    bad_span = isinstance(span_factor, bool) or not isinstance(span_factor, int)
    if span_factor is not None and (bad_span or span_factor < max(factors)):
        raise ValueError(
            f"span_factor must be an integer >= the largest factor ({max(factors)}), "
            f"got {span_factor!r}"
        )
    device = torch.device(device) if device is not None else next(model.parameters()).device
    longest = (span_factor or max(factors)) * config.train_len
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
