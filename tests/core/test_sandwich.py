"""Sandwich: the inner product of sinusoidal embeddings, shifted to 0 on the diagonal, per head."""

from __future__ import annotations

import math

import pytest
import torch

from relbias import Sandwich, relative_positions


def sandwich_formula(offset: int, dim: int, head: int, num_heads: int) -> float:
    """(sum_{k=1..d'/2} cos(offset / 10000^(2k/d')) - d'/2) / (8 h / H), h = 1..H."""
    total = sum(math.cos(offset / 10000 ** (2 * k / dim)) for k in range(1, dim // 2 + 1))
    return (total - dim / 2) / (8 * head / num_heads)


def test_hand_computed_points_dim_4():
    bias = Sandwich(2, dim=4)
    got = bias(1, 4)  # offsets 3, 2, 1, 0
    # dim 4: frequencies 10000^-0.5 = 0.01 and 10000^-1 = 1e-4; scales 8*1/2 = 4 and 8.
    offset1 = math.cos(0.01) + math.cos(1e-4) - 2
    assert got[0, 0, 2].item() == pytest.approx(offset1 / 4, rel=1e-6)
    assert got[1, 0, 2].item() == pytest.approx(offset1 / 8, rel=1e-6)
    offset3 = math.cos(0.03) + math.cos(3e-4) - 2
    assert got[0, 0, 0].item() == pytest.approx(offset3 / 4, rel=1e-6)
    assert got[:, 0, 3].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dim,num_heads", [(2, 1), (16, 3), (128, 8)])
def test_matches_the_formula_everywhere(dim, num_heads):
    bias = Sandwich(num_heads, dim=dim)
    got = bias(6, 40).double()
    d = relative_positions(6, 40)
    expected = torch.tensor(
        [
            [
                [sandwich_formula(int(d[r, j]), dim, h, num_heads) for j in range(40)]
                for r in range(6)
            ]
            for h in range(1, num_heads + 1)
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=1e-6)


def test_is_the_inner_product_of_sinusoidal_embeddings():
    dim, n = 8, 12
    t = torch.arange(n, dtype=torch.float64)[:, None]
    w = 10000.0 ** (-2.0 * torch.arange(1, dim // 2 + 1, dtype=torch.float64) / dim)
    p = torch.cat([torch.sin(t * w), torch.cos(t * w)], dim=1)  # [n, dim]
    inner = p @ p.T - dim / 2
    bias = Sandwich(4, dim=dim)
    scales = torch.tensor([8 * h / 4 for h in range(1, 5)], dtype=torch.float64)
    torch.testing.assert_close(bias(n).double(), inner / scales[:, None, None], rtol=0, atol=1e-6)


def test_zero_diagonal_penalty_elsewhere_and_symmetric():
    got = Sandwich(4, dim=32)(50)
    assert (torch.diagonal(got, dim1=1, dim2=2) == 0).all()
    off = ~torch.eye(50, dtype=torch.bool)
    assert (got[:, off] < 0).all()
    assert torch.equal(got, got.transpose(1, 2))
    # Head h is divided by 8h/H: later heads are flatter.
    ratio = got[0][off] / got[3][off]
    torch.testing.assert_close(ratio, torch.full_like(ratio, 4.0))


def test_no_parameters_and_serves_both_directions():
    bias = Sandwich(2)
    assert list(bias.parameters()) == []
    assert bias.dim == 128
    assert bias.bidirectional
