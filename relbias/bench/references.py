"""The reference implementations the benchmark compares against (imported when used).

* ``xt``: x-transformers' ``RelativePositionBias`` (T5) and ``AlibiPositionalBias``
  (ALiBi), applied with its ``Attend`` module (its default, non-flash path);
* ``hf_t5``: HuggingFace's ``T5Attention.compute_bias``, added with the causal mask
  to ``scaled_dot_product_attention``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

#: The families each reference implements.
REFERENCES = {"xt": ("t5", "alibi"), "hf_t5": ("t5",)}


def reference(method: str, family: str, module, heads: int):
    """A callable ``(q, k, v) -> out`` running reference ``method`` with the parameters of
    our bias ``module``; ``run.module`` is the reference's own module."""
    if method == "xt":
        return _x_transformers(family, module, heads)
    if method == "hf_t5":
        return _hf_t5(module, heads)
    raise ValueError(f"unknown reference {method!r}; choose from {', '.join(REFERENCES)}")


def _x_transformers(family: str, module, heads: int):
    from x_transformers.attend import Attend
    from x_transformers.x_transformers import AlibiPositionalBias, RelativePositionBias

    attend = Attend(causal=True)
    if family == "t5":
        rel = RelativePositionBias(
            scale=1.0,
            causal=True,
            num_buckets=module.num_buckets,
            max_distance=module.max_distance,
            heads=heads,
        )
        with torch.no_grad():
            rel.relative_attention_bias.weight.copy_(module.weight.detach().T)
    else:
        rel = AlibiPositionalBias(heads=heads)

    def run(q, k, v):
        bias = rel(q.shape[2], k.shape[2])
        return attend(q, k, v, attn_bias=bias)[0]

    run.module = rel
    return run


def _hf_t5(module, heads: int):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=heads * 64,
        d_kv=64,
        num_heads=heads,
        is_decoder=True,
        relative_attention_num_buckets=module.num_buckets,
        relative_attention_max_distance=module.max_distance,
    )
    t5 = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    with torch.no_grad():
        t5.relative_attention_bias.weight.copy_(module.weight.detach().T)
    masks = {}

    def run(q, k, v):
        n, m = q.shape[2], k.shape[2]
        bias = t5.compute_bias(n, m, device=q.device)
        if n not in masks:
            i = torch.arange(m - n, m, device=q.device)
            masks[n] = torch.arange(m, device=q.device)[None, :] > i[:, None]
        mask = bias.masked_fill(masks[n], float("-inf"))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    run.module = t5
    return run
