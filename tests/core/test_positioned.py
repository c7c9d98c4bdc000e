"""Attention at per-row positions, under an external mask, with grouped keys
(relbias.attention.positioned) against attention written out here, on every backend."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import FAMILY_KWARGS, build

import relbias
from relbias import biased_attention, choose_backend
from relbias.attention import positioned

FAMILIES = list(FAMILY_KWARGS)
BACKENDS = ("materialize", "table", "flex", "fused")


def written_out(q, k, v, bias, qpos, kpos, *, mask=None, causal=True, q_start=None):
    """softmax(q k^T / sqrt(d) + PE(pos_q, pos_k), hidden keys removed) v, with the keys
    repeated per query head and PE read from the module at each row's positions, one pair
    at a time from its forward (the family's own grid); a row that sees nothing gives 0."""
    batch, heads, q_len, d = q.shape
    k_len = k.shape[2]
    group = heads // k.shape[1]
    kk, vv = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    scores = kk.new_zeros(batch, heads, q_len, k_len)
    scores += torch.einsum("bhqd,bhkd->bhqk", q, kk) / math.sqrt(d)
    for b in range(batch):
        qp = qpos[b if qpos.shape[0] > 1 else 0]
        kp = kpos[b if kpos.shape[0] > 1 else 0]
        top = int(max(qp.max(), kp.max())) + 1
        grid = bias(top, top, q_start=0)  # PE(i, j) for every pair of positions below top
        scores[b] += grid[:, qp][:, :, kp].to(scores.dtype)
    seen = torch.ones(batch, 1, q_len, k_len, dtype=torch.bool)
    if causal:
        start = k_len - q_len if q_start is None else q_start
        seen = seen & (torch.arange(k_len)[None, :] <= torch.arange(start, start + q_len)[:, None])
    if mask is not None:
        seen = seen & mask
    scores = scores.masked_fill(~seen, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return weights @ vv


def random_case(
    seed, *, batch=2, heads=4, kv_heads=2, q_len=5, k_len=9, d=8, rows=None, shifted=False
):
    """Random q, k, v, positions and mask; ``shifted``: positions that advance by one along
    each row from a random start (left padding, a cache: what the fused kernel takes)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, d, generator=gen)
    k = torch.randn(batch, kv_heads, k_len, d, generator=gen)
    v = torch.randn(batch, kv_heads, k_len, 6, generator=gen)
    rows = batch if rows is None else rows
    if shifted:
        qpos = torch.randint(0, 30, (rows, 1), generator=gen) + torch.arange(q_len)
        kpos = torch.randint(0, 30, (rows, 1), generator=gen) + torch.arange(k_len)
    else:
        qpos = torch.randint(0, 30, (rows, q_len), generator=gen)
        kpos = torch.randint(0, 30, (rows, k_len), generator=gen)
    mask = torch.rand(batch, 1, q_len, k_len, generator=gen) > 0.3
    return q, k, v, qpos, kpos, mask


def random_module(family, heads=4, seed=0):
    torch.manual_seed(seed)
    bias = build(family, heads)
    with torch.no_grad():
        for p in bias.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return bias


def placed(q, k, v, bias, qpos, kpos, **kwargs):
    """``biased_attention`` at these positions, without gradients."""
    with torch.no_grad():
        return biased_attention(q, k, v, bias, q_positions=qpos, k_positions=kpos, **kwargs)


def assert_gradients_match(bias, q, k, v, qpos, kpos, mask, *, rtol, causal=True, **kwargs):
    """biased_attention's output and gradients (q, k, v and the bias's parameters) equal the
    written-out attention's, and are finite."""
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    params = list(bias.parameters())
    out = biased_attention(
        *inputs, bias, q_positions=qpos, k_positions=kpos, mask=mask, causal=causal, **kwargs
    )
    grads = torch.autograd.grad(out.square().sum(), [*inputs, *params])
    inputs2 = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = written_out(*inputs2, bias, qpos, kpos, mask=mask, causal=causal)
    torch.testing.assert_close(out, expected, rtol=0, atol=2e-6)
    grads2 = torch.autograd.grad(expected.square().sum(), [*inputs2, *params])
    for got, want in zip(grads, grads2):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=rtol, atol=1e-5)


