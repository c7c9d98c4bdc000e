"""Chapter 11 (extending a trained RoPE model): the stored retrofit study as tables, one row
per option, every verdict from :mod:`relbias.hf.retrofit_results` put in words.

The figures, the stored base checkpoint and the live retrofit are in
:mod:`relbias.book.retrofit`, which also exposes every table here.
"""

from __future__ import annotations

import re
import statistics
from pathlib import Path

from relbias.book.words import and_list
from relbias.lab import stats

__all__ = [
    "LABELS",
    "LATENCY_GOALS",
    "RANGE_WORDS",
    "curve_table",
    "decision_table",
    "families_in_words",
    "latency_goal",
    "latency_rows",
    "latency_verdicts",
    "paired_table",
    "probe_range_table",
    "probe_table",
    "provenance_rows",
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


def row_of(rows: list[dict], option: str, stage: str = "fine_tuned") -> dict:
    """The reader's row of ``option`` at ``stage``."""
    return next(r for r in rows if r["option"] == option and r["stage"] == stage)


def _signed_number(x: float, digits: int) -> str:
    """``x`` signed with ``digits`` decimals, or with as many more (up to three) as it takes
    not to print a number that is not zero as ``+0.000``: an interval's end that excludes 0
    must not read as if it touched it (smaller still, or zero, keeps ``digits``)."""
    for places in range(digits, digits + 4):
        text = f"{x:+.{places}f}"
        if float(text) != 0:
            return text
    return f"{x:+.{digits}f}"


def _signed(v: dict, digits: int = 2, *, interval: bool = False) -> str:
    """The verdict's mean, signed; with ``interval``, its seed interval after it."""
    ends = (_signed_number(v[k], digits) for k in ("low", "high"))
    seeds = " [{}, {}]".format(*ends) if interval else ""
    return f"{_signed_number(v['mean'], digits)}{seeds}"


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


#: The probe's distance ranges as the tables name them (``m_l`` the training length, the
#: fine-tune's length ``4 m_l``).
RANGE_WORDS = {
    "within": "within m_l",
    "to_fine_tune": "m_l to 4 m_l",
    "past_fine_tune": "past 4 m_l",
}
_LEVEL_WORDS = {"higher": "above", "lower": "below", "at the edge": "at the edge"}


def _probe_cell(probe: dict) -> str:
    """One probe's mean accuracy in each distance range, each against the probe's level:
    "above", "below", "at the edge", or nothing where it cannot be told apart."""
    cells = []
    for name, words in RANGE_WORDS.items():
        if name in probe:
            r = probe[name]
            word = _LEVEL_WORDS.get(r["vs_chance"]["answer"])
            cells.append(
                f"{words}: {statistics.fmean(r['accuracy']):.2f}" + (f" ({word})" if word else "")
            )
    return "; ".join(cells)


def probe_range_table(rows: list[dict], task: str, stage: str = "fine_tuned"):
    """Per option, ``task``'s accuracy in each distance range (mean [seed interval]) with its
    verdicts against the probe's level and, paired on the seed, against the base;
    ``(rows, headers)``."""
    from relbias.lab.stats import interval

    options = list(dict.fromkeys(r["option"] for r in rows))
    names = [n for n in RANGE_WORDS if n in row_of(rows, options[0], stage)["probe"][task]]
    out = []
    for option in options:
        probe = row_of(rows, option, stage)["probe"][task]
        line = [LABELS[option]]
        for name in names:
            r, i = probe[name], interval(probe[name]["accuracy"])
            line.append(
                f"{i['mean']:.2f} [{i['low']:.2f}, {i['high']:.2f}]; "
                f"{r['vs_chance']['answer']}; {r['vs_base']['answer']}"
            )
        out.append(line)
    first = row_of(rows, options[0], stage)["probe"][task]
    headers = [
        f"{RANGE_WORDS[n]} ({_distances(first[n])}): mean [interval]; against the level; "
        "against the base"
        for n in names
    ]
    return out, ["option", *headers]


def _distances(reading: dict) -> str:
    """The distances a range pools, as a header says them."""
    return ", ".join(f"{d:,}" for d in reading["distances"]) + " back"


def _ranges(probe: dict) -> str:
    """Each range of a probe with the distances it pools, for a header."""
    return "; ".join(f"{RANGE_WORDS[n]}: {_distances(r)}" for n, r in probe.items())


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
            _probe_cell(r["probe"]["recall"]),
            _probe_cell(r["probe"]["latest"]),
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
    probe = row_of(rows, options[0], stage)["probe"]
    headers = [
        "option",
        "parameters added" + (f" (total, {layers} layers)" if layers else ""),
        f"bits/byte at m_l = {train_len} tokens"
        + (" after the fine-tune" if stage == "fine_tuned" else "")
        + ", minus the base's [seed interval]",
        f"the loss from {train_len} to {16 * train_len} tokens",
        "bits/byte at 16 m_l, minus RoPE fine-tuned [seed interval]",
        "far tokens at 16 m_l: whole window minus sliding window, bits/token (above 0: worse)",
        f"recall accuracy against chance, 0.1 ({_ranges(probe['recall'])})",
        "'latest' accuracy against 0.5 (above: it tells the newer statement from the older; "
        f"{_ranges(probe['latest'])})",
    ]
    if stage == "fine_tuned":
        headers.append(
            "end of the fine-tune, on its own held-out windows (not the text read in the m_l "
            "column): m_l loss minus the base's; back to it?"
        )
    return out, headers


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


def paired_table(
    rows: list[dict], key: str, stage: str = "fine_tuned", digits: int = 3, *, length=None
):
    """The paired verdict ``key`` of every option (``near_cost``, ``far_vs_control``,
    ``context_use``; with ``length``, ``context_use_at`` at that length): mean difference,
    its interval, the text's error and the answer."""
    out = []
    for option in dict.fromkeys(r["option"] for r in rows):
        v = row_of(rows, option, stage)[key]
        v = v if length is None else v[length]
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
    from relbias.hf.retrofit_results import accuracy_by_distance, seeds_of

    options = ["base", *(o for o in OPTIONS if (o, seeds_of(runs, "base")[0]) in runs)]
    out, distances = [], None
    for option in options:
        by = accuracy_by_distance(runs, option, "zero_shot" if option == "base" else stage, task)
        distances = list(by)
        label = "base (RoPE, as pretrained)" if option == "base" else LABELS[option]
        out.append([label, *(statistics.fmean(a) for a in by.values())])
    return out, ["option", *(f"{d} back" for d in distances)]


def stored_bench(path=None) -> dict:
    """The stored benchmark of :mod:`scripts.hf_bench` (``relbias/hf/results/bench_cpu.json``)."""
    import json

    from relbias.hf.retrofit_study import FOLDER

    path = Path(path) if path is not None else FOLDER.parent / "bench_cpu.json"
    return json.loads(path.read_text())


#: The project's latency goals (issue 45): each measure's time over RoPE's, per family.
LATENCY_GOALS = {"train_step": 1.2, "decode": 1.2, "compiled_decode": 1.1}
#: FIRE's training step, whose MLP does more work.
FIRE_TRAIN_GOAL = 1.5


def latency_goal(family: str, measure: str) -> float:
    """The goal for ``measure`` (a key of :data:`LATENCY_GOALS`) of ``family``."""
    if measure not in LATENCY_GOALS:
        raise ValueError(f"measure must be one of {sorted(LATENCY_GOALS)}, got {measure!r}")
    if (family, measure) == ("fire", "train_step"):
        return FIRE_TRAIN_GOAL
    return LATENCY_GOALS[measure]


#: How the latency passages name a family (the benchmark's keys).
FAMILY_WORDS = {"alibi": "ALiBi", "t5": "T5", "fire": "FIRE", "offset": "the offset bias"}


def families_in_words(families) -> str:
    """Benchmark families in words, in their order: "T5 and Kerple-log"; "none" for none."""
    words = [FAMILY_WORDS.get(f, f.replace("_", "-").capitalize()) for f in families]
    return and_list(words) if words else "none"


def latency_verdicts(bench: dict) -> dict:
    """Per measure, the families whose time over RoPE's is ``"within"`` its goal (the whole
    interval of the median ratio below it, :func:`relbias.lab.stats.median_interval` over the
    repeats: 95 % for independent repeats), ``"over"`` it (the whole interval above) or
    ``"at the edge"`` (the interval holds the goal): ``{measure: {verdict: [families]}}``,
    RoPE left out."""
    out = {m: {"within": [], "over": [], "at the edge": []} for m in LATENCY_GOALS}
    for family, r in bench["results"].items():
        if family == "rope":
            continue
        for measure in LATENCY_GOALS:
            if f"{measure}_ratios" not in r:
                continue
            iv = stats.median_interval(r[f"{measure}_ratios"])
            goal = latency_goal(family, measure)
            word = "within" if iv["high"] < goal else "over" if iv["low"] > goal else "at the edge"
            out[measure][word].append(family)
    return out


def latency_rows(path=None):
    """The stored benchmark of :mod:`scripts.hf_bench` (``relbias/hf/results/bench_cpu.json``):
    per family the training step's, the cached decode's and the compiled decode's time over
    RoPE's, each the median of the per-repeat ratios with its interval from the order
    statistics (:func:`relbias.lab.stats.median_interval`; 95 % for independent repeats);
    and the benchmark's machine and settings."""
    bench = stored_bench(path)

    def cell(r, name):
        iv = stats.median_interval(r[f"{name}_ratios"])
        return f"{r[f'{name}_ratio']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}]"

    out = []
    for family, r in bench["results"].items():
        if family == "rope":
            continue
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
    from relbias.hf.retrofit_study import base_vocab

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
            "copy windows",
            f"{s.get('copy_share', 0.0):.0%} of the windows: a span of the window written again "
            "later in it, at a random distance",
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
