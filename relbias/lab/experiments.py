"""The experiments behind the book's claims, as functions and as a command line.

``python -m relbias.lab.experiments extrapolation [--config ...] [--methods ...] [--out DIR]``
    trains a :class:`~relbias.lab.model.TinyLM` per positional method on the standard-library
    bytes, evaluates bits per byte at 1x..16x the training length, prints a table and
    writes ``extrapolation_<config>.json`` and ``.png`` to ``DIR``.
``python -m relbias.lab.experiments retrieval [...]``
    trains each method on the key-value recall probe and reports accuracy against the
    distance back to the answer, at 1x and 4x the training length.
``python -m relbias.lab.experiments interpolation [--seeds ...] [--out DIR]``
    trains RoPE at the training length and reads 1x..16x with no scaling, with each
    position interpolation zero-shot, and after a short fine-tuning at 4x
    (:mod:`relbias.lab.interpolation`); writes ``interpolation_<config>.json`` and ``.png``.

``python -m relbias.lab.experiments ablation {t5,fire,offset} [...]``
    the ablations of :mod:`relbias.lab.ablations`: T5's ``dist_max`` and bucket count with
    the learned table read back, FIRE trained with shifted query positions, the clipped
    offset table against NoPE; writes ``ablation_<which>_<config>.json`` and ``.png``.

Every experiment but interpolation takes ``--seeds S [S ...]`` or ``--num-seeds N`` (every
method for each seed; the JSON keeps every seed and reports the mean and a 95 %
t-interval per length), and checkpoints: the sweep's progress and the run in progress are
kept in ``--checkpoint-dir`` (default ``OUT/checkpoints/<name>``) every
``--checkpoint-minutes`` (default 2) and on Ctrl-C, which ends the command with a message
saying what was saved; the same command with ``--resume`` continues it and gives the
result an uninterrupted run gives.

Variants: ``--gate-bias-init B`` starts the forget gates (``--methods forgetting``) at
``f = sigmoid(B)`` instead of the reference code's 1/2, and ``--tag NAME`` writes
``<experiment>_<config>_<NAME>.json``, so that a variant does not replace the plain sweep;
both are recorded in the results. A forget-gate run reads its gates back into the record
(``learned_gate``: :func:`gate_readback`), as bias families read back their bias.

Run ``python -m relbias.lab.experiments {extrapolation,retrieval,interpolation,ablation}
--help`` for every option.
Methods are the names in :data:`relbias.lab.model.POSITION_NAMES`, or ``all``, ``biases``,
``baselines``.
"""

from __future__ import annotations

import argparse
import math
import re
import statistics
import sys
import time
from pathlib import Path

import torch

from relbias.lab.data import load_corpus
from relbias.lab.model import BASELINE_POSITIONS, BIAS_POSITIONS, GATED_POSITIONS, POSITION_NAMES
from relbias.lab.probe import TASKS
from relbias.lab.stats import interval, levelled_off
from relbias.lab.training import (
    Config,
    build_model,
    device_name,
    evaluate_lengths,
    evaluate_retrieval,
    get_config,
    learned_bias,
    pick_device,
    plot_results,
    probe_batch,
    probe_batches,
    probe_max_distance,
    probe_min_distance,
    provenance,
    save_results,
    seed_everything,
    train_lm,
)

CONFIG_NAMES = ("quick", "medium", "full")
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


def _new_model(method: str, config: Config, device, **model_kwargs):
    """A seeded model; learned absolute positions clip beyond the training length."""
    seed_everything(config.seed)
    kwargs = {"learned_fallback": "clip"} if method == "learned" else {}
    return build_model(method, config, **{**kwargs, **model_kwargs}).to(device)


def _readback(model, config: Config) -> dict | None:
    """The learned bias at offsets 0..2*train_len-1 (FIRE: query at 2*train_len-1)."""
    if not model.uses_bias:
        return None
    max_offset = 2 * config.train_len - 1
    table = learned_bias(model, max_offset)
    return {
        "max_offset": max_offset,
        "query_position": max_offset,
        "module": repr(model.bias_modules()[0]),
        "values": [[round(v, 5) for v in row] for row in table.tolist()],
    }


