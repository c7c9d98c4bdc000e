"""The Forgetting Transformer's forget gate: PE(i, j) = sum_{t=j+1}^{i} log f_t, on every backend.

A from-scratch float64 double loop, every backend against the materialised bias, gradients
(gradcheck in float64, the fused backward against the materialised path), decoding with a
cache, block skipping, the float32 precision of F_i - F_j at 64k tokens, bad input.
"""

from __future__ import annotations

import math

import pytest
import torch
from conftest import assert_close
from torch.func import functional_call
from torch.nn import functional as F

import relbias
from relbias import ForgettingGate, biased_attention, make_bias
from relbias.attention import fused
from relbias.biases.prepared import ForgettingBias, PreparedBias

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's imports

HEADS, DIM, HEAD_DIM = 3, 8, 16
BLOCKS = [(fused.Q_BLOCK, fused.KV_BLOCK), (8, 16), (5, 7), (1, 1)]
# (q_len, past_len): self-attention, queries after a cached prefix, one decoding step,
# lengths that are no multiple of any block size.
SHAPES = [(37, 0), (20, 25), (1, 29), (64, 0), (45, 150)]


def gate(heads=HEADS, dim=DIM, *, scale=1.0, bias_init=(2.0, 0.5, -1.0)) -> ForgettingGate:
    """A gate whose logits vary with the input (weights ~ N(0, scale^2 / dim))."""
    module = ForgettingGate(heads, dim, bias_init=list(bias_init)[:heads])
    with torch.no_grad():
        module.proj.weight.normal_(0.0, scale / math.sqrt(dim))
    return module


def inputs(batch, past_len, q_len, dim=DIM, grad=False):
    """The layer input of the whole sequence, q, k, v for its last q_len positions."""
    x = torch.randn(batch, past_len + q_len, dim)
    n = past_len + q_len
    q = torch.randn(batch, HEADS, q_len, HEAD_DIM, requires_grad=grad)
    k = torch.randn(batch, HEADS, n, HEAD_DIM, requires_grad=grad)
    v = torch.randn(batch, HEADS, n, HEAD_DIM, requires_grad=grad)
    return x, q, k, v


def prepared_for(module, x, past_len):
    """The bias of the last positions of x, with the earlier ones as the cached past."""
    past = module.cumulative(x[:, :past_len]) if past_len else None
    return module.prepare(x[:, past_len:], past=past)


def reference(module, x, q_start=0) -> torch.Tensor:
    """PE(i, j) = sum_{t=j+1}^{i} log f_t by a double loop in float64 (j <= i; 0 above)."""
    w, b = module.proj.weight.double(), module.proj.bias.double()
    log_f = F.logsigmoid(x.double() @ w.T + b).transpose(1, 2)  # [batch, heads, len]
    n = x.shape[1]
    out = torch.zeros(x.shape[0], module.num_heads, n - q_start, n, dtype=torch.float64)
    for r in range(n - q_start):
        i = q_start + r
        for j in range(i + 1):
            out[:, :, r, j] = log_f[:, :, j + 1 : i + 1].sum(-1)
    return out


# --- the formula ---------------------------------------------------------------------------
@pytest.mark.parametrize("past_len", [0, 7])
def test_matches_a_double_loop_in_float64(past_len):
    module = gate()
    x = torch.randn(2, 19, DIM)
    with torch.no_grad():
        got = prepared_for(module, x, past_len).materialize()
        whole = module(x[:, past_len:], past=module.cumulative(x[:, :past_len]))
    expected = reference(module, x, q_start=past_len)
    assert got.shape == (2, HEADS, 19 - past_len, 19) and got.dtype == torch.float32
    assert torch.equal(whole, got)
    seen = torch.arange(past_len, 19)[:, None] >= torch.arange(19)[None, :]
    torch.testing.assert_close(got.double()[..., seen], expected[..., seen], rtol=1e-5, atol=1e-5)
    # 0 on the diagonal exactly, non-increasing as j moves away from i
    rows = torch.arange(19 - past_len)
    assert torch.all(got[:, :, rows, rows + past_len] == 0)
    lower = got.masked_fill(~seen, float("-inf"))
    rising = lower[..., 1:] >= lower[..., :-1] - 1e-6  # where key j + 1 is seen, so is j
    assert torch.all(rising[..., seen[:, 1:]])


