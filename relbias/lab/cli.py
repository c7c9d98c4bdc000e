"""The lab's command line: ``python -m relbias.lab EXPERIMENT [options]``.

``extrapolation``
    a :class:`~relbias.lab.model.TinyLM` per positional method trained on the
    standard-library bytes, bits per byte at 1x..16x the training length
    (:func:`~relbias.lab.experiments.run_extrapolation`).
``retrieval``
    each method trained on the recall probe, accuracy against the distance back to the
    answer (:func:`~relbias.lab.experiments.run_retrieval`).
``interpolation``
    RoPE read at 1x..16x with no scaling, each position interpolation zero-shot and after
    a short fine-tuning at 4x (:mod:`relbias.lab.interpolation`).
``ablation {t5,fire,offset,kerple,alibi_probe}``
    the ablations of :mod:`relbias.lab.ablations`.
``compact [FOLDER]``
    rewrite the compact copy (``FOLDER/compact/<name>.json``) of every result in FOLDER
    (default: the stored results, ``relbias/lab/results``): run it after adding a result.

Each writes ``<experiment>_<config>[_<tag>].json`` (and its compact copy in ``compact/``)
and a ``.png`` to ``--out``, and prints a table. Every experiment takes ``--seeds S [S
...]`` or ``--num-seeds N`` (every method for each seed; mean and 95 % t-interval per
length) and checkpoints: the sweep's progress and the run in progress are kept in
``--checkpoint-dir`` (default ``OUT/checkpoints/<name>``) every ``--checkpoint-minutes``
(default 2) and on Ctrl-C, which ends the command with a message saying what was saved;
the same command with ``--resume`` continues it and gives the result an uninterrupted
run gives. ``--gate-bias-init B`` starts the forget gates at ``f = sigmoid(B)``; ``--tag
NAME`` names a variant so that it does not replace the plain sweep. The optional
dependencies (the ``lab`` extra) are checked before anything trains.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path

__all__ = [
    "build_parser",
    "extrapolation_table",
    "interpolation_table",
    "main",
    "missing_dependencies",
    "retrieval_table",
    "save",
]

CONFIG_NAMES = ("quick", "medium", "full")
EXPERIMENTS = ("extrapolation", "retrieval", "interpolation", "ablation")
#: What the experiments import beyond torch (the ``lab`` extra): module -> distribution.
LAB_DEPENDENCIES = {"numpy": "numpy", "tqdm": "tqdm", "matplotlib": "matplotlib"}


def missing_dependencies() -> list[str]:
    """The distributions of the ``lab`` extra that are not installed."""
    return [dist for mod, dist in LAB_DEPENDENCIES.items() if importlib.util.find_spec(mod) is None]


# --- argument types -----------------------------------------------------------------------------


def _number(text: str, cast, ok, what: str):
    try:
        value = cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}") from None
    if not ok(value):
        raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    return _number(text, int, lambda v: v > 0, "an integer > 0")


def _non_negative_int(text: str) -> int:
    return _number(text, int, lambda v: v >= 0, "an integer >= 0")


def _positive_float(text: str) -> float:
    return _number(text, float, lambda v: 0 < v < math.inf, "a number > 0")


def _finite_float(text: str) -> float:
    return _number(text, float, math.isfinite, "a finite number")


# --- the parser -----------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    from relbias.lab.ablations import ABLATIONS, DEFAULT_BUCKETS, DEFAULT_DIST_MAX_FACTORS
    from relbias.lab.interpolation import DEFAULT_FINETUNE_FACTOR, DEFAULT_FINETUNE_STEPS
    from relbias.lab.model import POSITION_NAMES
    from relbias.lab.probe import TASKS

    parser = argparse.ArgumentParser(
        prog="python -m relbias.lab",
        description="Train TinyLMs with each positional method and compare them.",
    )
    sub = parser.add_subparsers(dest="experiment", required=True, metavar="EXPERIMENT")
    helps = {
        "extrapolation": "bits per byte at 1x..16x the training length",
        "retrieval": "recall accuracy against distance on the probe",
        "interpolation": "RoPE read at 1x..16x: no scaling, each interpolation, fine-tuned",
        "ablation": "ablations: T5's buckets, FIRE's inputs, the offset table's far "
        "offsets, Kerple's rate and shape, ALiBi's slopes on the probe",
    }
    p = {name: sub.add_parser(name, help=h, description=h) for name, h in helps.items()}
    c = sub.add_parser("compact", help="rewrite the compact copies of stored results")
    c.add_argument("folder", nargs="?", help="results folder (default: the stored results)")
    p["ablation"].add_argument("which", choices=ABLATIONS, help="which ablation")
    for name, q in p.items():
        _add_common_options(q)
        if name in ("extrapolation", "retrieval"):
            q.add_argument(
                "--methods",
                nargs="+",
                default=["all"],
                metavar="METHOD",
                help=f"methods: {', '.join(POSITION_NAMES)}, or all/biases/baselines",
            )
            q.add_argument(
                "--gate-bias-init",
                type=_finite_float,
                metavar="B",
                help="the forget gate's initial bias b (f = sigmoid(b) at the start; default "
                "0, as the reference code); only with gated methods (forgetting)",
            )
    p["extrapolation"].add_argument(
        "--eval-tokens", type=_positive_int, help="validation bytes read at every length"
    )
    p["extrapolation"].add_argument(
        "--eval-spread",
        action="store_true",
        help="draw the evaluation text evenly across the validation files",
    )
    r = p["retrieval"]
    r.add_argument("--probe", choices=TASKS, help="probe task (default: the configuration's)")
    r.add_argument("--competitors", type=_non_negative_int, help="competing pairs (override)")
    r.add_argument(
        "--distances", type=_positive_int, nargs="+", metavar="D", help="distances to test"
    )
    r.add_argument("--num-pairs", type=_positive_int, help="key-value pairs per sequence")
    r.add_argument("--distractors", type=_non_negative_int, help="lone digits per sequence")
    i = p["interpolation"]
    i.add_argument(
        "--finetune-factor",
        type=_positive_int,
        default=DEFAULT_FINETUNE_FACTOR,
        help=f"fine-tune at this multiple of m_l (default {DEFAULT_FINETUNE_FACTOR})",
    )
    i.add_argument(
        "--finetune-steps",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_FINETUNE_STEPS),
        help="fine-tuning runs of these many steps (default 25 50 100)",
    )
    a = p["ablation"]
    a.add_argument(
        "--dist-max-factors",
        type=_positive_float,
        nargs="+",
        default=list(DEFAULT_DIST_MAX_FACTORS),
        metavar="F",
        help="t5: dist_max as these multiples of m_l (default 0.25 0.5 1 2)",
    )
    a.add_argument(
        "--buckets",
        type=_positive_int,
        nargs="+",
        default=list(DEFAULT_BUCKETS),
        metavar="N",
        help="t5: bucket counts (default 32)",
    )
    a.add_argument(
        "--max-shift",
        type=_positive_int,
        help="fire: largest random query shift in training (default: (longest factor - 1) m_l)",
    )
    a.add_argument("--variants", nargs="+", metavar="NAME", help="run only these variants")
    return parser


def _add_common_options(p) -> None:
    p.add_argument(
        "--config",
        choices=CONFIG_NAMES,
        default=None,
        help="named configuration (default: quick, or $RELBIAS_CONFIG)",
    )
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
    p.add_argument("--tag", help="name a variant: writes <experiment>_<config>_<TAG>.json")
    seeds = p.add_mutually_exclusive_group()
    seeds.add_argument(
        "--seeds",
        type=_non_negative_int,
        nargs="+",
        metavar="SEED",
        help="run with each of these seeds; mean and 95 %% t-interval per length",
    )
    seeds.add_argument("--num-seeds", type=_positive_int, metavar="N", help="seeds 0..N-1")
    p.add_argument(
        "--checkpoint-dir",
        help="where the sweep keeps its progress (default: OUT/checkpoints/<name>)",
    )
    p.add_argument(
        "--checkpoint-minutes",
        type=_positive_float,
        default=2.0,
        help="minutes between checkpoints of the run in progress (default 2)",
    )
    p.add_argument(
        "--checkpoint-every-steps", type=_positive_int, help="also checkpoint every N steps"
    )
    p.add_argument(
        "--resume", action="store_true", help="continue the sweep saved in the checkpoint folder"
    )
    p.add_argument(
        "--weights",
        metavar="DIR",
        help="keep each run's final weights in DIR/<name>/ (extrapolation and retrieval)",
    )


# --- from arguments to a run --------------------------------------------------------------------


def _config(parser, args):
    from relbias.lab.config import get_config
    from relbias.lab.probe import probe_max_distance, probe_min_distance

    probe = args.experiment == "retrieval" or getattr(args, "which", None) == "alibi_probe"
    lengths = tuple(args.lengths) if args.lengths else None
    overrides = {"train_len": args.train_len}
    if probe:
        overrides.update(probe_steps=args.steps, probe_eval_factors=lengths)
    else:
        overrides.update(steps=args.steps, eval_factors=lengths)
    if args.experiment == "extrapolation":
        overrides.update(eval_tokens=args.eval_tokens, eval_spread=args.eval_spread or None)
    if args.experiment == "retrieval":
        overrides.update(
            probe_num_pairs=args.num_pairs,
            probe_distractors=args.distractors,
            probe_task=args.probe,
            probe_competitors=args.competitors,
        )
    overrides = {k: v for k, v in overrides.items() if v is not None}
    try:
        config = get_config(args.config, **overrides)
        if config.train_len < 4:
            raise ValueError("--train-len must be at least 4")
        if probe and config.probe_task == "competing":
            if probe_min_distance(config) > probe_max_distance(config, config.train_len):
                raise ValueError(
                    f"{config.probe_competitors} competing pairs do not fit in a training "
                    f"sequence of {config.train_len} tokens (need --train-len >= "
                    f"{4 * config.probe_competitors + 3})"
                )
        elif probe and 2 * config.probe_num_pairs + config.probe_distractors + 1 > config.train_len:
            raise ValueError(
                f"{config.probe_num_pairs} key-value pairs and {config.probe_distractors} "
                f"distractors do not fit in a training sequence of {config.train_len} tokens"
            )
        if args.experiment == "retrieval" and args.distances:
            longest = max(config.probe_eval_factors) * config.train_len
            too_far = [d for d in args.distances if d > longest - 2]
            if too_far:
                raise ValueError(
                    f"--distances {too_far} do not fit in the longest evaluation sequence "
                    f"({longest} tokens, distances up to {longest - 2}); raise --lengths"
                )
        if args.experiment == "interpolation" and args.finetune_factor not in config.eval_factors:
            raise ValueError(f"--finetune-factor must be one of {config.eval_factors}")
    except (TypeError, ValueError) as err:
        parser.error(str(err))
    return config


def _seeds(parser, args):
    if args.num_seeds is not None:
        return list(range(args.num_seeds))
    if args.seeds is not None:
        if len(set(args.seeds)) != len(args.seeds):
            parser.error(f"--seeds must not repeat, got {args.seeds}")
        return list(args.seeds)
    if args.experiment == "interpolation":
        from relbias.lab.interpolation import DEFAULT_SEEDS

        return list(DEFAULT_SEEDS)
    return None


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


def _variant(parser, args, methods) -> dict:
    """``model_kwargs`` of the experiments from ``--gate-bias-init``."""
    from relbias.lab.model import GATED_POSITIONS

    if getattr(args, "gate_bias_init", None) is None:
        return {}
    other = [m for m in methods if m not in GATED_POSITIONS]
    if other:
        parser.error(
            f"--gate-bias-init applies to the gated methods ({', '.join(GATED_POSITIONS)}) "
            f"only; drop {', '.join(other)} from --methods"
        )
    return {"model_kwargs": {"bias_kwargs": {"bias_init": args.gate_bias_init}}}


def _ablation_options(args) -> dict:
    if args.which == "t5":
        return {"dist_max_factors": tuple(args.dist_max_factors), "buckets": tuple(args.buckets)}
    if args.which == "fire" and args.max_shift is not None:
        return {"max_shift": args.max_shift}
    return {}


def _prepare(parser, args, config) -> tuple:
    """Check everything the run needs; returns ``(name, run)``: the result's file name and
    a function ``run(common) -> (results, table)``."""
    from relbias.lab import ablations, experiments, interpolation
    from relbias.lab.results import check_tag, file_stem

    try:
        tag = check_tag(args.tag)
    except ValueError as err:
        parser.error(f"--tag: {err}")
    seeds = _seeds(parser, args)
    if args.experiment == "interpolation":

        def run(common):
            results = interpolation.run_interpolation(
                config,
                seeds,
                finetune_factor=args.finetune_factor,
                finetune_steps=tuple(args.finetune_steps),
                **common,
            )
            return results, interpolation_table(results)

        return file_stem("interpolation", config.name, tag), run
    if args.experiment == "ablation":
        options = _ablation_options(args)
        try:
            ablations.variants_for(args.which, config, variants=args.variants, **options)
        except ValueError as err:
            parser.error(str(err))

        def run(common):
            results = ablations.run_ablation(
                args.which,
                config,
                seeds=seeds or [config.seed],
                variants=args.variants,
                tag=tag,
                **common,
                **options,
            )
            probe = args.which == "alibi_probe"
            return results, (retrieval_table if probe else extrapolation_table)(results)

        return file_stem(f"ablation_{args.which}", config.name, tag), run
    try:
        methods = experiments.resolve_methods(args.methods)
    except ValueError as err:
        parser.error(str(err))
    variant = _variant(parser, args, methods)

    name = file_stem(args.experiment, config.name, tag)
    weights = {"weights_dir": Path(args.weights) / name} if args.weights else {}

    def run(common):
        if args.experiment == "extrapolation":
            results = experiments.run_extrapolation(
                config, methods, seeds=seeds, tag=tag, **variant, **weights, **common
            )
            return results, extrapolation_table(results)
        results = experiments.run_retrieval(
            config,
            methods,
            seeds=seeds,
            distances=args.distances,
            tag=tag,
            **variant,
            **weights,
            **common,
        )
        return results, retrieval_table(results)

    return name, run


def main(argv=None) -> int:
    import torch

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.experiment == "compact":
        from relbias.lab.results import write_compact_copies

        written = write_compact_copies(args.folder)
        print(f"wrote {len(written)} compact copies")
        return 0
    missing = missing_dependencies()
    if missing:
        parser.error(
            f"the experiments need {', '.join(missing)} (not installed): pip install 'relbias[lab]'"
        )
    from relbias.lab.device import device_name, pick_device

    config = _config(parser, args)
    out = _check_out(parser, args.out)
    name, run = _prepare(parser, args, config)
    try:
        device = pick_device(args.device, verbose=False)
        torch.empty(1, device=device)
    except (RuntimeError, ValueError) as err:
        parser.error(f"--device {args.device!r} is not usable: {err}")
    ckpt_dir = Path(args.checkpoint_dir) if args.checkpoint_dir else out / "checkpoints" / name
    print(f"relbias: {name}, device {device_name(device)}, checkpoints in {ckpt_dir}", flush=True)
    common = {
        "device": device,
        "progress": not args.no_progress,
        "checkpoint_dir": ckpt_dir,
        "resume": args.resume,
        "checkpoint_seconds": 60 * args.checkpoint_minutes,
        "checkpoint_every": args.checkpoint_every_steps,
    }
    try:
        results, table = run(common)
    except KeyboardInterrupt as err:
        _report_interrupt(err, ckpt_dir, argv)
        return 130
    except (FileNotFoundError, FileExistsError, ValueError) as err:
        if "--resume" in str(err):
            parser.error(str(err))
        raise
    save(results, out)
    _remove_checkpoints(ckpt_dir)
    print(table)
    print(f"wall time {results['provenance']['wall_s']:.1f} s; wrote {out / name}.json and .png")
    return 0


def save(results: dict, out) -> Path:
    """Write ``results`` (and its compact copy) to ``out/<name>.json`` and its figure to
    ``out/<name>.png``; returns the JSON's path."""
    from relbias.lab.plots import plot_interpolation, plot_results
    from relbias.lab.results import result_name, write_results

    name = result_name(results)
    path = write_results(results, Path(out) / f"{name}.json")
    if results["kind"] == "interpolation":
        plot_interpolation(results).savefig(Path(out) / f"{name}.png", dpi=110)
    else:
        plot_results(results, Path(out) / f"{name}.png")
    return path


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


