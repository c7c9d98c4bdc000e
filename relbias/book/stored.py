"""The stored multi-seed ``medium`` sweeps, as the chapters show them beside their live runs.

The chapters' live training demos run the small ``quick`` configuration (one seed, a few
minutes on a CPU). The heavier claims rest on the stored sweeps in
``relbias/lab/results`` (``extrapolation_medium.json``, ``retrieval_medium.json``,
``ablation_*_medium.json``; the commands that made them are in that folder's README):
several seeds per method, a 95 % Student-t interval over seeds at every length.

This module turns them into what a chapter displays and glues: tables of mean and
interval, figures with the interval shaded, and verdicts. A verdict claims a difference
only where the intervals say so: :func:`compare` (two methods at one length) needs the
two intervals to be apart (:func:`relbias.lab.stats.separates`); :func:`trend` (one
method from the training length to a longer one) takes the interval of the per-seed
change, since both numbers come from the same trained models.
"""

from __future__ import annotations

import math

from relbias.book.display import glue
from relbias.book.plots import figure
from relbias.lab.experiments import summarize_extrapolation, summarize_retrieval
from relbias.lab.stats import interval, separates
from relbias.lab.training import (
    load_results,
    method_style,
    plot_extrapolation,
    plot_retrieval,
    plot_val_curves,
)

__all__ = [
    "RELATION",
    "accuracy_at",
    "accuracy_table",
    "at_factor",
    "bpb_table",
    "change_table",
    "combine",
    "compare",
    "compare_accuracy",
    "describe",
    "far_accuracy",
    "far_accuracy_table",
    "far_penalty",
    "gap_by_step",
    "glue_sweep",
    "intervention_at",
    "intervention_effect",
    "gate_summary",
    "join_parts",
    "levelled",
    "longer_training",
    "load",
    "nearest_step",
    "only",
    "order",
    "plot_longer_training",
    "plot_interventions",
    "plot_probe",
    "probe_lengths",
    "plot_sweep",
    "pool_seeds",
    "relation",
    "renamed",
    "seed_count",
    "short_verdict",
    "show_interval",
    "spread_by_step",
    "spread_of",
    "trend",
]

#: The stored result file of each experiment.
STORED = {
    "extrapolation": "extrapolation_medium",
    "retrieval": "retrieval_medium",
    "t5": "ablation_t5_medium",
    # the new ablations (issues 27, 28): one cause changed each, 3 seeds, medium, 3000 steps
    "t5_far": "ablation_t5_medium_farmin",
    "kerple": "ablation_kerple_medium",
    "alibi_probe": "ablation_alibi_probe_medium",
    "fire": "ablation_fire_medium",
    "offset": "ablation_offset_medium",
    # the forget gate (issue 17), swept later with the same configuration and seeds
    "forgetting_extrapolation": "extrapolation_medium_forgetting",
    # the medium sweep trained five times as long (--steps 15000), each sitting run as two
    # processes of different methods (joined by ``load``): seed 0 of every method, T5's
    # seeds 1 and 2 (one process each), then seeds 1 and 2 of the six other bias families,
    # then seeds 1 and 2 of the four baselines
    "extrapolation_15000": (
        "extrapolation_medium_steps15000_a",
        "extrapolation_medium_steps15000_b",
        "extrapolation_medium_steps15000_t5_seed1",
        "extrapolation_medium_steps15000_t5_seed2",
        "extrapolation_medium_steps15000_seeds12_a",
        "extrapolation_medium_steps15000_seeds12_b",
        "extrapolation_medium_steps15000_seeds12_c",
        "extrapolation_medium_steps15000_seeds12_d",
    ),
    # the forget gate on the probe, started at b = 0 (the reference) and at b = 5
    # (f = 0.993): seeds 0-2 first, seeds 3-5 added later (pooled by ``load``)
    "forgetting_retrieval": ("retrieval_medium_forgetting", "retrieval_medium_forgetting_seeds345"),
    "forgetting_retrieval_init5": (
        "retrieval_medium_forgetting_init5",
        "retrieval_medium_forgetting_init5_seeds345",
    ),
}


def load(kind: str = "extrapolation") -> dict:
    """The stored sweep of ``kind`` (one of :data:`STORED`'s keys), read from the library.

    A kind stored in several files comes as one sweep (:func:`join_parts`): each method
    summarised over every seed any file holds of it."""
    if kind not in STORED:
        raise ValueError(f"kind must be one of {list(STORED)}, got {kind!r}")
    names = STORED[kind] if isinstance(STORED[kind], tuple) else (STORED[kind],)
    parts = []
    for name in names:
        results = load_results(name)
        if "seeds" not in results:
            raise ValueError(f"{name}.json holds no multi-seed sweep")
        parts.append(results)
    return join_parts(parts)


def join_parts(parts) -> dict:
    """One sweep from the files of one kind, each a sitting of some methods and seeds
    (one sitting split over processes, later seeds added, more seeds for some methods):
    every method's per-seed records are gathered from all the files that hold it and its
    summary (mean and interval per length) recomputed over them. Methods keep the order in
    which they first appear and may stand on different seeds (:func:`seed_count`);
    ``"seeds"`` is the union and ``"parts"`` lists each file's commit, command, time, wall
    time, seeds and methods. A method given the same seed twice is refused."""
    if not parts:
        raise ValueError("parts must hold at least one sweep")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    summarize = {"extrapolation": summarize_extrapolation, "retrieval": summarize_retrieval}
    if first.get("kind") not in summarize:
        raise ValueError(f"can join extrapolation or retrieval sweeps, got {first.get('kind')!r}")
    for other in parts[1:]:
        for key in ("kind", "model_kwargs"):
            if other.get(key) != first.get(key):
                raise ValueError(f"the runs differ in {key}: {first.get(key)} and {other.get(key)}")
        if other["provenance"]["config"] != first["provenance"]["config"]:
            raise ValueError("the runs were made with different configurations")
    per_method: dict[str, dict] = {}
    for results in parts:
        for m, record in results["methods"].items():
            gathered = per_method.setdefault(m, {})
            twice = sorted(int(s) for s in record["seeds"] if int(s) in gathered)
            if twice:
                raise ValueError(f"method {m!r} holds seeds {twice} in more than one file")
            gathered.update({int(s): rec for s, rec in record["seeds"].items()})
    methods = {
        m: summarize[first["kind"]]({s: recs[s] for s in sorted(recs)})
        for m, recs in per_method.items()
    }
    return _with_parts(first, methods, parts)


