"""T5 buckets and T5Bias against HuggingFace transformers and the book's Figs. 2.10-2.11."""

from __future__ import annotations

import inspect
import itertools
import math

import pytest
import torch
from transformers import T5Config
from transformers.models.t5.modeling_t5 import T5Attention

from relbias import T5Bias, relative_positions, t5_bucket

OFFSETS = torch.arange(-4096, 4097)
NUM_BUCKETS = [1, 2, 3, 4, 5, 8, 31, 32, 33, 64, 128]
MAX_DISTANCES = [1, 2, 3, 5, 8, 20, 128, 1024]
SETTINGS = list(itertools.product(NUM_BUCKETS, MAX_DISTANCES, [False, True]))


def hf_bucket(offset, *, num_buckets, max_distance, bidirectional):
    """HF takes relative_position = j - i (key minus query): the opposite sign of i - j."""
    return T5Attention._relative_position_bucket(
        -offset, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )


def makes_buckets(num_buckets, max_distance, bidirectional):
    """Our rule: at least one exact bucket, and max_distance beyond the exact ones."""
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    return exact >= 1 and max_distance > exact


def is_valid_table(buckets, num_buckets):
    """In range, and non-decreasing in distance on each side of offset 0."""
    past = buckets[OFFSETS >= 0]  # distances 0, 1, 2, ...
    future = buckets[OFFSETS <= 0].flip(0)  # distances 0, 1, 2, ... to future keys
    in_range = bool(((buckets >= 0) & (buckets < num_buckets)).all())
    return in_range and bool((past.diff() >= 0).all()) and bool((future[1:].diff() >= 0).all())


def test_settings_cover_both_accepted_and_rejected():
    accepted = [s for s in SETTINGS if makes_buckets(*s)]
    assert 0 < len(accepted) < len(SETTINGS)


@pytest.mark.parametrize("num_buckets,max_distance,bidirectional", SETTINGS)
def test_buckets_match_transformers_at_every_offset(num_buckets, max_distance, bidirectional):
    kwargs = dict(num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)
    if not makes_buckets(num_buckets, max_distance, bidirectional):
        with pytest.raises(ValueError, match="num_buckets|max_distance"):
            t5_bucket(OFFSETS, **kwargs)
        with pytest.raises(ValueError, match="num_buckets|max_distance"):
            T5Bias(2, **kwargs)
        # ...and exactly these are the settings where the reference code yields no
        # valid bucket table: it raises, returns buckets outside [0, num_buckets), or
        # returns buckets that fall as the distance grows.
        try:
            ref = hf_bucket(OFFSETS, **kwargs)
        except (ZeroDivisionError, ValueError, RuntimeError):
            return
        assert not is_valid_table(ref, num_buckets)
        return
    ours = t5_bucket(OFFSETS, **kwargs)
    ref = hf_bucket(OFFSETS, **kwargs)
    assert ours.dtype == torch.long
    assert ours.shape == OFFSETS.shape
    assert torch.equal(ours, ref)
    assert is_valid_table(ours, num_buckets)


def test_buckets_keep_the_input_shape_and_accept_int32():
    d = relative_positions(5, 9)
    got = t5_bucket(d.int(), num_buckets=32, max_distance=128, bidirectional=True)
    assert got.shape == (5, 9)
    assert torch.equal(got, hf_bucket(d, num_buckets=32, max_distance=128, bidirectional=True))


def test_default_settings_are_t5s_bidirectional():
    assert torch.equal(
        t5_bucket(OFFSETS), hf_bucket(OFFSETS, num_buckets=32, max_distance=128, bidirectional=True)
    )


def test_signs_future_keys():
    future = torch.tensor([-1, -2, -50, -4000])
    # Causal: every future key (i - j < 0) goes to bucket 0.
    assert t5_bucket(future, bidirectional=False).tolist() == [0, 0, 0, 0]
    # Bidirectional: future keys take the upper half of the buckets.
    got = t5_bucket(future, num_buckets=32, bidirectional=True)
    past = t5_bucket(-future, num_buckets=32, bidirectional=True)
    assert torch.equal(got, past + 16)


def test_last_bucket_starts_before_max_distance():
    # Integer truncation in float32: the last bucket starts at 91 (bidirectional) and
    # 113 (causal) for T5's 32 buckets / max_distance 128, not at 128.
    d = torch.arange(0, 200)
    bi = t5_bucket(d, num_buckets=32, max_distance=128, bidirectional=True)
    causal = t5_bucket(d, num_buckets=32, max_distance=128, bidirectional=False)
    assert int((bi == 15).nonzero().min()) == 91
    assert int((causal == 31).nonzero().min()) == 113


def first_offset_of_each_bucket(**kwargs):
    d = torch.arange(0, 4097)
    b = t5_bucket(d, **kwargs)
    return {int(bucket): int(d[b == bucket].min()) for bucket in b.unique()}


