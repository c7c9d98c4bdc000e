"""Chapter 10's helpers: a small Llama from its config, HF's Trainer on the book's bytes, a
check of cached generation against a full recompute, and the figure of a reading by length.

Above :mod:`relbias.hf` (the ``hf`` extra); nothing below imports this module.
"""

from __future__ import annotations

import tempfile

import torch
from IPython.display import Markdown
from IPython.display import display as _display

from relbias.book.plots import figure, plot_bias_by_offset
from relbias.hf.train import SMALL_LLAMA, ByteWindows, byte_trainer

__all__ = [
    "LIVE",
    "LLAMA",
    "STORED",
    "SCALED_LABEL",
    "cached_logits_gap",
    "plot_bias",
    "plot_by_length",
    "randomise_biases",
    "setting_box",
    "setting_text",
    "small_llama",
    "train_with_trainer",
]

#: The chapter's small byte-level Llama: the one :func:`relbias.hf.train.build_model` builds.
LLAMA = SMALL_LLAMA

#: The lesson's live runs: Trainer steps, windows per step, the training length m_l in bytes
#: (the lesson shows them as ``STEPS, BATCH, TRAIN_LEN``; its lab notes' setting box reads them).
LIVE = {"steps": 300, "batch_size": 16, "seq_len": 64}

#: The stored TinyLM sweeps whose verdicts the chapter repeats (chapter 8's runs): the text
#: sweep trained 15,000 steps, the one trained 3,000 steps (with the context measure) and the
#: competing recall probe.
STORED = ("extrapolation_15000", "extrapolation", "retrieval")


