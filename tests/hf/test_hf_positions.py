"""relbias.hf under torch.compile (no host read of positions: the whole model compiles as one
graph) and under autocast. The per-row bias itself is the core's
(tests/core/test_positioned.py)."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import HEADS, biased, left_padded, random_rows


@pytest.mark.parametrize("family", ["fire", "t5", "kerple_log", "kerple_power"])
def test_torch_compile_in_one_graph_gives_the_same_logits_and_gradients(family):
    """``fullgraph=True``: no host read and no graph break in the model (the eager table path
    reads the offsets' range; under compile the elementwise path runs). ``aot_eager`` keeps
    the test short; it traces exactly what inductor would compile."""
    model = biased(family).train()
    ids = torch.tensor(random_rows([10, 10], seed=7))
    out = model(input_ids=ids, labels=ids, use_cache=False)
    out.loss.backward()
    expected = {n: p.grad.clone() for n, p in model.named_parameters() if ".relbias." in n}
    model.zero_grad()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    got = compiled(input_ids=ids, labels=ids, use_cache=False)
    torch.testing.assert_close(got.logits, out.logits, rtol=0, atol=1e-6)
    got.loss.backward()
    assert expected
    for name, grad in expected.items():
        torch.testing.assert_close(
            dict(model.named_parameters())[name].grad, grad, rtol=0, atol=1e-6
        )


def test_under_autocast_the_bias_is_added_in_float32():
    """bfloat16 autocast: q, k and v arrive in bfloat16; the bias (here T5 values that
    bfloat16 cannot hold, 3 + 1/512 apart from 3) is added in float32 to their float32 copies,
    so the output is the float32 attention of those inputs, not one with a rounded bias."""
    from torch.nn import functional as F

    import relbias.hf as rh

    model = biased("t5")
    attention = model.model.layers[0].self_attn
    bias = attention._relbias_bias
    with torch.no_grad():
        bias.weight.copy_(3.0 + torch.arange(bias.weight.numel()).view_as(bias.weight) / 512)
    torch.manual_seed(1)
    q = torch.randn(1, HEADS, 6, 8).bfloat16()
    k, v = torch.randn(2, 1, 2, 6, 8).bfloat16()
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got, _ = rh.relbias_attention(attention, q, k, v, causal[None, None], scaling=0.25)
    assert got.dtype == torch.float32
    exact = bias(6, 6)[None]
    kk, vv = k.float().repeat_interleave(2, 1), v.float().repeat_interleave(2, 1)
    mask = exact.masked_fill(~causal, float("-inf"))
    expected = F.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=mask, scale=0.25)
    torch.testing.assert_close(got, expected.transpose(1, 2), rtol=0, atol=1e-6)
    rounded = exact.bfloat16().float().masked_fill(~causal, float("-inf"))
    coarse = F.scaled_dot_product_attention(q.float(), kk, vv, attn_mask=rounded, scale=0.25)
    assert (coarse.transpose(1, 2) - got).abs().max() > 1e-4
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(input_ids=torch.tensor(random_rows([8], seed=8))).logits
    assert torch.isfinite(logits).all()


def _static_greedy(model, ids, mask, new_tokens):
    """Greedy decoding of ``new_tokens`` tokens through a static cache, without gradients."""
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            do_sample=False,
            cache_implementation="static",
        )


@pytest.mark.parametrize("family", ["t5", "fire", "sandwich", "alibi"])
def test_compiled_static_cache_decoding_does_not_recompile_per_step(family):
    """The forward compiled in one graph (``fullgraph``) and decoding with a static cache: the
    prompt and the decoding step compile once each, the positions and cache offsets of each
    new step are tensors of the same graph (a second generation with ``fail_on_recompile``
    runs without one), and the tokens equal eager decoding."""
    model = biased(family)
    ids, mask = left_padded(random_rows([5, 3], seed=11))

    def generate():
        return _static_greedy(model, ids, mask, 5)

    expected = generate()
    eager_forward = model.forward
    graphs = []

    def counting_backend(gm, example_inputs):
        graphs.append(gm)
        from torch._dynamo.backends.debugging import aot_eager

        return aot_eager(gm, example_inputs)

    torch._dynamo.reset()  # the compiled code of earlier tests counts toward the recompile limit
    model.forward = torch.compile(eager_forward, backend=counting_backend, fullgraph=True)
    try:
        assert torch.equal(generate(), expected)
        assert len(graphs) == 2  # the prompt's and the decoding step's
        torch.compiler.set_stance("fail_on_recompile")
        try:
            assert torch.equal(generate(), expected)
        finally:
            torch.compiler.set_stance("default")
    finally:
        model.forward = eager_forward


@pytest.mark.parametrize("family", ["sandwich", "kerple_log"])
def test_a_compiled_static_decode_evaluates_a_parameter_free_bias_once_per_forward(family):
    """Under compile with a static cache every layer reads every slot: a parameter-free
    family's values (the same in every layer: Sandwich's cosines) are computed by the first
    layer and read by the others, a family with parameters (Kerple-log's log1p) computes its
    own in each layer (the operations counted in each traced graph); the tokens equal eager
    decoding's either way (a left-padded batch)."""
    import collections

    from torch._dynamo.backends.common import aot_autograd

    model = biased(family)
    layers = model.config.num_hidden_layers
    ids, mask = left_padded(random_rows([5, 3], seed=12))

    def generate():
        return _static_greedy(model, ids, mask, 4)

    expected = generate()
    graphs = []

    def count(gm, example_inputs):
        graphs.append(collections.Counter(str(n.target) for n in gm.graph.nodes))
        return gm

    eager_forward = model.forward
    torch._dynamo.reset()  # the compiled code of earlier tests counts toward the recompile limit
    compiled = torch.compile(eager_forward, backend=aot_autograd(fw_compiler=count), fullgraph=True)
    model.forward = compiled
    try:
        assert torch.equal(generate(), expected)
    finally:
        model.forward = eager_forward
    assert len(graphs) == 2  # the prompt's and the decoding step's
    prompt, step = graphs
    if family == "sandwich":
        # the prompt: one cos for the bias, one in the (unused) rotary embedding; the decoding
        # step reads the bias from the table that apply() keeps: the rotary's cos alone
        assert prompt["aten.cos.default"] == 2
        assert step["aten.cos.default"] == 1 and step["aten.index_select.default"] == 1
    else:
        assert prompt["aten.log1p.default"] == step["aten.log1p.default"] == layers


def _compiled_graph_ops(model, generate):
    """The aten operations of each graph that a compiled forward traces during ``generate``."""
    import collections

    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def count(gm, example_inputs):
        graphs.append(collections.Counter(str(n.target) for n in gm.graph.nodes))
        return gm

    eager_forward = model.forward
    torch._dynamo.reset()
    model.forward = torch.compile(
        eager_forward, backend=aot_autograd(fw_compiler=count), fullgraph=True
    )
    try:
        return generate(), graphs
    finally:
        model.forward = eager_forward


@pytest.mark.parametrize("family", ["sandwich", "alibi"])
def test_apply_keeps_a_parameter_free_familys_values_in_a_table_that_is_not_saved(family):
    """The table holds the module's own values at every offset from -(n - 1) to n - 1
    (n = max_position_embeddings), in every layer's attention the same table, and is not a
    tensor of the state dict (a saved model is unchanged by it); a family with parameters
    gets none."""
    from relbias.hf._attention import KEPT_TABLE

    model = biased(family)
    n = model.config.max_position_embeddings
    table = getattr(model.model, KEPT_TABLE)
    bias = model.model.layers[0].self_attn._relbias_bias
    assert torch.equal(table, bias.offset_table(-(n - 1), n - 1))
    assert {id(a._relbias_table_home) for a in (l.self_attn for l in model.model.layers)} == {
        id(model.model)
    }
    assert not any(KEPT_TABLE in name for name in model.state_dict())
    assert not hasattr(biased("kerple_log").model, KEPT_TABLE)


def test_a_compiled_decode_computes_the_values_where_the_kept_table_does_not_serve():
    """A model cast after apply() (its table with it: float64 values rounded from float32) and
    a static cache longer than the table compute Sandwich's cosines in the decoding step, and
    decode as eager decoding does."""
    ids, mask = left_padded(random_rows([5, 3], seed=13))
    cast = biased("sandwich").double()
    short = biased("sandwich", max_position_embeddings=6)  # 5 + 4 slots: past the table
    for model in (cast, short):
        expected = _static_greedy(model, ids, mask, 4)
        got, graphs = _compiled_graph_ops(model, lambda m=model: _static_greedy(m, ids, mask, 4))
        assert torch.equal(got, expected)
        assert [ops["aten.cos.default"] for ops in graphs] == [2, 2]
        assert all(ops["aten.index_select.default"] == 0 for ops in graphs)
