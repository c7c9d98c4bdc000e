"""The fast backends of biased_attention (prepared biases, the table path, FlexAttention)
against the materialised path.

FlexAttention compiles one kernel per shape (tens of seconds on a CPU), so its tests
share a few shapes: every offset-only family uses the same kernel at a given shape,
FIRE its own. The strided-table backend needs no compilation and is tested more widely.
"""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import (
    ATTENTION_HEADS,
    ATTENTION_SHAPES,
    FAMILY_KWARGS,
    assert_backend_matches_materialise,
    assert_close,
    build,
    family_bias,
    qkv,
)
from torch._dynamo.utils import counters

import relbias
from relbias import biased_attention
from relbias._cache import LRUCache
from relbias.attention import api, fused, table
from relbias.attention.flex import causal_block_mask, compile_stats
from relbias.attention.table import table_attention
from relbias.biases.prepared import FIREBias, OffsetTableBias, prepare_bias

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from compiling

HEADS = ATTENTION_HEADS
FAMILIES = list(FAMILY_KWARGS)
SHAPES = ATTENTION_SHAPES


# --- prepared biases: the O(n) ingredients ---------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len,q_start", [(37, 37, None), (17, 40, 9), (1, 30, None)])
def test_prepared_bias_materialises_forward(family, causal, q_len, k_len, q_start):
    bias = family_bias(family, causal)
    prepared = prepare_bias(bias, q_len, k_len, q_start=q_start)
    expected = bias(q_len, k_len, q_start=q_start)
    assert isinstance(prepared, FIREBias if family == "fire" else OffsetTableBias)
    if family == "fire":
        assert_close(prepared.materialize(), expected)
    else:  # the same table and the same gather: bit for bit
        assert torch.equal(prepared.materialize(), expected)
        assert prepared.table.shape == (HEADS, q_len + k_len - 1)


def test_offset_table_bias_checks_its_table():
    with pytest.raises(ValueError, match="columns"):
        OffsetTableBias(torch.zeros(2, 5), 3, 4)
    with pytest.raises(TypeError, match="2-D"):
        OffsetTableBias(torch.zeros(5), 3, 3)
    with pytest.raises(TypeError, match="RelativeBias"):
        prepare_bias("alibi", 4)


# --- the strided-table backend -----------------------------------------------------------
# One code path per kind of prepared bias: a view of an offset table (T5's, random entries)
# and FIRE's blocks; the forget gate's in test_forgetting.py.
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len,q_start", SHAPES)
@pytest.mark.parametrize("kind", ["t5", "fire"])
def test_table_backend_matches_materialise(kind, causal, q_len, k_len, q_start):
    bias = family_bias(kind, causal)
    q, k, v = qkv(q_len, k_len)
    with torch.no_grad():
        expected = biased_attention(
            q, k, v, bias, causal=causal, q_start=q_start, backend="materialize"
        )
        got = biased_attention(q, k, v, bias, causal=causal, q_start=q_start, backend="table")
    assert_close(got, expected)


@pytest.mark.parametrize("few_operations", [True, False])
@pytest.mark.parametrize("block_rows", [1, 5, 16])
def test_table_backend_blocks(block_rows, few_operations):
    """Any block of query rows gives the same result (causal, queries inside the keys),
    in both of table_attention's strategies (few operations or the least memory)."""
    bias = family_bias("t5", True)
    q, k, v = qkv(21, 50)
    prepared = prepare_bias(bias, 21, 50, q_start=12)
    expected = biased_attention(q, k, v, bias, q_start=12, backend="materialize")
    small = 10**9 if few_operations else 0
    got = table_attention(q, k, v, prepared, block_rows=block_rows, small_attention=small)
    assert_close(got, expected)


TILE_SHAPES = [  # (q_len, q_start): whole tiles, a ragged tail, queries after a prefix
    (48, 0),
    (53, 0),
    (32, 7),
    (70, 13),
    (16, 0),
]


