r"""Prepared biases: the O(n) ingredients of one attention shape, ready for any backend.

:meth:`relbias.RelativeBias.prepare` turns a bias module into a :class:`PreparedBias`
for one shape ``(q_len, k_len, q_start)``: an :class:`OffsetTableBias` (the table of
the ``q_len + k_len - 1`` offsets the shape meets) for a family that depends on
``i - j`` alone, a :class:`FIREBias` for FIRE; the Forgetting Transformer's gate
(:meth:`relbias.ForgettingGate.prepare`, from the layer input) gives a
:class:`ForgettingBias`, one per sequence. Pass it to
:func:`relbias.biased_attention` in place of the module to compute it once and share
it across layers; it carries gradients to the module's parameters.

The backends read it through public methods only: :meth:`PreparedBias.materialize`
(the dense bias), :meth:`~PreparedBias.flipped_rows` (a block of the table path,
:mod:`relbias.attention.table`), :meth:`~PreparedBias.score_mod` (FlexAttention,
:mod:`relbias.attention.flex`) and :meth:`~PreparedBias.kernel_inputs` (the fused C++
kernel, :mod:`relbias.attention.fused`).

Reversing the order of the query rows turns a Toeplitz bias into a Hankel matrix, which
*is* a strided view of the reversed table (:func:`reversed_hankel`, no copy). FIRE's
block bias folds the hidden units of its MLP that do not switch on the inputs met into
one linear term first (:meth:`FIREBias.folded_mlp`).
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from relbias._cache import LRUCache
from relbias._checks import check_bool, check_lengths, no_autocast
from relbias._compile import timed
from relbias.biases.fire_block import fused_fire_applies, fused_fire_block
from relbias.biases.positions import relative_positions, take_columns

__all__ = [
    "FIREBias",
    "ForgettingBias",
    "OffsetTableBias",
    "PreparedBias",
    "fire_mlp",
    "prepare_bias",
    "reversed_hankel",
    "visible",
]


def visible(query_position, key_position):
    """Causal attention's one rule: query ``i`` sees key ``j`` when ``j <= i``.

    Works on integers and on tensors (broadcast), so that the dense mask, the offset
    tables and FlexAttention's ``mask_mod`` all ask it.
    """
    return key_position <= query_position


class PreparedBias:
    """The bias of one attention shape ``(q_len, k_len, q_start)``, ready for any backend.

    Build it with :meth:`relbias.RelativeBias.prepare`. It is computed once (its tensors
    keep their autograd history, so gradients reach the module's parameters) and can be
    passed as ``bias`` to :func:`relbias.biased_attention` in every layer that shares it.
    """

    #: Whether the bias depends on the offset ``i - j`` alone (then :meth:`reversed_table`
    #: exists and a block of the table path is a view of it, no copy).
    offset_only = False
    #: The batch size the bias was computed for (a data-dependent bias: one per sequence),
    #: or None for a bias shared by every sequence of a batch.
    batch = None
    #: The pieces a prepared bias keeps for the backends (its tables in a dtype, the kernel's
    #: inputs, per grad mode): at most this many, the latest.
    KEPT_PIECES = 8

    def __init__(self, num_heads, q_len, k_len, q_start, bidirectional):
        self.num_heads = num_heads
        self.q_len, self.k_len, self.q_start = q_len, k_len, q_start
        self.bidirectional = bidirectional
        self._dense = None
        self._pieces = LRUCache(self.KEPT_PIECES)

    # -- interface of the subclasses --------------------------------------------------
    def _tensors(self) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def _dense_bias(self) -> torch.Tensor:
        raise NotImplementedError

    @property
    def score_mod_key(self) -> tuple:
        """What the code of :meth:`score_mod` depends on (one compiled kernel per key)."""
        raise NotImplementedError

    def score_mod(self):
        """A FlexAttention ``score_mod`` adding this bias to a score."""
        raise NotImplementedError

    #: Whether FlexAttention's backward compiles this ``score_mod`` (measured on a GPU).
    score_mod_trainable = True

    def flipped_rows(
        self, start: int, stop: int, k_stop: int, causal: bool, dtype, *, compiled: bool = True
    ):
        """The bias of query rows ``stop-1, ..., start`` (reversed) and keys ``0 .. k_stop-1``.

        Returned as ``[1, heads, stop - start, k_stop]`` (``[batch, ...]`` for a
        data-dependent bias) in ``dtype``, with ``-inf``
        for future keys when ``causal``: the mask of one block of
        :func:`relbias.attention.table.table_attention`. ``compiled``: a bias whose block
        is computed (FIRE) may use its compiled block kernel (on the CPU, without gradients);
        False keeps to eager PyTorch.
        """
        raise NotImplementedError

    def reversed_table(self, causal: bool, dtype) -> torch.Tensor:
        """The table ``[heads, q_len + k_len - 1]`` in reversed offset order (offset-only)."""
        raise TypeError(f"{type(self).__name__} depends on more than the offset: no table")

    def kernel_inputs(self, causal: bool) -> tuple[str, tuple, int] | None:
        """What the fused C++ kernel reads: ``(family, tensors, highest offset)``, or None.

        The fused backend calls ``torch.ops.relbias_fused.<family>_forward(q, k, v,
        tensors[0], highest, *tensors[1:], q_start, causal, q_block, kv_block)`` and the
        matching ``_backward``, which returns a gradient for each of ``tensors`` (or for the
        first few: the others carry none, as the forget gate's ``hi``). The
        tensors keep their autograd history (when grad mode is on), so those gradients
        reach the module's parameters. Computed once per ``causal`` and grad mode, and
        kept (among :data:`KEPT_PIECES`). None: no fused kernel for this bias.
        """
        return None

    # -- shared --------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self._tensors()[0].device

    @property
    def requires_grad(self) -> bool:
        return any(t.requires_grad for t in self._tensors())

    def prepare(self, q_len, k_len=None, *, q_start=None) -> PreparedBias:
        """Itself, when prepared for this shape (else ``ValueError``): a prepared bias
        stands wherever a module's :meth:`~relbias.RelativeBias.prepare` is called."""
        shape = check_lengths(q_len, k_len, q_start)
        if shape != (self.q_len, self.k_len, self.q_start):
            raise ValueError(
                f"bias was prepared for (q_len, k_len, q_start) = "
                f"{(self.q_len, self.k_len, self.q_start)}, not {shape}"
            )
        return self

    def materialize(self) -> torch.Tensor:
        """The dense bias ``[heads, q_len, k_len]`` (``[batch, heads, q_len, k_len]`` for a
        data-dependent bias), computed on first use and kept.

        Equal to what the family's ``forward`` returns for the same shape (in float32,
        or float64, whatever autocast the caller runs under).
        """
        if self._dense is None or (
            torch.is_grad_enabled() and self.requires_grad and not self._dense.requires_grad
        ):
            with no_autocast(self.device):
                self._dense = self._dense_bias()
        return self._dense

    def check_shape(
        self, heads: int, q_len: int, k_len: int, q_start: int, causal: bool, batch=None
    ):
        if batch is not None and self.batch is not None and batch != self.batch:
            raise ValueError(
                f"bias was prepared for batch={self.batch} sequences but q has batch {batch}"
            )
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


def reversed_hankel(table: torch.Tensor, q_len, start, stop, k_stop, k_start=0) -> torch.Tensor:
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
    :meth:`relbias.RelativeBias.prepare`, or from any table of that shape.
    """

    offset_only = True

    def __init__(self, table, q_len, k_len=None, *, q_start=None, bidirectional=False):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        if not isinstance(table, torch.Tensor) or table.dim() != 2:
            raise TypeError("table must be a 2-D tensor [num_heads, q_len + k_len - 1]")
        if table.shape[1] != max(q_len + k_len - 1, 0):
            raise ValueError(
                f"table must have q_len + k_len - 1 = {q_len + k_len - 1} columns, "
                f"got {table.shape[1]}"
            )
        self._init(table, q_len, k_len, q_start, check_bool("bidirectional", bidirectional))

    @classmethod
    def _unchecked(cls, table, q_len: int, k_len: int, q_start: int, bidirectional: bool):
        """For :meth:`relbias.RelativeBias.prepare`, whose lengths are checked already."""
        prepared = cls.__new__(cls)
        prepared._init(table, q_len, k_len, q_start, bidirectional)
        return prepared

    def _init(self, table, q_len, k_len, q_start, bidirectional):
        super().__init__(table.shape[0], q_len, k_len, q_start, bidirectional)
        self.table = table

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
        return take_columns(self.table, index)

    @property
    def score_mod_key(self):
        return ("offset",)

    def score_mod(self):
        table, shift = self.table, self.k_len - 1

        def offset_score_mod(score, b, h, q_idx, kv_idx):
            # offset (q_start + q_idx) - kv_idx sits at column offset - lowest
            return score + table[h, q_idx - kv_idx + shift]

        return offset_score_mod

    def reversed_table(self, causal: bool, dtype) -> torch.Tensor:
        """The table in reversed offset order (entry 0: the highest offset), in ``dtype``,
        with ``-inf`` for the future (negative) offsets when ``causal``; kept."""

        def make():
            table = self.table.to(dtype)
            if causal and self.lowest < 0:
                offsets = torch.arange(table.shape[1], device=table.device) + self.lowest
                table = table.masked_fill(~visible(offsets, 0), float("-inf"))
            return table.flip(1).contiguous()

        return self._pieces.memo(("reversed", causal, dtype, torch.is_grad_enabled()), make)

    def flipped_rows(self, start, stop, k_stop, causal, dtype, *, compiled=True):
        table = self.reversed_table(causal, dtype)
        return reversed_hankel(table, self.q_len, start, stop, k_stop)

    def kernel_inputs(self, causal):
        # the kernel masks the future itself: the table without -inf, offsets from `highest`
        def make():
            highest = self.q_start + self.q_len - 1
            return ("offset", (self.reversed_table(False, torch.float32),), highest)

        return self._pieces.memo(("kernel", torch.is_grad_enabled()), make)


def fire_mlp(x, w1, b1, w2, b2) -> torch.Tensor:
    """FIRE's :math:`f_\\theta`, ``x [...]`` -> ``[..., heads]``: one hidden ReLU layer of
    ``w1, b1 [hidden]`` (its one input feature's weights) and an output layer ``w2 [heads,
    hidden]``, ``b2 [heads]``. The first layer is a product and a sum per hidden unit, not a
    matrix product of inner size 1, which would be a library call of its own (under
    ``torch.compile`` it cost a decoding step more than the rest of FIRE's bias)."""
    return F.linear(torch.relu(x[..., None] * w1 + b1), w2, b2)


class FIREBias(PreparedBias):
    r"""FIRE's bias for one shape: the O(n) pieces of :math:`f_\theta(\psi(|i-j|)/\psi(\max(L,i)))`.

    ``psi_table[t]`` is :math:`\psi(|\text{offset}|)` for the offsets of
    :class:`OffsetTableBias`, ``denominator[r]`` is :math:`\psi(\max(L, i)) + \epsilon`
    for query row ``r`` at absolute position ``i = q_start + r``, and the MLP weights
    ``w1, b1`` (``[hidden]``) and ``w2`` (``[heads, hidden]``), ``b2`` (``[heads]``).
    Built by :meth:`relbias.FIRE.prepare`.
    """

    #: FlexAttention's backward failed to compile FIRE's ``score_mod`` (an AssertionError
    #: lowering ``flex_attention_backward``, torch 2.11 on an H200,
    #: relbias/bench/results/gpu_check_h200.json); its forward agrees with the dense path.
    score_mod_trainable = False

    def __init__(self, psi_table, denominator, w1, b1, w2, b2, q_len, k_len=None, *, q_start=None):
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        self._init(psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start)

    @classmethod
    def _unchecked(cls, psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start):
        """For :meth:`relbias.FIRE.prepare`, whose lengths are checked already."""
        prepared = cls.__new__(cls)
        prepared._init(psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start)
        return prepared

    def _init(self, psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start):
        super().__init__(w2.shape[0], q_len, k_len, q_start, True)
        self.psi_table, self.denominator = psi_table, denominator
        self.w1, self.b1, self.w2, self.b2 = w1, b1, w2, b2
        self.hidden = w1.shape[0]

    def _tensors(self):
        return (self.psi_table, self.denominator, self.w1, self.b1, self.w2, self.b2)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        """f_theta on ``x [...]`` -> ``[heads, ...]``, as FIRE.mlp computes it (no autocast)."""
        with no_autocast(x.device):
            return fire_mlp(x, self.w1, self.b1, self.w2, self.b2).movedim(-1, 0)

    def _dense_bias(self):
        index = relative_positions(
            self.q_len, self.k_len, q_start=self.q_start, device=self.psi_table.device
        ) - (self.q_start - (self.k_len - 1))
        x = self.psi_table[index] / self.denominator[:, None]
        return self._mlp(x)

    @property
    def score_mod_key(self):
        return ("fire", self.hidden)

    def score_mod(self):
        psi_table, denominator, b2 = self.psi_table, self.denominator, self.b2
        shift = self.k_len - 1
        # One captured tensor per hidden unit: FlexAttention's backward cannot index one
        # tensor that needs a gradient more than once in a score_mod (torch 2.11, CUDA),
        # so w1, b1 and w2 are split into copied scalars and columns (gradients flow back
        # through the copies).
        units = [
            (self.w1[u].clone(), self.b1[u].clone(), self.w2[:, u].clone())
            for u in range(self.hidden)
        ]

        def fire_score_mod(score, b, h, q_idx, kv_idx):
            x = psi_table[q_idx - kv_idx + shift] / denominator[q_idx]
            out = b2[h]
            for w1_u, b1_u, w2_u in units:  # unrolled when compiled: the MLP runs in registers
                out = out + w2_u[h] * torch.relu(x * w1_u + b1_u)
            return score + out

        return fire_score_mod

    def _reversed(self, causal: bool, dtype):
        def make():
            psi = self.psi_table.flip(0).contiguous()
            lowest = self.q_start - (self.k_len - 1)
            offsets = torch.arange(lowest + psi.shape[0] - 1, lowest - 1, -1, device=psi.device)
            future = torch.zeros(offsets.shape, dtype=dtype, device=psi.device)
            if causal:
                future = future.masked_fill(~visible(offsets, 0), float("-inf"))
            return psi, future

        return self._pieces.memo(("reversed", causal, dtype, torch.is_grad_enabled()), make)

    def flipped_rows(self, start, stop, k_stop, causal, dtype, *, compiled=True):
        psi, future = self._reversed(causal, dtype)
        x_num = reversed_hankel(psi[None], self.q_len, start, stop, k_stop)[0, 0]
        fut = reversed_hankel(future[None], self.q_len, start, stop, k_stop)[0, 0]
        den = self.denominator[start:stop].flip(0)
        if compiled and fused_fire_applies(self):
            w1, b1, w2, slope, intercept = self.folded_mlp(causal)
            fused = timed(fused_fire_block(), ("fire_block", self.num_heads, w1.shape[0]))
            with no_autocast(psi.device):
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

        def fold():
            psi_max, den_min = self.psi_table.detach().max(), self.denominator.detach().min()
            x_max = 1.0 if causal else float(psi_max / den_min)
            at_zero, at_max = self.b1, self.w1 * x_max + self.b1
            linear = (at_zero >= 0) & (at_max >= 0)
            switching = ~linear & ~((at_zero <= 0) & (at_max <= 0))
            slope = self.w2[:, linear] @ self.w1[linear]
            intercept = self.b2 + self.w2[:, linear] @ self.b1[linear]
            return self.w1[switching], self.b1[switching], self.w2[:, switching], slope, intercept

        return self._pieces.memo(("folded", causal, torch.is_grad_enabled()), fold)

    def kernel_inputs(self, causal):
        def make():
            highest = self.q_start + self.q_len - 1  # the offset of the reversed psi's entry 0
            psi, _ = self._reversed(False, torch.float32)
            with no_autocast(psi.device):
                w1, b1, w2, slope, intercept = self.folded_mlp(causal)
                tensors = tuple(
                    t.float().contiguous()
                    for t in (psi, 1.0 / self.denominator, w1, b1, w2, slope, intercept)
                )
            return ("fire", tensors, highest)

        return self._pieces.memo(("kernel", causal, torch.is_grad_enabled()), make)


class ForgettingBias(PreparedBias):
    r"""The Forgetting Transformer's bias for one batch: :math:`\mathrm{PE}(i,j) = F_i - F_j`.

    ``cumulative`` is :math:`F` (float64, ``[batch, heads, k_len]``): the cumulative sum of
    the log forget gates at every key position (:meth:`relbias.ForgettingGate.prepare`
    builds it). The queries are the key positions ``q_start .. q_start + q_len - 1`` (so
    ``q_start + q_len <= k_len``), and their :math:`F_i` are the keys' :math:`F` there.
    Causal only.

    Every backend reads :math:`F` as two tensors of the compute dtype (:meth:`parts`):
    ``hi``, :math:`F` rounded to float32 (no gradient), and ``lo = F - hi`` (carrying the
    whole gradient), and computes :math:`(hi_i - hi_j) + (lo_i - lo_j)`, so that no float64
    ``[q_len, k_len]`` tensor is formed and the bias keeps float32's precision of the true
    difference even where :math:`F` is large (:class:`relbias.ForgettingGate`). ``dtype`` is
    the compute dtype: float32, or float64 (for gradcheck: both parts in float64, ``lo``
    exact, so the bias is float64's).
    """

    #: FlexAttention's backward of this ``score_mod`` has not been run: PyTorch has no CPU
    #: backward for FlexAttention and it was not measured on a GPU (untested, so refused).
    score_mod_trainable = False

    def __init__(self, cumulative, q_len=None, *, q_start=None, dtype=torch.float32):
        if not isinstance(cumulative, torch.Tensor) or cumulative.dtype != torch.float64:
            raise TypeError(
                "cumulative must be a float64 tensor [batch, heads, k_len] (F, the cumulative "
                "sum of the log forget gates)"
            )
        if cumulative.dim() != 3:
            raise ValueError(
                f"cumulative must have shape [batch, heads, k_len], got {tuple(cumulative.shape)}"
            )
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        k_len = cumulative.shape[-1]
        q_len, k_len, q_start = check_lengths(k_len if q_len is None else q_len, k_len, q_start)
        if q_start + q_len > k_len:
            raise ValueError(
                f"the queries must be key positions: q_start + q_len ({q_start} + {q_len}) "
                f"must be <= k_len ({k_len})"
            )
        self._init(cumulative, q_len, k_len, q_start, dtype)

    @classmethod
    def _unchecked(cls, cumulative, q_len: int, k_len: int, q_start: int, dtype):
        """For :meth:`relbias.ForgettingGate.prepare`, whose arguments are checked already."""
        prepared = cls.__new__(cls)
        prepared._init(cumulative, q_len, k_len, q_start, dtype)
        return prepared

    def _init(self, cumulative, q_len, k_len, q_start, dtype):
        super().__init__(cumulative.shape[1], q_len, k_len, q_start, False)
        self.cumulative = cumulative
        self.batch = cumulative.shape[0]
        self.dtype = dtype

    def _tensors(self):
        return (self.cumulative,)

    def check_shape(self, heads, q_len, k_len, q_start, causal, batch=None):
        if not causal:
            raise ValueError(
                "ForgettingBias (the Forgetting Transformer's forget gate) is causal only: "
                "causal=False is not supported"
            )
        super().check_shape(heads, q_len, k_len, q_start, causal, batch)

    def parts(self, dtype=None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(hi, lo)``, each ``[batch, heads, k_len]`` in ``dtype`` (default: the compute
        dtype): ``hi`` is :math:`F` rounded to float32 (no gradient), ``lo = F - hi`` carries
        the gradient. Contiguous; computed once per dtype and grad mode, and kept."""
        dtype = self.dtype if dtype is None else dtype

        def make():
            F_all = self.cumulative
            hi = F_all.detach().to(torch.float32).to(dtype)
            lo = (F_all - hi.to(F_all.dtype)).to(dtype)
            return hi.contiguous(), lo.contiguous()

        return self._pieces.memo(("parts", dtype, torch.is_grad_enabled()), make)

    def _block(self, rows: torch.Tensor, k_stop: int, dtype) -> torch.Tensor:
        """PE for query rows ``rows`` (indices into the queries) and keys ``0 .. k_stop - 1``:
        ``[batch, heads, len(rows), k_stop]``, without the mask."""
        hi, lo = self.parts(dtype)
        positions = rows + self.q_start
        hi_q, lo_q = hi[:, :, positions, None], lo[:, :, positions, None]
        return (hi_q - hi[:, :, None, :k_stop]) + (lo_q - lo[:, :, None, :k_stop])

    def _dense_bias(self):
        rows = torch.arange(self.q_len, device=self.cumulative.device)
        return self._block(rows, self.k_len, self.dtype)

    @property
    def score_mod_key(self):
        return ("forgetting",)

    def score_mod(self):
        hi, lo = self.parts(torch.float32)
        rows = slice(self.q_start, self.q_start + self.q_len)
        hi_q, lo_q = hi[:, :, rows].contiguous(), lo[:, :, rows].contiguous()

        def forgetting_score_mod(score, b, h, q_idx, kv_idx):
            return score + (
                (hi_q[b, h, q_idx] - hi[b, h, kv_idx]) + (lo_q[b, h, q_idx] - lo[b, h, kv_idx])
            )

        return forgetting_score_mod

    def flipped_rows(self, start, stop, k_stop, causal, dtype, *, compiled=True):
        device = self.cumulative.device
        rows = torch.arange(stop - 1, start - 1, -1, device=device)
        bias = self._block(rows, k_stop, self.dtype)
        if causal:
            keys = torch.arange(k_stop, device=device)
            bias = bias.masked_fill(~visible(rows[:, None] + self.q_start, keys), float("-inf"))
        return bias.to(dtype)

    def kernel_inputs(self, causal):
        # the kernel reads hi and lo per (batch, head) and returns the gradient of lo only
        def make():
            hi, lo = self.parts(torch.float32)
            highest = self.q_start + self.q_len - 1  # the last query's position
            return ("forgetting", (lo, hi), highest)

        return self._pieces.memo(("kernel", torch.is_grad_enabled()), make)

    def __repr__(self) -> str:
        return (
            f"ForgettingBias(batch={self.batch}, num_heads={self.num_heads}, q_len={self.q_len}, "
            f"k_len={self.k_len}, q_start={self.q_start})"
        )


def prepare_bias(bias, q_len, k_len=None, *, q_start=None) -> PreparedBias:
    """``bias.prepare(q_len, k_len, q_start=q_start)``: kept for the chapters that call it.

    See :meth:`relbias.RelativeBias.prepare`; a prepared bias returns itself.
    """
    if not callable(getattr(bias, "prepare", None)) or isinstance(bias, torch.Tensor):
        raise TypeError(
            f"bias must be a relbias.RelativeBias or a PreparedBias, got {type(bias).__name__}"
        )
    return bias.prepare(q_len, k_len, q_start=q_start)
