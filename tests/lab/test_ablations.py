"""The ablation entry points run end to end on a tiny configuration and record what they
claim to (T5's table and its monotone intervention, FIRE's trained input range, offset vs
NoPE past the training length); the query-shift hook of TinyLM."""

import json
import math

import matplotlib
import pytest
import torch
from conftest import tiny_config

import relbias
from relbias.lab.ablations import (
    fire_variants,
    run_ablation,
    shift_at,
    t5_variants,
    variants_for,
)
from relbias.lab.experiments import main
from relbias.lab.model import TinyLM, layer_bias
from relbias.lab.training import train_lm as real_train_lm

matplotlib.use("Agg")

TINY = tiny_config(steps=6, warmup=2, eval_factors=(1, 4))


def test_t5_variants_cover_quarter_to_twice_the_training_length():
    names = [v["name"] for v in t5_variants(TINY.replace(train_len=128))]
    assert names == ["t5_d32_b32", "t5_d64_b32", "t5_d128_b32", "t5_d256_b32"]
    small = t5_variants(TINY, buckets=(8, 32))  # m_l = 16: dist_max 4 leaves no room for 32
    by_name = {v["name"]: v for v in small}
    assert "t5_d4_b6_from32" in by_name and "t5_d4_b6_from8" in by_name
    for v in small:
        kw = v["model_kwargs"]["bias_kwargs"]
        TinyLM(dim=32, depth=1, heads=2, position="t5", train_len=16, bias_kwargs=kw)
    with pytest.raises(ValueError, match="dist_max_factors"):
        t5_variants(TINY, dist_max_factors=(0,))
    with pytest.raises(ValueError, match="buckets"):
        t5_variants(TINY, buckets=(1,))
    with pytest.raises(ValueError, match="ablation must be one of"):
        variants_for("rope", TINY)
    with pytest.raises(ValueError, match="max_shift"):
        fire_variants(TINY, max_shift=0)


def test_shift_is_a_function_of_seed_and_step():
    draws = [shift_at(0, s, 48) for s in range(200)]
    assert draws == [shift_at(0, s, 48) for s in range(200)]
    assert (
        min(draws) == 0 and max(draws) == 48 and draws != [shift_at(1, s, 48) for s in range(200)]
    )


def test_query_shift_moves_only_absolute_query_positions():
    torch.manual_seed(0)
    fire = TinyLM(dim=32, depth=1, heads=2, position="fire", train_len=16).bias
    dense = layer_bias(fire, 8, 20)
    # the 8 tokens sit at positions 20..27 of a 28-token sequence: its bottom-right block
    assert torch.allclose(dense, fire(28)[:, 20:, 20:])
    assert not torch.allclose(dense, fire(8))  # queries past L = 16 are normalised
    assert torch.allclose(layer_bias(fire, 8, 5), fire(8))  # below L: offsets alone
    torch.manual_seed(0)
    model = TinyLM(dim=32, depth=2, heads=2, position="alibi", train_len=16, share_bias=False)
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        plain = model(x)
        model.bias_query_shift = 7
        shifted = model(x)
    assert torch.allclose(plain, shifted, atol=1e-5)  # ALiBi reads offsets only
    with pytest.raises(ValueError, match="bias_query_shift"):
        model.bias_query_shift = -1


def test_t5_ablation_reads_back_the_table_and_restores_it(tmp_path):
    res = run_ablation(
        "t5", TINY, seeds=[0], out=tmp_path, progress=False, verbose=False,
        dist_max_factors=(0.5, 2),
    )  # fmt: skip
    assert set(res["methods"]) == {"t5_d8_b14_from32", "t5_d32_b32"}
    rec = res["methods"]["t5_d32_b32"]
    seed = rec["seeds"]["0"]
    table = torch.tensor(seed["bucket_table"])
    assert table.shape == (2, 32) and table.abs().sum() > 0  # trained away from zeros
    assert seed["far_above_min"] == pytest.approx(
        (table[:, -1] - table[:, :-1].min(1).values).tolist(), abs=1e-4
    )
    assert seed["bucket_first_offset"][0] == 0 and seed["bucket_first_offset"] == sorted(
        seed["bucket_first_offset"]
    )
    assert [r["length"] for r in rec["eval_monotone"]] == [16, 64]
    assert all(math.isfinite(r["bpb"]) for r in rec["eval_monotone"])
    stored = json.loads((tmp_path / "ablation_t5_tiny.json").read_text())
    assert stored["ablation"] == "t5" and (tmp_path / "ablation_t5_tiny.png").stat().st_size