@pytest.mark.parametrize("tile,strip", [(16, 4), (16, 16), (24, 8)])
@pytest.mark.parametrize("q_len,q_start", TILE_SHAPES)
@pytest.mark.parametrize("family", ["t5", "alibi"])
def test_tiled_table_attention_matches_materialise(
    family, tile, strip, q_len, q_start, monkeypatch
):
    """Causal tiles (past keys + the tile's own triangle, joined by log-sum-exp) equal the
    materialised path, batch 2, with and without a prefix: every offset-only family reads
    its table the same way (T5's random entries, ALiBi's steep ones whose far weights
    underflow)."""
    calls = []
    tiled = table._tiled_table_attention
    monkeypatch.setattr(table, "_tiled_table_attention", lambda *a: calls.append(1) or tiled(*a))
    bias = family_bias(family, True)
    q, k, v = qkv(q_len, q_start + q_len)
    with torch.no_grad():
        expected = biased_attention(q, k, v, bias, q_start=q_start, backend="materialize")
        prepared = prepare_bias(bias, q_len, q_start + q_len, q_start=q_start)
        got = table_attention(q, k, v, prepared, tile_rows=tile, strip_rows=strip)
    assert calls == ([1] if q_len >= tile else [])  # shorter than a tile: blocks of rows
    assert_close(got, expected)


def test_tile_settings_are_checked():
    prepared = prepare_bias(family_bias("t5", True), 20)
    q, k, v = qkv(20, 20)
    with pytest.raises(ValueError, match="multiple of strip_rows"):
        table_attention(q, k, v, prepared, tile_rows=16, strip_rows=5)
    with pytest.raises(ValueError, match="tile_rows must be an integer >= 1"):
        table_attention(q, k, v, prepared, tile_rows=0)
    with pytest.raises(TypeError, match="compiled must be True or False"):
        table_attention(q, k, v, prepared, compiled=1)


def test_tiles_only_where_they_apply():
    """FIRE, gradients, float64, bidirectional attention and keys after the last query
    keep the blocks of rows (and still equal the materialised path)."""
    t5 = family_bias("t5", True)
    q, k, v = qkv(24, 24)
    with torch.no_grad():
        assert table._tiles_apply(q, k, v, prepare_bias(t5, 24), True, 8)
        assert not table._tiles_apply(q, k, v, prepare_bias(t5, 24), True, 25)  # too short
    cases = [
        (family_bias("fire", True), q, k, v, True, "FIRE"),
        (family_bias("t5", False), q, k, v, False, "bidirectional"),
        (copy.deepcopy(t5).double(), q.double(), k.double(), v.double(), True, "float64"),
        (t5, *qkv(24, 24, grad=True), True, "gradients"),
    ]
    for bias, q_, k_, v_, causal, why in cases:
        with torch.set_grad_enabled(why == "gradients"):
            prepared = prepare_bias(bias, 24)
            assert not table._tiles_apply(q_, k_, v_, prepared, causal, 8), why
            expected = biased_attention(q_, k_, v_, bias, causal=causal, backend="materialize")
            got = biased_attention(q_, k_, v_, bias, causal=causal, backend="table")
        assert_close(got.detach().float(), expected.detach().float())
    q, k, v = qkv(24, 30)  # k_len > q_start + q_len
    with torch.no_grad():
        assert not table._tiles_apply(q, k, v, prepare_bias(t5, 24, 30, q_start=0), True, 8)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seed", range(12))
def test_folded_fire_mlp_is_the_same_function(causal, seed):
    """Folding FIRE's hidden units that do not switch on [0, x_max] keeps f_theta: checked
    on a dense grid of x for random weights (some units always on, off, or switching)."""
    torch.manual_seed(seed)
    fire = relbias.FIRE(4, hidden=16)
    with torch.no_grad():
        fire.hidden_layer.weight.normal_(0, 3)
        fire.hidden_layer.bias.normal_(0, 2)
        fire.output_layer.weight.normal_()
    with torch.no_grad():
        prepared = prepare_bias(fire, 50, 80, q_start=30)
        w1, b1, w2, slope, intercept = prepared.folded_mlp(causal)
    x_max = 1.0 if causal else float(prepared.psi_table.max() / prepared.denominator.min())
    assert w1.shape[0] <= 16
    x = torch.linspace(0, x_max, 2001)
    folded = (x[:, None] * slope + intercept + torch.relu(x[:, None] * w1 + b1) @ w2.T).T
    with torch.no_grad():
        torch.testing.assert_close(folded, prepared._mlp(x), rtol=1e-5, atol=1e-5)
    if causal:  # every x a causal attention meets lies in [0, 1]
        index = relbias.relative_positions(50, 80, q_start=30) + 79 - 30
        x_met = prepared.psi_table[index] / prepared.denominator[:, None]
        assert float(x_met[index >= 79 - 30].max()) <= 1.0


