"""ALiBi (Press et al., 2022): a fixed linear distance penalty, the book's Eqs. 2.82-2.84."""

from __future__ import annotations

import math

import torch

from relbias._checks import check_int, compute_dtype
from relbias.biases.base import RelativeBias


def alibi_slopes(num_heads) -> torch.Tensor:
    r"""The per-head slopes :math:`m_h` of Press et al.'s reference code, float32 ``[num_heads]``.

    For a power of two :math:`n`: :math:`m_h = 2^{-8h/n}`, :math:`h = 1..n` (8 heads:
    1/2, 1/4, ..., 1/256). Otherwise the slopes of the nearest lower power of two
    :math:`p`, followed by every other slope of :math:`2p` (its 1st, 3rd, 5th, ...)
    until there are ``num_heads``.

    The book's Eq. 2.84 prints :math:`\beta_k = 1/2^{8/k}`, which ignores the head
    count and grows with :math:`k`: an erratum; this function follows the paper.
    """
    num_heads = check_int("num_heads", num_heads, minimum=1)
    return torch.tensor(_slopes(num_heads), dtype=torch.float32)


def _geometric(n: int) -> list[float]:
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def _slopes(n: int) -> list[float]:
    lower = 2 ** int(math.floor(math.log2(n)))
    if lower == n:
        return _geometric(n)
    return _geometric(lower) + _slopes(2 * lower)[0::2][: n - lower]


class ALiBi(RelativeBias):
    r"""ALiBi: :math:`\mathrm{PE}(i,j) = -m_h\,(i-j)`, or :math:`-m_h\,|i-j|` when bidirectional.

    No parameters; slopes from :func:`alibi_slopes`. The reference code adds
    :math:`+m_h j` instead, which equals :math:`-m_h (i-j)` after the softmax only for
    causal rows. The book's :math:`\beta` sits inside :math:`1/\sqrt{d}`, so
    :math:`\beta = m_h \sqrt{d}` for the same attention. Press et al. (2022).
    """

    def __init__(self, num_heads, *, bidirectional=False):
        super().__init__(num_heads, bidirectional=bidirectional)
        self._register_anchor()

    @property
    def slopes(self) -> torch.Tensor:
        """The float32 slopes ``[num_heads]`` (never rounded to a low-precision dtype)."""
        return alibi_slopes(self.num_heads).to(self.device)

    def _offset_values(self, offsets):
        dtype = compute_dtype(self._anchor)
        distance = offsets.abs() if self.bidirectional else offsets
        return -self.slopes.to(dtype)[:, None] * distance.to(dtype)[None, :]
