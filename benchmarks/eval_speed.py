"""How much the prepared-bias fast path speeds up TinyLM's long evaluations.

    python benchmarks/eval_speed.py [--config quick] [--factor 16] [--methods alibi t5 fire]

Builds each model (untrained: the timing does not depend on the weights) and times
``evaluate_lengths`` at ``factor`` times the training length twice, once with
``model.attention_backend = "materialize"`` (a ``[heads, n, n]`` bias per forward) and
once with ``"auto"`` (on a CPU without gradients: relbias's fused kernel, or the O(n)
table read through a strided mask where that kernel cannot be built), after one warm-up
each. Prints the backend ``"auto"`` took, the wall times, their ratio and the largest
difference in bits per byte. Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import time

import torch

from relbias import choose_backend
from relbias.lab import build_model, evaluate_lengths, get_config
from relbias.lab.data import load_corpus
from relbias.lab.model import BIAS_POSITIONS


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="quick", help="named configuration")
    parser.add_argument("--factor", type=int, default=16, help="evaluation length / train_len")
    parser.add_argument(
        "--methods",
        nargs="+",
        default=list(BIAS_POSITIONS),
        choices=BIAS_POSITIONS,
        metavar="METHOD",
    )
    args = parser.parse_args(argv)
    if args.factor < 1:
        parser.error(f"--factor must be >= 1, got {args.factor}")
    cfg = get_config(args.config)
    corpus = load_corpus(max_bytes=cfg.corpus_bytes)
    length = args.factor * cfg.train_len
    print(f"evaluate_lengths at {args.factor}x = {length} tokens, config {cfg.name}")
    print(
        f"{'method':14s} {'auto took':>9s} {'materialize_s':>13s} {'auto_s':>8s} "
        f"{'speed-up':>8s} {'|d bpb|':>8s}"
    )
    for method in args.methods:
        model = build_model(method, cfg).eval()
        seconds, bpb = {}, {}
        for backend in ("materialize", "auto"):
            model.attention_backend = backend
            evaluate_lengths(model, corpus.val, cfg, factors=(args.factor,))
            start = time.perf_counter()
            rows = evaluate_lengths(model, corpus.val, cfg, factors=(args.factor,))
            seconds[backend], bpb[backend] = time.perf_counter() - start, rows[0]["bpb"]
        q = torch.empty(1, model.heads, length, model.dim // model.heads)
        with torch.no_grad():  # as in evaluate_lengths
            took = choose_backend(q, q, q, model.bias_modules()[0])
        print(
            f"{method:14s} {took:>9s} {seconds['materialize']:13.2f} {seconds['auto']:8.2f} "
            f"{seconds['materialize'] / seconds['auto']:7.2f}x "
            f"{abs(bpb['auto'] - bpb['materialize']):8.1e}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
