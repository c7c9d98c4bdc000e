"""The appendix (making biases fast): the goals table, its lesson and lab notes, and the
readings of relbias.book.fast_biases."""

from __future__ import annotations

import math
from pathlib import Path

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


# --- the split: a lesson and its lab notes (relbias.book.fast_biases) ---------------------------

BOOK = Path(__file__).resolve().parents[2] / "book"


def _cells(name: str) -> list[dict]:
    import json

    return json.loads((BOOK / name).read_text(encoding="utf-8"))["cells"]


def _tagged(name: str, tag: str) -> list[str]:
    return [
        "".join(c["source"])
        for c in _cells(name)
        if c["cell_type"] == "code" and tag in c.get("metadata", {}).get("tags", [])
    ]


def test_the_claims_live_in_the_lab_notes_and_hold():
    assert not _tagged("appendix_fast_biases.ipynb", "claims")
    (cell,) = _tagged("appendix_fast_biases_lab.ipynb", "claims")
    namespace: dict = {}
    exec(compile(cell, "appendix_fast_biases_lab:claims", "exec"), namespace)
    claimed = namespace["claimed"]
    assert claimed["full run: alibi within its forward goal"]["answer"] == "lower"
    assert claimed["full run: sandwich within its forward goal"]["answer"] == "higher"
    assert all(v["paired"] for v in claimed.values())
    # forward plus backward against the floor: the offset table (no block skipped) below it,
    # FIRE above it at 2,048 tokens only
    assert claimed["training: offset against the floor at 2048"]["answer"] == "lower"
    assert claimed["training: fire against the floor at 512"]["answer"] == "cannot be told apart"
    assert claimed["training: fire against the floor at 2048"]["answer"] == "higher"


def test_the_lab_notes_hold_every_section_the_lesson_links_to():
    import re

    lesson = "\n".join("".join(c["source"]) for c in _cells("appendix_fast_biases.ipynb"))
    lab = "\n".join("".join(c["source"]) for c in _cells("appendix_fast_biases_lab.ipynb"))
    linked = set(re.findall(r"<(sec-app-[\w-]+)>`", lesson))
    labels = set(re.findall(r"^\((sec-app-[\w-]+)\)=", lab, re.M))
    assert linked and linked <= labels


def test_repeat_claim_pairs_the_repeats():
    from relbias.book import fast_biases as fb

    report = bench.load_report()
    fused = fb.walls(report, "alibi", 4096, "fused")
    floor = fb.walls(report, "alibi", 4096, "sdpa")
    assert len(fused) == len(floor) == 3
    claim = fb.repeat_claim("x", report, "alibi", 4096, "fused", "sdpa", "lower", scale=1.15)
    assert claim.holds and claim.verdict["n"] == 3
    diffs = [a - 1.15 * b for a, b in zip(fused, floor)]
    assert math.isclose(claim.verdict["mean"], sum(diffs) / 3)


def test_trained_biases_are_the_heads_formula():
    import torch

    from relbias.book import fast_biases as fb
    from relbias.book import kerple_heads as kh
    from relbias.book import sweeps

    longer = sweeps.stored_once("extrapolation_15000")
    assert fb.training_length(longer) == longer["provenance"]["config"]["train_len"]
    for method in ("alibi", "kerple_power", "kerple_log"):
        bias = fb.trained_biases(longer, method, "0", 64)
        r1, r2 = kh.stored_heads(longer, method)["0"]
        expected = -kh.penalty_at(r1, r2, kh.FORMS[method], range(64)).float()
        torch.testing.assert_close(bias.offset_table(0, 63).float(), expected)


def test_provenance_rows_name_each_file_and_its_state():
    from relbias.book import fast_biases as fb

    rows = fb.provenance_rows(["cpu", "cpu_n4096_quiet", "train_speed_cpu_auto"])
    assert [r[0] for r in rows] == ["cpu.json", "cpu_n4096_quiet.json", "train_speed_cpu_auto.json"]
    assert "uncommitted" not in rows[0][4] and "uncommitted" in rows[1][4]
    assert rows[2][2] == "20 steps"
    # relbias.bench reads its load average at the run's end, train_speed.py at its start
    assert [r[3].split()[-1] for r in rows] == ["(end)", "(end)", "(start)"]


def test_run_provenance_says_when_the_load_was_read_and_the_tree_state():
    from relbias import bench
    from relbias.book import fast_biases as fb

    full, rerun = (fb.run_provenance(bench.load_report(name=n)) for n in ("cpu", "cpu_n4096_quiet"))
    assert "read at the end of the run" in full and "at the start" not in full
    assert "uncommitted" not in full and "(uncommitted changes)" in rerun
    assert full.startswith("finished ") and "after 34 minutes" in full