def test_fire_ablation_trains_inside_the_gap(monkeypatch, tmp_path):
    shifts = []

    def spy(model, data, config, **kwargs):
        if kwargs.get("before_step"):
            inner = kwargs["before_step"]

            def record(step, m):
                inner(step, m)
                shifts.append(m.bias_query_shift)

            kwargs["before_step"] = record
        return real_train_lm(model, data, config, **kwargs)

    monkeypatch.setattr("relbias.lab.experiments.train_lm", spy)
    res = run_ablation("fire", TINY, seeds=[0], progress=False, verbose=False)
    plain = res["methods"]["fire"]["seeds"]["0"]
    shifted = res["methods"]["fire_shift"]["seeds"]["0"]
    assert len(shifts) == TINY.steps and max(shifts) <= 3 * 16 and len(set(shifts)) > 1
    assert shifted["max_shift"] == 48 and plain["max_shift"] == 0
    # trained queries of the shifted run reach the inputs that the longest evaluation needs
    assert shifted["min_trained_input"] < plain["min_trained_input"]
    assert shifted["min_trained_input"] <= shifted["min_eval_input"] + 0.05
    assert len(shifted["bias_at_longest_query"]["values"]) == 2


def test_offset_ablation_and_cli(tmp_path, capsys):
    argv = [
        "ablation", "offset", "--config", "quick", "--steps", "4", "--train-len", "8",
        "--lengths", "1", "4", "--seeds", "0", "1", "--out", str(tmp_path), "--no-progress",
    ]  # fmt: skip
    assert main(argv) == 0
    assert "offset" in capsys.readouterr().out
    res = json.loads((tmp_path / "ablation_offset_quick.json").read_text())
    assert set(res["methods"]) == {"offset", "nope"} and res["seeds"] == [0, 1]
    for rec in res["methods"].values():
        past = rec["past_train_len_bpb"]
        assert past["n"] == 2 and past["low"] <= past["mean"] <= past["high"]
        row = rec["seeds"]["1"]["eval"][-1]
        assert rec["seeds"]["1"]["past_train_len_bpb"] == pytest.approx(
            sum(row["loss_by_position"][8:]) / 24
        )


def _trained_like(position, **bias_kwargs):
    """A tiny TinyLM whose bias holds random (trained-looking) values."""
    torch.manual_seed(0)
    model = TinyLM(
        dim=32, depth=1, heads=2, position=position, train_len=16, bias_kwargs=bias_kwargs
    )
    with torch.no_grad():
        for p in model.bias_modules()[0].parameters():
            p.add_(torch.randn_like(p))
    return model


def test_offset_interventions_change_only_the_offsets_without_a_parameter(tiny_corpus):
    from relbias.lab.ablations import MASKED, offset_interventions

    model = _trained_like("offset")
    table = model.bias_modules()[0].weight.detach().clone()
    seen = []

    def spy(changed, *args, **kwargs):
        seen.append(changed.bias_modules()[0].offset_table(0, 40).detach())
        return [{"factor": 4, "length": 64, "bytes": 1, "bpb": 1.0, "loss_by_position": [1.0] * 64}]

    import relbias.lab.ablations as ab

    real, ab._eval_rows = ab._eval_rows, spy
    try:
        out = offset_interventions(model, TINY, tiny_corpus)
    finally:
        ab._eval_rows = real
    far_min, far_masked = seen
    assert torch.equal(far_min[:, :16], table) and torch.equal(far_masked[:, :16], table)
    assert torch.equal(far_min[:, 16:], table.min(1).values[:, None].expand(-1, 25))
    assert (far_masked[:, 16:] == MASKED).all()
    assert torch.equal(model.bias_modules()[0].weight, table)  # the model itself is unchanged
    assert out["edge_above_min"] == pytest.approx(
        (table[:, -1] - table.min(1).values).tolist(), abs=1e-4
    )


