"""The issue's goals, checked against a report, and the verdicts the book quotes."""

from __future__ import annotations

import math

from relbias.bench.methods import FAST_METHODS


def index(report, pass_) -> dict:
    """The rows of one pass (``forward``, ``forward_backward``, ``memory``) by
    ``(family, n, method)``."""
    return {(r["family"], r["n"], r["method"]): r for r in report["results"] if r["pass"] == pass_}


def _best_ours(rows, family, n):
    """Our fastest non-materialising backend at (family, n): (method, row)."""
    found = [(m, rows.get((family, n, m))) for m in FAST_METHODS]
    found = [(m, r) for m, r in found if r and r.get("seconds_median")]
    return min(found, key=lambda mr: mr[1]["seconds_median"], default=(None, None))


def _seconds(rows, key):
    return rows.get(key, {}).get("seconds_median")


def _forward_goal(fwd, family, n) -> dict | None:
    method, row = _best_ours(fwd, family, n)
    if row is None:
        return None
    limit = 1.5 if family == "fire" else 1.15
    refs = {
        m: _seconds(fwd, (family, n, m)) / row["seconds_median"]
        for m in ("xt", "hf_t5")
        if _seconds(fwd, (family, n, m))
    }
    materialize = _seconds(fwd, (family, n, "materialize"))
    return {
        "backend": method,
        "ratio_to_floor": row.get("ratio_to_floor"),
        "limit": limit,
        "met": bool(row.get("ratio_to_floor", math.inf) <= limit),
        "speedup_vs_references": refs,
        "references_5x_met": all(v >= 5 for v in refs.values()) if refs else None,
        "speedup_vs_materialize": materialize / row["seconds_median"] if materialize else None,
        **{
            f"{m}_ratio_to_floor": fwd.get((family, n, m), {}).get("ratio_to_floor")
            for m in ("table", "flex", "fused")
        },
    }


#: Forward + backward at n = 2,048 within this factor of bias-free SDPA's (FIRE: 2x).
TRAINING_LIMITS = {"fire": 2.0}
TRAINING_LIMIT = 1.3


def _training_goal(bwd, family, n) -> dict | None:
    timed = [
        bwd[(family, n, m)]
        for m in ("fused", "materialize", "table")
        if _seconds(bwd, (family, n, m))
    ]
    best = min(timed, key=lambda r: r["seconds_median"], default=None)
    if best is None:
        return None
    limit = TRAINING_LIMITS.get(family, TRAINING_LIMIT)
    xt = _seconds(bwd, (family, n, "xt"))
    return {
        "backend": best["method"],
        "ratio_to_floor": best.get("ratio_to_floor"),
        "limit": limit,
        "met": bool(best.get("ratio_to_floor", math.inf) <= limit),
        "materialize_ratio_to_floor": bwd.get((family, n, "materialize"), {}).get("ratio_to_floor"),
        "speedup_vs_xt": xt / best["seconds_median"] if xt else None,
        "xt_met": (xt / best["seconds_median"] >= 1.0) if xt else None,
    }


def _memory_goal(mem, families, n, methods) -> dict:
    memory = {}
    for family in families:
        for method in methods:
            r = mem.get((family, n, method))
            if r and "ratio_to_floor" in r:
                memory.setdefault(family, {})[method] = {
                    "ratio_to_floor": r["ratio_to_floor"],
                    "extra_ratio_to_floor": r.get("extra_ratio_to_floor"),
                    "met": r["ratio_to_floor"] <= 1.5,
                }
    return memory


def evaluate_goals(report) -> dict:
    """The issue's goals, checked against this run (None where not measured)."""
    fwd, bwd, mem = (index(report, p) for p in ("forward", "forward_backward", "memory"))
    families = report["config"]["families"]
    goals = {}
    n = 4096 if any(k[1] == 4096 for k in fwd) else max((k[1] for k in fwd), default=None)
    if n is not None:
        speed = {f: _forward_goal(fwd, f, n) for f in families}
        goals[f"forward_n{n}"] = {f: g for f, g in speed.items() if g is not None}
    mem_n = max((k[1] for k in mem), default=None)
    if mem_n is not None:
        goals[f"memory_n{mem_n}"] = _memory_goal(mem, families, mem_n, FAST_METHODS)
    train_mem = index(report, "training_memory")
    train_n = max((k[1] for k in train_mem), default=None)
    if train_n is not None:
        goals[f"training_memory_n{train_n}"] = _memory_goal(
            train_mem, families, train_n, ("fused",)
        )
    bn = 2048 if any(k[1] == 2048 for k in bwd) else max((k[1] for k in bwd), default=None)
    if bn is not None:
        train = {f: _training_goal(bwd, f, bn) for f in families}
        goals[f"forward_backward_n{bn}"] = {f: g for f, g in train.items() if g is not None}
    return goals


def _goal_length(goals, prefix: str) -> int | None:
    return next((int(k[len(prefix) :]) for k in goals if k.startswith(prefix)), None)