def test_log_forget_cumulative_and_past():
    module = gate()
    x = torch.randn(2, 12, DIM)
    log_f = module.log_forget(x)
    assert log_f.shape == (2, HEADS, 12) and log_f.dtype == torch.float32
    assert torch.all(log_f <= 0)
    expected = F.logsigmoid(x @ module.proj.weight.T + module.proj.bias).transpose(1, 2)
    torch.testing.assert_close(log_f, expected)
    whole = module.cumulative(x)
    assert whole.dtype == torch.float64
    torch.testing.assert_close(whole, torch.cumsum(log_f.double(), -1))
    part = module.cumulative(x[:, 5:], past=whole[:, :, :5])
    torch.testing.assert_close(part, whole[:, :, 5:], rtol=0, atol=1e-12)
    assert torch.equal(module.cumulative(x, past=whole[:, :, :0]), whole)  # an empty past
    prepared = module.prepare(x[:, 5:], past=whole[:, :, :5])
    assert isinstance(prepared, ForgettingBias) and isinstance(prepared, PreparedBias)
    assert (prepared.batch, prepared.q_len, prepared.k_len, prepared.q_start) == (2, 7, 12, 5)
    torch.testing.assert_close(prepared.cumulative, whole, rtol=0, atol=1e-12)


def test_input_dtypes_and_autocast():
    """bfloat16 inputs and autocast: log f and the bias stay float32."""
    module = gate()
    x = torch.randn(2, 10, DIM)
    expected = module(x.bfloat16().float())
    assert module.log_forget(x.bfloat16()).dtype == torch.float32
    torch.testing.assert_close(module(x.bfloat16()), expected)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = module(x)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, module(x))


def test_the_gates_start_as_the_reference_code():
    module = ForgettingGate(4, 32)
    assert module.num_heads == 4 and module.dim == 32 and not module.bidirectional
    assert torch.all(module.proj.bias == 0.0)  # the reference code zeroes the gate's bias
    f = module.log_forget(torch.randn(1, 50, 32)).exp()
    assert torch.all((f - 0.5).abs() < 0.15)  # weights of std 0.02: f near sigmoid(0)
    little = ForgettingGate(4, 32, bias_init=5.0).log_forget(torch.randn(1, 50, 32)).exp()
    assert torch.all(little > 0.99)
    per_head = ForgettingGate(2, 4, bias_init=[0.0, 3.0])
    assert per_head.proj.bias.tolist() == [0.0, 3.0]


def test_made_by_name_but_not_a_position_family():
    module = make_bias("forgetting", 4, dim=16)
    assert isinstance(module, ForgettingGate) and isinstance(module, relbias.DataDependentBias)
    assert "forgetting" in relbias.DATA_DEPENDENT_NAMES
    assert "forgetting" not in relbias.BIAS_NAMES
    assert relbias.DATA_DEPENDENT_FAMILIES["forgetting"] is ForgettingGate


# --- every backend equals the materialised path ------------------------------------------------
def _attention(q, k, v, prepared, backend, **kwargs):
    with torch.no_grad():
        return biased_attention(q, k, v, prepared, backend=backend, return_backend=True, **kwargs)


def _check_backend(backend, q_len, past_len, batch=2, blocks=None):
    module = gate()
    x, q, k, v = inputs(batch, past_len, q_len)
    prepared = prepared_for(module, x, past_len)
    expected, _ = _attention(q, k, v, prepared, "materialize")
    if blocks is None:
        got, taken = _attention(q, k, v, prepared, backend)
        assert taken == backend
    else:
        q_block, kv_block = blocks
        with torch.no_grad():
            got = fused.fused_attention(q, k, v, prepared, q_block=q_block, kv_block=kv_block)
    assert_close(got, expected)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("q_len,past_len", SHAPES)
