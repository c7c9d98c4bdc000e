"""Multi-head attention with an additive relative positional bias (the book's Eqs. 2.75-2.77)."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from ._checks import check_lengths
from .base import RelativeBias


def _check_qkv(q, k, v) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have shape [batch, heads, len, head_dim], got {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {t.dtype}")
    if q.shape[:2] != k.shape[:2] or k.shape[:3] != v.shape[:3]:
        raise ValueError(
            "q, k and v must agree in batch and heads, and k and v in length: got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same head_dim, got {q.shape[-1]} and {k.shape[-1]}"
        )


def _bias_tensor(bias, q, k, q_start: int, causal: bool) -> torch.Tensor | None:
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    if bias is None:
        return None
    if isinstance(bias, RelativeBias):
        if bias.num_heads != heads:
            raise ValueError(
                f"bias has num_heads={bias.num_heads} but q has {heads} heads"
            )
        if not causal and not bias.bidirectional:
            raise ValueError(
                f"bias {type(bias).__name__} was built causal (bidirectional=False); "
                "build it with bidirectional=True for causal=False attention"
            )
        return bias(q_len, k_len, q_start=q_start)
    if not isinstance(bias, torch.Tensor):
        raise TypeError(
            "bias must be None, a torch.Tensor or a relbias.RelativeBias, "
            f"got {type(bias).__name__}"
        )
    target = (batch, heads, q_len, k_len)
    if bias.dim() > 4 or any(
        b not in (1, t) for b, t in zip(reversed(bias.shape), reversed(target))
    ):
        raise ValueError(
            f"bias of shape {tuple(bias.shape)} does not broadcast to "
            f"[batch, heads, q_len, k_len] = {list(target)}"
        )
    return bias


def biased_attention(
    q, k, v, bias=None, *, causal=True, return_weights=False, q_start=None
):
    r"""Softmax attention with an additive bias: the book's Eqs. 2.75-2.77.

    .. math::
        \alpha(i,j) = \mathrm{Softmax}_j\Big(\frac{q_i k_j^\top}{\sqrt{d}} + \mathrm{PE}(i,j)
        + \mathrm{Mask}(i,j)\Big), \qquad \mathrm{Att}_i = \sum_j \alpha(i,j)\, v_j

    ``q`` is ``[batch, heads, q_len, head_dim]``, ``k`` and ``v`` are
    ``[batch, heads, k_len, ...]``. The bias is added *after* the :math:`1/\sqrt{d}`
    scaling, as fairseq's ALiBi, KERPLE and x-transformers do; the book writes it
    inside, which is the same attention with the bias multiplied by :math:`\sqrt{d}`.
    ``bias`` is a tensor broadcastable to ``[batch, heads, q_len, k_len]`` or a
    :class:`~relbias.RelativeBias` (called with the lengths and ``q_start``).
    Queries sit at positions ``q_start ..`` (default: the last ``q_len`` of ``k_len``),
    and with ``causal=True`` query ``i`` sees keys ``j <= i``.

    Returns the output ``[batch, heads, q_len, v_dim]``, and with
    ``return_weights=True`` also the weights :math:`\alpha` ``[batch, heads, q_len, k_len]``.
    With no keys (``k_len = 0``) the output is zero (an empty sum).
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
    additive = _bias_tensor(bias, q, k, q_start, causal)

    if q_len == 0 or k_len == 0:
        out = q.new_zeros(batch, heads, q_len, v.shape[-1])
        return (out, q.new_zeros(batch, heads, q_len, k_len)) if return_weights else out

    mask = None if additive is None else additive.to(q.dtype)
    if causal:
        i = torch.arange(q_start, q_start + q_len, device=q.device)
        j = torch.arange(k_len, device=q.device)
        future = j[None, :] > i[:, None]
        blocked = torch.zeros(q_len, k_len, dtype=q.dtype, device=q.device).masked_fill(
            future, float("-inf")
        )
        mask = blocked if mask is None else mask + blocked

    if return_weights:
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        if mask is not None:
            scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        return weights @ v, weights
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
