"""The fused kernel's bfloat16 accuracy: its output and gradients against float32."""

from __future__ import annotations

import torch

from relbias import biased_attention
from relbias.bench.methods import attention_bias, bias_module, inputs

ACCURACY_METHOD = (
    "For each family at one length: q, k, v drawn in float32 (seeded), the output and the "
    "gradients of q, k, v and of the bias's parameters from out.float().square().mean(), by "
    "the fused kernel in bfloat16 and in float32. 'vs_float32' compares bfloat16 inputs "
    "with the float32 run on the unrounded inputs (the error a bfloat16 user sees); "
    "'same_inputs' with the float32 run on the rounded inputs (the kernel's own error: "
    "its arithmetic is float32's, so only the rounding of its results to bfloat16). Each "
    "figure is the largest absolute difference divided by the largest absolute value of "
    "the float32 result."
)


def _run(q, k, v, module) -> dict:
    q, k, v = (t.detach().requires_grad_(True) for t in (q, k, v))
    module.zero_grad()
    out = biased_attention(q, k, v, attention_bias(module, q), backend="fused")
    out.float().square().mean().backward()
    params = [p.grad for p in module.parameters() if p.grad is not None]
    bias_grad = torch.cat([g.flatten() for g in params]) if params else torch.zeros(0)
    return {
        "output": out.detach(),
        "dq": q.grad,
        "dk": k.grad,
        "dv": v.grad,
        "bias_grad": bias_grad,
    }


def _relative(got: dict, expected: dict) -> dict:
    out = {}
    for name, e in expected.items():
        if e.numel() == 0:
            continue
        e = e.double()
        out[name] = float((got[name].double() - e).abs().max() / e.abs().max().clamp_min(1e-30))
    return out


def bfloat16_accuracy(families, n=1024, heads=8, head_dim=64, seed=0) -> dict:
    """``{family: {"vs_float32": {...}, "same_inputs": {...}}}`` (see ``ACCURACY_METHOD``)."""
    results = {}
    for family in families:
        module = bias_module(family, heads, seed)
        q, k, v = inputs(n, heads, head_dim, torch.float32, seed)
        low = _run(*(t.bfloat16() for t in (q, k, v)), module)
        full = _run(q, k, v, module)
        rounded = _run(*(t.bfloat16().float() for t in (q, k, v)), module)
        results[family] = {
            "vs_float32": _relative(low, full),
            "same_inputs": _relative(low, rounded),
        }
    return {"n": n, "method": ACCURACY_METHOD, "families": results}
