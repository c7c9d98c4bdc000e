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

    slopes: torch.Tensor

    def __init__(self, num_heads, *, bidirectional=False):
        super().__init__(num_heads, bidirectional=bidirectional)
        self._register_anchor()
        # The float32 slopes [num_heads]: a buffer (not saved), so it moves with .to(device)
        # instead of being uploaded at every forward; never rounded to a low-precision dtype.
        self.register_buffer("slopes", alibi_slopes(self.num_heads), persistent=False)

    def _apply(self, fn, *args, **kwargs):
        # A cast of the module to float16/bfloat16 must not round the slopes (the anchor
        # records that dtype): they stay float32, on the module's new device.
        slopes = self.slopes
        result = super()._apply(fn, *args, **kwargs)
        if self.slopes.dtype in (torch.float16, torch.bfloat16):
            self.slopes = slopes.to(device=self.slopes.device, dtype=torch.float32)
        return result

    def _offset_values(self, offsets):
        dtype = compute_dtype(self._anchor)
        distance = offsets.abs() if self.bidirectional else offsets
        return -self.slopes.to(dtype)[:, None] * distance.to(dtype)[None, :]