def gate_readback(model, idx: torch.Tensor, distance: int | None = None) -> dict:
    """What a forget-gate model's gates learned, read on the token ids ``idx`` ``[batch, len]``.

    Per layer and head (lists ``[layers][heads]``): the mean :math:`\\log f_t` over the
    tokens and its 10 %, 50 % and 90 % quantiles; with ``distance`` also the mean bias
    the gates put between the last position and the token ``distance`` back (the sum of
    :math:`\\log f_t` over the last ``distance`` tokens: the probe's far key).
    """
    log_f = model.gate_log_forget(idx).double()  # [layers, batch, heads, len]
    per_head = log_f.permute(0, 2, 1, 3).flatten(2)  # [layers, heads, tokens]
    qs = torch.quantile(per_head, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), dim=-1)

    def rounded(t):
        return [[round(v, 5) for v in row] for row in t.tolist()]

    out = {
        "module": repr(model.gates()[0]),
        "tokens": idx.numel(),
        "mean_log_forget": rounded(per_head.mean(-1)),
        "log_forget_quantiles": {q: rounded(qs[i]) for i, q in enumerate(("0.1", "0.5", "0.9"))},
    }
    if distance is not None:
        if not 1 <= distance < idx.shape[1]:
            raise ValueError(f"distance must be in 1..{idx.shape[1] - 1}, got {distance}")
        out["distance"] = distance
        out["bias_at_distance"] = rounded(log_f[..., -distance:].sum(-1).mean(1))
    return out


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
    length), the evaluation rows of :func:`~relbias.lab.training.evaluate_lengths` (with
    the bytes and validation files read at each length) and, for bias families, the
    learned bias. ``model_kwargs`` go to :class:`~relbias.lab.model.TinyLM` (e.g.
    ``bias_kwargs``), ``train_kwargs`` to :func:`~relbias.lab.training.train_lm`
    (checkpointing, hooks).
    """
    corpus = corpus or load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=False)
    model = _new_model(method, config, device, **(model_kwargs or {}))
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
        "learned_bias": _readback(model, config),
    }
    if model.gates():  # read on the first validation windows of the training length
        windows = corpus.val[: config.eval_batch_size * config.train_len].long()
        idx = windows.view(config.eval_batch_size, config.train_len).to(device)
        record["learned_gate"] = gate_readback(model, idx)
    return model, record


def _sweep(run_one, methods, device, verbose: bool):
    """Run ``run_one(method, device)`` for every method; (device, records, wall seconds)."""
    methods = resolve_methods(methods or ["all"])
    device = device or pick_device(verbose=verbose)
    start, records = time.perf_counter(), {}
    for method in methods:
        _, records[method] = run_one(method, device)
        if verbose:
            _report(method, records[method])
    return device, records, time.perf_counter() - start


def run_seeds(
    run_one,
    names,
    seeds,
    *,
    identity: dict,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    verbose: bool = True,
) -> dict:
    """Run ``run_one(name, seed, train_kwargs) -> record`` for every seed and name.

    Seed by seed (every name for the first seed, then the next), so that a stopped sweep
    holds whole seeds. With ``checkpoint_dir`` the sweep keeps its progress there
    (:class:`~relbias.lab.checkpoint.SweepProgress`): each finished run's record, and the
    run in progress checkpointed every ``checkpoint_seconds`` seconds (or
    ``checkpoint_every`` steps) and on Ctrl-C; ``resume=True`` skips the finished runs
    and continues the one in progress. Returns ``{name: {seed: record}}``.
    """
    from relbias.lab.checkpoint import SweepProgress

    seeds = _check_seeds(seeds)
    progress = None
    if checkpoint_dir is not None:
        progress = SweepProgress(checkpoint_dir, identity, resume=resume)
    records = {name: {} for name in names}
    for seed in seeds:
        for name in names:
            if progress is not None and progress.done(name, seed):
                records[name][seed] = progress.get(name, seed)
                if verbose:
                    print(f"{name} seed {seed}: finished earlier (from {progress.folder})")
                continue
            train_kwargs = {}
            if progress is not None:
                train_kwargs = {
                    "checkpoint": progress.current_path,
                    "resume": progress.current_matches(name, seed),
                    "run_id": progress.key(name, seed),
                    "checkpoint_seconds": checkpoint_seconds,
                    "checkpoint_every": checkpoint_every,
                }
            record = run_one(name, seed, train_kwargs)
            records[name][seed] = record
            if progress is not None:
                progress.finish(name, seed, record)
            if verbose:
                _report(f"{name} seed {seed}", record)
    return records


def _check_seeds(seeds) -> list[int]:
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    return seeds


def summarize_extrapolation(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's records ``{seed: record}`` as a summary over seeds.

    ``eval`` rows hold the mean ``bpb`` and its t-interval (``bpb_low``, ``bpb_high``,
    ``bpb_sd``, ``n``) per length, the bytes and files read, and the mean loss by
    position; ``learned_bias`` is the first seed's; ``seeds`` keeps every record.
    """
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        values = [per_seed[s]["eval"][i]["bpb"] for s in seeds]
        iv = interval(values, confidence)
        positions = torch.tensor([per_seed[s]["eval"][i]["loss_by_position"] for s in seeds])
        summary = {k: row[k] for k in ("factor", "length", "windows", "bytes") if k in row}
        if "files" in row:
            summary["files"] = row["files"]
        summary.update(
            bpb=iv["mean"],
            bpb_low=iv["low"],
            bpb_high=iv["high"],
            bpb_sd=iv["sd"],
            n=iv["n"],
            loss_by_position=[round(v, 4) for v in positions.mean(0).tolist()],
        )
        rows.append(summary)
    return {
        "params": first["params"],
        "train": _train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def _train_summary(per_seed: dict) -> dict:
    trains = [rec["train"] for rec in per_seed.values()]
    out = {
        "steps": trains[0]["steps"],
        "final_loss_bits": statistics.fmean(t["final_loss_bits"] for t in trains),
        "wall_s": sum(t["wall_s"] for t in trains),
        "tokens_per_s": statistics.fmean(t["tokens_per_s"] for t in trains),
    }
    curves = [t["val_curve"] for t in trains if len(t.get("val_curve", ())) >= 2]
    if curves:
        out["val_levelled"] = [levelled_off(c) for c in curves]
    return out


def _sweep_identity(kind: str, config: Config, names, seeds, **extra) -> dict:
    return {
        "kind": kind,
        "config": config.to_dict(),
        "names": list(names),
        "seeds": list(seeds),
        **extra,
    }


def _seed_sweep(
    kind,
    train_one,
    summarize,
    config,
    methods,
    seeds,
    *,
    device,
    verbose,
    identity_extra,
    checkpoint,
):
    """Both experiments' multi-seed (or checkpointed) sweep: every method for every seed.

    ``train_one(method, config, device, train_kwargs) -> (model, record)`` trains one run;
    ``summarize({seed: record})`` makes a method's summary over seeds. Returns ``(device,
    records, seed_list, wall_s)``: with ``seeds`` the summaries and the seed list, without
    them (a checkpointed single-seed run) each method's record and None.
    """
    names = resolve_methods(methods or ["all"])
    multi = seeds is not None
    seed_list = _check_seeds(seeds) if multi else [config.seed]
    device = device or pick_device(verbose=verbose)
    start = time.perf_counter()

    def run_one(method, seed, train_kwargs):
        return train_one(method, config.replace(seed=seed), device, train_kwargs)[1]

    identity = _sweep_identity(kind, config, names, seed_list, **identity_extra)
    per = run_seeds(run_one, names, seed_list, identity=identity, verbose=verbose, **checkpoint)
    wall_s = time.perf_counter() - start
    if multi:
        return device, {m: summarize(per[m]) for m in names}, seed_list, wall_s
    return device, {m: per[m][config.seed] for m in names}, None, wall_s


def run_extrapolation(
    config: Config | None = None,
    methods=None,
    *,
    out=None,
    device=None,
    progress: bool = True,
    factors=None,
    verbose: bool = True,
    seeds=None,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    model_kwargs: dict | None = None,
    tag: str | None = None,
) -> dict:
    """Train and evaluate every method; returns (and with ``out`` writes) the results.

    Without ``seeds`` (and without ``checkpoint_dir``): one run per method with
    ``config.seed``, ``results["methods"][method]`` its record (the stored quick format).
    With ``seeds`` (a list): one run per method and seed, ``results["methods"][method]``
    the summary of :func:`summarize_extrapolation` (mean and 95 % t-interval per length,
    every seed's record under ``"seeds"``). ``checkpoint_dir`` and ``resume``: see
    :func:`run_seeds`. ``model_kwargs`` go to every method's
    :class:`~relbias.lab.model.TinyLM` (e.g. ``{"bias_kwargs": {"bias_init": 5.0}}`` for
    the forget gate) and are kept in the results; ``tag`` names a variant: the file is
    ``extrapolation_<config>_<tag>.json``.
    """
    tag = check_tag(tag)
    checkpoint = {
        "checkpoint_dir": checkpoint_dir,
        "resume": resume,
        "checkpoint_seconds": checkpoint_seconds,
        "checkpoint_every": checkpoint_every,
    }
    config = config or get_config()
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    if seeds is None and checkpoint_dir is None:  # the single-seed quick format

        def one(method, device):
            return train_and_evaluate(
                method,
                config,
                corpus=corpus,
                device=device,
                progress=progress,
                factors=factors,
                model_kwargs=model_kwargs,
            )

        device, records, wall_s = _sweep(one, methods, device, verbose)
        results = {
            "kind": "extrapolation",
            "methods": records,
            "corpus": corpus.describe(),
            "provenance": provenance(config, device, wall_s=wall_s),
        }
    else:

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

        device, records, seed_list, wall_s = _seed_sweep(
            "extrapolation",
            train_one,
            summarize_extrapolation,
            config,
            methods,
            seeds,
            device=device,
            verbose=verbose,
            identity_extra={"factors": factors, "model_kwargs": model_kwargs},
            checkpoint=checkpoint,
        )
        results = {"kind": "extrapolation", "methods": records}
        if seed_list is not None:
            results["seeds"] = seed_list
            results["interval"] = INTERVAL_NOTE
        results["corpus"] = corpus.describe()
        results["provenance"] = provenance(config, device, wall_s=wall_s)
    _add_variant(results, model_kwargs, tag)
    if out is not None:
        _write(results, out)
    return results


INTERVAL_NOTE = {
    "confidence": 0.95,
    "method": "two-sided Student-t interval of the mean over seeds (relbias.lab.stats)",
}


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
    """Train one method on the recall probe and measure accuracy against distance.

    Returns ``(model, record)``; ``record["eval"]`` has one row per (length, distance);
    for bias families ``record["learned_bias"]`` is the learned penalty read back.
    """
    device = device or pick_device(verbose=False)
    model = _new_model(method, config, device, **(model_kwargs or {}))
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
        record["learned_bias"] = _readback(model, config)
    if model.gates():  # read on probe sequences with the answer as far back as trained
        far = probe_max_distance(config, config.train_len)
        gen = torch.Generator().manual_seed(0)
        idx, _ = probe_batch(config, config.probe_batch_size, config.train_len, far, gen)
        record["learned_gate"] = gate_readback(model, idx.to(device), distance=far)
    return model, record


def summarize_retrieval(per_seed: dict, confidence: float = 0.95) -> dict:
    """One method's probe records ``{seed: record}``: mean accuracy and t-interval per
    (length, distance), every seed's record under ``"seeds"``."""
    seeds = list(per_seed)
    first = per_seed[seeds[0]]
    rows = []
    for i, row in enumerate(first["eval"]):
        iv = interval([per_seed[s]["eval"][i]["accuracy"] for s in seeds], confidence)
        rows.append(
            {
                "length": row["length"],
                "distance": row["distance"],
                "samples": row["samples"],
                "accuracy": iv["mean"],
                "accuracy_low": iv["low"],
                "accuracy_high": iv["high"],
                "accuracy_sd": iv["sd"],
                "n": iv["n"],
            }
        )
    return {
        "params": first["params"],
        "train": _train_summary(per_seed),
        "eval": rows,
        "learned_bias": first.get("learned_bias"),
        **({"learned_gate": first["learned_gate"]} if "learned_gate" in first else {}),
        "seeds": {str(s): per_seed[s] for s in seeds},
    }


def run_retrieval(
    config: Config | None = None,
    methods=None,
    *,
    out=None,
    device=None,
    progress: bool = True,
    factors=None,
    distances=None,
    verbose: bool = True,
    seeds=None,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    model_kwargs: dict | None = None,
    tag: str | None = None,
) -> dict:
    """Train every method on the probe; returns (and with ``out`` writes) the results.

    ``seeds``, ``checkpoint_dir``, ``resume``, ``model_kwargs``, ``tag``: as in
    :func:`run_extrapolation` (with seeds, each method's record is
    :func:`summarize_retrieval`'s).
    """
    tag = check_tag(tag)
    checkpoint = {
        "checkpoint_dir": checkpoint_dir,
        "resume": resume,
        "checkpoint_seconds": checkpoint_seconds,
        "checkpoint_every": checkpoint_every,
    }
    config = config or get_config()
    if seeds is None and checkpoint_dir is None:  # the single-seed quick format

        def one(method, device):
            return train_and_probe(
                method,
                config,
                device=device,
                progress=progress,
                factors=factors,
                distances=distances,
                model_kwargs=model_kwargs,
            )

        device, records, wall_s = _sweep(one, methods, device, verbose)
        seed_list = None
    else:

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

        device, records, seed_list, wall_s = _seed_sweep(
            "retrieval",
            train_one,
            summarize_retrieval,
            config,
            methods,
            seeds,
            device=device,
            verbose=verbose,
            identity_extra={
                "factors": factors,
                "distances": distances,
                "model_kwargs": model_kwargs,
            },
            checkpoint=checkpoint,
        )
    results = {
        "kind": "retrieval",
        "methods": records,
        "probe": _probe_description(config),
        "provenance": provenance(config, device, wall_s=wall_s),
    }
    if seed_list is not None:
        results["seeds"] = seed_list
        results["interval"] = INTERVAL_NOTE
    _add_variant(results, model_kwargs, tag)
    if out is not None:
        _write(results, out)
    return results


def check_tag(tag: str | None) -> str | None:
    """A variant's tag: None, or lower-case letters, digits and ``_`` (it ends a file name)."""
    if tag is None:
        return None
    if not isinstance(tag, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_]*", tag):
        raise ValueError(
            f"tag must be lower-case letters, digits and '_' (starting with a letter or "
            f"digit), got {tag!r}"
        )
    return tag


def _add_variant(results: dict, model_kwargs: dict | None, tag: str | None) -> None:
    if model_kwargs:
        results["model_kwargs"] = model_kwargs
    if tag is not None:
        results["tag"] = tag


def result_name(results: dict) -> str:
    """The file stem of ``results``: ``<kind>_<config>`` and, for a tagged variant, ``_<tag>``."""
    return file_stem(results["kind"], results["provenance"]["config"]["name"], results.get("tag"))


def file_stem(kind: str, config_name: str, tag: str | None = None) -> str:
    """``<kind>_<config>``, and ``_<tag>`` for a tagged variant: a result's file name."""
    return f"{kind}_{config_name}" + (f"_{tag}" if tag else "")


def _probe_description(config: Config) -> dict:
    if config.probe_task == "competing":
        return {
            "task": "competing: recall the far key's digit past nearer key-digit pairs",
            "num_competitors": config.probe_competitors,
            "min_distance": probe_min_distance(config),
            "chance": 0.1,
            "guess_among_present": 1 / (config.probe_competitors + 1),
        }
    return {
        "task": "key-value recall, answer copied from `distance` back",
        "num_pairs": config.probe_num_pairs,
        "num_distractors": config.probe_distractors,
        "chance": 0.1,
    }


def _report(method: str, rec: dict) -> None:
    train = rec["train"]
    print(
        f"{method}: {train['steps']} steps in {train['wall_s']:.1f} s "
        f"({train['tokens_per_s']:.0f} tokens/s), final training loss "
        f"{train['final_loss_bits']:.3f} bits",
        flush=True,
    )


def _write(results: dict, out) -> None:
    name = result_name(results)
    out = Path(out)
    save_results(results, out / f"{name}.json")
    plot_results(results, out / f"{name}.png")


# --- tables ----------------------------------------------------------------------------------


def _cell(row: dict) -> str:
    low, high = row.get("bpb_low"), row.get("bpb_high")
    if low is None or not math.isfinite(low):
        return f"{row['bpb']:7.3f}"
    return f"{row['bpb']:7.3f}+-{(high - low) / 2:.3f}"


def _extrapolation_row(method: str, rec: dict) -> str:
    bpb = " ".join(f"{_cell(r):>13s}" if "bpb_low" in r else _cell(r) for r in rec["eval"])
    return (
        f"{method:13s} {rec['params']:8d} {rec['train']['final_loss_bits']:7.3f} {bpb} "
        f"{rec['train']['wall_s']:7.1f}"
    )


def extrapolation_table(results: dict) -> str:
    """The results as a text table: bits per byte at each evaluation length."""
    first = next(iter(results["methods"].values()))
    width = 13 if "bpb_low" in first["eval"][0] else 7
    head = " ".join(f"{str(r['length']):>{width}s}" for r in first["eval"])
    lines = [f"{'method':13s} {'params':>8s} {'train':>7s} {head} {'train_s':>7s}"]
    lines += [_extrapolation_row(m, rec) for m, rec in results["methods"].items()]
    if "seeds" in results:
        lines.append(
            f"mean over seeds {results['seeds']} +- half-width of the 95 % t-interval; "
            "train_s: total over seeds"
        )
    return "\n".join(lines)


def retrieval_table(results: dict) -> str:
    """The results as text: one block per sequence length, accuracy at each distance."""
    first = next(iter(results["methods"].values()))
    lines = []
    for length in sorted({r["length"] for r in first["eval"]}):
        distances = [r["distance"] for r in first["eval"] if r["length"] == length]
        lines.append(f"accuracy at sequence length {length}, by distance back to the answer")
        lines.append(f"{'method':13s} " + " ".join(f"{d:>5d}" for d in distances))
        for method, rec in results["methods"].items():
            acc = {r["distance"]: r["accuracy"] for r in rec["eval"] if r["length"] == length}
            lines.append(f"{method:13s} " + " ".join(f"{acc[d]:5.2f}" for d in distances))
    return "\n".join(lines)


# --- command line -----------------------------------------------------------------------------


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be an integer > 0, got {text!r}")
    return value


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m relbias.lab.experiments",
        description="Train TinyLMs with each positional method and compare them.",
    )
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    for name, helptext in (
        ("extrapolation", "bits per byte at 1x..16x the training length"),
        ("retrieval", "key-value recall accuracy against distance"),
    ):
        p = sub.add_parser(name, help=helptext, description=helptext)
        p.add_argument(
            "--config",
            choices=CONFIG_NAMES,
            default=None,
            help="named configuration (default: quick, or $RELBIAS_CONFIG)",
        )
        p.add_argument(
            "--methods",
            nargs="+",
            default=["all"],
            metavar="METHOD",
            help=f"methods: {', '.join(POSITION_NAMES)}, or all/biases/baselines",
        )
        p.add_argument("--out", default="results", help="output folder (default: results)")
        p.add_argument("--steps", type=_positive_int, help="training steps (override)")
        p.add_argument("--train-len", type=_positive_int, help="training length (override)")
        p.add_argument(
            "--lengths",
            type=_positive_int,
            nargs="+",
            metavar="FACTOR",
            help="evaluation lengths as multiples of the training length",
        )
        p.add_argument("--seed", type=int, help="random seed (override)")
        p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
        p.add_argument("--no-progress", action="store_true", help="hide progress bars")
        p.add_argument(
            "--gate-bias-init",
            type=_finite_float,
            metavar="B",
            help="the forget gate's initial bias b (f = sigmoid(b) at the start; default 0, "
            "as the reference code); only with gated methods (forgetting)",
        )
        p.add_argument(
            "--tag",
            help="name of a variant: writes <experiment>_<config>_<tag>.json",
        )
        _add_seed_and_checkpoint_options(p)
        if name == "extrapolation":
            p.add_argument(
                "--eval-tokens",
                type=_positive_int,
                help="validation bytes read at every length (override)",
            )
            p.add_argument(
                "--eval-spread",
                action="store_true",
                help="draw the evaluation text evenly across the validation files "
                "(the medium and full configurations do)",
            )
        if name == "retrieval":
            p.add_argument(
                "--probe",
                choices=TASKS,
                help="probe task: recall (one key-value pair) or competing (the far key "
                "against nearer key-digit pairs); default: the configuration's",
            )
            p.add_argument(
                "--competitors",
                type=_non_negative_int,
                help="competing pairs nearer the query (--probe competing; override)",
            )
            p.add_argument(
                "--distances",
                type=_positive_int,
                nargs="+",
                metavar="D",
                help="distances back to the answer (default: 1, 2, 4, ... )",
            )
            p.add_argument(
                "--num-pairs", type=_positive_int, help="key-value pairs per sequence (override)"
            )
            p.add_argument(
                "--distractors",
                type=_non_negative_int,
                help="lone digits scattered in each sequence (override)",
            )
    _add_interpolation_parser(sub)
    _add_ablation_parser(sub)
    return parser


