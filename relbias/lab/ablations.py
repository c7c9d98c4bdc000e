"""Ablations that test the chapters' explanations of T5, FIRE and the clipped offset table.

``python -m relbias.lab.experiments ablation {t5,fire,offset} [--config medium] [--seeds ...]``
runs one of them (:func:`run_ablation`); every variant is trained and evaluated at every
length like a method of the extrapolation sweep, for every seed, with checkpoints and
``--resume``. The result, ``ablation_<which>_<config>.json``, summarises each variant over
seeds (mean and 95 % t-interval per length) and keeps every seed.

``t5``
    T5 buckets with ``max_distance`` (the book's ``dist_max``) at ``m_l/4, m_l/2, m_l,
    2 m_l`` (``dist_max_factors``) for each bucket count in ``buckets``. Where a bucket
    count leaves no logarithmic bucket below ``dist_max`` it is lowered to the largest
    that does, and the variant's name says so. For every run: the learned table per
    bucket (``bucket_table``), the first offset of each bucket, how far the last bucket
    sits above the lowest earlier bucket (``far_above_min``: positive means far keys are
    penalised less than middle ones), and an intervention: the same weights evaluated
    again with the table made non-increasing in distance (``eval_monotone``, each bucket
    lowered to the minimum of the buckets before it). If the non-monotone table is what
    breaks T5 at 16x, ``eval_monotone`` recovers there.
``fire``
    FIRE as in the sweep (``fire``), and FIRE trained with the whole sequence placed at a
    random absolute position ``s`` in ``0 .. max_shift`` at every step (``fire_shift``;
    :attr:`relbias.lab.model.TinyLM.bias_query_shift`), so that training queries reach
    ``i = m_l - 1 + max_shift`` and the MLP sees inputs ``psi(1)/psi(i)`` inside the gap
    ``(0, psi(1)/psi(L))`` that plain training never produces. ``max_shift`` defaults to
    ``(max eval factor - 1) * m_l``: the queries of the longest evaluation. Each run
    records the smallest nonzero MLP input trained (``min_trained_input``) and the one the
    longest evaluation needs, and the learned bias read at query ``16 m_l - 1``.
``offset``
    The clipped offset table (``offset``) against NoPE (``nope``): the loss by position
    at the longest length, averaged inside the training length and past it
    (``within_train_len_bpb``, ``past_train_len_bpb``), to measure the remark that the
    clipped table behaves like NoPE past the training length.
"""

from __future__ import annotations

import math
import time

import torch

from relbias.lab.data import load_corpus
from relbias.lab.training import (
    Config,
    evaluate_lengths,
    get_config,
    learned_bias,
    pick_device,
    provenance,
)

ABLATIONS = ("t5", "fire", "offset")
DEFAULT_DIST_MAX_FACTORS = (0.25, 0.5, 1.0, 2.0)
DEFAULT_BUCKETS = (32,)


def t5_variants(config: Config, dist_max_factors=DEFAULT_DIST_MAX_FACTORS, buckets=DEFAULT_BUCKETS):
    """The T5 variants: ``[{"name", "method", "model_kwargs"}, ...]``."""
    factors = tuple(dist_max_factors)
    if not factors or any(
        isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0 for f in factors
    ):
        raise ValueError(f"dist_max_factors must be numbers > 0, got {dist_max_factors!r}")
    buckets = tuple(buckets)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in buckets):
        raise ValueError(f"buckets must be integers >= 2, got {buckets!r}")
    out, seen = [], set()
    for nb in buckets:
        for f in factors:
            dist_max = max(2, round(f * config.train_len))
            used = min(nb, 2 * dist_max - 2)  # causal: nb // 2 exact buckets < dist_max
            name = f"t5_d{dist_max}_b{used}" + (f"_from{nb}" if used != nb else "")
            if name in seen:
                continue
            seen.add(name)
            out.append(
                {
                    "name": name,
                    "method": "t5",
                    "model_kwargs": {
                        "bias_kwargs": {"num_buckets": used, "max_distance": dist_max}
                    },
                    "dist_max_factor": f,
                    "dist_max": dist_max,
                    "num_buckets": used,
                    "num_buckets_asked": nb,
                }
            )
    return out


