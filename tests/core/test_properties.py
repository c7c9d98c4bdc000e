"""Properties over many random inputs (hypothesis)."""

from __future__ import annotations

import math

import torch
from conftest import build
from hypothesis import given, settings
from hypothesis import strategies as st

from relbias import FIRE, ALiBi, KerpleLog, KerplePower, OffsetBias, relative_positions, t5_bucket
from relbias.biases.kerple import project_after_steps

FAST = settings(max_examples=60, deadline=None)
OFFSET_ONLY = ["offset", "t5", "alibi", "sandwich", "kerple_power", "kerple_log"]


@st.composite
def lengths(draw, max_len=24, max_start=60):
    """(q_len, k_len, q_start): q_start None means the queries are the last q_len keys."""
    q_len = draw(st.integers(1, max_len))
    if draw(st.booleans()):
        k_len = draw(st.integers(q_len, max_len + q_len))
        return q_len, k_len, None
    return q_len, draw(st.integers(1, max_len)), draw(st.integers(0, max_start))


def rounding(name):
    """Exact for table lookups and products; a few ulps where pow, log1p or FIRE's MLP
    run vectorised (the same input may round differently in different SIMD lanes)."""
    if name in ("kerple_power", "kerple_log", "fire"):
        return dict(rtol=1e-6, atol=1e-6)
    return dict(rtol=0, atol=0)


def absolute_start(q_len, k_len, q_start):
    return k_len - q_len if q_start is None else q_start


def kerple(cls, draw, num_heads):
    module = cls(num_heads)
    r2_max = 2.0 if cls is KerplePower else 20.0
    r1 = draw(st.lists(st.floats(0.01, 10.0), min_size=num_heads, max_size=num_heads))
    r2 = draw(st.lists(st.floats(0.01, r2_max), min_size=num_heads, max_size=num_heads))
    with torch.no_grad():
        module.r1.copy_(torch.tensor(r1))
        module.r2.copy_(torch.tensor(r2))
    return module


# -- only the offset matters -------------------------------------------------------------


