r"""Attention at per-row positions, under an external mask, with grouped keys.

:func:`relbias.biased_attention` takes this path when it is given ``q_positions`` or
``k_positions`` (integer tensors ``[rows, len]``, ``rows`` the batch or 1), a ``mask``
(boolean, True where a query may read a key, broadcastable to
``[batch, heads, q_len, k_len]``; or FlexAttention's ``BlockMask`` on ``backend="flex"``)
or keys with fewer heads than the queries (grouped-query attention: query head ``h``
reads key head ``h // (heads / kv_heads)``, and the keys are never repeated).

Positions set the bias and nothing else: query ``r`` of row ``b`` sits at position
``q_positions[b, r]``, key ``j`` at ``k_positions[b, j]``, and PE is the family's
:meth:`~relbias.RelativeBias.at_positions` there (left padding, packed sequences, a
static cache). What a query sees is set by *slots*: with ``causal=True`` query slot
``q_start + r`` sees key slots ``j <= q_start + r``, and the ``mask`` removes more.
A query that sees no key at all gets a zero output (an empty sum), never NaN.

Backends (``"auto"`` chooses as for the shape path: :func:`relbias.choose_backend`):

* ``"materialize"``: the bias of all rows at once, added to the scores of PyTorch's
  ``scaled_dot_product_attention`` (its grouped-key mode, no copy);
* ``"table"``: the same in blocks of query rows, each against the keys it can see, so
  that no ``q_len x k_len`` bias exists at once (a decoding step is one block of one row);
* ``"flex"``: FlexAttention, the bias in its ``score_mod`` read from an O(n) table of
  the offsets that occur (FIRE: of :math:`\psi` and the per-row denominators; the range
  of the positions is read once per call, which waits for a GPU), the mask as its block
  mask;
* ``"fused"``: the C++ CPU kernel (:mod:`relbias.attention.fused`), for positions that
  advance by one along each row (query row ``r`` of sequence ``b`` at
  ``q_positions[b, 0] + r``, key ``j`` at ``k_positions[b, 0] + j``: left padding, a
  cache, a static cache): then PE depends on the row's shift
  ``q_positions[b, 0] - k_positions[b, 0]`` and ``r - j``, which the kernel reads from one
  table covering every row, with FIRE's denominators per row; the mask is read in the
  kernel, the grouped keys are never repeated. Packed sequences, whose positions restart,
  take the other backends.
"""

from __future__ import annotations

import math

import torch
from torch.nn import functional as F

from relbias._checks import check_broadcasts, needs_grad, no_autocast
from relbias._compile import _STATS, timed
from relbias.attention.flex import FLEX_DTYPES, _compiled_flex, causal_block_mask
from relbias.biases.base import RelativeBias
from relbias.biases.fire import FIRE
from relbias.biases.positions import check_positions
from relbias.biases.prepared import PreparedBias, visible

__all__ = [
    "BLOCK_ENTRIES",
    "FUSED_MIN_ROWS",
    "check_mask",
    "fused_serves",
    "is_block_mask",
    "positioned_attention",
    "row_shifts",
]

#: The table backend's blocks hold at most this many bias entries (rows x heads x keys).
BLOCK_ENTRIES = 1 << 22
#: Without gradients, ``"auto"`` takes the fused kernel on this path from this many query
#: rows: below it (a decoding step) the kernel's set-up per call (its table of every row's
#: offsets; FIRE's folded MLP) costs more than the table path's one block (measured by
#: ``python scripts/hf_bench.py``: the cached decode of a small Llama is slower through
#: the kernel).
FUSED_MIN_ROWS = 16


def is_block_mask(mask) -> bool:
    """Whether ``mask`` is FlexAttention's ``BlockMask``."""
    try:
        from torch.nn.attention.flex_attention import BlockMask
    except ImportError:  # pragma: no cover - every supported torch has it
        return False
    return isinstance(mask, BlockMask)


