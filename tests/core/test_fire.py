"""FIRE: f_theta(psi(i-j) / psi(max(L, i))) at hand-computed points, below, at and past L."""

from __future__ import annotations

import math

import pytest
import torch

from relbias import FIRE

W1 = [[1.0], [-1.0]]
B1 = [0.0, 0.5]
W2 = [[1.0, 0.0], [2.0, 1.0]]
B2 = [0.1, -0.2]


def fixed_fire(c=0.1, L=10.0, **kwargs) -> FIRE:
    """FIRE with 2 heads and a 2-unit MLP whose weights are set by hand."""
    fire = FIRE(2, hidden=2, c=c, L=L, **kwargs)
    with torch.no_grad():
        fire.hidden_layer.weight.copy_(torch.tensor(W1))
        fire.hidden_layer.bias.copy_(torch.tensor(B1))
        fire.output_layer.weight.copy_(torch.tensor(W2))
        fire.output_layer.bias.copy_(torch.tensor(B2))
    return fire


def f_theta(x: float) -> list[float]:
    """The MLP above by hand: [relu(x) + 0.1, 2 relu(x) + relu(0.5 - x) - 0.2]."""
    return [max(x, 0) + 0.1, 2 * max(x, 0) + max(0.5 - x, 0) - 0.2]


def fire_formula(i: int, j: int, c: float, L: float, eps: float = 1e-6) -> list[float]:
    def psi(x):
        return math.log(c * x + 1)

    return f_theta(psi(abs(i - j)) / (psi(max(L, i)) + eps))


def test_below_L_hand_computed():
    fire = fixed_fire()
    got = fire(4, 4)  # queries 0..3 < L = 10
    # i = 3, j = 1: psi(2)/psi(10) = log(1.2)/log(2)
    x = math.log(1.2) / (math.log(2.0) + 1e-6)
    assert got[:, 3, 1].tolist() == pytest.approx(f_theta(x), rel=1e-6)
    assert f_theta(x) == pytest.approx([x + 0.1, x + 0.3])  # x < 0.5: both ReLUs open
    assert got[:, 3, 3].tolist() == pytest.approx([0.1, 0.3], rel=1e-6)  # x = 0


def test_at_L_hand_computed():
    fire = fixed_fire()
    got = fire(1, 11)  # the query sits at i = 10 = L
    x = math.log(2.0) / (math.log(2.0) + 1e-6)  # j = 0: psi(10)/psi(10), just below 1
    assert got[:, 0, 0].tolist() == pytest.approx([x + 0.1, 2 * x - 0.2], rel=1e-6)
    assert got[:, 0, 0].tolist() == pytest.approx([1.1, 1.8], rel=1e-5)


def test_far_past_L_hand_computed():
    fire = fixed_fire()
    got = fire(1, 1001)  # i = 1000 >> L
    denominator = math.log(101.0) + 1e-6
    x0 = math.log(101.0) / denominator  # j = 0: the input stays at 1
    x990 = math.log(2.0) / denominator  # j = 990: offset 10
    assert got[:, 0, 0].tolist() == pytest.approx(f_theta(x0), rel=1e-6)
    assert got[:, 0, 990].tolist() == pytest.approx(f_theta(x990), rel=1e-6)


@pytest.mark.parametrize("c,L", [(0.1, 10.0), (1.0, 3.5), (0.01, 512.0)])
def test_matches_the_formula_everywhere(c, L):
    fire = fixed_fire(c=c, L=L)
    q_len, k_len, q_start = 5, 30, 20
    got = fire(q_len, k_len, q_start=q_start)
    expected = torch.tensor(
        [[fire_formula(q_start + r, j, c, L) for j in range(k_len)] for r in range(q_len)]
    ).permute(2, 0, 1)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_decoding_with_a_cache_uses_the_absolute_query_position():
    torch.manual_seed(3)
    fire = FIRE(4, hidden=8, L=16.0)
    full = fire(60)
    close = dict(rtol=1e-6, atol=1e-6)  # float32 rounding of the vectorised MLP
    torch.testing.assert_close(fire(1, 60), full[:, -1:], **close)
    torch.testing.assert_close(fire(1, 60, q_start=59), full[:, -1:], **close)
    torch.testing.assert_close(fire(3, 60), full[:, -3:], **close)
    torch.testing.assert_close(fire(5, 60, q_start=20), full[:, 20:25], **close)
    # The same keys seen from query 0 are a different row: FIRE is not offset-only.
    assert not torch.equal(fire(1, 60, q_start=0), full[:, -1:])


def test_normalized_input_stays_in_unit_range_past_L():
    fire = FIRE(1, L=8.0)
    x = fire.normalized_input(1, 5000)  # query at 4999, keys 0..4999
    assert x.min() == 0 and x.max() <= 1
    assert x[0, 0].item() == pytest.approx(1.0, abs=1e-5)


def test_threshold_and_scale_are_learnable_or_fixed():
    fire = FIRE(2, c=0.5, L=64)
    assert fire.L.item() == 64.0
    assert fire.c.requires_grad and fire.L_multiplier.requires_grad
    fire(3, 100).sum().backward()  # queries 97..99 > L: L does not matter
    assert fire.c.grad is not None and fire.c.grad != 0
    assert fire.L_multiplier.grad == 0
    fire.zero_grad()
    fire(3, 30).sum().backward()  # queries < L: L is the normaliser
    assert fire.L_multiplier.grad != 0
    fixed = FIRE(2, learn_c=False, learn_L=False)
    assert not fixed.c.requires_grad and not fixed.L_multiplier.requires_grad
    assert fixed.c.item() == pytest.approx(0.1) and fixed.L.item() == 512.0


def test_the_mlp_under_compile_gives_the_eager_values_and_gradients():
    """FIRE's MLP compiled in one graph (no autocast switch or host read breaks it) gives the
    eager MLP's values and gradients."""
    torch.manual_seed(3)
    fire = FIRE(4, hidden=8)
    x = torch.rand(2, 5, 7, requires_grad=True)
    eager = fire.mlp(x)
    grads = torch.autograd.grad(eager.square().sum(), [x, *fire.parameters()], allow_unused=True)
    compiled = torch.compile(fire.mlp, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager, rtol=0, atol=1e-6)
    again = torch.autograd.grad(compiled.square().sum(), [x, *fire.parameters()], allow_unused=True)
    for a, b in zip(again, grads):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
