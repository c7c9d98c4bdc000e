"""Positions per row: left padding, packed sequences, and generate() under the dynamic cache,
a static cache, a sliding window and beam search, each against a full recompute."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import (
    FAMILY_KWARGS,
    POSITION_FAMILIES,
    biased,
    left_padded,
    positions_of,
    random_rows,
)

#: Every position family under generate (the task asks T5, Kerple and FIRE at least).
GENERATE_FAMILIES = POSITION_FAMILIES
NEW = 6


def full_logits(model, sequences, mask):
    """The logits of a forward on the whole sequences (no cache), positions as generate's."""
    with torch.no_grad():
        return model(
            input_ids=sequences,
            attention_mask=mask,
            position_ids=positions_of(mask),
            use_cache=False,
        ).logits


@pytest.mark.parametrize("family", list(FAMILY_KWARGS))
def test_left_padded_rows_equal_the_rows_alone(family):
    """A left-padded batch gives each row the logits it has alone, unpadded: the mask HF
    builds is applied, and the bias reads each row's own positions (FIRE's absolute ones)."""
    model = biased(family)
    rows = random_rows([9, 4, 6], seed=1)
    ids, mask = left_padded(rows)
    with torch.no_grad():
        batch = model(
            input_ids=ids, attention_mask=mask, position_ids=positions_of(mask), use_cache=False
        ).logits
        for b, row in enumerate(rows):
            alone = model(input_ids=torch.tensor([row]), use_cache=False).logits[0]
            torch.testing.assert_close(batch[b, -len(row) :], alone, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", POSITION_FAMILIES)
def test_packed_sequences_equal_the_sequences_alone(family):
    """Two documents in one row, position_ids restarting at 0 (no attention mask): HF's
    packed-sequence mask keeps them apart, and each reads its own positions."""
    model = biased(family)
    first, second = random_rows([7, 5], seed=2)
    ids = torch.tensor([first + second])
    pos = torch.tensor([list(range(7)) + list(range(5))])
    with torch.no_grad():
        packed = model(input_ids=ids, position_ids=pos, use_cache=False).logits[0]
        a = model(input_ids=torch.tensor([first]), use_cache=False).logits[0]
        b = model(input_ids=torch.tensor([second]), use_cache=False).logits[0]
    torch.testing.assert_close(packed[:7], a, rtol=0, atol=1e-5)
    torch.testing.assert_close(packed[7:], b, rtol=0, atol=1e-5)


def _check_steps(model, prompt_ids, prompt_mask, out, beams=1):
    """Every generated step's logits equal a full recompute of the sequence it extended."""
    sequences = out.sequences
    width = prompt_ids.shape[1]
    mask = torch.cat(
        [
            prompt_mask.repeat_interleave(sequences.shape[0] // prompt_ids.shape[0], 0),
            torch.ones(sequences.shape[0], sequences.shape[1] - width, dtype=prompt_mask.dtype),
        ],
        1,
    )
    full = full_logits(model, sequences, mask)
    steps = len(out.logits)
    assert steps == NEW
    for t in range(steps):
        if beams == 1:
            got = out.logits[t]
        else:
            got = out.logits[t][out.beam_indices[:, t]]  # the beam each final sequence came from
        torch.testing.assert_close(got, full[:, width - 1 + t], rtol=0, atol=1e-5)


def generate_and_check(model, rows, seed, **generate_kwargs):
    """Generate NEW tokens greedily after the left-padded ``rows`` and check every step
    against a full recompute (:func:`_check_steps`)."""
    ids, mask = left_padded(random_rows(rows, seed=seed))
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=mask,
            max_new_tokens=NEW,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            **generate_kwargs,
        )
    _check_steps(model, ids, mask, out, beams=generate_kwargs.get("num_beams", 1))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", GENERATE_FAMILIES)
def test_generate_equals_a_full_recompute(family, cache):
    """Greedy decoding of a left-padded batch: with a static cache the queries do not sit
    at k_len - q_len (the keys are the whole preallocated cache)."""
    model = biased(family)
    generate_and_check(model, [5, 2, 3], 3, cache_implementation=cache)


@pytest.mark.parametrize("family", ["t5", "kerple_power", "kerple_log", "fire", "alibi"])
def test_beam_search_equals_a_full_recompute(family):
    model = biased(family)
    generate_and_check(model, [5, 3], 4, num_beams=3, num_return_sequences=3)


@pytest.mark.parametrize("arch", ["qwen2", "mistral"])
@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_generate_on_other_architectures(arch, cache):
    model = biased("fire", arch)
    generate_and_check(model, [4, 2], 5, cache_implementation=cache)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["t5", "fire"])
def test_sliding_window_cache_keeps_the_key_positions(family, cache):
    """Mistral with a 4-token window: the sliding cache drops old keys, so key slot 0 is no
    longer position 0 (the layer's key offset); decoding past the window stays exact."""
    model = biased(family, "mistral", sliding_window=4)
    generate_and_check(model, [6, 3], 6, cache_implementation=cache)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_layers_with_and_without_a_window_in_one_model(cache):
    """Qwen2 with its first layer full and the second one windowed (4 tokens): each layer
    reads its own key offset from the cache in the same forward."""
    model = biased(
        "kerple_log", "qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=1
    )
    assert model.config.layer_types == ["full_attention", "sliding_attention"]
    generate_and_check(model, [6, 3], 9, cache_implementation=cache)


@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["t5", "fire"])
def test_a_prompt_read_in_chunks_through_a_cache_equals_one_forward(family, cache):
    """Chunked prefill: the second chunk's queries start at slot 4 of the cache (not at
    k_len - q_len for the static cache); a left-padded row's first chunk is all padding."""
    from transformers import DynamicCache, StaticCache

    model = biased(family)
    ids, mask = left_padded(random_rows([9, 5], seed=10))
    pos = positions_of(mask)
    if cache == "dynamic":
        kv = DynamicCache(config=model.config)
    else:
        kv = StaticCache(config=model.config, max_cache_len=12)
    with torch.no_grad():
        first = model(
            input_ids=ids[:, :4],
            attention_mask=mask[:, :4],
            position_ids=pos[:, :4],
            cache=kv,
            use_cache=True,
        ).logits
        second = model(
            input_ids=ids[:, 4:],
            attention_mask=mask,
            position_ids=pos[:, 4:],
            cache=kv,
            use_cache=True,
        ).logits
    got = torch.cat([first, second], 1)
    expected = full_logits(model, ids, mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], expected[real], rtol=0, atol=1e-5)
