"""Biases are computed and added outside autocast: bfloat16 autocast changes no bias value.

Every family computes its bias under autocast (bit for bit the float32 one); attention
under autocast is one code path per backend and kind of prepared bias (an offset table,
T5's here, and FIRE's MLP).
"""

from __future__ import annotations

import pytest
import torch
from conftest import build, family_bias, qkv

from relbias import biased_attention

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from compiling

AUTOCAST = {"device_type": "cpu", "dtype": torch.bfloat16}
SHAPES = [(9, 9, None), (6, 20, 3)]


@pytest.mark.parametrize("q_len,k_len,q_start", SHAPES)
def test_materialised_bias_is_the_float32_one_under_autocast(family, q_len, k_len, q_start):
    module = build(family, 3)
    with torch.no_grad():
        expected = module(q_len, k_len, q_start=q_start)
        prepared_expected = module.prepare(q_len, k_len, q_start=q_start).materialize()
        with torch.autocast(**AUTOCAST):
            got = module(q_len, k_len, q_start=q_start)
            prepared = module.prepare(q_len, k_len, q_start=q_start).materialize()
    assert got.dtype == expected.dtype == torch.float32
    assert torch.equal(got, expected)
    assert prepared.dtype == torch.float32
    assert torch.equal(prepared, prepared_expected)


def test_fire_mlp_would_be_rounded_by_autocast():
    """The check above means something: FIRE's linear layers are autocast ops."""
    fire = build("fire", 3)
    x = torch.rand(5, 7)
    with torch.no_grad(), torch.autocast(**AUTOCAST):
        assert torch.nn.functional.linear(x[..., None], fire.hidden_layer.weight).dtype == (
            torch.bfloat16
        )
        assert fire.mlp(x).dtype == torch.float32


@pytest.mark.parametrize("backend", ["auto", "materialize", "table", "fused"])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kind", ["t5", "fire"])
def test_attention_under_autocast_is_the_float32_attention(kind, backend, causal):
    bias = family_bias(kind, causal)
    q, k, v = qkv(24, 24)
    with torch.no_grad():
        expected = biased_attention(q, k, v, bias, causal=causal, backend="materialize")
        with torch.autocast(**AUTOCAST):
            got = biased_attention(q, k, v, bias, causal=causal, backend=backend)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_bfloat16_inputs_under_autocast_add_the_bias_in_float32():
    """q, k, v from autocast's bfloat16 matmuls: the scores and the bias meet in float32."""
    bias = family_bias("alibi", True)
    q, k, v = (t.bfloat16() for t in qkv(40, 40))
    with torch.no_grad():
        expected = biased_attention(q.float(), k.float(), v.float(), bias, backend="materialize")
        with torch.autocast(**AUTOCAST):
            got = biased_attention(q, k, v, bias, return_weights=True)
    torch.testing.assert_close(got[0], expected, rtol=1e-5, atol=1e-5)
    assert got[1].dtype == torch.float32


def test_attention_with_gradients_under_autocast():
    bias = family_bias("t5", True)
    q, k, v = qkv(12, 12, grad=True)
    with torch.autocast(**AUTOCAST):
        out = biased_attention(q, k, v, bias)
    out.sum().backward()
    assert bias.weight.grad is not None and q.grad.dtype == torch.float32
