"""Configs, seeding, the training loop, evaluation at long lengths, read-back, results, plots."""

import json
import math

import matplotlib
import pytest
import torch
from conftest import tiny_config

from relbias.lab.config import get_config
from relbias.lab.device import autocast_dtype, largest_that_fits, pick_device, seed_everything
from relbias.lab.evaluation import evaluate_lengths, evaluate_retrieval
from relbias.lab.experiments import run_extrapolation
from relbias.lab.model import BIAS_POSITIONS, POSITION_NAMES, TinyLM, lm_loss
from relbias.lab.plots import plot_results
from relbias.lab.probe import probe_batches
from relbias.lab.readback import learned_bias
from relbias.lab.results import (
    learned_bias_from_results,
    load_results,
    made_with,
    provenance,
    write_results,
)
from relbias.lab.training import build_model, train_lm

matplotlib.use("Agg")

TINY = tiny_config(
    steps=40, warmup=5, eval_tokens=1024, probe_steps=5, probe_batch_size=8, probe_eval_samples=10
)


@pytest.fixture(scope="module")
def corpus(tiny_corpus):
    return tiny_corpus


def test_quick_config_on_every_device_full_on_request(monkeypatch):
    monkeypatch.delenv("RELBIAS_CONFIG", raising=False)
    monkeypatch.delenv("CI", raising=False)
    for cuda in (True, False):  # a chapter opened on a GPU runs the same live demo
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert get_config().name == "quick"
    monkeypatch.setenv("RELBIAS_CONFIG", "full")
    assert get_config().name == "full"
    monkeypatch.setenv("CI", "true")  # CI always runs quick
    assert get_config().name == "quick"
    monkeypatch.delenv("CI")
    monkeypatch.setenv("RELBIAS_CONFIG", "huge")
    with pytest.raises(ValueError, match="RELBIAS_CONFIG"):
        get_config()


def test_autocast_dtype_by_device(monkeypatch):
    assert autocast_dtype("cpu") is None
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert autocast_dtype("cuda") is torch.float16  # a T4: no bfloat16 tensor cores
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert autocast_dtype("cuda") is torch.bfloat16
    # asked for: a T4's float16 on a larger GPU, or no autocast; the CPU never autocasts
    assert autocast_dtype("cuda", torch.float16) is torch.float16
    assert autocast_dtype("cuda", None) is None and autocast_dtype("cpu", torch.float16) is None
    for bad in ("float16", torch.float32, 16):
        with pytest.raises(ValueError, match="amp_dtype must be one of"):
            autocast_dtype("cpu", bad)