def _add_seed_and_checkpoint_options(p) -> None:
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=_non_negative_int,
        nargs="+",
        metavar="SEED",
        help="run every method with each of these seeds and report the mean and a 95 %% "
        "t-interval per length (every seed is kept in the JSON)",
    )
    seeds.add_argument(
        "--num-seeds",
        type=_positive_int,
        metavar="N",
        help="the same with seeds 0..N-1",
    )
    p.add_argument(
        "--checkpoint-dir",
        help="where the sweep keeps its progress and the run in progress "
        "(default: OUT/checkpoints/<experiment>_<config>)",
    )
    p.add_argument(
        "--checkpoint-minutes",
        type=_positive_float,
        default=2.0,
        help="minutes between checkpoints of the run in progress (default 2)",
    )
    p.add_argument(
        "--checkpoint-every-steps",
        type=_positive_int,
        help="also checkpoint every this many training steps",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the sweep saved in the checkpoint folder (same command line)",
    )


def _add_ablation_parser(sub) -> None:
    from relbias.lab.ablations import ABLATIONS, DEFAULT_BUCKETS, DEFAULT_DIST_MAX_FACTORS

    helptext = (
        "ablations: T5's dist_max and buckets, FIRE with shifted queries and clamped inputs, "
        "offset vs NoPE, Kerple's rate and shape, ALiBi's slopes on the probe"
    )
    p = sub.add_parser("ablation", help=helptext, description=helptext)
    p.add_argument("which", choices=ABLATIONS, help="which ablation")
    p.add_argument("--config", choices=CONFIG_NAMES, default=None, help="named configuration")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument("--steps", type=_positive_int, help="training steps (override)")
    p.add_argument("--train-len", type=_positive_int, help="training length m_l (override)")
    p.add_argument(
        "--lengths",
        type=_positive_int,
        nargs="+",
        metavar="FACTOR",
        help="evaluation lengths as multiples of the training length",
    )
    p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")
    _add_seed_and_checkpoint_options(p)
    p.add_argument(
        "--dist-max-factors",
        type=_positive_float,
        nargs="+",
        default=list(DEFAULT_DIST_MAX_FACTORS),
        metavar="F",
        help="t5: dist_max as these multiples of m_l (default 0.25 0.5 1 2)",
    )
    p.add_argument(
        "--buckets",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_BUCKETS),
        metavar="N",
        help="t5: bucket counts (default 32)",
    )
    p.add_argument(
        "--max-shift",
        type=_positive_int,
        help="fire: largest random query shift in training (default: (longest factor - 1) m_l)",
    )
    p.add_argument(
        "--variants",
        nargs="+",
        metavar="NAME",
        help="run only these variants of the ablation (default: all)",
    )
    p.add_argument(
        "--tag",
        help="name a variant run: writes ablation_<which>_<config>_<TAG>.json",
    )


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text!r}")
    return value


