"""The work of a cached decoding step (issue 45, item 4), counted, never timed: the aten
operations of one step against the same Llama with RoPE on SDPA, the state every layer after
the first reads from the first, the bias tables kept between steps and their invalidation
(parameters updated in place, positions changed), and the results against the general path."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import POSITION_FAMILIES, biased, random_rows, tiny_model
from transformers import DynamicCache

import relbias.hf as rh
import relbias.hf._attention as attention
from relbias.hf.decode_work import greedy_decode, ops_of_one_step


@pytest.fixture
def general_path(monkeypatch):
    """Within this fixture's ``use()``: every step takes the general path (the core's
    ``biased_attention``) and the mask is never skipped, as before the decoding step's path."""

    class Switch:
        def use(self):
            monkeypatch.setattr(attention, "_decoding_step", lambda *args, **kwargs: None)
            monkeypatch.setattr(attention, "_reads_every_key", lambda *args, **kwargs: False)

        def undo(self):
            monkeypatch.undo()

    return Switch()


@pytest.mark.parametrize("rows", [(6,), (6, 3)], ids=["one row", "left-padded"])
@pytest.mark.parametrize("family", POSITION_FAMILIES)
def test_a_decoding_step_does_about_the_work_of_rope(family, rows, general_path):
    """One step's aten operations against the RoPE Llama's: the per-layer positions, bias,
    mask and checks of the general path made every offset family's step 1.2-1.6x RoPE's
    (FIRE's 1.4-1.7x); now the positions and mask work happen once per forward and the
    bias row is a slice of a kept table (FIRE past its threshold still runs its MLP)."""
    rope = ops_of_one_step(tiny_model(), rows)
    model = biased(family)
    ops = ops_of_one_step(model, rows)
    bound = 1.35 if family == "fire" else 1.1
    assert ops <= bound * rope, (ops, rope)
    general_path.use()
    before = ops_of_one_step(model, rows)
    assert before > 1.15 * rope  # the bound above would fail on the general path
    assert ops < before


def test_every_layer_after_the_first_reads_the_first_layers_step_state():
    model = biased("alibi", num_hidden_layers=3)
    attention.clear_step_caches()
    _, step = greedy_decode(model, (6, 3), 1)
    stats = dict(attention.STEP_STATS)
    steps = 4
    for _ in range(steps):
        step()
    new = {k: attention.STEP_STATS[k] - stats[k] for k in stats}
    assert new["steps"] == steps  # one per forward (every layer full attention)
    assert new["step_reuses"] == steps * 2  # by layers 1 and 2
    assert new["tables"] == 0  # the tables built on the first step still cover the offsets
    assert new["table_reuses"] == steps * 3


def test_tables_grow_rarely_over_a_long_decode():
    model = biased("t5")
    attention.clear_step_caches()
    stats = dict(attention.STEP_STATS)
    greedy_decode(model, (5,), 150)
    built = attention.STEP_STATS["tables"] - stats["tables"]
    layers = model.config.num_hidden_layers
    assert built <= 3 * layers  # 150 steps: the table doubles, not one build per step


@pytest.mark.parametrize("family", POSITION_FAMILIES)
def test_decoding_steps_equal_the_general_path(family, general_path):
    """The decoding step's path gives the general path's logits: bit for bit where the bias is
    evaluated by the same arithmetic, within float rounding where a transcendental function
    runs on other lanes of a vector (Kerple's pow)."""
    model = biased(family)
    for rows in [(7,), (7, 3, 5)]:
        attention.clear_step_caches()
        fast, _ = greedy_decode(model, rows, 12)
        general_path.use()
        slow, _ = greedy_decode(model, rows, 12)
        general_path.undo()
        for a, b in zip(fast, slow):
            torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["kerple_power", "kerple_log", "t5", "fire"])
