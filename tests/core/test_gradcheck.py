"""torch.autograd.gradcheck in float64: every learnable family, and biased_attention."""

from __future__ import annotations

import pytest
import torch
from conftest import build
from torch.func import functional_call

from relbias import biased_attention

LEARNABLE = ["offset", "t5", "kerple_power", "kerple_log", "fire"]


def learnable_parameters(module):
    return {name: p for name, p in module.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("name", LEARNABLE)
@pytest.mark.parametrize("q_len,k_len,q_start", [(4, 4, None), (2, 9, None), (3, 8, 5)])
def test_gradcheck_parameters(name, q_len, k_len, q_start):
    module = build(name, 2).double()
    if name.startswith("kerple"):
        with torch.no_grad():  # well inside the constraints, away from the clamps
            module.r1.copy_(torch.tensor([0.7, 1.3]))
            module.r2.copy_(torch.tensor([0.6, 1.4]))
    params = learnable_parameters(module)
    assert params, name
    names = list(params)
    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)

    def bias_of(*tensors):
        params = dict(zip(names, tensors))
        return functional_call(module, params, (q_len, k_len), {"q_start": q_start})

    assert bias_of(*inputs).dtype == torch.float64
    assert torch.autograd.gradcheck(bias_of, inputs, eps=1e-6, atol=1e-5)


def test_gradcheck_fire_threshold_and_scale_below_L():
    # Queries 0..7 with L = 5.5: both branches of max(L, i) are exercised.
    module = build("fire", 2).double()
    assert module.L.item() == 5.5
    names = ["c", "L_multiplier"]
    inputs = tuple(getattr(module, n).detach().clone().requires_grad_(True) for n in names)

    def bias_of(c, lam):
        return functional_call(module, {"c": c, "L_multiplier": lam}, (8, 8))

    assert torch.autograd.gradcheck(bias_of, inputs, eps=1e-6, atol=1e-5)


@pytest.mark.parametrize(
    "name,causal,return_weights",
    [
        ("kerple_log", True, False),
        ("kerple_log", False, False),
        ("kerple_log", True, True),
        ("kerple_log", False, True),
        ("fire", True, False),
        ("alibi", True, True),
    ],
)
def test_gradcheck_attention_qkv(name, causal, return_weights):
    module = build(name, 2).double()
    q = torch.randn(1, 2, 2, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 4, 2, dtype=torch.float64, requires_grad=True)

    def attend(q, k, v):  # with return_weights, gradcheck checks the weights too
        return biased_attention(q, k, v, module, causal=causal, return_weights=return_weights)

    assert torch.autograd.gradcheck(attend, (q, k, v), eps=1e-6, atol=1e-5)


def test_gradcheck_attention_tensor_bias():
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64, requires_grad=True)
    v = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(2, 3, 5, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda q, k, v, b: biased_attention(q, k, v, b), (q, k, v, bias), eps=1e-6, atol=1e-5
    )


def test_gradcheck_attention_through_kerple_parameters():
    module = build("kerple_power", 2).double()
    with torch.no_grad():
        module.r1.copy_(torch.tensor([0.4, 0.9]))
        module.r2.copy_(torch.tensor([0.8, 1.5]))
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    inputs = tuple(p.detach().clone().requires_grad_() for p in (module.r1, module.r2))

    def attend(r1, r2):
        bias = functional_call(module, {"r1": r1, "r2": r2}, (6, 6))
        return biased_attention(q, k, v, bias)

    assert torch.autograd.gradcheck(attend, inputs, eps=1e-6, atol=1e-5)
