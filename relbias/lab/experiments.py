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

Run ``python -m relbias.lab.experiments {extrapolation,retrieval,interpolation} --help`` for
every option.
Methods are the names in :data:`relbias.lab.model.POSITION_NAMES`, or ``all``, ``biases``,
``baselines``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from relbias.lab.data import load_corpus
from relbias.lab.model import BASELINE_POSITIONS, BIAS_POSITIONS, POSITION_NAMES
from relbias.lab.training import (
    Config,
    build_model,
    default_distances,
    device_name,
    evaluate_lengths,
    evaluate_retrieval,
    get_config,
    learned_bias,
    pick_device,
    plot_results,
    probe_batches,
    provenance,
    save_results,
    seed_everything,
    train_lm,
)

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


def _new_model(method: str, config: Config, device):
    """A seeded model; learned absolute positions clip beyond the training length."""
    seed_everything(config.seed)
    kwargs = {"learned_fallback": "clip"} if method == "learned" else {}
    return build_model(method, config, **kwargs).to(device)


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


def train_and_evaluate(
    method: str, config: Config, *, corpus=None, device=None, progress: bool = True, factors=None
):
    """Train one method on the text and evaluate every length; returns ``(model, record)``.

    The record holds the parameter count, the training history (loss in bits per step,
    wall time, tokens/s), the evaluation rows of
    :func:`~relbias.lab.training.evaluate_lengths` and, for bias families, the learned bias.
    """
    corpus = corpus or load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=False)
    model = _new_model(method, config, device)
    history = train_lm(model, corpus.train, config, device=device, progress=progress, desc=method)
    rows = evaluate_lengths(model, corpus.val, config, factors=factors, device=device)
    history["losses"] = [round(v, 4) for v in history["losses"]]
    record = {
        "params": sum(p.numel() for p in model.parameters()),
        "train": history,
        "eval": rows,
        "learned_bias": _readback(model, config),
    }
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


def run_extrapolation(
    config: Config | None = None,
    methods=None,
    *,
    out=None,
    device=None,
    progress: bool = True,
    factors=None,
    verbose: bool = True,
) -> dict:
    """Train and evaluate every method; returns (and with ``out`` writes) the results."""
    config = config or get_config()
    corpus = load_corpus(max_bytes=config.corpus_bytes)

    def one(method, device):
        return train_and_evaluate(
            method, config, corpus=corpus, device=device, progress=progress, factors=factors
        )

    device, records, wall_s = _sweep(one, methods, device, verbose)
    results = {
        "kind": "extrapolation",
        "methods": records,
        "corpus": corpus.describe(),
        "provenance": provenance(config, device, wall_s=wall_s),
    }
    if out is not None:
        _write(results, out)
    return results


def train_and_probe(
    method: str, config: Config, *, device=None, progress: bool = True, factors=None, distances=None
):
    """Train one method on the recall probe and measure accuracy against distance.

    Returns ``(model, record)``; ``record["eval"]`` has one row per (length, distance).
    """
    device = device or pick_device(verbose=False)
    model = _new_model(method, config, device)
    history = train_lm(
        model,
        probe_batches(config),
        config,
        steps=config.probe_steps,
        device=device,
        progress=progress,
        desc=method,
    )
    rows = []
    for factor in factors or config.probe_eval_factors:
        seq_len = factor * config.train_len
        ds = (
            default_distances(seq_len)
            if distances is None
            else [d for d in distances if d <= seq_len - 2]
        )
        rows += evaluate_retrieval(model, config, seq_len=seq_len, distances=ds, device=device)
    history["losses"] = [round(v, 4) for v in history["losses"]]
    return model, {
        "params": sum(p.numel() for p in model.parameters()),
        "train": history,
        "eval": rows,
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
) -> dict:
    """Train every method on the probe; returns (and with ``out`` writes) the results."""
    config = config or get_config()

    def one(method, device):
        return train_and_probe(
            method, config, device=device, progress=progress, factors=factors, distances=distances
        )

    device, records, wall_s = _sweep(one, methods, device, verbose)
    results = {
        "kind": "retrieval",
        "methods": records,
        "probe": {
            "task": "key-value recall, answer copied from `distance` back",
            "num_pairs": config.probe_num_pairs,
            "num_distractors": config.probe_distractors,
            "chance": 0.1,
        },
        "provenance": provenance(config, device, wall_s=wall_s),
    }
    if out is not None:
        _write(results, out)
    return results


