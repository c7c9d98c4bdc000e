"""The appendix's (making biases fast) readings of the stored benchmark runs.

The benchmark (:mod:`relbias.bench`) times, for each family and length, the floor
(causal attention without a bias) and every method *in turn within each repeat*, so the
repeats of one run pair them: :func:`repeat_claim` compares two of them repeat by repeat
with the one verdict function (:func:`relbias.book.claims.paired`), the repeats taking the
place of seeds. That interval measures the spread within one run only; how far a ratio
moves between runs is what the stored rerun shows.

- :func:`walls`: the timed samples (seconds) of one method, family and length;
- :func:`repeat_claim`: ``a`` against ``scale`` x ``b``, repeat by repeat (a goal: the
  fused kernel against the goal's multiple of the floor);
- :func:`trained_biases`: the offset-only bias a stored text model learned (its library
  number at offsets ``0 .. n-1``), as an :class:`relbias.OffsetBias` the kernel can run;
- :func:`provenance_rows`: where the stored benchmark files come from;
- :func:`run_provenance`: one stored benchmark run in full.

:mod:`relbias.bench` reads the load average it stores as ``load_average_at_start`` after
every measurement, when it builds the report: it is the load at the run's *end* (and
``created`` is the finishing time). ``benchmarks/train_speed.py`` reads its load before
any work.
"""

from __future__ import annotations

import torch

import relbias
from relbias import bench
from relbias.book import claims
from relbias.book import kerple_heads as kh

__all__ = [
    "provenance_rows",
    "repeat_claim",
    "run_provenance",
    "trained_biases",
    "training_length",
    "walls",
]


def walls(report: dict, family: str, n: int, method: str, pass_: str = "forward") -> list:
    """The wall-clock samples of ``method`` for ``family`` at length ``n`` (one per repeat,
    in the order the repeats ran)."""
    row = bench.rows_of_pass(report, pass_)[(family, n, method)]
    return list(row["wall"])


def repeat_claim(
    name: str,
    report: dict,
    family: str,
    n: int,
    a: str,
    b: str,
    expect: str,
    *,
    scale: float = 1.0,
    pass_: str = "forward",
) -> claims.Claim:
    """``a``'s time against ``scale`` times ``b``'s, paired by repeat: "lower" means
    ``a`` took less than ``scale`` x ``b`` in every reading the interval allows."""
    mine = walls(report, family, n, a, pass_)
    other = [scale * t for t in walls(report, family, n, b, pass_)]
    return claims.paired(name, mine, other, expect)


def trained_biases(results: dict, method: str, seed: str, n: int) -> relbias.OffsetBias:
    """The causal bias of one stored run of ``method`` (ALiBi or a Kerple form), from its
    trained ``(r1, r2)`` (:func:`relbias.book.kerple_heads.stored_heads`), at offsets
    ``0 .. n-1`` as an offset table: the library's number :math:`b = \\mathrm{PE}/\\sqrt{d}`, added
    after the attention scaling (the book's PE sits inside it)."""
    r1, r2 = kh.stored_heads(results, method)[seed]
    table = -kh.penalty_at(r1, r2, kh.FORMS[method], range(n))
    bias = relbias.OffsetBias(len(r1), max_offset=n - 1)
    with torch.no_grad():
        bias.weight.copy_(table.float())
    return bias


def provenance_rows(names) -> list[list]:
    """One row per stored benchmark file: its name, what it measured, the repeats, the
    load average (1 minute) and when it was read (a :mod:`relbias.bench` run: at its end;
    the training-speed script: at its start), the commit and the date."""
    rows = []
    for name in names:
        run = bench.load_report(name=name)
        if "results" in run:  # a relbias.bench report
            what = run["command"].removeprefix("python -m relbias.bench ")
            repeats = run["config"]["repeats"]
            load = run["machine"]["load_average_at_start"][0]  # read at the run's end
            when = "end"
            created = run["created"]
        else:  # a benchmarks/train_speed.py record
            what = run["command"].split(" --out ")[0].removeprefix("benchmarks/")
            repeats = f"{run['steps']} steps"
            load = run["load_average_at_start"][0]
            when = "start"
            created = run["created_utc"]
        commit = run["commit"]
        state = " (uncommitted changes)" if commit.endswith("+dirty") else ""
        rows.append(
            [
                f"{name}.json",
                what,
                repeats,
                f"{load:.1f} ({when})",
                commit[:12] + state,
                created[:10],
            ]
        )
    return rows


def run_provenance(report: dict) -> str:
    """Where and how one stored :mod:`relbias.bench` run was measured: when it finished,
    how long it ran, and the load average read at its end."""
    m, cfg = report["machine"], report["config"]
    commit = str(report.get("commit"))
    state = " (uncommitted changes)" if commit.endswith("+dirty") else ""
    load = ", ".join(f"{x:.1f}" for x in m.get("load_average_at_start", []))
    return (
        f"finished {report['created']} after {report['elapsed_seconds'] / 60:.0f} minutes "
        f"on {m.get('cpu', m.get('machine'))} ({m.get('cpu_count')} cores, "
        f"{report['threads']} torch threads), torch {report['torch']}, {cfg['dtype']}, "
        f"batch {cfg['batch']}, {cfg['heads']} heads of dimension {cfg['head_dim']}, causal; "
        f"flush denormals: {report['flush_denormal']}; load average (1, 5, 15 min) read at "
        f"the end of the run: {load}; command: {report['command']}; "
        f"commit {commit[:12]}{state}"
    )


def training_length(results: dict) -> int:
    """The training length (bytes) of a stored sweep's models."""
    return results["provenance"]["config"]["train_len"]