def _parts_of(results: dict) -> list[dict]:
    """Where each file behind ``results`` came from: its commit, command, time, wall time,
    seeds and methods (a joined sweep's own ``"parts"``)."""
    if "parts" in results:
        return results["parts"]
    keys = ("commit", "command", "created_utc", "wall_s")
    return [
        {
            **{k: results["provenance"].get(k) for k in keys},
            "seeds": results["seeds"],
            "methods": list(results["methods"]),
        }
    ]


def _with_parts(first: dict, methods: dict, sweeps) -> dict:
    """``first`` holding ``methods``, with the seeds, ``"parts"`` and summed wall time of
    all ``sweeps``."""
    sources = [part for r in sweeps for part in _parts_of(r)]
    return {
        **first,
        "methods": methods,
        "seeds": sorted({int(s) for r in sweeps for s in r["seeds"]}),
        "provenance": {
            **first["provenance"],
            "wall_s": sum(part["wall_s"] or 0 for part in sources),
        },
        "parts": sources,
    }


def pool_seeds(first: dict, *more: dict) -> dict:
    """One sweep from runs of the same methods, configuration and variant with different
    seeds (:func:`join_parts` where every file holds every method, checked here): each
    method's summary recomputed over all the seeds, ``"parts"`` listing each file."""
    for other in more:
        if list(other["methods"]) != list(first["methods"]):
            raise ValueError("the runs hold different methods")
    seeds = [s for r in (first, *more) for s in r["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the runs share seeds: {seeds}")
    return join_parts([first, *more])


def combine(first: dict, *more: dict, same_seeds: bool = True) -> dict:
    """One sweep holding the methods of several stored sweeps of the same kind,
    configuration and seeds (e.g. the forget gate's, run later, with the others'), each
    method's summary as its sweep gives it; ``"parts"`` lists every file as
    :func:`join_parts` does.

    ``same_seeds=False`` joins sweeps run with different seeds (a variant given more
    seeds): each method keeps its own interval, ``"seeds"`` becomes the union, and
    :func:`seed_count` tells how many seeds stand behind a method."""
    for other in more:
        for key in ("kind", "seeds") if same_seeds else ("kind",):
            if other.get(key) != first.get(key):
                raise ValueError(
                    f"the sweeps differ in {key}: {first.get(key)} and {other.get(key)}"
                )
        if other["provenance"]["config"] != first["provenance"]["config"]:
            raise ValueError("the sweeps were made with different configurations")
    methods = {}
    for results in (first, *more):
        twice = [m for m in results["methods"] if m in methods]
        if twice:
            raise ValueError(
                f"methods {twice} are in more than one sweep; rename a variant first "
                "(stored.renamed)"
            )
        methods.update(results["methods"])
    return _with_parts(first, methods, (first, *more))


def seed_count(results: dict, method: str) -> int:
    """How many seeds ``method``'s summary in ``results`` averages."""
    return len(results["methods"][method]["seeds"])


def renamed(results: dict, names: dict) -> dict:
    """``results`` with methods renamed by ``names`` (``{old: new}``), e.g. to put a
    variant beside the method it varies (:func:`combine` needs distinct names)."""
    missing = [m for m in names if m not in results["methods"]]
    if missing:
        raise ValueError(f"methods {missing} are not in the results: {list(results['methods'])}")
    methods = {names.get(m, m): rec for m, rec in results["methods"].items()}
    parts = [{**p, "methods": [names.get(m, m) for m in p["methods"]]} for p in _parts_of(results)]
    return {**results, "methods": methods, "parts": parts}


def gate_summary(results: dict, method: str) -> dict:
    """What ``method``'s forget gates learned, over seeds (the records' ``learned_gate``):
    ``mean_log_forget`` (the mean of :math:`\\log f_t` over seeds, layers, heads and
    tokens), ``half_life`` (``ln 2`` over its negative, in tokens), ``most_open`` (the
    head mean closest to 0) and, on probe sequences, ``bias_at_distance`` (the mean
    bias the gates put on the answer, ``distance`` back; ``least_bias``, the head closest
    to 0; ``least_bias_per_run``, that head's bias in each seed's run)."""
    seeds = results["methods"][method].get("seeds", {})
    gates = [rec["learned_gate"] for rec in seeds.values() if rec.get("learned_gate")]
    if not gates:
        raise ValueError(f"{method} has no gate read-back in these results")

    def flat(key):
        return [v for g in gates for row in g[key] for v in row]

    heads = flat("mean_log_forget")
    mean = sum(heads) / len(heads)
    out = {
        "seeds": len(gates),
        "mean_log_forget": mean,
        "half_life": math.log(2) / -mean if mean < 0 else math.inf,
        "most_open": max(heads),
    }
    if "bias_at_distance" in gates[0]:
        bias = flat("bias_at_distance")
        out.update(
            distance=gates[0]["distance"],
            bias_at_distance=sum(bias) / len(bias),
            least_bias=max(bias),
            least_bias_per_run=[max(max(row) for row in g["bias_at_distance"]) for g in gates],
        )
    return out


def far_penalty(results: dict, method: str) -> dict:
    """How hard ``method``'s learned table (the records' ``learned_bias``: one row per head,
    offsets 0 to the farthest read back) penalises the farthest offset, over seeds: the
    per-seed mean over heads of the farthest offset's bias minus the head's largest
    (``mean``, ``low``, ``high``: 0 is no penalty at all), and ``lowest_far`` (heads, over
    all seeds, whose farthest offset has their lowest bias: a table falling to the end)
    of ``heads``."""
    seeds = results["methods"][method].get("seeds", {})
    tables = [rec["learned_bias"]["values"] for rec in seeds.values() if rec.get("learned_bias")]
    if not tables:
        raise ValueError(f"{method} has no learned-bias read-back in these results")
    per_seed = [sum(row[-1] - max(row) for row in t) / len(t) for t in tables]
    rows = [row for t in tables for row in t]
    return {
        **interval(per_seed),
        "lowest_far": sum(row[-1] <= min(row) for row in rows),
        "heads": len(rows),
        "offset": len(rows[0]) - 1,
    }


def only(results: dict, methods) -> dict:
    """``results`` with only ``methods`` (in that order), for the tables and figures;
    ``"seeds"`` becomes the seeds those methods stand on and ``"parts"`` (of a joined
    sweep) the files that hold them, whose wall times make the provenance's."""
    missing = [m for m in methods if m not in results["methods"]]
    if missing:
        raise ValueError(f"methods {missing} are not in the results: {list(results['methods'])}")
    chosen = {m: results["methods"][m] for m in methods}
    out = {**results, "methods": chosen}
    seeds = sorted({int(s) for rec in chosen.values() for s in rec.get("seeds", {})})
    if seeds:
        out["seeds"] = seeds
    if "parts" in results:
        out["parts"] = [p for p in results["parts"] if set(p["methods"]) & set(methods)]
        wall_s = sum(p["wall_s"] or 0 for p in out["parts"])
        out["provenance"] = {**results["provenance"], "wall_s": wall_s}
    return out


def _row(record: dict, factor: int) -> dict:
    for row in record["eval"]:
        if row.get("factor") == factor:
            return row
    raise ValueError(f"factor must be one of {[r.get('factor') for r in record['eval']]}")


def at_factor(results: dict, method: str, factor: int) -> dict:
    """Mean and interval of ``method``'s bits per byte at ``factor`` x the training length."""
    row = _row(results["methods"][method], factor)
    return {"mean": row["bpb"], "low": row["bpb_low"], "high": row["bpb_high"], "n": row["n"]}


def show_interval(iv: dict, digits: int = 2) -> str:
    """``mean [low, high]`` with ``digits`` decimals; ``mean (one seed)`` where one seed
    leaves no interval."""
    if math.isnan(iv["low"]) or math.isnan(iv["high"]):
        return f"{iv['mean']:.{digits}f} (one seed)"
    return f"{iv['mean']:.{digits}f} [{iv['low']:.{digits}f}, {iv['high']:.{digits}f}]"


def bpb_table(results: dict, methods, *, digits: int = 2):
    """Rows and headers of a table: each method's mean bits per byte and 95 % interval per
    evaluation length (``mean [low, high]``), for :func:`relbias.book.show_table`."""
    factors = [row["factor"] for row in results["methods"][methods[0]]["eval"]]
    lengths = [row["length"] for row in results["methods"][methods[0]]["eval"]]
    headers = ["method", *(f"{n} ({f}x)" for n, f in zip(lengths, factors))]
    rows = [
        [m, *(show_interval(at_factor(results, m, f), digits) for f in factors)] for m in methods
    ]
    return rows, headers


def compare(results: dict, a: str, b: str, factor: int) -> str:
    """``"lower"`` or ``"higher"`` when ``a``'s interval at ``factor`` lies wholly below or
    above ``b``'s, else ``"overlapping"``: the rule before a chapter claims an ordering."""
    return order(at_factor(results, a, factor), at_factor(results, b, factor))


def order(ia: dict, ib: dict) -> str:
    """``"lower"``, ``"higher"`` or ``"overlapping"``: interval ``ia`` against ``ib`` (from
    :func:`at_factor`, :func:`accuracy_at` or two different sweeps)."""
    if not separates(ia, ib):
        return "overlapping"
    return "lower" if ia["high"] < ib["low"] else "higher"


RELATION = {"lower": "lies below", "higher": "lies above", "overlapping": "overlaps"}


def relation(results: dict, a: str, b: str, factor: int) -> str:
    """:func:`compare` as words for the prose: ``a``'s interval "lies below", "lies above"
    or "overlaps" ``b``'s."""
    return RELATION[compare(results, a, b, factor)]


def _per_seed_bpb(results: dict, method: str, factor: int, seeds=None) -> list[float]:
    """``method``'s bits per byte at ``factor`` x, one per seed (all, or ``seeds``)."""
    records = results["methods"][method]["seeds"]
    chosen = sorted(records, key=int) if seeds is None else [str(s) for s in seeds]
    return [_row(records[s], factor)["bpb"] for s in chosen]


def trend(results: dict, method: str, *, start: int = 1, end: int | None = None) -> dict:
    """How ``method``'s bits per byte change from ``start`` x to ``end`` x (default the
    longest) the training length, over seeds: the interval of the per-seed change
    (``mean``, ``low``, ``high``) and the ``verdict``: ``"degrades"`` (the whole interval
    above 0), ``"improves"`` (below 0) or ``"neither degrades nor improves beyond the
    interval"``; with one seed there is no interval and the verdict is ``"one seed, no
    verdict"``."""
    end = end or max(row["factor"] for row in results["methods"][method]["eval"])
    first = _per_seed_bpb(results, method, start)
    last = _per_seed_bpb(results, method, end)
    change = interval([b - a for a, b in zip(first, last)])
    if change["n"] < 2:
        verdict = "one seed, no verdict"
    elif change["low"] > 0:
        verdict = "degrades"
    elif change["high"] < 0:
        verdict = "improves"
    else:
        verdict = "neither degrades nor improves beyond the interval"
    return {**change, "verdict": verdict, "start": start, "end": end}


def levelled(results: dict, method: str) -> dict:
    """Whether ``method``'s validation curve at the training length levelled off, per seed:
    ``seeds`` (how many), ``levelled`` (how many fell by at most 0.02 bits over the last
    20 % of training) and ``largest_drop`` (bits, the most any seed still fell there)."""
    per_seed = results["methods"][method]["train"].get("val_levelled", [])
    if not per_seed:
        raise ValueError(f"{method} has no validation curve in these results")
    return {
        "seeds": len(per_seed),
        "levelled": sum(bool(s["levelled"]) for s in per_seed),
        "largest_drop": max(s["drop"] for s in per_seed),
    }


def spread_by_step(results: dict, methods) -> list[dict]:
    """How far apart ``methods`` are at the training length as training goes on: at each
    step of the validation curves, every method's mean over seeds and the ``spread``
    (largest mean minus smallest). Tells whether the differences close with training."""
    curves = {}
    for m in methods:
        per_seed = results["methods"][m]["seeds"].values()
        for record in per_seed:
            for point in record["train"].get("val_curve", []):
                curves.setdefault(point["step"], {}).setdefault(m, []).append(point["bpb"])
    rows = []
    for step in sorted(curves):
        means = {m: sum(v) / len(v) for m, v in curves[step].items()}
        if len(means) == len(methods):
            rows.append(
                {"step": step, "means": means, "spread": max(means.values()) - min(means.values())}
            )
    if not rows:
        raise ValueError(f"no validation curve common to {list(methods)}")
    return rows


def gap_by_step(results: dict, method: str, others) -> dict:
    """``{step: gap}``: along the validation curves at the training length, ``method``'s
    mean over seeds minus the mean of ``others``' means (:func:`spread_by_step`), e.g.
    whether one method's deficit is still closing when training ends."""
    others = [m for m in others if m != method]
    if not others:
        raise ValueError(f"others must hold a method besides {method!r}")
    rows = spread_by_step(results, [method, *others])
    return {
        r["step"]: r["means"][method] - sum(r["means"][m] for m in others) / len(others)
        for r in rows
    }


def nearest_step(by_step: dict, step: int) -> int:
    """The key of ``by_step`` (training steps) nearest to ``step``."""
    return min(by_step, key=lambda s: abs(s - step))


def spread_of(intervals: dict) -> dict:
    """How far apart methods are, from one interval each (``{method: interval}``, e.g.
    their bits per byte at one length): ``highest`` and ``lowest`` (by mean), ``spread``
    (the difference of those means), ``rest_spread`` (the spread without the highest),
    ``apart`` (the pairs, in the given order, whose intervals separate: :func:`order`)
    and ``pairs`` (how many pairs there are)."""
    if len(intervals) < 2:
        raise ValueError(f"intervals must hold at least two methods, got {list(intervals)}")
    names = list(intervals)
    by_mean = sorted(names, key=lambda m: intervals[m]["mean"])
    rest = [intervals[m]["mean"] for m in by_mean[:-1]]
    pairs = [(a, b) for i, a in enumerate(names) for b in names[i + 1 :]]
    return {
        "highest": by_mean[-1],
        "lowest": by_mean[0],
        "spread": intervals[by_mean[-1]]["mean"] - intervals[by_mean[0]]["mean"],
        "rest_spread": max(rest) - min(rest),
        "apart": [(a, b) for a, b in pairs if order(intervals[a], intervals[b]) != "overlapping"],
        "pairs": len(pairs),
    }


def _shared_seeds(short: dict, longer: dict, method: str) -> list[int]:
    """The seeds of ``method`` that both runs hold."""
    held = [set(map(int, r["methods"][method]["seeds"])) for r in (short, longer)]
    seeds = sorted(held[0] & held[1])
    if not seeds:
        raise ValueError(
            f"the runs share no seed of {method}: {sorted(held[0])} and {sorted(held[1])}"
        )
    return seeds


def longer_training(short: dict, longer: dict, methods) -> dict:
    """The same methods trained ``short`` and ``longer`` (more steps, otherwise the same
    configuration), compared per method on the seeds both runs hold of it (``seeds``):
    bits per byte at the training length and at the longest length after each
    (``short_1x``, ``longer_1x``, ``short_end``, ``longer_end``: mean and 95 % interval
    over those seeds, no interval for one seed); the longer run's largest fall over the
    last fifth of training (``drop``), how many of its seeds levelled off (``levelled``,
    :func:`levelled`) of how many (``runs``). ``"steps"`` gives both step counts."""
    configs = [r["provenance"]["config"] for r in (short, longer)]
    differ = sorted(
        k for k in {**configs[0], **configs[1]} if configs[0].get(k) != configs[1].get(k)
    )
    if differ != ["steps"] or not configs[1]["steps"] > configs[0]["steps"]:
        raise ValueError(
            "longer must be short's configuration with more steps; they differ in "
            f"{differ} (steps {configs[0]['steps']} and {configs[1]['steps']})"
        )
    end = max(row["factor"] for row in short["methods"][methods[0]]["eval"])
    rows = {}
    for m in methods:
        seeds = _shared_seeds(short, longer, m)
        lev = levelled(longer, m)
        rows[m] = {
            "seeds": seeds,
            "drop": lev["largest_drop"],
            "levelled": lev["levelled"],
            "runs": lev["seeds"],
        }
        for name, results in (("short", short), ("longer", longer)):
            for at, factor in (("1x", 1), ("end", end)):
                rows[m][f"{name}_{at}"] = interval(_per_seed_bpb(results, m, factor, seeds))
    return {"steps": [c["steps"] for c in configs], "end": end, "methods": rows}


def plot_longer_training(short: dict, longer: dict, groups, *, width: float = 11.0):
    """The validation curves at the training length, each the mean over the seeds both runs
    hold of the method: the longer run solid, the shorter dotted, one panel per group of
    methods (a legend entry, below the panel, gives the number of seeds)."""
    fig, axes = figure(width, 4.4, ncols=len(groups))
    for ax, methods in zip(getattr(axes, "flat", [axes]), groups):
        for i, m in enumerate(methods):
            seeds = [str(s) for s in _shared_seeds(short, longer, m)]
            color = method_style(m, i)["color"]
            label = f"{m} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''})"
            for results, style in ((longer, "-"), (short, ":")):
                curves = [results["methods"][m]["seeds"][s]["train"]["val_curve"] for s in seeds]
                xs = [p["step"] for p in curves[0]]
                ys = [sum(c[j]["bpb"] for c in curves) / len(curves) for j in range(len(xs))]
                ax.plot(xs, ys, style, color=color, lw=1, label=label if style == "-" else None)
        ax.set_xlabel("training step (dotted: the shorter run)")
        ax.legend(fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.16))
        _zoom_on_late_steps(ax)
    # one y label, on the left panel only: a second one would sit between the panels
    first = next(iter(getattr(axes, "flat", [axes])))
    first.set_ylabel("bits per byte at the training\nlength, mean over seeds")
    return fig