def summary(report) -> dict:
    """Key numbers of a report for the book's prose (ranges over families)."""
    goals = report["goals"]
    fwd = next((v for k, v in goals.items() if k.startswith("forward_n")), {})
    mem = next((v for k, v in goals.items() if k.startswith("memory_n")), {})
    train_mem = next((v for k, v in goals.items() if k.startswith("training_memory_n")), {})
    bwd = next((v for k, v in goals.items() if k.startswith("forward_backward_n")), {})
    offset_only = [f for f in fwd if f != "fire"]

    def span(values):
        values = [v for v in values if v is not None]
        return (min(values), max(values)) if values else (math.nan, math.nan)

    return {
        "n_forward": _goal_length(goals, "forward_n"),
        "n_memory": _goal_length(goals, "memory_n"),
        "n_backward": _goal_length(goals, "forward_backward_n"),
        "table": span(fwd[f].get("table_ratio_to_floor") for f in offset_only),
        "flex": span(fwd[f]["flex_ratio_to_floor"] for f in offset_only),
        "fused": span(fwd[f].get("fused_ratio_to_floor") for f in offset_only),
        "fire": fwd.get("fire", {}).get("table_ratio_to_floor", math.nan),
        "fire_flex": fwd.get("fire", {}).get("flex_ratio_to_floor", math.nan),
        "fire_fused": fwd.get("fire", {}).get("fused_ratio_to_floor") or math.nan,
        "vs_references": span(v for f in fwd.values() for v in f["speedup_vs_references"].values()),
        "vs_materialize": span(f["speedup_vs_materialize"] for f in fwd.values()),
        "memory_table": span(m["table"]["ratio_to_floor"] for m in mem.values() if "table" in m),
        "memory_flex": span(m["flex"]["ratio_to_floor"] for m in mem.values() if "flex" in m),
        "memory_fused": span(m["fused"]["ratio_to_floor"] for m in mem.values() if "fused" in m),
        "backward_vs_xt": {f: g["speedup_vs_xt"] for f, g in bwd.items() if g.get("speedup_vs_xt")},
        "backward_floor": span(g["ratio_to_floor"] for f, g in bwd.items() if f != "fire"),
        "backward_fire": bwd.get("fire", {}).get("ratio_to_floor", math.nan),
        "backward_met": [f for f, g in bwd.items() if g["met"]],
        "backward_missed": [f for f, g in bwd.items() if not g["met"]],
        "n_training_memory": _goal_length(goals, "training_memory_n"),
        "training_memory_fused": span(
            m["fused"]["ratio_to_floor"] for m in train_mem.values() if "fused" in m
        ),
        "forward_met": [f for f, g in fwd.items() if g["met"]],
        "forward_missed": [f for f, g in fwd.items() if not g["met"]],
    }


def goal_rows(report) -> list[list]:
    """The issue's goals as table rows: goal, family, measured, target, met."""
    rows = []
    for name, per_family in report.get("goals", {}).items():
        for family, g in per_family.items():
            if name.startswith("forward_n"):
                measured = f"{g['backend']} {g['ratio_to_floor']:.2f}x floor"
                rows.append([name, family, measured, f"<= {g['limit']}x", g["met"]])
                for ref, speedup in g["speedup_vs_references"].items():
                    faster = f"{speedup:.1f}x faster than {ref}"
                    rows.append([name, family, faster, ">= 5x", speedup >= 5])
            elif "memory" in name:
                for method, m in g.items():
                    measured = f"{method} {m['ratio_to_floor']:.2f}x floor"
                    rows.append([name, family, measured, "<= 1.5x", m["met"]])
            else:
                measured = f"{g['backend']} {g['ratio_to_floor']:.2f}x floor"
                rows.append([name, family, measured, f"<= {g['limit']}x", g["met"]])
                if g.get("speedup_vs_xt") is not None:
                    measured = f"{g['speedup_vs_xt']:.2f}x x-transformers' speed"
                    rows.append([name, family, measured, ">= 1x", g["xt_met"]])
    return rows


def goal_summary_rows(report) -> list[list]:
    """One row per family of a report's goals, for a compact table: the family, the fastest
    backend's forward time over the floor's and its limit, the forward-plus-backward time
    over the floor's and its limit, and the fused kernel's forward peak memory over the
    floor's (NaN where the report did not measure it)."""
    goals = report.get("goals", {})
    fwd = next((v for k, v in goals.items() if k.startswith("forward_n")), {})
    bwd = next((v for k, v in goals.items() if k.startswith("forward_backward_n")), {})
    mem = next((v for k, v in goals.items() if k.startswith("memory_n")), {})
    rows = []
    for family in report["config"]["families"]:
        f, b = fwd.get(family, {}), bwd.get(family, {})
        rows.append(
            [
                family,
                f.get("ratio_to_floor", math.nan),
                f.get("limit", math.nan),
                b.get("ratio_to_floor", math.nan),
                b.get("limit", math.nan),
                mem.get(family, {}).get("fused", {}).get("ratio_to_floor", math.nan),
            ]
        )
    return rows
