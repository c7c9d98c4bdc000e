r"""Fast ways to apply a relative bias: O(n) tables, strided views and FlexAttention.

:func:`relbias.biased_attention` can add a bias :math:`\mathrm{PE}(i, j)` to the
attention scores in four ways (its ``backend`` argument):

``"materialize"``
    Build the bias ``[heads, q_len, k_len]`` (what every family's ``forward``
    returns) and hand it to ``scaled_dot_product_attention`` as an additive mask.
    Simple and differentiable everywhere, but it costs ``heads * q_len * k_len``
    floats: 8.6 GB for 8 heads at n = 16,384.

``"table"``
    For a family that depends on the offset ``i - j`` alone, the whole bias is a
    Toeplitz matrix read from a table of ``q_len + k_len - 1`` values per head
    (:class:`OffsetTableBias`). Reversing the order of the query rows turns it into
    a Hankel matrix, which *is* a strided view of the reversed table (strides
    ``(1, 1)``, no copy): PyTorch's fused CPU attention kernel reads that view as
    its mask. Causal attention runs in blocks of query rows, each against the keys
    it can see, with ``-inf`` in the table for future keys; long sequences run in
    tiles that split each block's past keys from its causal triangle and join the
    two by their log-sum-exp, so that no score above the diagonal is computed in
    vain. FIRE, which also depends on the absolute query position, is evaluated
    block by block instead (:class:`FIREBias`), so that no ``q_len x k_len`` tensor
    exists at once; hidden units of its MLP that do not switch on the inputs met
    are folded into one linear term first.

``"flex"``
    Compute the bias inside the attention kernel with FlexAttention's
    ``score_mod``: an offset-only family looks its value up in the O(n) table,
    FIRE evaluates its MLP for each score. Causal attention uses a block mask, so
    blocks above the diagonal are skipped. The kernel is compiled once per shape
    (:func:`compile_stats` counts compilations and their time); on the CPU it runs
    forward only (PyTorch has no CPU backward for FlexAttention).

``"fused"``
    relbias's own C++ CPU kernel (:mod:`relbias.attention.fused`): the bias added to each block of
    scores inside a flash-style loop, from the same O(n) ingredients (float32, forward
    only, built on first use).

:func:`prepare_bias` turns a :class:`~relbias.RelativeBias` into the O(n)
ingredients of one attention shape. Pass the result to ``biased_attention`` in
place of the module to compute it once and share it across layers; it carries
gradients to the module's parameters.
"""

from __future__ import annotations

import math
import threading
import time
from collections import OrderedDict

import torch
from torch.nn import functional as F

from relbias._checks import check_int, check_lengths
from relbias.biases.base import RelativeBias
from relbias.biases.positions import relative_positions

__all__ = [
    "FIREBias",
    "FLEX_DTYPES",
    "OffsetTableBias",
    "PreparedBias",
    "causal_block_mask",
    "clear_cache",
    "compile_stats",
    "default_block_rows",
    "flex_attention_with_bias",
    "last_backend",
    "prepare_bias",
    "table_attention",
]

#: dtypes FlexAttention accepts (on the CPU: float32, bfloat16, float16).
FLEX_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

#: FlexAttention's block size in both directions (its default).
BLOCK_SIZE = 128


