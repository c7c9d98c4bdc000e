"""The interpolation experiment: scalings by name, a tiny run end to end, its summary and CLI."""

import math

import matplotlib
import pytest
import torch

from relbias import RopeScaling
from relbias.lab import interpolation as ip
from relbias.lab.cli import interpolation_table, main
from relbias.lab.config import get_config
from relbias.lab.model import TinyLM
from relbias.lab.plots import plot_interpolation
from relbias.lab.stats import interval

matplotlib.use("Agg")

TINY = dict(dim=16, heads=2, depth=1, steps=3, batch_size=4, eval_tokens=256, corpus_bytes=60_000)


def test_scaling_for_each_name():
    assert ip.scaling_for("none", 4, 64) is None
    assert ip.scaling_for("linear", 4, 64) == RopeScaling("linear", 4.0, original_len=64)
    assert ip.scaling_for("dynamic", 4, 64) == RopeScaling("dynamic", 1.0, original_len=64)
    assert ip.scaling_for("yarn", 2, 32).factor == 2.0
    with pytest.raises(ValueError, match="scaling must be one of"):
        ip.scaling_for("ntk_by_parts", 2, 32)


def test_tinylm_rope_scaling_is_an_attribute():
    model = TinyLM(
        dim=16,
        heads=2,
        depth=1,
        train_len=8,
        position="rope",
        rope_scaling=RopeScaling("linear", 4.0),
    )
    assert model.rope_scaling == RopeScaling("linear", 4.0)
    model.rope_scaling = {"kind": "yarn", "factor": 2.0, "original_len": 8}
    assert model.rotary.attention_factor == pytest.approx(0.1 * math.log(2) + 1)
    model.rope_scaling = None
    x = torch.randint(0, 256, (1, 24))
    with torch.no_grad():
        plain = model(x)
        model.rope_scaling = RopeScaling("ntk", 3.0)
        assert not torch.allclose(plain, model(x))
    with pytest.raises(ValueError, match="rope_scaling needs position='rope'"):
        TinyLM(position="alibi").rope_scaling = None
    assert TinyLM(position="alibi").rope_scaling is None


def test_tiny_run_end_to_end():
    config = get_config("quick", train_len=8, eval_factors=(1, 2, 4), **TINY)
    results = ip.run_interpolation(
        config, seeds=(0, 1), finetune_factor=2, finetune_steps=(1, 2), verbose=False
    )
    assert results["kind"] == "interpolation" and results["setup"]["finetune_length"] == 16
    assert [run["seed"] for run in results["runs"]] == [0, 1]
    run = results["runs"][0]
    assert set(run["zero_shot"]) == set(ip.SCALINGS)
    assert set(run["finetuned"]) == set(ip.FINETUNED_SCALINGS)
    assert list(run["finetuned"]["yarn"]) == ["1", "2"]
    first = [rows[0]["bpb"] for rows in run["zero_shot"].values()]
    assert max(first) - min(first) < 1e-9  # s = 1: every scaling is plain RoPE
    cell = results["summary"]["zero_shot"]["yarn"]["32"]
    values = [r["zero_shot"]["yarn"][2]["bpb"] for r in results["runs"]]
    expected = interval(values)
    assert cell["n"] == 2
    for key in ("mean", "low", "high"):
        assert cell[key] == pytest.approx(expected[key], abs=1e-5)
    # the two variants that change one thing: YaRN without its temperature, linear at 10x lr
    no_temp = ip.scaling_for("yarn_no_temp", 4, 8)
    assert no_temp == RopeScaling("yarn", 4.0, original_len=8, attention_factor=1.0)
    assert results["setup"]["finetune_variants"]["linear_lr10"]["lr"] == pytest.approx(
        10 * results["setup"]["finetune_variants"]["linear"]["lr"]
    )
    lr10 = [r["finetuned"]["linear_lr10"]["2"]["eval"][0]["bpb"] for r in results["runs"]]
    assert lr10 != [r["finetuned"]["linear"]["2"]["eval"][0]["bpb"] for r in results["runs"]]
    assert "yarn, 2 steps" in interpolation_table(results)
    fig = plot_interpolation(results)
    assert len(fig.axes) == 2
    with pytest.raises(ValueError, match="finetune_factor"):
        ip.run_interpolation(config, seeds=(0,), finetune_factor=3, verbose=False)


def test_command_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        main(["interpolation", "--finetune-factor", "3", "--out", str(tmp_path)])
    assert exc.value.code == 2 and "--finetune-factor must be one of" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["interpolation", "--finetune-steps", "0", "--out", str(tmp_path)])
    assert "must be an integer > 0" in capsys.readouterr().err