def check_mask(mask, batch: int, heads: int, q_len: int, k_len: int) -> None:
    """A mask is a boolean tensor broadcastable to ``[batch, heads, q_len, k_len]`` (or a
    ``BlockMask``, checked by FlexAttention)."""
    if is_block_mask(mask):
        return
    if not isinstance(mask, torch.Tensor):
        raise TypeError(
            f"mask must be None, a boolean torch.Tensor or a FlexAttention BlockMask, got "
            f"{type(mask).__name__}"
        )
    if mask.dtype != torch.bool:
        raise TypeError(
            f"mask must be a boolean tensor (True: the query may read the key), got {mask.dtype}"
        )
    check_broadcasts("mask", mask, (batch, heads, q_len, k_len))


def row_shifts(q_positions, k_positions, batch: int):
    """Each row's shift ``q_positions[b, 0] - k_positions[b, 0]`` (int64 ``[batch]``) where
    the positions advance by one along every row, else None (one read of the positions)."""
    if q_positions is None and k_positions is None:
        return None
    if q_positions is None or k_positions is None:
        raise ValueError("give both q_positions and k_positions, or neither")
    qp, kp = check_positions(q_positions, k_positions)
    if qp.shape[1] == 0 or kp.shape[1] == 0:
        return None
    steps = torch.cat([qp.diff(dim=1).flatten(), kp.diff(dim=1).flatten()])
    if steps.numel() and not bool((steps == 1).all()):
        return None
    return (qp[:, 0] - kp[:, 0]).expand(batch).contiguous()


def fused_serves(q, k, v, bias, q_positions=None, k_positions=None, mask=None) -> bool:
    """Whether the fused kernel can compute this attention on this path (``"auto"`` asks)."""
    from relbias.attention import fused

    if torch.compiler.is_compiling() or is_block_mask(mask):
        return False
    if q.shape[2] < FUSED_MIN_ROWS and not needs_grad(q, k, v, bias):
        return False
    if any(t.device.type != "cpu" or t.dtype != q.dtype for t in (q, k, v)):
        return False
    if q.dtype not in fused.DTYPES:
        return False
    if isinstance(bias, PreparedBias):
        if q_positions is not None or k_positions is not None:
            return False
        return bias.kernel_inputs(True) is not None
    if not isinstance(bias, RelativeBias) or not (bias.offset_only or isinstance(bias, FIRE)):
        return False
    if q_positions is None and k_positions is None:
        return True
    try:
        return row_shifts(q_positions, k_positions, q.shape[0]) is not None
    except (TypeError, ValueError):
        return False  # the positions' own error is raised where they are read


def _default_positions(q_positions, k_positions, batch, q_len, k_len, q_start, device):
    """The positions, checked against the shape; a missing one is its slots."""
    if q_positions is None:
        q_positions = torch.arange(q_start, q_start + q_len, device=device)[None]
    if k_positions is None:
        k_positions = torch.arange(k_len, device=device)[None]
    q_positions, k_positions = check_positions(q_positions, k_positions)
    for name, t, length in (
        ("q_positions", q_positions, q_len),
        ("k_positions", k_positions, k_len),
    ):
        if t.shape[0] not in (1, batch) or t.shape[1] != length:
            raise ValueError(
                f"{name} must have shape [batch={batch} or 1, {length}], got {tuple(t.shape)}"
            )
        if t.device != device:
            raise ValueError(f"{name} is on {t.device} but q is on {device}")
    return q_positions, k_positions