def _add_interpolation_parser(sub) -> None:
    from relbias.lab import interpolation as ip

    helptext = "RoPE read at 1x..16x: no scaling, each interpolation zero-shot and fine-tuned"
    p = sub.add_parser("interpolation", help=helptext, description=helptext)
    p.add_argument("--config", choices=CONFIG_NAMES, default=None, help="named configuration")
    p.add_argument("--out", default="results", help="output folder (default: results)")
    p.add_argument("--seeds", type=_non_negative_int, nargs="+", default=list(ip.DEFAULT_SEEDS))
    p.add_argument("--steps", type=_positive_int, help="pre-training steps (override)")
    p.add_argument("--train-len", type=_positive_int, help="training length m_l (override)")
    p.add_argument(
        "--finetune-factor",
        type=_positive_int,
        default=ip.DEFAULT_FINETUNE_FACTOR,
        help="fine-tune at this multiple of the training length (default 4)",
    )
    p.add_argument(
        "--finetune-steps",
        type=_positive_int,
        nargs="+",
        default=list(ip.DEFAULT_FINETUNE_STEPS),
        help="fine-tuning runs of these many steps (default 25 50 100)",
    )
    p.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    p.add_argument("--no-progress", action="store_true", help="hide progress bars")


def _main_interpolation(parser, args) -> int:
    from relbias.lab import interpolation as ip

    overrides = {"steps": args.steps, "train_len": args.train_len}
    try:
        config = get_config(args.config, **{k: v for k, v in overrides.items() if v is not None})
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    if args.finetune_factor not in config.eval_factors:
        parser.error(f"--finetune-factor must be one of {config.eval_factors}")
    out = _check_out(parser, args.out)
    device = pick_device(args.device, verbose=False)
    print(f"relbias: interpolation, config {config.name}, seeds {args.seeds}", flush=True)
    results = ip.run_interpolation(
        config,
        args.seeds,
        finetune_factor=args.finetune_factor,
        finetune_steps=tuple(args.finetune_steps),
        device=device,
        progress=not args.no_progress,
    )
    name = f"interpolation_{config.name}"
    save_results(results, out / f"{name}.json")
    fig = ip.plot_interpolation(results)
    fig.savefig(out / f"{name}.png", dpi=110)
    print(ip.interpolation_table(results))
    print(f"wall time {results['provenance']['wall_s']:.1f} s; wrote {out / name}.json and .png")
    return 0


