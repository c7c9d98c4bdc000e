"""relative_positions: the offset i - j with 0-based positions, queries last by default."""

from __future__ import annotations

import pytest
import torch

from relbias import relative_positions


def test_square_matrix_is_query_minus_key():
    expected = torch.tensor([[0, -1, -2], [1, 0, -1], [2, 1, 0]])
    got = relative_positions(3)
    assert got.dtype == torch.long
    assert torch.equal(got, expected)


def test_queries_default_to_the_last_positions():
    # Decoding one token with a cache of 4 earlier keys: the query sits at position 4.
    assert torch.equal(relative_positions(1, 5), torch.tensor([[4, 3, 2, 1, 0]]))
    assert torch.equal(relative_positions(2, 4), torch.tensor([[2, 1, 0, -1], [3, 2, 1, 0]]))


def test_explicit_q_start():
    got = relative_positions(2, 3, q_start=0)
    assert torch.equal(got, torch.tensor([[0, -1, -2], [1, 0, -1]]))
    # q_start lets queries lie past the keys (e.g. cross-attention over a prefix).
    got = relative_positions(2, 1, q_start=7)
    assert torch.equal(got, torch.tensor([[7], [8]]))


@pytest.mark.parametrize("q_len,k_len,q_start", [(5, 9, None), (4, 4, 0), (3, 10, 2), (6, 2, 11)])
def test_entries_match_the_definition(q_len, k_len, q_start):
    got = relative_positions(q_len, k_len, q_start=q_start)
    start = k_len - q_len if q_start is None else q_start
    assert got.shape == (q_len, k_len)
    for r in range(q_len):
        for j in range(k_len):
            assert got[r, j].item() == (start + r) - j


def test_book_question_pairs_sharing_offset_five():
    # The course question: which pairs share the bias of (query 8, key 3)? offset 5.
    d = relative_positions(12)
    pairs = {(i, j) for i in range(12) for j in range(12) if d[i, j] == d[8, 3]}
    assert pairs == {(i, i - 5) for i in range(5, 12)}


@pytest.mark.parametrize("q_len,k_len", [(0, None), (0, 5), (0, 0)])
def test_zero_length_is_empty(q_len, k_len):
    got = relative_positions(q_len, k_len)
    assert got.shape == (0, q_len if k_len is None else k_len)
    assert got.dtype == torch.long


def test_zero_keys_with_explicit_start():
    assert relative_positions(3, 0, q_start=0).shape == (3, 0)
