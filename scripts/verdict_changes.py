"""The verdicts of the stored sweeps that changed with the one verdict function (issue 35).

Before, a chapter read a method's extrapolation from its two ends (the per-seed change from
1x to 16x: "degrades", "improves" or "neither") and ordered two methods, or two probe
accuracies, by whether their intervals over seeds overlapped. Now every verdict goes
through :func:`relbias.lab.stats.verdict`: whole curves
(:func:`~relbias.lab.readings.method_curve`),
paired by seed where runs share seeds (:func:`~relbias.lab.readings.methods_verdict`,
:func:`~relbias.lab.readings.accuracy_verdict`), with "at the edge" where the gap is below the
evaluation's own sampling error. This script applies both rules to every stored sweep and
prints, as a Markdown table, each verdict that differs (old, new, why), for the results
README::

    python scripts/verdict_changes.py
"""

from __future__ import annotations

import sys

from relbias.lab import readings
from relbias.lab.interpolation import as_sweep
from relbias.lab.readings import at_factor, row_at
from relbias.lab.results import load_results, load_stored
from relbias.lab.stats import interval


def old_trend(results: dict, method: str) -> str:
    """The rule before: the interval of the per-seed change from 1x to the longest length."""
    records = results["methods"][method]["seeds"]
    end = max(r["factor"] for r in results["methods"][method]["eval"])
    change = interval([row_at(rec, end)["bpb"] - row_at(rec, 1)["bpb"] for rec in records.values()])
    if change["n"] < 2:
        return "one seed"
    if change["low"] > 0:
        return "degrades"
    if change["high"] < 0:
        return "improves"
    return "neither"


def old_order(a: dict, b: dict) -> str:
    """The rule before: two intervals over seeds, ordered only where they do not overlap."""
    if a["high"] < b["low"]:
        return "lower"
    if b["high"] < a["low"]:
        return "higher"
    return "overlapping"


def _why_curve(curve: dict) -> str:
    if curve["answer"].startswith("improves, then") or curve["answer"].startswith("degrades, then"):
        at = curve.get("turns_at") or curve.get("levels_from")
        return f"the whole curve: it turns at {at} bytes"
    if curve["answer"] == "at the edge":
        return "the changes lie within the text's own sampling error"
    return "the whole curve, every pair of lengths paired by seed"


def _why_pair(v: dict) -> str:
    if v["answer"] == "at the edge":
        return f"gap {v['gap']:.4f} below the sampling error {v['error']:.4f}"
    if v["answer"] == "cannot be told apart":
        return "paired by seed, the interval of the difference holds 0"
    return f"paired by seed: difference {v['mean']:+.3f} [{v['low']:+.3f}, {v['high']:+.3f}]"


def curve_changes(kind: str, results: dict) -> list[list[str]]:
    rows = []
    for m in results["methods"]:
        old = old_trend(results, m)
        new = readings.method_curve(results, m)
        if old != new["answer"]:
            rows.append([kind, f"{m}: 1x to 16x", old, new["answer"], _why_curve(new)])
    return rows


def pair_changes(kind: str, results: dict, pairs, factor: int) -> list[list[str]]:
    rows = []
    for a, b in pairs:
        old = old_order(at_factor(results, a, factor), at_factor(results, b, factor))
        new = readings.methods_verdict(results, a, b, factor)
        if (old, new["answer"]) not in (("lower", "lower"), ("higher", "higher")) and not (
            old == "overlapping" and new["answer"] == "cannot be told apart"
        ):
            rows.append([kind, f"{a} vs {b} at {factor}x", old, new["answer"], _why_pair(new)])
    return rows


def accuracy_changes(kind: str, results: dict, against: str) -> list[list[str]]:
    rows = []
    for length in readings.probe_lengths(results):
        for m in results["methods"]:
            if m == against:
                continue
            old = old_order(
                readings.accuracy_at(results, m, length),
                readings.accuracy_at(results, against, length),
            )
            new = readings.accuracy_verdict(results, m, against, length)
            same = (old, new["answer"]) in (("lower", "lower"), ("higher", "higher")) or (
                old == "overlapping" and new["answer"] == "cannot be told apart"
            )
            if not same:
                label = f"{m} vs {against}, recall at {length} tokens (farthest distance)"
                rows.append([kind, label, old, new["answer"], _why_pair(new)])
    return rows


def main() -> int:
    rows = []
    for kind in ("extrapolation", "extrapolation_15000"):
        results = load_stored(kind)
        rows += curve_changes(kind, results)
        methods = list(results["methods"])
        end = max(r["factor"] for r in results["methods"][methods[0]]["eval"])
        rows += pair_changes(
            kind, results, [(a, b) for a in methods for b in methods if a < b], end
        )
    rows += accuracy_changes("retrieval", load_stored("retrieval"), "nope")
    interp = load_results("interpolation_quick")
    tuned = as_sweep(
        interp, "finetuned", max(int(k) for k in interp["runs"][0]["finetuned"]["yarn"])
    )
    for factor in (1, 4):
        rows += pair_changes(
            "interpolation, fine-tuned",
            tuned,
            [("yarn", "yarn_no_temp"), ("linear_lr10", "none")],
            factor,
        )
    print("| sweep | verdict on | before | now | why |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(f"\n{len(rows)} verdicts changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