def test_table_mask_is_a_view_of_the_table():
    """The mask of a block shares the table's storage: no q_len x k_len tensor exists."""
    prepared = prepare_bias(relbias.ALiBi(HEADS), 300)
    mask = prepared.flipped_rows(100, 200, 200, True, torch.float32)
    assert mask.shape == (1, HEADS, 100, 200)
    assert mask.untyped_storage().nbytes() == HEADS * (2 * 300 - 1) * 4
    rows = torch.arange(199, 99, -1)[:, None]  # reversed query rows
    keys = torch.arange(200)[None, :]
    slopes = relbias.alibi_slopes(HEADS)[:, None, None]
    expected = (-slopes * (rows - keys)).masked_fill(keys > rows, float("-inf"))
    assert torch.equal(mask[0], expected)


def test_table_backend_gradients_match_materialise():
    """The table path is differentiable too (through the unfused kernel)."""
    for name in ("t5", "fire"):
        bias = family_bias(name, True)
        grads = {}
        for backend in ("materialize", "table"):
            torch.manual_seed(1)
            q, k, v = qkv(12, 20, grad=True)
            bias.zero_grad()
            biased_attention(q, k, v, bias, backend=backend).square().sum().backward()
            grads[backend] = [q.grad, k.grad, v.grad] + [
                p.grad for p in bias.parameters() if p.grad is not None
            ]
        for a, b in zip(grads["materialize"], grads["table"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_compiled_fire_blocks_match_eager():
    """FIRE's compiled block kernel agrees with the eager MLP (causal and not)."""
    fire = build("fire", HEADS)
    q, k, v = qkv(40, 40)
    with torch.no_grad():
        for causal in (True, False):
            prepared = prepare_bias(fire, 40)
            compiled = table_attention(q, k, v, prepared, causal=causal)
            eager = table_attention(q, k, v, prepared, causal=causal, compiled=False)
            assert_close(compiled, eager)
            expected = biased_attention(q, k, v, fire, causal=causal, backend="materialize")
            assert_close(eager, expected)
        # float64 is not the compiled kernel's: its blocks stay eager, in float64
        fire64, q64, k64, v64 = copy.deepcopy(fire).double(), q.double(), k.double(), v.double()
        got = table_attention(q64, k64, v64, prepare_bias(fire64, 40))
        expected = biased_attention(q64, k64, v64, fire64, backend="materialize")
        assert got.dtype == torch.float64
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


# --- FlexAttention -------------------------------------------------------------------------
# Few shapes: each (shape, mask, kind of bias) compiles once.
FLEX_CASES = [
    pytest.param(True, 48, 80, 20, id="causal-q_start"),
    pytest.param(False, 48, 80, 20, id="bidirectional-q_start"),
    pytest.param(True, 150, 150, None, id="causal-square"),
]


@pytest.mark.parametrize("causal,q_len,k_len,q_start", FLEX_CASES)
def test_flex_matches_materialise(causal, q_len, k_len, q_start):
    q, k, v = qkv(q_len, k_len)
    families = FAMILIES if q_len != 150 else ["alibi", "t5"]  # one more length, offset kernel
    for name in families:
        bias = family_bias(name, causal)
        assert_backend_matches_materialise("flex", q, k, v, bias, causal=causal, q_start=q_start)


def test_flex_compiles_once_per_shape():
    """A second call with the same shapes reuses the compiled kernel (counted twice over)."""
    q, k, v = qkv(48, 80)
    bias = family_bias("kerple_log", True)
    with torch.no_grad():
        biased_attention(q, k, v, bias, q_start=20, backend="flex")  # compiled (or cached)
        before, graphs = compile_stats()["compiles"], counters["stats"]["unique_graphs"]
        for name in ("alibi", "sandwich", "offset"):  # other families: same kernel
            biased_attention(q, k, v, family_bias(name, True), q_start=20, backend="flex")
        biased_attention(q, k, v, bias, q_start=20, backend="flex")
    assert compile_stats()["compiles"] == before
    assert counters["stats"]["unique_graphs"] == graphs
    assert compile_stats()["calls"] >= 5
    assert all(seconds > 0 for seconds in compile_stats()["per_key"].values())


def test_flex_refuses_cpu_gradients():
    q, k, v = qkv(48, 80, grad=True)
    with pytest.raises(RuntimeError, match="no CPU"):
        biased_attention(q, k, v, relbias.ALiBi(HEADS), q_start=20, backend="flex")


def test_flex_refuses_gradients_for_fire_whose_backward_does_not_compile():
    q, k, v = qkv(48, 80, grad=True)
    with pytest.raises(RuntimeError, match="cannot compute gradients for FIREBias"):
        biased_attention(q, k, v, relbias.FIRE(HEADS), q_start=20, backend="flex")


# The fake compiled call runs FlexAttention eagerly, which warns that it is not compiled.
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
def test_flex_retries_with_small_kernel_options_when_out_of_resource(monkeypatch):
    """Triton's default configuration can need more shared memory than a GPU has (seen
    on an H200, 16-bit inputs): the call is compiled again with smaller blocks."""
    from torch.nn.attention.flex_attention import flex_attention

    from relbias.attention import flex as flex_module

    seen = []

    def fake_compiled(q, k, v, *, score_mod=None, block_mask=None, kernel_options=None):
        seen.append(kernel_options)
        if kernel_options is None:
            raise RuntimeError("No valid triton configs. OutOfMemoryError: out of resource")
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=block_mask)

    monkeypatch.setattr(flex_module, "_compiled_flex", lambda: fake_compiled)
    monkeypatch.setattr(flex_module, "_SMALL_KERNEL_KEYS", LRUCache(4))
    q, k, v = qkv(40, 40)
    bias = relbias.ALiBi(HEADS)
    out = biased_attention(q, k, v, bias, backend="flex")
    ref = biased_attention(q, k, v, bias, backend="materialize")
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    assert seen == [None, flex_module.SMALL_KERNEL_OPTIONS]
    biased_attention(q, k, v, bias, backend="flex")  # remembered: straight to small options
    assert seen[-1] == flex_module.SMALL_KERNEL_OPTIONS and len(seen) == 3

    def other_failure(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr(flex_module, "_compiled_flex", lambda: other_failure)
    with pytest.raises(RuntimeError, match="something else"):
        biased_attention(*qkv(24, 24), bias, backend="flex")


@pytest.mark.parametrize(
    "q_len,k_len,q_start", [(300, 300, 0), (100, 300, 200), (130, 260, 7), (1, 129, 128)]
)
def test_causal_block_mask_matches_create_block_mask(q_len, k_len, q_start):
    from torch.nn.attention.flex_attention import create_block_mask

    ours = causal_block_mask(q_len, k_len, q_start, "cpu")
    theirs = create_block_mask(
        lambda b, h, i, j: i + q_start >= j, None, None, q_len, k_len, device="cpu"
    )
    assert torch.equal(ours.to_dense(), theirs.to_dense())
    i = torch.arange(q_start, q_start + q_len)[:, None]
    j = torch.arange(k_len)[None, :]
    assert torch.equal(ours.mask_mod(0, 0, i - q_start, j), j <= i)


# --- choosing the backend ------------------------------------------------------------------
def test_auto_trains_through_the_fused_kernel_on_the_cpu(monkeypatch):
    """Gradients needed on the CPU: the fused kernel's backward, or the materialised bias
    where the kernel cannot be built (the table path and CPU FlexAttention have none)."""
    q, k, v = qkv(30, 30, grad=True)
    _, backend = biased_attention(q, k, v, relbias.ALiBi(HEADS), return_backend=True)
    assert backend == api.CPU_TRAINING_BACKENDS[0] == "fused"
    # learnable bias, inputs without gradients: the bias needs one
    q, k, v = qkv(30, 30)
    _, backend = biased_attention(q, k, v, family_bias("t5", True), return_backend=True)
    assert backend == "fused"
    # nothing needs a gradient (parameter-free bias): the inference path, even in grad mode
    _, backend = biased_attention(q, k, v, relbias.ALiBi(HEADS), return_backend=True)
    assert backend == api.CPU_INFERENCE_BACKENDS[0]
    monkeypatch.setattr(fused, "_BUILD", {"ok": False, "error": "RuntimeError: no compiler"})
    _, backend = biased_attention(q, k, v, family_bias("t5", True), return_backend=True)
    assert backend == "materialize"


@pytest.mark.parametrize("case", ["weights", "tensor", "none", "float64"])
def test_auto_materialises(case):
    q, k, v = qkv(10, 10, dtype=torch.float64 if case == "float64" else torch.float32)
    bias = {"tensor": torch.randn(HEADS, 10, 10), "none": None}.get(case, relbias.ALiBi(HEADS))
    with torch.no_grad():
        out = biased_attention(q, k, v, bias, return_weights=case == "weights", return_backend=True)
    assert (
        out[-1]
        == "materialize"
        == api.choose_backend(q, k, v, bias, return_weights=case == "weights")
    )
    assert len(out) == (3 if case == "weights" else 2)


def test_backend_argument_is_checked():
    q, k, v = qkv(10, 10)
    with pytest.raises(ValueError, match="backend must be one of"):
        biased_attention(q, k, v, relbias.ALiBi(HEADS), backend="fast")
    with pytest.raises(ValueError, match="return_weights"):
        biased_attention(q, k, v, relbias.ALiBi(HEADS), backend="table", return_weights=True)
    with pytest.raises(ValueError, match="dense tensor"):
        biased_attention(q, k, v, torch.zeros(HEADS, 10, 10), backend="flex")
    with pytest.raises(ValueError, match="needs a bias"):
        biased_attention(q, k, v, None, backend="table")
    with pytest.raises(ValueError, match="bidirectional"):
        biased_attention(q, k, v, relbias.ALiBi(HEADS), causal=False, backend="table")


# --- sharing one prepared bias across layers -------------------------------------------------
def test_prepared_bias_is_shared_across_layers_with_gradients():
    """Two 'layers' using one prepared bias: same outputs and gradients as the module."""
    bias = family_bias("offset", True)
    q, k, v = qkv(25, 25)

    def two_layers(b):
        out = biased_attention(q, k, v, b)
        return biased_attention(out, k, v, b)

    bias.zero_grad()
    two_layers(bias).square().sum().backward()
    expected_grad = bias.weight.grad.clone()
    bias.zero_grad()
    prepared = prepare_bias(bias, 25)
    out, backend = biased_attention(q, k, v, prepared, return_backend=True)
    assert backend == api.CPU_TRAINING_BACKENDS[0]
    two_layers(prepared).square().sum().backward()
    torch.testing.assert_close(bias.weight.grad, expected_grad)
    with torch.no_grad():  # inference: the fast path, from the same object
        fast = biased_attention(q, k, v, prepare_bias(bias, 25), return_backend=True)
        assert fast[1] == api.CPU_INFERENCE_BACKENDS[0]
        assert_close(fast[0], out.detach())


def test_prepared_bias_shape_is_checked():
    prepared = prepare_bias(relbias.ALiBi(HEADS), 10)
    q, k, v = qkv(12, 12)
    with pytest.raises(ValueError, match="prepared for"):
        biased_attention(q, k, v, prepared)
    q, k, v = qkv(10, 10)
    with pytest.raises(ValueError, match="bidirectional"):
        biased_attention(q, k, v, prepared, causal=False)


def test_tiles_keep_their_buffers_but_never_return_them():
    """Consecutive calls reuse the tiles' buffers (same shape), yet every call returns a
    tensor of its own: the first result survives the second call unchanged."""
    tiles = {"tile_rows": 16, "strip_rows": 8, "group_rows": 32}  # groups of 32, 16 at n = 48
    bias = family_bias("alibi", True)
    with torch.no_grad():
        prepared = prepare_bias(bias, 48)
        q, k, v = qkv(48, 48)
        first = table_attention(q, k, v, prepared, **tiles)
        kept = first.clone()
        buffers = dict(table._WORKSPACE.buffers)
        q2, k2, v2 = qkv(48, 48)
        second = table_attention(q2, k2, v2, prepared, **tiles)
        assert len(buffers) == 4  # q and output buffers for groups of 32 and 16 rows
        assert all(table._WORKSPACE.buffers[key] is buf for key, buf in buffers.items())
        assert torch.equal(first, kept)
        for out in (first, second):
            assert out.data_ptr() not in {b.data_ptr() for b in buffers.values()}
    assert_close(second, biased_attention(q2, k2, v2, bias, backend="materialize").detach())
