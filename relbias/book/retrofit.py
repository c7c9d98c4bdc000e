"""Chapter 11 (extending a trained RoPE model): the stored retrofit study as tables and
figures, the stored base checkpoint, and the live retrofit.

The study and its reader live in the hf room (:mod:`relbias.hf.retrofit_study`,
:mod:`relbias.hf.retrofit_results`); this module draws what they give, and exposes the
tables of :mod:`relbias.book.retrofit_tables`.
"""

from __future__ import annotations

import statistics

from relbias.book.plots import figure
from relbias.book.retrofit_tables import (
    LABELS,
    LATENCY_GOALS,
    curve_table,
    decision_table,
    families_in_words,
    latency_rows,
    latency_verdicts,
    paired_table,
    probe_range_table,
    probe_table,
    provenance_rows,
    row_of,
    setting_rows,
    stored_bench,
    token_budget,
)
from relbias.hf.retrofit_study import base_path, base_vocab

__all__ = [
    "LABELS",
    "LATENCY_GOALS",
    "base_path",
    "curve_table",
    "base_vocab",
    "decision_table",
    "families_in_words",
    "latency_rows",
    "latency_verdicts",
    "live_retrofit",
    "live_table",
    "plot_curves",
    "plot_option",
    "plot_probe",
    "paired_table",
    "plot_recovery",
    "plot_rotations",
    "probe_range_table",
    "probe_table",
    "provenance_rows",
    "quick_study",
    "row_of",
    "setting_rows",
    "stored_bench",
    "token_budget",
]


def _mean_curve(runs: dict, option: str, stage: str, seeds) -> tuple[list, list]:
    from relbias.hf.retrofit_results import reading

    reads = [reading(runs, option, s, stage) for s in seeds]
    lengths = [e["length"] for e in reads[0]["by_length"]["by_length"]]
    means = [
        statistics.fmean(r["by_length"]["by_length"][i]["bits"] for r in reads)
        for i in range(len(lengths))
    ]
    return lengths, means


def plot_curves(runs: dict, options):
    """Bits per byte against the window length, mean over seeds, for ``options`` before
    (left) and after (right) the fine-tune, with the base (dashed) in both panels."""
    from relbias.hf.retrofit_results import seeds_of

    fig, axes = figure(9.0, 4.2, ncols=2)
    seeds = seeds_of(runs, "base")
    lengths, base = _mean_curve(runs, "base", "zero_shot", seeds)
    for ax, stage, title in zip(
        axes[0],
        ("zero_shot", "fine_tuned"),
        ("applied, before the fine-tune", "after the fine-tune"),
    ):
        # on top (zorder): before the fine-tune, RoPE unchanged is the base and would hide it
        ax.plot(lengths, base, "k--", marker="o", zorder=5, label="base (RoPE, as pretrained)")
        for k, option in enumerate(options):
            lengths, means = _mean_curve(runs, option, stage, seeds_of(runs, option))
            style = "-" if k < 10 else "--"
            ax.plot(lengths, means, style, marker="o", markersize=3, label=LABELS[option])
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(n) for n in lengths])
        ax.set_xlabel("window length (tokens)")
        ax.set_title(title, fontsize=9)
    axes[0, 0].set_ylabel("bits per byte (mean of 3 seeds)")
    axes[0, 1].legend(fontsize=6, ncol=2)
    return fig