def test_pick_device_never_chooses_mps_by_itself(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None:
        monkeypatch.setattr(mps, "is_available", lambda: True)
    assert pick_device(verbose=False).type == "cpu"


def test_config_overrides_and_checks():
    assert get_config("quick", steps=5).steps == 5
    assert get_config("quick").eval_factors == (1, 2, 4, 8, 16)
    with pytest.raises(ValueError, match="config name"):
        get_config("huge")
    with pytest.raises(ValueError, match="train_len"):
        get_config("quick", train_len=0)
    with pytest.raises(ValueError, match="eval_factors"):
        get_config("quick", eval_factors=(1, -2))
    with pytest.raises(ValueError, match="divisible"):
        get_config("quick", dim=30, heads=4)
    with pytest.raises(ValueError, match="seed"):
        get_config("quick", seed=-1)
    assert get_config("quick", eval_factors=[1, 2]).eval_factors == (1, 2)


def test_pick_device_prints(capsys):
    assert pick_device("cpu").type == "cpu"
    assert "cpu" in capsys.readouterr().out


def _fixed_batch_loss(model, corpus):
    x = corpus.val[: 16 * 16 + 1].long()
    with torch.no_grad():
        return float(lm_loss(model(x[:-1].view(16, 16)), x[1:].view(16, 16)))


@pytest.mark.parametrize("position", POSITION_NAMES)
def test_a_few_steps_lower_the_loss(position, corpus):
    seed_everything(0)
    model = build_model(position, TINY)
    before = _fixed_batch_loss(model, corpus)
    history = train_lm(model, corpus.train, TINY, progress=False)
    after = _fixed_batch_loss(model, corpus)
    assert after < before - 0.5, (before, after)
    assert len(history["losses"]) == TINY.steps and history["tokens_per_s"] > 0


@pytest.mark.parametrize("position", POSITION_NAMES)
def test_evaluation_at_16x_is_finite(position, corpus):
    seed_everything(0)
    fallback = {"learned_fallback": "clip"} if position == "learned" else {}
    model = build_model(position, TINY, **fallback)
    train_lm(model, corpus.train, TINY, steps=3, progress=False)
    rows = evaluate_lengths(model, corpus.val, TINY)
    assert [r["factor"] for r in rows] == [1, 2, 4, 8, 16]
    assert rows[-1]["length"] == 256 and len(rows[-1]["loss_by_position"]) == 256
    for row in rows:
        assert math.isfinite(row["bpb"]) and row["windows"] >= 1
        assert all(math.isfinite(v) for v in row["loss_by_position"])


def test_learned_positions_without_fallback_refuse_long_eval(corpus):
    model = build_model("learned", TINY)
    with pytest.raises(ValueError, match="learned_fallback"):
        evaluate_lengths(model, corpus.val, TINY, factors=(2,))
    with pytest.raises(ValueError, match="factors"):
        evaluate_lengths(model, corpus.val, TINY, factors=(0,))


@pytest.mark.parametrize("position", POSITION_NAMES)
def test_two_runs_give_identical_numbers(position, corpus):
    """Two trainings of the same configuration and seed, with two threads (where the fused
    kernel's backward splits work between threads), repeat bit for bit."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        runs = []
        for _ in range(2):
            seed_everything(0)
            model = build_model(position, TINY, learned_fallback="clip")
            history = train_lm(model, corpus.train, TINY, steps=6, progress=False)
            evals = evaluate_lengths(model, corpus.val, TINY, factors=(1, 2))
            runs.append((history["losses"], [r["bpb"] for r in evals]))
    finally:
        torch.set_num_threads(threads)
    assert runs[0] == runs[1]


def test_deterministic_algorithms_are_on_only_while_training(corpus):
    from relbias.lab.device import deterministic_algorithms

    assert not torch.are_deterministic_algorithms_enabled()
    seed_everything(0)  # seeding alone switches nothing on
    assert not torch.are_deterministic_algorithms_enabled()
    seen = []
    model = build_model("alibi", TINY)
    train_lm(
        model, corpus.train, TINY, steps=2, progress=False,
        after_step=lambda step, m: seen.append(torch.are_deterministic_algorithms_enabled()),
    )  # fmt: skip
    assert seen == [True, True] and not torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)  # a caller's own setting is restored as it was
    try:
        with deterministic_algorithms():
            assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert not torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)


@pytest.mark.parametrize("position", BIAS_POSITIONS)
def test_learned_bias_readback_shapes(position):
    model = TinyLM(position=position, dim=16, depth=2, heads=2, train_len=8)
    table = learned_bias(model, 31)
    assert table.shape == (2, 32) and table.dtype == torch.float32
    assert torch.isfinite(table).all()
    assert learned_bias(model.bias, 5, query_position=20).shape == (2, 6)
    per_layer = TinyLM(position=position, dim=16, depth=2, heads=2, train_len=8, share_bias=False)
    assert learned_bias(per_layer, 7, layer=1).shape == (2, 8)


def test_learned_bias_matches_the_module():
    model = TinyLM(position="alibi", dim=16, depth=1, heads=2, train_len=8)
    full = model.bias(10)  # [heads, 10, 10]; last row holds offsets 9..0
    torch.testing.assert_close(learned_bias(model, 9), full[:, -1].flip(-1))


def test_learned_bias_errors():
    with pytest.raises(ValueError, match="no additive bias"):
        learned_bias(TinyLM(position="rope", dim=16, depth=1, heads=2), 4)
    fire = TinyLM(position="fire", dim=16, depth=1, heads=2)
    with pytest.raises(ValueError, match="query_position"):
        learned_bias(fire, 10, query_position=5)
    with pytest.raises(ValueError, match="layer"):
        learned_bias(fire, 4, layer=3)
    with pytest.raises(TypeError):
        learned_bias(torch.nn.Linear(2, 2), 4)


def test_probe_training_and_accuracy():
    seed_everything(0)
    model = build_model("alibi", TINY)
    train_lm(model, probe_batches(TINY), TINY, steps=TINY.probe_steps, progress=False)
    rows = evaluate_retrieval(model, TINY, seq_len=32, samples=10)
    assert [r["distance"] for r in rows] == [1, 2, 4, 8, 16, 30]
    assert all(0.0 <= r["accuracy"] <= 1.0 for r in rows)


def _tiny_results():
    rows = [
        {
            "factor": f,
            "length": 16 * f,
            "windows": 1,
            "bpb": 3.0,
            "loss_by_position": [3.0] * (16 * f),
        }
        for f in (1, 2)
    ]
    return {
        "kind": "extrapolation",
        "methods": {"alibi": {"eval": rows}, "rope": {"eval": rows}},
        "provenance": provenance(TINY, torch.device("cpu"), wall_s=1.0),
    }


def test_results_roundtrip_and_plots(tmp_path):
    results = _tiny_results()
    prov = results["provenance"]
    assert prov["config"]["name"] == "tiny" and prov["torch"] == torch.__version__
    assert {"device", "commit", "created_utc", "wall_s", "python"} <= set(prov)
    path = write_results(results, tmp_path / "sub" / "r.json")
    assert load_results(path) == json.loads(json.dumps(results))
    fig = plot_results(results, tmp_path / "r.png")
    assert (tmp_path / "r.png").stat().st_size > 0 and len(fig.axes) == 2
    retrieval = {
        "kind": "retrieval",
        "provenance": prov,
        "methods": {
            "alibi": {
                "eval": [
                    {"length": 16, "distance": d, "accuracy": 0.5, "samples": 2} for d in (1, 2)
                ]
            }
        },
    }
    assert len(plot_results(retrieval).axes) == 1
    with pytest.raises(ValueError, match="kind"):
        plot_results({"kind": "other"})
    with pytest.raises(FileNotFoundError, match="stored results"):
        load_results("no_such_result")


def test_learned_bias_from_results():
    stored = {
        "methods": {
            "alibi": {"learned_bias": {"values": [[0.0, -0.5], [0.0, -0.1]]}},
            "rope": {"learned_bias": None},
        }
    }
    tables = learned_bias_from_results(stored)
    assert list(tables) == ["alibi"] and tables["alibi"].shape == (2, 2)


def test_largest_that_fits_steps_down_on_out_of_memory():
    tried = []

    def run(size):
        tried.append(size)
        if size > 16:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return size * 2

    assert largest_that_fits(run, [64, 32, 16, 8]) == (16, 32)
    assert tried == [64, 32, 16]
    with pytest.raises(torch.cuda.OutOfMemoryError):
        largest_that_fits(run, [64, 32])
    with pytest.raises(ValueError, match="sizes"):
        largest_that_fits(run, [])
    with pytest.raises(ZeroDivisionError):  # other errors are not swallowed
        largest_that_fits(lambda size: 1 / 0, [2, 1])


def test_medium_sits_between_quick_and_full_and_quick_is_unchanged():
    quick, medium, full = (get_config(n) for n in ("quick", "medium", "full"))
    assert quick.train_len < medium.train_len <= full.train_len
    assert medium.steps > quick.steps
    assert medium.batch_size * medium.train_len >= quick.batch_size * quick.train_len
    assert medium.eval_spread and full.eval_spread and medium.eval_tokens >= 131072
    assert medium.val_every > 0 and medium.probe_task == "competing" and medium.probe_competitors
    assert medium.probe_eval_factors == (1, 4, 16)
    # the chapters' live demos: unchanged
    assert not quick.eval_spread and quick.eval_tokens == 16384 and quick.val_every == 0
    assert quick.probe_task == "recall" and quick.steps == 1000 and quick.train_len == 64
    for field, bad in (("eval_spread", 1), ("val_every", -1), ("probe_task", "x")):
        with pytest.raises(ValueError, match=field):
            get_config("quick", **{field: bad})


def test_spread_evaluation_records_bytes_and_files(corpus):
    seed_everything(0)
    model = build_model("alibi", TINY)
    cfg = TINY.replace(eval_spread=True, eval_tokens=2048)
    rows = evaluate_lengths(
        model, corpus.val, cfg, factors=(1, 4), file_offsets=corpus.split_offsets("val")
    )
    assert [r["bytes"] for r in rows] == [2048, 2048]  # the same bytes at every length
    assert rows[0]["files"] > 1 and rows[0]["files"] == rows[1]["files"]
    plain = evaluate_lengths(model, corpus.val, TINY, factors=(1, 4))
    assert [r["bytes"] for r in plain] == [1024, 1024] and "files" not in plain[0]
    assert rows[0]["bpb"] != plain[0]["bpb"]  # other text


def test_validation_curve_during_training(corpus):
    seed_everything(0)
    model = build_model("alibi", TINY)
    cfg = TINY.replace(val_every=15, val_tokens=512)
    history = train_lm(model, corpus.train, cfg, progress=False, val_data=corpus.val)
    steps = [p["step"] for p in history["val_curve"]]
    assert steps == [15, 30, 40]
    assert history["val_curve"][-1]["bpb"] < history["val_curve"][0]["bpb"]
    assert model.training is False
    quiet = train_lm(build_model("alibi", TINY), corpus.train, TINY, progress=False)
    assert "val_curve" not in quiet  # off unless asked for (quick: val_every = 0)
    with pytest.raises(ValueError, match="val_every"):
        train_lm(model, corpus.train, TINY, progress=False, val_every=-2)


def test_plot_shows_interval_bands(tmp_path):

    cfg = TINY.replace(steps=3, eval_factors=(1, 2))
    res = run_extrapolation(cfg, ["alibi"], seeds=[0, 1], progress=False, verbose=False)
    row = res["methods"]["alibi"]["eval"][0]
    assert row["n"] == 2 and row["bpb_low"] <= row["bpb"] <= row["bpb_high"]
    per_seed = [res["methods"]["alibi"]["seeds"][s]["eval"][0]["bpb"] for s in ("0", "1")]
    assert row["bpb"] == pytest.approx(sum(per_seed) / 2)
    fig = plot_results(res)
    assert len(fig.axes[0].collections) == 1  # the band of the one method
    single = run_extrapolation(cfg, ["alibi"], progress=False, verbose=False)
    assert single["seeds"] == [cfg.seed]  # one seed: no interval to shade
    assert len(plot_results(single).axes[0].collections) == 0
    assert len(plot_results(single).axes) == 2  # no validation curve: two panels
    curved = run_extrapolation(
        cfg.replace(val_every=1, val_tokens=256), ["alibi"], seeds=[0, 1], verbose=False,
        progress=False,
    )  # fmt: skip
    fig = plot_results(curved)
    assert len(fig.axes) == 3 and len(fig.axes[2].lines) == 2  # one curve per seed
    assert [len(r["train"]["val_curve"]) for r in curved["methods"]["alibi"]["seeds"].values()] == [
        3,
        3,
    ]
    assert len(curved["methods"]["alibi"]["train"]["val_levelled"]) == 2


def test_made_with_tells_which_config_a_stored_result_came_from():
    older = get_config("quick").to_dict()
    del older["probe_task"], older["val_every"]  # fields added to Config later
    stored = {"provenance": {"config": older}}
    assert made_with(stored, get_config("quick"))  # a missing field counts at its default
    assert not made_with(stored, get_config("quick").replace(steps=999))
    assert not made_with(stored, get_config("medium"))
    newer = {"provenance": {"config": get_config("medium").to_dict()}}
    assert made_with(newer, get_config("medium"))
    assert not made_with(newer, get_config("medium").replace(val_every=7))


def test_attention_memory_estimate_for_a_16_gb_card():
    from relbias.lab.device import attention_memory_bytes

    medium = get_config("medium")
    est = attention_memory_bytes(medium, seq_len=2048, batch=8, training=False)
    assert est["attention"] == 2 * 8 * 4 * 2048 * 2048 * 2  # scores and weights, 16-bit
    assert est["bias"] == 4 * 2048 * 2048 * 4 and est["total"] == sum(
        v for k, v in est.items() if k != "total"
    )
    train = attention_memory_bytes(medium, seq_len=128, batch=16, training=True)
    assert train["attention"] == medium.depth * 2 * 16 * 4 * 128 * 128 * 2
    full = get_config("full")
    longest = attention_memory_bytes(full, seq_len=16 * full.train_len, batch=8, training=False)
    assert longest["total"] < 16 * 1024**3 / 2  # the full configuration's 16x fits a T4