def test_book_fig_2_10_table():
    # n_b = 32 in the book's notation: 33 buckets, dist_max = 1024, causal.
    kwargs = dict(num_buckets=33, max_distance=1024, bidirectional=False)
    d = torch.arange(0, 4097)
    b = t5_bucket(d, **kwargs)
    assert torch.equal(b[:16], torch.arange(16))
    assert b[16:21].tolist() == [16] * 5
    assert b[21:27].tolist() == [17] * 6
    assert b[27:34].tolist() == [18] * 7
    assert b[34] == 19
    starts = first_offset_of_each_bucket(**kwargs)
    assert sorted(starts) == list(range(33))
    assert starts[32] == 802
    assert b[801] == 31 and b[802] == 32 and b[4096] == 32


def test_book_fig_2_11a_table():
    # n_b = 3, dist_max = 5: 0 -> u_0, 1 -> u_1, 2..3 -> u_2, >= 4 -> u_3.
    d = torch.arange(0, 100)
    b = t5_bucket(d, num_buckets=4, max_distance=5, bidirectional=False)
    assert b[:4].tolist() == [0, 1, 2, 2]
    assert (b[4:] == 3).all()


def book_bucket(distance: int, n_b: int, dist_max: int) -> int:
    """The book's Eq. 2.79, literally, in float64 (integer-valued for odd n_b)."""
    half = (n_b + 1) / 2
    if 0 <= distance < half:
        return distance
    scaled = (math.log(distance) - math.log(half)) / (math.log(dist_max) - math.log(half)) * half
    value = min(n_b, half + math.floor(scaled))
    assert value == int(value)
    return int(value)


def test_book_formula_equals_t5_default_causal():
    d = torch.arange(0, 4097)
    ours = t5_bucket(d, num_buckets=32, max_distance=128, bidirectional=False).tolist()
    book = [book_bucket(x, 31, 128) for x in range(0, 4097)]
    assert ours == book


# -- T5Bias against T5Attention.compute_bias ----------------------------------------------


def hf_attention(num_heads, num_buckets, max_distance, causal):
    config = T5Config(
        d_model=8,
        d_kv=4,
        d_ff=16,
        num_heads=num_heads,
        num_layers=1,
        relative_attention_num_buckets=num_buckets,
        relative_attention_max_distance=max_distance,
        is_decoder=causal,
    )
    attention = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        attention.relative_attention_bias.weight.normal_()
    return attention


def hf_compute_bias(attention, q_len, k_len, q_start):
    params = inspect.signature(attention.compute_bias).parameters
    if "past_seen_tokens" in params:
        out = attention.compute_bias(q_len, k_len, past_seen_tokens=q_start)
    elif "cache_position" in params:
        positions = torch.arange(q_start, q_start + q_len)
        out = attention.compute_bias(q_len, k_len, cache_position=positions)
    else:  # pragma: no cover - a version that can only place queries at 0..q_len-1
        assert q_start == 0
        out = attention.compute_bias(q_len, k_len)
    assert out.shape == (1, attention.n_heads, q_len, k_len)
    return out[0]


@pytest.mark.parametrize(
    "num_buckets,max_distance,causal",
    [(32, 128, True), (32, 128, False), (33, 1024, True), (8, 20, False), (4, 5, True)],
)
@pytest.mark.parametrize("q_len,k_len", [(7, 7), (1, 300), (5, 200), (40, 180)])
def test_t5bias_equals_compute_bias(num_buckets, max_distance, causal, q_len, k_len):
    heads = 3
    ref = hf_attention(heads, num_buckets, max_distance, causal)
    ours = T5Bias(
        heads, num_buckets=num_buckets, max_distance=max_distance, bidirectional=not causal
    )
    assert ours.weight.shape == (heads, num_buckets)
    with torch.no_grad():
        ours.weight.copy_(ref.relative_attention_bias.weight.T)
    with torch.no_grad():
        # HF places queries at 0..q_len-1 unless told otherwise.
        assert torch.equal(ours(q_len, k_len, q_start=0), hf_compute_bias(ref, q_len, k_len, 0))
        # Our default puts the queries last (decoding with a cache).
        assert torch.equal(ours(q_len, k_len), hf_compute_bias(ref, q_len, k_len, k_len - q_len))


def test_t5bias_is_a_table_lookup_and_starts_at_zero():
    bias = T5Bias(2, num_buckets=8, max_distance=20, bidirectional=True)
    assert torch.equal(bias(6), torch.zeros(2, 6, 6))
    with torch.no_grad():
        bias.weight.copy_(torch.arange(16.0).reshape(2, 8))
    d = relative_positions(6, 30)
    b = t5_bucket(d, num_buckets=8, max_distance=20, bidirectional=True)
    assert torch.equal(bias(6, 30), bias.weight.detach()[:, b])
