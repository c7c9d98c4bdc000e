"""The setting box at the top of every chapter: which book, which model, which text, which
runs (BOOK_STYLE's first element), computed from the configurations and the stored sweeps.

:func:`setting_box` displays it as MyST (the build renders Markdown outputs as MyST), four
lines in the same layout in every chapter, so that a student who opens any chapter knows
what "the book", "the model" and each number refer to.
"""

from __future__ import annotations

from IPython.display import Markdown
from IPython.display import display as _display

from relbias.book.words import and_list
from relbias.lab.config import Config, get_config
from relbias.lab.data import load_corpus
from relbias.lab.results import describe, load_stored
from relbias.lab.training import build_model

__all__ = [
    "interpolation_words",
    "setting_box",
    "setting_box_with",
    "setting_text",
    "setting_text_with",
]

#: How a stored sweep is named in the box, by kind of :func:`relbias.lab.results.load_stored`.
SWEEP_WORDS = {
    "extrapolation": "the medium sweep",
    "extrapolation_15000": "the medium sweep trained longer",
    "retrieval": "the recall probe",
}


def _model_line(config: Config) -> str:
    params = sum(p.numel() for p in build_model("nope", config).parameters())
    return (
        f"**The model**: TinyLM, a byte-level decoder of {config.depth} layers, width "
        f"{config.dim} and {config.heads} heads of dimension {config.dim // config.heads} "
        f"(about {round(params, -3) // 1000:,} thousand parameters without positions)."
    )


def _text_line(config: Config) -> str:
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    files = corpus.describe(with_files=False)["num_files"]
    return (
        "**The text**: the Python standard library's own source as bytes (nothing is "
        f"downloaded): {corpus.train.numel() / 1e6:.1f} MB of {files['train']} files to train "
        f"on, {corpus.val.numel() / 1e6:.1f} MB of {files['val']} other files held out."
    )


def _sweep_words(kind: str) -> str:
    info = describe(load_stored(kind))
    steps = f"{info['probe_steps']:,}" if "probe_steps" in info else f"{info['steps']:,}"
    return (
        f"{SWEEP_WORDS.get(kind, kind)} ($m_l$ = {info['train_len']} bytes, {steps} steps, "
        f"{info['seeds']} seeds)"
    )


def setting_text(config: Config, findings=("extrapolation_15000",)) -> str:
    """The box as MyST: ``config`` is the live run's configuration, ``findings`` the kinds of
    the stored sweeps the chapter's findings use (:func:`relbias.lab.results.load_stored`)."""
    stored = get_config("medium")
    live = (
        f"**The runs**: the live demo below trains `{config.name}` ($m_l$ = "
        f"{config.train_len} bytes, {config.steps:,} steps, one seed); the findings use "
    )
    kinds = list(findings)
    if not kinds:
        raise ValueError("findings must name at least one stored sweep")
    sweeps = [_sweep_words(k) for k in kinds]
    live += and_list(sweeps)
    lines = [
        "**The book** is Xiao and Zhu's *Foundations of Large Language Models* "
        "{cite:p}`xiao2025foundations`; these pages are a companion to its §2.3.5.",
        _model_line(stored),
        _text_line(stored),
        live + ". {ref}`Chapter 1 <sec-setting>` says more.",
    ]
    body = "\n".join(f"- {line}" for line in lines)
    return f":::{{admonition}} The setting\n:class: note\n\n{body}\n:::\n"


def setting_box(config: Config, findings=("extrapolation_15000",)) -> None:
    """Display :func:`setting_text` (as a Markdown output: MyST in the built book)."""
    _display(Markdown(setting_text(config, findings)))


def interpolation_words(results: dict) -> str:
    """Chapter 7's interpolation experiment (``relbias.lab.interpolation``'s result) in the
    box's words: its training length, steps, seeds and fine-tuning."""
    config, setup = results["provenance"]["config"], results["setup"]
    steps = ", ".join(str(n) for n in setup["finetune_steps"])
    return (
        f"the interpolation experiment ($m_l$ = {config['train_len']} bytes, "
        f"{config['steps']:,} steps, {len(setup['seeds'])} seeds, fine-tuned {steps} steps at "
        f"{setup['finetune_length']} bytes)"
    )


def setting_text_with(config: Config, findings=("extrapolation_15000",), more=()) -> str:
    """:func:`setting_text`, whose findings also use ``more``: stored runs that
    :func:`relbias.lab.results.load_stored` does not name, each already in words (e.g.
    :func:`interpolation_words`), named after the stored sweeps of ``findings``."""
    text = setting_text(config, findings)
    extra = [str(m) for m in more]
    if not extra:
        return text
    # the runs' line, rebuilt with the more runs after the stored sweeps setting_text named
    start = text.index("the findings use ") + len("the findings use ")
    end = text.index(". {ref}`Chapter 1")
    named = [_sweep_words(k) for k in findings] + extra
    return text[:start] + and_list(named) + text[end:]


def setting_box_with(config: Config, findings=("extrapolation_15000",), more=()) -> None:
    """Display :func:`setting_text_with` (as a Markdown output: MyST in the built book)."""
    _display(Markdown(setting_text_with(config, findings, more)))
