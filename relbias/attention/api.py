"""Multi-head attention with an additive relative positional bias (the book's Eqs. 2.75-2.77).

:func:`biased_attention` is the one entry point; :func:`choose_backend` is its one
``"auto"`` policy (the model asks it too). The backends live below: the dense bias
(here), the O(n) table path (:mod:`relbias.attention.table`), FlexAttention
(:mod:`relbias.attention.flex`) and the fused C++ CPU kernel
(:mod:`relbias.attention.fused`); what they read of a bias is a
:class:`~relbias.biases.prepared.PreparedBias`.
"""

from __future__ import annotations

import functools
import math

import torch
from torch.nn import functional as F

from relbias._checks import (
    autocast_enabled,
    check_bool,
    check_broadcasts,
    check_lengths,
    check_positive_float,
    needs_grad,
    no_autocast,
)
from relbias.attention.flex import FLEX_DTYPES, flex_attention_with_bias
from relbias.attention.positioned import fused_serves, positioned_attention
from relbias.attention.table import table_attention
from relbias.biases.base import DataDependentBias, RelativeBias
from relbias.biases.prepared import PreparedBias, visible

__all__ = [
    "BACKENDS",
    "CPU_INFERENCE_BACKENDS",
    "CPU_TRAINING_BACKENDS",
    "biased_attention",
    "causal_mask",
    "choose_backend",
]

BACKENDS = ("auto", "materialize", "table", "flex", "fused")

