"""Chapter 10: its helpers (relbias.book.hf_chapter: the Llama, the Trainer, the cache check,
the figure and the setting box) and its two pages (the lesson shows its names and checks)."""

from __future__ import annotations

import json
import re
from pathlib import Path

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
    # the right panel starts past the training length: its line would sit on the spine
    assert len(right.get_lines()) == 2 + 1  # two models and the zero line
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


def test_randomise_biases_fills_every_table_away_from_zero():
    for family in ("t5", "kerple_log", "fire"):
        model = rh.apply(hc.small_llama(), family)
        hc.randomise_biases(model, seed=1)
        values = torch.cat([p.detach().flatten() for b in rh.biases(model) for p in b.parameters()])
        assert float(values.min()) >= 0.1 and float(values.max()) < 1.1
        assert len(set(values.tolist())) > 1  # a different number at every entry


# --- the two pages: the lesson shows its names and its checks; the lab notes hold the study ---


BOOK = Path(__file__).resolve().parents[2] / "book"
LESSON = BOOK / "10_bring_your_model.ipynb"
LAB = BOOK / "10_bring_your_model_lab.ipynb"
HIDDEN = {"remove-cell", "remove-input"}


def _cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _src(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _visible_code(path):
    return [
        _src(c)
        for c in _cells(path)
        if c["cell_type"] == "code" and not HIDDEN & set(c.get("metadata", {}).get("tags", []))
    ]


def test_the_lesson_defines_every_name_its_code_uses_where_it_is_seen():
    shown = "\n".join(_visible_code(LESSON))
    for name in ("hc", "STEPS", "BATCH", "TRAIN_LEN", "nb", "rh", "corpus", "llama"):
        assert re.search(
            rf"^(\w+, )*{name}\b.*=|import .* as {name}\b|^def {name}\(", shown, re.M
        ), name
    # the visible settings are the helpers' (the lab notes' setting box reads hc.LIVE)
    cell = next(c for c in _cells(LESSON) if c.get("id") == "ch10-live-run")
    values = dict(re.findall(r"^(TRAIN_LEN) = (\d+)", _src(cell), re.M))
    steps, batch = re.search(r"^STEPS, BATCH = (\d+), (\d+)", _src(cell), re.M).groups()
    assert {"steps": int(steps), "batch_size": int(batch), "seq_len": int(values["TRAIN_LEN"])} == (
        hc.LIVE
    )


def test_the_lesson_shows_the_cache_check_and_the_gates_refusal():
    shown = "\n".join(_visible_code(LESSON))
    assert "cached_logits_gap" in shown and "rh.FAMILIES" in shown and "TOLERANCE" in shown
    assert "use_cache=False" in shown
    lab_shown = "\n".join(_visible_code(LAB))
    assert "randomise_biases" in lab_shown and "cached_logits_gap" in lab_shown


def test_the_answer_box_links_every_verdict_to_a_lab_section():
    lesson_md = [_src(c) for c in _cells(LESSON) if c["cell_type"] == "markdown"]
    box = next(s for s in lesson_md[:3] if "{admonition} The answer" in s)
    rows = [line for line in box.splitlines() if line.startswith("| ") and "---" not in line][1:]
    labels = set(
        re.findall(
            r"^\(([\w-]+)\)=",
            "\n".join(_src(c) for c in _cells(LAB) if c["cell_type"] == "markdown"),
            re.M,
        )
    )
    assert len(rows) == 4
    for row in rows:
        linked = re.findall(r"<(sec-ch10-[\w-]+)>", row)
        assert len(linked) == 2 and set(linked) <= labels, row
    assert "Chapter 11" in lesson_md[0] and "11_extending_a_trained_model" in lesson_md[0]


def test_plot_bias_labels_the_scaled_bias():
    model = rh.apply(hc.small_llama(), "alibi")
    fig = hc.plot_bias({"a": rh.biases(model)[0], "b": rh.biases(model)[1]}, 32, mark=(16,))
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert labels and set(labels) == {hc.SCALED_LABEL}
