"""The experiments' command line: documented errors, and a tiny run end to end."""

import json
import subprocess
import sys

import matplotlib
import pytest

from relbias.lab.cli import main
from relbias.lab.experiments import resolve_methods
from relbias.lab.model import BASELINE_POSITIONS, POSITION_NAMES

matplotlib.use("Agg")


def _error(capsys, argv):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err


def test_resolve_methods():
    assert resolve_methods(["all"]) == list(POSITION_NAMES)
    assert resolve_methods(["baselines", "rope", "alibi"]) == [*BASELINE_POSITIONS, "alibi"]
    with pytest.raises(ValueError, match="unknown method 'bogus'"):
        resolve_methods(["bogus"])


def test_unknown_method(capsys, tmp_path):
    err = _error(capsys, ["extrapolation", "--methods", "alibi", "bogus", "--out", str(tmp_path)])
    assert "unknown method 'bogus'" in err and "kerple_log" in err


@pytest.mark.parametrize("option", ["--lengths", "--steps", "--train-len"])
@pytest.mark.parametrize("value", ["0", "-3", "two"])
def test_non_positive_lengths(capsys, tmp_path, option, value):
    err = _error(capsys, ["extrapolation", option, value, "--out", str(tmp_path)])
    assert "must be an integer > 0" in err and option in err


