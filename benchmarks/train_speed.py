"""Wall time and tokens per second of the extrapolation sweep, per positional method.

    python benchmarks/train_speed.py [--config quick] [--methods ...] [--steps N] [--no-eval]

Trains each method as ``python -m relbias.lab.experiments extrapolation`` does (same
config, same batches), times training and the 1x..16x evaluation separately, and
prints one row per method plus the total. With ``--steps`` smaller than the config's,
the last line extrapolates the sweep's training time to the config's step count.
Timings on a shared CPU vary with what else runs: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import sys
import time

from relbias.lab.data import load_corpus
from relbias.lab.experiments import resolve_methods
from relbias.lab.training import (
    build_model,
    device_name,
    evaluate_lengths,
    get_config,
    pick_device,
    seed_everything,
    train_lm,
)


def time_method(method, config, corpus, device, *, steps, evaluate):
    """(train seconds, tokens per second, eval seconds) for one method."""
    seed_everything(config.seed)
    kwargs = {"learned_fallback": "clip"} if method == "learned" else {}
    model = build_model(method, config, **kwargs).to(device)
    history = train_lm(model, corpus.train, config, steps=steps, device=device, progress=False)
    eval_s = 0.0
    if evaluate:
        start = time.perf_counter()
        evaluate_lengths(model, corpus.val, config, device=device)
        eval_s = time.perf_counter() - start
    return history["wall_s"], history["tokens_per_s"], eval_s


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("quick", "full"), default="quick")
    parser.add_argument("--methods", nargs="+", default=["all"])
    parser.add_argument("--steps", type=int, help="training steps (default: the config's)")
    parser.add_argument("--no-eval", action="store_true", help="time training only")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    args = parser.parse_args(argv)
    try:
        methods = resolve_methods(args.methods)
    except ValueError as err:
        parser.error(str(err))
    config = get_config(args.config)
    steps = args.steps or config.steps
    if steps <= 0:
        parser.error("--steps must be > 0")
    device = pick_device(args.device, verbose=False)
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    print(
        f"config {config.name}: {steps} steps of {config.batch_size}x{config.train_len} "
        f"tokens, device {device_name(device)}"
    )
    print(f"{'method':13s} {'train_s':>8s} {'tokens/s':>9s} {'eval_s':>7s}")
    total_train = total_eval = 0.0
    for method in methods:
        train_s, tps, eval_s = time_method(
            method, config, corpus, device, steps=steps, evaluate=not args.no_eval
        )
        total_train, total_eval = total_train + train_s, total_eval + eval_s
        print(f"{method:13s} {train_s:8.1f} {tps:9.0f} {eval_s:7.1f}", flush=True)
    print(f"{'total':13s} {total_train:8.1f} {'':9s} {total_eval:7.1f}")
    if steps != config.steps:
        estimate = total_train * config.steps / steps + total_eval
        print(f"estimated sweep at {config.steps} steps: {estimate:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