def describe(results: dict) -> dict:
    """What a sweep read and where it came from, for the prose: ``seeds``, ``steps``,
    ``train_len``, ``eval_kb`` (validation kB at every length), ``files`` (the fewest
    validation files any length touched), ``commit`` (every commit of a joined sweep's
    parts) and ``wall_min``."""
    config = results["provenance"]["config"]
    rows = next(iter(results["methods"].values()))["eval"]
    info = {
        "seeds": len(results["seeds"]),
        "steps": config["steps"],
        "train_len": config["train_len"],
        "commit": ", ".join(
            dict.fromkeys(
                (p.get("commit") or "unknown")[:7]
                for p in results.get("parts", [results["provenance"]])
            )
        ),
        "wall_min": round((results["provenance"].get("wall_s") or 0) / 60),
    }
    if results["kind"] in ("extrapolation", "ablation") and "bytes" in rows[0]:  # text, not probe
        info["eval_kb"] = min(row["bytes"] for row in rows) // 1024
        info["files"] = min(row.get("files", 0) for row in rows)
    else:
        info["probe_steps"] = config["probe_steps"]
        info["samples"] = min(row["samples"] for row in rows)
    return info


def plot_sweep(results: dict, methods, *, width: float = 11.0, height: float = 3.6):
    """Bits per byte against evaluation length with the 95 % interval shaded (left) and the
    validation curve of every seed at the training length (right), for ``methods``."""
    chosen = only(results, methods)
    fig, axes = figure(width, height, ncols=2)
    left, right = axes.flat
    plot_extrapolation(chosen, ax=left)
    plot_val_curves(chosen, ax=right)
    _zoom_on_late_steps(right)
    # the book's units (bytes), short labels that fit beside each other, and one legend
    # below both panels, so that no legend covers a line or a band
    lengths = [row["length"] for row in next(iter(chosen["methods"].values()))["eval"]]
    left.set_xticks(lengths, [str(n) for n in lengths])
    left.set_xlabel("evaluation length (bytes); grey: training length")
    left.set_ylabel("bits per byte")
    right.set_xlabel("training step")
    right.set_ylabel("bits per byte at the training length")
    _legend_below(fig, left, [left, right])
    return fig