def test_unwritable_out(capsys, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    err = _error(capsys, ["retrieval", "--out", str(blocker / "sub")])
    assert "--out" in err and "not a writable folder" in err


def test_distance_beyond_longest_sequence(capsys, tmp_path):
    err = _error(
        capsys,
        [
            "retrieval",
            "--train-len",
            "16",
            "--lengths",
            "1",
            "--distances",
            "4",
            "40",
            "--out",
            str(tmp_path),
        ],
    )
    assert "--distances [40]" in err


def test_probe_that_does_not_fit(capsys, tmp_path):
    err = _error(
        capsys,
        [
            "retrieval",
            "--train-len",
            "8",
            "--num-pairs",
            "3",
            "--distractors",
            "2",
            "--out",
            str(tmp_path),
        ],
    )
    assert "do not fit" in err
    assert "integer >= 0" in _error(capsys, ["retrieval", "--distractors", "-1"])


def test_unknown_experiment_and_config(capsys):
    assert "invalid choice" in _error(capsys, ["nonsense"])
    assert "invalid choice" in _error(capsys, ["extrapolation", "--config", "huge"])


def test_module_entry_point_errors_without_traceback(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "relbias.lab",
            "extrapolation",
            "--methods",
            "nope_x",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "unknown method 'nope_x'" in proc.stderr and "Traceback" not in proc.stderr


def test_tiny_extrapolation_run(capsys, tmp_path):
    assert (
        main(
            [
                "extrapolation",
                "--methods",
                "alibi",
                "learned",
                "--steps",
                "3",
                "--train-len",
                "8",
                "--lengths",
                "1",
                "4",
                "--out",
                str(tmp_path),
                "--no-progress",
                "--config",
                "quick",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "alibi" in out and "learned" in out
    results = json.loads((tmp_path / "extrapolation_quick.json").read_text())
    assert set(results["methods"]) == {"alibi", "learned"}
    assert [r["length"] for r in results["methods"]["alibi"]["eval"]] == [8, 32]
    assert results["corpus"]["files"] and results["provenance"]["config"]["steps"] == 3
    assert results["methods"]["alibi"]["learned_bias"]["max_offset"] == 15
    assert (tmp_path / "extrapolation_quick.png").stat().st_size > 0


def test_tiny_retrieval_run(capsys, tmp_path):
    assert (
        main(
            [
                "retrieval",
                "--methods",
                "t5",
                "--steps",
                "2",
                "--train-len",
                "8",
                "--lengths",
                "1",
                "2",
                "--distances",
                "1",
                "3",
                "10",
                "--out",
                str(tmp_path),
                "--no-progress",
            ]
        )
        == 0
    )
    results = json.loads((tmp_path / "retrieval_quick.json").read_text())
    rows = results["methods"]["t5"]["eval"]
    assert [(r["length"], r["distance"]) for r in rows] == [
        (8, 1),
        (8, 3),
        (16, 1),
        (16, 3),
        (16, 10),
    ]
    assert "accuracy" in capsys.readouterr().out


def test_seed_and_checkpoint_option_errors(capsys, tmp_path):
    out = ["--out", str(tmp_path)]
    err = _error(capsys, ["extrapolation", "--seeds", "0", "--num-seeds", "3", *out])
    assert "not allowed with argument" in err
    assert "--seeds must not repeat" in _error(capsys, ["extrapolation", "--seeds", "1", "1", *out])
    assert "integer >= 0" in _error(capsys, ["extrapolation", "--seeds", "-1", *out])
    assert "--num-seeds" in _error(capsys, ["retrieval", "--num-seeds", "0", *out])
    err = _error(capsys, ["extrapolation", "--checkpoint-minutes", "0", *out])
    assert "--checkpoint-minutes" in err and "number > 0" in err
    err = _error(capsys, ["extrapolation", "--resume", "--checkpoint-dir", str(tmp_path / "x")])
    assert "no sweep to resume" in err
    err = _error(capsys, ["retrieval", "--probe", "competing", "--competitors", "4",
                          "--train-len", "8", *out])  # fmt: skip
    assert "competing pairs do not fit" in err and "--train-len >= 19" in err
    assert "invalid choice" in _error(capsys, ["ablation", "bogus", *out])
    assert "invalid choice" in _error(capsys, ["retrieval", "--probe", "copy", *out])


def test_tiny_competing_probe_with_seeds(capsys, tmp_path):
    argv = [
        "retrieval", "--probe", "competing", "--competitors", "2", "--methods", "alibi",
        "--steps", "3", "--train-len", "12", "--lengths", "1", "2", "--num-seeds", "2",
        "--out", str(tmp_path), "--no-progress", "--config", "quick",
    ]  # fmt: skip
    assert main(argv) == 0
    res = json.loads((tmp_path / "retrieval_quick.json").read_text())
    assert res["seeds"] == [0, 1] and res["probe"]["num_competitors"] == 2
    rec = res["methods"]["alibi"]
    assert [r["distance"] for r in rec["eval"] if r["length"] == 12] == [5, 6]
    assert [r["distance"] for r in rec["eval"] if r["length"] == 24] == [5, 8, 16, 18]
    assert all(r["n"] == 2 and 0 <= r["accuracy"] <= 1 for r in rec["eval"])
    assert set(rec["seeds"]) == {"0", "1"} and rec["learned_bias"]["max_offset"] == 23
    # a finished sweep removes its checkpoints; an unfinished one is never overwritten
    assert not (tmp_path / "checkpoints").exists()
    saved = tmp_path / "checkpoints" / "retrieval_quick"
    saved.mkdir(parents=True)
    (saved / "progress.json").write_text("{}")
    err = _error(capsys, argv)
    assert "already saved" in err and "--resume" in err


def test_gate_variant_options(capsys, tmp_path):
    """--gate-bias-init reaches the forget gates, --tag names the file, both are recorded,
    and the record reads the learned gates back (on text and on probe sequences)."""
    out = ["--out", str(tmp_path)]
    err = _error(capsys, ["retrieval", "--methods", "forgetting", "alibi",
                          "--gate-bias-init", "5", *out])  # fmt: skip
    assert "--gate-bias-init" in err and "drop alibi" in err
    assert "finite" in _error(capsys, ["retrieval", "--gate-bias-init", "nan", *out])
    assert "--tag" in _error(capsys, ["retrieval", "--tag", "Init 5", *out])
    common = ["--methods", "forgetting", "--steps", "1", "--train-len", "12", "--lengths",
              "1", "2", "--no-progress", "--config", "quick", *out]  # fmt: skip
    argv = ["retrieval", "--probe", "competing", "--competitors", "1", "--seeds", "0", "1"]
    assert main([*argv, *common, "--gate-bias-init", "5", "--tag", "init5"]) == 0
    res = json.loads((tmp_path / "retrieval_quick_init5.json").read_text())
    assert res["tag"] == "init5"
    assert res["model_kwargs"] == {"bias_kwargs": {"bias_init": 5.0}}
    gate = res["methods"]["forgetting"]["learned_gate"]
    assert gate["distance"] == 8
    assert gate["tokens"] == res["provenance"]["config"]["probe_batch_size"] * 12
    # one step from b = 5: log f stays near log sigmoid(5) = -0.0067 in every layer and head
    assert all(-0.02 < v < 0 for row in gate["mean_log_forget"] for v in row)
    assert all(-0.25 < v < 0 for row in gate["bias_at_distance"] for v in row)
    assert main(["extrapolation", *common]) == 0  # the reference init: f = 0.5 at the start
    res = json.loads((tmp_path / "extrapolation_quick.json").read_text())
    gate = res["methods"]["forgetting"]["learned_gate"]
    assert "tag" not in res and "model_kwargs" not in res and "distance" not in gate
    assert all(-0.95 < v < -0.45 for row in gate["mean_log_forget"] for v in row)