def test_t5_far_to_min_keeps_the_buckets_up_to_each_minimum(tiny_corpus):
    from relbias.lab.ablations import t5_details

    model = _trained_like("t5")
    saved = model.bias_modules()[0].weight.detach().clone()
    out = t5_details(model, TINY, tiny_corpus)
    lowest = out["interventions"]["far_to_min"]["min_bucket"]
    assert lowest == saved.argmin(1).tolist()
    assert out["interventions"]["far_to_min"]["changed"] == sum(
        int((saved[h, b + 1 :] != saved[h, b]).sum()) for h, b in enumerate(lowest)
    )
    assert torch.equal(model.bias_modules()[0].weight, saved)  # restored


def test_clamped_fire_is_fire_inside_the_range_and_clamps_outside():
    from relbias.lab.ablations import ClampedFIRE, fire_trained_range

    fire = _trained_like("fire").bias_modules()[0]
    with torch.no_grad():
        visible = relbias.relative_positions(40) >= 0  # future keys are masked anyway
        unclamped = ClampedFIRE(fire, 1e-12, 1.0).prepare(40)
        assert torch.allclose(unclamped[:, visible], fire(40)[:, visible], atol=1e-6)
        low, high = fire_trained_range(fire, 16)
        x = fire.normalized_input(40).masked_fill(~visible, 0)
        assert 0 < low < high < 1 and x[x > 0].min() < low and x.max() > high
        clamped = ClampedFIRE(fire, low, high).prepare(40)[:, visible]
        expected = fire.mlp(torch.where(x > 0, x.clamp(low, high), x)).permute(2, 0, 1)
        assert torch.equal(clamped, expected[:, visible])
        diagonal = ClampedFIRE(fire, low, high).prepare(40).diagonal(dim1=1, dim2=2)
        assert torch.equal(diagonal, fire(40).diagonal(dim1=1, dim2=2))  # input 0 untouched
    with pytest.raises(ValueError, match="low <= high"):
        ClampedFIRE(fire, 0.5, 0.2)


def test_kerple_ladder_differs_only_in_what_learns():
    from relbias.lab.ablations import kerple_variants

    alibi, rate, shape = kerple_variants(TINY)
    kw_rate, kw_shape = rate["model_kwargs"]["bias_kwargs"], shape["model_kwargs"]["bias_kwargs"]
    assert {k: v for k, v in kw_rate.items() if k != "learn_r2"} == {
        k: v for k, v in kw_shape.items() if k != "learn_r2"
    }
    assert (kw_rate["learn_r2"], kw_shape["learn_r2"]) == (False, True)
    models = []
    for v in (alibi, rate, shape):
        torch.manual_seed(0)
        models.append(
            TinyLM(
                dim=32, depth=1, heads=2, position=v["method"], train_len=16, **v["model_kwargs"]
            )
        )
    x = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        outs = [m(x) for m in models]
    assert torch.allclose(outs[0], outs[1], atol=1e-6) and torch.equal(outs[1], outs[2])
    with pytest.raises(ValueError, match="variants must name some of"):
        variants_for("kerple", TINY, variants=["rope"])


def test_alibi_probe_restores_the_slopes(monkeypatch):
    from relbias.lab.ablations import SLOPE_CHANGES, alibi_probe_interventions

    model = TinyLM(dim=32, depth=1, heads=4, position="alibi", train_len=16)
    saved = model.bias.slopes.clone()
    used = []
    monkeypatch.setattr(
        "relbias.lab.ablations.evaluate_retrieval",
        lambda m, config, **kw: used.append(m.bias.slopes.clone()) or [],
    )
    out = alibi_probe_interventions(model, TINY.replace(probe_eval_factors=(1,)))
    assert list(out["interventions"]) == [name for name, _, _ in SLOPE_CHANGES]
    assert torch.equal(used[0], saved * torch.tensor([1, 1, 1, 0.0]))
    assert torch.equal(used[3], saved * 0.5)
    assert torch.equal(model.bias.slopes, saved)


def test_fire_shift_is_evaluated_from_position_zero(monkeypatch):
    """The shifted run's evaluation reads queries from position 0, like the other models:
    the last training step's shift is not left on the model."""
    seen = []

    def spy(model, data, config, **kwargs):
        seen.append(model.bias_query_shift)
        return real_evaluate(model, data, config, **kwargs)

    from relbias.lab.training import evaluate_lengths as real_evaluate

    monkeypatch.setattr("relbias.lab.experiments.evaluate_lengths", spy)
    run_ablation("fire", TINY, seeds=[0], progress=False, verbose=False, variants=["fire_shift"])
    assert seen and all(s == 0 for s in seen)