def positioned_attention(
    q,
    k,
    v,
    bias,
    *,
    backend: str,
    causal: bool,
    q_start: int,
    q_positions=None,
    k_positions=None,
    mask=None,
    return_weights: bool = False,
):
    """The attention of :func:`relbias.biased_attention` on this path (see the module).

    ``q`` is ``[batch, heads, q_len, d]``, ``k`` and ``v`` ``[batch, kv_heads, k_len, ...]``
    (checked by the caller), ``backend`` one of ``"materialize"``, ``"table"``, ``"flex"``,
    ``"fused"`` (chosen by the caller), ``bias`` None, a dense tensor (``"materialize"``
    only), a :class:`~relbias.RelativeBias` or a prepared bias (its own slots: no positions).
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    if mask is not None:
        check_mask(mask, batch, heads, q_len, k_len)
        if is_block_mask(mask) and backend != "flex":
            raise ValueError(
                f"a FlexAttention BlockMask works with backend='flex' only, got backend={backend!r}"
            )
        if is_block_mask(mask) and causal:
            raise ValueError(
                "a BlockMask is the whole mask: build it with the causal rule in its mask_mod "
                "and pass causal=False"
            )
    positioned = q_positions is not None or k_positions is not None
    if positioned and not isinstance(bias, RelativeBias):
        raise TypeError(
            "q_positions and k_positions place a relbias.RelativeBias module; "
            f"a {type(bias).__name__} bias has its positions already (pass the module)"
        )
    q_positions, k_positions = _default_positions(
        q_positions, k_positions, batch, q_len, k_len, q_start, q.device
    )
    if backend == "flex":
        return _flex(q, k, v, bias, q_positions, k_positions, mask, causal, q_start)
    if backend == "fused":
        shifts = None if not positioned else row_shifts(q_positions, k_positions, batch)
        if positioned and shifts is None:
            raise ValueError(
                "backend='fused' takes positions that advance by one along each row (a shift "
                "per row); these do not (packed sequences?): use backend='table', 'flex' or "
                "'materialize' (or 'auto')"
            )
        return _fused(q, k, v, bias, q_positions, shifts, mask, causal, q_start)
    if backend == "table":
        rows_per_block = _block_rows(bias, heads, batch, k_len)
    else:
        rows_per_block = max(q_len, 1)
    blocks = [(s, min(q_len, s + rows_per_block)) for s in range(0, q_len, rows_per_block)]
    outs, weights = [], []
    for start, stop in blocks:
        k_stop = min(k_len, q_start + stop) if causal else k_len
        additive = _block_bias(bias, q_positions, k_positions, start, stop, k_stop, q.dtype)
        seen = _block_seen(mask, causal, q_start, start, stop, k_stop, q.device)
        out = _attend_block(
            q[:, :, start:stop], k[:, :, :k_stop], v[:, :, :k_stop], additive, seen, return_weights
        )
        if return_weights:
            out, w = out
            weights.append(F.pad(w, (0, k_len - k_stop)))
        outs.append(out)
    out = outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)
    if return_weights:
        return out, (weights[0] if len(weights) == 1 else torch.cat(weights, dim=2))
    return out


def _fused(q, k, v, bias, q_positions, shifts, mask, causal, q_start):
    """The fused kernel: one table over every row's offsets, the shifts and mask read inside."""
    from relbias.attention import fused
    from relbias.biases.prepared import FIREBias, OffsetTableBias

    batch, _, q_len, _ = q.shape
    k_len = k.shape[2]
    if isinstance(bias, PreparedBias):
        family, tensors, highest = bias.kernel_inputs(causal)
    elif isinstance(bias, RelativeBias):
        if shifts is None:
            low = high = q_start
        else:
            low, high = (int(x) for x in torch.stack(torch.aminmax(shifts)).tolist())
        # a table of every offset the rows meet: that of queries low .. high + q_len - 1
        width = q_len + high - low
        if isinstance(bias, FIRE):
            part = bias._prepare(width, k_len, low)
            rows = (
                q_positions
                if q_positions is not None
                else torch.arange(q_start, q_start + q_len, device=q.device)[None]
            ).expand(batch, -1)
            with no_autocast(q.device):
                denominator = bias.denominator(rows).contiguous()  # [batch, q_len]
            prepared = FIREBias._unchecked(
                part.psi_table,
                denominator,
                part.w1,
                part.b1,
                part.w2,
                part.b2,
                width,
                k_len,
                low,
            )
            family, tensors, highest = prepared.kernel_inputs(False)  # x bounded by its tables
        else:
            table = bias.offset_table(low - (k_len - 1), high + q_len - 1)
            prepared = OffsetTableBias._unchecked(table, width, k_len, low, bias.bidirectional)
            family, tensors, highest = prepared.kernel_inputs(causal)
    else:
        raise ValueError(f"backend='fused' needs a relbias bias, not {type(bias).__name__}")
    if mask is not None:
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
    return fused.placed_attention(
        q,
        k,
        v,
        family,
        tensors,
        highest,
        q_start=q_start,
        causal=causal,
        starts=shifts,
        mask=mask,
    ).to(q.dtype)


