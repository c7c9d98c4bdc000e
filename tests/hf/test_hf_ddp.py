"""The same Trainer script under torchrun (DDP, two processes, gloo on the CPU) gives the
one-process loss curve for the same global batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relbias.hf import train

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--family", "kerple_log", "--steps", "20", "--global-batch", "16", "--seq-len", "32"]


@pytest.mark.slow
def test_torchrun_two_processes_give_the_one_process_loss_curve(tmp_path):
    one = train.main([*ARGS, "--out", str(tmp_path / "one.json")])
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run(
        [str(torchrun), "--nproc_per_node", "2", "-m", "relbias.hf.train", *ARGS]
        + ["--out", str(tmp_path / "two.json")],
        cwd=ROOT,
        env=env,
        check=True,
        timeout=600,
        capture_output=True,
    )
    two = json.loads((tmp_path / "two.json").read_text())
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert len(one["losses"]) == len(two["losses"]) == 4
    assert one["losses"][-1] < one["losses"][0] - 1.0
    assert two["losses"] == pytest.approx(one["losses"], rel=1e-5)
    assert two["held_out_after"] == pytest.approx(one["held_out_after"], rel=1e-5)