def _legend_below(fig, source, axes) -> None:
    """One legend for ``axes``, from ``source``'s lines, below the panels (none on them)."""
    for ax in axes:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    handles, labels = source.get_legend_handles_labels()
    if handles:
        fig.legend(
            handles, labels, loc="outside lower center", ncol=min(len(labels), 6), fontsize=8
        )


def _zoom_on_late_steps(ax) -> None:
    """Limit the y axis to the curves after the first fifth of training (the first steps
    start several bits higher and would flatten the part that tells whether they levelled)."""
    points = [(x, y) for line in ax.get_lines() for x, y in zip(*line.get_data())]
    if not points:
        return
    last = max(x for x, _ in points)
    late = [y for x, y in points if x >= last / 5]
    low, high = min(y for _, y in points), max(late)
    ax.set_ylim(low - 0.05 * (high - low + 1e-9), high + 0.05 * (high - low + 1e-9))


def accuracy_table(results: dict, methods, length: int, *, digits: int = 2):
    """Rows and headers: each method's recall accuracy (mean [low, high] over seeds, the
    interval clipped to [0, 1]) per distance, at sequence length ``length``."""
    distances = [
        r["distance"] for r in results["methods"][methods[0]]["eval"] if r["length"] == length
    ]
    if not distances:
        raise ValueError(f"length {length} is not among the stored lengths")
    headers = ["method", *(f"d = {d}" for d in distances)]
    rows = [
        [m, *(show_interval(accuracy_at(results, m, length, d), digits) for d in distances)]
        for m in methods
    ]
    return rows, headers