def fire_variants(config: Config, max_shift: int | None = None):
    """FIRE as in the sweep, and FIRE trained with random query shifts up to ``max_shift``."""
    if max_shift is None:
        max_shift = (max(config.eval_factors) - 1) * config.train_len
    if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 1:
        raise ValueError(f"max_shift must be an integer >= 1, got {max_shift!r}")
    return [
        {"name": "fire", "method": "fire", "model_kwargs": {}, "max_shift": 0},
        {"name": "fire_shift", "method": "fire", "model_kwargs": {}, "max_shift": max_shift},
    ]


def offset_variants(config: Config):
    """The clipped offset table and NoPE."""
    return [
        {"name": "offset", "method": "offset", "model_kwargs": {}},
        {"name": "nope", "method": "nope", "model_kwargs": {}},
    ]


def variants_for(which: str, config: Config, **options) -> list[dict]:
    """The variants of ablation ``which`` (one of :data:`ABLATIONS`)."""
    if which == "t5":
        return t5_variants(config, **options)
    if which == "fire":
        return fire_variants(config, **options)
    if which == "offset":
        if options:
            raise ValueError(f"the offset ablation takes no options, got {sorted(options)}")
        return offset_variants(config)
    raise ValueError(f"ablation must be one of {ABLATIONS}, got {which!r}")


def shift_at(seed: int, step: int, max_shift: int) -> int:
    """The query shift of training step ``step``: uniform in ``0..max_shift``, a function of
    ``(seed, step)`` alone, so that a resumed run draws the same shifts."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return int(torch.randint(0, max_shift + 1, (1,), generator=gen))


@torch.no_grad()
def t5_details(model, config: Config, corpus, factors=None, device=None) -> dict:
    """Read back a trained T5 model's table and evaluate it with the table made monotone."""
    bias = model.bias_modules()[0]
    table = bias.weight.detach().float().cpu()
    longest = max(config.eval_factors if factors is None else factors) * config.train_len
    buckets = bias.buckets(torch.arange(longest))
    first_offset = [int((buckets == b).nonzero()[0]) for b in buckets.unique().tolist()]
    far_above_min = (table[:, -1] - table[:, :-1].min(dim=1).values).tolist()
    saved = bias.weight.detach().clone()
    try:
        bias.weight.copy_(torch.cummin(saved, dim=1).values)
        monotone = evaluate_lengths(model, corpus.val, config, factors=factors, device=device)
    finally:
        bias.weight.copy_(saved)
    return {
        "bucket_table": [[round(v, 5) for v in row] for row in table.tolist()],
        "bucket_first_offset": first_offset,
        "far_above_min": [round(v, 5) for v in far_above_min],
        "eval_monotone": [
            {k: r[k] for k in ("factor", "length", "bytes", "bpb", "loss_by_position")}
            for r in monotone
        ],
    }


@torch.no_grad()
def fire_details(model, config: Config, max_shift: int, factors=None) -> dict:
    """FIRE's smallest trained MLP input against the one the longest evaluation needs."""
    bias = model.bias_modules()[0]
    longest = max(config.eval_factors if factors is None else factors) * config.train_len
    c = float(bias.c.detach().abs())
    L = float(bias.L.detach())

    def smallest(i):  # offset 1 at query i
        return math.log1p(c) / (math.log1p(c * max(L, i)) + bias.eps)

    query = longest - 1
    read = learned_bias(model, max_offset=2 * config.train_len - 1, query_position=query)
    return {
        "c": round(c, 5),
        "L": round(L, 3),
        "max_shift": max_shift,
        "min_trained_input": round(smallest(config.train_len - 1 + max_shift), 5),
        "min_eval_input": round(smallest(query), 5),
        "bias_at_longest_query": {
            "query_position": query,
            "values": [[round(v, 5) for v in row] for row in read.tolist()],
        },
    }


