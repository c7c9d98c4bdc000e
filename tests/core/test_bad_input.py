"""Bad input raises ValueError/TypeError naming the parameter; empty and long inputs work."""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILY_KWARGS, build

import relbias
from relbias import (
    FIRE,
    ALiBi,
    KerpleLog,
    KerplePower,
    OffsetBias,
    Sandwich,
    T5Bias,
    alibi_slopes,
    biased_attention,
    make_bias,
    relative_positions,
    t5_bucket,
)

FAMILIES = list(FAMILY_KWARGS)

# -- head counts -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize(
    "heads,error",
    [
        (0, ValueError),
        (-2, ValueError),
        (2.0, TypeError),
        ("4", TypeError),
        (True, TypeError),
        (None, TypeError),
    ],
)
def test_bad_head_counts(name, heads, error):
    with pytest.raises(error, match="num_heads"):
        make_bias(name, heads, **FAMILY_KWARGS[name])


@pytest.mark.parametrize("heads,error", [(0, ValueError), (1.5, TypeError), (False, TypeError)])
def test_bad_head_counts_for_slopes(heads, error):
    with pytest.raises(error, match="num_heads"):
        alibi_slopes(heads)


def test_numpy_integers_are_integers():
    import numpy as np

    assert ALiBi(np.int64(4)).num_heads == 4
    assert relative_positions(np.int32(3)).shape == (3, 3)


# -- lengths -----------------------------------------------------------------------------

LENGTH_CASES = [
    ((-1,), {}, ValueError, "q_len"),
    ((2.0,), {}, TypeError, "q_len"),
    (("3",), {}, TypeError, "q_len"),
    ((3, -1), {}, ValueError, "k_len"),
    ((3, 4.0), {}, TypeError, "k_len"),
    ((3, 2), {}, ValueError, "k_len"),  # queries must lie inside the keys
    ((3, 5), {"q_start": -1}, ValueError, "q_start"),
    ((3, 5), {"q_start": 1.0}, TypeError, "q_start"),
]


@pytest.mark.parametrize("args,kwargs,error,param", LENGTH_CASES)
def test_bad_lengths_relative_positions(args, kwargs, error, param):
    with pytest.raises(error, match=param):
        relative_positions(*args, **kwargs)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("args,kwargs,error,param", LENGTH_CASES)
def test_bad_lengths_modules(name, args, kwargs, error, param):
    with pytest.raises(error, match=param):
        build(name)(*args, **kwargs)


def test_k_len_message_says_what_is_allowed():
    with pytest.raises(ValueError, match=r"k_len \(2\) must be >= q_len \(3\)"):
        ALiBi(1)(3, 2)


def test_bad_offset_table_range():
    with pytest.raises(ValueError, match="max_offset"):
        ALiBi(1).offset_table(5, 3)
    with pytest.raises(TypeError, match="min_offset"):
        ALiBi(1).offset_table(0.5, 3)
    with pytest.raises(TypeError, match="FIRE"):
        FIRE(1).offset_table(0, 3)


# -- t5_bucket and T5Bias ------------------------------------------------------------------


@pytest.mark.parametrize(
    "offset",
    [torch.tensor([1.0, 2.0]), torch.tensor([1.0], dtype=torch.float64), torch.tensor([True])],
)
def test_t5_bucket_rejects_non_integer_offsets(offset):
    with pytest.raises(TypeError, match="offset"):
        t5_bucket(offset)


@pytest.mark.parametrize("offset", [[1, 2], 3, None])
def test_t5_bucket_rejects_non_tensors(offset):
    with pytest.raises(TypeError, match="offset"):
        t5_bucket(offset)


NO_BUCKETS = [
    ({"num_buckets": 0}, ValueError, "num_buckets"),
    ({"num_buckets": 1, "bidirectional": False}, ValueError, "num_buckets"),
    ({"num_buckets": 3, "bidirectional": True}, ValueError, "num_buckets"),
    ({"num_buckets": 32, "max_distance": 8, "bidirectional": True}, ValueError, "max_distance"),
    ({"num_buckets": 32, "max_distance": 16, "bidirectional": False}, ValueError, "max_distance"),
    ({"max_distance": 0}, ValueError, "max_distance"),
    ({"num_buckets": 32.0}, TypeError, "num_buckets"),
    ({"max_distance": "128"}, TypeError, "max_distance"),
    ({"bidirectional": 1}, TypeError, "bidirectional"),
]