def test_fused_matches_materialise(q_len, past_len, blocks):
    _check_backend("fused", q_len, past_len, blocks=blocks)


def test_backend_fused_is_the_kernel():
    _check_backend("fused", 20, 25)


@pytest.mark.parametrize("q_len,past_len", SHAPES)
@pytest.mark.parametrize("batch", [1, 3])
def test_table_matches_materialise(q_len, past_len, batch):
    _check_backend("table", q_len, past_len, batch)


@pytest.mark.parametrize("block_rows", [1, 7, 16])
def test_table_blocks_of_rows(block_rows):
    from relbias.attention.table import table_attention

    module = gate()
    x, q, k, v = inputs(3, 10, 33)
    prepared = prepared_for(module, x, 10)
    expected, _ = _attention(q, k, v, prepared, "materialize")
    with torch.no_grad():
        got = table_attention(q, k, v, prepared, block_rows=block_rows)
    assert_close(got, expected)


@pytest.mark.parametrize("q_len,past_len", [(37, 0), (20, 25)])
def test_flex_forward_matches_materialise(q_len, past_len):
    module = gate()
    x, q, k, v = inputs(2, past_len, q_len)
    prepared = prepared_for(module, x, past_len)
    expected, _ = _attention(q, k, v, prepared, "materialize")
    got, taken = _attention(q, k, v, prepared, "flex")
    assert taken == "flex"
    assert_close(got, expected)


def test_flex_training_is_refused():
    """FlexAttention has no CPU backward, and its backward of this score_mod is untested."""
    module = gate()
    x, q, k, v = inputs(1, 0, 8)
    with pytest.raises(RuntimeError, match="cannot compute gradients"):
        biased_attention(q, k, v, module.prepare(x), backend="flex")


def test_auto_takes_the_fused_kernel_on_the_cpu():
    module = gate()
    x, q, k, v = inputs(2, 0, 30)
    prepared = module.prepare(x)  # the gate's parameters need a gradient: training
    assert relbias.choose_backend(q, k, v, prepared) == "fused"
    with torch.no_grad():
        prepared = module.prepare(x)
        assert relbias.choose_backend(q, k, v, prepared) == "fused"
        _, taken = biased_attention(q, k, v, prepared, return_backend=True)
        assert taken == "fused"


def test_return_weights():
    module = gate()
    x, q, k, v = inputs(2, 4, 9)
    prepared = prepared_for(module, x, 4)
    with torch.no_grad():
        out, weights = biased_attention(q, k, v, prepared, return_weights=True)
        expected = biased_attention(q, k, v, prepared, backend="materialize")
    assert_close(out, expected)
    assert weights.shape == (2, HEADS, 9, 13)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, HEADS, 9))


# --- decoding with a cache -----------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["materialize", "fused", "table"])
def test_decoding_with_a_cache_equals_the_whole_sequence(backend):
    """Token by token (and then a chunk), the cached F continues the sum: each step's output
    equals its rows of the attention over the whole sequence."""
    module = gate()
    n = 24
    x, q, k, v = inputs(2, 0, n)
    with torch.no_grad():
        whole = biased_attention(q, k, v, module.prepare(x), backend="materialize")
        past, steps = None, []
        for start, stop in [(0, 10), *((t, t + 1) for t in range(10, 20)), (20, n)]:
            prepared = module.prepare(x[:, start:stop], past=past)
            assert (prepared.q_start, prepared.k_len) == (start, stop)
            steps.append(
                biased_attention(
                    q[:, :, start:stop], k[:, :, :stop], v[:, :, :stop], prepared, backend=backend
                )
            )
            past = prepared.cumulative
    assert_close(torch.cat(steps, dim=2), whole)


