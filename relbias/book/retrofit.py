"""Chapter 11 (extending a trained RoPE model): the stored retrofit study as tables and
figures, the stored base checkpoint, and the live retrofit.

The study and its reader live in the hf room (:mod:`relbias.hf.retrofit_study`,
:mod:`relbias.hf.retrofit_results`); this module only draws and tabulates what they give.
"""

from __future__ import annotations

import os
import re
import statistics
import urllib.request
from pathlib import Path

from relbias.book.plots import figure

__all__ = [
    "LABELS",
    "base_path",
    "curve_table",
    "base_vocab",
    "decision_table",
    "latency_rows",
    "live_retrofit",
    "live_table",
    "plot_curves",
    "plot_option",
    "plot_probe",
    "paired_table",
    "plot_recovery",
    "plot_rotations",
    "probe_table",
    "provenance_rows",
    "quick_study",
    "row_of",
    "setting_rows",
    "stored_bench",
    "token_budget",
]

#: How the chapter names each option.
LABELS = {
    "control": "RoPE, unchanged",
    "linear": "linear interpolation",
    "dynamic_ntk": "dynamic NTK",
    "yarn": "YaRN",
    "alibi": "ALiBi (RoPE off)",
    "t5": "T5 (RoPE off)",
    "kerple_log": "Kerple-log (RoPE off)",
    "fire": "FIRE (RoPE off)",
    "yarn+alibi": "YaRN + ALiBi",
}
#: The files of a saved base (``save_pretrained`` of model and tokenizer).
BASE_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
_RAW = "https://raw.githubusercontent.com/relbias/relbias/main/relbias/hf/results/retrofit"


def base_path(seed: int = 0) -> Path:
    """The stored base of ``seed`` (a folder ``from_pretrained`` reads). The checkpoints
    live in the repository, not in the wheel: an install without them fetches the files
    into ``~/.cache/relbias/retrofit``."""
    from relbias.hf.retrofit_study import FOLDER

    path = FOLDER / f"base_seed{seed}"
    if (path / "model.safetensors").is_file():
        return path
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    path = cache / "relbias" / "retrofit" / f"base_seed{seed}"
    path.mkdir(parents=True, exist_ok=True)
    for name in BASE_FILES:
        if not (path / name).is_file():
            urllib.request.urlretrieve(f"{_RAW}/base_seed{seed}/{name}", path / name)
    return path


def row_of(rows: list[dict], option: str, stage: str = "fine_tuned") -> dict:
    """The reader's row of ``option`` at ``stage``."""
    return next(r for r in rows if r["option"] == option and r["stage"] == stage)


def _signed(v: dict, digits: int = 2, *, interval: bool = False) -> str:
    """The verdict's mean, signed; with ``interval``, its seed interval after it."""
    seeds = f" [{v['low']:+.{digits}f}, {v['high']:+.{digits}f}]" if interval else ""
    return f"{v['mean']:+.{digits}f}{seeds}"


def _ordering(v: dict, lower: str, higher: str) -> str:
    return {"lower": lower, "higher": higher}.get(v["answer"], v["answer"])


def _curve_words(curve: dict, bits: dict | None = None) -> str:
    """The whole curve's verdict in words, read whole: where the verdict is "improves"
    ("degrades") but some change the other way separates at the edge, say where the curve
    turns and that it turns back only at the edge (no order claimed there). The lengths named
    here come from the paired verdicts, never from the lowest mean: an "improves" falls as far
    as the last length shown "lower" than the first; a "degrades" rises past the last length
    not shown "higher". A curve that improves, then degrades keeps the verdict function's own
    ``turns_at``, which is the length of its lowest mean (``relbias.lab.stats.curve_verdict``).
    A curve that levels off says by how much it fell (rose) first, in bits per byte."""
    answer = curve["answer"]
    if curve.get("turns_at"):
        answer += f" (at {curve['turns_at']})"
    if answer in ("improves", "degrades") and bits:
        changes = curve["changes"]
        improves = answer == "improves"
        back = [c for c in changes if c["answer"] == "at the edge" and (c["mean"] > 0) == improves]
        if back:
            first = min(c["start"] for c in changes)
            shown = "lower" if improves else "higher"
            from_first = [c for c in changes if c["start"] == first]
            if improves:
                # the fall, as far as a paired verdict shows it
                turn = max((c["end"] for c in from_first if c["answer"] == shown), default=first)
                later = [c["start"] for c in back if c["start"] >= turn]
                rise = min(later) if later else min(c["start"] for c in back)
                where = "it" if rise == turn else f"{rise} tokens"
                return f'improves to {turn} tokens, then higher past {where}, only "at the edge"'
            return f'degrades{_rise_start(changes)}, after a dip only "at the edge"'
    if answer == "degrades" and bits:
        return f"degrades{_rise_start(curve['changes'])}"
    if answer.endswith(", then levels off") and bits and curve.get("levels_from"):
        # how far it fell (rose) before it levelled off, so a tiny change reads as tiny
        first, level = min(bits), curve["levels_from"]
        size = abs(statistics.fmean(bits[level]) - statistics.fmean(bits[first]))
        verb = answer.split(",")[0]
        return f"{verb} by {size:.3f} bits to {level} tokens, then levels off"
    return answer