@pytest.mark.parametrize("kwargs,error,param", NO_BUCKETS)
def test_settings_that_make_no_buckets(kwargs, error, param):
    with pytest.raises(error, match=param):
        t5_bucket(torch.arange(5), **kwargs)
    with pytest.raises(error, match=param):
        T5Bias(2, **{"bidirectional": True, **kwargs})


def test_smallest_valid_bucket_settings_work():
    d = torch.arange(-3, 4)
    causal = t5_bucket(d, num_buckets=2, max_distance=2, bidirectional=False)
    assert causal.tolist() == [0, 0, 0, 0, 1, 1, 1]
    # Bidirectional, 2 buckets a side: future distances >= 1 share bucket 3 (bucket 2,
    # a future key at distance 0, is never used, as in T5).
    both = t5_bucket(d, num_buckets=4, max_distance=2, bidirectional=True)
    assert both.tolist() == [3, 3, 3, 0, 1, 1, 1]


# -- family-specific settings ---------------------------------------------------------------


@pytest.mark.parametrize(
    "dim,error",
    [(3, ValueError), (127, ValueError), (0, ValueError), (-4, ValueError), (64.0, TypeError)],
)
def test_sandwich_dim(dim, error):
    with pytest.raises(error, match="dim"):
        Sandwich(2, dim=dim)


def test_sandwich_odd_dim_message_says_even():
    with pytest.raises(ValueError, match="even"):
        Sandwich(2, dim=5)


@pytest.mark.parametrize(
    "kwargs,error,pattern",
    [
        ({"c": 0}, ValueError, r"^c must"),
        ({"c": -0.1}, ValueError, r"^c must"),
        ({"c": float("nan")}, ValueError, r"^c must"),
        ({"c": float("inf")}, ValueError, r"^c must"),
        ({"c": "0.1"}, TypeError, r"^c must"),
        ({"L": 0}, ValueError, r"^L must"),
        ({"L": -512}, ValueError, r"^L must"),
        ({"L": None}, TypeError, r"^L must"),
        ({"hidden": 0}, ValueError, r"^hidden must"),
        ({"hidden": 8.5}, TypeError, r"^hidden must"),
    ],
)
def test_fire_settings(kwargs, error, pattern):
    with pytest.raises(error, match=pattern):
        FIRE(2, **kwargs)


def test_offset_settings():
    with pytest.raises(ValueError, match="max_offset"):
        OffsetBias(2, -1)
    with pytest.raises(TypeError, match="max_offset"):
        OffsetBias(2, 5.0)
    with pytest.raises(ValueError, match="unseen"):
        OffsetBias(2, 5, unseen="wrap")
    with pytest.raises(ValueError, match="unseen"):
        OffsetBias(2, 5, unseen=["clip"])
    with pytest.raises(TypeError, match="bidirectional"):
        OffsetBias(2, 5, bidirectional="yes")


def test_alibi_and_kerple_settings():
    with pytest.raises(TypeError, match="bidirectional"):
        ALiBi(2, bidirectional=None)
    with pytest.raises(ValueError, match="eps"):
        KerplePower(2, eps=2.0)
    with pytest.raises(ValueError, match="eps"):
        KerpleLog(2, eps=0)


@pytest.mark.parametrize("name", ["rope", "ALiBi", "", "kerple", None, ["t5"], 3])
def test_unknown_names(name):
    with pytest.raises(ValueError, match="name must be one of"):
        make_bias(name, 2)


def test_every_name_builds_its_family():
    assert set(relbias.BIAS_NAMES) == set(FAMILIES)
    for name in FAMILIES:
        module = make_bias(name, 3, **FAMILY_KWARGS[name])
        assert isinstance(module, relbias.RelativeBias)
        assert isinstance(module, relbias.BIAS_FAMILIES[name])
        assert module.num_heads == 3


# -- biased_attention shapes ---------------------------------------------------------------


def qkv(b=2, h=3, q=4, k=6, d=8, dv=5):
    return torch.randn(b, h, q, d), torch.randn(b, h, k, d), torch.randn(b, h, k, dv)


