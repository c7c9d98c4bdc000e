"""The length test for any causal LM: :func:`eval_by_length`.

The reading of the lab (:mod:`relbias.lab.data`, :mod:`relbias.lab.context`) for a model
the user already has: every length reads the same spans of text, cut into windows of that
length, so the lengths differ in context alone; past the shortest length (``window``, the
training length of a length-generalisation test) the context-use measure compares the long
reading with a sliding window of ``window`` tokens on the same tokens
(:func:`relbias.lab.context.context_use`: below 0 the far context helps, above 0 it
hurts: the same tokens read worse with it in view).
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from relbias._checks import check_choice, check_int
from relbias.lab.context import context_use, sliding_loss, span_loss
from relbias.lab.data import spread_eval_windows

UNITS = ("token", "byte")


def reset_dynamic_rope(model) -> None:
    """Give HF's dynamic RoPE (``rope_type="dynamic"``) its original frequencies back.

    HF grows the rotation base with the longest input a model has read and puts the
    original back only for an input *shorter* than ``max_position_embeddings``: after a
    long reading, an input of exactly ``m_l`` tokens is read with the long input's base.
    A reading that means "dynamic NTK at this length" resets first (then the first input
    of each length grows the base to that length)."""
    from relbias.hf._apply import rotary_modules

    for rotary in rotary_modules(model):
        dynamic = "dynamic" in str(getattr(rotary, "rope_type", ""))
        if dynamic and hasattr(rotary, "original_inv_freq"):
            rotary.inv_freq = rotary.original_inv_freq.to(rotary.inv_freq.device).clone()
            rotary.max_seq_len_cached = rotary.original_max_seq_len


@contextlib.contextmanager
def evaluating(model):
    """``model`` in eval mode inside the block (a module; anything else is left alone), its
    training mode put back after, also on an error."""
    was_training = isinstance(model, nn.Module) and model.training
    if isinstance(model, nn.Module):
        model.eval()
    try:
        yield model
    finally:
        if was_training:
            model.train()


def _forward_of(model):
    """``ids [batch, n] -> logits [batch, n, vocab]`` for a transformers model, a module or
    a callable; the model's device and eval mode (restored by the caller)."""
    if not callable(model):
        raise TypeError(
            "model must be a causal LM (a transformers model, a torch module or a callable "
            f"ids -> logits), got {type(model).__name__}"
        )
    device = torch.device("cpu")
    if isinstance(model, nn.Module):
        first = next(model.parameters(), None)
        if first is not None:
            device = first.device

    from transformers import PreTrainedModel

    is_hf = isinstance(model, PreTrainedModel)

    def forward(ids):
        ids = ids.to(device)
        if is_hf:
            # HF's dynamic RoPE keeps the base the longest input grew (it resets only below
            # m_l): every input here is read at its own length, as if it came first
            reset_dynamic_rope(model)
            out = model(input_ids=ids, use_cache=False)
        else:
            out = model(ids)
        logits = getattr(out, "logits", out)
        if not isinstance(logits, torch.Tensor):
            raise TypeError(
                "model must return logits [batch, n, vocab] (a tensor or an output with "
                f".logits), got {type(out).__name__}"
            )
        return logits

    return forward


def _tokens(data) -> tuple[torch.Tensor, bool]:
    """Token ids as a 1-D LongTensor, and whether they are bytes (one token per byte)."""
    if isinstance(data, (bytes, bytearray)):
        return torch.tensor(list(data), dtype=torch.long), True
    if not isinstance(data, torch.Tensor):
        raise TypeError(
            f"data must be bytes or a 1-D integer tensor of token ids, got {type(data).__name__}"
        )
    if data.dim() != 1 or data.is_floating_point() or data.dtype == torch.bool:
        raise ValueError(
            f"data must be a 1-D integer tensor of token ids, got {data.dtype} "
            f"of shape {tuple(data.shape)}"
        )
    return data.long(), data.dtype == torch.uint8


def _check_lengths(lengths) -> list[int]:
    try:
        lengths = [check_int("lengths", n, minimum=2) for n in lengths]
    except TypeError:
        raise TypeError(f"lengths must be integers >= 2, got {lengths!r}") from None
    if not lengths or any(b <= a for a, b in zip(lengths, lengths[1:])):
        raise ValueError(f"lengths must be increasing integers >= 2, got {lengths}")
    if any(lengths[-1] % n for n in lengths):
        raise ValueError(
            f"every length must divide the longest ({lengths[-1]}), so that each reads the "
            f"same spans: got {lengths}"
        )
    return lengths