def _rise_start(changes: list[dict]) -> str:
    """Where a "degrades" curve's rise starts, as far as the paired verdicts show it: at the
    first length shown "higher" than some shorter one, so the rise is stated "past" the
    length just before it (nothing, where that is the first length)."""
    lengths = sorted({c["start"] for c in changes} | {c["end"] for c in changes})
    higher = [c["end"] for c in changes if c["answer"] == "higher"]
    if not higher:
        return ""
    turn = lengths[lengths.index(min(higher)) - 1]
    return "" if turn == lengths[0] else f" past {turn} tokens"


#: The decision table's one vocabulary for a curve: the loss rises (reads worse) or falls.
_PLAIN = (("improves", "falls"), ("degrades", "rises"))


def _plain_curve_words(curve: dict, bits: dict | None = None) -> str:
    """:func:`_curve_words` in the lesson's words: the loss "falls" or "rises" with length."""
    words = _curve_words(curve, bits)
    for old, new in _PLAIN:
        words = words.replace(old, new)
    return words


def _accuracy(v: dict, chance: float) -> str:
    mean = statistics.fmean(v["accuracy"])
    word = {"higher": "above chance", "lower": "below chance"}.get(v["answer"], v["answer"])
    return f"{mean:.2f} ({word})"


def decision_table(
    rows: list[dict], stage: str = "fine_tuned", *, train_len: int, layers: int | None = None
):
    """The decision table at ``stage``: one row per option, ``(rows, headers)``; with
    ``layers``, the parameter column's header says it holds totals over that many layers."""
    options = list(dict.fromkeys(r["option"] for r in rows))
    out = []
    for option in options:
        r = row_of(rows, option, stage)
        line = [
            LABELS[option],
            f"{r['params_added']:,}",
            f"{_signed(r['near_cost'], 3, interval=True)} "
            f"({_ordering(r['near_cost'], 'better', 'worse')})",
            _plain_curve_words(r["curve"], r["bits"]),
            "the reference"
            if option == "control"
            else f"{_signed(r['far_vs_control'], 3, interval=True)} "
            f"({_ordering(r['far_vs_control'], 'better', 'worse')})",
            f"{_signed(r['context_use'], 3, interval=True)} "
            f"({_ordering(r['context_use'], 'uses it', 'reads it worse')})",
        ]
        if stage == "fine_tuned":
            steps = r["recovery_steps"]
            gap = r["final_gap"]
            line.append(
                f"{_signed(gap, 3, interval=True)} ({_ordering(gap, 'below', 'above')}); "
                "back to it: "
                + (
                    "in no seed"
                    if all(s is None for s in steps)
                    else ", ".join("no" if s is None else f"step {s}" for s in steps)
                )
            )
        out.append(line)
    headers = [
        "option",
        "parameters added" + (f" (total, {layers} layers)" if layers else ""),
        f"bits/byte at m_l = {train_len} tokens"
        + (" after the fine-tune" if stage == "fine_tuned" else "")
        + ", minus the base's [seed interval]",
        f"the loss from {train_len} to {16 * train_len} tokens",
        "bits/byte at 16 m_l, minus RoPE fine-tuned [seed interval]",
        "far tokens at 16 m_l: whole window minus sliding window, bits/token (above 0: worse)",
    ]
    if stage == "fine_tuned":
        headers.append(
            "end of the fine-tune, on its own held-out windows (not the text read in the m_l "
            "column): m_l loss minus the base's; back to it?"
        )
    return out, headers


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
    """Recall and 'latest' accuracy against the distance, mean over seeds."""
    from relbias.hf.retrofit_results import LATEST_CHANCE, RECALL_CHANCE, reading, seeds_of

    fig, axes = figure(9, 3.8, ncols=2)
    train_len = runs[("base", seeds_of(runs, "base")[0])]["study"]["train_len"]
    for k, (task, chance) in enumerate((("recall", RECALL_CHANCE), ("latest", LATEST_CHANCE))):
        ax = axes[0, k]
        for option in ["base", *options]:
            seeds = seeds_of(runs, option)
            reads = [
                reading(runs, option, s, "zero_shot" if option == "base" else stage) for s in seeds
            ]
            dist = [x["distance"] for x in reads[0][task]]
            acc = [
                statistics.fmean(r[task][i]["accuracy"] for r in reads) for i in range(len(dist))
            ]
            style = "k--" if option == "base" else "-"
            ax.plot(dist, acc, style, marker="o", label=LABELS.get(option, "base (RoPE)"))
        ax.axhline(chance, color="grey", linewidth=0.8)
        ax.axvline(train_len, color="grey", linestyle=":")
        ax.set_xscale("log", base=2)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("distance of the answer (tokens)")
        ax.set_ylabel("accuracy")
        ax.set_title(task)
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


