"""The stored sweeps as the chapters show them: tables of mean and 95 % interval over seeds.

The numbers come from :mod:`relbias.lab.results` (the stored sweeps:
:func:`~relbias.lab.results.load_stored`) and :mod:`relbias.lab.stats` (intervals and
verdicts); the figures from
:mod:`relbias.lab.plots`. This module only lays the intervals out for
:func:`relbias.book.show_table`.
"""

from __future__ import annotations

import math

from relbias.lab.stats import accuracy_at, at_factor

__all__ = ["accuracy_table", "bpb_table", "far_accuracy_table", "show_interval"]


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


def far_accuracy_table(far: dict, *, digits: int = 2):
    """Rows and headers of a table of :func:`~relbias.lab.stats.far_accuracy`'s ``far``: each
    method's recall accuracy at the farthest distance of every tested length, mean [95 %
    interval, clipped to [0, 1]] over seeds."""
    if not far:
        raise ValueError("far must hold at least one method (relbias.lab.stats.far_accuracy)")
    methods = list(far)
    lengths = list(far[methods[0]])
    headers = ["method", *(f"{n} tokens, d = {far[methods[0]][n]['distance']}" for n in lengths)]
    rows = [[m, *(show_interval(far[m][n], digits) for n in lengths)] for m in methods]
    return rows, headers
