r"""FlexAttention: the bias computed inside a compiled attention kernel.

``biased_attention(..., backend="flex")`` computes the bias with FlexAttention's
``score_mod``: an offset-only family looks its value up in the O(n) table, FIRE
evaluates its MLP for each score, the forget gate reads its cumulative log gates by batch
and head (:meth:`~relbias.biases.prepared.PreparedBias.score_mod`).
Causal attention uses a block mask built from block coordinates
(:func:`causal_block_mask`), so blocks above the diagonal are skipped. The kernel is
compiled once per shape (:func:`compile_stats` counts compilations and their time); on
the CPU it runs forward only (PyTorch has no CPU backward for FlexAttention), and
``backend="auto"`` never takes it (see :func:`relbias.attention.api.choose_backend`).
"""

from __future__ import annotations

import math

import torch

from relbias._cache import LRUCache
from relbias._checks import needs_grad
from relbias._compile import _STATS, compile_stats, timed
from relbias.biases.prepared import PreparedBias, visible

__all__ = [
    "BLOCK_SIZE",
    "FLEX_DTYPES",
    "causal_block_mask",
    "compile_stats",
    "flex_attention_with_bias",
]

#: dtypes FlexAttention accepts (on the CPU: float32, bfloat16, float16).
FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: FlexAttention's block size in both directions (its default).
BLOCK_SIZE = 128

#: Kernel options tried when Triton's default configuration for a compiled kernel needs
#: more shared memory than the GPU has ("out of resource"): fewer pipeline stages and
#: smaller blocks. Seen on an H200 with torch 2.11 for 16-bit inputs with any bias
#: table captured by ``score_mod``.
SMALL_KERNEL_OPTIONS = {"num_stages": 1, "BLOCK_M": 64, "BLOCK_N": 64}

#: At most this many block masks are kept (the latest shapes) ...
BLOCK_MASKS_KEPT = 64
#: ... and this many calls remembered as needing :data:`SMALL_KERNEL_OPTIONS`.
SMALL_KERNEL_KEYS_KEPT = 256

_SMALL_KERNEL_KEYS = LRUCache(SMALL_KERNEL_KEYS_KEPT)
_BLOCK_MASKS = LRUCache(BLOCK_MASKS_KEPT)
_COMPILED = None


def _compiled_flex():
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def _causal_mask_mod(q_start: int):
    def causal_mask(b, h, q_idx, kv_idx):
        return visible(q_idx + q_start, kv_idx)

    return causal_mask


def causal_block_mask(q_len, k_len, q_start, device, block_size=BLOCK_SIZE):
    """FlexAttention's block mask for causal attention of queries at ``q_start ..``.

    Built from block coordinates (O((n/block)^2) integers), not by evaluating the
    mask at all ``q_len x k_len`` points; cached per shape (the latest
    :data:`BLOCK_MASKS_KEPT`).
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device)
    key = (q_len, k_len, q_start, str(device), block_size)
    if key in _BLOCK_MASKS:
        return _BLOCK_MASKS[key]
    nq, nk = math.ceil(q_len / block_size), math.ceil(k_len / block_size)
    qb = torch.arange(nq, device=device)
    kb = torch.arange(nk, device=device)
    first_row = q_start + qb * block_size
    last_row = q_start + torch.clamp((qb + 1) * block_size, max=q_len) - 1
    first_key, last_key = kb * block_size, (kb + 1) * block_size - 1
    visible = first_key[None, :] <= last_row[:, None]
    whole = (last_key[None, :] <= first_row[:, None]) & (last_key[None, :] < k_len)
    whole &= ((qb + 1) * block_size <= q_len)[:, None]
    partial = visible & ~whole

    def pack(selected):
        count = selected.sum(-1).to(torch.int32)
        order = torch.argsort((~selected).to(torch.int8), dim=-1, stable=True)
        return count[None, None], order.to(torch.int32)[None, None].contiguous()

    kv_num, kv_idx = pack(partial)
    full_num, full_idx = pack(whole)
    mask = BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=(block_size, block_size),
        mask_mod=_causal_mask_mod(q_start),
        seq_lengths=(q_len, k_len),
    )
    _BLOCK_MASKS[key] = mask
    return mask


def flex_attention_with_bias(q, k, v, bias: PreparedBias | None, *, causal=True, q_start=None):
    """FlexAttention with ``bias`` computed inside the kernel (``score_mod``).

    ``bias`` is a :class:`~relbias.biases.prepared.PreparedBias` of this shape (it
    places the queries) or None; with no bias, ``q_start`` places them (default: the
    last ``q_len`` of the keys). The lengths are checked by the caller
    (:func:`relbias.biased_attention` checks them once). The kernel is compiled on the
    first call with a new shape (counted by :func:`compile_stats`) and reused after that.
    """
    if q.dtype not in FLEX_DTYPES:
        raise TypeError(
            f"backend='flex' needs q, k, v in one of {[str(d) for d in FLEX_DTYPES]}, got {q.dtype}"
        )
    if bias is not None and not bias.score_mod_trainable and needs_grad(q, k, v, bias):
        raise RuntimeError(
            f"backend='flex' cannot compute gradients for {type(bias).__name__}: "
            "FlexAttention's backward does not compile its score_mod (measured with torch "
            "2.11 on a GPU); use backend='materialize' for training, or torch.no_grad()"
        )
    if q.device.type == "cpu" and needs_grad(q, k, v, bias):
        raise RuntimeError(
            "backend='flex' cannot compute gradients on the CPU (PyTorch has no CPU "
            "backward for FlexAttention): use backend='materialize' or torch.no_grad()"
        )
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    if bias is not None:
        bias.check_shape(heads, q_len, k_len, bias.q_start, causal, batch=batch)
        q_start = bias.q_start
    elif q_start is None:
        q_start = k_len - q_len
    block_mask = causal_block_mask(q_len, k_len, q_start, q.device) if causal else None
    score_mod = None if bias is None else bias.score_mod()
    key = (
        str(q.device),
        str(q.dtype),
        tuple(q.shape),
        tuple(k.shape),
        tuple(v.shape),
        None if bias is None else bias.score_mod_key,
        causal,
        q_start if causal else None,
        torch.is_grad_enabled(),
    )
    _STATS["calls"] += 1
    if not (key in _SMALL_KERNEL_KEYS and _SMALL_KERNEL_KEYS[key]):  # (a read keeps it)
        try:
            return timed(_compiled_flex(), key)(q, k, v, score_mod=score_mod, block_mask=block_mask)
        except Exception as exc:  # Inductor's errors have no public class to catch
            if "out of resource" not in str(exc):
                raise
            _SMALL_KERNEL_KEYS[key] = True
    small = (*key, "small kernel options")
    return timed(_compiled_flex(), small)(
        q, k, v, score_mod=score_mod, block_mask=block_mask, kernel_options=SMALL_KERNEL_OPTIONS
    )
