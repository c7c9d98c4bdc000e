"""Checkpoints: atomic writes, stop-and-resume equals an uninterrupted run, Ctrl-C."""

import json
import os
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch
from conftest import tiny_config

from relbias.lab.checkpoint import (
    SweepProgress,
    TrainingInterrupted,
    atomic_torch_save,
    load_checkpoint,
)
from relbias.lab.config import Config
from relbias.lab.device import seed_everything
from relbias.lab.experiments import run_extrapolation
from relbias.lab.sweep import run_seeds
from relbias.lab.training import build_model, train_lm

TINY = tiny_config(steps=20, warmup=3, val_every=4, val_tokens=256)


@pytest.fixture(scope="module")
def corpus(tiny_corpus):
    return tiny_corpus


def _model(method):
    seed_everything(TINY.seed)
    return build_model(method, TINY)


def test_atomic_torch_save_never_leaves_a_partial_file(tmp_path):
    path = tmp_path / "sub" / "state.pt"
    atomic_torch_save({"x": torch.arange(3)}, path)
    assert torch.equal(torch.load(path)["x"], torch.arange(3))
    # A lambda cannot be pickled: the old file must survive the failed write.
    with pytest.raises((AttributeError, TypeError, pickle.PicklingError)):
        atomic_torch_save({"f": lambda: 0}, path)
    assert torch.equal(torch.load(path)["x"], torch.arange(3))
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.pt"]