def _interval_cell(values, digits: int = 3) -> str:
    from relbias.lab.stats import interval

    i = interval(values)
    return f"{i['mean']:.{digits}f} [{i['low']:.{digits}f}, {i['high']:.{digits}f}]"


def curve_table(rows: list[dict], stage: str = "fine_tuned"):
    """Bits per byte at every length, mean and 95 % interval over seeds, with the curve's
    verdict; ``(rows, headers)``."""
    options = list(dict.fromkeys(r["option"] for r in rows))
    first = row_of(rows, options[0], stage)
    lengths = sorted(first["bits"])
    out = []
    for option in options:
        r = row_of(rows, option, stage)
        out.append(
            [
                LABELS[option],
                *(_interval_cell(r["bits"][n]) for n in lengths),
                _curve_words(r["curve"], r["bits"]),
            ]
        )
    return out, ["option", *(f"{n} tokens" for n in lengths), "the whole curve"]


def paired_table(rows: list[dict], key: str, stage: str = "fine_tuned", digits: int = 3):
    """The paired verdict ``key`` of every option (``near_cost``, ``far_vs_control``,
    ``context_use``): mean difference, its interval, the text's error and the answer."""
    out = []
    for option in dict.fromkeys(r["option"] for r in rows):
        v = row_of(rows, option, stage)[key]
        out.append(
            [
                LABELS[option],
                f"{v['mean']:+.{digits}f} [{v['low']:+.{digits}f}, {v['high']:+.{digits}f}]",
                "unknown" if v["error"] is None else f"{v['error']:.{digits}f}",
                v["answer"],
            ]
        )
    return out, ["option", "mean difference [95 % interval]", "text's error", "verdict"]


def probe_table(runs: dict, task: str, stage: str = "fine_tuned"):
    """Accuracy at every distance on ``task`` (``recall`` or ``latest``), mean over seeds,
    for the base and every option at ``stage``; ``(rows, headers)``."""
    from relbias.hf.retrofit import OPTIONS
    from relbias.hf.retrofit_results import reading, seeds_of

    options = ["base", *(o for o in OPTIONS if (o, seeds_of(runs, "base")[0]) in runs)]
    out, distances = [], None
    for option in options:
        seeds = seeds_of(runs, option)
        which = "zero_shot" if option == "base" else stage
        reads = [reading(runs, option, s, which)[task] for s in seeds]
        distances = [x["distance"] for x in reads[0]]
        label = "base (RoPE, as pretrained)" if option == "base" else LABELS[option]
        out.append(
            [
                label,
                *(statistics.fmean(r[i]["accuracy"] for r in reads) for i in range(len(distances))),
            ]
        )
    return out, ["option", *(f"{d} back" for d in distances)]


def stored_bench(path=None) -> dict:
    """The stored benchmark of :mod:`scripts.hf_bench` (``relbias/hf/results/bench_cpu.json``)."""
    import json

    from relbias.hf.retrofit_study import FOLDER

    path = Path(path) if path is not None else FOLDER.parent / "bench_cpu.json"
    return json.loads(path.read_text())


