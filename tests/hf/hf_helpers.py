"""Tiny Hugging Face models for the tests of relbias.hf, and the reference attention.

Every model is built from a config (no download): :data:`relbias.hf.decode_work.TINY_LLAMA`
(hidden size 32, 2 layers, 4 query heads and 2 key/value heads, a vocabulary of 64 tokens)
for any of three architectures; the family settings are that module's ``FAMILY_KWARGS``.
"""

from __future__ import annotations

import contextlib

import torch
from transformers import (
    AttentionInterface,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
)

import relbias.hf as rh
from relbias import DataDependentBias
from relbias.hf.decode_work import (  # noqa: F401 (the tests import them from here)
    COUNTED_FAMILIES,
    FAMILY_KWARGS,
    TINY_LLAMA,
    left_padded,
    random_rows,
)

VOCAB = TINY_LLAMA["vocab_size"]
HEADS = TINY_LLAMA["num_attention_heads"]
KV_HEADS = TINY_LLAMA["num_key_value_heads"]
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}
POSITION_FAMILIES = COUNTED_FAMILIES


def tiny_model(arch="llama", **overrides):
    """A tiny causal LM of ``arch`` in eval mode, float32, default (sdpa) attention."""
    config_class, model_class = ARCHITECTURES[arch]
    return model_class(config_class(**{**TINY_LLAMA, **overrides})).eval()


@torch.no_grad()
def randomize(model) -> None:
    """Move every bias parameter away from its (often zero) start, inside its constraints."""
    for bias in {id(b): b for b in rh.biases(model)}.values():
        for name, p in bias.named_parameters():
            if name in ("r1", "r2"):
                p.uniform_(0.2, 1.5)
            elif name == "weight" and p.dim() == 2 and p.shape[0] == HEADS:
                p.normal_(0.0, 1.0)  # the offset and T5 tables
            elif name == "c":
                p.fill_(0.7)
            elif name == "L_multiplier":
                p.fill_(1.1)
            else:
                p.normal_(0.0, 0.5)


def biased(family="t5", arch="llama", *, shared=False, keep_rope=False, **overrides):
    """A tiny model with ``family`` applied and its bias parameters randomised."""
    model = tiny_model(arch, **overrides)
    rh.apply(model, family, shared=shared, keep_rope=keep_rope, **FAMILY_KWARGS[family])
    randomize(model)
    return model


def _repeat_kv(x: torch.Tensor, groups: int) -> torch.Tensor:
    return x.repeat_interleave(groups, dim=1)


def reference_attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kw):
    """HF's eager attention with the bias added by hand, for one unpadded sequence per row
    without a cache (queries at 0 .. n-1, keys the same): the core's dense bias
    ``bias(n, n)`` (or the gate's dense bias from the layer input) and a causal mask built
    here, not the mask HF passes."""
    bias = module._relbias_bias
    n = query.shape[2]
    assert key.shape[2] == n, "the reference serves a forward without a cache"
    groups = query.shape[1] // key.shape[1]
    k, v = _repeat_kv(key, groups), _repeat_kv(value, groups)
    scores = torch.matmul(query, k.transpose(2, 3)) * scaling
    if isinstance(bias, DataDependentBias):
        scores = scores + bias(kw["relbias_input"]).to(scores.dtype)
    else:
        scores = scores + bias(n, n)[None].to(scores.dtype)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, v).transpose(1, 2).contiguous(), weights


@contextlib.contextmanager
def reference_implementation():
    """Within this block the ``"relbias"`` attention of every model is the reference."""
    AttentionInterface.register(rh.ATTN_IMPLEMENTATION, reference_attention)
    try:
        yield
    finally:
        AttentionInterface.register(rh.ATTN_IMPLEMENTATION, rh.relbias_attention)


def reference_logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), reference_implementation():
        return model(input_ids=ids).logits


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """The position ids generate() derives from a left-padding mask."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)
