"""TinyLM: every positional scheme runs, learned positions fail loudly, biases are shared or not."""

import pytest
import torch

from relbias import RotaryEmbedding
from relbias.lab.model import (
    BIAS_POSITIONS,
    POSITION_NAMES,
    TinyLM,
    default_bias_kwargs,
    sinusoidal_positions,
)

TINY = dict(dim=16, depth=2, heads=2, train_len=8)


def test_position_names_cover_biases_and_baselines():
    assert set(BIAS_POSITIONS) == {
        "offset",
        "t5",
        "alibi",
        "sandwich",
        "kerple_power",
        "kerple_log",
        "fire",
    }
    assert set(POSITION_NAMES) - set(BIAS_POSITIONS) == {
        "nope",
        "sinusoidal",
        "learned",
        "rope",
        "forgetting",
    }


@pytest.mark.parametrize("position", POSITION_NAMES)
def test_forward_shape_and_causality(position):
    torch.manual_seed(0)
    model = TinyLM(position=position, **TINY).eval()
    x = torch.randint(0, 256, (2, 8))
    logits = model(x)
    assert logits.shape == (2, 8, 256)
    assert torch.isfinite(logits).all()
    changed = x.clone()
    changed[:, 5:] = (changed[:, 5:] + 1) % 256
    # earlier positions never see later tokens
    torch.testing.assert_close(model(changed)[:, :5], logits[:, :5])


def test_learned_positions_error_beyond_train_len_and_clip_fallback():
    model = TinyLM(position="learned", **TINY)
    x = torch.randint(0, 256, (1, 12))
    with pytest.raises(ValueError, match="learned_fallback='clip'"):
        model(x)
    model.learned_fallback = "clip"
    assert model(x).shape == (1, 12, 256)
    clipped = TinyLM(position="learned", learned_fallback="clip", **TINY)
    assert clipped.learned_fallback == "clip"
    with pytest.raises(ValueError, match="learned_fallback"):
        TinyLM(position="learned", learned_fallback="wrap", **TINY)


@pytest.mark.parametrize(
    "position", ["sinusoidal", "rope", "nope", "alibi", "fire", "t5", "forgetting"]
)
def test_other_positions_run_beyond_train_len(position):
    model = TinyLM(position=position, **TINY)
    assert torch.isfinite(model(torch.randint(0, 256, (1, 40)))).all()


def test_bias_shared_by_default_and_per_layer_on_request():
    shared = TinyLM(position="t5", **TINY)
    assert shared.share_bias and len(shared.bias_modules()) == 1
    per_layer = TinyLM(position="t5", share_bias=False, **TINY)
    modules = per_layer.bias_modules()
    assert len(modules) == TINY["depth"] and modules[0] is not modules[1]
    assert TinyLM(position="rope", **TINY).bias_modules() == []


def test_default_bias_kwargs_follow_train_len():
    assert default_bias_kwargs("offset", 64) == {"max_offset": 63, "unseen": "clip"}
    assert default_bias_kwargs("t5", 64)["max_distance"] == 64
    assert default_bias_kwargs("fire", 64) == {"L": 64}
    model = TinyLM(position="offset", bias_kwargs={"unseen": "error"}, **TINY)
    assert model.bias.unseen == "error" and model.bias.max_offset == 7


@pytest.mark.parametrize(
    "kwargs, error",
    [
        (dict(position="bogus"), ValueError),
        (dict(dim=15, heads=2), ValueError),
        (dict(depth=0), ValueError),
        (dict(train_len=2.5), TypeError),
        (dict(share_bias="yes"), TypeError),
    ],
)
def test_bad_arguments(kwargs, error):
    with pytest.raises(error):
        TinyLM(**{**TINY, **kwargs})


def test_forward_rejects_1d_input():
    with pytest.raises(ValueError, match=r"\[batch, len\]"):
        TinyLM(**TINY)(torch.zeros(5, dtype=torch.long))


def test_rotary_scores_depend_only_on_offset():
    rot = RotaryEmbedding(8)
    q, k = torch.randn(8), torch.randn(8)
    seq = torch.stack([q, k] * 10)[None, None]  # q at even, k at odd positions
    out = rot(seq)[0, 0]
    score = [float(out[i] @ out[i - 3]) for i in range(4, 20, 2)]  # offset 3
    torch.testing.assert_close(torch.tensor(score), torch.full((len(score),), score[0]))


def test_sinusoidal_table():
    table = sinusoidal_positions(10, 6)
    assert table.shape == (10, 6)
    torch.testing.assert_close(table[0], torch.tensor([0.0, 1.0] * 3))


# --- the prepared bias and the attention backend ---------------------------------------------


@pytest.mark.parametrize("share_bias", [True, False])
@pytest.mark.parametrize("position", BIAS_POSITIONS)
def test_fast_evaluation_equals_the_materialised_bias(position, share_bias, monkeypatch):
    """Under no_grad on the CPU the model adds its bias from the O(n) table inside the
    fused kernel; same logits."""
    torch.manual_seed(1)
    model = TinyLM(position=position, share_bias=share_bias, **TINY).eval()
    x = torch.randint(0, 256, (2, 16 * TINY["train_len"]))  # 16x the training length
    with torch.no_grad():
        fast = model(x)
        model.attention_backend = "materialize"
        dense = model(x)
    assert relbias_backend_after(model, x, "auto", monkeypatch) == "fused"
    torch.testing.assert_close(fast, dense, atol=2e-5, rtol=1e-4)


