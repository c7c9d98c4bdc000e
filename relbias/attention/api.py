"""Multi-head attention with an additive relative positional bias (the book's Eqs. 2.75-2.77)."""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from relbias._checks import check_lengths
from relbias.attention import fused
from relbias.attention.flex import (
    FLEX_DTYPES,
    PreparedBias,
    _set_last_backend,
    flex_attention_with_bias,
    prepare_bias,
    table_attention,
)
from relbias.biases.base import RelativeBias


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


def _check_module(bias: RelativeBias, heads: int, causal: bool) -> None:
    if bias.num_heads != heads:
        raise ValueError(f"bias has num_heads={bias.num_heads} but q has {heads} heads")
    if not causal and not bias.bidirectional:
        raise ValueError(
            f"bias {type(bias).__name__} was built causal (bidirectional=False); "
            "build it with bidirectional=True for causal=False attention"
        )


def _bias_tensor(bias, q, k, q_start: int, causal: bool) -> torch.Tensor | None:
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    if bias is None:
        return None
    if isinstance(bias, RelativeBias):
        _check_module(bias, heads, causal)
        return bias(q_len, k_len, q_start=q_start)
    if isinstance(bias, PreparedBias):
        bias.check_shape(heads, q_len, k_len, q_start, causal)
        return bias.materialize()
    if not isinstance(bias, torch.Tensor):
        raise TypeError(
            "bias must be None, a torch.Tensor, a relbias.RelativeBias or a "
            f"relbias.attention.flex.PreparedBias, got {type(bias).__name__}"
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


BACKENDS = ("auto", "materialize", "table", "flex", "fused")

#: What ``backend="auto"`` takes on the CPU when no gradient is needed, in order of
#: preference: the first that can compute the attention. Measured on a 2-core CPU
#: (benchmarks/results/cpu.json): the fused kernel (:mod:`relbias.attention.fused`, float32, where
#: a C++ compiler could build it) runs nearest the speed of bias-free attention, the
#: strided-table path next; FlexAttention's CPU kernel (forward only) is about 3x
#: slower than bias-free attention even with no bias.
CPU_INFERENCE_BACKENDS = ("fused", "table")


def _needs_grad(q, k, v, bias) -> bool:
    if not torch.is_grad_enabled():
        return False
    if any(t.requires_grad for t in (q, k, v)):
        return True
    if isinstance(bias, RelativeBias):
        return any(p.requires_grad for p in bias.parameters())
    if isinstance(bias, (PreparedBias, torch.Tensor)):
        return bias.requires_grad
    return False


def _choose_backend(backend, q, k, v, bias, return_weights) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    structured = isinstance(bias, (RelativeBias, PreparedBias))
    if backend != "auto":
        if return_weights and backend != "materialize":
            raise ValueError(
                f"return_weights=True needs the attention weights, which only "
                f"backend='materialize' forms; got backend={backend!r}"
            )
        if backend != "materialize" and isinstance(bias, torch.Tensor):
            raise ValueError(
                f"backend={backend!r} needs a relbias.RelativeBias (or prepared bias), "
                "not a dense tensor; a dense bias only works with backend='materialize'"
            )
        if backend in ("table", "fused") and bias is None:
            raise ValueError(f"backend={backend!r} needs a bias; use 'materialize' or 'flex'")
        if (
            backend in ("table", "fused")
            and isinstance(bias, RelativeBias)
            and not (bias.offset_only or _is_fire(bias))
        ):
            raise ValueError(f"backend={backend!r} does not support {type(bias).__name__}")
        return backend
    if return_weights or not structured or q.dtype not in FLEX_DTYPES:
        return "materialize"
    if isinstance(bias, RelativeBias) and not (bias.offset_only or _is_fire(bias)):
        return "materialize"
    if q.device.type == "cuda":
        return "flex"
    if q.device.type != "cpu" or _needs_grad(q, k, v, bias):
        return "materialize"
    for name in CPU_INFERENCE_BACKENDS:
        if name != "fused" or (q.dtype == torch.float32 and fused.available()):
            return name
    return "materialize"


def _is_fire(bias) -> bool:
    from relbias.biases.fire import FIRE

    return isinstance(bias, FIRE)


def _dense_mask(additive, q, q_len, k_len, q_start, causal):
    """The additive mask for SDPA: the bias (4-D, so the fused kernel takes it) and -inf."""
    if additive is None:
        if not causal:
            return None
        i = torch.arange(q_start, q_start + q_len, device=q.device)
        j = torch.arange(k_len, device=q.device)
        return j[None, :] <= i[:, None]  # boolean: True where attention is allowed
    mask = additive.to(q.dtype)
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if causal:
        i = torch.arange(q_start, q_start + q_len, device=q.device)
        j = torch.arange(k_len, device=q.device)
        mask = mask.masked_fill(j[None, :] > i[:, None], float("-inf"))
    return mask


def biased_attention(
    q,
    k,
    v,
    bias=None,
    *,
    causal=True,
    return_weights=False,
    q_start=None,
    backend="auto",
    return_backend=False,
):
    r"""Softmax attention with an additive bias: the book's Eqs. 2.75-2.77.

    .. math::
        \alpha(i,j) = \mathrm{Softmax}_j\Big(\frac{q_i k_j^\top}{\sqrt{d}} + \mathrm{PE}(i,j)
        + \mathrm{Mask}(i,j)\Big), \qquad \mathrm{Att}_i = \sum_j \alpha(i,j)\, v_j

    ``q`` is ``[batch, heads, q_len, head_dim]``, ``k`` and ``v`` are
    ``[batch, heads, k_len, ...]``. The bias is added *after* the :math:`1/\sqrt{d}`
    scaling, as fairseq's ALiBi, KERPLE and x-transformers do; the book writes it
    inside, which is the same attention with the bias multiplied by :math:`\sqrt{d}`.
    ``bias`` is a tensor broadcastable to ``[batch, heads, q_len, k_len]``, a
    :class:`~relbias.RelativeBias` (called with the lengths and ``q_start``), or a
    bias prepared once for this shape by :func:`relbias.attention.flex.prepare_bias` (to share
    it across layers).
    Queries sit at positions ``q_start ..`` (default: the last ``q_len`` of ``k_len``),
    and with ``causal=True`` query ``i`` sees keys ``j <= i``.

    ``backend`` chooses how the bias reaches the scores (see :mod:`relbias.attention.flex`):
    ``"materialize"`` builds the ``[heads, q_len, k_len]`` bias; ``"table"`` reads an
    offset-only bias from its O(n) table through a strided view (FIRE: block by
    block), with no ``q_len x k_len`` tensor; ``"flex"`` computes it inside a compiled
    FlexAttention kernel; ``"fused"`` inside relbias's own C++ CPU kernel
    (:mod:`relbias.attention.fused`, float32, forward only). ``"auto"`` (default) takes
    FlexAttention on a GPU; on the CPU it takes the first of
    :data:`CPU_INFERENCE_BACKENDS` that can run when no gradient is needed
    (FlexAttention and the fused kernel have no CPU backward) and ``"materialize"``
    otherwise; a dense tensor bias, a float64
    input and ``return_weights=True`` always materialise. All backends give the same
    values within float rounding.

    Returns the output ``[batch, heads, q_len, v_dim]``, and with
    ``return_weights=True`` also the weights :math:`\alpha` ``[batch, heads, q_len, k_len]``;
    with ``return_backend=True`` the name of the backend taken comes last
    (also available afterwards from :func:`relbias.attention.flex.last_backend`).
    With no keys (``k_len = 0``) the output is zero (an empty sum).
    """
    _check_qkv(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}")
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
    chosen = _choose_backend(backend, q, k, v, bias, return_weights)

    def finish(*outputs):
        _set_last_backend(chosen)
        if return_backend:
            outputs = (*outputs, chosen)
        return outputs if len(outputs) > 1 else outputs[0]

    if chosen != "materialize" or q_len == 0 or k_len == 0:
        if isinstance(bias, RelativeBias):
            _check_module(bias, heads, causal)
        elif isinstance(bias, PreparedBias):
            bias.check_shape(heads, q_len, k_len, q_start, causal)
        elif bias is not None and not isinstance(bias, torch.Tensor):
            _bias_tensor(bias, q, k, q_start, causal)  # raises the TypeError
    if q_len == 0 or k_len == 0:
        if isinstance(bias, torch.Tensor):
            _bias_tensor(bias, q, k, q_start, causal)
        out = q.new_zeros(batch, heads, q_len, v.shape[-1])
        if return_weights:
            return finish(out, q.new_zeros(batch, heads, q_len, k_len))
        return finish(out)

    if chosen in ("table", "flex", "fused"):
        prepared = None if bias is None else prepare_bias(bias, q_len, k_len, q_start=q_start)
        if chosen == "table":
            return finish(table_attention(q, k, v, prepared, causal=causal))
        if chosen == "fused":
            return finish(fused.fused_attention(q, k, v, prepared, causal=causal))
        return finish(flex_attention_with_bias(q, k, v, prepared, causal=causal, q_start=q_start))

    additive = _bias_tensor(bias, q, k, q_start, causal)
    if return_weights:
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        if additive is not None:
            scores = scores + additive.to(q.dtype)
        if causal:
            i = torch.arange(q_start, q_start + q_len, device=q.device)
            j = torch.arange(k_len, device=q.device)
            scores = scores.masked_fill(j[None, :] > i[:, None], float("-inf"))
        weights = torch.softmax(scores, dim=-1)
        return finish(weights @ v, weights)
    if additive is None and causal and q_start == 0 and q_len == k_len:
        return finish(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    mask = _dense_mask(additive, q, q_len, k_len, q_start, causal)
    return finish(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