#: What ``backend="auto"`` takes on the CPU when no gradient is needed, in order of
#: preference: the first that can compute the attention. Measured on a 2-core CPU
#: (relbias/bench/results/cpu.json): the fused kernel (:mod:`relbias.attention.fused`, float32
#: or bfloat16, where a C++ compiler could build it) runs nearest the speed of bias-free
#: attention, the strided-table path next; FlexAttention's CPU kernel (forward only), with
#: a bias, took 1.6-4.0 times bias-free attention (FlexAttention without a bias not timed).
CPU_INFERENCE_BACKENDS = ("fused", "table")
#: ... and when a gradient is needed (training): the fused kernel's backward, else the
#: materialised bias (the table path and FlexAttention have no CPU backward).
CPU_TRAINING_BACKENDS = ("fused", "materialize")


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
    if (
        q.shape[0] != k.shape[0]
        or k.shape[:3] != v.shape[:3]
        or k.shape[1] == 0
        or q.shape[1] % k.shape[1]
    ):
        raise ValueError(
            "q, k and v must agree in batch, k and v in heads and in length, and q's heads must "
            "be a multiple of k's (grouped-query attention): got "
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


def causal_mask(q_len: int, k_len: int, q_start: int, device=None) -> torch.Tensor:
    """The dense causal mask ``[q_len, k_len]``: True where query ``q_start + r`` sees key ``j``.

    For the materialised path only (the other backends never build it).
    """
    i = torch.arange(q_start, q_start + q_len, device=device)
    j = torch.arange(k_len, device=device)
    return visible(i[:, None], j[None, :])


def _check_bias_type(bias) -> None:
    if isinstance(bias, DataDependentBias):
        raise TypeError(
            f"bias {type(bias).__name__} is computed from the layer input: pass "
            "bias.prepare(x) (a prepared bias, one per batch) as bias, not the module"
        )
    if bias is not None and not isinstance(bias, (torch.Tensor, RelativeBias, PreparedBias)):
        raise TypeError(
            "bias must be None, a torch.Tensor, a relbias.RelativeBias or a "
            f"relbias.PreparedBias, got {type(bias).__name__}"
        )


def _dense_mask(additive, q, q_len, k_len, q_start, causal):
    """The additive mask for SDPA: the bias (4-D, so the fused kernel takes it) and -inf."""
    if additive is None:
        return causal_mask(q_len, k_len, q_start, q.device) if causal else None
    mask = additive.to(q.dtype)
    while mask.dim() < 4:
        mask = mask.unsqueeze(0)
    if causal:
        mask = mask.masked_fill(~causal_mask(q_len, k_len, q_start, q.device), float("-inf"))
    return mask


def choose_backend(
    q,
    k,
    v,
    bias=None,
    backend="auto",
    *,
    return_weights=False,
    q_positions=None,
    k_positions=None,
    mask=None,
) -> str:
    """The backend :func:`biased_attention` takes for these arguments: the one ``auto`` policy.

    An explicit ``backend`` is checked against the bias (``ValueError`` where it cannot
    serve it) and returned. ``"auto"`` takes:

    * ``"materialize"`` for ``return_weights=True``, no bias or a dense tensor bias, a
      dtype other than float32/bfloat16/float16, or a family with no prepared form;
    * on the CPU, the first of :data:`CPU_TRAINING_BACKENDS` that can run when a
      gradient is needed (grad mode on and ``q``, ``k``, ``v`` or the bias requires
      one), else the first of :data:`CPU_INFERENCE_BACKENDS`: the fused kernel
      (float32 or bfloat16, where it could be built), else ``"materialize"`` (training)
      or ``"table"`` (inference);
    * on any other device, ``"materialize"`` whenever a gradient is needed
      (FlexAttention training has not been verified on a GPU, so ``auto`` never takes
      it); without gradients ``"table"`` on CUDA (the O(n) table through strided masks,
      which never builds a ``q_len x k_len`` index or bias tensor), else
      ``"materialize"``.

    With per-row positions, a mask or grouped keys (``q_positions``, ``k_positions``,
    ``mask``; keys with fewer heads than the queries: :mod:`relbias.attention.positioned`)
    the same policy holds where the fused kernel can serve them: positions that advance by
    one along each row (left padding, a cache; not packed sequences, whose positions
    restart), a boolean mask (not a ``BlockMask``), not under ``torch.compile`` (reading
    the positions would break the graph). Elsewhere ``"auto"`` passes the fused kernel by.
    """
    _check_qkv(q, k, v)
    _check_bias_type(bias)
    where = None
    if q_positions is not None or k_positions is not None or mask is not None:
        where = (q_positions, k_positions, mask)
    elif k.shape[1] != q.shape[1]:
        where = (None, None, None)
    return _choose(backend, q, k, v, bias, return_weights, where)


def _choose(backend, q, k, v, bias, return_weights, where=None) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {list(BACKENDS)}, got {backend!r}")
    structured = isinstance(bias, (RelativeBias, PreparedBias))
    preparable = structured and (isinstance(bias, PreparedBias) or bias.preparable)
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
        if backend in ("table", "fused") and not preparable:
            raise ValueError(f"backend={backend!r} does not support {type(bias).__name__}")
        return backend
    if return_weights or not preparable or q.dtype not in FLEX_DTYPES:
        return "materialize"
    training = needs_grad(q, k, v, bias)
    if q.device.type == "cpu":
        from relbias.attention import fused  # built on first use

        for name in CPU_TRAINING_BACKENDS if training else CPU_INFERENCE_BACKENDS:
            if name != "fused" or (
                q.dtype in fused.DTYPES
                and (where is None or fused_serves(q, k, v, bias, *where))
                and fused.available()
            ):
                return name
    if training:
        return "materialize"
    if q.device.type == "cuda":
        return "table"
    return "materialize"


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
    scale=None,
    q_positions=None,
    k_positions=None,
    mask=None,
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
    bias prepared once for this shape by :meth:`relbias.RelativeBias.prepare` (to share
    it across layers). A bias computed from the layer input (the Forgetting Transformer's
    :class:`~relbias.ForgettingGate`) is passed prepared, ``gate.prepare(x)``: one bias per
    sequence (its batch must be ``q``'s), causal only.
    Queries sit at positions ``q_start ..`` (default: the last ``q_len`` of ``k_len``),
    and with ``causal=True`` query ``i`` sees keys ``j <= i``.

    ``backend`` chooses how the bias reaches the scores: ``"materialize"`` builds the
    ``[heads, q_len, k_len]`` bias; ``"table"`` reads an offset-only bias from its O(n)
    table through a strided view (FIRE: block by block), with no ``q_len x k_len``
    tensor (:mod:`relbias.attention.table`); ``"flex"`` computes it inside a compiled
    FlexAttention kernel (:mod:`relbias.attention.flex`); ``"fused"`` inside relbias's
    own C++ CPU kernel (:mod:`relbias.attention.fused`, float32 or bfloat16, forward and
    backward).
    ``"auto"`` (default) follows :func:`choose_backend`: on the CPU the fused kernel,
    with or without gradients (where it could be built; else the table path without
    gradients, the materialised bias with them); on CUDA the table path without
    gradients and the materialised bias with them; a dense tensor bias, a float64 input
    and ``return_weights=True`` always materialise. All backends give the same values
    within float rounding.

    ``scale`` replaces :math:`1/\sqrt{d}` as the factor of the scores (None: :math:`1/\sqrt{d}`;
    a Hugging Face model passes its own ``scaling``); every backend takes it by scaling the
    queries by ``scale * sqrt(d)`` first, which is the same attention (within float rounding;
    a gradient flows through it) with the bias still added after the scaling.

    ``q_positions`` ``[batch or 1, q_len]`` and ``k_positions`` ``[batch or 1, k_len]``
    (integer tensors) place the bias per row where the positions are not the slots
    (left padding, packed sequences, a static cache): PE is
    :meth:`~relbias.RelativeBias.at_positions` there, while ``causal`` and ``q_start``
    still say which key *slots* a query slot sees. ``mask`` (boolean, True where a query
    may read a key, broadcastable to ``[batch, heads, q_len, k_len]``; or FlexAttention's
    ``BlockMask`` with ``backend="flex"`` and ``causal=False``) hides more keys; with a
    mask, ``causal=False`` is allowed for a bias built causal (the mask then hides the
    future). ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention: a
    divisor; query head ``h`` reads key head ``h // (heads // kv_heads)``, without copying
    the keys). A query that sees no key gets a zero output. These run on every backend
    (:mod:`relbias.attention.positioned`); the fused kernel takes positions that advance
    by one along each row (a per-row shift: left padding, a cache) and a boolean mask.

    Under ``torch.autocast`` the bias is computed and added in float32 (FIRE's MLP
    included): with a bias, the attention runs outside autocast on ``q``, ``k``, ``v``
    cast to at least float32, and returns that dtype.

    Returns the output ``[batch, heads, q_len, v_dim]``, and with
    ``return_weights=True`` also the weights :math:`\alpha` ``[batch, heads, q_len, k_len]``;
    with ``return_backend=True`` the name of the backend taken comes last (or ask
    :func:`choose_backend` beforehand). With no keys (``k_len = 0``) the output is zero
    (an empty sum).
    """
    _check_qkv(q, k, v)
    check_bool("causal", causal)
    _check_bias_type(bias)
    q_len, k_len, q_start = check_lengths(q.shape[2], k.shape[2], q_start)  # the one check
    where = None
    if q_positions is not None or k_positions is not None or mask is not None:
        where = (q_positions, k_positions, mask)
    elif k.shape[1] != q.shape[1]:
        where = (None, None, None)
    factor = 1.0
    if scale is not None:
        factor = check_positive_float("scale", scale) * math.sqrt(q.shape[-1])
    if bias is not None and autocast_enabled(q.device):
        # The bias is computed and added in float32: the attention runs outside autocast,
        # on q, k and v in at least float32 (autocast would round the bias to its dtype).
        dtype = functools.reduce(torch.promote_types, (q.dtype, k.dtype, v.dtype, torch.float32))
        with no_autocast(q.device):
            q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
            if factor != 1.0:
                q = q * factor  # after the cast: the queries are not rounded to autocast's dtype
            return _attend(
                q, k, v, bias, causal, return_weights, q_start, backend, return_backend, where
            )
    if factor != 1.0:
        q = q * factor
    return _attend(q, k, v, bias, causal, return_weights, q_start, backend, return_backend, where)


def _attend(q, k, v, bias, causal, return_weights, q_start, backend, return_backend, where=None):
    """:func:`biased_attention` for arguments already checked."""
    batch, heads, q_len, head_dim = q.shape
    k_len = k.shape[2]
    chosen = _choose(backend, q, k, v, bias, return_weights, where)

    def finish(*outputs):
        if return_backend:
            outputs = (*outputs, chosen)
        return outputs if len(outputs) > 1 else outputs[0]

    if isinstance(bias, RelativeBias):
        _check_module(bias, heads, causal or (where is not None and where[2] is not None))
    elif isinstance(bias, PreparedBias):
        masked = where is not None and where[2] is not None and not bias.batch
        bias.check_shape(heads, q_len, k_len, q_start, causal or masked, batch=batch)
    elif isinstance(bias, torch.Tensor):
        check_broadcasts("bias", bias, (batch, heads, q_len, k_len))
    if q_len == 0 or k_len == 0:
        out = q.new_zeros(batch, heads, q_len, v.shape[-1])
        if return_weights:
            return finish(out, q.new_zeros(batch, heads, q_len, k_len))
        return finish(out)

    if where is not None:
        q_positions, k_positions, mask = where
        result = positioned_attention(
            q,
            k,
            v,
            bias,
            backend=chosen,
            causal=causal,
            q_start=q_start,
            q_positions=q_positions,
            k_positions=k_positions,
            mask=mask,
            return_weights=return_weights,
        )
        return finish(*result) if return_weights else finish(result)

    if chosen in ("table", "flex", "fused"):
        prepared = bias
        if isinstance(bias, RelativeBias):
            prepared = bias._prepare(q_len, k_len, q_start)  # lengths checked above
        if chosen == "table":
            return finish(table_attention(q, k, v, prepared, causal=causal))
        if chosen == "fused":
            from relbias.attention import fused

            return finish(fused.fused_attention(q, k, v, prepared, causal=causal))
        return finish(flex_attention_with_bias(q, k, v, prepared, causal=causal, q_start=q_start))

    if isinstance(bias, RelativeBias):
        additive = bias(q_len, k_len, q_start=q_start)
    elif isinstance(bias, PreparedBias):
        additive = bias.materialize()
    else:
        additive = bias
    if return_weights:
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        if additive is not None:
            scores = scores + additive.to(q.dtype)
        if causal:
            scores = scores.masked_fill(
                ~causal_mask(q_len, k_len, q_start, q.device), float("-inf")
            )
        weights = torch.softmax(scores, dim=-1)
        return finish(weights @ v, weights)
    if additive is None and causal and q_start == 0 and q_len == k_len:
        return finish(F.scaled_dot_product_attention(q, k, v, is_causal=True))
    mask = _dense_mask(additive, q, q_len, k_len, q_start, causal)
    return finish(F.scaled_dot_product_attention(q, k, v, attn_mask=mask))