def plot_rotations(base, *, factor: float = 4.0, longest: int = 16):
    """Each pair's turns within ``m_l`` (``theta_k m_l / 2 pi``, log scale) in the saved ``base``
    and under each scaling by ``factor`` as HF computes them (:func:`relbias.hf.retrofit.
    rotation_rates`; dynamic NTK read at ``factor`` and ``longest`` times ``m_l``); linear
    interpolation drawn wide, under YaRN, which equals it on the slow pairs."""
    import math

    from relbias.hf.retrofit import load_option, rotation_rates

    fig, ax = figure(6.4, 3.4)
    lines = [
        ("control", 1, "RoPE as pretrained", dict(color="k", ls="--", lw=2)),
        ("linear", 1, "linear interpolation (any length)", dict(color="C1", lw=4, alpha=0.5)),
        ("dynamic_ntk", factor, f"dynamic NTK at {factor:g} $m_l$", dict(color="C2")),
        ("dynamic_ntk", longest, f"dynamic NTK at {longest} $m_l$", dict(color="C2", ls=":")),
        ("yarn", 1, "YaRN (any length)", dict(color="C3")),
    ]
    for option, times, label, style in lines:
        config = load_option(base, option, factor=factor).config
        m_l = config.max_position_embeddings
        rates = rotation_rates(config, length=int(times * m_l))[0] * m_l / (2 * math.pi)
        pairs = list(range(1, len(rates) + 1))
        ax.plot(pairs, rates.tolist(), marker="o", ms=3, label=label, **style)
    ax.axhline(1.0, color="grey", ls=":", lw=1)
    ax.text(len(pairs), 1.2, "one turn within $m_l$", fontsize=7, color="grey", ha="right")
    ax.set_yscale("log")
    ax.set_xticks(pairs)
    ax.set_xlabel("pair $k$ (fastest first)")
    ax.set_ylabel(f"turns within $m_l$ = {m_l} tokens")
    ax.legend(fontsize=7)
    return fig


def plot_recovery(runs: dict, options):
    """The fine-tune's loss at ``m_l`` on held-out windows against its step, minus the base's
    (seed by seed, then the mean over seeds; 0, dashed: the base's loss). The y axis is linear
    up to 0.1 bits and logarithmic above, so that both the bias swaps' start (about a bit
    above) and the gaps of a few hundredths at the end can be read."""
    from matplotlib.ticker import FixedLocator, NullFormatter

    from relbias.hf.retrofit_results import seeds_of

    fig, ax = figure(8.5, 4.0)
    ax.axhline(0.0, color="k", linestyle="--", label="base")
    for option in options:
        seeds = seeds_of(runs, option)
        base = [runs[("base", s)]["held_out_bpb"] for s in seeds]
        curves = [runs[(option, s)]["fine_tune"]["recovery"] for s in seeds]
        steps = [p["step"] for p in curves[0]]
        means = [
            statistics.fmean(c[i]["bpb"] - b for c, b in zip(curves, base))
            for i in range(len(steps))
        ]
        ax.plot(steps, means, marker=".", label=LABELS[option])
    ax.set_yscale("symlog", linthresh=0.1, linscale=2.0)
    ticks = [0.0, 0.025, 0.05, 0.075, 0.1, 0.2, 0.5, 1.0]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_ylim(-0.01, 1.5)
    ax.grid(axis="y", linewidth=0.4, alpha=0.5)
    ax.set_xlabel("fine-tune step")
    ax.set_ylabel("bits per byte at m_l (held out),\nminus the base's")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return fig