def accuracy_at(results: dict, method: str, length: int, distance: int | None = None) -> dict:
    """Recall accuracy of ``method`` at one sequence ``length`` and ``distance`` (default:
    the farthest), mean and 95 % interval over seeds, the interval clipped to [0, 1]."""
    rows = [r for r in results["methods"][method]["eval"] if r["length"] == length]
    if not rows:
        raise ValueError(f"length {length} is not among the stored lengths")
    row = (
        rows[-1] if distance is None else next((r for r in rows if r["distance"] == distance), None)
    )
    if row is None:
        raise ValueError(f"distance must be one of {[r['distance'] for r in rows]}")
    return {
        "mean": row["accuracy"],
        "low": max(0.0, row["accuracy_low"]),
        "high": min(1.0, row["accuracy_high"]),
        "distance": row["distance"],
    }


def compare_accuracy(results: dict, a: str, b: str, length: int, distance=None) -> str:
    """``"lower"``, ``"higher"`` or ``"overlapping"``: ``a``'s recall accuracy against
    ``b``'s at one length and distance (default the farthest), by their intervals."""
    return order(*(accuracy_at(results, m, length, distance) for m in (a, b)))


def probe_lengths(results: dict) -> list[int]:
    """The sequence lengths a stored probe was tested at, shortest first."""
    return sorted({r["length"] for rec in results["methods"].values() for r in rec["eval"]})


def far_accuracy(results: dict, methods) -> dict:
    """``{method: {length: interval}}``: each method's recall accuracy at the farthest
    distance of every tested length (:func:`accuracy_at`)."""
    return {m: {n: accuracy_at(results, m, n) for n in probe_lengths(results)} for m in methods}


