"""The command line, ``python -m relbias.bench``: options -> :class:`BenchConfig` -> run.

Bad options end in a usage error (exit code 2) that names the option.
"""

from __future__ import annotations

import argparse
import sys

from relbias._json import write_json
from relbias.bench.config import FAMILIES, FULL_LENGTHS, QUICK_LENGTHS, BenchConfig, ConfigError
from relbias.bench.memory import worker_main
from relbias.bench.methods import ALL_METHODS
from relbias.bench.report import RESULTS_DIR, format_tables, run


def _csv(kind, what: str):
    """An argparse type: comma-separated values of ``kind``."""

    def parse(text):
        try:
            return [kind(x) for x in text.split(",") if x]
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated {what}, got {text!r}"
            ) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m relbias.bench",
        description="Benchmark: how fast, and in how much memory, each way of applying a "
        "bias runs.",
    )
    p.add_argument(
        "--quick", action="store_true", help="small run: n = 256, 512, 3 repeats (about a minute)"
    )
    p.add_argument(
        "--lengths",
        type=_csv(int, "integers"),
        default=None,
        help=f"comma-separated lengths (default {','.join(map(str, FULL_LENGTHS))})",
    )
    p.add_argument(
        "--families",
        type=_csv(str, "names"),
        default=None,
        help=f"comma-separated families (default all: {','.join(FAMILIES)})",
    )
    p.add_argument(
        "--methods",
        type=_csv(str, "names"),
        default=None,
        help=f"comma-separated methods (default all: {','.join(ALL_METHODS)})",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per method")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--backward-max", type=int, default=2048, help="largest n timed forward + backward"
    )
    p.add_argument("--no-backward", dest="backward", action="store_false")
    p.add_argument(
        "--no-memory", dest="memory", action="store_false", help="skip the peak-memory subprocesses"
    )
    p.add_argument(
        "--max-dense-gib",
        type=float,
        default=4.0,
        help="skip dense methods that would need more GiB of [H, n, n] tensors",
    )
    p.add_argument("--memory-timeout", type=float, default=3600)
    p.add_argument(
        "--flush-denormal",
        action="store_true",
        help="flush denormal floats for the whole run (torch.set_flush_denormal(True)); by "
        "default the run keeps PyTorch's default, as a user's process does",
    )
    p.add_argument(
        "--no-flush-denormal-rows",
        dest="flush_denormal_rows",
        action="store_false",
        help="skip the separate rows timed with denormals flushed",
    )
    p.add_argument(
        "--no-training-memory",
        dest="training_memory",
        action="store_false",
        help="skip the peak memory of a training step at the largest length",
    )
    p.add_argument(
        "--no-bf16-accuracy",
        dest="bf16_accuracy",
        action="store_false",
        help="skip the fused kernel's bfloat16 accuracy against float32",
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON file to write (default: the stored results, relbias/bench/results/cpu.json, "
        "or cpu-quick.json with --quick; '-' for none)",
    )
    p.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    return p


def _config(parser: argparse.ArgumentParser, args, argv) -> BenchConfig:
    """The run's settings from parsed options (``--quick``'s defaults filled in); a bad
    setting stops with a usage error naming its option."""
    lengths = (
        args.lengths
        if args.lengths is not None
        else (QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    )
    repeats = 3 if args.quick and args.repeats is None else args.repeats
    backward_max = args.backward_max
    if args.quick and lengths:
        backward_max = min(backward_max, max(lengths))
    out = args.out
    if out is None:
        out = str(RESULTS_DIR / ("cpu-quick.json" if args.quick else "cpu.json"))
    settings = dict(
        lengths=list(lengths),
        families=args.families or list(FAMILIES),
        methods=args.methods or list(ALL_METHODS),
        repeats=repeats,
        heads=args.heads,
        head_dim=args.head_dim,
        dtype=args.dtype,
        seed=args.seed,
        backward=args.backward,
        backward_max=backward_max,
        memory=args.memory,
        max_dense_gib=args.max_dense_gib,
        memory_timeout=args.memory_timeout,
        flush_denormal=args.flush_denormal,
        flush_denormal_rows=args.flush_denormal_rows,
        training_memory=args.training_memory,
        bf16_accuracy=args.bf16_accuracy,
        out=out,
        argv=list(sys.argv[1:] if argv is None else argv),
    )
    if args.threads is not None:
        settings["threads"] = args.threads
    try:
        return BenchConfig(**settings)
    except ConfigError as err:
        parser.error(f"argument {err.option}: {err.problem}")


def parse_args(argv=None) -> BenchConfig:
    """The :class:`BenchConfig` of a command line (``sys.argv[1:]`` by default)."""
    parser = build_parser()
    return _config(parser, parser.parse_args(argv), argv)


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.memory_worker is not None:
        return worker_main(args.memory_worker)
    config = _config(parser, args, argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    report = run(config, log=log)
    print(format_tables(report))
    if config.out != "-":
        path = write_json(report, config.out)
        print(f"\nwrote {path}")
    return 0
