"""biased_attention against a plain softmax(q k^T / sqrt(d) + bias + mask) v."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FAMILY_KWARGS, build

from relbias import ALiBi, biased_attention, make_bias


def plain_attention(q, k, v, bias=None, *, causal=True, q_start=None):
    """softmax(q k^T / sqrt(d) + bias + mask) v, written out; returns (output, weights)."""
    q_len, k_len, d = q.shape[2], k.shape[2], q.shape[3]
    start = k_len - q_len if q_start is None else q_start
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) / math.sqrt(d)
    if bias is not None:
        scores = scores + bias
    if causal:
        for r in range(q_len):
            for j in range(k_len):
                if j > start + r:
                    scores[..., r, j] = float("-inf")
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True))
    weights = weights / weights.sum(dim=-1, keepdim=True)
    return torch.einsum("bhqk,bhkd->bhqd", weights, v), weights


def qkv(batch=2, heads=3, q_len=5, k_len=5, d=8, dv=6, dtype=torch.float64):
    q = torch.randn(batch, heads, q_len, d, dtype=dtype)
    k = torch.randn(batch, heads, k_len, d, dtype=dtype)
    v = torch.randn(batch, heads, k_len, dv, dtype=dtype)
    return q, k, v


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len", [(5, 5), (1, 9), (3, 10)])
def test_no_bias(causal, q_len, k_len):
    q, k, v = qkv(q_len=q_len, k_len=k_len)
    expected, _ = plain_attention(q, k, v, causal=causal)
    torch.testing.assert_close(biased_attention(q, k, v, causal=causal), expected)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "bias_shape", [(2, 3, 4, 7), (3, 4, 7), (1, 3, 4, 7), (4, 7), (1, 1, 1, 7), (3, 1, 1)]
)
def test_tensor_bias_broadcasts(causal, bias_shape):
    q, k, v = qkv(q_len=4, k_len=7)
    bias = torch.randn(bias_shape, dtype=torch.float64)
    expected, weights = plain_attention(q, k, v, bias, causal=causal)
    torch.testing.assert_close(biased_attention(q, k, v, bias, causal=causal), expected)
    out, got_weights = biased_attention(q, k, v, bias, causal=causal, return_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got_weights, weights)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len", [(6, 6), (1, 12), (4, 12)])
def test_every_family_as_a_module(family, causal, q_len, k_len):
    module = build(family, 3).double()
    q, k, v = qkv(heads=3, q_len=q_len, k_len=k_len)
    table = module(q_len, k_len).detach()
    expected, weights = plain_attention(q, k, v, table, causal=causal)
    torch.testing.assert_close(biased_attention(q, k, v, module, causal=causal), expected)
    out, got = biased_attention(q, k, v, module, causal=causal, return_weights=True)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(got, weights)


def test_explicit_q_start():
    module = ALiBi(3)
    q, k, v = qkv(q_len=2, k_len=9, dtype=torch.float32)
    table = module(2, 9, q_start=3)
    expected, _ = plain_attention(q, k, v, table, q_start=3)
    got = biased_attention(q, k, v, module, q_start=3)
    torch.testing.assert_close(got, expected)
    # Not the same as the default (queries last, at 7 and 8).
    assert not torch.allclose(got, biased_attention(q, k, v, module))


def test_decoding_with_a_cache_equals_the_last_rows():
    for name in FAMILY_KWARGS:
        module = build(name, 3).double()
        q, k, v = qkv(q_len=10, k_len=10)
        full = biased_attention(q, k, v, module)
        step = biased_attention(q[:, :, -1:], k, v, module)
        torch.testing.assert_close(step, full[:, :, -1:], msg=name)


@pytest.mark.parametrize("causal", [True, False])
def test_weights_sum_to_one_and_vanish_on_masked_keys(causal):
    module = make_bias("kerple_log", 3)
    q, k, v = qkv(q_len=4, k_len=9, dtype=torch.float32)
    out, weights = biased_attention(q, k, v, module, causal=causal, return_weights=True)
    assert weights.shape == (2, 3, 4, 9)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 3, 4))
    future = torch.arange(9)[None, :] > torch.arange(5, 9)[:, None]
    if causal:
        assert (weights[..., future] == 0).all()
        assert (weights[..., ~future] > 0).all()
    else:
        assert (weights > 0).all()
    torch.testing.assert_close(out, biased_attention(q, k, v, module, causal=causal))


def test_float32_agrees_with_float64():
    q, k, v = qkv(q_len=5, k_len=11)
    module = build("t5", 3)
    expected = biased_attention(q, k, v, module.double())
    got = biased_attention(q.float(), k.float(), v.float(), module.float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), expected, rtol=1e-5, atol=1e-5)


def test_bias_shifts_attention_towards_near_keys():
    # Identical keys: with no bias attention is uniform; ALiBi favours the nearest key.
    q = torch.ones(1, 1, 1, 4)
    k = torch.ones(1, 1, 6, 4)
    v = torch.arange(6.0).reshape(1, 1, 6, 1)
    _, uniform = biased_attention(q, k, v, return_weights=True)
    torch.testing.assert_close(uniform, torch.full((1, 1, 1, 6), 1 / 6))
    _, w = biased_attention(q, k, v, ALiBi(1), return_weights=True)
    assert (w[0, 0, 0].diff() > 0).all()  # the nearest key (j = 5) gets the most


@pytest.mark.parametrize("q_len,k_len,q_start", [(0, 0, None), (0, 5, None), (3, 0, 0)])
def test_zero_length(q_len, k_len, q_start):
    q, k, v = qkv(q_len=q_len, k_len=k_len)
    out = biased_attention(q, k, v, ALiBi(3), q_start=q_start)
    assert out.shape == (2, 3, q_len, 6)
    assert (out == 0).all()
    out, w = biased_attention(q, k, v, ALiBi(3), q_start=q_start, return_weights=True)
    assert out.shape == (2, 3, q_len, 6) and w.shape == (2, 3, q_len, k_len)


def _scaled_reference(q, k, v, table, scale, q_start=None):
    """plain_attention with the scores' factor ``scale`` in place of 1/sqrt(d)."""
    factor = scale * math.sqrt(q.shape[-1])
    return plain_attention(q * factor, k, v, table, q_start=q_start)[0]