def plot_probe(runs: dict, options, *, stage: str = "fine_tuned"):
    """Recall and 'latest' accuracy against the distance, mean over seeds (each seed a faint
    dot; dotted: ``m_l``; dash-dotted: the fine-tune's length)."""
    from relbias.hf.retrofit_results import (
        LATEST_CHANCE,
        RECALL_CHANCE,
        accuracy_by_distance,
        seeds_of,
    )

    fig, axes = figure(9, 3.8, ncols=2)
    study = runs[("base", seeds_of(runs, "base")[0])]["study"]
    for k, (task, chance) in enumerate((("recall", RECALL_CHANCE), ("latest", LATEST_CHANCE))):
        ax = axes[0, k]
        for option in ["base", *options]:
            by = accuracy_by_distance(
                runs, option, "zero_shot" if option == "base" else stage, task
            )
            dist = list(by)
            acc = [statistics.fmean(by[d]) for d in dist]
            style = "k--" if option == "base" else "-"
            (line,) = ax.plot(dist, acc, style, marker="o", label=LABELS.get(option, "base (RoPE)"))
            for seed_acc in zip(*by.values()):  # each seed, faint: the spread behind the mean
                ax.plot(dist, seed_acc, ".", color=line.get_color(), alpha=0.3, markersize=3)
        ax.axhline(chance, color="grey", linewidth=0.8)
        ax.axvline(study["train_len"], color="grey", linestyle=":")
        ax.axvline(study["fine_tune_len"], color="grey", linestyle="-.", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("distance of the answer (tokens)")
        ax.set_ylabel("accuracy")
        ax.set_title({"recall": "recall", "latest": "newer of two ('latest')"}[task])
    axes[0, 0].legend(fontsize=6)
    return fig


def quick_study() -> dict:
    """The study's settings cut for a CPU demo of a few minutes: a short fine-tune and a
    lighter reading (two spans, 16 sequences per distance, lengths to 4 m_l)."""
    from relbias.hf.retrofit_study import STUDY

    study = dict(STUDY)
    study.update(
        fine_tune_steps=20,
        recovery_every=5,
        lengths=[128, 256, 512],
        spans=2,
        recall_distances=[64, 256],
        latest_distances=[64, 256],
        probe_samples=16,
    )
    return study


def live_retrofit(option: str, *, seed: int = 0, study: dict | None = None) -> dict:
    """Retrofit the stored base of ``seed`` with ``option`` in ``study`` (default
    :func:`quick_study`): read zero-shot, fine-tune, read again; the run's record."""
    from relbias.hf.retrofit_study import Data, retrofit_record

    study = quick_study() if study is None else study
    path = base_path(seed)
    data = Data(path.parent, study, tokenizer_dir=path)
    return retrofit_record(path, option, seed, data, study)


def plot_option(runs: dict, option: str):
    """One option's curve before and after the fine-tune, beside the base and the
    fine-tuned control (the explorer's figure)."""
    from relbias.hf.retrofit_results import seeds_of

    fig, ax = figure(6.0, 3.4)
    seeds = seeds_of(runs, "base")
    lengths, base = _mean_curve(runs, "base", "zero_shot", seeds)
    ax.plot(lengths, base, "k--", marker="o", label="base (RoPE, as pretrained)")
    lengths, control = _mean_curve(runs, "control", "fine_tuned", seeds_of(runs, "control"))
    ax.plot(lengths, control, color="grey", marker="o", label="RoPE unchanged, fine-tuned")
    if option != "control":
        for stage, style in (("zero_shot", ":"), ("fine_tuned", "-")):
            lengths, means = _mean_curve(runs, option, stage, seeds_of(runs, option))
            words = "before" if stage == "zero_shot" else "after"
            ax.plot(
                lengths,
                means,
                style,
                color="C1",
                marker="o",
                label=f"{LABELS[option]}, {words} the fine-tune",
            )
    ax.set_xscale("log", base=2)
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_xlabel("window length (tokens)")
    ax.set_ylabel("bits per byte (mean of 3 seeds)")
    ax.set_title(LABELS[option], fontsize=9)
    ax.legend(fontsize=7)
    return fig


def live_table(record: dict):
    """A live run's reading (:func:`live_retrofit`): bits per byte at each length before and
    after its fine-tune, and the loss at ``m_l`` at the start and end of the fine-tune;
    ``(rows, headers)``."""
    lengths = [e["length"] for e in record["fine_tuned"]["by_length"]["by_length"]]
    out = []
    for stage, words in (("zero_shot", "applied"), ("fine_tuned", "fine-tuned")):
        if record[stage] is None:  # the control's zero shot is the base
            continue
        bits = [e["bits"] for e in record[stage]["by_length"]["by_length"]]
        out.append([f"{LABELS[record['option']]}, {words}", *(f"{b:.3f}" for b in bits)])
    return out, ["seed 0, one run", *(f"{n} tokens" for n in lengths)]
