"""Chapter 10's helpers (relbias.book.hf_chapter): the Llama, the Trainer, the cache check,
the figure and the setting box."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

import torch  # noqa: E402

import relbias.hf as rh  # noqa: E402
from relbias.book import hf_chapter as hc  # noqa: E402
from relbias.hf.train import build_model  # noqa: E402
from relbias.lab.config import get_config  # noqa: E402


def test_the_chapters_llama_is_the_training_scripts():
    ours, script = hc.small_llama(), build_model(None)
    assert {k: getattr(ours.config, k) for k in hc.LLAMA} == hc.LLAMA
    assert {k: getattr(script.config, k) for k in hc.LLAMA} == hc.LLAMA
    for (a, p), (b, q) in zip(ours.named_parameters(), script.named_parameters()):
        assert a == b and torch.equal(p, q)


def test_train_with_trainer_is_silent_and_learns(capsys):
    model = hc.small_llama()
    rh.apply(model, "alibi")
    text = torch.tensor(list(b"def f(x):\n    return x + 1\n" * 40), dtype=torch.uint8)
    losses = hc.train_with_trainer(model, text, steps=100, batch_size=4, seq_len=16)
    out = capsys.readouterr()
    assert out.out == "" and out.err == ""
    assert len(losses) == 2 and losses[-1] < losses[0]
    assert not model.training


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_cached_logits_gap_is_float_rounding(cache):
    model = hc.small_llama().eval()
    rh.apply(model, "kerple_log")
    prompts = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(0))
    assert hc.cached_logits_gap(model, prompts, 5, cache) < 1e-4


def test_plot_by_length_draws_both_panels():
    reading = {
        "by_length": [
            {"length": 8, "bits": 3.0, "context_use": None},
            {"length": 32, "bits": 3.1, "context_use": {"difference": 0.2}},
        ]
    }
    fig = hc.plot_by_length({"a": reading, "b": reading}, 8)
    left, right = fig.axes
    assert len(left.get_lines()) == 2 + 1  # two models and the training length
    assert [t.get_text() for t in left.get_xticklabels()] == ["8", "32"]
    assert right.get_ylabel().startswith("long minus sliding")


def test_setting_text_has_the_books_four_lines():
    text = hc.setting_text(
        get_config("quick"), steps=300, seq_len=64, batch_size=16, family="kerple_log"
    )
    lines = [line for line in text.splitlines() if line.startswith("- **")]
    assert [line.split("**")[1] for line in lines] == [
        "The book",
        "The model",
        "The text",
        "The runs",
    ]
    assert "hidden size 64" in text and "4 heads of dimension 16" in text
    assert "300 steps of 16 windows" in text and "sec-setting" in text
