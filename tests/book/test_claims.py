"""Every verdict a chapter states goes through the one verdict function.

Each chapter asserts its findings about the stored runs in one hidden cell tagged ``claims``
(:mod:`relbias.book.claims`). This file runs every such cell on its own (it reads stored
results only), so that a claim the verdict function does not give fails here, without
executing the chapter; and it reads every chapter's code for orderings decided elsewhere:
an ``assert`` that compares the means or ends of intervals itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import matplotlib
import pytest

from relbias.book import claims
from relbias.lab import readings

matplotlib.use("Agg")

BOOK = Path(__file__).resolve().parents[2] / "book"
CHAPTERS = sorted(p for p in BOOK.glob("[0-9]*.ipynb"))


def _lab_of(lesson: Path) -> Path:
    return lesson.with_name(f"{lesson.stem}_lab.ipynb")


#: Chapters whose findings rest on stored runs: each has one claims cell, in its lab notes
#: (``NN_name_lab.ipynb``) where the chapter has them, else in the chapter's one page.
WITH_FINDINGS = [
    _lab_of(p) if _lab_of(p).is_file() else p
    for p in CHAPTERS
    if not p.stem.endswith("_lab") and (_lab_of(p).is_file() or not p.name.startswith("01"))
]
#: Lessons with lab notes: their claims live in the lab notes, not on the lesson.
LESSONS_WITH_LABS = [p for p in CHAPTERS if not p.stem.endswith("_lab") and _lab_of(p).is_file()]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def claims_cells(path: Path) -> list[str]:
    return [
        _source(c)
        for c in _cells(path)
        if c["cell_type"] == "code" and "claims" in c.get("metadata", {}).get("tags", [])
    ]


@pytest.mark.parametrize("path", WITH_FINDINGS, ids=lambda p: p.stem)
def test_every_claim_is_the_verdict_functions(path):
    cells = claims_cells(path)
    assert len(cells) == 1, f"{path.name}: {len(cells)} cells tagged 'claims', want one"
    source = cells[0]
    assert "claims.check(" in source, f"{path.name}: the claims cell must call claims.check"
    namespace: dict = {}
    exec(compile(source, f"{path.name}:claims", "exec"), namespace)  # raises ClaimError


@pytest.mark.parametrize("path", LESSONS_WITH_LABS, ids=lambda p: p.stem)
def test_a_lesson_leaves_its_claims_to_its_lab_notes(path):
    assert not claims_cells(path), f"{path.name}: the claims cell belongs in its lab notes"


# An ordering decided by hand: an assert comparing an interval's mean, low or high end.
HAND_ORDER = re.compile(
    r"""\[\s*["'](mean|low|high)["']\s*\]\s*[<>]|[<>]=?\s*[\w.]+(\[[^\]]+\])*\[\s*["'](mean|low|high)["']\s*\]"""
)


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_no_chapter_orders_results_by_hand(path):
    found = []
    for i, cell in enumerate(_cells(path)):
        if cell["cell_type"] != "code":
            continue
        for line in _source(cell).splitlines():
            if line.strip().startswith("assert") and HAND_ORDER.search(line):
                found.append(f"cell {i}: {line.strip()}")
    assert not found, (
        f"{path.name} orders results without the verdict function (use relbias.book.claims):\n"
        + "\n".join(found)
    )


def test_the_lint_finds_hand_orderings():
    assert HAND_ORDER.search('assert a["mean"] < b["mean"]')
    assert HAND_ORDER.search("assert gain['high'] < 0")
    assert HAND_ORDER.search('assert x > far["alibi"][n]["low"]')
    assert not HAND_ORDER.search('assert v["answer"] == "lower"')
    assert not HAND_ORDER.search("assert gap < 0.05")


# --- the claims module itself ----------------------------------------------------------------
def _sweep():
    from relbias.lab.summaries import summarize_extrapolation

    def record(bpbs, seed):
        rows = [
            {"factor": f, "length": 8 * f, "windows": 1, "bytes": 8, "bpb": b + 0.1 * seed}
            for f, b in zip((1, 2, 4), bpbs)
        ]
        train = {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0}
        return {"params": 1, "train": train, "eval": rows}

    per = {"flat": [1.0, 1.0, 1.0], "worse": [1.0, 1.5, 2.0]}
    methods = {
        m: summarize_extrapolation({s: record(b, s) for s in range(3)}) for m, b in per.items()
    }
    for m in methods:  # a small spread, so that the paired intervals are not points
        for s, rec in methods[m]["seeds"].items():
            rec["eval"][1]["bpb"] += 0.01 * (int(s) - 1) ** 2
    return {"kind": "extrapolation", "methods": methods, "seeds": [0, 1, 2], "provenance": {}}


def test_check_returns_the_verdicts_and_names_every_wrong_claim():
    res = _sweep()
    got = claims.check(
        [
            claims.curve(res, "worse", "degrades"),
            claims.methods(res, "flat", "worse", 4, "lower"),
        ]
    )
    assert got["worse curve"]["answer"] == "degrades"
    assert got["flat vs worse at 4x"]["paired"]
    with pytest.raises(claims.ClaimError, match=r"flat curve: the chapter says 'improves'"):
        claims.check(
            [claims.curve(res, "flat", "improves"), claims.curve(res, "worse", "degrades")]
        )
    with pytest.raises(ValueError, match="expect must be one of"):
        claims.curve(res, "flat", "better")
    with pytest.raises(ValueError, match="unique"):
        claims.check([claims.curve(res, "flat", "improves")] * 2)


def test_paired_claims_and_their_answers():
    assert claims.paired("d", [0.1, 0.2, 0.15], None, "higher").holds
    assert not claims.paired("d", [0.1, -0.2, 0.15], None, "higher").holds
    assert set(readings.CONTEXT_WORDS.values()) >= {"uses the far context"}