# --- gradients --------------------------------------------------------------------------------
def test_gradcheck_the_dense_bias():
    module = gate(2, 3).double()
    x = torch.randn(2, 6, 3, dtype=torch.float64)
    past = module.cumulative(torch.randn(2, 3, 3, dtype=torch.float64)).detach()
    names = ["proj.weight", "proj.bias"]
    params = tuple(dict(module.named_parameters())[n].detach().clone() for n in names)
    tensors = tuple(t.requires_grad_(True) for t in (x, *params))

    def bias_of(x, weight, bias):
        params = {"proj.weight": weight, "proj.bias": bias}
        return functional_call(module, params, (x,), {"past": past})

    assert bias_of(*tensors).dtype == torch.float64
    assert torch.autograd.gradcheck(bias_of, tensors, eps=1e-6, atol=1e-6)


class _Layer(torch.nn.Module):
    """Attention of the last positions of x with the gate's bias, the first 3 cached."""

    def __init__(self, module):
        super().__init__()
        self.gate = module

    def forward(self, x, q, k, v):
        cached = self.gate.cumulative(x[:, :3])
        prepared = self.gate.prepare(x[:, 3:], past=cached)
        return biased_attention(q[:, :, 3:], k, v, prepared, backend="materialize")


def test_gradcheck_attention_on_the_materialised_path():
    layer = _Layer(gate(2, 3).double())
    x = torch.randn(1, 7, 3, dtype=torch.float64)
    q, k, v = (torch.randn(1, 2, 7, 4, dtype=torch.float64) for _ in range(3))
    weight, bias = (p.detach().clone() for p in (layer.gate.proj.weight, layer.gate.proj.bias))
    tensors = tuple(t.requires_grad_(True) for t in (x, weight, bias, q))

    def attention(x, weight, bias, q):
        params = {"gate.proj.weight": weight, "gate.proj.bias": bias}
        return functional_call(layer, params, (x, q, k, v))

    assert torch.autograd.gradcheck(attention, tensors, eps=1e-6, atol=1e-6)


def _gradients(backend, module, x, q, k, v, dout, past_len=0, blocks=None):
    """The output and the gradients of x, q, k, v and of the gate's parameters (the past
    computed from x as well, so its gradient reaches the gate too); the fused kernel with
    ``blocks = (q_block, kv_block)`` when given."""
    for t in (x, q, k, v):
        t.grad = None
    module.zero_grad()
    prepared = prepared_for(module, x, past_len)
    if blocks is None:
        out = biased_attention(q, k, v, prepared, backend=backend)
    else:
        assert backend == "fused"
        out = fused.fused_attention(q, k, v, prepared, q_block=blocks[0], kv_block=blocks[1])
    (out * dout).sum().backward()
    grads = [x.grad, q.grad, k.grad, v.grad, module.proj.weight.grad, module.proj.bias.grad]
    return [out.detach(), *(g.clone() for g in grads)]


def assert_gradients_close(got, expected, tol=2e-5):
    for g, e in zip(got, expected):
        scale = max(float(e.abs().max()), 1.0)
        torch.testing.assert_close(g, e, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("q_len,past_len,batch", [(37, 0, 2), (20, 25, 3), (1, 29, 2), (64, 0, 1)])
def test_fused_gradients_match_materialise(q_len, past_len, batch, blocks):
    module = gate()
    x, q, k, v = inputs(batch, past_len, q_len, grad=True)
    x.requires_grad_(True)
    dout = torch.randn(q.shape)
    got = _gradients("fused", module, x, q, k, v, dout, past_len, blocks=blocks)
    expected = _gradients("materialize", module, x, q, k, v, dout, past_len)
    assert_gradients_close(got, expected)


def test_fused_gradients_against_float64():
    """The fused backward (float32) against the materialised path in float64."""
    module = gate()
    x, q, k, v = inputs(2, 0, 90, grad=True)
    x.requires_grad_(True)
    dout = torch.randn(q.shape)
    got = _gradients("fused", module, x, q, k, v, dout)
    module64 = gate().double()
    module64.load_state_dict({n: p.double() for n, p in module.state_dict().items()})
    x64, q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (x, q, k, v))
    expected = _gradients("materialize", module64, x64, q64, k64, v64, dout.double())
    assert_gradients_close(got, [e.float() for e in expected], tol=1e-5)


