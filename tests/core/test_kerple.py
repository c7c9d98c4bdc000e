"""Kerple power and log: the formulas at hand-computed points and the enforced constraints."""

from __future__ import annotations

import copy
import io
import math

import pytest
import torch

from relbias import ALiBi, KerpleLog, KerplePower, alibi_slopes, relative_positions
from relbias.biases.kerple import project_after_steps


def with_params(cls, r1, r2, **kwargs):
    module = cls(len(r1), **kwargs)
    with torch.no_grad():
        module.r1.copy_(torch.tensor(r1))
        module.r2.copy_(torch.tensor(r2))
    return module


def test_power_hand_computed_points():
    bias = with_params(KerplePower, [0.5, 2.0], [1.0, 1.5])
    got = bias(1, 5)  # offsets 4, 3, 2, 1, 0
    assert got[0, 0].tolist() == [-2.0, -1.5, -1.0, -0.5, 0.0]
    assert got[1, 0, 0].item() == pytest.approx(-2.0 * 4**1.5)  # -16
    assert got[1, 0, 1].item() == pytest.approx(-2.0 * 3**1.5, rel=1e-6)


def test_log_hand_computed_points():
    bias = with_params(KerpleLog, [1.0, 0.5], [2.0, 0.25])
    got = bias(1, 5)
    assert got[0, 0, 1].item() == pytest.approx(-math.log(7.0), rel=1e-6)  # offset 3
    assert got[1, 0, 0].item() == pytest.approx(-0.5 * math.log(2.0), rel=1e-6)  # offset 4
    assert got[:, 0, 4].tolist() == [0.0, 0.0]


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
def test_formula_on_a_grid_and_even_in_the_offset(cls):
    bias = with_params(cls, [0.3, 1.7, 0.9], [0.2, 1.1, 1.9])
    d = relative_positions(7, 11).abs().double()
    r1 = bias.r1.detach().double()[:, None, None]
    r2 = bias.r2.detach().double()[:, None, None]
    if cls is KerplePower:
        expected = -r1 * d**r2
    else:
        expected = -r1 * torch.log1p(r2 * d)
    torch.testing.assert_close(bias(7, 11).double(), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(bias(6, 6, q_start=0), bias(6, 6, q_start=0).transpose(1, 2))


def test_power_with_exponent_one_is_alibi_with_learned_slopes():
    slopes = alibi_slopes(4)
    # The smallest slope, 1/256, is below the default floor eps = 1e-2 on r1 (the
    # reference code's clamp), so lower the floor.
    kerple = with_params(KerplePower, slopes.tolist(), [1.0] * 4, eps=1e-4)
    alibi = ALiBi(4, bidirectional=True)
    torch.testing.assert_close(kerple(9, 13), alibi(9, 13))
    floored = with_params(KerplePower, slopes.tolist(), [1.0] * 4)
    floored(2)
    assert floored.r1[3].item() == pytest.approx(1e-2)


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
def test_initial_parameters_satisfy_the_constraints(cls):
    for _ in range(5):
        bias = cls(16)
        assert (bias.r1 > 0).all() and (bias.r2 > 0).all()
        if cls is KerplePower:
            assert (bias.r2 <= 2).all()


def test_forward_projects_out_of_range_parameters():
    power = with_params(KerplePower, [-1.0, 0.5], [5.0, -3.0])
    out = power(3, 3)
    assert (power.r1 > 0).all()
    assert (power.r2 > 0).all() and (power.r2 <= 2).all()
    assert power.r2[0].item() == 2.0
    assert torch.isfinite(out).all() and (out <= 0).all()
    log = with_params(KerpleLog, [-1.0, 0.5], [50.0, -3.0])
    out = log(3, 3)
    assert (log.r1 > 0).all() and (log.r2 > 0).all()
    assert log.r2[0].item() == 50.0  # no upper bound on r2 for the log form
    assert torch.isfinite(out).all() and (out <= 0).all()


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam, torch.optim.AdamW])
def test_constraints_hold_right_after_an_optimiser_step(cls, optimizer):
    bias = with_params(cls, [0.5, 0.5], [1.0, 1.9])
    opt = optimizer(bias.parameters(), lr=10.0)
    project_after_steps(opt, bias)
    for _ in range(3):
        opt.zero_grad()
        # Push r1 and r2 below 0, and r2 of head 1 above 2.
        loss = bias.r1.sum() + bias.r2[0] - 100 * bias.r2[1]
        loss.backward()
        opt.step()
        # No forward in between: the optimiser step itself must leave them valid.
        assert (bias.r1 > 0).all(), bias.r1
        assert (bias.r2 > 0).all(), bias.r2
        if cls is KerplePower:
            assert (bias.r2 <= 2).all(), bias.r2
    if cls is KerpleLog:
        assert bias.r2[1] > 2  # the log form has no upper bound: the push went through


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
def test_two_forwards_then_one_backward(cls):
    # A module shared by two layers is called twice before backward: the projection
    # at each forward must not invalidate the first call's graph.
    bias = with_params(cls, [0.5, 1.5], [0.7, 1.2])
    first, second = bias(5), bias(3, 7)
    (first.sum() + second.sum()).backward()
    assert bias.r1.grad is not None and (bias.r1.grad < 0).all()
    # ...while a parameter that breaks its constraint is still projected.
    with torch.no_grad():
        bias.r1[0] = -1.0
    bias(2)
    assert bias.r1[0].item() == pytest.approx(bias.eps)


