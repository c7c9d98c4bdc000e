"""The experiments behind the book's claims: every positional method trained on text and
evaluated at 1x..16x the training length (:func:`run_extrapolation`), and trained on the
recall probe and tested against the distance to the answer (:func:`run_retrieval`).

Both run through the one sweep runner (:func:`relbias.lab.sweep.run_sweep`): every method
for every seed (default: the configuration's seed), a summary over seeds per method (mean
and 95 % t-interval per length; :mod:`relbias.lab.stats`), checkpoints and resuming.
``model_kwargs`` go to every method's :class:`~relbias.lab.model.TinyLM` and ``tag`` names a
variant (the file ``<experiment>_<config>_<tag>.json``); both are recorded in the results.
The command line is :mod:`relbias.lab.cli` (``python -m relbias.lab``).

Methods are the names in :data:`relbias.lab.model.POSITION_NAMES`, or ``all``, ``biases``,
``baselines``.
"""

from __future__ import annotations

import torch

from relbias.lab.config import Config, get_config
from relbias.lab.data import load_corpus
from relbias.lab.device import pick_device, seed_everything
from relbias.lab.evaluation import evaluate_lengths, evaluate_retrieval
from relbias.lab.model import BASELINE_POSITIONS, BIAS_POSITIONS, POSITION_NAMES
from relbias.lab.probe import (
    probe_batch,
    probe_batches,
    probe_description,
    probe_max_distance,
    probe_min_distance,
)
from relbias.lab.readback import bias_readback, gate_readback
from relbias.lab.results import check_tag
from relbias.lab.summaries import summarize_extrapolation, summarize_retrieval
from relbias.lab.sweep import run_sweep
from relbias.lab.training import build_model, train_lm
from relbias.lab.weights import save_weights

__all__ = [
    "METHOD_GROUPS",
    "new_model",
    "resolve_methods",
    "run_extrapolation",
    "run_retrieval",
    "train_and_evaluate",
    "train_and_probe",
]

METHOD_GROUPS = {"all": POSITION_NAMES, "biases": BIAS_POSITIONS, "baselines": BASELINE_POSITIONS}


def resolve_methods(names) -> list[str]:
    """Expand ``all``/``biases``/``baselines`` and check every name; keeps order, no repeats."""
    out = []
    for name in names:
        group = METHOD_GROUPS.get(name, (name,))
        for method in group:
            if method not in POSITION_NAMES:
                raise ValueError(
                    f"unknown method {method!r}; choose from {', '.join(POSITION_NAMES)} "
                    f"or {', '.join(METHOD_GROUPS)}"
                )
            if method not in out:
                out.append(method)
    return out


def new_model(method: str, config: Config, device, **model_kwargs):
    """A model seeded with ``config.seed``; learned absolute positions clip beyond the
    training length (so that a longer evaluation runs)."""
    seed_everything(config.seed)
    kwargs = {"learned_fallback": "clip"} if method == "learned" else {}
    return build_model(method, config, **{**kwargs, **model_kwargs}).to(device)


def train_and_evaluate(
    method: str,
    config: Config,
    *,
    corpus=None,
    device=None,
    progress: bool = True,
    factors=None,
    model_kwargs: dict | None = None,
    train_kwargs: dict | None = None,
):
    """Train one method on the text and evaluate every length; returns ``(model, record)``.

    The record holds the parameter count, the training history (loss in bits per step,
    wall time, tokens/s; with ``config.val_every`` the validation curve at the training
    length), the evaluation rows of :func:`~relbias.lab.evaluation.evaluate_lengths` (with
    the bytes and validation files read at each length), the learned bias of a bias family
    and the gates of a forget-gate model (read on the first validation windows).
    ``model_kwargs`` go to :class:`~relbias.lab.model.TinyLM` (e.g. ``bias_kwargs``),
    ``train_kwargs`` to :func:`~relbias.lab.training.train_lm` (checkpointing, hooks).
    """
    corpus = corpus or load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=False)
    model = new_model(method, config, device, **(model_kwargs or {}))
    history = train_lm(
        model,
        corpus.train,
        config,
        device=device,
        progress=progress,
        desc=method,
        val_data=corpus.val,
        **(train_kwargs or {}),
    )
    rows = evaluate_lengths(
        model,
        corpus.val,
        config,
        factors=factors,
        device=device,
        file_offsets=corpus.split_offsets("val"),
    )
    history["losses"] = [round(v, 4) for v in history["losses"]]
    record = {
        "params": sum(p.numel() for p in model.parameters()),
        "train": history,
        "eval": rows,
        "learned_bias": bias_readback(model, config),
    }
    if model.gates():
        windows = corpus.val[: config.eval_batch_size * config.train_len].long()
        idx = windows.view(config.eval_batch_size, config.train_len).to(device)
        record["learned_gate"] = gate_readback(model, idx)
    return model, record


