"""Chapter 2's readings of the learned offset table (one bias per offset, clipped).

- :func:`stored_table`: one stored seed's learned table, read back at the end of training
  (the records' ``learned_bias``: the library's number, PE(i, j)/sqrt(d), per head, offsets
  0 to 2 m_l - 1);
- :func:`plot_stored_tables`: those tables for several training budgets, one panel each, on
  one y scale, labelled in the book's notation;
- :func:`plot_stored_seeds`: one stored sweep's tables, one panel per seed;
- :func:`edge_rows`: the clipped edge against the table's minimum and largest value, over
  every head of every seed, for each budget;
- :func:`context_rows`: the context-use measure of a sweep that records it, per method;
- :func:`provenance_rows`: the stored sweeps a page reads, their files and commits;
- :func:`lab_setting_box`: the setting box for the lab notes (whose live demo is on the
  lesson's page).
"""

from __future__ import annotations

from fractions import Fraction

import torch
from IPython.display import Markdown
from IPython.display import display as _display

from relbias.book.plots import plot_bias_by_offset
from relbias.book.setting import setting_text_with
from relbias.book.sweeps import show_interval
from relbias.lab import readback, readings

__all__ = [
    "Y_LABEL",
    "answer_key",
    "context_rows",
    "edge_rows",
    "lab_setting_box",
    "plot_stored_seeds",
    "plot_stored_tables",
    "provenance_rows",
    "stored_table",
]

#: The y label of a figure that shows the library's number (the bias after the scaling).
Y_LABEL = "PE(i, j)/√d (the library's number)"


def stored_table(results: dict, method: str = "offset", seed: int | str = 0) -> torch.Tensor:
    """``[heads, offsets]``: ``method``'s learned table of seed ``seed`` as the record read
    it back after training (offsets 0 onwards; the library's number, PE(i, j)/sqrt(d))."""
    record = results["methods"][method]["seeds"][str(seed)]
    return torch.tensor(record["learned_bias"]["values"])


def plot_stored_tables(
    runs: dict, method: str = "offset", seed: int | str = 0, *, width=3.6, height=2.9
):
    """``runs`` is ``{title: results}``: one panel per entry with ``method``'s learned table
    of ``seed`` (one line per head), on one y scale, a dashed line at the last trained
    offset m_l - 1 (every farther offset reads its value). Returns the Figure."""
    tables = {title: stored_table(r, method, seed) for title, r in runs.items()}
    return _plot_tables(tables, _train_len(runs.values()), width=width, height=height)


def plot_stored_seeds(results: dict, method: str = "offset", seeds=None, *, width=3.2, height=2.9):
    """One panel per seed of ``results`` (all, or ``seeds``): ``method``'s learned table of
    that seed, as :func:`plot_stored_tables` draws it. Returns the Figure."""
    held = sorted(results["methods"][method]["seeds"], key=int)
    seeds = held if seeds is None else [str(s) for s in seeds]
    tables = {f"seed {s}": stored_table(results, method, s) for s in seeds}
    return _plot_tables(tables, _train_len([results]), width=width, height=height)


def _train_len(runs) -> int:
    train_lens = {r["provenance"]["config"]["train_len"] for r in runs}
    if len(train_lens) != 1:
        raise ValueError(f"runs must share one training length, got {sorted(train_lens)}")
    return train_lens.pop()


def _plot_tables(tables: dict, train_len: int, *, width: float, height: float):
    low = min(float(t.min()) for t in tables.values())
    high = max(float(t.max()) for t in tables.values())
    pad = 0.05 * (high - low)
    fig = plot_bias_by_offset(
        tables,
        mark=[train_len - 1],
        ylim=(low - pad, high + pad),
        width=width,
        height=height,
        ncols=len(tables),
    )
    for ax in fig.axes:
        if ax.lines:
            ax.set_ylabel(Y_LABEL, fontsize=8)
            ax.set_xlabel("offset i - j (bytes)")
    return fig