@torch.no_grad()
def eval_by_length(
    model,
    data,
    lengths,
    *,
    unit="token",
    spans=4,
    window=None,
    stride=1,
    batch_size=8,
    token_bytes=None,
) -> dict:
    """Bits per token (or per byte) of a causal LM at several lengths, and its context use.

    ``model``: any causal LM, with or without relbias (a transformers model, called as
    ``model(input_ids=ids, use_cache=False).logits``; a module or callable ``ids ->
    logits``). ``data``: the evaluation text as token ids (a 1-D integer tensor; a
    ``uint8`` tensor or ``bytes`` for a byte-level model, one token per byte).
    ``lengths``: increasing lengths, each dividing the longest. The text is read in
    ``spans`` spans of the longest length spread evenly over ``data``
    (:func:`relbias.lab.data.spread_eval_windows`); at each length the same spans are cut
    into windows of that length and every window is read from position 0, so every length
    scores exactly the same tokens.

    ``unit="token"`` reports bits per token; ``unit="byte"`` bits per byte: for byte data
    the same numbers, otherwise ``token_bytes`` (a 1-D tensor: the byte length of every
    token id, e.g. ``len(tokenizer.decode([i]).encode())``) divides the bits by the bytes
    of the scored tokens.

    Context use (:func:`relbias.lab.context.context_use`): at every length longer than
    ``window`` (default: the shortest length), the tokens at positions ``>= window`` of each
    long window are read again by a window of ``window`` tokens sliding with ``stride``
    (default 1: each token with ``window - 1`` tokens of context); ``difference`` is the
    long reading minus the sliding one, in bits per token (below 0: the far context helps).

    Returns a dict: ``unit``, ``window``, ``stride``, ``spans``, and ``by_length``, one entry
    per length with ``length``, ``bits`` (per ``unit``), ``bits_by_span`` (the same, span by
    span: the text's own sampling error, :func:`relbias.lab.stats.text_error`), ``tokens``
    (scored), ``bytes`` (for ``unit="byte"``), and ``context_use`` (None at lengths
    ``<= window``).
    """
    unit = check_choice("unit", unit, set(UNITS))
    lengths = _check_lengths(lengths)
    spans = check_int("spans", spans, minimum=1)
    stride = check_int("stride", stride, minimum=1)
    batch_size = check_int("batch_size", batch_size, minimum=1)
    window = lengths[0] if window is None else check_int("window", window, minimum=2)
    if window > lengths[-1]:
        raise ValueError(f"window ({window}) must be at most the longest length ({lengths[-1]})")
    if stride > window:
        raise ValueError(f"stride ({stride}) must be at most window ({window})")
    ids, is_bytes = _tokens(data)
    sizes = None
    if unit == "byte" and not is_bytes:
        if token_bytes is None:
            raise ValueError(
                "unit='byte' for token ids that are not bytes needs token_bytes (the byte "
                "length of every token id)"
            )
        sizes = torch.as_tensor(token_bytes, dtype=torch.long).cpu()
        if sizes.dim() != 1 or int(ids.max()) >= sizes.numel() or (sizes < 0).any():
            raise ValueError(
                "token_bytes must be a 1-D tensor of non-negative byte lengths covering "
                f"every token id in data (ids up to {int(ids.max())}), got shape "
                f"{tuple(sizes.shape)}"
            )
    elif token_bytes is not None:
        raise ValueError("token_bytes is read only for unit='byte' of non-byte token ids")

    forward = _forward_of(model)
    with evaluating(model):
        by_length = []
        for length in lengths:
            x, y, _ = spread_eval_windows(ids, length, spans * lengths[-1], span_len=lengths[-1])
            bits = span_loss(forward, x, y, batch_size=batch_size)  # [windows, length]
            entry = {"length": length, "tokens": int(bits.numel())}
            per_span = bits.reshape(spans, -1)  # the windows of each span, in order
            if sizes is None:
                entry["bits"] = float(bits.mean())
                by_span = per_span.mean(1)
            else:
                span_bytes = sizes[y].reshape(spans, -1).sum(1).clamp(min=1)
                entry["bytes"] = int(sizes[y].sum())
                entry["bits"] = float(bits.sum()) / max(entry["bytes"], 1)
                by_span = per_span.sum(1) / span_bytes
            entry["bits_by_span"] = [round(float(v), 5) for v in by_span]
            if unit == "byte" and sizes is None:
                entry["bytes"] = entry["tokens"]
            entry["context_use"] = None
            if length > window:
                sliding = sliding_loss(
                    forward, x, y, window=window, stride=stride, batch_size=batch_size * 32
                )
                entry["context_use"] = context_use(bits, sliding, window)
            by_length.append(entry)
    return {
        "unit": unit,
        "window": window,
        "stride": stride,
        "spans": spans,
        "by_length": by_length,
    }