# ---------------------------------------------------------------------------------
# Prepared biases: the O(n) ingredients of one attention shape
# ---------------------------------------------------------------------------------
class PreparedBias:
    """The bias of one attention shape ``(q_len, k_len, q_start)``, ready for any backend.

    Build it with :func:`prepare_bias`. It is computed once (its tensors keep their
    autograd history, so gradients reach the module's parameters) and can be passed
    as ``bias`` to :func:`relbias.biased_attention` in every layer that shares it.
    """

    kind = "prepared"

    def __init__(self, num_heads, q_len, k_len, q_start, bidirectional):
        self.num_heads = num_heads
        self.q_len, self.k_len, self.q_start = q_len, k_len, q_start
        self.bidirectional = bidirectional
        self._dense = None
        self._backend_inputs = {}  # per backend: what it derived from this bias, kept

    # -- interface of the subclasses --------------------------------------------------
    def _tensors(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def _dense_bias(self) -> torch.Tensor:
        raise NotImplementedError

    def score_mod(self):
        """A FlexAttention ``score_mod`` adding this bias to a score."""
        raise NotImplementedError

    def flipped_rows(self, start: int, stop: int, k_stop: int, causal: bool, dtype):
        """The bias of query rows ``stop-1, ..., start`` (reversed) and keys ``0 .. k_stop-1``.

        Returned as ``[1, heads, stop - start, k_stop]`` in ``dtype``, with ``-inf``
        for future keys when ``causal``: the mask of one block of :func:`table_attention`.
        """
        raise NotImplementedError

    # -- shared --------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._tensors()[0].device

    @property
    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in self._tensors())

    def materialize(self) -> torch.Tensor:
        """The dense bias ``[heads, q_len, k_len]``, computed on first use and kept.

        Equal to what the family's ``forward`` returns for the same shape.
        """
        if self._dense is None or (
            torch.is_grad_enabled() and self.requires_grad and not self._dense.requires_grad
        ):
            self._dense = self._dense_bias()
        return self._dense

    def check_shape(self, heads: int, q_len: int, k_len: int, q_start: int, causal: bool):
        if heads != self.num_heads:
            raise ValueError(f"bias has num_heads={self.num_heads} but q has {heads} heads")
        if (q_len, k_len, q_start) != (self.q_len, self.k_len, self.q_start):
            raise ValueError(
                f"bias was prepared for (q_len, k_len, q_start) = "
                f"{(self.q_len, self.k_len, self.q_start)}, but attention has "
                f"{(q_len, k_len, q_start)}"
            )
        if not causal and not self.bidirectional:
            raise ValueError(
                "bias was prepared from a causal family (bidirectional=False); "
                "build it with bidirectional=True for causal=False attention"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(num_heads={self.num_heads}, q_len={self.q_len}, "
            f"k_len={self.k_len}, q_start={self.q_start})"
        )


def _reversed_hankel(table: torch.Tensor, q_len, start, stop, k_stop, k_start=0) -> torch.Tensor:
    """Rows ``stop-1 .. start`` (reversed) and keys ``k_start .. k_stop-1`` of a Toeplitz bias.

    ``table`` holds offsets ``lo .. hi`` (``hi = q_start + q_len - 1``) in *reversed*
    order, ``table[:, m]`` = offset ``hi - m``. Reversed row ``r`` is query
    ``stop - 1 - r``, so entry ``(r, j)`` (key ``k_start + j``) has offset
    ``hi - (q_len - stop + k_start + r + j)``: a view with strides ``(1, 1)`` into the
    table, no copy.
    """
    heads = table.shape[0]
    return table.as_strided(
        (1, heads, stop - start, k_stop - k_start),
        (0, table.stride(0), 1, 1),
        storage_offset=table.storage_offset() + q_len - stop + k_start,
    )


class OffsetTableBias(PreparedBias):
    """An offset-only bias as its table of ``q_len + k_len - 1`` values per head.

    ``table[:, t]`` is PE for the offset ``lowest + t`` with
    ``lowest = q_start - (k_len - 1)``, up to ``q_start + q_len - 1``: every offset
    that a ``q_len x k_len`` attention meets. Build it from a module with
    :func:`prepare_bias`, or from any table of that shape.
    """

    kind = "offset"

    def __init__(self, table, q_len, k_len=None, *, q_start=None, bidirectional=False):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        if not isinstance(table, torch.Tensor) or table.dim() != 2:
            raise TypeError("table must be a 2-D tensor [num_heads, q_len + k_len - 1]")
        if table.shape[1] != max(q_len + k_len - 1, 0):
            raise ValueError(
                f"table must have q_len + k_len - 1 = {q_len + k_len - 1} columns, "
                f"got {table.shape[1]}"
            )
        super().__init__(table.shape[0], q_len, k_len, q_start, bidirectional)
        self.table = table
        self._flipped = {}

    @classmethod
    def from_module(cls, module: RelativeBias, q_len, k_len=None, *, q_start=None):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        lowest = q_start - (k_len - 1)
        table = module.offset_table(lowest, q_start + q_len - 1)
        return cls(table, q_len, k_len, q_start=q_start, bidirectional=module.bidirectional)

    @property
    def lowest(self) -> int:
        """The offset of ``table[:, 0]``."""
        return self.q_start - (self.k_len - 1)

    def _tensors(self):
        return (self.table,)

    def _dense_bias(self):
        index = (
            relative_positions(
                self.q_len, self.k_len, q_start=self.q_start, device=self.table.device
            )
            - self.lowest
        )
        return self.table[:, index]

    def score_mod(self):
        table, shift = self.table, self.k_len - 1

        def offset_score_mod(score, b, h, q_idx, kv_idx):
            # offset (q_start + q_idx) - kv_idx sits at column offset - lowest
            return score + table[h, q_idx - kv_idx + shift]

        return offset_score_mod

    def _reversed_table(self, causal: bool, dtype) -> torch.Tensor:
        key = (causal, dtype, torch.is_grad_enabled())
        if key not in self._flipped:
            table = self.table.to(dtype)
            if causal and self.lowest < 0:
                future = torch.arange(table.shape[1], device=table.device) < -self.lowest
                table = table.masked_fill(future, float("-inf"))
            self._flipped[key] = table.flip(1).contiguous()
        return self._flipped[key]

    def flipped_rows(self, start, stop, k_stop, causal, dtype):
        table = self._reversed_table(causal, dtype)
        return _reversed_hankel(table, self.q_len, start, stop, k_stop)


class FIREBias(PreparedBias):
    r"""FIRE's bias for one shape: the O(n) pieces of :math:`f_\theta(\psi(|i-j|)/\psi(\max(L,i)))`.

    ``psi_table[t]`` is :math:`\psi(|\text{offset}|)` for the offsets of
    :class:`OffsetTableBias`, ``denominator[r]`` is :math:`\psi(\max(L, i)) + \epsilon`
    for query row ``r`` at absolute position ``i = q_start + r``, and the MLP weights
    ``w1, b1`` (``[hidden]``) and ``w2`` (``[heads, hidden]``), ``b2`` (``[heads]``).
    """

    kind = "fire"

    def __init__(self, psi_table, denominator, w1, b1, w2, b2, q_len, k_len=None, *, q_start=None):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        super().__init__(w2.shape[0], q_len, k_len, q_start, True)
        self.psi_table, self.denominator = psi_table, denominator
        self.w1, self.b1, self.w2, self.b2 = w1, b1, w2, b2
        self.hidden = w1.shape[0]
        self._aux = {}

    @classmethod
    def from_module(cls, module, q_len, k_len=None, *, q_start=None):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        dtype = module.c.dtype if module.c.dtype == torch.float64 else torch.float32
        device = module.device
        offsets = torch.arange(q_start - (k_len - 1), q_start + q_len, device=device)
        psi_table = module.psi(offsets.abs().to(dtype))
        i = torch.arange(q_start, q_start + q_len, device=device, dtype=dtype)
        threshold = torch.maximum(i, module.L.to(dtype))
        denominator = module.psi(threshold) + module.eps
        w1 = module.hidden_layer.weight.to(dtype).reshape(-1)
        b1 = module.hidden_layer.bias.to(dtype)
        w2 = module.output_layer.weight.to(dtype)
        b2 = module.output_layer.bias.to(dtype)
        return cls(psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start=q_start)

    def _tensors(self):
        return (self.psi_table, self.denominator, self.w1, self.b1, self.w2, self.b2)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """f_theta on ``x [...]`` -> ``[heads, ...]``, as FIRE.mlp computes it."""
        hidden = torch.relu(F.linear(x[..., None], self.w1[:, None], self.b1))
        return F.linear(hidden, self.w2, self.b2).movedim(-1, 0)

    def _dense_bias(self):
        index = relative_positions(
            self.q_len, self.k_len, q_start=self.q_start, device=self.psi_table.device
        ) - (self.q_start - (self.k_len - 1))
        x = self.psi_table[index] / self.denominator[:, None]
        return self._mlp(x)

    def score_mod(self):
        psi_table, denominator = self.psi_table, self.denominator
        w1, b1, w2, b2 = self.w1, self.b1, self.w2, self.b2
        shift, hidden = self.k_len - 1, self.hidden

        def fire_score_mod(score, b, h, q_idx, kv_idx):
            x = psi_table[q_idx - kv_idx + shift] / denominator[q_idx]
            out = b2[h]
            for u in range(hidden):  # unrolled when compiled: the MLP runs in registers
                out = out + w2[h, u] * torch.relu(x * w1[u] + b1[u])
            return score + out

        return fire_score_mod

    def _reversed(self, causal: bool, dtype):
        key = (causal, dtype, torch.is_grad_enabled())
        if key not in self._aux:
            psi = self.psi_table.flip(0).contiguous()
            lowest = self.q_start - (self.k_len - 1)
            offsets = torch.arange(lowest + psi.shape[0] - 1, lowest - 1, -1, device=psi.device)
            future = torch.zeros(offsets.shape, dtype=dtype, device=psi.device)
            if causal:
                future = future.masked_fill(offsets < 0, float("-inf"))
            self._aux[key] = (psi, future)
        return self._aux[key]

    def flipped_rows(self, start, stop, k_stop, causal, dtype):
        psi, future = self._reversed(causal, dtype)
        x_num = _reversed_hankel(psi[None], self.q_len, start, stop, k_stop)[0, 0]
        fut = _reversed_hankel(future[None], self.q_len, start, stop, k_stop)[0, 0]
        den = self.denominator[start:stop].flip(0)
        if _use_fused_fire(self, dtype):
            w1, b1, w2, slope, intercept = self.folded_mlp(causal)
            fused = _timed(_fused_fire_block(), ("fire_block", self.num_heads, w1.shape[0]))
            bias = fused(x_num, fut, den, w1, b1, w2, slope, intercept)
            return bias.to(dtype)[None]
        bias = self._mlp(x_num / den[:, None]).to(dtype)
        return (bias + fut if causal else bias)[None]

    def folded_mlp(self, causal: bool):
        r"""The MLP with every hidden unit that does not switch on the inputs folded away.

        A hidden unit :math:`\mathrm{relu}(w_u x + b_u)` whose sign does not change
        for :math:`x` in :math:`[0, x_{\max}]` is either zero there (dropped) or linear
        (added into ``slope * x + intercept``). Causal attention meets
        :math:`x \le 1` (:math:`|i - j| \le i \le \max(L, i)`); bidirectional
        attention the largest value of its tables. Returns ``(w1, b1, w2, slope,
        intercept)`` for the switching units: the same function, fewer units.
        """
        key = ("folded", causal)
        if key not in self._aux:
            x_max = 1.0 if causal else float(self.psi_table.max() / self.denominator.min())
            at_zero, at_max = self.b1, self.w1 * x_max + self.b1
            linear = (at_zero >= 0) & (at_max >= 0)
            switching = ~linear & ~((at_zero <= 0) & (at_max <= 0))
            slope = self.w2[:, linear] @ self.w1[linear]
            intercept = self.b2 + self.w2[:, linear] @ self.b1[linear]
            self._aux[key] = (
                self.w1[switching],
                self.b1[switching],
                self.w2[:, switching],
                slope,
                intercept,
            )
        return self._aux[key]


def _fire_block(x_num, future, den, w1, b1, w2, slope, intercept):
    """FIRE's bias for a block of rows in one pass: ``[heads, rows, keys]``.

    ``w1, b1, w2, slope, intercept`` come from :meth:`FIREBias.folded_mlp`. The hidden
    unit ``u`` is computed once per score and shared by all heads (the heads are
    separate outputs of one loop, which the compiler fuses).
    """
    x = x_num / den[:, None]
    outs = [future + (x * slope[h] + intercept[h]) for h in range(w2.shape[0])]
    for u in range(w1.shape[0]):
        hidden = torch.relu(x * w1[u] + b1[u])
        outs = [out + w2[h, u] * hidden for h, out in enumerate(outs)]
    return torch.stack(outs)


_FUSED_FIRE = []
#: Evaluate FIRE's block bias with a compiled, fused kernel on the CPU (no gradients).
FUSE_FIRE = True


def _use_fused_fire(bias, dtype) -> bool:
    if not FUSE_FIRE or bias.psi_table.dtype != torch.float32 or bias.device.type != "cpu":
        return False
    return not (torch.is_grad_enabled() and bias.requires_grad)


def _fused_fire_block():
    if not _FUSED_FIRE:
        _FUSED_FIRE.append(torch.compile(_fire_block, dynamic=True))
    return _FUSED_FIRE[0]


def _timed(fn, key):
    """Call ``fn``, recording the first call per ``key`` as a compilation."""

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(recompile_limit=1024, accumulated_recompile_limit=4096):
            if key in _COMPILE_TIMES:
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        _COMPILE_TIMES[key] = seconds
        _STATS["compiles"] += 1
        _STATS["compile_seconds"] += seconds
        return out

    return call


def prepare_bias(bias: RelativeBias, q_len, k_len=None, *, q_start=None) -> PreparedBias:
    """Compute the O(n) ingredients of ``bias`` for one attention shape.

    Returns an :class:`OffsetTableBias` for a family that depends on ``i - j`` alone
    and a :class:`FIREBias` for FIRE. Pass it as ``bias`` to
    :func:`relbias.biased_attention` (in every layer that shares the bias): the
    module runs once, and gradients still reach its parameters.
    """
    if isinstance(bias, PreparedBias):
        return bias
    if not isinstance(bias, RelativeBias):
        raise TypeError(f"bias must be a relbias.RelativeBias, got {type(bias).__name__}")
    if bias.offset_only:
        return OffsetTableBias.from_module(bias, q_len, k_len, q_start=q_start)
    from relbias.biases.fire import FIRE

    if isinstance(bias, FIRE):
        return FIREBias.from_module(bias, q_len, k_len, q_start=q_start)
    raise TypeError(
        f"{type(bias).__name__} depends on absolute positions and has no prepared form; "
        "use backend='materialize'"
    )


# ---------------------------------------------------------------------------------
# Backend 2: the O(n) table as a strided mask of the fused SDPA kernel
# ---------------------------------------------------------------------------------
#: Causal :func:`table_attention` runs in about this many blocks of query rows (each
#: block skips the keys after its last query; more blocks skip more but cost more calls).
TABLE_BLOCKS = 5
#: ... and blocks have at least this many rows.
TABLE_MIN_BLOCK_ROWS = 256
#: Up to this many scores (q_len x k_len), table_attention favours few operations over
#: memory (on a busy CPU every parallel operation waits for a free core).
SMALL_ATTENTION = 4096 * 4096
#: At most this many bias entries (heads x rows x keys) per block for FIRE.
FIRE_BLOCK_ENTRIES = 1 << 23
#: Causal self-attention with an offset-only bias (float32 on the CPU, no gradients)
#: runs in tiles of ``TILE_ROWS`` query rows: see :func:`_tiled_table_attention`.
TILE_ROWS = 1024
#: ... each tile's own causal triangle in strips of ``STRIP_ROWS`` rows, and up to
#: ``TILE_GROUP_ROWS`` rows at once (a few copies of that many rows is the extra memory).
STRIP_ROWS = 256
TILE_GROUP_ROWS = 4096

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def table_attention(q, k, v, bias: PreparedBias, *, causal=True, block_rows=None):
    """Attention with ``bias`` added through a strided mask, no ``q_len x k_len`` tensor.

    ``q`` is ``[batch, heads, q_len, head_dim]``; the query rows run in reversed order
    so that an offset-only bias is a zero-copy view of its table (see the module
    docstring). Causal attention runs in blocks of ``block_rows`` query rows, each
    against the keys it can see; long causal self-attention with an offset-only bias
    runs in tiles instead (:func:`_tiled_table_attention`). Equal to the materialised
    path within float rounding.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    bias.check_shape(heads, q_len, k_len, bias.q_start, causal)
    out, tiled = None, 0
    if block_rows is None and _tiles_apply(q, k, v, bias, causal):
        out = q.new_empty(batch, heads, q_len, v.shape[-1])
        tiled = _tiled_table_attention(q, k, v, bias, out)
        block_rows = STRIP_ROWS  # the rows after the last whole tile
    if block_rows is None:
        block_rows = default_block_rows(bias, causal)
    block_rows = check_int("block_rows", block_rows, minimum=1)
    blocks = [(start, min(q_len, start + block_rows)) for start in range(tiled, q_len, block_rows)]

    def block(rows, start, stop):  # rows: the queries start..stop-1 in reversed order
        k_stop = min(k_len, bias.q_start + stop) if causal else k_len
        mask = bias.flipped_rows(start, stop, k_stop, causal, q.dtype)
        return F.scaled_dot_product_attention(
            rows, k[:, :, :k_stop], v[:, :, :k_stop], attn_mask=mask
        )

    if out is None and q_len * k_len <= SMALL_ATTENTION:
        # Few large operations (each one a parallel region): reverse q once, join the
        # blocks once, reverse the output once.
        reversed_q = q.flip(2)
        pieces = [
            block(reversed_q[:, :, q_len - stop : q_len - start], start, stop)
            for start, stop in blocks
        ]
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces[::-1], dim=2)
        del pieces
        return joined.flip(2)
    # Long sequences: the least memory, one block of rows at a time.
    if out is None:
        out = q.new_empty(batch, heads, q_len, v.shape[-1])
    for start, stop in blocks:
        out[:, :, start:stop] = block(q[:, :, start:stop].flip(2), start, stop).flip(2)
    return out


def default_block_rows(bias: PreparedBias, causal: bool = True) -> int:
    """The rows per block that :func:`table_attention` takes when it uses blocks."""
    if bias.kind == "fire":
        return max(16, FIRE_BLOCK_ENTRIES // max(1, bias.num_heads * bias.k_len))
    if not causal:
        return bias.q_len
    return max(TABLE_MIN_BLOCK_ROWS, math.ceil(bias.q_len / TABLE_BLOCKS))


def _tiles_apply(q, k, v, bias, causal) -> bool:
    """Whether :func:`_tiled_table_attention` can compute (part of) this attention."""
    return (
        causal
        and bias.kind == "offset"
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and k.dtype == v.dtype == torch.float32
        and q.shape[-1] == v.shape[-1]
        and bias.k_len == bias.q_start + bias.q_len
        and bias.q_len >= TILE_ROWS
        and TILE_ROWS % STRIP_ROWS == 0
        and not (torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, bias.table)))
    )


def _tiled_table_attention(q, k, v, bias: OffsetTableBias, out: torch.Tensor) -> int:
    """Causal attention of the first ``q_len // TILE_ROWS`` tiles of query rows, into ``out``.

    Returns the number of rows done.

    Blocks of rows with ``-inf`` for future keys compute, and throw away, the upper
    half of every block's diagonal square. Tiles waste no more than the kernel's own
    causal shortcut: a tile meets the keys before it in one call (every one of them
    visible), and its own causal triangle in strips of ``STRIP_ROWS`` rows; the
    triangle's bias is the same in every tile, so one call runs a strip of several
    tiles. The fused kernel returns each part's log-sum-exp, which weighs the two
    parts: ``lerp(triangle, past, sigmoid(lse_past - lse_triangle))``. Query rows run
    reversed within each tile (a Hankel mask), ``TILE_GROUP_ROWS`` rows at a time, in
    buffers kept between calls.
    """
    batch, heads, q_len, dim = q.shape
    tile, strip = TILE_ROWS, STRIP_ROWS
    table = bias._reversed_table(True, q.dtype)  # offsets in reversed order, -inf < 0

    def by_tile(x):  # [batch, heads, tiles, ...] -> [batch * tiles, heads, ...]
        return x.transpose(1, 2).flatten(0, 1)

    def from_tiles(x, tiles):
        return x.unflatten(0, (batch, tiles)).transpose(1, 2)

    all_rows, group = q_len // tile * tile, max(1, TILE_GROUP_ROWS // tile) * tile
    for start in range(0, all_rows, group):
        stop = min(all_rows, start + group)
        tiles, first_key = (stop - start) // tile, bias.q_start + start
        rows = torch.arange(stop - 1, start - 1, -1, device=q.device).view(tiles, tile).flip(0)
        reversed_q = _workspace("q", (batch, heads, stop - start, dim), q)
        torch.index_select(q, 2, rows.flatten(), out=reversed_q)
        reversed_q = reversed_q.unflatten(2, (tiles, tile))
        keys, values = (
            x[:, :, first_key : first_key + stop - start].unflatten(2, (tiles, tile))
            for x in (k, v)
        )
        group_out = _workspace("out", (batch, heads, tiles, tile, dim), q)
        lse = q.new_empty(batch, heads, tiles, tile)
        for s in range(tile // strip):  # strip s: rows s*strip .. (s+1)*strip-1 of a tile
            lo, hi, width = tile - (s + 1) * strip, tile - s * strip, (s + 1) * strip
            # the mask of the group's first tile, the same in every tile
            mask = _reversed_hankel(
                table,
                q_len,
                start + s * strip,
                start + (s + 1) * strip,
                first_key + width,
                k_start=first_key,
            )
            o, log_sum = _flash_cpu(
                by_tile(reversed_q[:, :, :, lo:hi]),
                by_tile(keys[:, :, :, :width]),
                by_tile(values[:, :, :, :width]),
                0.0,
                False,
                attn_mask=mask,
            )
            group_out[:, :, :, lo:hi] = from_tiles(o, tiles)
            lse[:, :, :, lo:hi] = from_tiles(log_sum, tiles)
        for t in range(tiles):  # every key before tile t: offsets from 1 up, all visible
            past = first_key + t * tile
            if past > 0:
                mask = _reversed_hankel(
                    table, q_len, start + t * tile, start + (t + 1) * tile, past
                )
                o, log_sum = _flash_cpu(
                    reversed_q[:, :, t], k[:, :, :past], v[:, :, :past], 0.0, False, attn_mask=mask
                )
                group_out[:, :, t].lerp_(o, torch.sigmoid(log_sum - lse[:, :, t])[..., None])
        out.index_copy_(2, rows.flatten(), group_out.flatten(2, 3))  # rows back in order
    return all_rows


_WORKSPACE = threading.local()
#: Buffers ``_workspace`` keeps per thread (the latest shapes).
WORKSPACE_BUFFERS = 4


def _workspace(name: str, shape, like: torch.Tensor) -> torch.Tensor:
    """A buffer kept between calls of this thread, for the latest few shapes.

    Memory that the allocator has just returned to the system page-faults on first use;
    keeping the tiles' two group-sized buffers saves that on every call.
    """
    buffers = _WORKSPACE.__dict__.setdefault("buffers", OrderedDict())
    key = (name, tuple(shape), like.dtype, like.device)
    if key not in buffers:
        buffers[key] = like.new_empty(shape)
        while len(buffers) > WORKSPACE_BUFFERS:
            buffers.popitem(last=False)
    buffers.move_to_end(key)
    return buffers[key]


# ---------------------------------------------------------------------------------
# Backend 3: FlexAttention, compiled once per shape
# ---------------------------------------------------------------------------------
_STATS = {"compiles": 0, "compile_seconds": 0.0, "calls": 0}
_COMPILE_TIMES: OrderedDict = OrderedDict()
_BLOCK_MASKS: OrderedDict = OrderedDict()
_MAX_BLOCK_MASKS = 64
_COMPILED = None
_LAST_BACKEND: list = [None]


def _set_last_backend(name: str) -> None:
    _LAST_BACKEND[0] = name


def last_backend() -> str | None:
    """The backend the most recent :func:`relbias.biased_attention` call took."""
    return _LAST_BACKEND[0]


def compile_stats() -> dict:
    """Compilations of the FlexAttention kernel so far, and their cost.

    ``compiles``: distinct kernels compiled (one per shape, dtype, family kind and
    mask); ``compile_seconds``: the wall time of their first calls (compilation plus
    one run); ``calls``: FlexAttention calls in all; ``per_key``: seconds per kernel.
    """
    return {**_STATS, "per_key": dict(_COMPILE_TIMES)}


def clear_cache() -> None:
    """Forget the cached block masks and the compile accounting (not dynamo's cache)."""
    _BLOCK_MASKS.clear()
    _COMPILE_TIMES.clear()
    _STATS.update(compiles=0, compile_seconds=0.0, calls=0)


def _compiled_flex():
    global _COMPILED
    if _COMPILED is None:
        from torch.nn.attention.flex_attention import flex_attention

        _COMPILED = torch.compile(flex_attention, dynamic=False)
    return _COMPILED


def _causal_mask_mod(q_start: int):
    def causal_mask(b, h, q_idx, kv_idx):
        return q_idx + q_start >= kv_idx

    return causal_mask


def causal_block_mask(q_len, k_len, q_start, device, block_size=BLOCK_SIZE):
    """FlexAttention's block mask for causal attention of queries at ``q_start ..``.

    Built from block coordinates (O((n/block)^2) integers), not by evaluating the
    mask at all ``q_len x k_len`` points; cached per shape.
    """
    from torch.nn.attention.flex_attention import BlockMask

    device = torch.device(device)
    key = (q_len, k_len, q_start, str(device), block_size)
    if key in _BLOCK_MASKS:
        _BLOCK_MASKS.move_to_end(key)
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
    while len(_BLOCK_MASKS) > _MAX_BLOCK_MASKS:
        _BLOCK_MASKS.popitem(last=False)
    return mask


def flex_attention_with_bias(q, k, v, bias: PreparedBias | None, *, causal=True, q_start=None):
    """FlexAttention with ``bias`` computed inside the kernel (``score_mod``).

    The kernel is compiled on the first call with a new shape (counted by
    :func:`compile_stats`) and reused after that.
    """
    if q.dtype not in FLEX_DTYPES:
        raise TypeError(
            f"backend='flex' needs q, k, v in one of {[str(d) for d in FLEX_DTYPES]}, got {q.dtype}"
        )
    if (
        q.device.type == "cpu"
        and torch.is_grad_enabled()
        and (any(t.requires_grad for t in (q, k, v)) or (bias is not None and bias.requires_grad))
    ):
        raise RuntimeError(
            "backend='flex' cannot compute gradients on the CPU (PyTorch has no CPU "
            "backward for FlexAttention): use backend='materialize' or torch.no_grad()"
        )
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
    if bias is not None:
        bias.check_shape(heads, q_len, k_len, q_start, causal)
    block_mask = causal_block_mask(q_len, k_len, q_start, q.device) if causal else None
    score_mod = None if bias is None else bias.score_mod()
    key = (
        str(q.device),
        str(q.dtype),
        tuple(q.shape),
        tuple(k.shape),
        tuple(v.shape),
        None if bias is None else (bias.kind, getattr(bias, "hidden", None)),
        causal,
        q_start if causal else None,
        torch.is_grad_enabled(),
    )
    _STATS["calls"] += 1
    call = _timed(_compiled_flex(), key)
    return call(q, k, v, score_mod=score_mod, block_mask=block_mask)