def latency_rows(path=None):
    """The stored benchmark of :mod:`scripts.hf_bench` (``relbias/hf/results/bench_cpu.json``):
    per family the training step's and the cached decode's time over RoPE's (the median of
    the per-repeat ratios, with their range where the file holds them); and the benchmark's
    machine line."""
    bench = stored_bench(path)

    def cell(r, name):
        text = f"{r[f'{name}_ratio']:.2f}"
        spread = r.get(f"{name}_ratios")
        return text + (f" ({min(spread):.2f}-{max(spread):.2f})" if spread else "")

    out = []
    for family, r in bench["results"].items():
        line = [family, cell(r, "train_step"), cell(r, "decode")]
        if "compiled_decode_ratio" in r:
            line.append(cell(r, "compiled_decode"))
        out.append(line)
    headers = ["family", "training step / RoPE's", "cached decode / RoPE's"]
    if any("compiled_decode_ratio" in r for r in bench["results"].values()):
        headers.append("compiled static-cache decode / RoPE's")
    return out, headers, bench["machine"], bench["settings"]


def token_budget(study: dict) -> dict:
    """Tokens of pretraining and of the fine-tune, and the fine-tune's share."""
    pre = study["base_steps"] * study["base_batch"] * study["train_len"]
    fine = study["fine_tune_steps"] * study["fine_tune_batch"] * study["fine_tune_len"]
    return {"pretraining": pre, "fine_tune": fine, "share": fine / pre}


def setting_rows(runs: dict):
    """The study's settings as ``(rows, headers)``: model, data, pretraining, fine-tune,
    readings, seeds."""
    from relbias.hf.retrofit_results import seeds_of

    seeds = seeds_of(runs, "base")
    base = runs[("base", seeds[0])]
    s = base["study"]
    budget = token_budget(s)
    rows = [
        ["model", f"Llama, RoPE (theta 10,000), {base['parameters']:,} parameters"],
        [
            "tokenizer",
            f"byte-level BPE, {s['vocab_size']:,} ids (256 bytes + merges), an end-of-text token "
            f"(the models' vocabulary: {base_vocab(seeds[0]):,}), trained on the training split",
        ],
        ["training length m_l", f"{s['train_len']} tokens"],
        [
            "pretraining",
            f"{s['base_steps']:,} steps x {s['base_batch']} windows of {s['train_len']} tokens = "
            f"{budget['pretraining']:,} tokens, lr {s['base_lr']}, linear decay",
        ],
        [
            "probe items in training",
            f"{s['probe_share']:.0%} of the windows, up to {s['probe_items']} items each "
            "(recall or 'latest', distance uniform within the window)",
        ],
        ["RoPE scaling factor", f"{s['factor']:g} (linear, dynamic NTK, YaRN)"],
        [
            "fine-tune",
            f"{s['fine_tune_steps']} steps x {s['fine_tune_batch']} windows of "
            f"{s['fine_tune_len']} tokens = {budget['fine_tune']:,} tokens "
            f"({budget['share']:.1%} of pretraining), lr {s['fine_tune_lr']}, the same "
            "windows for every option of a seed",
        ],
        [
            "loss at m_l during the fine-tune",
            f"every {s['recovery_every']} steps, {s['recovery_windows']} held-out windows",
        ],
        [
            "reading",
            f"lengths {', '.join(str(n) for n in s['lengths'])} tokens, {s['spans']} spans of "
            f"{s['lengths'][-1]} tokens; sliding window m_l, stride {s['context_stride']}",
        ],
        [
            "probes",
            f"recall at {', '.join(str(d) for d in s['recall_distances'])} back; 'latest' at "
            f"{', '.join(str(d) for d in s['latest_distances'])}; {s['probe_samples']} "
            "sequences each",
        ],
        ["seeds", ", ".join(str(k) for k in seeds)],
    ]
    return rows, ["", "setting"]


def provenance_rows(runs: dict):
    """Where every stored run came from: option, seed, commit, wall time, command (as code;
    the ``--folder`` of the repository's own study folder, the default, left out)."""
    out = []
    for (option, seed), r in sorted(runs.items(), key=lambda kv: (kv[0][0] != "base", kv[0])):
        p = r["provenance"]
        command = re.sub(r" --folder \S*relbias/hf/results/retrofit/?(?=\s|$)", "", p["command"])
        out.append([option, seed, p["commit"][:10], f"{p['wall_s']:,.0f}", f"`{command}`"])
    return out, ["run", "seed", "commit", "seconds", "command"]


def base_vocab(seed: int = 0) -> int:
    """The vocabulary size of the stored base of ``seed`` (its ``config.json``)."""
    import json

    return json.loads((base_path(seed) / "config.json").read_text())["vocab_size"]


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