def test_attention_q_k_v_types_and_shapes():
    q, k, v = qkv()
    with pytest.raises(TypeError, match="q must be a torch.Tensor"):
        biased_attention(q.tolist(), k, v)
    with pytest.raises(ValueError, match=r"k must have shape \[batch, heads, len, head_dim\]"):
        biased_attention(q, k[0], v)
    with pytest.raises(TypeError, match="v must be a floating-point"):
        biased_attention(q, k, v.long())
    with pytest.raises(ValueError, match="agree in batch"):
        biased_attention(q[:1], k, v)
    with pytest.raises(ValueError, match="multiple of k's"):  # 3 query heads, 2 key heads
        biased_attention(q, k[:, :2], v[:, :2])
    with pytest.raises(ValueError, match="in length"):
        biased_attention(q, k, v[:, :, :5])
    with pytest.raises(ValueError, match="head_dim"):
        biased_attention(q, k[..., :7], v)
    with pytest.raises(ValueError, match="k_len"):
        biased_attention(*qkv(q=7, k=6))  # more queries than keys, no q_start
    with pytest.raises(TypeError, match="causal"):
        biased_attention(q, k, v, causal="yes")


@pytest.mark.parametrize("shape", [(3, 4, 5), (2, 4, 6), (4, 4, 6), (1, 2, 3, 4, 6), (6, 4)])
def test_attention_tensor_bias_must_broadcast(shape):
    with pytest.raises(ValueError, match="bias of shape"):
        biased_attention(*qkv(), torch.zeros(shape))


def test_attention_module_bias_checks():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="num_heads=4"):
        biased_attention(q, k, v, ALiBi(4))
    with pytest.raises(ValueError, match="bidirectional=True"):
        biased_attention(q, k, v, ALiBi(3), causal=False)
    with pytest.raises(ValueError, match="bidirectional=True"):
        biased_attention(q, k, v, OffsetBias(3, 8), causal=False)
    with pytest.raises(TypeError, match="bias must be None, a torch.Tensor"):
        biased_attention(q, k, v, [[0.0]])
    # Bidirectional and even families serve non-causal attention.
    for name in ("sandwich", "kerple_log", "fire"):
        assert biased_attention(q, k, v, build(name), causal=False).shape == (2, 3, 4, 5)


# -- zero lengths -------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize(
    "q_len,k_len,q_start", [(0, None, None), (0, 7, None), (3, 0, 0), (0, 0, 5)]
)
def test_zero_length_returns_empty(name, q_len, k_len, q_start):
    out = build(name)(q_len, k_len, q_start=q_start)
    expected_k = q_len if k_len is None else k_len
    assert out.shape == (3, q_len, expected_k)
    assert out.dtype == torch.float32


def test_zero_length_tables_and_buckets():
    assert ALiBi(2).offset_table(4, 3).shape == (2, 0)
    assert build("kerple_log").offset_table(0, -1).shape == (3, 0)
    empty = torch.zeros(0, dtype=torch.long)
    assert t5_bucket(empty).shape == (0,)
    assert relative_positions(0, 0).shape == (0, 0)
    assert OffsetBias(1, 2, unseen="error").offset_table(0, -1).shape == (1, 0)


# -- no NaN or inf up to 65,536 positions --------------------------------------------------

LONG = 65_536


def long_cases():
    yield "offset", build("offset", 2, max_offset=127, bidirectional=False)
    yield "offset_bidirectional", build("offset", 2, max_offset=127, bidirectional=True)
    yield "t5", build("t5", 2, num_buckets=32, max_distance=128, bidirectional=False)
    yield "t5_bidirectional", build("t5", 2, num_buckets=32, max_distance=128)
    yield "alibi", ALiBi(8)
    yield "alibi_bidirectional", ALiBi(8, bidirectional=True)
    yield "sandwich", Sandwich(2)
    power, log = KerplePower(2), KerpleLog(2)
    with torch.no_grad():  # the steepest settings the constraints allow
        power.r1.fill_(50.0)
        power.r2.fill_(2.0)
        log.r1.fill_(50.0)
        log.r2.fill_(1e3)
    yield "kerple_power", power
    yield "kerple_log", log
    yield "fire", FIRE(2)
    yield "fire_small_L", FIRE(2, c=5.0, L=1.0)
    yield "fire_tiny_c", FIRE(2, c=1e-12, L=2.0)


@pytest.mark.parametrize("case", [name for name, _ in long_cases()])
def test_no_nan_or_inf_up_to_65536(case):
    module = dict(long_cases())[case]
    with torch.no_grad():
        for q_len, q_start in ((1, None), (2, None), (1, 0), (2, LONG - 2)):
            out = module(q_len, LONG, q_start=q_start)
            assert out.shape == (module.num_heads, q_len, LONG)
            assert out.dtype == torch.float32
            assert torch.isfinite(out).all(), (case, q_len, q_start)
