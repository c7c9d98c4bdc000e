"""``python -m relbias.demo`` runs and shows every family."""

import subprocess
import sys

import relbias


def test_demo_lists_every_family():
    proc = subprocess.run(
        [sys.executable, "-m", "relbias.demo"], capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line.strip()}
    missing = [name for name in relbias.BIAS_NAMES if name not in rows]
    assert not missing, proc.stdout