def relbias_backend_after(model, x, backend, monkeypatch):
    """The backend biased_attention took in the model's last layer (asked, not guessed)."""
    import relbias.lab.model as model_module

    taken, real = [], model_module.biased_attention

    def spy(*args, **kwargs):
        out, name = real(*args, **kwargs, return_backend=True)
        taken.append(name)
        return out

    monkeypatch.setattr(model_module, "biased_attention", spy)
    model.attention_backend = backend
    with torch.no_grad():
        model(x)
    return taken[-1]


@pytest.mark.parametrize("position", BIAS_POSITIONS)
def test_training_gradients_equal_the_materialised_bias(position):
    torch.manual_seed(2)
    model = TinyLM(position=position, **TINY)
    x = torch.randint(0, 256, (2, 8))
    grads = {}
    for backend in ("auto", "materialize"):
        model.attention_backend = backend
        model.zero_grad()
        model(x).square().mean().backward()
        grads[backend] = {
            n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None
        }
    assert grads["auto"].keys() == grads["materialize"].keys()
    learnable = any(True for _ in model.bias.parameters())
    assert any(n.startswith("bias.") for n in grads["auto"]) == learnable
    for name in grads["auto"]:
        torch.testing.assert_close(grads["auto"][name], grads["materialize"][name])


@pytest.mark.parametrize("position", BIAS_POSITIONS)
def test_shared_bias_is_computed_once_per_forward(position, monkeypatch):
    import relbias.lab.model as model_module

    calls = []
    real = model_module.prepare_bias
    monkeypatch.setattr(
        model_module,
        "prepare_bias",
        lambda bias, *a, **k: calls.append(bias) or real(bias, *a, **k),
    )
    model = TinyLM(position=position, **{**TINY, "depth": 3})
    model(torch.randint(0, 256, (1, 8)))
    assert calls == [model.bias]
    per_layer = TinyLM(position=position, share_bias=False, **{**TINY, "depth": 3})
    calls.clear()
    per_layer(torch.randint(0, 256, (1, 8)))
    assert calls == [blk.bias for blk in per_layer.blocks]


def test_attention_backend_is_checked():
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        TinyLM(position="alibi", attention_backend="fast", **TINY)
    model = TinyLM(position="alibi", **TINY)
    with pytest.raises(ValueError, match="attention_backend must be one of"):
        model.attention_backend = "gpu"


def test_forgetting_has_a_gate_per_layer_and_no_positional_embedding():
    torch.manual_seed(0)
    model = TinyLM(position="forgetting", **TINY)
    gates = model.gates()
    assert len(gates) == TINY["depth"] and gates[0] is not gates[1]
    assert model.bias_modules() == [] and model.abs_pos is None and model.rotary is None
    assert all(torch.all(g.proj.bias == 0) for g in gates)  # the reference code's start
    x = torch.randint(0, 256, (2, 8))
    model(x).logsumexp(-1).sum().backward()
    assert all(g.proj.weight.grad.abs().sum() > 0 for g in gates)


def test_forgetting_layer_equals_its_written_out_attention():
    """The block's attention is softmax(q k^T / sqrt(d) + F_i - F_j + mask) v, with F the
    cumulative log forget gate of the layer's normalised input, on every CPU backend."""
    torch.manual_seed(1)
    model = TinyLM(position="forgetting", **TINY).eval()
    block = model.blocks[0]
    x = torch.randn(2, 8, TINY["dim"])
    h = block.norm1(x)
    log_f = torch.nn.functional.logsigmoid(block.gate.proj(h)).transpose(1, 2).double()
    F = log_f.cumsum(-1)
    pe = (F[..., :, None] - F[..., None, :]).float()
    q, k, v = block.attn.qkv(h).view(2, 8, 3, 2, 8).permute(2, 0, 3, 1, 4)
    mask = torch.ones(8, 8, dtype=torch.bool).tril()
    scores = (q @ k.transpose(-1, -2) / 8**0.5 + pe).masked_fill(~mask, float("-inf"))
    expected = block.attn.proj((scores.softmax(-1) @ v).transpose(1, 2).reshape(2, 8, 16))
    for backend in ("materialize", "table", "fused", "auto"):
        got = block.attn(h, block.gate.prepare(h), backend)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)


def test_gate_log_forget_is_each_gate_on_its_layers_input():
    torch.manual_seed(0)
    model = TinyLM(position="forgetting", dim=16, depth=3, heads=2, train_len=8)
    idx = torch.randint(0, 256, (2, 8))
    inputs = []
    hooks = [
        b.norm1.register_forward_hook(lambda _m, _i, o: inputs.append(o)) for b in model.blocks
    ]
    model.eval()
    with torch.no_grad():
        model(idx)
    for h in hooks:
        h.remove()
    model.train()
    log_f = model.gate_log_forget(idx)
    assert log_f.shape == (3, 2, 2, 8) and model.training  # the mode is restored
    for layer, gate in enumerate(model.gates()):
        torch.testing.assert_close(log_f[layer], gate.log_forget(inputs[layer]).detach())
    with pytest.raises(ValueError, match="position='forgetting'"):
        TinyLM(position="alibi", dim=16, depth=1, heads=2, train_len=8).gate_log_forget(idx)
    with pytest.raises(ValueError, match=r"idx must be \[batch, len\]"):
        model.gate_log_forget(idx[0])
