"""scripts/span_content.py: the readings that tell content, file boundaries and the model
apart, on a tiny sweep's stored weights."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from relbias.lab import get_config
from relbias.lab.experiments import run_extrapolation

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "span_content.py"


def _script():
    spec = importlib.util.spec_from_file_location("span_content", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_bigram_bits_are_a_normalised_model():
    script = _script()
    train = torch.tensor([0, 1, 0, 1, 2], dtype=torch.uint8)
    x = torch.tensor([[0, 1]])
    y = torch.tensor([[1, 0]])
    bits = script.bigram_bits(train, x, y)
    # counts + 1: after 0, "1" was seen twice of 2, each of 256 bytes gets one more
    assert bits[0, 0] == pytest.approx(-torch.log2(torch.tensor(3 / 258.0)).item())
    assert script.position_ranges(2048) == ((512, 1024), (1024, 2048))


def test_the_script_reads_a_sweeps_weights(tmp_path):
    cfg = get_config("quick").replace(
        dim=16,
        heads=2,
        depth=1,
        train_len=16,
        steps=3,
        eval_tokens=1024,
        eval_factors=(1, 8),
        eval_spread=True,
    )
    run_extrapolation(
        cfg, ["alibi", "rope"], seeds=[0], progress=False, verbose=False, weights_dir=tmp_path / "w"
    )
    out = tmp_path / "span.json"
    assert _script().main(["--weights", str(tmp_path / "w"), "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert set(result["methods"]) == {"alibi", "rope"} and result["spans"] == 8
    for row in result["methods"].values():
        assert set(row["long"]) == set(row["sliding"]) == {"32-63", "64-127"}
    assert result["provenance"]["config"]["train_len"] == 16
    with pytest.raises(SystemExit):
        _script().main(["--weights", str(tmp_path / "w"), "--seed", "5", "--out", str(out)])


def test_the_stride_check_reads_stored_weights(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location(
        "context_stride", SCRIPT.with_name("context_stride.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = get_config("quick").replace(
        dim=16, heads=2, depth=1, train_len=16, steps=2, eval_tokens=256, eval_factors=(1, 4)
    )
    run_extrapolation(
        cfg, ["kerple_power"], seeds=[0], progress=False, verbose=False, weights_dir=tmp_path
    )
    path = next(tmp_path.glob("kerple_power_seed0.pt*"))
    assert module.main(["--spans", "2", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("kerple_power: long ") and "stride 2" in out and "stride 1" in out