def far_accuracy_table(far: dict, *, digits: int = 2):
    """Rows and headers of a table of :func:`far_accuracy`'s ``far``: each method's recall
    accuracy at the farthest distance of every tested length, mean [95 % interval,
    clipped to [0, 1]] over seeds."""
    if not far:
        raise ValueError("far must hold at least one method (stored.far_accuracy)")
    methods = list(far)
    lengths = list(far[methods[0]])
    headers = ["method", *(f"{n} tokens, d = {far[methods[0]][n]['distance']}" for n in lengths)]
    rows = [[m, *(show_interval(far[m][n], digits) for n in lengths)] for m in methods]
    return rows, headers


def plot_probe(results: dict, methods, *, width: float = 12.0, height: float = 3.4):
    """Recall accuracy against distance (interval shaded), one panel per sequence length."""
    chosen = only(results, methods)
    lengths = sorted({r["length"] for m in methods for r in results["methods"][m]["eval"]})
    fig, axes = figure(width, height, ncols=len(lengths))
    panels = list(getattr(axes, "flat", [axes]))
    for ax, length in zip(panels, lengths):
        plot_retrieval(chosen, length=length, ax=ax)
        ax.set_xlabel("distance (grey: longest trained)", fontsize=8)
    _legend_below(fig, panels[0], panels)  # a legend on a panel would cover the bands
    return fig


def glue_sweep(prefix: str, results: dict, methods) -> dict:
    """Glue what a chapter's prose says about ``methods`` in a stored sweep, and return it.

    For the sweep: ``{prefix}_seeds``, ``_steps``, ``_train_len``, ``_commit`` (and
    ``_eval_kb``, ``_files`` for text). For each method ``m`` and each evaluation factor
    ``f``: ``{prefix}_{m}_bpb{f}`` (``mean [low, high]``); and from the training length to
    the longest, ``{prefix}_{m}_trend`` (the verdict of :func:`trend`) and
    ``{prefix}_{m}_change`` (the per-seed change, ``mean [low, high]``). Returns
    ``{"describe": ..., "trend": {m: ...}}`` for the chapter's checks.
    """
    info = describe(results)
    for key, value in info.items():
        glue(f"{prefix}_{key}", value)
    trends = {}
    for m in methods:
        for row in results["methods"][m]["eval"]:
            f = row["factor"]
            glue(f"{prefix}_{m}_bpb{f}", show_interval(at_factor(results, m, f)))
        trends[m] = trend(results, m)
        glue(f"{prefix}_{m}_trend", trends[m]["verdict"])
        glue(f"{prefix}_{m}_change", show_interval(trends[m]))
    return {"describe": info, "trend": trends}


# --- interventions: the same trained weights evaluated with one thing changed (ablations) ---


def intervention_at(results: dict, method: str, intervention: str, factor: int) -> dict:
    """Mean and 95 % interval of ``method``'s bits per byte at ``factor`` x the training
    length, evaluated with the stored ``intervention`` (an ablation's
    ``methods[method]["interventions"][intervention]``: the same trained weights with one
    thing changed). Same keys as :func:`at_factor`."""
    held = results["methods"][method].get("interventions", {})
    if intervention not in held:
        raise ValueError(
            f"intervention must be one of {list(held)} for {method!r}, got {intervention!r}"
        )
    row = _row(held[intervention], factor)
    return {"mean": row["bpb"], "low": row["bpb_low"], "high": row["bpb_high"], "n": row["n"]}


def intervention_effect(
    results: dict, method: str, intervention: str, factor: int, *, against: int | None = None
) -> dict:
    """What ``intervention`` does to ``method``'s bits per byte at ``factor`` x, seed by seed
    (intervened minus as trained: both readings come from the same trained weights): the
    interval of that change (``mean``, ``low``, ``high``, ``n``) and the ``verdict``:
    ``"lowers"`` (the whole interval below 0), ``"raises"`` (above 0) or ``"no change
    beyond the interval"``; ``"one seed, no verdict"`` with one seed.

    ``against``: compare with the as-trained reading at that factor instead (e.g. 1: does
    the intervened reading at 16x still lie above the model's reading at the training
    length?)."""
    against = factor if against is None else against
    seeds = results["methods"][method]["seeds"]
    changes = []
    for s in sorted(seeds, key=int):
        record = seeds[s]
        if intervention not in record.get("interventions", {}):
            raise ValueError(f"seed {s} of {method!r} holds no intervention {intervention!r}")
        changed = _row(record["interventions"][intervention], factor)["bpb"]
        changes.append(changed - _row(record, against)["bpb"])
    change = interval(changes)
    if change["n"] < 2:
        verdict = "one seed, no verdict"
    elif change["high"] < 0:
        verdict = "lowers"
    elif change["low"] > 0:
        verdict = "raises"
    else:
        verdict = "no change beyond the interval"
    return {**change, "verdict": verdict}


def plot_interventions(
    results: dict, methods, interventions, factor: int, *, width: float = 8.0, height: float = 3.4
):
    """Bits per byte at ``factor`` x for each of ``methods`` as trained and with each of
    ``interventions`` (mean over seeds, bar: 95 % interval), one group of points per
    reading; a dotted line per method marks its bits per byte at the training length."""
    fig, ax = figure(width, height)
    readings = ["as trained", *interventions]
    spread = 0.8 / max(len(methods), 1)
    for k, m in enumerate(methods):
        color = method_style(m, k)["color"]
        ivs = [at_factor(results, m, factor)]
        ivs += [intervention_at(results, m, name, factor) for name in interventions]
        xs = [i - 0.4 + spread * (k + 0.5) for i in range(len(readings))]
        means = [iv["mean"] for iv in ivs]
        below = [iv["mean"] - iv["low"] for iv in ivs]
        above = [iv["high"] - iv["mean"] for iv in ivs]
        ax.errorbar(xs, means, yerr=[below, above], fmt="o", ms=4, capsize=3, color=color, label=m)
        ax.axhline(at_factor(results, m, 1)["mean"], color=color, ls=":", lw=1)
    ax.set_xticks(range(len(readings)), readings)
    ax.set_ylabel(f"bits per byte at {factor}x")
    fig.legend(
        *ax.get_legend_handles_labels(), loc="outside lower center", ncol=len(methods), fontsize=8
    )
    return fig


