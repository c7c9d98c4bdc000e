"""The one sweep runner: every variant for every seed, with checkpoints, summarised over seeds.

The extrapolation and retrieval experiments, the ablations and the interpolation
experiment all run through :func:`run_sweep`: a list of named variants (a method with
its model's keyword arguments, or an ablation's variant), a list of seeds, and one
function that trains and evaluates a variant for one seed and returns its record. The
runner goes seed by seed (every variant for the first seed, then the next), so that a
stopped sweep holds whole seeds; with a checkpoint folder it keeps each finished run's
record and the run in progress (:class:`~relbias.lab.checkpoint.SweepProgress`), and the
same call with ``resume=True`` continues where it stopped and returns what an
uninterrupted sweep returns. The result holds each variant's summary over seeds, the seeds,
the interval convention and the provenance (:func:`~relbias.lab.results.provenance`).
"""

from __future__ import annotations

import time

from relbias.lab.checkpoint import SweepProgress
from relbias.lab.config import Config
from relbias.lab.results import INTERVAL_NOTE, provenance

__all__ = ["check_seeds", "run_seeds", "run_sweep"]


def check_seeds(seeds) -> list[int]:
    """``seeds`` as a list: non-empty, integers >= 0, no repeats (else a ValueError)."""
    seeds = list(seeds)
    if not seeds or any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in seeds):
        raise ValueError(f"seeds must be a non-empty list of integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must not repeat, got {seeds!r}")
    return seeds


def report(name: str, record: dict) -> None:
    """Print one line about a finished run (its training summary)."""
    train = record.get("train", {})
    speed = f" ({train['tokens_per_s']:.0f} tokens/s)" if "tokens_per_s" in train else ""
    print(
        f"{name}: {train.get('steps', '?')} steps in {train.get('wall_s', 0):.1f} s{speed}, "
        f"final training loss {train.get('final_loss_bits', float('nan')):.3f} bits",
        flush=True,
    )


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

    Seed by seed (every name for the first seed, then the next). With ``checkpoint_dir``
    the sweep keeps its progress there: each finished run's record, and the run in
    progress checkpointed every ``checkpoint_seconds`` seconds (or ``checkpoint_every``
    steps) and on Ctrl-C (``train_kwargs`` carries the checkpoint to
    :func:`~relbias.lab.training.train_lm`); ``resume=True`` skips the finished runs and
    continues the one in progress. ``identity`` (what the sweep is) must match the saved
    progress's. Returns ``{name: {seed: record}}``.
    """
    seeds = check_seeds(seeds)
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
                report(f"{name} seed {seed}", record)
    return records


def run_sweep(
    kind: str,
    config: Config,
    names,
    seeds,
    run_one,
    summarize,
    *,
    device,
    identity_extra: dict | None = None,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    verbose: bool = True,
) -> dict:
    """Run every name of ``names`` for every seed (:func:`run_seeds`) and summarise each
    over seeds with ``summarize({seed: record}) -> summary``.

    ``run_one(name, seed, train_kwargs) -> record`` trains and evaluates one run (it builds
    the seed's configuration itself: ``config.replace(seed=seed)``). Returns ``{"kind",
    "methods": {name: summary}, "seeds", "interval", "provenance"}``; the caller adds what
    is particular to its experiment (the corpus, the probe, variants, a tag).
    ``identity_extra`` joins what identifies the sweep for resuming (factors, options).
    """
    names = list(names)
    seeds = check_seeds(seeds)
    start = time.perf_counter()
    identity = {
        "kind": kind,
        "config": config.to_dict(),
        "names": names,
        "seeds": seeds,
        **(identity_extra or {}),
    }
    per = run_seeds(
        run_one,
        names,
        seeds,
        identity=identity,
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_seconds=checkpoint_seconds,
        checkpoint_every=checkpoint_every,
        verbose=verbose,
    )
    return {
        "kind": kind,
        "methods": {name: summarize(per[name]) for name in names},
        "seeds": seeds,
        "interval": INTERVAL_NOTE,
        "provenance": provenance(config, device, wall_s=time.perf_counter() - start),
    }
