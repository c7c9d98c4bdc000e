"""FIRE's bias for a block of query rows in one compiled pass: the kernel of
:meth:`relbias.biases.prepared.FIREBias.flipped_rows` on the CPU (float32, no gradients),
where the MLP's hidden units are computed once per score and shared by the heads."""

from __future__ import annotations

import torch

from relbias._checks import needs_grad

__all__ = ["fire_block", "fused_fire_applies", "fused_fire_block"]


def fire_block(x_num, future, den, w1, b1, w2, slope, intercept):
    """FIRE's bias for a block of rows in one pass: ``[heads, rows, keys]``.

    ``w1, b1, w2, slope, intercept`` come from
    :meth:`relbias.biases.prepared.FIREBias.folded_mlp`. The hidden unit ``u`` is computed
    once per score and shared by all heads (the heads are separate outputs of one loop,
    which the compiler fuses).
    """
    x = x_num / den[:, None]
    outs = [future + (x * slope[h] + intercept[h]) for h in range(w2.shape[0])]
    for u in range(w1.shape[0]):
        hidden = torch.relu(x * w1[u] + b1[u])
        outs = [out + w2[h, u] * hidden for h, out in enumerate(outs)]
    return torch.stack(outs)


_FUSED_FIRE = []


def fused_fire_applies(bias) -> bool:
    """Whether the compiled block kernel can compute the blocks of ``bias`` (a prepared
    FIRE: float32 on the CPU, no gradients)."""
    if bias.psi_table.dtype != torch.float32 or bias.device.type != "cpu":
        return False
    return not needs_grad(bias)


def fused_fire_block():
    """:func:`fire_block` compiled once (dynamic shapes) and kept for the process."""
    if not _FUSED_FIRE:
        _FUSED_FIRE.append(torch.compile(fire_block, dynamic=True))
    return _FUSED_FIRE[0]