# -- the bias at positions ------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("q_len", "k_len", "q_start"), [(7, 7, 0), (1, 9, 8), (3, 12, 5)])
def test_at_slot_positions_the_bias_is_forward(family, q_len, k_len, q_start):
    bias = random_module(family)
    qpos = (torch.arange(q_len) + q_start).expand(2, q_len)
    kpos = torch.arange(k_len).expand(2, k_len)
    expected = bias(q_len, k_len, q_start=q_start)
    for elementwise in (False, True):
        got = bias.at_positions(qpos, kpos, elementwise=elementwise)
        assert got.shape == (2, 4, q_len, k_len)
        torch.testing.assert_close(got[0], expected, rtol=0, atol=1e-6)
        torch.testing.assert_close(got[1], expected, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_each_row_reads_its_own_positions(family):
    """Rows far apart and with gaps (as a user's position_ids may have), and one shared row
    of key positions: each row is forward's grid at that row's positions, on both paths."""
    bias = random_module(family)
    qpos = torch.tensor([[40, 41, 45], [3, 4, 5]])
    kpos = torch.tensor([[0, 20, 40, 41, 45], [0, 1, 2, 4, 5]])
    for elementwise in (False, True):
        got = bias.at_positions(qpos, kpos, elementwise=elementwise)
        shared = bias.at_positions(qpos, kpos[1:], elementwise=elementwise)
        for b in range(2):
            full = bias(46, 46, q_start=0)
            torch.testing.assert_close(got[b], full[:, qpos[b]][:, :, kpos[b]], rtol=0, atol=1e-6)
            torch.testing.assert_close(
                shared[b], full[:, qpos[b]][:, :, kpos[1]], rtol=0, atol=1e-6
            )


@pytest.mark.parametrize(
    ("q_positions", "k_positions", "error", "match"),
    [
        (torch.zeros(1, 3), torch.zeros(1, 4, dtype=torch.long), TypeError, "q_positions"),
        (
            torch.zeros(1, 3, dtype=torch.long),
            torch.zeros(4, dtype=torch.long),
            ValueError,
            "k_positions",
        ),
        (
            torch.zeros(2, 3, dtype=torch.long),
            torch.zeros(3, 4, dtype=torch.long),
            ValueError,
            "rows",
        ),
        ([0, 1, 2], torch.zeros(1, 4, dtype=torch.long), TypeError, "q_positions"),
    ],
)
def test_bad_positions_are_named(q_positions, k_positions, error, match):
    with pytest.raises(error, match=match):
        build("alibi").at_positions(q_positions, k_positions)


# -- attention on every backend -----------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("causal", [True, False])
def test_positions_mask_and_grouped_keys_equal_the_written_out_attention(family, backend, causal):
    bias = random_module(family)
    # random positions (not for the fused kernel), then positions shifted per row
    for seed in range(2 if backend == "fused" else 0, 5):
        q, k, v, qpos, kpos, mask = random_case(
            seed, rows=1 if seed in (1, 4) else None, shifted=seed >= 2
        )
        mask[0, 0, 1] = False  # a query that sees no key: output 0
        expected = written_out(q, k, v, bias, qpos, kpos, mask=mask, causal=causal)
        got = placed(q, k, v, bias, qpos, kpos, mask=mask, causal=causal, backend=backend)
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)
        assert (got[0, :, 1] == 0).all()


@pytest.mark.parametrize("family", FAMILIES)
def test_the_table_path_in_several_blocks_of_rows(family, monkeypatch):
    """Blocks of 16 rows (no [q_len, k_len] bias at once), causal, keys trimmed per block."""
    monkeypatch.setattr(positioned, "BLOCK_ENTRIES", 16 * 4 * 2 * 40)
    bias = random_module(family)
    q, k, v, qpos, kpos, mask = random_case(5, q_len=37, k_len=40)
    expected = written_out(q, k, v, bias, qpos, kpos, mask=mask, causal=True)
    with torch.no_grad():
        got = biased_attention(
            q, k, v, bias, q_positions=qpos, k_positions=kpos, mask=mask, backend="table"
        )
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


@pytest.mark.parametrize("backend", BACKENDS)
def test_grouped_keys_alone_equal_repeated_keys(backend):
    """No positions and no mask: grouped keys take this path and equal the keys repeated."""
    bias = random_module("kerple_log")
    q, k, v, *_ = random_case(3)
    with torch.no_grad():
        got = biased_attention(q, k, v, bias, backend=backend)
        expected = biased_attention(
            q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), bias, backend="materialize"
        )
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_return_weights_with_grouped_keys_and_a_mask():
    bias = random_module("t5")
    q, k, v, qpos, kpos, mask = random_case(4)
    out, weights = biased_attention(
        q, k, v, bias, q_positions=qpos, k_positions=kpos, mask=mask, return_weights=True
    )
    torch.testing.assert_close(out, written_out(q, k, v, bias, qpos, kpos, mask=mask))
    assert weights.shape == (2, 4, 5, 9)
    rows = weights.sum(-1)
    torch.testing.assert_close(rows, (rows > 0.5).to(rows.dtype))  # 1, or 0 where nothing seen