@pytest.mark.parametrize("method", ["kerple_power", "fire", "rope"])
def test_stop_and_resume_equals_an_uninterrupted_run(method, corpus, tmp_path):
    whole = _model(method)
    expected = train_lm(whole, corpus.train, TINY, progress=False, val_data=corpus.val)

    def stop_half_way(step, model):
        if step == TINY.steps // 2 - 1:
            raise KeyboardInterrupt

    ckpt = tmp_path / "run.pt"
    first = _model(method)
    with pytest.raises(TrainingInterrupted) as info:
        train_lm(
            first,
            corpus.train,
            TINY,
            progress=False,
            val_data=corpus.val,
            checkpoint=ckpt,
            after_step=stop_half_way,
            run_id="r",
        )
    assert info.value.step == TINY.steps // 2 and info.value.checkpoint == ckpt
    assert str(ckpt) in str(info.value) and f"step {TINY.steps // 2} of {TINY.steps}" in str(
        info.value
    )
    assert load_checkpoint(ckpt)["step"] == TINY.steps // 2
    # The global RNG is disturbed between the two halves, as a new process would have it.
    torch.manual_seed(12345)
    second = _model(method)
    got = train_lm(
        second,
        corpus.train,
        TINY,
        progress=False,
        val_data=corpus.val,
        checkpoint=ckpt,
        resume=True,
        run_id="r",
    )
    assert got["losses"] == expected["losses"]
    assert got["val_curve"] == expected["val_curve"]
    assert [p["step"] for p in got["val_curve"]] == [4, 8, 12, 16, 20]
    assert got["resumed_at"] == [TINY.steps // 2] and "resumed_at" not in expected
    for (name, a), (_, b) in zip(whole.state_dict().items(), second.state_dict().items()):
        assert torch.equal(a, b), name


def test_periodic_checkpoints_and_resume_checks(corpus, tmp_path):
    ckpt = tmp_path / "run.pt"
    seen = []

    def watch(step, model):
        if ckpt.exists():
            seen.append(load_checkpoint(ckpt)["step"])

    train_lm(
        _model("alibi"),
        corpus.train,
        TINY,
        progress=False,
        checkpoint=ckpt,
        checkpoint_every=5,
        after_step=watch,
        run_id="a",
    )
    assert sorted(set(seen)) == [5, 10, 15] and load_checkpoint(ckpt)["step"] == 20
    with pytest.raises(ValueError, match="another run"):
        train_lm(
            _model("alibi"),
            corpus.train,
            TINY.replace(steps=30),
            progress=False,
            checkpoint=ckpt,
            resume=True,
            run_id="a",
        )
    with pytest.raises(ValueError, match="resume=True needs checkpoint"):
        train_lm(_model("alibi"), corpus.train, TINY, progress=False, resume=True)
    with pytest.raises(ValueError, match="checkpoint_every"):
        train_lm(_model("alibi"), corpus.train, TINY, progress=False, checkpoint_every=0)


def test_interrupt_without_checkpoint_says_nothing_was_saved(corpus):
    def stop(step, model):
        raise KeyboardInterrupt

    with pytest.raises(TrainingInterrupted, match="nothing was saved"):
        train_lm(_model("alibi"), corpus.train, TINY, progress=False, after_step=stop)


def test_sweep_skips_finished_runs_on_resume(tmp_path):
    calls = []

    def run_one(name, seed, train_kwargs):
        calls.append((name, seed))
        if len(calls) == 3 and not resumed:
            raise KeyboardInterrupt
        assert train_kwargs["run_id"] == f"{name}/seed{seed}"
        return {"value": seed * 10 + len(name)}

    identity = {"kind": "test", "names": ["a", "bb"], "seeds": [0, 1]}
    resumed = False
    with pytest.raises(KeyboardInterrupt):
        run_seeds(
            run_one, ["a", "bb"], [0, 1], identity=identity, checkpoint_dir=tmp_path, verbose=False
        )
    assert calls == [("a", 0), ("bb", 0), ("a", 1)]
    resumed = True
    out = run_seeds(
        run_one,
        ["a", "bb"],
        [0, 1],
        identity=identity,
        checkpoint_dir=tmp_path,
        resume=True,
        verbose=False,
    )
    assert calls[3:] == [("a", 1), ("bb", 1)]  # the finished runs were not repeated
    assert out == {
        "a": {0: {"value": 1}, 1: {"value": 11}},
        "bb": {0: {"value": 2}, 1: {"value": 12}},
    }
    with pytest.raises(FileExistsError, match="already saved"):
        SweepProgress(tmp_path, identity)  # without resume: never overwrite a saved sweep
    SweepProgress(tmp_path, identity, resume=True).remove()
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    run_seeds(run_one, ["a"], [0], identity=identity, checkpoint_dir=tmp_path, verbose=False)
    assert (tmp_path / ".gitignore").read_text() == "*\n"
    with pytest.raises(ValueError, match="other settings"):
        SweepProgress(tmp_path, {**identity, "seeds": [0]}, resume=True)
    with pytest.raises(FileNotFoundError, match="no sweep to resume"):
        SweepProgress(tmp_path / "empty", identity, resume=True)


def _cli(out, *extra):
    return [
        sys.executable, "-m", "relbias.lab", "extrapolation",
        "--methods", "alibi", "t5", "--seeds", "0", "1", "--steps", "60", "--train-len", "8",
        "--lengths", "1", "2", "--eval-tokens", "1024", "--no-progress", "--out", str(out),
        *extra,
    ]  # fmt: skip


def test_ctrl_c_then_resume_gives_the_uninterrupted_result(tmp_path):
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ckpt = tmp_path / "ckpt"
    proc = subprocess.Popen(
        _cli(tmp_path, "--checkpoint-dir", str(ckpt), "--checkpoint-every-steps", "5"),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not (ckpt / "current.pt").exists():  # the first run is under way
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never wrote a checkpoint"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    assert proc.returncode == 130, err
    assert "interrupted (Ctrl-C)" in err and "resume with:" in err and "--resume" in err
    # Ctrl-C lands in a training (saved at that step) or, rarely, in an evaluation (the run
    # continues from the checkpoint written at the end of its training)
    assert "saved after training step" in err or "continues from its last checkpoint" in err
    assert not (tmp_path / "extrapolation_quick.json").exists()
    state = load_checkpoint(ckpt / "current.pt")
    run, step = state["run"], state["step"]
    assert 0 < step <= 60
    resumed = subprocess.run(
        _cli(tmp_path, "--checkpoint-dir", str(ckpt), "--resume"),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert not ckpt.exists()  # removed once the results were written
    got = json.loads((tmp_path / "extrapolation_quick.json").read_text())
    config = got["provenance"]["config"]
    expected = run_extrapolation(
        Config(**{**config, "eval_factors": tuple(config["eval_factors"]),
                  "probe_eval_factors": tuple(config["probe_eval_factors"])}),
        ["alibi", "t5"], seeds=[0, 1], progress=False, verbose=False,
    )  # fmt: skip
    for method in ("alibi", "t5"):
        for seed in ("0", "1"):
            a = got["methods"][method]["seeds"][seed]
            b = expected["methods"][method]["seeds"][seed]
            assert a["train"]["losses"] == b["train"]["losses"], (method, seed)
            assert [r["bpb"] for r in a["eval"]] == [r["bpb"] for r in b["eval"]]
    method, seed = run.split("/seed")
    assert got["methods"][method]["seeds"][seed]["train"].get("resumed_at") == [step]
