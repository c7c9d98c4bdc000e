"""OffsetBias: one learnable scalar per head and offset, clipped or refused beyond max_offset."""

from __future__ import annotations

import re

import pytest
import torch

from relbias import OffsetBias, relative_positions


def filled(num_heads, max_offset, **kwargs) -> OffsetBias:
    bias = OffsetBias(num_heads, max_offset, **kwargs)
    with torch.no_grad():
        bias.weight.copy_(torch.randn_like(bias.weight))
    return bias


def test_parameter_count_for_training_length_128():
    # One bias per offset, trained on length 128: offsets 0..127 causal, -127..127 both ways.
    assert OffsetBias(1, 127).weight.numel() == 128
    assert OffsetBias(1, 127, bidirectional=True).weight.numel() == 255
    assert OffsetBias(8, 127).weight.shape == (8, 128)


def test_starts_at_zero():
    assert torch.equal(OffsetBias(3, 4)(6), torch.zeros(3, 6, 6))


def test_causal_entries_are_u_of_the_offset():
    bias = filled(2, 10)
    got = bias(6, 8)
    d = relative_positions(6, 8)
    u = bias.weight.detach()
    for r in range(6):
        for j in range(8):
            expected = u[:, max(int(d[r, j]), 0)]  # future keys (masked) read u_0
            assert torch.equal(got[:, r, j], expected)


def test_bidirectional_entries_are_u_of_the_offset():
    bias = filled(2, 4, bidirectional=True)
    got = bias(4, 5, q_start=1)  # offsets -3..4
    d = relative_positions(4, 5, q_start=1)
    u = bias.weight.detach()
    assert u.shape == (2, 9)
    for r in range(4):
        for j in range(5):
            assert torch.equal(got[:, r, j], u[:, int(d[r, j]) + 4])


def test_clip_shares_the_edge_parameter():
    bias = filled(3, 4)
    got = bias(1, 20)  # offsets 19..0
    u = bias.weight.detach()
    for j in range(20):
        offset = 19 - j
        assert torch.equal(got[:, 0, j], u[:, min(offset, 4)])
    two_sided = filled(3, 4, bidirectional=True)
    got = two_sided(1, 30, q_start=10)  # offsets 10..-19
    u = two_sided.weight.detach()
    assert torch.equal(got[:, 0, 0], u[:, -1])  # offset 10 -> edge u_4
    assert torch.equal(got[:, 0, -1], u[:, 0])  # offset -19 -> edge u_-4


def test_clipped_offsets_train_the_edge_parameter():
    bias = OffsetBias(1, 2)
    bias(1, 10).sum().backward()  # offsets 9..0: u_2 is read by offsets 2..9
    assert bias.weight.grad.tolist() == [[1.0, 1.0, 8.0]]


def test_error_mode_accepts_seen_offsets():
    bias = filled(2, 5, unseen="error")
    clip = OffsetBias(2, 5)
    with torch.no_grad():
        clip.weight.copy_(bias.weight)
    assert torch.equal(bias(6), clip(6))  # offsets up to 5: all seen


@pytest.mark.parametrize(
    "kwargs,q_len,k_len,q_start,first",
    [
        ({}, 7, None, None, 6),
        ({}, 1, 100, None, 6),
        ({}, 2, 3, 9, 6),
        ({"bidirectional": True}, 3, 10, 0, -6),
        ({"bidirectional": True}, 2, 3, 9, 6),
        ({"bidirectional": True}, 1, 7, None, 6),
    ],
)
def test_error_mode_names_the_first_unseen_offset(kwargs, q_len, k_len, q_start, first):
    bias = OffsetBias(2, 5, unseen="error", **kwargs)
    with pytest.raises(ValueError, match=rf"offset i - j = {re.escape(str(first))}\b"):
        bias(q_len, k_len, q_start=q_start)
    with pytest.raises(ValueError, match="unseen='clip'"):
        bias(q_len, k_len, q_start=q_start)


def test_error_mode_allows_future_keys_of_a_causal_table():
    # Causal tables give masked future keys u_0, also in error mode.
    bias = OffsetBias(1, 3, unseen="error")
    assert bias(1, 4, q_start=0).shape == (1, 1, 4)  # offsets 0, -1, -2, -3
