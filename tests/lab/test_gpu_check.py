"""scripts/gpu_check.py: the parts that run without a GPU, on a tiny size."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _run(*args, tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), *args],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def _tiny_chapter(folder):
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell(
            "from relbias import book as nb\nrt = nb.runtime_banner()\nassert rt.quick"
        ),
        nbformat.v4.new_code_cell("assert 1 + 1 == 3, 'a claim that fails'"),
    ]
    path = folder / "tiny_chapter.ipynb"
    nbformat.write(nb, path)
    return path


@pytest.mark.slow
def test_cpu_stages_run_and_write_one_report(tmp_path):
    chapter = _tiny_chapter(tmp_path)
    proc = _run(
        "--device", "cpu", "--smoke", "--methods", "alibi", "fire", "--budget", "600",
        "--chapters", str(chapter), "--full-methods", "alibi",
        "--families", "alibi", "t5", "fire",  # tests/core/test_flex.py compiles every family
        tmp_path=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    stages = report["stages"]
    assert list(stages) == [
        "env", "chapters", "flex_speed", "full", "train", "train_t4", "flex", "cpu_vs_gpu"
    ]  # fmt: skip
    assert report["provenance"]["budget_s"] == 600
    assert stages["env"]["torch"] and stages["env"]["autocast_dtype"] == "None"
    run = stages["chapters"]["chapters"]["tiny_chapter"]
    assert "configuration: quick" in (run.get("banner") or ""), run
    assert run["claims"] == 2
    assert [f["error"] for f in run["failed"]] == ["AssertionError"]
    assert stages["chapters"]["all_claims_held"] is False
    full = stages["full"]["methods"]["alibi"]
    assert (tmp_path / full["file"]).is_file() and set(full["bpb"]) == {"1", "2"}
    for method in ("alibi", "fire"):
        row = stages["train"]["methods"][method]
        assert row["finite"] and set(row["bpb"]) == {"1", "2"}, row
        assert stages["cpu_vs_gpu"]["methods"][method]["cpu"]
    assert stages["train_t4"] == {"seconds": stages["train_t4"]["seconds"], "skipped": "needs CUDA"}
    cases = stages["flex"]["cases"]
    assert {c["family"] for c in cases} == {"alibi", "t5", "fire"}
    for case in cases:
        assert "error" not in case, case
        assert case["out_max_abs_err"] < (1e-4 if case["dtype"] == "float32" else 0.1), case


def test_bad_arguments_are_usage_errors(tmp_path, capsys):
    """In this process (the script's parser, as ``python scripts/gpu_check.py`` runs it):
    exit code 2 and a message naming the option, no traceback."""
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    for args, option in (
        (["--stages", "env,warp"], "--stages"),
        (["--steps", "0"], "--steps"),
        (["--budget", "-1"], "--budget"),
    ):
        with pytest.raises(SystemExit) as exit_:
            script.main(["--out", str(tmp_path), *args])
        assert exit_.value.code == 2, args
        err = capsys.readouterr().err
        assert option in err and "Traceback" not in err
    assert not (tmp_path / "gpu_check.json").exists()