# --- interventions and the loss past the training length (chapters 2 and 3) ---------------


def _intervention_rows(record: dict, name: str) -> list[dict]:
    """The evaluation rows of ``record`` (one seed's or the summary over seeds) with
    intervention ``name``: ``record["interventions"][name]["eval"]``, or ``record[name]``
    where the rows sit at the top level (the T5 ablation's ``eval_monotone``)."""
    if name in record.get("interventions", {}):
        return record["interventions"][name]["eval"]
    if isinstance(record.get(name), list):
        return record[name]
    known = [*record.get("interventions", {}), *(k for k in record if k.startswith("eval_"))]
    raise ValueError(f"no intervention {name!r} in this record; it has {known}")


def interventions_as_methods(results: dict, variant: str, names, *, labels=None) -> dict:
    """``results`` with ``variant`` as trained and once per intervention of ``names`` (the
    same trained weights evaluated with one thing changed), each as a method of its own,
    named by ``labels`` (``{name: label}``; ``variant`` may be renamed too; default
    ``"<variant>, <name>"``): its summary rows and every seed's rows, so that
    :func:`bpb_table`, :func:`at_factor`, :func:`trend`, :func:`loss_within_and_past` and
    :func:`plot_bpb_by_length` read it like any method."""
    labels = dict(labels or {})
    record = results["methods"][variant]
    methods = {labels.get(variant, variant): record}
    for name in names:
        seeds = {
            s: {**rec, "eval": _intervention_rows(rec, name)} for s, rec in record["seeds"].items()
        }
        label = labels.get(name, f"{variant}, {name}")
        methods[label] = {**record, "eval": _intervention_rows(record, name), "seeds": seeds}
    return {**results, "methods": methods}


def paired_change(results: dict, a: str, b: str, factor: int) -> dict:
    """``a``'s bits per byte at ``factor`` x minus ``b``'s, seed by seed (two methods of
    ``results`` that hold the same seeds, e.g. a model as trained and with an intervention,
    from :func:`interventions_as_methods`): mean and 95 % interval of the per-seed change."""
    seeds_a, seeds_b = results["methods"][a]["seeds"], results["methods"][b]["seeds"]
    if set(seeds_a) != set(seeds_b):
        raise ValueError(
            f"{a!r} and {b!r} hold different seeds: {sorted(seeds_a)}, {sorted(seeds_b)}"
        )
    return interval(
        [_row(seeds_a[s], factor)["bpb"] - _row(seeds_b[s], factor)["bpb"] for s in seeds_a]
    )


def loss_within_and_past(results: dict, method: str) -> dict:
    """``method``'s mean loss at the longest length, split at the training length ``m_l``:
    the first ``m_l`` positions of a window (``"within"``) and the rest (``"past"``), each
    per seed from the loss by position, then mean and 95 % interval over seeds; with
    ``"length"`` (the window) and ``"train_len"``."""
    train_len = results["provenance"]["config"]["train_len"]
    within, past, length = [], [], None
    for rec in results["methods"][method]["seeds"].values():
        row = max(rec["eval"], key=lambda r: r["length"])
        pos, length = row["loss_by_position"], row["length"]
        within.append(sum(pos[:train_len]) / train_len)
        past.append(sum(pos[train_len:]) / (len(pos) - train_len))
    return {
        "within": interval(within),
        "past": interval(past),
        "length": length,
        "train_len": train_len,
    }


def edge_above_min(results: dict, method: str = "offset", offset: int | None = None) -> dict:
    """How far a learned table's value at ``offset`` sits above the table's minimum up to
    that offset, per head and seed, from the records' read-back (``learned_bias``, offsets
    0 onwards). The default offset is the clipped offset table's edge ``u_{m_l-1}``, the
    value every farther offset reads; for T5 pass the farthest offset read back (``-1``).
    Returns ``values`` (every head of every seed), ``low`` and ``high`` (their range),
    ``above`` (heads whose value lies above the minimum: those keys favoured over the
    middle ones) of ``heads``, and ``below_max``, the range of the value minus the table's
    largest."""
    if offset is None:
        offset = results["provenance"]["config"]["train_len"] - 1
    values, below = [], []
    for rec in results["methods"][method]["seeds"].values():
        for row in rec["learned_bias"]["values"]:
            table = row[: offset + 1] if offset >= 0 else row[: len(row) + offset + 1]
            values.append(table[-1] - min(table))
            below.append(table[-1] - max(table))
    return {
        "values": values,
        "low": min(values),
        "high": max(values),
        "above": sum(v > 0 for v in values),
        "heads": len(values),
        "below_max": (min(below), max(below)),
    }


def plot_bpb_by_length(runs: dict, methods, *, width: float = 8.0, height: float = 3.0):
    """Bits per byte against the window length in bytes (log scale), the 95 % interval over
    seeds shaded, one panel per entry of ``runs`` (``{title: results}``, sharing the y
    axis) with ``methods`` in each; a grey line marks the training length, and one legend
    below the panels names every method (no legend covers a curve)."""
    fig, axes = figure(width, height, ncols=len(runs), sharey=True)
    axes = list(getattr(axes, "flat", [axes]))
    for ax, (title, results) in zip(axes, runs.items()):
        plot_extrapolation(only(results, methods), ax=ax)
        ax.get_legend().remove()
        ax.set_xlabel("window length (bytes); grey: training length")
        ax.set_title(title, fontsize=10)
    axes[0].set_ylabel("bits per byte")
    for ax in axes[1:]:
        ax.set_ylabel("")
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="outside lower center", ncol=min(len(names), 5), fontsize=8)
    return fig


