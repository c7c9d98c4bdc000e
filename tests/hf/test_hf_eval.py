"""relbias.hf.eval_by_length: bits by length and context use for any causal LM."""

from __future__ import annotations

import math

import pytest
import torch
from hf_helpers import FAMILY_KWARGS, randomize, tiny_model
from torch.nn import functional as F

import relbias.hf as rh
from relbias.lab.data import spread_eval_windows

TEXT = bytes(range(32, 127)) * 8 + b"def f(x):\n    return x + 1\n" * 20  # 1,300 bytes


def byte_model(family=None):
    """A tiny byte-level Llama (vocab 256), with ``family`` applied, or RoPE."""
    torch.manual_seed(0)
    model = tiny_model(vocab_size=256)
    if family is not None:
        rh.apply(model, family, **FAMILY_KWARGS[family])
        randomize(model)
    return model


def hand_bits(model, ids, length, longest, spans):
    """Mean bits per token over the same windows, computed here."""
    x, y, _ = spread_eval_windows(ids, length, spans * longest, span_len=longest)
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits
    nats = F.cross_entropy(logits.transpose(1, 2), y, reduction="none")
    return nats / math.log(2.0), y


@pytest.mark.parametrize("family", ["alibi", "kerple_log", None])
def test_bits_by_length_equal_a_hand_computation(family):
    model = byte_model(family)
    ids = torch.tensor(list(TEXT))
    out = rh.eval_by_length(model, TEXT, [8, 16, 32], unit="byte", spans=3)
    assert out["unit"] == "byte" and out["window"] == 8 and out["spans"] == 3
    assert [e["length"] for e in out["by_length"]] == [8, 16, 32]
    for entry in out["by_length"]:
        bits, _ = hand_bits(model, ids, entry["length"], 32, 3)
        assert entry["tokens"] == 3 * 32 == entry["bytes"]
        assert entry["bits"] == pytest.approx(float(bits.mean()), abs=1e-6)
    assert out["by_length"][0]["context_use"] is None


def test_context_use_with_a_stride_of_the_window_is_the_short_reading():
    """With ``stride = window`` the sliding reading cuts each long window into windows of
    ``window`` tokens, each read from position 0: on the tokens past ``window`` it is the
    reading at length ``window`` of the same tokens; ``difference`` is long minus that."""
    model = byte_model("t5")
    ids = torch.tensor(list(TEXT))
    out = rh.eval_by_length(model, ids.to(torch.uint8), [8, 32], stride=8, spans=2)
    use = out["by_length"][1]["context_use"]
    long_bits, _ = hand_bits(model, ids, 32, 32, 2)  # [2, 32]
    short_bits, _ = hand_bits(model, ids, 8, 32, 2)  # [8, 8]: the same tokens, 4 per span
    short = short_bits.reshape(2, 32)
    assert use["window"] == 8 and use["bytes"] == 2 * 24
    assert use["long_bpb"] == pytest.approx(float(long_bits[:, 8:].mean()), abs=1e-6)
    assert use["sliding_bpb"] == pytest.approx(float(short[:, 8:].mean()), abs=1e-6)
    assert use["difference"] == pytest.approx(use["long_bpb"] - use["sliding_bpb"], abs=1e-9)


def test_context_use_of_a_callable_is_the_lab_reading():
    """Any ``ids -> logits`` callable; the default stride 1 (every token past the window
    keeps ``window - 1`` tokens of context) gives the lab's own reading of the same spans."""
    from relbias.lab.context import context_use, sliding_loss, span_loss

    model = byte_model("fire")

    def forward(ids):
        return model(input_ids=ids, use_cache=False).logits

    ids = torch.tensor(list(TEXT))
    out = rh.eval_by_length(forward, ids, [8, 24], spans=2)
    x, y, _ = spread_eval_windows(ids, 24, 48, span_len=24)
    with torch.no_grad():
        expected = context_use(span_loss(forward, x, y), sliding_loss(forward, x, y, window=8), 8)
    got = out["by_length"][1]["context_use"]
    assert got.keys() == expected.keys()
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-9), key
    assert out["unit"] == "token" and "bytes" not in out["by_length"][0]


def test_bits_per_byte_of_multi_byte_tokens():
    model = byte_model(None)
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 256, (400,), generator=g)
    token_bytes = torch.randint(1, 4, (256,), generator=g)
    out = rh.eval_by_length(model, ids, [10, 20], unit="byte", spans=2, token_bytes=token_bytes)
    for entry in out["by_length"]:
        bits, y = hand_bits(model, ids, entry["length"], 20, 2)
        assert entry["bytes"] == int(token_bytes[y].sum())
        assert entry["bits"] == pytest.approx(float(bits.sum()) / entry["bytes"], abs=1e-6)


def test_training_mode_is_restored():
    model = byte_model("alibi").train()
    rh.eval_by_length(model, TEXT, [8, 16], spans=1)
    assert model.training


def test_bad_arguments_are_named():
    model = byte_model("alibi")
    with pytest.raises(ValueError, match="unit must be one of"):
        rh.eval_by_length(model, TEXT, [8], unit="char")
    with pytest.raises(ValueError, match="increasing"):
        rh.eval_by_length(model, TEXT, [16, 8])
    with pytest.raises(ValueError, match="divide the longest"):
        rh.eval_by_length(model, TEXT, [8, 12])
    with pytest.raises(ValueError, match="lengths must be an integer >= 2"):
        rh.eval_by_length(model, TEXT, [1, 8])
    with pytest.raises(ValueError, match="needs token_bytes"):
        rh.eval_by_length(model, torch.arange(100), [8], unit="byte")
    with pytest.raises(ValueError, match="1-D integer tensor"):
        rh.eval_by_length(model, torch.rand(100), [8])
    with pytest.raises(TypeError, match="data must be bytes"):
        rh.eval_by_length(model, "text", [8])
    with pytest.raises(ValueError, match="stride"):
        rh.eval_by_length(model, TEXT, [8, 16], stride=9)
    with pytest.raises(ValueError, match="no span of length"):
        rh.eval_by_length(model, TEXT[:20], [8, 32])
