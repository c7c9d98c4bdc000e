"""What nbval compares does not depend on the fused kernel's cache: a first build of the
kernel inside a notebook cell (an empty ``TORCH_EXTENSIONS_DIR``) adds no output to the
cell. Here on this CPU's own code path; on ATen's scalar one (the test command's second code
path) tests/book/test_second_code_path.py runs its notebooks with an empty cache, so that
the appendix builds the kernel inside a cell. The build is logged, not printed
(``relbias.attention.fused``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[2]

# The cell trains nothing: it runs one fused attention, which builds the kernel first, and
# prints whether this kernel compiled it (True, since the cache is empty) and a value.
CELL = """\
import torch
import relbias
from relbias.attention import fused

q, k, v = torch.randn(3, 1, 2, 40, 16, generator=torch.Generator().manual_seed(0)).unbind(0)
out = relbias.biased_attention(q, k, v, relbias.ALiBi(2), causal=True, backend="fused")
reference = relbias.biased_attention(q, k, v, relbias.ALiBi(2), causal=True,
                                     backend="materialize")
print("compiled here:", fused.build_info()["compiled"])
print("equal to the materialised bias:", torch.allclose(out, reference, atol=1e-5))
"""


@pytest.mark.slow
def test_a_first_build_inside_a_cell_changes_no_compared_output(tmp_path):
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell(CELL, execution_count=1)
    cell.outputs = [
        nbformat.v4.new_output(
            "stream",
            name="stdout",
            text="compiled here: True\nequal to the materialised bias: True\n",
        )
    ]
    nb.cells = [cell]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    path = tmp_path / "first_build.ipynb"
    nbformat.write(nb, path)
    cache = tmp_path / "empty_cache"
    cache.mkdir()
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(cache), "OMP_NUM_THREADS": "1"}
    env.pop("ATEN_CPU_CAPABILITY", None)  # this CPU's own code path
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            str(path),
            "--nbval",
            "--nbval-kernel-name",
            "python3",
            "--nbval-kernel-startup-timeout",
            "180",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-q",
            f"--rootdir={tmp_path}",
        ],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert "1 passed" in proc.stdout
    built = list((cache / "relbias").glob("*/relbias_fused_*/*.so"))
    assert len(built) == 1, built  # the cell did build it, into the empty cache