def _check_out(parser, out: str) -> Path:
    """Create the output folder and prove it is writable, or stop with a clear message."""
    path = Path(out)
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / ".relbias-write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        parser.error(f"--out {out!r} is not a writable folder: {err.strerror or err}")
    return path


def _config_from_args(parser, args) -> Config:
    overrides = {
        "steps": args.steps,
        "train_len": args.train_len,
        "seed": getattr(args, "seed", None),
    }
    if args.experiment == "ablation" and args.which == "alibi_probe":
        overrides["probe_steps"] = overrides.pop("steps")
        overrides["probe_eval_factors"] = tuple(args.lengths) if args.lengths else None
    elif args.experiment in ("extrapolation", "ablation"):
        overrides["eval_factors"] = tuple(args.lengths) if args.lengths else None
    if args.experiment == "extrapolation":
        overrides["eval_tokens"] = args.eval_tokens
        overrides["eval_spread"] = True if args.eval_spread else None
    elif args.experiment == "retrieval":
        overrides["probe_steps"] = overrides.pop("steps")
        overrides["probe_eval_factors"] = tuple(args.lengths) if args.lengths else None
        overrides["probe_num_pairs"] = args.num_pairs
        overrides["probe_distractors"] = args.distractors
        overrides["probe_task"] = args.probe
        overrides["probe_competitors"] = args.competitors
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = get_config(args.config, **overrides)
        if config.train_len < 4:
            raise ValueError("--train-len must be at least 4")
        if args.experiment == "retrieval" and config.probe_task == "competing":
            if probe_min_distance(config) > probe_max_distance(config, config.train_len):
                raise ValueError(
                    f"{config.probe_competitors} competing pairs do not fit in a training "
                    f"sequence of {config.train_len} tokens (need --train-len >= "
                    f"{4 * config.probe_competitors + 3})"
                )
        elif args.experiment == "retrieval" and (
            2 * config.probe_num_pairs + config.probe_distractors + 1 > config.train_len
        ):
            raise ValueError(
                f"{config.probe_num_pairs} key-value pairs and {config.probe_distractors} "
                f"distractors do not fit in a training sequence of {config.train_len} tokens"
            )
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    return config