@FAST
@given(
    name=st.sampled_from(OFFSET_ONLY),
    heads=st.integers(1, 4),
    shape=lengths(),
    shift=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_offset_only_families_depend_only_on_i_minus_j(name, heads, shape, shift, seed):
    torch.manual_seed(seed)
    module = build(name, heads)
    q_len, k_len, q_start = shape
    start = absolute_start(*shape)
    bias = module(q_len, k_len, q_start=q_start)
    assert bias.shape == (heads, q_len, k_len)
    d = relative_positions(q_len, k_len, q_start=start)
    for offset in d.unique():
        values = bias[:, d == offset]
        assert (values == values[:, :1]).all()
    # Moving queries and keys together by `shift` positions changes nothing.
    moved = module(q_len, k_len + shift, q_start=start + shift)[:, :, shift:]
    torch.testing.assert_close(moved, bias, **rounding(name))


@FAST
@given(
    heads=st.integers(1, 3),
    L=st.floats(2.0, 60.0),
    q_len=st.integers(1, 20),
    k_len=st.integers(1, 30),
    data=st.data(),
    seed=st.integers(0, 2**16),
)
def test_fire_below_L_depends_only_on_i_minus_j(heads, L, q_len, k_len, data, seed):
    torch.manual_seed(seed)
    fire = FIRE(heads, hidden=8, L=L)
    last = math.ceil(L) - 1  # the largest position i < L
    if q_len > last + 1:
        q_len = last + 1
    q_start = data.draw(st.integers(0, last - q_len + 1))
    bias = fire(q_len, k_len, q_start=q_start)
    d = relative_positions(q_len, k_len, q_start=q_start)
    x = fire.normalized_input(q_len, k_len, q_start=q_start)
    for offset in d.unique():
        # The MLP's input is exactly a function of the offset...
        assert (x[d == offset] == x[d == offset][0]).all()
        # ...and so is its output, up to float32 rounding (the vectorised MLP may round
        # the same input differently in different lanes).
        values = bias[:, d == offset]
        torch.testing.assert_close(values, values[:, :1].expand_as(values), rtol=1e-6, atol=1e-6)


@FAST
@given(
    L=st.floats(1.0, 100.0),
    past=st.integers(0, 200),
    later=st.integers(1, 500),
    offset=st.integers(1, 50),
)
def test_fire_past_L_does_not_depend_only_on_i_minus_j(L, past, later, offset):
    # An MLP that is strictly increasing in its input: f(x) = relu(x) + 0.
    fire = FIRE(1, hidden=1, L=L)
    with torch.no_grad():
        fire.hidden_layer.weight.fill_(1.0)
        fire.hidden_layer.bias.zero_()
        fire.output_layer.weight.fill_(1.0)
        fire.output_layer.bias.zero_()
    i1 = max(int(L) + 1, offset) + past  # i1 > L and i1 - offset >= 0
    i2 = i1 + later
    first = fire(1, i1 + 1)[0, 0, i1 - offset]
    second = fire(1, i2 + 1)[0, 0, i2 - offset]
    # The same offset, farther past L: a smaller input psi(offset)/psi(i), a smaller bias.
    assert second < first


@FAST
@given(
    name=st.sampled_from(OFFSET_ONLY + ["fire"]),
    heads=st.integers(1, 3),
    shape=lengths(),
    seed=st.integers(0, 2**16),
)
def test_rows_equal_single_query_calls(name, heads, shape, seed):
    # Every family, FIRE included: row r is what a one-token decoding step at that
    # absolute position returns.
    torch.manual_seed(seed)
    module = build(name, heads)
    q_len, k_len, q_start = shape
    start = absolute_start(*shape)
    bias = module(q_len, k_len, q_start=q_start)
    for r in range(q_len):
        torch.testing.assert_close(
            module(1, k_len, q_start=start + r)[:, 0], bias[:, r], **rounding(name)
        )


# -- distance penalties ----------------------------------------------------------------


@FAST
@given(
    family=st.sampled_from(["alibi", "alibi_bidirectional", "kerple_power", "kerple_log"]),
    heads=st.integers(1, 16),
    n=st.integers(1, 5000),
    data=st.data(),
)
def test_penalties_never_increase_with_distance_and_vanish_at_zero(family, heads, n, data):
    if family == "kerple_power":
        module = kerple(KerplePower, data.draw, heads)
    elif family == "kerple_log":
        module = kerple(KerpleLog, data.draw, heads)
    else:
        module = ALiBi(heads, bidirectional=family == "alibi_bidirectional")
    table = module.offset_table(-n, n)  # offsets -n..n
    past = table[:, n:]  # distances 0..n to past keys (i - j >= 0)
    assert (past[:, 0] == 0).all()
    assert (past <= 0).all()
    assert (past.diff(dim=1) <= 0).all()
    if family != "alibi":  # causal ALiBi leaves masked future keys unpenalised
        future = table[:, : n + 1].flip(1)  # distances 0..n to future keys
        # Even in i - j (up to the last bit: vectorised pow may round differently).
        torch.testing.assert_close(future, past, rtol=1e-6, atol=0)
    else:
        assert (table[:, :n] > 0).all()


@FAST
@given(
    heads=st.integers(1, 8),
    half=st.integers(1, 128),
    shape=lengths(max_len=40, max_start=3000),
)
def test_sandwich_zero_on_the_diagonal_penalty_elsewhere(heads, half, shape):
    module = build("sandwich", heads, dim=2 * half)
    q_len, k_len, q_start = shape
    bias = module(q_len, k_len, q_start=q_start)
    d = relative_positions(q_len, k_len, q_start=absolute_start(*shape))
    assert (bias[:, d == 0] == 0).all()
    assert (bias[:, d != 0] <= 0).all()
    assert torch.isfinite(bias).all()


# -- buckets ---------------------------------------------------------------------------


@st.composite
def bucket_settings(draw):
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.integers(4 if bidirectional else 2, 300))
    per_side = num_buckets // 2 if bidirectional else num_buckets
    max_distance = draw(st.integers(per_side // 2 + 1, 10_000))
    return dict(num_buckets=num_buckets, max_distance=max_distance, bidirectional=bidirectional)


@settings(max_examples=150, deadline=None)
@given(kwargs=bucket_settings(), n=st.integers(1, 20_000))
def test_buckets_in_range_and_never_decrease_with_distance(kwargs, n):
    distance = torch.arange(0, n + 1)
    past = t5_bucket(distance, **kwargs)
    future = t5_bucket(-distance, **kwargs)
    for buckets in (past, future):
        assert buckets.min() >= 0 and buckets.max() < kwargs["num_buckets"]
        assert (buckets[1:].diff() >= 0).all()
    assert past[0] == 0
    if kwargs["bidirectional"]:
        half = kwargs["num_buckets"] // 2
        assert (future[1:] >= half).all() and (past < half).all()
    else:
        assert (future == 0).all()


# -- Kerple's constraints survive optimisers that push against them ----------------------

OPTIMIZERS = {
    "sgd": lambda p, lr: torch.optim.SGD(p, lr=lr),
    "sgd_momentum": lambda p, lr: torch.optim.SGD(p, lr=lr, momentum=0.9, nesterov=True),
    "adam": lambda p, lr: torch.optim.Adam(p, lr=lr),
    "adamw": lambda p, lr: torch.optim.AdamW(p, lr=lr, weight_decay=0.5),
    "rmsprop": lambda p, lr: torch.optim.RMSprop(p, lr=lr),
    "adagrad": lambda p, lr: torch.optim.Adagrad(p, lr=lr),
}


@FAST
@given(
    power=st.booleans(),
    optimizer=st.sampled_from(sorted(OPTIMIZERS)),
    lr=st.floats(1e-2, 1e3),
    steps=st.integers(1, 4),
    pushes=st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3),
    seed=st.integers(0, 2**16),
)
def test_kerple_constraints_hold_after_optimiser_steps(power, optimizer, lr, steps, pushes, seed):
    torch.manual_seed(seed)
    module = (KerplePower if power else KerpleLog)(3)
    opt = OPTIMIZERS[optimizer](module.parameters(), lr)
    project_after_steps(opt, module)
    p1, p2, p3 = pushes
    for _ in range(steps):
        opt.zero_grad()
        # Drive r1 and r2 below 0 and r2 above 2 (signs of the pushes vary), plus a
        # forward-pass loss so the gradients also come through the bias itself.
        loss = (
            abs(p1) * module.r1.sum()
            + abs(p2) * module.r2[0]
            - abs(p3) * module.r2[1]
            + p1 * module.r2[2]
            + module(4).sum()
        )
        loss.backward()
        opt.step()
        # Checked right after the step, with no forward in between.
        assert (module.r1 > 0).all()
        assert (module.r2 > 0).all()
        if power:
            assert (module.r2 <= 2).all()


# -- OffsetBias: clipping and refusing unseen offsets -----------------------------------


@FAST
@given(
    max_offset=st.integers(0, 10),
    bidirectional=st.booleans(),
    shape=lengths(max_len=16, max_start=30),
    seed=st.integers(0, 2**16),
)
def test_offset_clip_shares_the_edge_parameter(max_offset, bidirectional, shape, seed):
    torch.manual_seed(seed)
    bias = OffsetBias(2, max_offset, bidirectional=bidirectional)
    with torch.no_grad():
        bias.weight.normal_()
    u = bias.weight.detach()
    q_len, k_len, q_start = shape
    got = bias(q_len, k_len, q_start=q_start)
    d = relative_positions(q_len, k_len, q_start=absolute_start(*shape))
    low = -max_offset if bidirectional else 0
    for offset in d.unique().tolist():
        expected = u[:, min(max(offset, low), max_offset) - low]
        assert (got[:, d == offset] == expected[:, None]).all()
    if (d > max_offset).any():
        assert (got[:, d > max_offset] == u[:, -1:]).all()
    if (d < low).any():
        assert (got[:, d < low] == u[:, :1]).all()


@FAST
@given(
    max_offset=st.integers(0, 10),
    bidirectional=st.booleans(),
    shape=lengths(max_len=16, max_start=30),
)
def test_offset_error_names_the_first_unseen_offset(max_offset, bidirectional, shape):
    bias = OffsetBias(1, max_offset, bidirectional=bidirectional, unseen="error")
    q_len, k_len, q_start = shape
    d = relative_positions(q_len, k_len, q_start=absolute_start(*shape))
    if d.max() > max_offset:
        first = max_offset + 1
    elif bidirectional and d.min() < -max_offset:
        first = -max_offset - 1
    else:
        assert bias(q_len, k_len, q_start=q_start).shape == (1, q_len, k_len)
        return
    try:
        bias(q_len, k_len, q_start=q_start)
    except ValueError as error:
        assert f"offset i - j = {first} " in str(error)
    else:
        raise AssertionError("unseen='error' accepted an offset with no parameter")
