"""relbias.hf.apply: exact logits for every family on Llama, Qwen2 and Mistral, gradients,
the save/load round trip, the clear errors, and the room's place above the core."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_helpers import (
    ARCHITECTURES,
    FAMILY_KWARGS,
    POSITION_FAMILIES,
    VOCAB,
    biased,
    random_rows,
    reference_logits,
    tiny_model,
)
from torch import nn
from transformers import PreTrainedConfig, PreTrainedModel

import relbias
import relbias.hf as rh

ROOT = Path(__file__).resolve().parents[2]


def ids_of(n=12, batch=2, seed=0):
    return torch.tensor(random_rows([n] * batch, seed=seed))


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
@pytest.mark.parametrize("family", list(FAMILY_KWARGS))
def test_logits_equal_eager_attention_with_the_bias_added(arch, family):
    model = biased(family, arch)
    ids = ids_of()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, reference_logits(model, ids), rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ["t5", "kerple_log", "fire"])
def test_shared_bias_is_one_module_and_exact(family):
    model = biased(family, shared=True)
    found = rh.biases(model)
    assert all(b is found[0] for b in found)
    assert sum(".relbias." in f".{k}" for k in model.state_dict()) == len(
        list(found[0].state_dict())
    )
    ids = ids_of()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, reference_logits(model, ids), rtol=0, atol=1e-5)


def test_own_bias_per_layer_by_default():
    model = biased("t5")
    first, second = rh.biases(model)
    assert first is not second
    assert not torch.equal(first.weight, second.weight)  # randomised independently


def test_rope_is_off_by_default_and_kept_on_request():
    """RoPE off: the logits do not change when every position moves by the same amount
    (a relative bias sees only offsets; FIRE is excluded, it reads absolute positions).
    keep_rope=True: RoPE stays applied (the reference sees it too) and the model differs."""
    torch.manual_seed(0)
    off = biased("t5")
    ids = ids_of()
    pos = torch.arange(ids.shape[1])[None].expand(2, -1)
    with torch.no_grad():
        a = off(input_ids=ids, position_ids=pos).logits
        b = off(input_ids=ids, position_ids=pos + 7).logits
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    torch.manual_seed(0)
    kept = biased("t5", keep_rope=True)
    kept.load_state_dict(off.state_dict())
    with torch.no_grad():
        c = kept(input_ids=ids).logits
    torch.testing.assert_close(c, reference_logits(kept, ids), rtol=0, atol=1e-5)
    assert (c - a).abs().max() > 1e-3
    assert kept.config.relbias["keep_rope"] is True


def test_config_records_the_choice():
    model = biased("offset", shared=True)
    assert model.config._attn_implementation == rh.ATTN_IMPLEMENTATION
    assert model.config.relbias == {
        "family": "offset",
        "shared": True,
        "keep_rope": False,
        "bias_kwargs": {"max_offset": 6},
    }


def test_a_config_shared_with_another_model_is_left_alone():
    """Two models built from one config object share it; apply changes only its own model."""
    first = tiny_model()
    config = first.config
    second = type(first)(config).eval()
    ids = ids_of()
    with torch.no_grad():
        before = second(ids).logits
    rh.apply(first, "alibi")
    assert second.config is config and config._attn_implementation != rh.ATTN_IMPLEMENTATION
    assert not hasattr(config, "relbias")
    assert all(m.config is first.config for m in first.modules() if hasattr(m, "config"))
    with torch.no_grad():
        assert torch.equal(second(ids).logits, before)
        assert torch.allclose(first(ids).logits, reference_logits(first, ids), atol=1e-5)


@pytest.mark.parametrize("family", list(FAMILY_KWARGS))
def test_gradients_reach_every_bias_parameter(family):
    model = biased(family)
    model.train()
    ids = ids_of(n=10)
    out = model(input_ids=ids, labels=ids)
    out.loss.backward()
    for layer, bias in enumerate(rh.biases(model)):
        for name, p in bias.named_parameters():
            assert p.grad is not None, f"layer {layer} {name}: no gradient"
            assert torch.isfinite(p.grad).all()
            assert p.grad.abs().sum() > 0, f"layer {layer} {name}: zero gradient"


@pytest.mark.parametrize(
    ("family", "shared", "arch"),
    [(f, False, "llama") for f in FAMILY_KWARGS]
    + [("t5", True, "qwen2"), ("fire", True, "mistral"), ("kerple_power", False, "qwen2")],
)
def test_save_and_from_pretrained_give_the_same_logits_exactly(tmp_path, family, shared, arch):
    model = biased(family, arch, shared=shared)
    ids = ids_of()
    with torch.no_grad():
        before = model(input_ids=ids).logits
    model.save_pretrained(tmp_path)
    loaded = rh.from_pretrained(tmp_path)
    assert type(loaded) is type(model)
    assert loaded.config.relbias == model.config.relbias
    assert loaded.config._attn_implementation == rh.ATTN_IMPLEMENTATION
    for a, b in zip(rh.biases(model), rh.biases(loaded)):
        for (na, pa), (nb, pb) in zip(a.state_dict().items(), b.state_dict().items()):
            assert na == nb and torch.equal(pa, pb)
    with torch.no_grad():
        after = loaded.eval()(input_ids=ids).logits
    assert torch.equal(before, after)


def test_from_pretrained_of_a_plain_model_says_so(tmp_path):
    tiny_model().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="no relbias model"):
        rh.from_pretrained(tmp_path)
    with pytest.raises(FileNotFoundError, match="local directory"):
        rh.from_pretrained(tmp_path / "absent")


def test_unknown_family_is_refused():
    with pytest.raises(ValueError, match=r"family must be one of \['offset', 't5'"):
        rh.apply(tiny_model(), "rope")


def test_arguments_that_do_not_fit_the_family_are_named():
    with pytest.raises(TypeError, match="do not fit family 'offset'"):
        rh.apply(tiny_model(), "offset")  # max_offset is required
    with pytest.raises(TypeError, match="do not fit family 't5'"):
        rh.apply(tiny_model(), "t5", slope=2)
    with pytest.raises(TypeError, match="shared must be True or False"):
        rh.apply(tiny_model(), "t5", shared="yes")
    with pytest.raises(TypeError, match="JSON values"):
        rh.apply(tiny_model(), "kerple_log", r1_init=torch.tensor(0.5))


def test_flash_attention_is_refused_by_name():
    model = tiny_model()
    model.config._attn_implementation_internal = "flash_attention_2"
    with pytest.raises(ValueError, match="'flash_attention_2' is a flash-attention kernel"):
        rh.apply(model, "alibi")


def test_switching_the_implementation_after_apply_is_an_error():
    model = biased("alibi")
    model.set_attn_implementation("sdpa")
    with pytest.raises(RuntimeError, match="attn_implementation is now 'sdpa'"):
        model(input_ids=ids_of())
    model.set_attn_implementation(rh.ATTN_IMPLEMENTATION)
    model(input_ids=ids_of())


def test_applying_twice_is_refused():
    model = biased("alibi")
    with pytest.raises(ValueError, match="already carries relbias biases"):
        rh.apply(model, "t5")


def test_forget_gate_under_a_cache_is_refused():
    model = biased("forgetting")
    ids = ids_of(n=5)
    with torch.no_grad():
        model(input_ids=ids, use_cache=False)
        first = model(input_ids=ids, use_cache=True)  # a cache that held nothing: exact
        with pytest.raises(ValueError, match="'forgetting'.*cannot decode with a cache"):
            model(input_ids=ids[:, :1], cache=first.past_key_values, use_cache=True)
        with pytest.raises(ValueError, match="cannot decode with a cache"):
            model.generate(ids, max_new_tokens=2, do_sample=False)
        out = model.generate(ids, max_new_tokens=2, do_sample=False, use_cache=False)
    assert out.shape == (2, 7)


class _OwnConfig(PreTrainedConfig):
    model_type = "relbias_test_own_attention"

    def __init__(self, num_attention_heads=2, hidden_size=8, **kwargs):
        self.num_attention_heads = num_attention_heads
        self.hidden_size = hidden_size
        super().__init__(**kwargs)


class OwnAttention(nn.Module):
    """Attention computed in the module itself: no interface to put a bias through."""

    def forward(self, x):
        return torch.softmax(x @ x.transpose(1, 2), -1) @ x


class _OwnModel(PreTrainedModel):
    config_class = _OwnConfig

    def __init__(self, config):
        super().__init__(config)
        self.attn = OwnAttention()
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)


def test_a_model_whose_attention_skips_the_interface_is_refused():
    with pytest.raises(ValueError, match="_OwnModel's attention does not go through"):
        rh.apply(_OwnModel(_OwnConfig()), "alibi")
    with pytest.raises(TypeError, match="PreTrainedModel"):
        rh.apply(nn.Linear(2, 2), "alibi")


def test_import_relbias_does_not_import_transformers():
    code = (
        "import sys, relbias, relbias.biases, relbias.attention\n"
        "assert 'transformers' not in sys.modules, 'transformers imported'\n"
        "assert 'relbias.hf' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_nothing_below_imports_the_room():
    for part in ("biases", "attention", "lab"):
        for path in (ROOT / "relbias" / part).rglob("*.py"):
            text = path.read_text()
            assert "relbias.hf" not in text and "from relbias import hf" not in text, path


def test_vocab_and_heads_of_the_helpers():
    """The helpers' models use grouped-query attention (fewer key heads than query heads)."""
    model = tiny_model()
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert model.config.vocab_size == VOCAB
    assert relbias.BIAS_NAMES == tuple(POSITION_FAMILIES)


@pytest.mark.parametrize("family", ["t5", "fire"])
def test_the_scaling_hf_passes_is_the_one_used(family):
    """A layer whose ``scaling`` is not 1/sqrt(head_dim) (Gemma2 sets its own; here a large
    one, so that it shows in a tiny model): the scores are scaled by it, as in the reference."""
    model = biased(family)
    for layer in model.model.layers:
        layer.self_attn.scaling = 8.0
    ids = ids_of()
    with torch.no_grad():
        got = model(input_ids=ids).logits
    torch.testing.assert_close(got, reference_logits(model, ids), rtol=0, atol=1e-5)
    for layer in model.model.layers:
        layer.self_attn.scaling = layer.self_attn.head_dim**-0.5
    with torch.no_grad():
        default = model(input_ids=ids).logits
    assert (default - got).abs().max() > 1e-3
