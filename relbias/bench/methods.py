"""The methods the benchmark compares: their names, notes, and how each one is built.

* ``sdpa``: plain causal ``scaled_dot_product_attention`` with no bias (the floor);
* ``materialize``, ``table``, ``flex``, ``fused``: :func:`relbias.biased_attention`
  with that backend;
* ``xt``, ``hf_t5``: the references of :mod:`relbias.bench.references`.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from relbias import DATA_DEPENDENT_NAMES, alibi_slopes, biased_attention, make_bias
from relbias.attention import fused
from relbias.bench.references import REFERENCES, reference

OUR_METHODS = ("materialize", "table", "flex", "fused")
#: Our methods that never form a [H, n, n] tensor, fastest expected first.
FAST_METHODS = ("fused", "table", "flex")
ALL_METHODS = ("sdpa", *OUR_METHODS, *REFERENCES)
#: Dense methods hold about this many [heads, n, n] float tensors at once (forward).
DENSE_COPIES = {"materialize": 2, "xt": 4, "hf_t5": 3}

METHOD_NOTES = {
    "sdpa": "F.scaled_dot_product_attention(q, k, v, is_causal=True), no bias: the floor",
    "materialize": "relbias.biased_attention(backend='materialize'): [H, n, n] bias + causal "
    "-inf as a 4-D additive mask of scaled_dot_product_attention",
    "table": "relbias.biased_attention(backend='table'): offset-only families read their "
    "O(n) table through a zero-copy strided (Hankel) mask with reversed query rows; causal "
    "attention in tiles of 1024 query rows (the keys before a tile in one call, its causal "
    "triangle in strips of 256 rows, joined by log-sum-exp), blocks of rows below that; FIRE "
    "evaluates its MLP (hidden units that do not switch on [0, 1] folded into one linear "
    "term) per block of rows with a compiled fused kernel",
    "flex": "relbias.biased_attention(backend='flex'): compiled FlexAttention, score_mod "
    "reads the O(n) table (FIRE: computes its MLP per score), causal block mask",
    "fused": "relbias.biased_attention(backend='fused'): relbias's C++ CPU kernel "
    "(relbias/attention/csrc/fused_attention.cpp; float32 arithmetic): "
    f"blocks of {fused.Q_BLOCK} "
    f"query rows x {fused.KV_BLOCK} keys (each thread transposes one head's keys at a time), "
    "scores by oneDNN's brgemm, the bias added in place "
    "(offset-only: a run of the reversed O(n) table; FIRE: its folded MLP per score), online "
    "softmax, no block above the causal diagonal; weights below 2^-64 of their row's largest "
    "dropped (no denormal is formed) and key blocks whose bound lies below that skipped "
    "(blocks_skipped); backward: FlashAttention-2's from the saved log-sum-exp, per head, "
    "the bias's gradient reduced per offset (FIRE: through its MLP per score)",
    "xt": "x-transformers RelativePositionBias / AlibiPositionalBias -> [H, n, n] bias, "
    "applied by x_transformers.attend.Attend(causal=True) (its default einsum path)",
    "hf_t5": "transformers T5Attention(is_decoder=True).compute_bias -> [1, H, n, n] bias, "
    "plus causal -inf, as the mask of scaled_dot_product_attention",
}


#: The width of the layer input the forget gate reads in the benchmark.
GATE_DIM = 64


class GateOnInput(torch.nn.Module):
    """A data-dependent family with a fixed, seeded layer input ``[1, n, dim]`` per length,
    so that the benchmark treats it as it treats the position families:
    :meth:`prepare` gives the prepared bias of a length (the gate's own O(n) work is part of
    every timed call, see :func:`attention_bias`)."""

    def __init__(self, gate, seed: int):
        super().__init__()
        self.gate, self.seed, self._inputs = gate, seed, {}

    def input(self, n: int) -> torch.Tensor:
        if n not in self._inputs:
            gen = torch.Generator().manual_seed(self.seed + n)
            self._inputs[n] = torch.randn(1, n, self.gate.dim, generator=gen)
        return self._inputs[n]

    def prepare(self, n: int):
        return self.gate.prepare(self.input(n))


#: How a family that is not a function of positions alone enters the benchmark.
FAMILY_NOTES = {
    "forgetting": "the forget gate (relbias.ForgettingGate) reads a seeded input [1, n, "
    f"{GATE_DIM}] and is prepared inside every timed call (its O(n) gate and cumulative sum "
    "included); its biases give each head one of ALiBi's slopes as its mean forget rate",
}


def decay_bias_init(heads: int) -> torch.Tensor:
    """Gate biases whose forget rates are ALiBi's slopes: ``log sigmoid(b_h) = -m_h``, i.e.
    ``b_h = -log(exp(m_h) - 1)`` (the reference code's decay-time initialisation with
    decay times ``1 / m_h``), so that the gate forgets on ALiBi's scales, one per head."""
    return -torch.log(torch.expm1(alibi_slopes(heads).double())).float()


def attention_bias(module, q):
    """What :func:`relbias.biased_attention` takes for ``module`` and these queries: the
    module itself, or a forget gate prepared on its input of ``q``'s length."""
    if isinstance(module, GateOnInput):
        return module.prepare(q.shape[2])
    return module


def bias_module(name: str, heads: int, seed: int):
    """A bias module with reproducible, non-trivial parameters.

    The forget gate (``"forgetting"``) comes wrapped in :class:`GateOnInput`, its biases
    from :func:`decay_bias_init` and its weights as the family draws them (std 0.02), so
    that each head forgets at about one of ALiBi's rates, varied a little by the input."""
    torch.manual_seed(seed)
    if name in DATA_DEPENDENT_NAMES:
        gate = make_bias(name, heads, dim=GATE_DIM, bias_init=decay_bias_init(heads))
        return GateOnInput(gate, seed)
    kwargs = {"max_offset": 1024} if name == "offset" else {}
    module = make_bias(name, heads, **kwargs)
    if name in ("offset", "t5"):
        with torch.no_grad():
            module.weight.normal_()
    return module


def runner(method: str, family: str | None, module, heads: int):
    """A callable ``(q, k, v) -> out`` applying ``module`` by ``method`` (causal)."""
    if method == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method in OUR_METHODS:
        return lambda q, k, v: biased_attention(
            q, k, v, attention_bias(module, q), causal=True, backend=method
        )
    return reference(method, family, module, heads)


def applicable(
    method: str, family: str, n: int, heads: int, max_dense_gib: float, backward: bool
) -> str | None:
    """None when the method runs for this family and n, else why not."""
    if method in REFERENCES and family not in REFERENCES[method]:
        return "no reference implementation of this family"
    if backward and method == "flex" and not torch.cuda.is_available():
        return "FlexAttention has no backward on the CPU"
    if method == "fused" and not fused.available():
        return f"the fused kernel could not be built: {fused.unavailable_reason()}"
    copies = DENSE_COPIES.get(method)
    if copies and family == "fire":
        copies += 32 / heads  # FIRE's MLP holds its hidden layer (32 units) for every score
    if copies:
        need = copies * (3 if backward else 1) * heads * n * n * 4 / 2**30
        if need > max_dense_gib:
            return f"needs ~{need:.0f} GiB of dense [H, n, n] tensors (> --max-dense-gib)"
    return None


def inputs(n: int, heads: int, dim: int, dtype, seed: int, grad: bool = False):
    """Seeded ``[q, k, v]``, each ``[1, heads, n, dim]``."""
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(1, heads, n, dim, generator=gen, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    ]