def _report(method: str, rec: dict) -> None:
    train = rec["train"]
    print(
        f"{method}: {train['steps']} steps in {train['wall_s']:.1f} s "
        f"({train['tokens_per_s']:.0f} tokens/s), final training loss "
        f"{train['final_loss_bits']:.3f} bits",
        flush=True,
    )


def _write(results: dict, out) -> None:
    name = f"{results['kind']}_{results['provenance']['config']['name']}"
    out = Path(out)
    save_results(results, out / f"{name}.json")
    plot_results(results, out / f"{name}.png")


# --- tables ----------------------------------------------------------------------------------


def _extrapolation_row(method: str, rec: dict) -> str:
    bpb = " ".join(f"{r['bpb']:7.3f}" for r in rec["eval"])
    return (
        f"{method:13s} {rec['params']:8d} {rec['train']['final_loss_bits']:7.3f} {bpb} "
        f"{rec['train']['wall_s']:7.1f}"
    )


def extrapolation_table(results: dict) -> str:
    """The results as a text table: bits per byte at each evaluation length."""
    first = next(iter(results["methods"].values()))
    head = " ".join(f"{str(r['length']):>7s}" for r in first["eval"])
    lines = [f"{'method':13s} {'params':>8s} {'train':>7s} {head} {'train_s':>7s}"]
    lines += [_extrapolation_row(m, rec) for m, rec in results["methods"].items()]
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
            choices=("quick", "full"),
            default=None,
            help="named configuration (default: quick on CPU or under CI, else full)",
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
        if name == "retrieval":
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
    return parser


def _add_interpolation_parser(sub) -> None:
    from relbias.lab import interpolation as ip

    helptext = "RoPE read at 1x..16x: no scaling, each interpolation zero-shot and fine-tuned"
    p = sub.add_parser("interpolation", help=helptext, description=helptext)
    p.add_argument("--config", choices=("quick", "full"), default=None, help="named configuration")
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
    overrides = {"steps": args.steps, "train_len": args.train_len, "seed": args.seed}
    if args.experiment == "extrapolation":
        overrides["eval_factors"] = tuple(args.lengths) if args.lengths else None
    else:
        overrides["probe_steps"] = overrides.pop("steps")
        overrides["probe_eval_factors"] = tuple(args.lengths) if args.lengths else None
        overrides["probe_num_pairs"] = args.num_pairs
        overrides["probe_distractors"] = args.distractors
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = get_config(args.config, **overrides)
        if config.train_len < 4:
            raise ValueError("--train-len must be at least 4")
        if args.experiment == "retrieval" and (
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


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.experiment == "interpolation":
        return _main_interpolation(parser, args)
    try:
        methods = resolve_methods(args.methods)
    except ValueError as err:
        parser.error(str(err))
    config = _config_from_args(parser, args)
    out = _check_out(parser, args.out)
    try:
        device = pick_device(args.device, verbose=False)
        torch.empty(1, device=device)
    except (RuntimeError, ValueError) as err:
        parser.error(f"--device {args.device!r} is not usable: {err}")
    _check_distances(parser, args, config)
    print(
        f"relbias: {args.experiment}, config {config.name}, device {device_name(device)}, "
        f"methods {' '.join(methods)}",
        flush=True,
    )
    progress = not args.no_progress
    if args.experiment == "extrapolation":
        results = run_extrapolation(config, methods, device=device, progress=progress)
        table = extrapolation_table(results)
    else:
        results = run_retrieval(
            config, methods, device=device, progress=progress, distances=args.distances
        )
        table = retrieval_table(results)
    _write(results, out)
    name = f"{args.experiment}_{config.name}"
    print(table)
    print(f"wall time {results['provenance']['wall_s']:.1f} s; wrote {out / name}.json and .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