@pytest.mark.parametrize("family", ["t5", "kerple_power", "fire"])
def test_gradients_at_positions_equal_the_written_out_attention(family):
    bias = random_module(family)
    q, k, v, qpos, kpos, mask = random_case(6)
    mask[1, 0, 2] = False
    assert_gradients_match(bias, q, k, v, qpos, kpos, mask, rtol=1e-5)


def test_prepared_and_dense_biases_take_a_mask_and_grouped_keys():
    bias = random_module("alibi")
    q, k, v, _, _, mask = random_case(7)
    slots = torch.arange(4, 9)[None], torch.arange(9)[None]
    expected = written_out(q, k, v, bias, *slots, mask=mask)
    prepared = bias.prepare(5, 9)
    for given in (prepared, bias(5, 9)):
        for backend in ("materialize", "table", "fused") if given is prepared else ("materialize",):
            got = biased_attention(q, k, v, given, mask=mask, backend=backend)
            torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_the_forget_gate_prepared_takes_a_mask_and_grouped_keys():
    gate = relbias.make_bias("forgetting", 4, dim=16)
    x = torch.randn(2, 9, 16)
    prepared = gate.prepare(x)
    q, k, v, _, _, mask = random_case(8, q_len=9, k_len=9)
    dense = prepared.materialize()  # [batch, heads, 9, 9]
    kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
    seen = mask & torch.ones(9, 9, dtype=torch.bool).tril()
    scores = (q @ kk.transpose(-1, -2) / math.sqrt(8) + dense).masked_fill(~seen, float("-inf"))
    expected = torch.softmax(scores, -1).nan_to_num(0.0) @ vv
    for backend in ("materialize", "table", "fused"):
        got = biased_attention(q, k, v, prepared, mask=mask, backend=backend)
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_a_block_mask_on_flex_equals_the_boolean_mask():
    from torch.nn.attention.flex_attention import create_block_mask

    bias = random_module("kerple_log")
    q, k, v, qpos, kpos, mask = random_case(9)

    def mask_mod(b, h, q_idx, kv_idx):
        return mask[b, 0, q_idx, kv_idx]

    block_mask = create_block_mask(mask_mod, 2, None, 5, 9, device="cpu")
    expected = written_out(q, k, v, bias, qpos, kpos, mask=mask, causal=False)
    got = placed(q, k, v, bias, qpos, kpos, mask=block_mask, causal=False, backend="flex")
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_under_autocast_the_bias_is_added_in_float32():
    bias = random_module("t5")
    with torch.no_grad():  # values bfloat16 cannot hold
        bias.weight.copy_(3.0 + torch.arange(bias.weight.numel()).view_as(bias.weight) / 512)
    q, k, v, qpos, kpos, mask = random_case(10)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = biased_attention(
            q.bfloat16(),
            k.bfloat16(),
            v.bfloat16(),
            bias,
            q_positions=qpos,
            k_positions=kpos,
            mask=mask,
            scale=0.25,
        )
    assert got.dtype == torch.float32
    expected = written_out(
        q.bfloat16().float() * (0.25 * math.sqrt(8)),
        k.bfloat16().float(),
        v.bfloat16().float(),
        bias,
        qpos,
        kpos,
        mask=mask,
    )
    torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


def test_auto_takes_the_fused_kernel_where_it_serves():
    """Shifted positions with a mask and grouped keys: the fused kernel, with and without
    gradients; positions that restart (packed) or a BlockMask: the other backends."""
    from relbias.attention import fused

    if not fused.available():
        pytest.skip(f"the fused kernel cannot be built here: {fused.unavailable_reason()}")
    bias = random_module("alibi")
    rows = positioned.FUSED_MIN_ROWS
    q, k, v, qpos, kpos, mask = random_case(11, shifted=True, q_len=rows, k_len=rows + 4)
    with torch.no_grad():
        assert choose_backend(q, k, v, bias, q_positions=qpos, k_positions=kpos, mask=mask) == (
            "fused"
        )
        _, chosen = biased_attention(q, k, v, bias, mask=mask, return_backend=True)
        assert chosen == "fused"
        restarting = torch.cat([torch.arange(7), torch.arange(rows - 3)])[None]
        assert choose_backend(q, k, v, bias, q_positions=qpos, k_positions=restarting) == "table"
        decoding = biased_attention(
            q[:, :, -1:],
            k,
            v,
            bias,
            q_positions=qpos[:, -1:],
            k_positions=kpos,
            return_backend=True,
        )[1]
        assert decoding == "table"  # one query row: the table path's one block
    q.requires_grad_()
    _, chosen = biased_attention(
        q, k, v, bias, q_positions=qpos, k_positions=kpos, return_backend=True
    )
    assert chosen == "fused"
    _, chosen = biased_attention(
        q, k, v, bias, q_positions=qpos, k_positions=restarting, return_backend=True
    )
    assert chosen == "materialize"