def plot_loss_by_position(
    results: dict, methods, *, window: int = 32, width: float = 8.0, height: float = 3.0
):
    """Loss (bits per byte) against the position in the window at the longest length, the
    mean over seeds smoothed over ``window`` positions, one line per method of ``methods``
    (log-scaled positions, in bytes); a grey line marks the training length, and the legend
    sits below the axes."""
    import numpy as np

    fig, ax = figure(width, height)
    for i, m in enumerate(methods):
        row = max(results["methods"][m]["eval"], key=lambda r: r["length"])
        y = np.convolve(row["loss_by_position"], np.ones(window) / window, mode="valid")
        style = method_style(m, i)
        ax.plot(
            np.arange(len(y)) + window,
            y,
            label=m,
            lw=1.2,
            color=style["color"],
            linestyle=style["linestyle"],
        )
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel(f"position in a {row['length']}-byte window (bytes; mean of {window})")
    ax.set_ylabel("bits per byte")
    fig.legend(loc="outside lower center", ncol=min(len(methods), 4), fontsize=8)
    return fig


# --- a sweep's finding in one table (chapter 8) ---------------------------------------------

#: The verdicts of :func:`trend` in a word, for a table column.
SHORT_VERDICT = {
    "improves": "improves",
    "degrades": "degrades",
    "neither degrades nor improves beyond the interval": "neither",
    "one seed, no verdict": "one seed",
}


def short_verdict(change: dict) -> str:
    """:func:`trend`'s verdict in one word: ``"improves"``, ``"degrades"``, ``"neither"``
    (the interval of the change holds 0) or ``"one seed"`` (no interval)."""
    return SHORT_VERDICT[change["verdict"]]


def change_table(results: dict, methods, *, start: int = 1, end: int | None = None):
    """Rows and headers of a narrow table, one row per method of ``methods``: bits per byte
    at ``start`` x and ``end`` x the training length (default: the longest), the per-seed
    change between them and its verdict in one word (:func:`trend`, :func:`short_verdict`),
    each number as ``mean [low, high]`` over seeds."""
    end = end or max(row["factor"] for row in results["methods"][methods[0]]["eval"])
    rows = []
    for m in methods:
        change = trend(results, m, start=start, end=end)
        rows.append(
            [
                m,
                show_interval(at_factor(results, m, start)),
                show_interval(at_factor(results, m, end)),
                show_interval(change),
                short_verdict(change),
            ]
        )
    return rows, ["method", f"{start}x", f"{end}x", "change", "verdict"]


def far_to_min_table(table) -> list[list[float]]:
    """Each row of a bucket table (heads x buckets) with every bucket past the row's minimum
    set to that minimum (the first minimum where several tie): the T5 ablation's
    ``far_to_min`` (:func:`relbias.lab.ablations.t5_details`), the near buckets unchanged."""
    out = []
    for row in table:
        row = list(row)
        b = min(range(len(row)), key=row.__getitem__)
        out.append(row[: b + 1] + [row[b]] * (len(row) - b - 1))
    return out


def plot_t5_far_end(
    ablation: dict,
    longer: dict,
    *,
    variant: str = "t5_d128_b32",
    seed: str = "0",
    width: float = 8.0,
    height: float = 3.0,
):
    """The learned T5 bias of every head of one seed against the offset (log scale): left,
    ``ablation``'s ``variant`` as trained (solid) and with the buckets past each head's
    minimum set to it (``far_to_min``, dashed); right, the sweep ``longer``'s ``t5`` of the
    same seed (its read-back per offset). Both panels share the y axis and read the offsets
    of the longer read-back; a dashed grey line marks the last offset of a training window;
    one colour per head, and one legend below the panels."""
    import matplotlib
    import torch
    from matplotlib.lines import Line2D

    from relbias.biases.t5 import t5_bucket

    spec = ablation["methods"][variant]["variant"]
    record = ablation["methods"][variant]["seeds"][seed]
    read = longer["methods"]["t5"]["seeds"][seed]["learned_bias"]["values"]
    offsets = torch.arange(len(read[0]))
    buckets = t5_bucket(
        offsets, num_buckets=spec["num_buckets"], max_distance=spec["dist_max"], bidirectional=False
    )
    trained = torch.tensor(record["bucket_table"])[:, buckets]
    changed = torch.tensor(far_to_min_table(record["bucket_table"]))[:, buckets]
    panels = {
        f"{ablation['provenance']['config']['steps']:,} steps, seed {seed}": (trained, changed),
        f"{longer['provenance']['config']['steps']:,} steps, seed {seed}": (torch.tensor(read),),
    }
    colors = matplotlib.colormaps["tab10"].colors
    fig, axes = figure(width, height, ncols=2, sharey=True)
    for ax, (title, tables) in zip(axes.flat, panels.items()):
        for table, style in zip(tables, ("-", "--")):
            for h, row in enumerate(table.tolist()):
                ax.step(offsets.numpy(), row, where="post", color=colors[h], ls=style, lw=1)
        ax.axvline(ablation["provenance"]["config"]["train_len"] - 1, color="grey", ls=":", lw=1)
        ax.set(xscale="symlog", xlim=(0, len(read[0]) - 1), xlabel="offset i - j (bytes)")
        ax.set_title(title, fontsize=10)
    axes.flat[0].set_ylabel("learned bias $u_{b(i-j)}$")
    heads = len(read)
    handles = [Line2D([], [], color=colors[h], lw=1) for h in range(heads)]
    handles += [Line2D([], [], color="black", lw=1), Line2D([], [], color="black", ls="--", lw=1)]
    names = [f"head {h}" for h in range(heads)] + ["as trained", "far buckets set to the minimum"]
    fig.legend(handles, names, loc="outside lower center", ncol=3, fontsize=8)
    return fig


def bpb_table_by_length(runs: dict, *, digits: int = 2):
    """Rows and headers of a narrow table of bits per byte, one row per evaluation length
    and one column per entry of ``runs`` (``{column title: (results, method)}``, e.g. one
    method of two sweeps, or a model as trained and with an intervention): mean [95 %
    interval] over seeds. Every entry must hold the same lengths."""
    columns = list(runs.items())
    first_results, first_method = columns[0][1]
    evals = first_results["methods"][first_method]["eval"]
    rows = []
    for row in evals:
        f = row["factor"]
        rows.append(
            [f"{row['length']} ({f}x)"]
            + [show_interval(at_factor(r, m, f), digits) for _, (r, m) in columns]
        )
    return rows, ["window (bytes)", *(title for title, _ in columns)]
