"""scripts/verdict_changes.py: the old rules (two ends, overlapping intervals) against the
verdict function, on synthetic sweeps whose difference is known."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from relbias.lab.summaries import summarize_extrapolation

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "verdict_changes.py"


def _script():
    spec = importlib.util.spec_from_file_location("verdict_changes", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sweep(per_method):
    def record(bpbs):
        rows = [
            {"factor": f, "length": 8 * f, "windows": 1, "bytes": 8, "bpb": b}
            for f, b in zip((1, 2, 4, 8), bpbs)
        ]
        train = {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0}
        return {"params": 1, "train": train, "eval": rows}

    methods = {
        m: summarize_extrapolation({s: record(b) for s, b in enumerate(seeds)})
        for m, seeds in per_method.items()
    }
    return {"kind": "extrapolation", "methods": methods, "seeds": [0, 1, 2], "provenance": {}}


def test_a_curve_that_turns_is_listed_with_its_turn():
    script = _script()
    # falls to 2x, rises after: the two ends agree ("neither"), the curve does not
    turn = [[2.0, 1.8, 2.0, 2.01], [2.5, 2.31, 2.5, 2.5], [3.0, 2.8, 3.01, 3.0]]
    res = _sweep({"t": turn})
    assert script.old_trend(res, "t") == "neither"
    (row,) = script.curve_changes("x", res)
    assert row[2:4] == ["neither", "improves, then degrades"] and "16 bytes" in row[4]


def test_paired_seeds_separate_what_overlapping_intervals_hid():
    script = _script()
    base = [[1.0] * 4, [2.0] * 4, [3.0] * 4]
    lower = [[v - 0.1 + e for v in s] for s, e in zip(base, (0.001, -0.001, 0.0))]
    res = _sweep({"a": lower, "b": base})
    (row,) = script.pair_changes("x", res, [("a", "b")], 8)
    assert row[2:4] == ["overlapping", "lower"] and row[4].startswith("paired by seed")
    assert script.pair_changes("x", res, [("b", "b")], 8) == []