def small_llama(seed: int = 0):
    """:data:`LLAMA` built from its config (no download), with RoPE, seeded."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(**LLAMA))


def train_with_trainer(model, text, *, steps=300, batch_size=16, seq_len=64, lr=3e-3, seed=0):
    """Train ``model`` with ``transformers.Trainer`` on random windows of the bytes ``text``
    (a 1-D tensor), in one process on the CPU, silently (:func:`relbias.hf.train.byte_trainer`).
    Returns the training losses, one per 50 steps (nats per byte)."""
    data = ByteWindows(text, steps * batch_size, seq_len, seed)
    with tempfile.TemporaryDirectory() as folder:
        trainer = byte_trainer(
            model,
            data,
            folder,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            seed=seed,
            logging_steps=50,
            quiet=True,
        )
        trainer.train()
    model.eval()
    return [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]


@torch.no_grad()
def randomise_biases(model, seed: int = 0):
    """Fill every bias parameter of ``model`` (after :func:`relbias.hf.apply`) with random
    values in [0.1, 1.1), seeded: a table that starts at zero (the offset table, T5's
    buckets) then differs from one entry to the next (T5's offsets in one bucket still share
    an entry), so that a check of the bias's placement cannot pass on zeros. Returns
    ``model``."""
    import relbias.hf as rh

    generator = torch.Generator().manual_seed(seed)
    for bias in rh.biases(model):
        for p in bias.parameters():
            p.copy_(0.1 + torch.rand(p.shape, generator=generator, dtype=p.dtype))
    return model


@torch.no_grad()
def cached_logits_gap(model, prompts: torch.Tensor, new_tokens: int, cache: str) -> float:
    """Greedy ``generate`` of ``new_tokens`` after ``prompts`` ``[rows, n]`` with the cache
    ``cache`` (``"dynamic"`` or ``"static"``): the largest gap between the logits of each
    decoding step and those of one forward pass over the whole generated sequence."""
    out = model.generate(
        prompts,
        attention_mask=torch.ones_like(prompts),
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        cache_implementation=cache,
        pad_token_id=0,
    )
    full = model(input_ids=out.sequences, use_cache=False).logits
    start = prompts.shape[1] - 1
    return max(float((step - full[:, start + t]).abs().max()) for t, step in enumerate(out.logits))


#: The y label of this chapter's bias figures: ``relbias.hf`` adds the bias after HF's
#: 1/sqrt(d) scale, so the number drawn is the book's PE(i, j) divided by sqrt(d).
SCALED_LABEL = "PE(i, j)/√d"


def plot_bias(bias, max_offset: int, **kwargs):
    """:func:`relbias.book.plots.plot_bias_by_offset` with the y axis in the book's notation
    for a bias added after the scale: :data:`SCALED_LABEL` on every panel."""
    fig = plot_bias_by_offset(bias, max_offset, **kwargs)
    for ax in fig.axes:
        if ax.get_ylabel():
            ax.set_ylabel(SCALED_LABEL)
    return fig


def plot_by_length(readings: dict, train_len: int):
    """Two panels from :func:`relbias.hf.eval_by_length` readings (label to reading): bits
    per byte by window length, and the context-use difference (long reading minus a sliding
    window of the training length) at the lengths past it."""
    fig, axes = figure(8.0, 3.0, ncols=2)
    left, right = axes.flat
    for label, reading in readings.items():
        rows = reading["by_length"]
        left.plot([r["length"] for r in rows], [r["bits"] for r in rows], "o-", label=label)
        far = [r for r in rows if r["context_use"] is not None]
        right.plot(
            [r["length"] for r in far],
            [r["context_use"]["difference"] for r in far],
            "o-",
            label=label,
        )
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        lengths = [r["length"] for r in next(iter(readings.values()))["by_length"]]
        ax.set_xticks(lengths, [f"{n:,}" for n in lengths])
        ax.minorticks_off()
        ax.set_xlabel("window length (bytes)")
    # the training length, on the left only: the right panel starts past it
    left.axvline(train_len, color="grey", lw=0.8, ls="--")
    right.axhline(0.0, color="grey", lw=0.8)
    left.set_ylabel("bits per byte")
    right.set_ylabel("long minus sliding (bits per byte)")
    left.set_title("loss by window length", fontsize=9)
    right.set_title(f"context use past {train_len} bytes", fontsize=9)
    left.legend(fontsize=8)
    return fig


def setting_text(config, *, steps: int, seq_len: int, batch_size: int, family: str) -> str:
    """The setting box of chapter 10 as MyST, in the layout of
    :func:`relbias.book.setting.setting_text`: the book, this chapter's Llama, the text (of
    ``config``), and its live runs (no stored sweep)."""
    from relbias.book.setting import _text_line

    heads, kv = LLAMA["num_attention_heads"], LLAMA["num_key_value_heads"]
    params = sum(p.numel() for p in small_llama().parameters())
    lines = [
        "**The book** is Xiao and Zhu's *Foundations of Large Language Models* "
        "{cite:p}`xiao2025foundations`; these pages are a companion to its §2.3.5.",
        f"**The model**: a Hugging Face `LlamaForCausalLM` built from its config, byte-level "
        f"(vocabulary 256), {LLAMA['num_hidden_layers']} layers, hidden size "
        f"{LLAMA['hidden_size']}, {heads} heads of dimension {LLAMA['hidden_size'] // heads} "
        f"sharing {kv} key/value heads (about {round(params, -3) // 1000:,} thousand "
        "parameters), not TinyLM.",
        _text_line(config),
        f"**The runs**: the lesson's live demo trains two models with HF's Trainer, `{family}` "
        "and RoPE, and its T5 exercise a third, the same way "
        f"($m_l$ = {seq_len} bytes, {steps:,} steps of {batch_size} windows, one seed; "
        "its own steps, not the runtime configuration's); no sweep of this Llama is stored. The "
        "verdicts of three seeds are those of the book's TinyLM sweeps ({doc}`Chapter 8 "
        "<08_side_by_side>`). {ref}`Chapter 1 <sec-setting>` says more.",
    ]
    body = "\n".join(f"- {line}" for line in lines)
    return f":::{{admonition}} The setting\n:class: note\n\n{body}\n:::\n"


def setting_box(config, **kwargs) -> None:
    """Display :func:`setting_text` (a Markdown output: MyST in the built book)."""
    _display(Markdown(setting_text(config, **kwargs)))
