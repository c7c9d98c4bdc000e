"""The notebooks whose outputs are computed from kernels and formulas (rather than read from
stored results) again under a second CPU code path: ATen's scalar kernels
(``ATEN_CPU_CAPABILITY=default``) instead of the vectorised ones this CPU picks, against the
same stored outputs. An output that depends on the last digits of a float fails here: a
reader's CPU, Colab's and CI's differ from the one that stored them.

``scripts/test.sh`` runs this file in its pool of workers, beside the other tests (it was a
step of its own after them, with one core idle): nbval in a child process, one notebook at a
time in one kernel (two kernels started at one instant once missed their 60 s start), with
an empty kernel cache, so that the fused kernel is built for this code path inside a cell
(which must change no compared output: tests/book/test_kernel_cache.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The notebooks run again: computed from kernels and formulas, and under a minute each.
SECOND_PATH = ["book/01_introduction.ipynb", "book/appendix_fast_biases.ipynb"]


@pytest.mark.slow
def test_notebooks_under_atens_scalar_code_path(tmp_path):
    env = {
        **os.environ,
        "ATEN_CPU_CAPABILITY": "default",
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "kernel_cache"),
        "OMP_NUM_THREADS": "1",
    }
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            *SECOND_PATH,
            "--nbval",
            "--nbval-kernel-name",
            "python3",
            "--nbval-sanitize-with",
            "book/sanitize.cfg",
            "--nbval-kernel-startup-timeout",
            "180",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    built = list((tmp_path / "kernel_cache").glob("relbias/*/relbias_fused_*/*.so"))
    assert [p.name for p in built] == ["relbias_fused_default.so"], built
