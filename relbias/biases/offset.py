"""One learnable bias per offset: PE(i, j) = u_{i-j} (the book's §2.3.5, Shaw et al., 2018)."""

from __future__ import annotations

import torch
from torch import nn

from relbias._checks import check_choice, check_int, compute_dtype
from relbias.biases.base import RelativeBias
from relbias.biases.positions import take_columns


class OffsetBias(RelativeBias):
    r"""A learnable scalar :math:`u_{i-j}` per head and offset, :math:`\mathrm{PE}(i,j) = u_{i-j}`.

    Causal (default): offsets ``0 .. max_offset``, ``max_offset + 1`` parameters per head;
    a model trained on length :math:`m_l` sees offsets ``0 .. m_l - 1``. Future keys
    (negative offsets, always masked) read ``u_0``, as T5's causal bucket 0 does.
    Bidirectional: offsets ``-max_offset .. max_offset``, ``2 max_offset + 1`` parameters.

    Offsets beyond ``max_offset`` have no trained parameter (the book's point about
    generalisation). ``unseen="clip"`` gives them the edge parameter, as Shaw et al.
    (2018) clip offsets to ``[-K, K]``; ``unseen="error"`` raises a ``ValueError``
    naming the first offset that has no parameter.

    The table starts at zero: an untrained model has no positional preference.
    """

    def __init__(self, num_heads, max_offset, *, bidirectional=False, unseen="clip"):
        super().__init__(num_heads, bidirectional=bidirectional)
        self.max_offset = check_int("max_offset", max_offset, minimum=0)
        self.unseen = check_choice("unseen", unseen, {"clip", "error"})
        size = 2 * self.max_offset + 1 if bidirectional else self.max_offset + 1
        self.weight = nn.Parameter(torch.zeros(self.num_heads, size))

    @property
    def min_offset(self) -> int:
        """The smallest offset with a parameter of its own."""
        return -self.max_offset if self.bidirectional else 0

    def _offset_values(self, offsets):
        if self.unseen == "error" and offsets.numel():
            self._check_seen(int(offsets.min()), int(offsets.max()))
        low = self.min_offset
        index = offsets.clamp(low, self.max_offset) - low
        return take_columns(self.weight.to(compute_dtype(self.weight)), index)

    def _check_seen(self, lowest: int, highest: int) -> None:
        if highest > self.max_offset:
            first = self.max_offset + 1
        elif self.bidirectional and lowest < -self.max_offset:
            first = -self.max_offset - 1
        else:
            return
        raise ValueError(
            f"offset i - j = {first} has no parameter: this OffsetBias has offsets "
            f"{self.min_offset}..{self.max_offset} (max_offset={self.max_offset}); "
            "use unseen='clip' to share the edge parameter with farther offsets"
        )

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, max_offset={self.max_offset}, unseen={self.unseen!r}"
