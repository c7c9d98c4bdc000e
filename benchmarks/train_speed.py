"""Training speed per positional method, and its ratio to the same model with no positions.

    python benchmarks/train_speed.py [--config quick] [--methods ...] [--steps N] [--no-eval]
    python benchmarks/train_speed.py --dim 128 --heads 8 --depth 2 --batch-size 8 \\
        --train-len 512 --warmup-steps 3 --steps 20 --no-eval --methods nope alibi t5 ...

Trains each method as ``python -m relbias.lab extrapolation`` does (same
config, same batches, ``relbias.lab.train_lm``), after ``--warmup-steps``
untimed steps, times ``--steps`` training steps and the 1x..16x evaluation separately,
and prints one row per method: seconds per step, tokens per second, the ratio of its
time per step to ``nope``'s (the same model with no positional scheme: what the bias
costs in training), and the attention backend ``auto`` took. ``--backend materialize``
times the dense bias instead (what training cost before the fused kernel's backward).
With ``--steps`` smaller than the config's, the last line extrapolates the sweep's
training time to the config's step count. Timings on a shared CPU vary with what else
runs: run it on a quiet machine. ``--out FILE`` also writes the rows as JSON, with the
command, the commit, the versions and the load average (``relbias/bench/results/``).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

from relbias._json import write_json
from relbias.attention import choose_backend
from relbias.lab.config import get_config
from relbias.lab.data import load_corpus
from relbias.lab.device import device_name, pick_device, seed_everything
from relbias.lab.evaluation import evaluate_lengths
from relbias.lab.experiments import resolve_methods
from relbias.lab.results import provenance
from relbias.lab.training import build_model, train_lm

#: The model's size, overridable on the command line (``--dim`` ...).
SIZE_OPTIONS = ("dim", "heads", "depth", "batch_size", "train_len")


def attention_backend(model, config, device) -> str:
    """The backend ``auto`` takes for the model's attention in training (or its override)."""
    if model.attention_backend != "auto":
        return model.attention_backend
    head_dim = config.dim // config.heads
    q = torch.zeros(1, config.heads, config.train_len, head_dim, device=device)
    modules = model.bias_modules()
    if not modules:
        return "sdpa (no bias)"
    bias = modules[0]
    return choose_backend(q.requires_grad_(True), q, q, bias)


def time_method(method, config, corpus, device, *, steps, warmup, evaluate, backend):
    """Seconds per training step, tokens per second, eval seconds and the backend."""
    seed_everything(config.seed)
    kwargs = {"learned_fallback": "clip"} if method == "learned" else {}
    model = build_model(method, config, **kwargs).to(device)
    model.attention_backend = backend
    if warmup:
        train_lm(model, corpus.train, config, steps=warmup, device=device, progress=False)
    history = train_lm(model, corpus.train, config, steps=steps, device=device, progress=False)
    eval_s = 0.0
    if evaluate:
        start = time.perf_counter()
        evaluate_lengths(model, corpus.val, config, device=device)
        eval_s = time.perf_counter() - start
    taken = attention_backend(model, config, device)
    return history["wall_s"] / steps, history["tokens_per_s"], eval_s, taken


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", choices=("quick", "full"), default="quick")
    parser.add_argument("--methods", nargs="+", default=["all"])
    parser.add_argument("--steps", type=int, help="timed training steps (default: the config's)")
    parser.add_argument("--warmup-steps", type=int, default=0, help="untimed steps first")
    parser.add_argument("--no-eval", action="store_true", help="time training only")
    parser.add_argument("--device", help="cuda, mps or cpu (default: the best available)")
    parser.add_argument(
        "--backend",
        default="auto",
        choices=("auto", "materialize", "fused", "table", "flex"),
        help="the attention backend of every layer (default: auto)",
    )
    for name in SIZE_OPTIONS:
        parser.add_argument("--" + name.replace("_", "-"), type=int, help="override the config's")
    parser.add_argument("--out", help="also write the rows as JSON to this file")
    args = parser.parse_args(argv)
    try:
        methods = resolve_methods(args.methods)
    except ValueError as err:
        parser.error(str(err))
    overrides = {n: getattr(args, n) for n in SIZE_OPTIONS if getattr(args, n) is not None}
    try:
        config = get_config(args.config, **overrides)
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    steps = args.steps if args.steps is not None else config.steps
    if steps <= 0:
        parser.error("--steps must be > 0")
    if args.warmup_steps < 0:
        parser.error("--warmup-steps must be >= 0")
    device = pick_device(args.device, verbose=False)
    load_at_start = os.getloadavg()
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    print(
        f"config {config.name}: width {config.dim}, {config.heads} heads, {config.depth} "
        f"layers; {steps} steps (after {args.warmup_steps} untimed) of "
        f"{config.batch_size}x{config.train_len} tokens; device {device_name(device)}, "
        f"{torch.get_num_threads()} threads; backend {args.backend}"
    )
    print(f"{'method':13s} {'s/step':>8s} {'tokens/s':>9s} {'vs nope':>8s} {'eval_s':>7s}  backend")
    rows = {}
    for method in methods:
        rows[method] = time_method(
            method,
            config,
            corpus,
            device,
            steps=steps,
            warmup=args.warmup_steps,
            evaluate=not args.no_eval,
            backend=args.backend,
        )
        step_s, tps, eval_s, taken = rows[method]
        nope = rows.get("nope")
        ratio = f"{step_s / nope[0]:7.2f}x" if nope else f"{'-':>8s}"
        print(f"{method:13s} {step_s:8.4f} {tps:9.0f} {ratio} {eval_s:7.1f}  {taken}", flush=True)
    total_train = sum(r[0] for r in rows.values()) * steps
    total_eval = sum(r[2] for r in rows.values())
    print(f"{'total':13s} {total_train:8.1f} s training, {total_eval:.1f} s evaluation")
    if steps != config.steps:
        estimate = total_train * config.steps / steps + total_eval
        print(f"estimated sweep at {config.steps} steps: {estimate:.0f} s")
    if args.out:
        nope = rows.get("nope")
        report = {
            **provenance(config, device),
            "threads": torch.get_num_threads(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
            "steps": steps,
            "warmup_steps": args.warmup_steps,
            "backend": args.backend,
            "rows": [
                {
                    "method": method,
                    "seconds_per_step": step_s,
                    "tokens_per_s": tps,
                    "eval_seconds": eval_s,
                    "backend": taken,
                    "ratio_to_nope": step_s / nope[0] if nope else None,
                }
                for method, (step_s, tps, eval_s, taken) in rows.items()
            ],
        }
        print(f"wrote {write_json(report, args.out)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
