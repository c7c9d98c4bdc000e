"""The benchmark's settings: BenchConfig checks them, the command line answers bad options
with a usage error (exit code 2) naming the option. Nothing is timed here."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from relbias import bench
from relbias.bench import cli


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--lengths", "-3"], "argument --lengths: must be >= 1, got -3"),
        (["--lengths", "0,64"], "argument --lengths: must be >= 1, got 0"),
        (["--lengths", "64,x"], "argument --lengths: must be comma-separated integers"),
        (["--lengths", ","], "argument --lengths: must not be empty"),
        (["--lengths", "64,64"], "argument --lengths: repeats 64"),
        (["--repeats", "0"], "argument --repeats: must be >= 1, got 0"),
        (["--heads", "0"], "argument --heads: must be >= 1"),
        (["--head-dim", "-1"], "argument --head-dim: must be >= 1"),
        (["--threads", "0"], "argument --threads: must be >= 1"),
        (["--backward-max", "-1"], "argument --backward-max: must be >= 0"),
        (["--max-dense-gib", "-1"], "argument --max-dense-gib: must be a number >= 0"),
        (["--max-dense-gib", "nan"], "argument --max-dense-gib: must be a number >= 0"),
        (["--memory-timeout", "0"], "argument --memory-timeout: must be a number > 0"),
        (["--families", "alibi,nope"], "argument --families: unknown 'nope'; choose from"),
        (["--methods", "sdpa,nope"], "argument --methods: unknown 'nope'; choose from"),
        (["--dtype", "float16"], "argument --dtype: invalid choice"),
        (["--out", ""], "argument --out: must be a file name or '-'"),
        (["--bogus"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_options_are_usage_errors(argv, message, capsys, monkeypatch):
    def no_run(config, log):  # an option accepted by mistake must not start a benchmark
        raise AssertionError(f"accepted {argv}")

    monkeypatch.setattr(cli, "run", no_run)
    with pytest.raises(SystemExit) as err:
        bench.main(argv)
    assert err.value.code == 2
    printed = capsys.readouterr()
    assert message in printed.err and "usage: python -m relbias.bench" in printed.err
    assert printed.out == ""


@pytest.mark.slow
def test_the_module_answers_a_bad_option_without_a_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "relbias.bench", "--lengths", "-3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "argument --lengths: must be >= 1, got -3" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_options_become_a_config():
    config = bench.parse_args(
        ["--lengths", "32,48", "--families", "t5", "--methods", "sdpa,table", "--threads", "1"]
    )
    assert isinstance(config, bench.BenchConfig)
    assert (config.lengths, config.families, config.methods) == (
        [32, 48],
        ["t5"],
        ["sdpa", "table"],
    )
    assert config.threads == 1 and config.repeats is None and config.out.endswith("cpu.json")
    assert config.argv[:2] == ["--lengths", "32,48"]
    quick = bench.parse_args(["--quick", "--lengths", "64,128", "--out", "-"])
    assert (quick.repeats, quick.backward_max, quick.out) == (3, 128, "-")


def test_config_checks_its_settings():
    assert bench.BenchConfig().lengths == list(bench.FULL_LENGTHS)
    assert bench.BenchConfig(lengths=(8, 16)).lengths == [8, 16]
    assert bench.BenchConfig(max_dense_gib=math.inf).max_dense_gib == math.inf
    cases = [
        ({"lengths": [8, 2.5]}, "lengths: must be an integer, got 2.5"),
        ({"lengths": 8}, "lengths: must be a list"),
        ({"lengths": [True]}, "lengths: must be an integer"),
        ({"families": "alibi"}, "families: must be a list"),
        ({"methods": []}, "methods: must not be empty"),
        ({"repeats": 0}, "repeats: must be >= 1"),
        ({"seed": 1.5}, "seed: must be an integer"),
        ({"backward": 1}, "backward: must be True or False"),
        ({"dtype": "float16"}, "dtype: must be one of float32, bfloat16"),
    ]
    for kwargs, message in cases:
        with pytest.raises(bench.ConfigError, match=message) as err:
            bench.BenchConfig(**kwargs)
        assert isinstance(err.value, ValueError)
        assert err.value.option == "--" + next(iter(kwargs)).replace("_", "-")
    with pytest.raises(TypeError, match="BenchConfig"):
        bench.run({"lengths": [8]})


def test_compare_rejects_unknown_methods():
    with pytest.raises(ValueError, match="methods: unknown 'nope'"):
        bench.compare(16, ["alibi"], ["nope"])