@pytest.mark.parametrize("backend", ["materialize", "table", "fused", "flex"])
@pytest.mark.parametrize("family", ["alibi", "t5", "kerple_log", "fire"])
def test_a_given_scale_replaces_one_over_sqrt_d(backend, family):
    """HF passes its own ``scaling``: every backend uses it, the bias still added after it."""
    module = build(family, 3).float()
    torch.manual_seed(0)
    q, k, v = qkv(heads=3, q_len=4, k_len=11, d=16, dv=16, dtype=torch.float32)
    table = module(4, 11).detach()
    for scale in (0.05, 0.7):
        expected = _scaled_reference(q, k, v, table, scale)
        with torch.no_grad():
            got = biased_attention(q, k, v, module, backend=backend, scale=scale)
            # scale = 1/sqrt(d) is the default exactly (no extra multiplication)
            same = biased_attention(q, k, v, module, backend=backend, scale=1 / math.sqrt(16))
            default = biased_attention(q, k, v, module, backend=backend)
        torch.testing.assert_close(got, expected, atol=2e-5, rtol=1e-4)
        assert torch.equal(same, default)


@pytest.mark.parametrize("backend", ["materialize", "fused"])
def test_the_scale_reaches_the_gradients(backend):
    module = build("kerple_power", 3).float()
    q, k, v = (
        t.requires_grad_() for t in qkv(heads=3, q_len=6, k_len=6, d=16, dtype=torch.float32)
    )
    grads = {}
    for name, fn in (
        ("got", lambda: biased_attention(q, k, v, module, backend=backend, scale=0.2)),
        ("ref", lambda: _scaled_reference(q, k, v, module(6, 6), 0.2)),
    ):
        out = fn()
        grads[name] = torch.autograd.grad(out.square().sum(), (q, k, v, *module.parameters()))
    for got, ref in zip(grads["got"], grads["ref"]):
        torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), True, "0.1"])
def test_a_bad_scale_is_named(bad):
    q, k, v = qkv()
    with pytest.raises((TypeError, ValueError), match="scale must be a positive"):
        biased_attention(q, k, v, None, scale=bad)
