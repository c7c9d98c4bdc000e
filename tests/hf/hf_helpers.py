"""Tiny Hugging Face models for the tests of relbias.hf, and the reference attention.

Every model is built from a config (no download): hidden size 32, 2 layers, 4 query heads
and 2 key/value heads (grouped-query attention), a vocabulary of 64 tokens.
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

VOCAB = 64
HEADS = 4
KV_HEADS = 2
ARCHITECTURES = {
    "llama": (LlamaConfig, LlamaForCausalLM),
    "qwen2": (Qwen2Config, Qwen2ForCausalLM),
    "mistral": (MistralConfig, MistralForCausalLM),
}
#: Every family with keyword arguments that make each test meaningful: FIRE's threshold L
#: is 3, so that queries past position 3 read their absolute position (a position wrong by
#: a row's padding shows); T5 and the offset bias with few buckets/offsets so that
#: short sequences reach the logarithmic buckets and the clipped offsets.
FAMILY_KWARGS = {
    "offset": {"max_offset": 6},
    "t5": {"num_buckets": 8, "max_distance": 12},
    "alibi": {},
    "sandwich": {"dim": 8},
    "kerple_power": {},
    "kerple_log": {},
    "fire": {"hidden": 8, "L": 3.0},
    "forgetting": {},
}
POSITION_FAMILIES = [f for f in FAMILY_KWARGS if f != "forgetting"]


def tiny_model(arch="llama", **overrides):
    """A tiny causal LM of ``arch`` in eval mode, float32, default (sdpa) attention."""
    config_class, model_class = ARCHITECTURES[arch]
    settings = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=HEADS,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=None,
        tie_word_embeddings=False,
    )
    settings.update(overrides)
    return model_class(config_class(**settings)).eval()


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


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``rows`` left-padded with token 0."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    return ids, mask


def positions_of(mask: torch.Tensor) -> torch.Tensor:
    """The position ids generate() derives from a left-padding mask."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def random_rows(lengths, seed=0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB, (n,), generator=g).tolist() for n in lengths]
