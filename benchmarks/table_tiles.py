"""The table path's two causal strategies against attention without a bias, at one length.

    python benchmarks/table_tiles.py [--n 4096] [--families t5 alibi] [--rounds 12]
        [--tile 1024 --strip 256] [--cold] [--churn]

Times, interleaved round by round, plain causal ``scaled_dot_product_attention`` (the
floor), ``table_attention`` with its default strategy (tiles of ``--tile`` rows, by default
``table.TILE_ROWS``, for long float32 sequences: past keys in one call, the causal
triangle in strips of ``--strip`` rows, joined by log-sum-exp) and
``table_attention(block_rows=...)`` (the blocks of rows with ``-inf`` for future keys that
tiles replace; ``--block-rows``, by default
``table.default_block_rows``). ``--cold`` evicts the caches before every call, as
the big materialising calls of ``python -m relbias.bench`` do; ``--churn`` allocates and
frees half a gigabyte before every call, as those calls also do, after which memory that
a call allocates afresh page-faults. Prints medians, each median's ratio to the floor's
and the minor page faults per call. Run it on a quiet machine: two cores are noisy.
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from torch.nn import functional as F

from relbias import BIAS_NAMES, make_bias, prepare_bias
from relbias.attention import table


def _time_calls(args) -> dict:
    """Seconds of every call, round by round, interleaved."""
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, args.heads, args.n, args.head_dim).unbind(0)
    evict = torch.empty(64 << 20) if args.cold else None  # 256 MiB
    calls = {"floor": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)}
    with torch.no_grad():
        for family in args.families:
            prepared = prepare_bias(make_bias(family, args.heads), args.n)
            rows = args.block_rows or table.default_block_rows(prepared)
            calls[f"{family} tiles"] = lambda p=prepared: table.table_attention(
                q, k, v, p, tile_rows=args.tile, strip_rows=args.strip
            )
            calls[f"{family} blocks of {rows}"] = lambda p=prepared, rows=rows: (
                table.table_attention(q, k, v, p, block_rows=rows)
            )
        seconds = {name: [] for name in calls}
        faults = {name: [] for name in calls}
        for call in calls.values():  # warm-up
            call()
        for _ in range(args.rounds):
            for name, call in calls.items():
                if evict is not None:
                    evict.add_(1.0)
                if args.churn:
                    del_me = torch.ones(512 << 18)  # 512 MiB, freed at once
                    del del_me
                before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
                start = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - start)
                faults[name].append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return seconds, faults


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=4096, help="sequence length")
    parser.add_argument(
        "--families",
        nargs="+",
        default=["t5", "alibi"],
        choices=[name for name in BIAS_NAMES if name != "fire"],
    )
    parser.add_argument("--rounds", type=int, default=12, help="timed rounds")
    parser.add_argument("--tile", type=int, default=table.TILE_ROWS, help="rows per tile")
    parser.add_argument("--strip", type=int, default=table.STRIP_ROWS, help="rows per strip")
    parser.add_argument(
        "--block-rows", type=int, default=None, help="rows per block of the block strategy"
    )
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--cold", action="store_true", help="evict caches before each call")
    parser.add_argument(
        "--churn", action="store_true", help="allocate and free 512 MiB before each call"
    )
    args = parser.parse_args(argv)
    for name in ("n", "rounds", "tile", "strip", "heads", "head_dim"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.tile % args.strip:
        parser.error(f"--tile ({args.tile}) must be a multiple of --strip ({args.strip})")
    torch.set_flush_denormal(True)  # as the benchmark: strong biases underflow exp
    try:
        seconds, faults = _time_calls(args)
    finally:
        torch.set_flush_denormal(False)  # PyTorch's default; there is no getter
    floor = statistics.median(seconds["floor"])
    print(
        f"n = {args.n}, {args.heads} heads of {args.head_dim}, tile {args.tile}, "
        f"strip {args.strip}, {args.rounds} rounds, {torch.get_num_threads()} threads"
        f"{', cold caches' if args.cold else ''}{', 512 MiB churn' if args.churn else ''}"
    )
    for name, samples in seconds.items():
        median = statistics.median(samples)
        print(
            f"  {name:28s} {median * 1e3:8.1f} ms  {median / floor:6.3f}x the floor  "
            f"{statistics.median(faults[name]):7.0f} page faults"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
