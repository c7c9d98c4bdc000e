"""ALiBi: Press et al.'s slopes for any head count, the linear penalty, the book's erratum."""

from __future__ import annotations

import math

import pytest
import torch

from relbias import ALiBi, alibi_slopes, relative_positions


def reference_slopes(n: int) -> list[float]:
    """Press et al.'s recurrence, written from its description.

    For a power of two n: a geometric sequence whose first term and ratio are both
    2^(-2^-(log2(n) - 3)) = 2^(-8/n). Otherwise: the slopes of the closest lower power
    of two p, then every other slope of 2p (the 1st, 3rd, ...) until there are n.
    """

    def power_of_two(n: int) -> list[float]:
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_two(p) + reference_slopes(2 * p)[0::2][: n - p]


@pytest.mark.parametrize("n", range(1, 65))
def test_slopes_match_the_reference_recurrence(n):
    got = alibi_slopes(n)
    assert got.dtype == torch.float32
    assert got.shape == (n,)
    # The reference code builds a float32 tensor from its float64 list.
    assert torch.equal(got, torch.tensor(reference_slopes(n), dtype=torch.float32))


def test_eight_heads_are_powers_of_one_half():
    assert alibi_slopes(8).tolist() == [1 / 2**k for k in range(1, 9)]


def test_non_power_of_two_interleaves():
    # 12 heads: the 8 slopes of 8 heads, then the 1st, 3rd, 5th, 7th slopes of 16 heads.
    sixteen = alibi_slopes(16)
    assert torch.equal(alibi_slopes(12), torch.cat([alibi_slopes(8), sixteen[0:8:2]]))
    assert torch.equal(alibi_slopes(3), torch.tensor([2**-4, 2**-8, 2**-2]))


def book_printed_slopes(n: int) -> torch.Tensor:
    """The book's Eq. 2.84 as printed: beta_k = 1 / 2^(8/k), k = 1..n (an erratum)."""
    return torch.tensor([1 / 2 ** (8 / k) for k in range(1, n + 1)], dtype=torch.float32)


@pytest.mark.parametrize("n", [2, 4, 8, 16, 12])
def test_book_erratum_is_not_what_we_compute(n):
    ours, book = alibi_slopes(n), book_printed_slopes(n)
    assert not torch.allclose(ours, book)
    # The printed rule grows with k and ignores the head count; the paper's falls.
    assert (book.diff() > 0).all()
    assert torch.equal(book_printed_slopes(2 * n)[:n], book)
    if n in (2, 4, 8, 16):
        assert (ours.diff() < 0).all()
    # The first head: printed 1/2^8 for every head count, the paper's 2^(-8/n).
    assert book[0] == 2**-8
    assert ours[0] == torch.tensor(2 ** (-8 / 2 ** math.floor(math.log2(n))), dtype=torch.float32)


def test_causal_penalty_is_minus_slope_times_offset():
    bias = ALiBi(8)
    got = bias(4, 6)
    d = relative_positions(4, 6).float()
    m = torch.tensor([1 / 2**k for k in range(1, 9)])
    assert torch.equal(got, -m[:, None, None] * d)
    # Hand-computed: head 0 (slope 1/2), query 5, key 2: -1.5; head 7 (1/256), offset 5.
    assert got[0, 3, 2] == -1.5
    assert got[7, 3, 0] == -5 / 256


def test_bidirectional_penalty_uses_absolute_distance():
    bias = ALiBi(4, bidirectional=True)
    got = bias(5, 5)
    m = alibi_slopes(4)
    d = relative_positions(5).abs().float()
    assert torch.equal(got, -m[:, None, None] * d)
    assert torch.equal(got, got.transpose(1, 2))
    # Causal ALiBi does *not* penalise future keys (they are masked anyway).
    causal = ALiBi(4)(5, 5)
    assert (causal[:, 0, 1:] > 0).all()


def test_alibi_has_no_parameters_and_slopes_property():
    bias = ALiBi(6)
    assert list(bias.parameters()) == []
    assert torch.equal(bias.slopes, alibi_slopes(6))


def test_reference_key_position_form_agrees_only_for_causal_rows():
    # The reference code adds +m*j; after softmax this equals -m*(i-j) in causal rows.
    torch.manual_seed(1)
    heads, n = 4, 9
    scores = torch.randn(heads, n, n)
    m = alibi_slopes(heads)[:, None, None]
    j = torch.arange(n).float()
    mask = torch.full((n, n), float("-inf")).triu(1)
    ours = torch.softmax(scores + ALiBi(heads)(n) + mask, dim=-1)
    reference = torch.softmax(scores + m * j + mask, dim=-1)
    torch.testing.assert_close(ours, reference)
    bidirectional = torch.softmax(scores + ALiBi(heads, bidirectional=True)(n), dim=-1)
    reference_bi = torch.softmax(scores + m * j, dim=-1)
    assert not torch.allclose(bidirectional, reference_bi)