@pytest.mark.parametrize("how", ["deepcopy", "torch.load"])
def test_copies_are_projected_after_optimiser_steps(how):
    original = with_params(KerplePower, [0.5, 1.0], [1.0, 1.5])
    if how == "deepcopy":
        module = copy.deepcopy(original)
    else:
        buffer = io.BytesIO()
        torch.save(original, buffer)
        buffer.seek(0)
        module = torch.load(buffer, weights_only=False)
    opt = torch.optim.SGD(module.parameters(), lr=10.0)
    project_after_steps(opt, module)
    (100 * module.r1.sum() - 100 * module.r2.sum()).backward()
    opt.step()
    assert (module.r1 > 0).all()
    assert (module.r2 > 0).all() and (module.r2 <= 2).all()


def test_importing_kerple_registers_no_global_hook():
    """No process-wide optimiser hook: only the optimiser project_after_steps is given to."""
    from torch.optim.optimizer import _global_optimizer_post_hooks

    import relbias.biases.kerple as kerple

    assert not any(
        getattr(hook, "__module__", "") == kerple.__name__
        for hook in _global_optimizer_post_hooks.values()
    )
    bias = with_params(KerplePower, [0.5, 0.5], [1.0, 1.0])
    opt = torch.optim.SGD(bias.parameters(), lr=10.0)
    (100 * bias.r1.sum()).backward()
    opt.step()  # no hook attached: the step leaves r1 below its floor ...
    assert (bias.r1 < 0).all()
    out = bias(3)  # ... and the module clamps it at use, so its bias obeys the constraint
    assert (bias.r1 >= bias.eps).all() and (out <= 0).all()


def test_project_after_steps_finds_kerple_biases_in_a_model_and_detaches():
    model = torch.nn.Sequential(
        torch.nn.Linear(2, 2), with_params(KerplePower, [0.5, 0.5], [1.0, 1.0])
    )
    kerple = model[1]
    opt = torch.optim.SGD(model.parameters(), lr=10.0)
    handle = project_after_steps(opt, [model])
    (100 * kerple.r1.sum() - 100 * kerple.r2.sum()).backward()
    opt.step()
    assert (kerple.r1 >= kerple.eps).all() and (kerple.r2 <= 2).all()
    handle.remove()
    opt.zero_grad()
    (100 * kerple.r1.sum()).backward()
    opt.step()
    assert (kerple.r1 < 0).all()  # detached: no projection after this step
    other = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    project_after_steps(other, kerple)  # an optimiser that does not hold r1, r2
    other.step()
    assert (kerple.r1 < 0).all()
    with pytest.raises(TypeError, match="optimizer"):
        project_after_steps(kerple, kerple)
    with pytest.raises(TypeError, match="modules"):
        project_after_steps(opt, 3)


def test_power_started_at_alibi_is_alibi_and_keeps_a_fixed_exponent():
    slopes = alibi_slopes(4).tolist()
    kerple = KerplePower(4, r1_init=slopes, r2_init=1.0, learn_r2=False, eps=1e-3)
    visible = relative_positions(9) >= 0
    assert torch.equal(kerple(9)[:, visible], ALiBi(4)(9)[:, visible])
    assert kerple.r1.requires_grad and not kerple.r2.requires_grad
    opt = torch.optim.AdamW([p for p in kerple.parameters() if p.requires_grad], lr=0.1)
    kerple(9).sum().backward()
    opt.step()
    assert torch.equal(kerple.r2, torch.ones(4))
    assert not torch.equal(kerple.r1, torch.tensor(slopes))


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
def test_a_given_start_draws_no_random_numbers(cls):
    torch.manual_seed(3)
    cls(4, r1_init=0.5, r2_init=0.5)
    after_given = torch.rand(1)
    torch.manual_seed(3)
    after_nothing = torch.rand(1)
    assert torch.equal(after_given, after_nothing)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"r2_init": 3.0}, ValueError, r"r2_init must be .* each in \[0.01, 2.0\], got 3.0"),
        ({"r2_init": 0.0}, ValueError, "r2_init must be"),
        ({"r1_init": [1.0, 2.0]}, ValueError, r"r1_init must be a number or 4 numbers"),
        ({"r1_init": "x"}, TypeError, "r1_init must be a number or a sequence of 4 numbers"),
        ({"r1_init": True}, ValueError, "r1_init must be"),
        ({"learn_r2": 1}, TypeError, "learn_r2 must be True or False"),
    ],
)
def test_bad_starts_name_the_parameter(kwargs, error, message):
    with pytest.raises(error, match=message):
        KerplePower(4, **kwargs)


@pytest.mark.parametrize("cls", [KerplePower, KerpleLog])
def test_under_torch_compile_one_graph_with_the_projected_values_and_gradients(cls):
    """``fullgraph=True``: no graph break for the projection. Parameters off their constraints
    give the values and gradients of the projected parameters (what eager computes after
    projecting them in place); the stored parameters are left for the next eager call."""
    torch.manual_seed(0)
    bias = cls(4)
    with torch.no_grad():
        bias.r1[0] = -0.5
        bias.r2[1] = 5.0 if cls is KerplePower else -1.0
    eager = copy.deepcopy(bias)
    expected = eager(6, 9)
    expected.square().sum().backward()
    compiled = torch.compile(lambda: bias(6, 9), fullgraph=True, backend="aot_eager")
    got = compiled()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-6)
    got.square().sum().backward()
    torch.testing.assert_close(bias.r1.grad, eager.r1.grad, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(bias.r2.grad, eager.r2.grad, rtol=1e-6, atol=1e-6)
    assert float(bias.r1[0]) == -0.5  # not projected in place under compile
    bias(6, 9)
    assert float(bias.r1[0]) == pytest.approx(bias.eps)  # ... and projected by the next eager call