def test_an_in_place_parameter_update_rebuilds_the_table(family, general_path):
    """An optimiser step between two decodes (the parameters change in place, as in training):
    the kept tables follow the parameters' versions, so the second decode equals the general
    path with the new parameters."""
    model = biased(family)
    if family == "fire":
        for bias in rh.biases(model):  # a threshold above the positions: FIRE's table path
            with torch.no_grad():
                bias.L_multiplier.fill_(20.0)
    first, _ = greedy_decode(model, (6, 3), 4)
    model.train()
    opt = torch.optim.SGD([p for n, p in model.named_parameters() if ".relbias." in n], lr=0.5)
    ids = torch.tensor(random_rows([8], seed=3))
    model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    opt.step()
    model.eval()
    built = attention.STEP_STATS["tables"]
    after, _ = greedy_decode(model, (6, 3), 4)
    assert attention.STEP_STATS["tables"] > built  # rebuilt for the new parameters
    assert not torch.allclose(after[-1], first[-1])
    general_path.use()
    expected, _ = greedy_decode(model, (6, 3), 4)
    for a, b in zip(after, expected):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize("family", ["fire", "alibi"])
def test_positions_changed_in_place_rebuild_the_step_state(family):
    """The shared step state is keyed by the position ids (and their version): the same tensor
    written in place between two calls gives the new positions' attention (FIRE reads the query
    position)."""
    model = biased(family)
    layer = model.model.layers[0].self_attn
    torch.manual_seed(0)
    q = torch.randn(2, 4, 1, 8)
    k, v = torch.randn(2, 2, 2, 9, 8)
    mask = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :3] = False
    position_ids = torch.tensor([[8], [5]])

    def call():
        with torch.no_grad():
            return rh.relbias_attention(
                layer, q, k, v, mask, position_ids=position_ids, relbias_offsets=(8, 0)
            )[0]

    first = call()
    expected = _general_attention(layer, q, k, v, mask, position_ids, (8, 0))
    torch.testing.assert_close(first, expected, rtol=0, atol=1e-6)
    steps = attention.STEP_STATS["steps"]
    position_ids.add_(10)  # past FIRE's threshold (3): another denominator
    second = call()
    assert attention.STEP_STATS["steps"] == steps + 1
    for got in (first, second):
        assert torch.isfinite(got).all()
    expected = _general_attention(layer, q, k, v, mask, position_ids, (8, 0))
    torch.testing.assert_close(second, expected, rtol=0, atol=1e-6)
    if family == "fire":
        assert not torch.allclose(first, second)


def _general_attention(layer, q, k, v, mask, position_ids, offsets):
    """The general path's attention for one call (the core's ``biased_attention``)."""
    from relbias import biased_attention

    qpos, kpos = attention.positions(q, k, position_ids, offsets)
    with torch.no_grad():
        out = biased_attention(
            q,
            k,
            v,
            layer._relbias_bias,
            mask=mask,
            q_positions=qpos,
            k_positions=kpos,
            causal=False,
        )
    return out.transpose(1, 2)


def test_the_mask_is_skipped_only_where_every_key_is_read():
    from transformers.masking_utils import causal_mask_function, sliding_window_causal_mask_function

    args = dict(batch_size=2, q_length=1, kv_length=9, q_offset=8, kv_offset=0)
    args["mask_function"] = causal_mask_function
    assert rh.relbias_mask(**args) is None
    assert rh.relbias_mask(**args, attention_mask=torch.ones(2, 9, dtype=torch.bool)) is None
    padded = torch.ones(2, 9, dtype=torch.bool)
    padded[1, :2] = False
    assert rh.relbias_mask(**args, attention_mask=padded).shape == (2, 1, 1, 9)
    static = dict(args, kv_length=16)  # a static cache's empty slots
    assert rh.relbias_mask(**static).shape == (2, 1, 1, 16)
    assert rh.relbias_mask(**args, allow_is_causal_skip=False) is not None
    window = dict(args, mask_function=sliding_window_causal_mask_function(4), local_size=4)
    assert rh.relbias_mask(**window) is not None
    prompt = dict(args, q_length=3, kv_length=11)
    assert rh.relbias_mask(**prompt).shape == (2, 1, 3, 11)


def test_no_step_state_with_gradients():
    """With gradients (training through a cache) the general path runs: the gradient reaches
    the bias parameters."""
    model = biased("kerple_log").train()
    ids = torch.tensor(random_rows([6], seed=2))
    cache = DynamicCache(config=model.config)
    model(input_ids=ids, cache=cache)
    stats = dict(attention.STEP_STATS)
    out = model(input_ids=ids[:, :1], cache=cache)
    assert attention.STEP_STATS == stats
    out.logits.sum().backward()
    grads = [p.grad for n, p in model.named_parameters() if ".relbias." in n]
    assert grads and all(g is not None for g in grads)
