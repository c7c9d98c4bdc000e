"""A smoke test of the benchmark's command line at tiny sizes (nothing is timed here)."""

from __future__ import annotations

import json

import pytest

from relbias import bench

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # x-transformers


@pytest.mark.slow
@pytest.mark.reference
def test_bench_cli_writes_json(tmp_path, capsys, monkeypatch):
    out = tmp_path / "bench.json"
    calls = iter(range(100))  # every reading of the load average a new value
    monkeypatch.setattr("relbias.bench.report.os.getloadavg", lambda: (next(calls),) * 3)
    code = bench.main(
        [
            "--lengths",
            "32,48",
            "--families",
            "alibi,t5,kerple_log",
            "--methods",
            "sdpa,materialize,table,xt,hf_t5",
            "--repeats",
            "1",
            "--backward-max",
            "32",
            "--threads",
            "1",
            "--no-training-memory",  # the training step's memory: the next test
            "--out",
            str(out),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert "Forward time" in printed and "Peak memory" in printed and f"wrote {out}" in printed
    report = json.loads(out.read_text())
    # the load is read before the first measurement and again after the last
    machine = report["machine"]
    assert machine["load_average_at_start"] == [0, 0, 0]  # read first, before any timing
    assert machine["load_average_at_end"][0] > 0
    for key in ("machine", "torch", "threads", "timing_method", "memory_method", "goals"):
        assert key in report
    assert report["threads"] == 1
    rows = {(r["pass"], r["family"], r["n"], r["method"]): r for r in report["results"]}
    # the floor once per length and pass; references only for their families
    assert rows[("forward", None, 32, "sdpa")]["seconds_median"] > 0
    assert rows[("forward", "t5", 48, "hf_t5")]["ratio_to_floor"] > 0
    assert "skipped" in rows[("forward", "kerple_log", 32, "xt")]
    assert ("forward_backward", "alibi", 48, "materialize") not in rows  # n > --backward-max
    assert rows[("forward_backward", "alibi", 32, "xt")]["seconds_median"] > 0
    # every method computes the same attention as the first one measured
    for (pass_, family, n, method), row in rows.items():
        if pass_ == "forward" and method != "sdpa" and "max_abs_diff" in row:
            assert row["max_abs_diff"] < 1e-4, (family, n, method)
    memory = [r for r in report["results"] if r["pass"] == "memory"]
    assert not [r for r in report["results"] if r["pass"] == "training_memory"]
    assert {r["method"] for r in memory} == {"sdpa", "materialize", "table", "xt", "hf_t5"}
    assert not [r for r in memory if "error" in r]
    assert all(r["peak_extra_bytes"] >= 0 and r["input_bytes"] > 0 for r in memory)
    # what the book reads from a report
    assert "torch " in bench.provenance(report)
    assert bench.summary(report)["n_forward"] == 48
    assert bench.goal_rows(report)
    assert len(bench.plot_forward(report, ["alibi", "t5"]).axes) == 2
    assert bench.plot_memory(report, "t5").axes


@pytest.mark.slow
def test_bench_fused_rows_flushed_rows_training_memory_and_bfloat16(tmp_path, capsys):
    """Under PyTorch's defaults (denormals kept); the forward again with denormals flushed
    as separate rows; the fused kernel timed forward and backward, with its block counts;
    the memory of a training step; the bfloat16 accuracy; the training goal."""
    out = tmp_path / "bench.json"
    argv = "--lengths 32,48 --families alibi,fire --methods sdpa,materialize,fused "
    argv += f"--repeats 1 --threads 1 --out {out}"
    assert bench.main(argv.split()) == 0
    printed = capsys.readouterr().out
    assert "denormals flushed" in printed and "training step" in printed
    assert "bfloat16 fused kernel" in printed and "key blocks skipped" in printed
    report = json.loads(out.read_text())
    assert report["flush_denormal"] is False
    rows = {(r["pass"], r["family"], r["n"], r["method"]): r for r in report["results"]}
    fused_row = rows[("forward", "alibi", 48, "fused")]
    assert fused_row["blocks_computed"] >= 1 and fused_row["blocks_skipped"] >= 0
    assert rows[("forward_backward", "fire", 48, "fused")]["seconds_median"] > 0
    flushed = {k for k in rows if k[0] == "forward_flush_denormal"}
    assert flushed == {
        ("forward_flush_denormal", f, 48, m)
        for f, m in [
            (None, "sdpa"),
            ("alibi", "sdpa"),
            ("alibi", "fused"),
            ("fire", "sdpa"),
            ("fire", "fused"),
        ]
    }
    training = [r for r in report["results"] if r["pass"] == "training_memory"]
    assert {(r["family"], r["method"]) for r in training} == {
        (None, "sdpa"),
        ("alibi", "materialize"),
        ("alibi", "fused"),
        ("fire", "materialize"),
        ("fire", "fused"),
    }
    assert all(r["peak_bytes"] > 0 and "error" not in r for r in training)
    accuracy = report["bfloat16_accuracy"]
    assert accuracy["n"] == 48 and set(accuracy["families"]) == {"alibi", "fire"}
    for a in accuracy["families"].values():
        assert 0 < a["vs_float32"]["output"] < 0.05
        assert 0 <= a["same_inputs"]["output"] <= 2**-8
    goal = report["goals"]["forward_backward_n48"]["fire"]
    assert goal["limit"] == 2.0 and goal["backend"] in ("fused", "materialize")
    assert report["goals"]["training_memory_n48"]["alibi"]["fused"]["ratio_to_floor"] > 0
    summary = bench.summary(report)
    assert summary["n_training_memory"] == 48 and summary["n_backward"] == 48


def test_bench_rejects_unknown_names():
    with pytest.raises(SystemExit):
        bench.parse_args(["--families", "nope"])
    with pytest.raises(SystemExit):
        bench.parse_args(["--methods", "nope"])


def test_quick_defaults():
    args = bench.parse_args(["--quick"])
    assert args.lengths == list(bench.QUICK_LENGTHS)
    assert args.out.endswith("cpu-quick.json")
    full = bench.parse_args([])
    assert full.lengths == list(bench.FULL_LENGTHS)
    assert not full.flush_denormal and full.flush_denormal_rows  # PyTorch's default first
    assert bench.parse_args(["--flush-denormal"]).flush_denormal


def test_stored_reports_load_by_name():
    from relbias import bench

    full, quiet = bench.load_report(), bench.load_report(name="cpu_n4096_quiet")
    assert full["config"]["lengths"][-1] == 16384
    assert quiet["config"]["lengths"] == [4096]
    assert set(quiet["goals"]["forward_n4096"]) == set(full["config"]["families"])
    gate = bench.load_report(name="cpu_n4096_quiet_forgetting")  # added with the forget gate
    assert set(gate["goals"]["forward_n4096"]) == {"forgetting"} and not gate["flush_denormal"]
    with pytest.raises(ValueError, match="name must be a file name"):
        bench.load_report(name="../cpu")
    with pytest.raises(ValueError, match="no stored benchmark named 'gpu'"):
        bench.load_report(name="gpu")


def _table_tiles():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "table_tiles.py"
    spec = importlib.util.spec_from_file_location("table_tiles", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_tiles_script_runs(capsys, monkeypatch):
    """benchmarks/table_tiles.py at a tiny size: it prints every strategy, its tiles the
    ones asked for (passed to table_attention, no module setting changed)."""
    from relbias.attention import table

    seen = []
    real = table.table_attention

    def spy(*args, **kwargs):
        seen.append((kwargs.get("tile_rows"), kwargs.get("strip_rows")))
        return real(*args, **kwargs)

    monkeypatch.setattr(table, "table_attention", spy)
    code = _table_tiles().main(
        [
            "--n",
            "40",
            "--tile",
            "16",
            "--strip",
            "8",
            "--rounds",
            "1",
            "--heads",
            "2",
            "--head-dim",
            "8",
            "--families",
            "alibi",
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    for name in ("floor", "alibi tiles", "alibi blocks of 256"):
        assert name in printed
    assert (16, 8) in seen


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--tile", "100", "--strip", "30"], "multiple of --strip"),
        (["--n", "0"], "--n must be >= 1"),
        (["--families", "fire"], "invalid choice"),
    ],
)
def test_table_tiles_script_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit) as err:
        _table_tiles().main(argv)
    assert err.value.code == 2
    assert message in capsys.readouterr().err


def _train_speed():
    """benchmarks/train_speed.py as a module (the scripts are not installed)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "train_speed.py"
    spec = importlib.util.spec_from_file_location("train_speed", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_train_speed_reports_the_ratio_to_nope_and_the_backend(tmp_path, capsys):
    out = tmp_path / "speed.json"
    argv = "--methods nope alibi fire --steps 2 --warmup-steps 1 --no-eval "
    argv += f"--dim 32 --heads 2 --train-len 32 --batch-size 2 --out {out}"
    assert _train_speed().main(argv.split()) == 0
    printed = capsys.readouterr().out
    assert "vs nope" in printed and "width 32, 2 heads" in printed
    report = json.loads(out.read_text())
    rows = {r["method"]: r for r in report["rows"]}
    assert rows["nope"]["ratio_to_nope"] == 1.0 and rows["nope"]["backend"] == "sdpa (no bias)"
    assert rows["alibi"]["backend"] == rows["fire"]["backend"] == "fused"  # training on the CPU
    assert rows["fire"]["ratio_to_nope"] > 0 and rows["fire"]["seconds_per_step"] > 0
    assert report["config"]["train_len"] == 32 and len(report["load_average_at_start"]) == 3
    assert report["commit"] is None or len(report["commit"]) >= 40


@pytest.mark.parametrize(
    "argv,message",
    [(["--steps", "0"], "--steps must be > 0"), (["--methods", "nope_x"], "unknown method")],
)
def test_train_speed_rejects_bad_arguments(argv, message, capsys):
    with pytest.raises(SystemExit):
        _train_speed().main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.slow
def test_bench_times_the_forget_gate_like_a_position_family(tmp_path):
    """The forget gate reads a seeded input per length, prepared inside every timed call;
    every backend agrees with the materialised one, forward and backward, and the training
    memory and bfloat16 rows exist as for the other families."""
    out = tmp_path / "bench.json"
    argv = "--lengths 40 --families forgetting --methods sdpa,materialize,table,flex,fused "
    argv += f"--repeats 1 --threads 1 --out {out}"
    assert bench.main(argv.split()) == 0
    report = json.loads(out.read_text())
    assert "forget gate" in report["config"]["family_notes"]["forgetting"]
    rows = {(r["pass"], r["method"]): r for r in report["results"] if r["family"] == "forgetting"}
    for method in ("table", "flex", "fused"):
        assert rows[("forward", method)]["max_abs_diff"] < 1e-5
    assert rows[("forward_backward", "fused")]["seconds_median"] > 0
    assert "skipped" in rows[("forward_backward", "flex")]  # no FlexAttention backward on CPU
    assert 0 < report["bfloat16_accuracy"]["families"]["forgetting"]["vs_float32"]["output"] < 0.05
    assert "forgetting" in report["goals"]["forward_n40"]