# --- block skipping and extreme gates -----------------------------------------------------------
def test_a_strongly_forgetting_head_skips_far_blocks():
    module = gate(2, DIM, scale=0.1, bias_init=(-2.0, 6.0))  # log f ~ -2.1 and ~ -0.0025
    x = torch.randn(1, 1024, DIM, requires_grad=True)
    q, k, v = (torch.randn(1, 2, 1024, 32, requires_grad=True) for _ in range(3))
    with torch.no_grad():
        counts = fused.block_counts(q, k, v, module.prepare(x), kv_block=64)
    total = counts["computed"] + counts["skipped"]
    assert total == 2 * sum(min(r + 128, 1024) // 64 for r in range(0, 1024, 128)), counts
    assert counts["skipped"] > total / 4, counts  # the first head's far blocks
    dout = torch.randn(q.shape)
    got = _gradients("fused", module, x, q, k, v, dout, blocks=(fused.Q_BLOCK, 64))
    expected = _gradients("materialize", module, x, q, k, v, dout)
    assert_gradients_close(got, expected, tol=5e-5)


def test_a_gate_that_never_forgets_skips_nothing():
    module = gate(HEADS, DIM, scale=0.0, bias_init=(30.0, 30.0, 30.0))  # log f = 0
    x, q, k, v = inputs(1, 0, 300)
    with torch.no_grad():
        prepared = module.prepare(x)
        counts = fused.block_counts(q, k, v, prepared)
        # no forgetting: plain causal attention
        plain = biased_attention(q, k, v, None)
        got = biased_attention(q, k, v, prepared, backend="fused")
    assert counts["skipped"] == 0
    assert_close(got, plain)


@pytest.mark.parametrize("logit", [1e4, -1e4])
@pytest.mark.parametrize("backend", ["materialize", "table", "fused", "flex"])
def test_extreme_gate_logits_give_no_nan(logit, backend):
    """f = 1 (nothing forgotten) or log f = -1e4 (each query sees only itself)."""
    module = gate(HEADS, DIM, scale=0.0, bias_init=(logit,) * HEADS)
    x, q, k, v = inputs(2, 10, 30)
    prepared = prepared_for(module, x, 10)
    got, _ = _attention(q, k, v, prepared, backend)
    assert torch.isfinite(got).all()
    if logit < 0:  # every weight on the query's own key
        expected = v[:, :, 10:]
    else:
        expected, _ = _attention(q, k, v, None, "materialize", q_start=10)
    assert_close(got, expected)


@pytest.mark.parametrize("backend", ["materialize", "fused"])
def test_extreme_gate_logits_give_finite_gradients(backend):
    module = gate(2, DIM, scale=0.0, bias_init=(1e4, -1e4))
    x, q, k, v = inputs(1, 0, 40, grad=True)
    q, k, v = q[:, :2].detach(), k[:, :2].detach(), v[:, :2].detach()
    for t in (q, k, v):
        t.requires_grad_(True)
    x.requires_grad_(True)
    grads = _gradients(backend, module, x, q, k, v, torch.randn(q.shape))
    assert all(torch.isfinite(g).all() for g in grads)


# --- the float32 precision of F_i - F_j at long lengths -----------------------------------------
def test_precision_of_the_difference_at_64k_tokens():
    """At 65,536 tokens F reaches about -6,000: F_i - F_j of float32 values would lose
    digits (ulp(6000) ~ 5e-4). The split F = hi + lo keeps float32's rounding of the true
    difference: within a few ulps of |PE|, where the naive float32 difference is far off."""
    n, heads = 65536, 2
    torch.manual_seed(5)
    module = ForgettingGate(heads, 4, bias_init=[2.0, 3.0])  # log f ~ -0.13 and ~ -0.05
    with torch.no_grad():
        module.proj.weight.normal_(0.0, 0.5)
    x = torch.randn(1, n, 4)
    with torch.no_grad():
        log_f = module.log_forget(x)
        F_all = module.cumulative(x)  # float64
        assert float(F_all.min()) < -3000
        errors, naive_errors, scales = [], [], []
        for start in (5, 20000, 65536 - 8):  # 8 query rows here, against every key before
            prepared = module.prepare(x[:, start : start + 8], past=F_all[:, :, :start])
            got = prepared.materialize()  # [1, heads, 8, start + 8]
            i = torch.arange(start, start + 8)[:, None]
            j = torch.arange(start + 8)[None, :]
            seen = j <= i
            exact = F_all[:, :, start : start + 8, None] - F_all[:, :, None, : start + 8]
            naive = (
                F_all.float()[:, :, start : start + 8, None]
                - F_all.float()[:, :, None, : start + 8]
            )
            errors.append((got.double() - exact)[..., seen].abs())
            naive_errors.append((naive.double() - exact)[..., seen].abs())
            scales.append(exact[..., seen].abs())
    error, naive_error, scale = (torch.cat(t, -1) for t in (errors, naive_errors, scales))
    ulp = 2.0**-23
    assert torch.all(error <= 4 * ulp * scale + 1e-10), float((error - 4 * ulp * scale).max())
    near = scale < 1  # keys near the query: small PE, where the naive difference fails
    assert near.any()
    assert float(naive_error[near].max()) > 1000 * float(error[near].max() + 1e-12)
    assert float((naive_error[near] / (ulp * scale[near]).clamp_min(1e-30)).max()) > 1000
    assert float(naive_error.max()) > 1e-4
    # the reference itself: the sum of the float32 log f in float64
    torch.testing.assert_close(F_all[:, :, -1], log_f.double().sum(-1), rtol=1e-12, atol=0)


def test_fused_and_table_keep_the_precision_at_long_lengths():
    """The fused kernel and the table path read the same split: the attention of the last
    queries of a 65,536-token sequence equals the materialised path's."""
    n, heads = 65536, 2
    torch.manual_seed(6)
    module = ForgettingGate(heads, 4, bias_init=[4.0, 6.0])
    x = torch.randn(1, n, 4)
    q = torch.randn(1, heads, 4, 16)
    k, v = (torch.randn(1, heads, n, 16) for _ in range(2))
    with torch.no_grad():
        F_all = module.cumulative(x)
        prepared = module.prepare(x[:, -4:], past=F_all[:, :, :-4])
        expected, _ = _attention(q, k, v, prepared, "materialize")
        for backend in ("fused", "table"):
            got, _ = _attention(q, k, v, prepared, backend)
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


# --- bad input ------------------------------------------------------------------------------------
def test_bad_constructor_arguments():
    for heads, error in [(0, ValueError), (2.0, TypeError), (True, TypeError)]:
        with pytest.raises(error, match="num_heads"):
            ForgettingGate(heads, 4)
    for dim, error in [(0, ValueError), ("4", TypeError)]:
        with pytest.raises(error, match="dim"):
            ForgettingGate(2, dim)
    with pytest.raises(ValueError, match="bias_init must be a number or 2 numbers"):
        ForgettingGate(2, 4, bias_init=[1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="bias_init must be finite"):
        ForgettingGate(2, 4, bias_init=float("nan"))
    with pytest.raises(TypeError, match="bias_init"):
        ForgettingGate(2, 4, bias_init="high")
    with pytest.raises(TypeError, match="bias_init"):
        ForgettingGate(2, 4, bias_init=True)
    with pytest.raises(ValueError, match="name must be one of"):
        make_bias("forget", 2, dim=4)


def test_bad_x_and_past():
    module = gate(2, 4)
    x = torch.randn(2, 5, 4)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        module.prepare(x.tolist())
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        module.prepare(x.long())
    with pytest.raises(ValueError, match=r"x must have shape \[batch, len, dim=4\]"):
        module.prepare(x[0])
    with pytest.raises(ValueError, match=r"x must have shape \[batch, len, dim=4\]"):
        module.log_forget(torch.randn(2, 5, 3))
    past = module.cumulative(x)
    with pytest.raises(TypeError, match="past must be a float64 tensor"):
        module.prepare(x, past=past.float())
    with pytest.raises(TypeError, match="past must be a float64 tensor"):
        module.prepare(x, past=past.tolist())
    for bad in (past[:1], past[:, :1], past[0]):
        with pytest.raises(ValueError, match=r"past must have shape \[batch=2, heads=2"):
            module.prepare(x, past=bad)


def test_bad_attention_arguments():
    module = gate()
    x, q, k, v = inputs(2, 0, 6)
    with torch.no_grad():
        prepared = module.prepare(x)
        with pytest.raises(TypeError, match=r"computed from the layer input: pass bias\.prepare"):
            biased_attention(q, k, v, module)
        for backend in ("materialize", "table", "fused", "flex"):
            with pytest.raises(ValueError, match="ForgettingBias .* causal only"):
                biased_attention(q, k, v, prepared, causal=False, backend=backend)
            with pytest.raises(
                ValueError, match="prepared for batch=2 sequences but q has batch 3"
            ):
                biased_attention(
                    *(torch.cat([t, t[:1]]) for t in (q, k, v)), prepared, backend=backend
                )
            with pytest.raises(
                ValueError, match="prepared for batch=2 sequences but q has batch 1"
            ):
                biased_attention(q[:1], k[:1], v[:1], prepared, backend=backend)
        with pytest.raises(ValueError, match="num_heads"):
            biased_attention(q[:, :2], k[:, :2], v[:, :2], prepared)
        with pytest.raises(ValueError, match="prepared for"):
            biased_attention(q[:, :, :5], k[:, :, :5], v[:, :, :5], prepared)


def test_bad_prepared_bias():
    F_all = torch.zeros(2, 3, 10, dtype=torch.float64)
    bias = ForgettingBias(F_all, 4)
    assert (bias.q_len, bias.k_len, bias.q_start, bias.batch) == (4, 10, 6, 2)
    assert ForgettingBias(F_all, 4, q_start=2).q_start == 2
    with pytest.raises(TypeError, match="cumulative must be a float64 tensor"):
        ForgettingBias(F_all.float())
    with pytest.raises(ValueError, match=r"cumulative must have shape \[batch, heads, k_len\]"):
        ForgettingBias(F_all[0])
    with pytest.raises(ValueError, match="q_start \\+ q_len"):
        ForgettingBias(F_all, 4, q_start=7)
    with pytest.raises(ValueError, match="k_len"):
        ForgettingBias(F_all, 11)
    with pytest.raises(TypeError, match="dtype"):
        ForgettingBias(F_all, dtype=torch.bfloat16)


def test_the_kernel_checks_its_own_inputs():
    assert fused.available()
    q, k, v = (torch.randn(2, HEADS, 10, 8) for _ in range(3))
    hi = torch.zeros(2, HEADS, 10)
    op = torch.ops.relbias_fused.forgetting_forward
    with pytest.raises(RuntimeError, match="causal only"):
        op(q, k, v, hi, 9, hi, 0, False, 4, 4)
    with pytest.raises(RuntimeError, match=r"hi and lo must be \[batch, heads, k_len\]"):
        op(q, k, v, hi[:, :, :9].contiguous(), 9, hi, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match=r"hi and lo must be \[batch, heads, k_len\]"):
        op(q, k, v, hi[:1].contiguous(), 9, hi[:1].contiguous(), 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="lo must be a contiguous float32"):
        op(q, k, v, hi.double(), 9, hi, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="queries must sit at key positions"):
        op(q, k, v, hi, 10, hi, 1, True, 4, 4)
    out, lse, _ = op(q, k, v, hi, 9, hi, 0, True, 4, 4)
    expected = biased_attention(q, k, v, None)
    assert_close(out, expected)  # F = 0: no bias