@pytest.mark.parametrize("family", ["t5", "kerple_power", "alibi", "fire"])
def test_the_fused_kernels_gradients_at_shifted_positions(family):
    """Grouped keys, a mask with a query that sees nothing, rows shifted apart: the kernel's
    backward gives the written-out attention's gradients (keys summed over each group)."""
    from relbias.attention import fused

    if not fused.available():
        pytest.skip(f"the fused kernel cannot be built here: {fused.unavailable_reason()}")
    bias = random_module(family)
    q, k, v, qpos, kpos, mask = random_case(16, shifted=True, q_len=7, k_len=12)
    mask[1, 0, 2] = False
    for causal in (True, False):
        assert_gradients_match(
            bias, q, k, v, qpos, kpos, mask, rtol=1e-4, causal=causal, backend="fused"
        )


def test_the_fused_kernel_refuses_positions_that_restart():
    bias = random_module("alibi")
    q, k, v, qpos, kpos, mask = random_case(17)
    with pytest.raises(ValueError, match="advance by one"):
        biased_attention(q, k, v, bias, q_positions=qpos, k_positions=kpos, backend="fused")


def test_torch_compile_reads_no_positions_and_does_not_recompile_for_new_ones():
    """One graph (fullgraph) whose positions and mask are inputs: new values (the next
    decoding step of a static cache) run the same graph, no recompilation."""
    bias = random_module("t5")
    q, k, v, qpos, kpos, mask = random_case(12)

    def attend(q, k, v, qpos, kpos, mask):
        return biased_attention(q, k, v, bias, q_positions=qpos, k_positions=kpos, mask=mask)

    compiled = torch.compile(attend, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(
            compiled(q, k, v, qpos, kpos, mask),
            attend(q, k, v, qpos, kpos, mask),
            rtol=0,
            atol=2e-6,
        )
        torch.compiler.set_stance("fail_on_recompile")
        try:
            for seed in (13, 14):
                q, k, v, qpos, kpos, mask = random_case(seed)
                torch.testing.assert_close(
                    compiled(q, k, v, qpos, kpos, mask),
                    attend(q, k, v, qpos, kpos, mask),
                    rtol=0,
                    atol=2e-6,
                )
        finally:
            torch.compiler.set_stance("default")


@pytest.mark.parametrize("family", ["alibi", "fire"])
def test_flex_at_new_positions_reuses_its_compiled_kernel(family):
    """backend='flex' at positions whose range differs from the last call's (another
    offset table or psi length, another lowest offset) runs the kernel already compiled."""
    bias = random_module(family)
    cases = [random_case(seed, shifted=seed % 2 == 1) for seed in (20, 21, 22, 23)]
    spans = {int(qp.max() - kp.min()) - int(qp.min() - kp.max()) for _, _, _, qp, kp, _ in cases}
    assert len(spans) > 1  # the ranges differ
    for i, (q, k, v, qpos, kpos, mask) in enumerate(cases):
        if i == 1:
            torch.compiler.set_stance("fail_on_recompile")
        try:
            got = placed(q, k, v, bias, qpos, kpos, mask=mask, backend="flex")
        finally:
            torch.compiler.set_stance("default")
        expected = written_out(q, k, v, bias, qpos, kpos, mask=mask)
        torch.testing.assert_close(got, expected, rtol=0, atol=2e-6)


# -- bad input -------------------------------------------------------------------------------
def test_bad_arguments_are_named():
    bias = random_module("alibi")
    q, k, v, qpos, kpos, mask = random_case(15)
    with pytest.raises(TypeError, match="boolean"):
        biased_attention(q, k, v, bias, mask=mask.float())
    with pytest.raises(ValueError, match="mask of shape"):
        biased_attention(q, k, v, bias, mask=mask[..., :4])
    with pytest.raises(ValueError, match="q_positions"):
        biased_attention(q, k, v, bias, q_positions=qpos[:, :3])
    with pytest.raises(ValueError, match="multiple of k's"):
        biased_attention(q, k[:, :1].expand(2, 3, 9, 8), v[:, :1].expand(2, 3, 9, 6), bias)
    with pytest.raises(TypeError, match="pass the module"):
        biased_attention(q, k, v, bias.prepare(5, 9), q_positions=qpos)
    from torch.nn.attention.flex_attention import create_block_mask

    block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, 5, 9, device="cpu")
    with pytest.raises(ValueError, match="backend='flex' only"):
        biased_attention(q, k, v, bias, mask=block_mask, causal=False, backend="table")
    with pytest.raises(ValueError, match="causal=False"):
        biased_attention(q, k, v, bias, mask=block_mask, backend="flex")
