"""Loading a model saved after relbias.hf.apply with transformers' own AutoModelForCausalLM:
refused with an error naming relbias.hf.from_pretrained (with relbias.hf imported or not),
never a model without its biases; relbias.hf.from_pretrained still gives it back exactly,
saved again too, and a plain model saves and loads as before."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hf_helpers import biased, random_rows, tiny_model
from transformers import AutoConfig, AutoModelForCausalLM, LlamaForCausalLM

import relbias.hf as rh

ROOT = Path(__file__).resolve().parents[2]
#: What the error must name: the loader that puts the biases back, and the import it needs.
FIX = ("relbias.hf.from_pretrained", "import relbias.hf")


def ids_of(n=12, batch=2, seed=0):
    return torch.tensor(random_rows([n] * batch, seed=seed))


def logits(model, ids):
    with torch.no_grad():
        return model.eval()(input_ids=ids).logits


def assert_names_the_fix(message: str) -> None:
    for text in FIX:
        assert text in message, f"{text!r} not in the error: {message}"


@pytest.mark.parametrize(
    ("family", "shared", "arch"),
    [("t5", False, "llama"), ("kerple_log", True, "qwen2"), ("forgetting", False, "mistral")],
)
def test_transformers_refuses_a_saved_model_with_relbias_imported(tmp_path, family, shared, arch):
    """relbias.hf is imported here (and "relbias" registered): AutoModelForCausalLM still
    refuses the saved model, before building it, with an error naming the fix; so does a
    model built from its config. relbias.hf.from_pretrained gives the same logits exactly."""
    model = biased(family, arch, shared=shared)
    ids = ids_of()
    before = logits(model, ids)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["attn_implementation"] == rh.SAVED_ATTN_IMPLEMENTATION
    assert saved["relbias"] == model.config.relbias
    with pytest.raises(ValueError, match=r"relbias\.hf\.from_pretrained") as error:
        AutoModelForCausalLM.from_pretrained(tmp_path)
    assert_names_the_fix(str(error.value))
    with pytest.raises(ValueError, match=r"relbias\.hf\.from_pretrained"):
        AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path))
    loaded = rh.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == rh.ATTN_IMPLEMENTATION
    assert torch.equal(logits(loaded, ids), before)


def test_transformers_refuses_a_saved_model_without_relbias(tmp_path):
    """A fresh interpreter that never imports relbias: the load fails, naming the fix."""
    biased("alibi").save_pretrained(tmp_path)
    code = (
        "import sys\n"
        "from transformers import AutoModelForCausalLM\n"
        "try:\n"
        f"    AutoModelForCausalLM.from_pretrained({str(tmp_path)!r})\n"
        "except ValueError as error:\n"
        "    print(error)\n"
        "else:\n"
        "    sys.exit('loaded without an error')\n"
        "assert not any(m.startswith('relbias') for m in sys.modules), 'relbias imported'\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr + done.stdout
    assert_names_the_fix(done.stdout)


def test_a_model_loaded_and_saved_again_keeps_the_guard_and_its_logits(tmp_path):
    model = biased("fire", "qwen2")
    ids = ids_of()
    before = logits(model, ids)
    model.save_pretrained(tmp_path / "first")
    rh.from_pretrained(tmp_path / "first").save_pretrained(tmp_path / "second")
    with pytest.raises(ValueError, match=r"relbias\.hf\.from_pretrained"):
        AutoModelForCausalLM.from_pretrained(tmp_path / "second")
    assert torch.equal(logits(rh.from_pretrained(tmp_path / "second"), ids), before)


def test_a_plain_model_saves_and_loads_with_transformers_as_before(tmp_path):
    """apply on another model built from the same config object leaves this one's config
    (and its config.json) without the guard: transformers loads it, same logits."""
    model = tiny_model()
    rh.apply(type(model)(model.config), "t5")
    ids = ids_of()
    before = logits(model, ids)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert "attn_implementation" not in saved and "relbias" not in saved
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert type(loaded) is LlamaForCausalLM
    assert loaded.config._attn_implementation == "sdpa"
    assert torch.equal(logits(loaded, ids), before)