def _check_distances(parser, args, config: Config) -> None:
    if args.experiment != "retrieval" or not args.distances:
        return
    longest = max(config.probe_eval_factors) * config.train_len
    too_far = [d for d in args.distances if d > longest - 2]
    if too_far:
        parser.error(
            f"--distances {too_far} do not fit in the longest evaluation sequence "
            f"({longest} tokens, distances up to {longest - 2}); raise --lengths"
        )


def _seeds_from_args(args):
    if args.num_seeds is not None:
        return list(range(args.num_seeds))
    if args.seeds is not None:
        if len(set(args.seeds)) != len(args.seeds):
            raise ValueError(f"--seeds must not repeat, got {args.seeds}")
        return list(args.seeds)
    return None


def _resume_command(argv) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in argv:
        argv.append("--resume")
    return " ".join(["python -m relbias.lab.experiments", *argv])


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.experiment == "interpolation":
        return _main_interpolation(parser, args)
    methods = None
    if args.experiment != "ablation":
        try:
            methods = resolve_methods(args.methods)
        except ValueError as err:
            parser.error(str(err))
    config = _config_from_args(parser, args)
    try:
        seeds = _seeds_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    out = _check_out(parser, args.out)
    try:
        device = pick_device(args.device, verbose=False)
        torch.empty(1, device=device)
    except (RuntimeError, ValueError) as err:
        parser.error(f"--device {args.device!r} is not usable: {err}")
    variant = {}
    if args.experiment != "ablation":
        _check_distances(parser, args, config)
        variant = _variant_from_args(parser, args, methods)
    if args.experiment == "ablation":
        try:
            from relbias.lab.ablations import variants_for

            check_tag(args.tag)
            options = _ablation_options(args)
            variants_for(args.which, config, variants=args.variants, **options)
        except ValueError as err:
            parser.error(str(err))
        name = file_stem(f"ablation_{args.which}", config.name, args.tag)
    else:
        name = file_stem(args.experiment, config.name, args.tag)
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else out / "checkpoints" / name
    what = f"ablation {args.which}" if args.experiment == "ablation" else args.experiment
    print(
        f"relbias: {what}, config {config.name}, device {device_name(device)}, "
        + (f"methods {' '.join(methods)}, " if methods else "")
        + f"seeds {seeds if seeds is not None else [config.seed]}, checkpoints in {ckpt_dir}",
        flush=True,
    )
    common = {
        "device": device,
        "progress": not args.no_progress,
        "checkpoint_dir": ckpt_dir,
        "resume": args.resume,
        "checkpoint_seconds": 60 * args.checkpoint_minutes,
        "checkpoint_every": args.checkpoint_every_steps,
    }
    try:
        if args.experiment == "extrapolation":
            results = run_extrapolation(config, methods, seeds=seeds, **common, **variant)
            table = extrapolation_table(results)
        elif args.experiment == "retrieval":
            results = run_retrieval(
                config, methods, distances=args.distances, seeds=seeds, **common, **variant
            )
            table = retrieval_table(results)
        else:
            from relbias.lab.ablations import run_ablation, write_ablation

            results = run_ablation(
                args.which,
                config,
                seeds=seeds or [config.seed],
                variants=args.variants,
                tag=args.tag,
                **common,
                **options,
            )
            if args.which == "alibi_probe":
                table = retrieval_table(results)
            else:
                table = extrapolation_table(results)
    except KeyboardInterrupt as err:
        _report_interrupt(err, ckpt_dir, argv)
        return 130
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        if "--resume" in str(err):
            parser.error(str(err))
        raise
    if args.experiment == "ablation":
        write_ablation(results, out)
    else:
        _write(results, out)
    _remove_checkpoints(ckpt_dir)
    print(table)
    print(f"wall time {results['provenance']['wall_s']:.1f} s; wrote {out / name}.json and .png")
    return 0


