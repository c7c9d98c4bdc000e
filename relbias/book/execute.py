"""Executing the chapters: ``python -m relbias.book execute book/<chapter>.ipynb ...``

:func:`execute_notebook` stores the outputs of a fresh top-to-bottom run (``CI=1``: the
quick configuration on the CPU), without widget state or timings: the outputs that nbval
then compares. :func:`chapter_report` runs a copy of a chapter as a reader would (on the
GPU, if there is one, in the configuration the runtime banner picks there), without
stopping at a failed cell, and reports its time, its peak GPU memory, the configuration
it ran and which of its asserted claims did not hold (``scripts/gpu_check.py`` runs every
chapter so).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient

__all__ = ["chapter_report", "execute_notebook", "main"]


def _execute(nb, path: Path, env, timeout: int, kernel_name: str, **client_options) -> None:
    """Run ``nb`` in its folder (``path``'s), its kernel started with the environment
    ``env`` (None: this process's), and give this process its environment back after."""
    saved = dict(os.environ)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    try:
        NotebookClient(
            nb,
            timeout=timeout,
            # A loaded 2-core machine (CI: the test pool beside the book's build) can take
            # more than nbclient's default 60 s to start a kernel; nbval gets 180 s too.
            startup_timeout=180,
            kernel_name=kernel_name,
            store_widget_state=False,
            resources={"metadata": {"path": str(path.parent)}},
            **client_options,
        ).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def execute_notebook(path, *, timeout: int = 1800, kernel_name: str = "python3") -> float:
    """Run a chapter top to bottom in the quick configuration and store its outputs.

    The kernel runs with ``CI=1`` (the quick configuration on the CPU, as nbval in CI),
    in the notebook's folder (as nbval and the book's build run it). Widget state and
    cell timings are not stored, so the notebook changes only when its outputs do.
    Returns the wall time in seconds.
    """
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    _execute(nb, path, {**os.environ, "CI": "1"}, timeout, kernel_name, record_timing=False)
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, path)
    return time.perf_counter() - start


# Appended to the copy that chapter_report runs: the peak GPU memory, as one JSON line.
_PEAK_CELL = (
    "import json as _json, torch as _torch\n"
    "print('RELBIAS-PEAK', _json.dumps(_torch.cuda.max_memory_allocated() "
    "if _torch.cuda.is_available() else None))"
)


def chapter_report(path, *, timeout: int = 1800, kernel_name: str = "python3", env=None) -> dict:
    """Run a copy of chapter ``path`` top to bottom in its folder, through every cell even
    after a failure, and report: ``seconds``, ``peak_gpu_mib`` (None on a CPU), ``banner``
    (what the runtime banner printed: the device and configuration), ``claims`` (the
    number of cells holding an ``assert``), ``failed`` (per failed cell: its index, tags,
    first line, error name and message; an ``AssertionError`` is a claim that did not hold
    on this run) and ``claims_held`` (True when no asserting cell failed). The chapter
    itself is not changed. ``env``: environment variables for the run (e.g. without
    ``CI``, which forces the quick configuration on the CPU)."""
    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(_PEAK_CELL))
    start = time.perf_counter()
    _execute(nb, path, env, timeout, kernel_name, allow_errors=True)
    seconds = time.perf_counter() - start
    failed, claims, banner, peak = [], 0, None, None
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        source = cell.source
        first = source.strip().splitlines()[0][:120] if source.strip() else ""
        claims += bool(re.search(r"^\s*assert\b", source, re.M))
        for out in cell.get("outputs", []):
            text = out.get("text", "") if out.get("output_type") == "stream" else ""
            if "configuration:" in text and banner is None:
                banner = text.strip().splitlines()[0]
            if text.startswith("RELBIAS-PEAK"):
                value = json.loads(text.split(None, 1)[1])
                peak = None if value is None else round(value / 1024**2, 1)
            if out.get("output_type") == "error":
                failed.append(
                    {
                        "cell": index,
                        "tags": list(cell.get("metadata", {}).get("tags", [])),
                        "first_line": first,
                        "error": out.get("ename"),
                        "message": str(out.get("evalue", ""))[:500],
                    }
                )
    return {
        "seconds": round(seconds, 1),
        "peak_gpu_mib": peak,
        "banner": banner,
        "claims": claims,
        "failed": failed,
        "claims_held": not any(f["error"] == "AssertionError" for f in failed),
    }


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
