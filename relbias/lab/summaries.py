"""A sweep's records summarised over seeds, as a result file stores them.

- :func:`summarize_extrapolation`: one method's text records (bits per byte by length, the
  loss by position, the context-use measure) as means with 95 % intervals over seeds;
- :func:`summarize_retrieval`: one method's probe records (accuracy by length and distance);
- :func:`summarize_interventions`: an ablation's readings of the same weights, summarised
  the same way;
- :func:`train_summary`: the training side (steps, loss, time, each run's last-fifth fall).

Every interval is :func:`relbias.lab.stats.interval`'s; reading a stored summary back is
:mod:`relbias.lab.readings`'.
"""

from __future__ import annotations

import statistics

from relbias.lab.stats import interval, last_fifth_fall, paired_interval


def summarize_extrapolation(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's records ``{seed: record}`` as a summary over seeds.

    ``eval`` rows hold the mean ``bpb`` and its t-interval (``bpb_low``, ``bpb_high``,
    ``bpb_sd``, ``n``) per length, the bytes and files read, and the mean loss by
    position (None where a record lacks its own: a compact file's); ``learned_bias`` is
    the first seed's; ``seeds`` keeps every record.
    """
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        values = [per_seed[s]["eval"][i]["bpb"] for s in seeds]
        iv = interval(values, confidence)
        positions = [per_seed[s]["eval"][i].get("loss_by_position") for s in seeds]
        summary = {k: row[k] for k in ("factor", "length", "windows", "bytes") if k in row}
        if "files" in row:
            summary["files"] = row["files"]
        summary.update(
            bpb=iv["mean"],
            bpb_low=iv["low"],
            bpb_high=iv["high"],
            bpb_sd=iv["sd"],
            n=iv["n"],
            loss_by_position=(
                None
                if any(p is None for p in positions)
                else [round(statistics.fmean(at), 4) for at in zip(*positions)]
            ),
        )
        contexts = [per_seed[s]["eval"][i].get("context") for s in seeds]
        if all(c is not None for c in contexts):
            summary["context"] = _context_summary(contexts, confidence)
        rows.append(summary)
    return {
        "params": first["params"],
        "train": train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def _context_summary(contexts: list, confidence: float) -> dict:
    """The context-use measure of one length over seeds: intervals of the long and the
    sliding reading and of their paired difference, and the sliding reading's mean loss by
    position (the verdict itself: :func:`relbias.lab.readings.context_verdict`)."""
    sliding = [c.get("sliding_loss_by_position") for c in contexts]
    return {
        "window": contexts[0]["window"],
        "stride": contexts[0]["stride"],
        "long_bpb": interval([c["long_bpb"] for c in contexts], confidence),
        "sliding_bpb": interval([c["sliding_bpb"] for c in contexts], confidence),
        "difference": paired_interval([c["difference"] for c in contexts], None, confidence),
        "sliding_loss_by_position": (
            None
            if any(p is None for p in sliding)
            else [round(statistics.fmean(at), 4) for at in zip(*sliding)]
        ),
    }


def summarize_retrieval(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's probe records ``{seed: record}``: mean accuracy and t-interval per
    (length, distance), every seed's record under ``"seeds"``."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        iv = interval([per_seed[s]["eval"][i]["accuracy"] for s in seeds], confidence)
        rows.append(
            {
                "length": row["length"],
                "distance": row["distance"],
                "samples": row["samples"],
                "accuracy": iv["mean"],
                "accuracy_low": iv["low"],
                "accuracy_high": iv["high"],
                "accuracy_sd": iv["sd"],
                "n": iv["n"],
            }
        )
    return {
        "params": first["params"],
        "train": train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def train_summary(per_seed: dict) -> dict:
    """The training side of one method's records over seeds: steps, mean final loss, total
    time, mean throughput, and under ``val_levelled`` each run's fall over the last fifth of
    training (:func:`relbias.lab.stats.last_fifth_fall`; the stored key's name is kept)."""
    trains = [rec["train"] for rec in per_seed.values()]
    out = {
        "steps": trains[0]["steps"],
        "final_loss_bits": statistics.fmean(t["final_loss_bits"] for t in trains),
        "wall_s": sum(t["wall_s"] for t in trains),
        "tokens_per_s": statistics.fmean(t["tokens_per_s"] for t in trains),
    }
    curves = [t["val_curve"] for t in trains if len(t.get("val_curve", ())) >= 2]
    if curves:
        out["val_levelled"] = [last_fifth_fall(c) for c in curves]
    return out


def summarize_interventions(per_seed: dict, summarize) -> dict:
    """Each intervention of the records ``{seed: record}`` over seeds: its evaluation rows
    summarised as the plain ones (``summarize``), and a t-interval of every number it
    holds per seed (``within_train_len_bpb``, ...)."""
    records = list(per_seed.values())
    out = {}
    for name, first in records[0].get("interventions", {}).items():
        as_plain = {s: {**r, "eval": r["interventions"][name]["eval"]} for s, r in per_seed.items()}
        summary = {"eval": summarize(as_plain)["eval"]}
        for key, value in first.items():
            if isinstance(value, float):
                summary[key] = interval([r["interventions"][name][key] for r in records])
        out[name] = summary
    return out