def train_and_probe(
    method: str,
    config: Config,
    *,
    device=None,
    progress: bool = True,
    factors=None,
    distances=None,
    model_kwargs: dict | None = None,
    train_kwargs: dict | None = None,
):
    """Train one method on the configured recall probe and measure accuracy against distance.

    Returns ``(model, record)``; ``record["eval"]`` has one row per (length, distance);
    for bias families ``record["learned_bias"]`` is the learned penalty read back, for a
    forget-gate model ``record["learned_gate"]`` its gates on probe sequences with the
    answer as far back as trained.
    """
    device = device or pick_device(verbose=False)
    model = new_model(method, config, device, **(model_kwargs or {}))
    history = train_lm(
        model,
        probe_batches(config),
        config,
        steps=config.probe_steps,
        device=device,
        progress=progress,
        desc=method,
        **(train_kwargs or {}),
    )
    rows = []
    low = probe_min_distance(config)
    for factor in factors or config.probe_eval_factors:
        seq_len = factor * config.train_len
        high = probe_max_distance(config, seq_len)
        ds = None if distances is None else [d for d in distances if low <= d <= high]
        rows += evaluate_retrieval(model, config, seq_len=seq_len, distances=ds, device=device)
    history["losses"] = [round(v, 4) for v in history["losses"]]
    record = {
        "params": sum(p.numel() for p in model.parameters()),
        "train": history,
        "eval": rows,
    }
    if model.uses_bias:
        record["learned_bias"] = bias_readback(model, config)
    if model.gates():
        far = probe_max_distance(config, config.train_len)
        gen = torch.Generator().manual_seed(0)
        idx, _ = probe_batch(config, config.probe_batch_size, config.train_len, far, gen)
        record["learned_gate"] = gate_readback(model, idx.to(device), distance=far)
    return model, record


def _sweep_of(
    kind, train_one, summarize, config, methods, seeds, device, checkpoint, extra, weights_dir
):
    """The common part of both experiments: every method for every seed, summarised; with
    ``weights_dir`` each finished run's final weights saved there
    (:func:`~relbias.lab.weights.save_weights`)."""
    names = resolve_methods(methods or ["all"])
    device = device or pick_device(verbose=checkpoint.get("verbose", True))

    def run_one(method, seed, train_kwargs):
        cfg = config.replace(seed=seed)
        model, record = train_one(method, cfg, device, train_kwargs)
        if weights_dir is not None:
            save_weights(
                model, weights_dir, method=method, config=cfg, model_kwargs=extra["model_kwargs"]
            )
        return record

    return run_sweep(
        kind,
        config,
        names,
        [config.seed] if seeds is None else seeds,
        run_one,
        summarize,
        device=device,
        identity_extra=extra,
        **checkpoint,
    )


def _with_variant(results: dict, model_kwargs: dict | None, tag: str | None) -> dict:
    if model_kwargs:
        results["model_kwargs"] = model_kwargs
    if tag is not None:
        results["tag"] = tag
    return results


def run_extrapolation(
    config: Config | None = None,
    methods=None,
    *,
    seeds=None,
    device=None,
    progress: bool = True,
    factors=None,
    verbose: bool = True,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    model_kwargs: dict | None = None,
    tag: str | None = None,
    weights_dir=None,
) -> dict:
    """Train and evaluate every method (default all) for every seed (default
    ``[config.seed]``); returns the results: per method the summary of
    :func:`~relbias.lab.summaries.summarize_extrapolation` (every seed's record under
    ``"seeds"``), the corpus description and the provenance. ``checkpoint_dir``, ``resume``:
    see :func:`relbias.lab.sweep.run_seeds`; ``weights_dir``: where each run's final weights
    go (:func:`~relbias.lab.weights.save_weights`; default: not kept)."""
    tag = check_tag(tag)
    config = config or get_config()
    corpus = load_corpus(max_bytes=config.corpus_bytes)

    def train_one(method, cfg, device, train_kwargs):
        return train_and_evaluate(
            method,
            cfg,
            corpus=corpus,
            device=device,
            progress=progress,
            factors=factors,
            model_kwargs=model_kwargs,
            train_kwargs=train_kwargs,
        )

    checkpoint = {
        "checkpoint_dir": checkpoint_dir,
        "resume": resume,
        "checkpoint_seconds": checkpoint_seconds,
        "checkpoint_every": checkpoint_every,
        "verbose": verbose,
    }
    extra = {"factors": factors, "model_kwargs": model_kwargs}
    results = _sweep_of(
        "extrapolation",
        train_one,
        summarize_extrapolation,
        config,
        methods,
        seeds,
        device,
        checkpoint,
        extra,
        weights_dir,
    )
    results["corpus"] = corpus.describe()
    return _with_variant(results, model_kwargs, tag)


def run_retrieval(
    config: Config | None = None,
    methods=None,
    *,
    seeds=None,
    device=None,
    progress: bool = True,
    factors=None,
    distances=None,
    verbose: bool = True,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    model_kwargs: dict | None = None,
    tag: str | None = None,
    weights_dir=None,
) -> dict:
    """Train every method on the probe for every seed; returns the results (per method the
    summary of :func:`~relbias.lab.summaries.summarize_retrieval`), as
    :func:`run_extrapolation` does for text, with the probe's description."""
    tag = check_tag(tag)
    config = config or get_config()

    def train_one(method, cfg, device, train_kwargs):
        return train_and_probe(
            method,
            cfg,
            device=device,
            progress=progress,
            factors=factors,
            distances=distances,
            model_kwargs=model_kwargs,
            train_kwargs=train_kwargs,
        )

    checkpoint = {
        "checkpoint_dir": checkpoint_dir,
        "resume": resume,
        "checkpoint_seconds": checkpoint_seconds,
        "checkpoint_every": checkpoint_every,
        "verbose": verbose,
    }
    extra = {"factors": factors, "distances": distances, "model_kwargs": model_kwargs}
    results = _sweep_of(
        "retrieval",
        train_one,
        summarize_retrieval,
        config,
        methods,
        seeds,
        device,
        checkpoint,
        extra,
        weights_dir,
    )
    results["probe"] = probe_description(config)
    return _with_variant(results, model_kwargs, tag)


# The command line of older result files (python -m relbias.lab.experiments ...).
if __name__ == "__main__":
    import sys

    sys.exit(
        "relbias.lab.experiments is a module, not a command: run the same experiment with\n"
        f"    python -m relbias.lab {' '.join(sys.argv[1:])}"
    )
