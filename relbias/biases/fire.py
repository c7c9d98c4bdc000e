"""FIRE (Li et al., 2024): functional interpolation of relative positions."""

from __future__ import annotations

import torch
from torch import nn

from relbias._checks import (
    check_int,
    check_lengths,
    check_positive_float,
    compute_dtype,
    no_autocast,
)
from relbias.biases.base import RelativeBias
from relbias.biases.positions import relative_positions
from relbias.biases.prepared import FIREBias, fire_mlp


class FIRE(RelativeBias):
    r"""FIRE: :math:`\mathrm{PE}(i,j) = f_\theta\big(\psi(i-j) / \psi(\max(L, i))\big)`.

    :math:`\psi(x) = \log(c\,x + 1)` and :math:`f_\theta` is an MLP
    ``1 -> hidden -> num_heads`` with a ReLU. Dividing by :math:`\psi(\max(L, i))` is
    *progressive interpolation*: for :math:`i < L` the bias depends on :math:`i - j`
    alone; for :math:`i \ge L` the MLP's input stays in ``[0, 1]``, so longer
    sequences reuse the trained input range. It needs the absolute query position
    :math:`i` (``q_start`` when decoding with a cache), so ``offset_only`` is False.

    ``c`` and the threshold ``L`` are learnable (the book writes :math:`m_{len}` for
    :math:`L`). As in the reference code, :math:`L = |\lambda L_0|` with a learned
    multiplier :math:`\lambda` (initially 1), :math:`\psi` uses :math:`|c|\,|i-j|`,
    and a small ``eps`` keeps the denominator positive. Li et al. (ICLR 2024).
    """

    offset_only = False

    def __init__(self, num_heads, *, hidden=32, c=0.1, L=512, learn_c=True, learn_L=True, eps=1e-6):
        super().__init__(num_heads, bidirectional=True)
        self.hidden = check_int("hidden", hidden, minimum=1)
        c = check_positive_float("c", c)
        L = check_positive_float("L", L)
        self.eps = check_positive_float("eps", eps)
        self.hidden_layer = nn.Linear(1, self.hidden)
        self.output_layer = nn.Linear(self.hidden, self.num_heads)
        self.c = nn.Parameter(torch.tensor(c), requires_grad=bool(learn_c))
        self.register_buffer("L_init", torch.tensor(L))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0), requires_grad=bool(learn_L))

    def _apply(self, fn, *args, **kwargs):
        # L_init is a position (the threshold L), not a weight: a cast of the module to
        # float16/bfloat16 must not round it (513 -> 512 in bfloat16), so it stays float32.
        L_init = self.L_init
        result = super()._apply(fn, *args, **kwargs)
        if self.L_init.dtype in (torch.float16, torch.bfloat16):
            self.L_init = L_init.to(device=self.L_init.device, dtype=torch.float32)
        return result

    @property
    def L(self) -> torch.Tensor:
        """The threshold :math:`L = |\\lambda L_0|` (a 0-d tensor)."""
        return (self.L_multiplier * self.L_init).abs()

    def psi(self, x: torch.Tensor) -> torch.Tensor:
        r""":math:`\psi(x) = \log(|c|\,x + 1)` for non-negative ``x``."""
        c = self.c.to(compute_dtype(self.c)).abs()
        return torch.log1p(c * x)

    def denominator(self, positions: torch.Tensor) -> torch.Tensor:
        r""":math:`\psi(\max(L, i)) + \epsilon` for query positions ``positions`` (a tensor of
        any shape), in the compute dtype: the MLP input's denominator."""
        dtype = compute_dtype(self.c)
        return self.psi(torch.maximum(positions.to(dtype), self.L.to(dtype))) + self.eps

    def normalized_input(self, q_len, k_len=None, *, q_start=None) -> torch.Tensor:
        r"""The MLP's input :math:`\psi(|i-j|) / \psi(\max(L, i))` as ``[q_len, k_len]``."""
        q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
        offsets = relative_positions(q_len, k_len, q_start=q_start, device=self.device)
        dtype = compute_dtype(self.c)
        i = torch.arange(q_start, q_start + q_len, device=self.device, dtype=dtype)
        threshold = torch.maximum(i, self.L.to(dtype))
        return self.psi(offsets.abs().to(dtype)) / (self.psi(threshold)[:, None] + self.eps)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """:math:`f_\\theta`: ``[...]`` inputs to ``[..., num_heads]`` outputs, in x's dtype.

        Outside ``torch.autocast``: the MLP runs in x's dtype (float32) even under it
        (:func:`relbias.biases.prepared.fire_mlp`, which the prepared form uses too).
        """
        w1, b1 = self.hidden_layer.weight.to(x.dtype), self.hidden_layer.bias.to(x.dtype)
        w2, b2 = self.output_layer.weight.to(x.dtype), self.output_layer.bias.to(x.dtype)
        with no_autocast(x.device):
            return fire_mlp(x, w1[:, 0], b1, w2, b2)

    @property
    def preparable(self) -> bool:
        """FIRE has a prepared form (:class:`~relbias.biases.prepared.FIREBias`)."""
        return True

    def _prepare(self, q_len, k_len, q_start):
        """FIRE's O(n) ingredients: psi of every offset, the denominator of every query row
        and the MLP's weights (all in float32, or float64 for a float64 module)."""
        dtype = compute_dtype(self.c)
        device = self.device
        offsets = torch.arange(q_start - (k_len - 1), q_start + q_len, device=device)
        psi_table = self.psi(offsets.abs().to(dtype))
        i = torch.arange(q_start, q_start + q_len, device=device, dtype=dtype)
        denominator = self.denominator(i)
        w1 = self.hidden_layer.weight.to(dtype).reshape(-1)
        b1 = self.hidden_layer.bias.to(dtype)
        w2 = self.output_layer.weight.to(dtype)
        b2 = self.output_layer.bias.to(dtype)
        return FIREBias._unchecked(psi_table, denominator, w1, b1, w2, b2, q_len, k_len, q_start)

    def _values_at(self, offsets, q_positions, elementwise):
        r"""FIRE at per-row positions: the query position ``i`` of each row sets its
        denominator :math:`\psi(\max(L, i))`."""
        dtype = compute_dtype(self.c)
        x = self.psi(offsets.abs().to(dtype)) / self.denominator(q_positions)[:, :, None]
        return self.mlp(x).permute(0, 3, 1, 2)

    def _position_values(self, q_len, k_len, q_start):
        x = self.normalized_input(q_len, k_len, q_start=q_start)
        return self.mlp(x).permute(2, 0, 1)

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, hidden={self.hidden}, "
            f"c={float(self.c.detach()):.4g}, L={float(self.L.detach()):.4g}"
        )