def offset_details(record: dict, config: Config) -> dict:
    """Mean loss at the longest length inside and past the training length."""
    row = record["eval"][-1]
    pos = row["loss_by_position"]
    m = config.train_len
    return {
        "length": row["length"],
        "within_train_len_bpb": sum(pos[:m]) / m,
        "past_train_len_bpb": sum(pos[m:]) / max(len(pos) - m, 1),
    }


def run_ablation(
    which: str,
    config: Config | None = None,
    *,
    seeds=(0,),
    out=None,
    device=None,
    progress: bool = True,
    factors=None,
    verbose: bool = True,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    **options,
) -> dict:
    """Run ablation ``which`` for every variant and seed; returns (and writes) the results.

    ``options``: ``dist_max_factors``, ``buckets`` (t5); ``max_shift`` (fire).
    """
    from relbias.lab.experiments import (
        INTERVAL_NOTE,
        _check_seeds,
        _sweep_identity,
        run_seeds,
        summarize_extrapolation,
        train_and_evaluate,
    )
    from relbias.lab.stats import interval

    config = config or get_config()
    variants = {v["name"]: v for v in variants_for(which, config, **options)}
    seeds = _check_seeds(seeds)
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=verbose)
    start = time.perf_counter()

    def run_one(name, seed, train_kwargs):
        v = variants[name]
        cfg = config.replace(seed=seed)
        shift = v.get("max_shift", 0)
        if shift:
            train_kwargs = {
                **train_kwargs,
                "before_step": lambda step, model: setattr(
                    model, "bias_query_shift", shift_at(seed, step, shift)
                ),
            }
        model, record = train_and_evaluate(
            v["method"],
            cfg,
            corpus=corpus,
            device=device,
            progress=progress,
            factors=factors,
            model_kwargs=v["model_kwargs"],
            train_kwargs=train_kwargs,
        )
        model.bias_query_shift = 0
        if which == "t5":
            record.update(t5_details(model, cfg, corpus, factors, device))
        elif which == "fire":
            record.update(fire_details(model, cfg, shift, factors))
        else:
            record.update(offset_details(record, cfg))
        return record

    identity = _sweep_identity(
        f"ablation_{which}", config, list(variants), seeds, factors=factors, options=options
    )
    per = run_seeds(
        run_one,
        list(variants),
        seeds,
        identity=identity,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_seconds=checkpoint_seconds,
        checkpoint_every=checkpoint_every,
        verbose=verbose,
    )
    summaries = {}
    for name, v in variants.items():
        summary = summarize_extrapolation(per[name])
        summary["variant"] = {k: val for k, val in v.items() if k != "name"}
        if which == "t5":
            mono = {s: {**r, "eval": r["eval_monotone"]} for s, r in per[name].items()}
            summary["eval_monotone"] = summarize_extrapolation(mono)["eval"]
        if which == "offset":
            for key in ("within_train_len_bpb", "past_train_len_bpb"):
                summary[key] = interval([r[key] for r in per[name].values()])
        summaries[name] = summary
    results = {
        "kind": "ablation",
        "ablation": which,
        "methods": summaries,
        "seeds": seeds,
        "interval": INTERVAL_NOTE,
        "corpus": corpus.describe(with_files=False),
        "provenance": provenance(config, device, wall_s=time.perf_counter() - start),
    }
    if out is not None:
        write_ablation(results, out)
    return results


def write_ablation(results: dict, out) -> None:
    """Write ``ablation_<which>_<config>.json`` and a plot of bits per byte by length."""
    from pathlib import Path

    from matplotlib.figure import Figure

    from relbias.lab.training import plot_extrapolation, save_results

    name = f"ablation_{results['ablation']}_{results['provenance']['config']['name']}"
    out = Path(out)
    save_results(results, out / f"{name}.json")
    ax = Figure(figsize=(6, 4.2)).subplots()
    plot_extrapolation(results, ax=ax)
    ax.set_title(f"ablation {results['ablation']}", fontsize=9)
    ax.figure.tight_layout()
    ax.figure.savefig(out / f"{name}.png", dpi=110)
