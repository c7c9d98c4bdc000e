"""The shared interface of every bias family: :class:`RelativeBias`."""

from __future__ import annotations

import torch
from torch import nn

from relbias._checks import check_bool, check_int, check_lengths, compute_dtype, no_autocast
from relbias.biases.positions import check_positions, relative_positions, take_columns
from relbias.biases.prepared import OffsetTableBias


class RelativeBias(nn.Module):
    """Base class of every relative positional bias PE(i, j).

    A subclass either depends on the offset ``i - j`` alone (``offset_only = True``)
    and implements :meth:`_offset_values`, or also on the absolute query position
    (``offset_only = False``, FIRE) and implements :meth:`_position_values`.

    Calling the module returns the additive bias as a float tensor
    ``[num_heads, q_len, k_len]``; the attention layer adds it to the scaled scores.

    Notation: the docstrings write a family's formula as PE(i, j), as the book does, and
    the module returns it as it is added *after* the 1/sqrt(d) scaling. The book adds
    PE(i, j) inside the scaling, so in the book's terms a module returns PE(i, j)/sqrt(d):
    the same for a learned bias (its parameters absorb the factor), and a factor sqrt(d)
    on a fixed one (ALiBi's book slope beta is m sqrt(d)).
    Positions are always computed in integer arithmetic and the formula in at least
    float32, whatever dtype the module was cast to, and outside ``torch.autocast``.
    :meth:`prepare` gives the O(n) form that the fast attention backends read.
    """

    offset_only = True

    def __init__(self, num_heads, *, bidirectional: bool = False):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.bidirectional = check_bool("bidirectional", bidirectional)

    # -- what subclasses implement -------------------------------------------------
    def _offset_values(self, offsets: torch.Tensor) -> torch.Tensor:
        """PE for a 1-D LongTensor of offsets i - j, as ``[num_heads, len(offsets)]``."""
        raise NotImplementedError

    def _position_values(self, q_len: int, k_len: int, q_start: int) -> torch.Tensor:
        """PE for the whole ``[num_heads, q_len, k_len]`` grid (position-dependent families)."""
        raise NotImplementedError

    # -- the shared interface --------------------------------------------------------
    @property
    def preparable(self) -> bool:
        """Whether :meth:`prepare` has an O(n) form for this family (the fast backends need it).

        True for every offset-only family (an offset table); FIRE overrides it.
        """
        return self.offset_only

    @property
    def device(self) -> torch.device:
        for t in self._tensors():
            return t.device
        return torch.device("cpu")

    @property
    def dtype(self) -> torch.dtype:
        """The dtype the module was cast to (float32 for a module with no tensors)."""
        for t in self._tensors():
            if t.is_floating_point():
                return t.dtype
        return torch.float32

    def _tensors(self):
        yield from self.parameters()
        yield from self.buffers()

    def _register_anchor(self) -> None:
        """Give a parameter-free family a scalar buffer that follows ``.to()``.

        It records the device and dtype the module was moved to; the family's own
        constants are computed in float64/float32 on the fly, never rounded to it.
        """
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)

    def offset_table(self, min_offset, max_offset) -> torch.Tensor:
        """PE(i, j) for every offset ``i - j`` from ``min_offset`` to ``max_offset``.

        Returns ``[num_heads, max_offset - min_offset + 1]`` in the compute dtype
        (float32, or float64 for a float64 module). Only for offset-only families:
        this O(n) table is all that a length-n attention needs.
        """
        if not self.offset_only:
            raise TypeError(
                f"{type(self).__name__} depends on the absolute query position, "
                "so it has no offset table; call the module instead"
            )
        min_offset = check_int("min_offset", min_offset)
        max_offset = check_int("max_offset", max_offset, minimum=min_offset - 1)
        offsets = torch.arange(min_offset, max_offset + 1, device=self.device)
        with no_autocast(self.device):  # float32 whatever autocast the caller runs under
            return self._offset_values(offsets)

    def at_positions(self, q_positions, k_positions, *, elementwise=None) -> torch.Tensor:
        """PE(i, j) for queries at ``q_positions`` and keys at ``k_positions``, per row.

        ``q_positions`` is an integer tensor ``[rows, q_len]`` and ``k_positions``
        ``[rows, k_len]`` (``rows``: the batch, or 1 for positions every sequence shares;
        one of them may have 1 row where the other has more). Returns
        ``[rows, num_heads, q_len, k_len]`` in the compute dtype (float32, or float64 for a
        float64 module), outside autocast: :meth:`forward` for positions that are not
        ``q_start + r`` and ``j`` (left padding, packed sequences, a static cache).

        An offset-only family reads the offsets from its :meth:`offset_table` over the range
        that occurs (one read of that range), or with ``elementwise=True`` evaluates every
        offset (no read of the positions' values: the path under ``torch.compile``, where
        the read would break the graph, and off the CPU, where it would wait for the
        device). Both give the same values; the default reads the range on the CPU only,
        outside ``torch.compile``, where there are more offsets than twice ``q_len + k_len``
        (not a decoding step, which has fewer than the table would hold).
        """
        q_positions, k_positions = check_positions(q_positions, k_positions)
        rows = max(q_positions.shape[0], k_positions.shape[0])
        shape = (rows, q_positions.shape[1], k_positions.shape[1])
        if elementwise is None:
            # Few offsets per row (a decoding step): fewer than the table would hold; off
            # the CPU the read of their range would wait for the device.
            few = rows * shape[1] * shape[2] <= 2 * (shape[1] + shape[2])
            on_device = q_positions.device.type != "cpu"
            elementwise = few or on_device or torch.compiler.is_compiling()
        if 0 in shape:
            return torch.zeros(
                rows,
                self.num_heads,
                *shape[1:],
                dtype=compute_dtype(*self._tensors()),
                device=q_positions.device,
            )
        offsets = q_positions[:, :, None] - k_positions[:, None, :]
        with no_autocast(offsets.device):
            return self._values_at(offsets, q_positions, elementwise)

    def _values_at(self, offsets, q_positions, elementwise) -> torch.Tensor:
        """:meth:`at_positions` for checked positions: ``offsets`` ``[rows, q_len, k_len]``."""
        if not self.offset_only:
            raise NotImplementedError(f"{type(self).__name__} does not compute PE per position")
        if elementwise:
            values = self._offset_values(offsets.reshape(-1))  # [heads, rows * q * k]
            return values.view(self.num_heads, *offsets.shape).transpose(0, 1)
        low, high = (int(v) for v in torch.stack(torch.aminmax(offsets)).tolist())
        table = self.offset_table(low, high)  # [heads, high - low + 1]
        return take_columns(table, offsets - low).transpose(0, 1)

    def prepare(self, q_len, k_len=None, *, q_start=None):
        """The O(n) ingredients of this bias for one attention shape: a prepared bias.

        An offset-only family returns an :class:`~relbias.biases.prepared.OffsetTableBias`
        (its table of the ``q_len + k_len - 1`` offsets the shape meets); FIRE returns a
        :class:`~relbias.biases.prepared.FIREBias`. Pass the result as ``bias`` to
        :func:`relbias.biased_attention` (in every layer that shares the bias): the module
        runs once, and gradients still reach its parameters.
        """
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        return self._prepare(q_len, k_len, q_start)

    def _prepare(self, q_len: int, k_len: int, q_start: int):
        """:meth:`prepare` for lengths already checked (``biased_attention`` checks them once)."""
        if not self.offset_only:
            raise TypeError(
                f"{type(self).__name__} depends on absolute positions and has no prepared form; "
                "use backend='materialize'"
            )
        table = self.offset_table(q_start - (k_len - 1), q_start + q_len - 1)
        return OffsetTableBias._unchecked(table, q_len, k_len, q_start, self.bidirectional)

    def forward(self, q_len, k_len=None, *, q_start=None) -> torch.Tensor:
        """The bias ``[num_heads, q_len, k_len]`` for queries at ``q_start ..``."""
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        if q_len == 0 or k_len == 0:
            return torch.zeros(self.num_heads, q_len, k_len, dtype=self.dtype, device=self.device)
        if self.offset_only:
            lowest = q_start - (k_len - 1)
            table = self.offset_table(lowest, q_start + q_len - 1)
            index = relative_positions(q_len, k_len, q_start=q_start, device=self.device) - lowest
            bias = take_columns(table, index)
        else:
            with no_autocast(self.device):  # FIRE's MLP in float32, not autocast's dtype
                bias = self._position_values(q_len, k_len, q_start)
        return self._to_output_dtype(bias)

    def _to_output_dtype(self, bias: torch.Tensor) -> torch.Tensor:
        """Cast to the module's dtype, saturating instead of overflowing to inf."""
        dtype = self.dtype
        if bias.dtype != dtype:
            info = torch.finfo(dtype)
            bias = bias.clamp(info.min, info.max).to(dtype)
        return bias

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, bidirectional={self.bidirectional}"


class DataDependentBias(nn.Module):
    """Base class of a bias computed from the layer's input ``x``, not from positions alone.

    Such a bias cannot be called with lengths: :meth:`prepare` takes ``x``
    (``[batch, len, dim]``) and returns a prepared bias, which is passed as ``bias`` to
    :func:`relbias.biased_attention`. Its values differ per sequence, so the prepared bias
    has a batch dimension. Causal only (``bidirectional`` is False).
    """

    bidirectional = False
    offset_only = False

    def __init__(self, num_heads):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)

    def prepare(self, x, *, past=None):
        raise NotImplementedError