def _ablation_options(args) -> dict:
    """The options of :func:`~relbias.lab.ablations.run_ablation` that ``args.which`` takes."""
    if args.which == "t5":
        return {
            "dist_max_factors": tuple(args.dist_max_factors),
            "buckets": tuple(args.buckets),
        }
    if args.which == "fire" and args.max_shift is not None:
        return {"max_shift": args.max_shift}
    return {}


def _variant_from_args(parser, args, methods) -> dict:
    """``model_kwargs`` and ``tag`` of :func:`run_extrapolation` from the command line."""
    try:
        tag = check_tag(args.tag)
    except ValueError as err:
        parser.error(f"--tag: {err}")
    variant = {"tag": tag}
    if args.gate_bias_init is not None:
        other = [m for m in methods if m not in GATED_POSITIONS]
        if other:
            parser.error(
                f"--gate-bias-init applies to the gated methods ({', '.join(GATED_POSITIONS)}) "
                f"only; drop {', '.join(other)} from --methods"
            )
        variant["model_kwargs"] = {"bias_kwargs": {"bias_init": args.gate_bias_init}}
    return variant


def _remove_checkpoints(folder: Path) -> None:
    """Delete a finished sweep's checkpoint folder (and ``checkpoints/`` when left empty)."""
    from relbias.lab.checkpoint import remove_sweep

    if (folder / "progress.json").is_file():
        remove_sweep(folder)
        if folder.parent.name == "checkpoints":
            try:
                folder.parent.rmdir()
            except OSError:
                pass


def _report_interrupt(err, ckpt_dir: Path, argv) -> None:
    """Say what a Ctrl-C left on disk and how to continue."""
    import json

    done = []
    progress = ckpt_dir / "progress.json"
    if progress.is_file():
        done = sorted(json.loads(progress.read_text()).get("records", {}))
    lines = ["", "relbias: interrupted (Ctrl-C)."]
    lines.append(
        f"  finished runs saved in {progress}: {len(done)}"
        + (f" ({', '.join(done)})" if done else "")
    )
    step = getattr(err, "step", None)
    if step is not None:
        lines.append(
            f"  the run in progress was saved after training step {step} "
            f"in {ckpt_dir / 'current.pt'}"
        )
    else:
        lines.append(
            f"  the run in progress continues from its last checkpoint in "
            f"{ckpt_dir / 'current.pt'} (if any; otherwise it starts again)"
        )
    lines.append(f"  resume with: {_resume_command(argv)}")
    print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
