"""Sandwich (Chi et al., 2023): the inner product of two sinusoidal position embeddings."""

from __future__ import annotations

import torch

from relbias._checks import check_int, compute_dtype, float64_device
from relbias.biases.base import RelativeBias


class Sandwich(RelativeBias):
    r"""Sandwich: a parameter-free bias from sinusoidal embeddings (the book's Table 2.4).

    .. math::
        \mathrm{PE}_h(i,j) = \frac{1}{r_h}\Big(\sum_{k=1}^{d'/2}
        \cos\frac{i-j}{10000^{2k/d'}} \;-\; \frac{d'}{2}\Big),
        \qquad r_h = \frac{8h}{H},\ h = 1..H

    The sum is :math:`p_i \cdot p_j` for sinusoidal embeddings :math:`p` of width
    :math:`d'` (``dim``). Subtracting :math:`d'/2` makes the diagonal 0 and every other
    entry a penalty; dividing head :math:`h` of :math:`H` by :math:`8h/H` gives each
    head its own scale, as the per-head slopes of ALiBi do (the scaling of Chi et al.'s
    implementation). The formula is even in ``i - j``, so it serves causal and
    bidirectional attention alike. Computed in float64 (on the CPU for a module on MPS,
    which has no float64), then rounded.
    """

    def __init__(self, num_heads, *, dim=128):
        super().__init__(num_heads, bidirectional=True)
        self.dim = check_int("dim", dim, minimum=2)
        if self.dim % 2:
            raise ValueError(f"dim must be an even integer >= 2, got {self.dim}")
        self._register_anchor()

    def head_scales(self) -> torch.Tensor:
        """The divisors :math:`r_h = 8h/H`, float64 ``[num_heads]``.

        On the module's device, or on the CPU for a module on MPS (no float64 there).
        """
        device = float64_device(self.device)
        heads = torch.arange(1, self.num_heads + 1, dtype=torch.float64, device=device)
        return 8.0 * heads / self.num_heads

    def _offset_values(self, offsets):
        device = float64_device(offsets.device)  # MPS has no float64: the CPU computes
        k = torch.arange(1, self.dim // 2 + 1, dtype=torch.float64, device=device)
        frequencies = 10000.0 ** (-2.0 * k / self.dim)
        angles = offsets.to(device=device, dtype=torch.float64)[:, None] * frequencies[None, :]
        inner = torch.cos(angles).sum(dim=1) - self.dim / 2
        table = inner[None, :] / self.head_scales().to(device)[:, None]
        return table.to(dtype=compute_dtype(self._anchor)).to(offsets.device)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}"