def _resume_command(argv) -> str:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--resume" not in argv:
        argv.append("--resume")
    return " ".join(["python -m relbias.lab", *argv])


def _report_interrupt(err, ckpt_dir: Path, argv) -> None:
    """Say what a Ctrl-C left on disk and how to continue."""
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


# --- tables ---------------------------------------------------------------------------------


def _cell(row: dict) -> str:
    low, high = row.get("bpb_low"), row.get("bpb_high")
    if low is None or not math.isfinite(low):
        return f"{row['bpb']:7.3f}"
    return f"{row['bpb']:7.3f}+-{(high - low) / 2:.3f}"


def extrapolation_table(results: dict) -> str:
    """The results as a text table: bits per byte at each evaluation length."""
    first = next(iter(results["methods"].values()))
    head = " ".join(f"{str(r['length']):>13s}" for r in first["eval"])
    lines = [f"{'method':24s} {'params':>8s} {'train':>7s} {head} {'train_s':>7s}"]
    for method, rec in results["methods"].items():
        bpb = " ".join(f"{_cell(r):>13s}" for r in rec["eval"])
        lines.append(
            f"{method:24s} {rec['params']:8d} {rec['train']['final_loss_bits']:7.3f} {bpb} "
            f"{rec['train']['wall_s']:7.1f}"
        )
    lines.append(
        f"mean over seeds {results['seeds']} +- half-width of the 95 % t-interval "
        "(one seed: no interval); train_s: total over seeds"
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


def interpolation_table(results: dict) -> str:
    """Mean bits per byte over seeds [95 % interval] per variant and length, as text."""
    summary = results["summary"]
    lengths = list(next(iter(summary["zero_shot"].values())))
    lines = [f"{'variant':24s} " + " ".join(f"{n:>17s}" for n in lengths)]

    def line(label, cells):
        values = " ".join(
            f"{c['mean']:6.3f} [{c['low']:.2f},{c['high']:.2f}]" for c in cells.values()
        )
        return f"{label:24s} {values}"

    for name, cells in summary["zero_shot"].items():
        lines.append(line(f"{name}, zero-shot", cells))
    for name, by_steps in summary["finetuned"].items():
        for steps, cells in by_steps.items():
            lines.append(line(f"{name}, {steps} steps", cells))
    return "\n".join(lines)
