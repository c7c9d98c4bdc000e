"""relbias inside a Hugging Face model: any bias family in every layer, in one call.

A room above the core (the ``hf`` extra: transformers, accelerate); ``import relbias``
never imports it, and nothing in :mod:`relbias.biases`, :mod:`relbias.attention` or
:mod:`relbias.lab` imports it.

- :func:`apply` puts a family into every decoder layer of a transformers causal LM of the
  Llama family (its own bias per layer, or one shared), turns RoPE off unless asked to keep
  it, registers the ``"relbias"`` attention and mask functions and records the choice in
  ``model.config.relbias``;
- :func:`from_pretrained` loads a model saved after :func:`apply`, biases included
  (the ``attn_implementation`` saved with it, :data:`SAVED_ATTN_IMPLEMENTATION`, makes
  transformers' own ``AutoModelForCausalLM.from_pretrained`` refuse it with an error
  naming this function, instead of loading it without its biases);
- :func:`eval_by_length` reads bits per token (or per byte) of any causal LM at several
  lengths, with the context-use measure of :mod:`relbias.lab.context`.

How positions, masks, caches and grouped keys reach the bias: :mod:`relbias.hf._attention`.

Training is HF's: ``transformers.Trainer`` trains a model after :func:`apply` as any other
(:mod:`relbias.hf.train` is a small script on the book's byte corpus). Many processes are
HF's road too: the same script under ``torchrun --nproc_per_node N`` runs DDP (tested here
on the CPU with 2 processes and gloo: the one-process loss curve for the same global
batch), and ``accelerate launch`` gives DDP or FSDP on several GPUs (not tested here: no
GPU). The bias parameters are ordinary parameters of the model, so DDP averages their
gradients and FSDP shards them with the layer that holds them.

The attention is the core's :func:`relbias.biased_attention` at each row's positions,
under HF's boolean mask, with HF's scale and the grouped keys as they come. On the CPU
the core's ``auto`` takes the fused kernel for training and prompts (no ``[q_len, k_len]``
bias), the table path for a decoding step; packed sequences (positions that restart)
take the materialised bias with gradients. With a cache, each row's positions must advance
by one per cache slot (what ``generate`` does, left padding included). The forget gate
serves training and evaluation without a cache.
"""

from relbias.hf._apply import (
    BIAS_ATTRIBUTE,
    FAMILIES,
    SAVED_ATTN_IMPLEMENTATION,
    apply,
    biases,
    from_pretrained,
    register,
    rotary_modules,
)
from relbias.hf._attention import ATTN_IMPLEMENTATION, relbias_attention, relbias_mask
from relbias.hf.evaluation import UNITS, eval_by_length

__all__ = [
    "ATTN_IMPLEMENTATION",
    "BIAS_ATTRIBUTE",
    "FAMILIES",
    "SAVED_ATTN_IMPLEMENTATION",
    "UNITS",
    "apply",
    "biases",
    "eval_by_length",
    "from_pretrained",
    "register",
    "relbias_attention",
    "relbias_mask",
    "rotary_modules",
]
