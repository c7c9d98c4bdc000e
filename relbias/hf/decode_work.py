"""The work of one cached decoding step, counted, never timed: the one home of the tiny Llama,
the family settings, the greedy decode and the aten-operation count that the decode-work
tests (``tests/hf/test_hf_decode_work.py``) and chapter 11's lab notes both use.

The tiny model: a Llama with hidden size 32, 2 layers, 4 query heads and 2 key/value heads
(grouped-query attention), a vocabulary of 64 tokens, built from a config (no download).
A step's work is the number of aten operations (nested ones included) that the PyTorch
profiler records for one greedy step through a ``DynamicCache``, after two warm-up steps;
a family's ratio is that count over the same model's with RoPE on SDPA.
"""

from __future__ import annotations

import contextlib
import os

import torch

__all__ = [
    "COUNTED_FAMILIES",
    "FAMILY_KWARGS",
    "TINY_LLAMA",
    "greedy_decode",
    "left_padded",
    "operator_ratios",
    "ops_of_one_step",
    "random_rows",
    "tiny_llama",
]

#: The tiny model's settings (a ``LlamaConfig``'s keyword arguments).
TINY_LLAMA = dict(
    vocab_size=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    pad_token_id=0,
    bos_token_id=None,
    eos_token_id=None,
    tie_word_embeddings=False,
)

#: Every family with settings that make a short test meaningful: FIRE's threshold L is 3,
#: so that queries past position 3 read their absolute position (a position wrong by a
#: row's padding shows); T5 and the offset bias with few buckets/offsets, so that short
#: sequences reach the logarithmic buckets and the clipped offsets.
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
#: The families a decoding step is counted for (the forget gate refuses a cache).
COUNTED_FAMILIES = [f for f in FAMILY_KWARGS if f != "forgetting"]


def tiny_llama(seed: int | None = None, **overrides):
    """The tiny Llama in eval mode, float32, SDPA attention; ``seed`` seeds its weights."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if seed is not None:
        torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**{**TINY_LLAMA, **overrides})).eval()


def random_rows(lengths, seed: int = 0, vocab: int = TINY_LLAMA["vocab_size"]) -> list[list[int]]:
    """One row of random token ids (1 .. vocab-1, never the padding id 0) per length."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=g).tolist() for n in lengths]


def left_padded(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and attention mask of ``rows`` left-padded with token 0."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        ids[b, width - len(row) :] = torch.tensor(row)
        mask[b, width - len(row) :] = 1
    return ids, mask


def greedy_decode(model, lengths, steps: int, seed: int = 5):
    """A prompt of random left-padded rows of ``lengths``, then ``steps`` greedy steps
    through a ``DynamicCache`` (positions and mask as ``generate`` builds them); returns the
    logits of every step and a function that runs one more step."""
    from transformers import DynamicCache

    ids, mask = left_padded(random_rows(list(lengths), seed=seed))
    state = {"mask": mask, "pos": (mask.cumsum(-1) - 1).clamp(min=0)}
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=state["pos"], cache=cache)
    state["tok"] = out.logits[:, -1:].argmax(-1)

    def step():
        state["mask"] = torch.cat([state["mask"], torch.ones_like(state["mask"][:, :1])], 1)
        state["pos"] = state["pos"][:, -1:] + 1
        with torch.no_grad():
            logits = model(
                input_ids=state["tok"],
                attention_mask=state["mask"],
                position_ids=state["pos"],
                cache=cache,
            ).logits
        state["tok"] = logits[:, -1:].argmax(-1)
        return logits

    return [step() for _ in range(steps)], step


@contextlib.contextmanager
def _quiet_stderr():
    """The profiler's C++ start/stop lines go to file descriptor 2: hide them."""
    saved = os.dup(2)
    with open(os.devnull, "w") as null:
        os.dup2(null.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)


def ops_of_one_step(model, lengths) -> int:
    """The aten operations (nested ones included) of one decoding step of ``model`` on a
    prompt of left-padded rows of ``lengths``, after two warm-up steps."""
    _, step = greedy_decode(model, lengths, 2)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with _quiet_stderr(), torch.profiler.profile(activities=activities) as prof:
        step()
    return sum(e.name.startswith("aten::") for e in prof.events())


def operator_ratios(rows=((6,), (6, 3)), families=None) -> dict:
    """``{lengths: {family: ratio}}``: one decoding step's aten operations with each family
    (its bias parameters as initialised) over the same tiny Llama's with RoPE, for each
    prompt in ``rows`` (by default one row, and two left-padded rows)."""
    import relbias.hf as rh

    out = {}
    for lengths in rows:
        rope = ops_of_one_step(tiny_llama(seed=0), lengths)
        out[lengths] = {}
        for family in families or COUNTED_FAMILIES:
            model = tiny_llama(seed=0)
            rh.apply(model, family, **FAMILY_KWARGS[family])
            out[lengths][family] = ops_of_one_step(model, lengths) / rope
    return out