def edge_rows(runs: dict, method: str = "offset", *, digits: int = 1):
    """Rows and headers of a table, one row per entry of ``runs`` (``{label: results}``):
    how far the clipped edge u_{m_l-1} sits above the table's minimum and below its largest
    value (ranges over every head of every seed: read-back values, the library's number),
    and in how many heads it lies above the minimum
    (:func:`relbias.lab.readback.edge_above_min`)."""
    rows = []
    for label, results in runs.items():
        e = readback.edge_above_min(results, method)
        low, high = e["below_max"]
        rows.append(
            [
                label,
                f"{e['least']:.{digits}f} to {e['most']:.{digits}f}",
                f"{-high:.{digits}f} to {-low:.{digits}f}",
                f"{e['above']} of {e['heads']}",
            ]
        )
    headers = [
        "trained",
        "edge above the minimum",
        "edge below the largest value",
        "heads with the edge above the minimum",
    ]
    return rows, headers


def context_rows(results: dict, methods, *, digits: int = 2):
    """Rows and headers: per method, the bytes past m_l read in the whole window (``long``)
    and by the sliding window of m_l bytes, their per-seed difference (mean [95 % interval])
    and its verdict in the book's words (:func:`relbias.lab.readings.context_verdict`)."""
    rows = []
    for m in methods:
        v = readings.context_verdict(results, m)
        rows.append(
            [
                m,
                show_interval(v["long"], digits),
                show_interval(v["sliding"], digits),
                show_interval(v, digits),
                v["words"],
            ]
        )
    headers = ["method", "whole window", "sliding window", "whole - sliding", "verdict"]
    return rows, headers


def ablation_words(kind: str = "offset") -> str:
    """The stored offset ablation in the setting box's words: its own retrained models."""
    from relbias.lab.results import describe, load_stored

    info = describe(load_stored(kind))
    return (
        f"the offset ablation, its own retrained models ($m_l$ = {info['train_len']} bytes, "
        f"{info['steps']:,} steps, {info['seeds']} seeds)"
    )


def lab_setting_box(config, findings, more=()) -> None:
    """The setting box (:func:`relbias.book.setting.setting_text_with`) for a chapter's lab
    notes, ``more`` naming further runs in words: the live demo it names is on the lesson's
    page, not below."""
    text = setting_text_with(config, findings, more)
    if "the live demo below" not in text:
        raise ValueError("the setting box no longer names 'the live demo below'")
    _display(Markdown(text.replace("the live demo below", "the lesson's live demo")))


def provenance_rows(kinds, methods):
    """Rows and headers of a table, one row per stored sweep of ``kinds`` (keys of
    :data:`relbias.lab.results.STORED`): the files that hold ``methods`` (a sweep stored in
    several files keeps each file's seeds, methods and commit), their training steps, m_l,
    seeds and the commits that ran them."""
    from relbias.lab.results import STORED, describe, load_stored

    rows = []
    for kind in kinds:
        results = load_stored(kind)
        info = describe(results)
        files = STORED[kind] if isinstance(STORED[kind], tuple) else (STORED[kind],)
        files = [f if isinstance(f, str) else f[0] for f in files]
        parts = results.get("parts")
        if parts is None:
            parts = [{"commit": results["provenance"]["commit"], "methods": list(methods)}]
        if len(parts) != len(files):
            raise ValueError(f"{kind}: {len(files)} files but {len(parts)} parts")
        held = [(f, p) for f, p in zip(files, parts) if set(p["methods"]) & set(methods)]
        steps = info.get("probe_steps", info["steps"])
        rows.append(
            [
                kind,
                ", ".join(f"{f}.json" for f, _ in held),
                f"{steps:,}",
                info["train_len"],
                info["seeds"],
                ", ".join(dict.fromkeys(p["commit"][:7] for _, p in held)),
            ]
        )
    headers = ["stored sweep", "files (relbias/lab/results)", "steps", "m_l", "seeds", "commits"]
    return rows, headers


def named_config_steps(results: dict) -> int:
    """The steps of the named configuration that ``results`` ran (its own budget)."""
    from relbias.lab.config import get_config

    return get_config(results["provenance"]["config"]["name"]).steps


