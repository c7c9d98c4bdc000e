"""Executing the chapters: ``python -m relbias.book execute book/<chapter>.ipynb ...``

Stores the outputs of a fresh top-to-bottom run (``CI=1``: the quick configuration on
the CPU), without widget state or timings: the outputs that nbval then compares.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

__all__ = ["execute_notebook", "main"]


def execute_notebook(path, *, timeout: int = 1800, kernel_name: str = "python3") -> float:
    """Run a chapter top to bottom in the quick configuration and store its outputs.

    The kernel runs with ``CI=1`` (the quick configuration on the CPU, as nbval in CI),
    in the notebook's folder (as nbval and the book's build run it). Widget state and
    cell timings are not stored, so the notebook changes only when its outputs do.
    Returns the wall time in seconds.
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    old = os.environ.get("CI")
    os.environ["CI"] = "1"
    start = time.perf_counter()
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            kernel_name=kernel_name,
            store_widget_state=False,
            record_timing=False,
            resources={"metadata": {"path": str(path.parent)}},
        ).execute()
    finally:
        if old is None:
            os.environ.pop("CI", None)
        else:
            os.environ["CI"] = old
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv=None) -> int:
    """``python -m relbias.book execute book/02_offset_bias.ipynb ...``"""
    parser = argparse.ArgumentParser(
        prog="python -m relbias.book",
        description="Execute book chapters in place (CI=1: quick configuration, CPU).",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("execute", help="run notebooks top to bottom and store outputs")
    run.add_argument("notebooks", nargs="+", type=Path)
    run.add_argument("--timeout", type=int, default=1800, help="seconds per cell")
    args = parser.parse_args(argv)
    for nb_path in args.notebooks:
        if not nb_path.is_file():
            parser.error(f"no such notebook: {nb_path}")
    for nb_path in args.notebooks:
        seconds = execute_notebook(nb_path, timeout=args.timeout)
        print(f"{nb_path}: executed in {seconds:.0f} s")
    return 0