def _block_rows(bias, heads, batch, k_len) -> int:
    rows = batch if isinstance(bias, RelativeBias) else (getattr(bias, "batch", None) or 1)
    return max(16, BLOCK_ENTRIES // max(1, rows * heads * k_len))


def _block_bias(bias, q_positions, k_positions, start, stop, k_stop, dtype):
    """The bias of query rows ``start .. stop-1`` and keys ``0 .. k_stop-1`` (4-D), or None."""
    if bias is None:
        return None
    if isinstance(bias, RelativeBias):
        return bias.at_positions(q_positions[:, start:stop], k_positions[:, :k_stop])
    if isinstance(bias, PreparedBias):
        block = bias.flipped_rows(start, stop, k_stop, False, dtype).flip(2)
        return block if block.dim() == 4 else block[None]
    dense = bias  # a dense tensor, broadcastable to [batch, heads, q_len, k_len]
    while dense.dim() < 4:
        dense = dense.unsqueeze(0)
    rows = dense[:, :, start:stop] if dense.shape[2] > 1 else dense
    return rows[..., :k_stop] if rows.shape[3] > 1 else rows


def _block_seen(mask, causal, q_start, start, stop, k_stop, device):
    """True where query rows ``start .. stop-1`` may read keys ``0 .. k_stop-1`` (4-D), or
    None where every key is seen."""
    seen = None
    if causal:
        i = torch.arange(q_start + start, q_start + stop, device=device)
        seen = visible(i[:, None], torch.arange(k_stop, device=device)[None, :])[None, None]
    if mask is not None:
        while mask.dim() < 4:
            mask = mask.unsqueeze(0)
        rows = mask[:, :, start:stop] if mask.shape[2] > 1 else mask
        rows = rows[..., :k_stop] if rows.shape[3] > 1 else rows
        seen = rows if seen is None else seen & rows
    return seen


def _attend_block(q, k, v, additive, seen, return_weights):
    """Attention of one block: the bias where ``seen``, ``-inf`` elsewhere, zero for a query
    that sees no key; the keys grouped (no copy) where they have fewer heads."""
    grouped = k.shape[1] != q.shape[1]
    if additive is not None:
        additive = additive.to(q.dtype)  # the compute dtype: float32 under autocast
        if seen is not None:
            additive = additive.masked_fill(~seen, float("-inf"))
        mask = additive
    else:
        mask = seen
    if return_weights:
        group = q.shape[1] // k.shape[1]
        qg = q.unflatten(1, (k.shape[1], group))  # [batch, kv_heads, group, rows, d]
        scores = (qg @ k[:, :, None].transpose(-2, -1)).flatten(1, 2) / math.sqrt(q.shape[-1])
        if mask is not None:
            if mask.dtype == torch.bool:
                scores = scores.masked_fill(~mask, float("-inf"))
            else:
                scores = scores + mask
        weights = torch.softmax(scores, dim=-1)
        if seen is not None:
            weights = torch.where(seen.any(-1, keepdim=True), weights, 0.0)
        wg = weights.unflatten(1, (k.shape[1], group))
        return (wg @ v[:, :, None]).flatten(1, 2), weights
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    if seen is not None:
        out = torch.where(seen.any(-1, keepdim=True), out, 0.0)
    return out


def _flex(q, k, v, bias, q_positions, k_positions, mask, causal, q_start):
    """FlexAttention at per-row positions, with the mask as its block mask."""
    from torch.nn.attention.flex_attention import create_block_mask

    if q.dtype not in FLEX_DTYPES:
        raise TypeError(
            f"backend='flex' needs q, k, v in one of {[str(d) for d in FLEX_DTYPES]}, got {q.dtype}"
        )
    if needs_grad(q, k, v, bias) and (q.device.type == "cpu" or isinstance(bias, FIRE)):
        raise RuntimeError(
            "backend='flex' at positions computes no gradients on the CPU (PyTorch has no CPU "
            "backward for FlexAttention) nor for FIRE: use backend='materialize' or "
            "torch.no_grad()"
        )
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    score_mod, mod_key = _score_mod(bias, q_positions, k_positions, batch)
    if mask is None:
        block_mask = causal_block_mask(q_len, k_len, q_start, q.device) if causal else None
    elif is_block_mask(mask):
        block_mask = mask
    else:
        full = mask
        while full.dim() < 4:
            full = full.unsqueeze(0)
        mb, mh = full.shape[0] > 1, full.shape[1] > 1
        full = full.expand(-1, -1, q_len, k_len)

        def mask_mod(b, h, q_idx, kv_idx):
            seen = full[b if mb else 0, h if mh else 0, q_idx, kv_idx]
            return seen & visible(q_idx + q_start, kv_idx) if causal else seen

        block_mask = create_block_mask(
            mask_mod, batch if mb else None, heads if mh else None, q_len, k_len, device=q.device
        )
    key = (
        "positioned",
        str(q.device),
        str(q.dtype),
        tuple(q.shape),
        tuple(k.shape),
        tuple(v.shape),
        mod_key,
        causal,
        q_start,
        torch.is_grad_enabled(),
    )
    _STATS["calls"] += 1
    return timed(_compiled_flex(), key)(
        q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=k.shape[1] != heads
    )


def _score_mod(bias, q_positions, k_positions, batch):
    """FlexAttention's ``score_mod`` for ``bias`` at these positions, and its key."""
    if bias is None:
        return None, None
    if isinstance(bias, PreparedBias):
        return bias.score_mod(), bias.score_mod_key
    if isinstance(bias, torch.Tensor):
        raise ValueError("backend='flex' needs a relbias bias, not a dense tensor")
    qp = q_positions.expand(batch, -1).contiguous()
    kp = k_positions.expand(batch, -1).contiguous()
    q_lo, q_hi = (int(x) for x in torch.stack(torch.aminmax(qp)).tolist())
    k_lo, k_hi = (int(x) for x in torch.stack(torch.aminmax(kp)).tolist())
    low, high = q_lo - k_hi, q_hi - k_lo
    if isinstance(bias, FIRE):
        return _fire_score_mod(bias, qp, kp, low, high), ("fire-positions", bias.hidden)
    if not bias.offset_only:
        raise TypeError(f"backend='flex' cannot place {type(bias).__name__} at positions")
    # The table is padded to a power of two and the lowest offset folded into the query
    # positions, so that a new range of positions reuses the compiled kernel (a table of a
    # new length, or a new int in the closure, would compile it again).
    table = bias.offset_table(low, high)
    table = F.pad(table, (0, _padded(table.shape[-1]) - table.shape[-1]))  # zeros, never read
    qp = qp - low

    def positioned_offset_score_mod(score, b, h, q_idx, kv_idx):
        return score + table[h, qp[b, q_idx] - kp[b, kv_idx]]

    return positioned_offset_score_mod, ("offset-positions",)


def _padded(n: int) -> int:
    """The power of two at or above ``n`` (at least 64): the length of a table that a
    compiled ``score_mod`` reads, so that tables of similar lengths share one kernel."""
    return max(64, 1 << (n - 1).bit_length())


def _fire_score_mod(bias: FIRE, qp, kp, low, high):
    furthest = max(abs(low), abs(high))
    with no_autocast(qp.device):
        dtype = torch.float32
        # psi at every distance up to a power of two past the farthest: a new range of
        # positions reuses the compiled kernel (see _score_mod)
        distances = torch.arange(_padded(furthest + 1), device=qp.device, dtype=dtype)
        psi = bias.psi(distances).to(dtype)
        denominator = bias.denominator(qp).to(dtype)  # [batch, q_len]
    w1 = bias.hidden_layer.weight.to(dtype).reshape(-1)
    b1 = bias.hidden_layer.bias.to(dtype)
    w2 = bias.output_layer.weight.to(dtype)
    b2 = bias.output_layer.bias.to(dtype)
    units = [(w1[u].clone(), b1[u].clone(), w2[:, u].clone()) for u in range(w1.shape[0])]

    def positioned_fire_score_mod(score, b, h, q_idx, kv_idx):
        offset = qp[b, q_idx] - kp[b, kv_idx]
        x = psi[torch.abs(offset)] / denominator[b, q_idx]
        out = b2[h]
        for w1_u, b1_u, w2_u in units:
            out = out + w2_u[h] * torch.relu(x * w1_u + b1_u)
        return score + out

    return positioned_fire_score_mod