def answer_key(longer: dict, short: dict, ablation: dict, probe: dict, quick) -> Markdown:
    """The lesson's key above its answer table, as Markdown bullets without maths (a glued
    block): which models each run set names (m_l, steps, seeds), how the ablation's
    retrained models match the short runs, the sliding-window test, the recall probe and
    its chance (5/12), and the live demo's ``quick`` configuration."""
    from relbias.lab.results import describe

    long_info, short_info = describe(longer), describe(short)
    abl_info, probe_info = describe(ablation), describe(probe)
    m_l = long_info["train_len"]
    for info in (short_info, abl_info, probe_info):
        if info["train_len"] != m_l or info["seeds"] != long_info["seeds"]:
            raise ValueError("the key's run sets differ in m_l or seeds")
    if probe["probe"]["num_competitors"] != 1:  # the key's words describe one competitor
        raise ValueError(
            "answer_key describes the probe with one competitor, got num_competitors="
            f"{probe['probe']['num_competitors']}"
        )
    chance = Fraction(readings.probe_chance(probe)).limit_denominator(100)
    if short_info["steps"] != named_config_steps(short):
        raise ValueError("the short runs no longer train the medium configuration's budget")
    if not abl_info["steps"] == probe_info["probe_steps"] == short_info["steps"]:
        raise ValueError("the ablation and the probe no longer train the short runs' steps")
    factors = (1, 2, 4, 8, 16)
    match = max(
        abs(readings.at_factor(ablation, m, f)["mean"] - readings.at_factor(short, m, f)["mean"])
        for m in ("offset", "nope")
        for f in factors
    )
    lengths = readings.probe_lengths(probe)
    longest = m_l * factors[-1]
    short_runs = f"{short_info['steps']:,}-step runs"  # the budgets' names, as the lab's
    items = [
        f"*{long_info['steps']:,}-step runs*: the table and NoPE trained on windows of "
        f"{m_l} bytes, {long_info['seeds']} seeds (a seed's two models on the same batches).",
        f"*{short_runs}*: separate runs of the same models and seeds. Both sets use the "
        "*medium* configuration (the model and windows of every stored run here): "
        f"{short_info['steps']:,} steps is its own budget, and the {long_info['steps']:,}-step "
        f"runs train {long_info['steps'] // short_info['steps']} times as long.",
        f"*Ablation models*: the {short_runs} trained again (new models, same configuration, "
        f"steps and seeds); their means over seeds lie within about {match:.2f} bits per "
        f"byte of the {short_runs}' at every window length.",
        f"*Sliding-window test* ({short_runs}): in windows of {longest:,} bytes, the bytes after "
        f"the first {m_l} are read twice, with the whole window before them and through a "
        f"window of at most {m_l} bytes sliding along the text; each is the mean over "
        "those bytes. Reading them worse whole means more context harms.",
        f"*Recall probe*: separate models trained {probe_info['probe_steps']:,} steps on "
        f"{m_l}-byte windows to give the digit stored with a key when the key is asked again "
        "at the end, with one nearer pair of another key and, half the time, one farther "
        f"pair; tested in windows of {', '.join(str(n) for n in lengths[:-1])} and "
        f"{lengths[-1]:,} bytes, the digit almost a whole test window back (so in the longer "
        "two, farther back than any training window). Chance, a random pick among the digits "
        f"present (two, or three half the time): {chance}. Scoring above it does not show key "
        "matching: a rule that ignores the keys (the target is always the second pair from "
        "the end) is always right.",
        f"*Quick*: the live demo's configuration on a CPU: {quick.train_len}-byte windows, "
        f"{quick.steps:,} steps, one seed (on a GPU it runs the medium one).",
        "*Bits per byte*: the loss on held-out Python text, the mean over every byte of a "
        "window unless said otherwise; lower reads better.",
    ]
    text = "\n".join(f"- {item}" for item in items) + "\n"
    return Markdown(text)
