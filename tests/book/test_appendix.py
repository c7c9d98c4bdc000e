"""The helper the appendix (making biases fast) adds: a compact table of the goals."""

from __future__ import annotations

import math

from relbias import bench


def test_goal_summary_rows_read_the_reports_goals():
    report = bench.load_report()
    rows = bench.goal_summary_rows(report)
    assert [r[0] for r in rows] == report["config"]["families"]
    goals = report["goals"]
    fwd = next(v for k, v in goals.items() if k.startswith("forward_n"))
    bwd = next(v for k, v in goals.items() if k.startswith("forward_backward_n"))
    mem = next(v for k, v in goals.items() if k.startswith("memory_n"))
    for family, forward, limit, training, training_limit, memory in rows:
        assert forward == fwd[family]["ratio_to_floor"] and limit == fwd[family]["limit"]
        assert training == bwd[family]["ratio_to_floor"]
        assert training_limit == bwd[family]["limit"]
        assert memory == mem[family]["fused"]["ratio_to_floor"]


def test_goal_summary_rows_leave_gaps_where_nothing_was_measured():
    report = bench.load_report(name="cpu_n4096_quiet")
    rows = bench.goal_summary_rows(report)
    assert rows and all(math.isnan(r[3]) and math.isnan(r[5]) for r in rows)
    assert all(not math.isnan(r[1]) for r in rows)
