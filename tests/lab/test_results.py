"""The results store: compact copies, writing and reading by name, provenance of the checkout."""

from __future__ import annotations

import json
import subprocess

import pytest

from relbias.lab import results
from relbias.lab.config import get_config


def _sweep():
    return json.loads(json.dumps(_sweep_with_tuples()))


def _sweep_with_tuples():
    record = {
        "train": {"steps": 3, "losses": [3.0, 2.0, 1.0], "final_loss_bits": 1.0},
        "eval": [{"factor": 1, "bpb": 1.5, "loss_by_position": [1.4, 1.6]}],
    }
    return {
        "kind": "extrapolation",
        "methods": {
            "alibi": {
                "train": {"steps": 3, "final_loss_bits": 1.0},
                "eval": [{"factor": 1, "bpb": 1.5, "loss_by_position": [1.4, 1.6]}],
                "seeds": {"0": record},
            }
        },
        "seeds": [0],
        "provenance": {"config": get_config("quick").to_dict(), "wall_s": 1.0},
    }


def test_compact_drops_only_per_step_losses_and_per_seed_positions():
    full = _sweep()
    small = results.compact(full)
    seed = small["methods"]["alibi"]["seeds"]["0"]
    assert "losses" not in seed["train"] and "loss_by_position" not in seed["eval"][0]
    assert seed["eval"][0]["bpb"] == 1.5 and seed["train"]["final_loss_bits"] == 1.0
    assert small["methods"]["alibi"]["eval"][0]["loss_by_position"] == [1.4, 1.6]  # the mean
    assert full["methods"]["alibi"]["seeds"]["0"]["train"]["losses"] == [3.0, 2.0, 1.0]


def test_compact_keeps_each_seeds_loss_within_and_past_the_training_length():
    """A compact copy replaces a seed's loss by position (past the training length) with the
    two means a chapter reads, and loss_within_and_past gives the same from either."""
    from relbias.lab.readings import loss_within_and_past

    full = _sweep()
    train_len = full["provenance"]["config"]["train_len"]
    for s, offset in (("0", 0.0), ("1", 0.5)):
        positions = [1.0 + offset + 0.01 * i for i in range(4 * train_len)]
        row = {"factor": 4, "length": 4 * train_len, "bpb": 2.0, "loss_by_position": positions}
        full["methods"]["alibi"]["seeds"][s] = {"eval": [row]}
    small = results.compact(full)
    kept = small["methods"]["alibi"]["seeds"]["1"]["eval"][0]
    assert "loss_by_position" not in kept
    assert kept["within_train_len_bpb"] == pytest.approx(1.5 + 0.01 * (train_len - 1) / 2)
    raw, compact = loss_within_and_past(full, "alibi"), loss_within_and_past(small, "alibi")
    assert raw == compact and raw["past"]["mean"] > raw["within"]["mean"]


def test_write_results_writes_the_raw_file_and_its_compact_copy(tmp_path, monkeypatch):
    path = results.write_results(_sweep(), tmp_path / "extrapolation_quick.json")
    assert json.loads(path.read_text()) == _sweep()
    compact = json.loads((tmp_path / "compact" / "extrapolation_quick.json").read_text())
    assert compact == results.compact(_sweep())
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    monkeypatch.setattr(results, "COMPACT_DIR", tmp_path / "compact")
    assert results.load_results("extrapolation_quick") == compact  # a name reads the compact
    assert results.load_results("extrapolation_quick", raw=True) == _sweep()
    assert results.load_results(path) == _sweep()  # a path reads that file
    with pytest.raises(FileNotFoundError, match="stored results: .'extrapolation_quick'."):
        results.load_results("no_such_result")


def test_every_stored_result_has_its_compact_copy():
    """``relbias/lab/results/compact`` holds what ships: each raw file's compact copy,
    regenerated whenever a raw file changes (``python -m relbias.lab compact``)."""
    raw = sorted(p.name for p in results.RESULTS_DIR.glob("*.json"))
    shipped = sorted(p.name for p in results.COMPACT_DIR.glob("*.json"))
    assert raw == shipped
    for name in raw:
        stored = json.loads((results.RESULTS_DIR / name).read_text())
        assert json.loads((results.COMPACT_DIR / name).read_text()) == results.compact(stored)


def test_names_of_result_files():
    assert results.check_tag(None) is None and results.check_tag("steps15000_a") == "steps15000_a"
    for bad in ("A", "_x", "a-b", "", 3):
        with pytest.raises(ValueError, match="tag must be"):
            results.check_tag(bad)
    assert results.file_stem("extrapolation", "medium", "b") == "extrapolation_medium_b"
    sweep = {"kind": "ablation", "ablation": "t5", "provenance": {"config": {"name": "medium"}}}
    assert results.result_name(sweep) == "ablation_t5_medium"
    assert results.result_name({**sweep, "tag": "farmin"}) == "ablation_t5_medium_farmin"


def test_provenance_names_the_relbias_checkout_not_the_callers_repository(tmp_path):
    here = results.checkout_commit()
    assert here is None or len(here.split("+")[0]) == 40  # this checkout (or an install)
    other = tmp_path / "other"
    other.mkdir()
    subprocess.run(["git", "init", "-q", str(other)], check=True)
    (other / "relbias").mkdir()
    assert results.checkout_commit(other / "relbias") is None  # not a checkout's top level
    assert results.checkout_commit(tmp_path / "nowhere") is None
