"""The prepared GPU check: what a reader's GPU run of the book does, measured in one go.

Run on a machine with a CUDA GPU (every stage is guarded, so one failure never hides the
others; the stages run in order of value, each within its share of ``--budget``)::

    python -m relbias.attention.fused && python scripts/gpu_check.py --out gpu_results --budget 780

It writes ``gpu_check.json`` (updated after every stage, with provenance) into ``--out``:

``env``
    torch, CUDA, the GPU, its compute capability and memory, the autocast dtype the
    book would use there, the relbias commit.
``chapters``
    every chapter of the book executed top to bottom on the GPU, as a reader runs it there
    (no ``CI``: the runtime banner picks the GPU configuration, the stored sweeps'
    ``medium``): per chapter the time, the peak GPU memory, the banner, and which asserted
    claims did not hold (:func:`relbias.book.execute.chapter_report`; a chapter is run
    through every cell, so a failed claim does not hide the next). A chapter that starts
    runs to its end; the next one starts only while the stage's budget lasts.
``flex_speed``
    FlexAttention forward and forward + backward time for every family in bfloat16 up to
    32,768 tokens, against FlexAttention with no bias. FIRE's ``score_mod`` has no
    FlexAttention backward (``backend="flex"`` refuses its gradients): its
    forward + backward is timed on the backend ``"auto"`` takes instead, and named.
``full``
    the ``full`` configuration's extrapolation for ``--full-methods`` (default nope,
    rope, t5, alibi, fire; one seed), each method written to ``--out/full/`` as soon as it
    is done (``relbias.lab.cli.save``), so that a budget cut keeps what finished.
``train``
    alibi, t5, fire and nope (``--methods``) trained for ``--steps`` steps in the
    configuration a chapter trains on a GPU (``relbias.book.runtime.GPU_CONFIG``, the stored
    sweeps' ``medium``), then evaluated at 1x, 4x and 16x the training length: steps/s
    (what sizes a chapter's GPU demo), peak memory, bits per byte.
``train_t4``
    the same under a T4-sized memory cap (15 GB, ``torch.cuda.set_per_process_memory_fraction``)
    with float16 autocast and a gradient scaler, as on a T4 (compute capability 7.5), and
    chapter 4's long recall evaluation (16,384 tokens) under that cap.
``flex``
    FlexAttention forward and backward for every family against the materialised path,
    in float32 and bfloat16 at two lengths: largest errors of the output and of the
    gradients of q, k, v and the bias's parameters, and FlexAttention's compile counts.
``cpu_vs_gpu``
    the weights trained in ``train`` evaluated on the CPU (float32) and on the GPU with
    and without autocast: the differences in bits per byte.

Test the script on a CPU first: ``--device cpu --smoke`` runs what a CPU can on tiny sizes
(``tests/lab/test_gpu_check.py`` does, with a tiny chapter and ``--chapters``).

Each stage stops starting new cases when its share of ``--budget`` seconds is spent and
says so (``"skipped"``).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
import traceback
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(ROOT))

import relbias  # noqa: E402
from relbias.book.runtime import GPU_CONFIG  # noqa: E402
from relbias.lab import config as lab_config  # noqa: E402
from relbias.lab import device as lab_device  # noqa: E402
from relbias.lab import evaluation, training  # noqa: E402
from relbias.lab.data import load_corpus  # noqa: E402
from relbias.lab.results import checkout_commit  # noqa: E402

# In order of value: the chapters first, then the biased FlexAttention rows, then `full`.
STAGES = ("env", "chapters", "flex_speed", "full", "train", "train_t4", "flex", "cpu_vs_gpu")
# Share of --budget each stage may spend before it stops starting new cases.
STAGE_SHARE = {
    "env": 0.01,
    "chapters": 0.45,
    "flex_speed": 0.15,
    "full": 0.2,
    "train": 0.04,
    "train_t4": 0.06,
    "flex": 0.06,
    "cpu_vs_gpu": 0.03,
}
FULL_METHODS = ("nope", "rope", "t5", "alibi", "fire")
T4_MEMORY_BYTES = 15 * 1024**3


class Budget:
    """Seconds a stage may still spend."""

    def __init__(self, seconds: float):
        self.end = time.perf_counter() + seconds

    def left(self) -> float:
        return self.end - time.perf_counter()


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_bytes(device: torch.device) -> int | None:
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def stage_env(ctx) -> dict:
    device = ctx.device
    out = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "relbias_commit": checkout_commit() or os.environ.get("RELBIAS_COMMIT"),
        "device": lab_device.device_name(device),
        "autocast_dtype": str(lab_device.autocast_dtype(device)),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        out.update(
            capability=list(torch.cuda.get_device_capability(device)),
            memory_gib=round(props.total_memory / 1024**3, 1),
            multiprocessors=props.multi_processor_count,
        )
    return out


def _train_methods(ctx, budget: Budget, *, tag: str, amp_dtype="auto") -> dict:
    cfg, device = ctx.config, ctx.device
    rows = {}
    for method in ctx.methods:
        if budget.left() <= 0:
            rows[method] = {"skipped": "time budget spent"}
            continue
        try:
            lab_device.seed_everything(0)
            model = training.build_model(method, cfg).to(device)
            _reset_peak(device)
            history = training.train_lm(
                model,
                ctx.corpus.train,
                cfg,
                steps=ctx.steps,
                device=device,
                progress=False,
                amp_dtype=amp_dtype,
            )
            _sync(device)
            train_peak = _peak_bytes(device)
            evals = evaluation.evaluate_lengths(
                model, ctx.corpus.val, cfg, factors=ctx.factors, device=device, amp_dtype=amp_dtype
            )
            rows[method] = {
                "steps_per_s": round(ctx.steps / history["wall_s"], 2),
                "tokens_per_s": round(history["tokens_per_s"]),
                "train_peak_mib": _mib(train_peak),
                "eval_peak_mib": _mib(_peak_bytes(device)),
                "final_loss_bits": round(history["final_loss_bits"], 4),
                "bpb": {str(r["factor"]): round(r["bpb"], 4) for r in evals},
                "finite": all(math.isfinite(v) for v in history["losses"]),
            }
            if tag == "train":
                ctx.trained[method] = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        except Exception as exc:  # one method's failure must not hide the others
            rows[method] = _failure(exc)
    return rows


def stage_chapters(ctx, budget: Budget) -> dict:
    """Every chapter (``ctx.chapters``) run as a reader runs it on this machine."""
    from relbias.book.execute import chapter_report

    env = {k: v for k, v in os.environ.items() if k != "CI"}
    rows = {}
    for path in ctx.chapters:
        if budget.left() <= 0:
            rows[path.stem] = {"skipped": "time budget spent"}
            continue
        _reset_peak(ctx.device)
        try:
            rows[path.stem] = chapter_report(path, timeout=max(60, int(budget.left())), env=env)
        except Exception as exc:
            rows[path.stem] = _failure(exc)
        print(f"[gpu_check]   {path.stem}: {rows[path.stem]}", flush=True)
    held = [r.get("claims_held") for r in rows.values() if "claims_held" in r]
    return {"chapters": rows, "all_claims_held": all(held) if held else None}


def stage_full(ctx, budget: Budget) -> dict:
    """The ``full`` configuration for ``ctx.full_methods``, one seed, each method written
    to ``out/full`` when done."""
    from relbias.lab.cli import save
    from relbias.lab.experiments import run_extrapolation

    cfg = lab_config.get_config("full", **ctx.full_overrides)
    rows = {}
    for method in ctx.full_methods:
        if budget.left() <= 0:
            rows[method] = {"skipped": "time budget spent"}
            continue
        try:
            _reset_peak(ctx.device)
            results = run_extrapolation(
                cfg, [method], seeds=[0], device=ctx.device, progress=False, verbose=False,
                tag=method,
            )  # fmt: skip
            path = save(results, ctx.out / "full")
            rec = results["methods"][method]
            rows[method] = {
                "file": str(path.relative_to(ctx.out)),
                "train_s": round(rec["train"]["wall_s"], 1),
                "peak_mib": _mib(_peak_bytes(ctx.device)),
                "bpb": {str(r["factor"]): round(r["bpb"], 4) for r in rec["eval"]},
            }
        except Exception as exc:
            rows[method] = _failure(exc)
    return {"config": cfg.to_dict(), "seeds": [0], "methods": rows}


def stage_train(ctx, budget: Budget) -> dict:
    return {
        "config": ctx.config.name,
        "steps": ctx.steps,
        "methods": _train_methods(ctx, budget, tag="train"),
    }


def stage_train_t4(ctx, budget: Budget) -> dict:
    """Under a T4's memory and with its autocast dtype (float16 with a gradient scaler)."""
    device = ctx.device
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    total = torch.cuda.get_device_properties(device).total_memory
    fraction = min(1.0, T4_MEMORY_BYTES / total)
    index = device.index if device.index is not None else torch.cuda.current_device()
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    try:
        out = {"memory_fraction": round(fraction, 4), "autocast": "float16 (asked for)"}
        out["methods"] = _train_methods(ctx, budget, tag="train_t4", amp_dtype=torch.float16)
        out["long_recall"] = _long_recall(ctx, amp_dtype=torch.float16)
        return out
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, index)
        torch.cuda.empty_cache()


def _long_recall(ctx, amp_dtype="auto") -> dict:
    """Chapter 4's recall evaluation at 16,384 tokens with an (untrained) ALiBi model."""
    device, cfg = ctx.device, ctx.config
    seq_len = 256 * cfg.train_len
    try:
        lab_device.seed_everything(0)
        model = training.build_model("alibi", cfg).to(device)
        _reset_peak(device)
        start = time.perf_counter()
        rows = evaluation.evaluate_retrieval(
            model,
            cfg,
            seq_len=seq_len,
            distances=[1, seq_len // 2, seq_len - 2],
            samples=8,
            device=device,
            amp_dtype=amp_dtype,
        )
        _sync(device)
        return {
            "seq_len": seq_len,
            "ok": True,
            "seconds": round(time.perf_counter() - start, 2),
            "peak_mib": _mib(_peak_bytes(device)),
            "accuracy": [r["accuracy"] for r in rows],
        }
    except Exception as exc:
        return {"seq_len": seq_len, "ok": False, **_failure(exc)}


def _compile_stats() -> dict | None:
    from relbias.attention import flex

    stats = getattr(flex, "compile_stats", None)
    return _jsonable(stats()) if stats else None


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    return x if isinstance(x, (str, int, float, bool, type(None))) else str(x)


def _family_bias(name: str, heads: int, n: int, device) -> relbias.RelativeBias:
    kwargs = {"max_offset": n - 1} if name == "offset" else {}
    if name == "fire":
        kwargs = {"L": n // 2}
    bias = relbias.make_bias(name, heads, **kwargs).to(device)
    with torch.no_grad():  # learnable tables start at zero: give them values to check
        for p in bias.parameters():
            if p.dim() and not p.abs().sum():
                p.normal_(0, 0.5)
    return bias


def stage_flex(ctx, budget: Budget) -> dict:
    device = ctx.device
    heads, dim = 8, 64
    before = _compile_stats()
    rows = []
    for name in ctx.families:
        for dtype in (torch.float32, torch.bfloat16):
            for n in ctx.flex_lengths:
                case = {"family": name, "dtype": str(dtype).replace("torch.", ""), "n": n}
                if budget.left() <= 0:
                    rows.append({**case, "skipped": "time budget spent"})
                    continue
                try:
                    case.update(_flex_case(name, dtype, n, heads, dim, device))
                except Exception as exc:
                    case.update(_failure(exc))
                rows.append(case)
    after = _compile_stats()
    return {"cases": rows, "compile_stats_before": before, "compile_stats_after": after}


def _flex_case(name, dtype, n, heads, dim, device) -> dict:
    gen = torch.Generator(device="cpu").manual_seed(n)
    q, k, v = (torch.randn(1, heads, n, dim, generator=gen) for _ in range(3))
    bias = _family_bias(name, heads, n, device)
    backward = device.type == "cuda"  # PyTorch has no CPU backward for FlexAttention
    results = {}
    for backend in ("materialize", "flex"):
        bias.zero_grad(set_to_none=True)
        dt = torch.float32 if backend == "materialize" else dtype
        leaves = [t.to(device, dt).requires_grad_(backward) for t in (q, k, v)]
        start = time.perf_counter()
        with torch.set_grad_enabled(backward):
            out = relbias.biased_attention(*leaves, bias, causal=True, backend=backend)
        grads = []
        if backward:
            out.float().square().sum().backward()
            grads = [t.grad.float() for t in leaves] + [
                p.grad.float().clone()
                if p.grad is not None
                else torch.zeros_like(p, dtype=torch.float32)
                for p in bias.parameters()
            ]
        _sync(device)
        results[backend] = (out.detach().float(), grads, time.perf_counter() - start)
    ref_out, ref_grads, _ = results["materialize"]
    out, grads, seconds = results["flex"]
    rel = [
        float((g - r).abs().max()) / max(float(r.abs().max()), 1e-6)
        for g, r in zip(grads, ref_grads)
    ]
    return {
        "out_max_abs_err": float((out - ref_out).abs().max()),
        "grad_max_rel_err": [round(x, 6) for x in rel] if backward else "no CPU backward",
        "finite": bool(torch.isfinite(out).all())
        and all(bool(torch.isfinite(g).all()) for g in grads),
        "first_call_s": round(seconds, 2),
    }


def _cuda_time(fn, device, repeats: int = 5) -> float:
    for _ in range(2):
        fn()
    _sync(device)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        _sync(device)
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def stage_flex_speed(ctx, budget: Budget) -> dict:
    device = ctx.device
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    heads, dim = 8, 64
    rows = []
    for n in ctx.speed_lengths:
        gen = torch.Generator(device="cpu").manual_seed(0)
        qkv = [
            torch.randn(1, heads, n, dim, generator=gen).to(device, torch.bfloat16)
            for _ in range(3)
        ]
        for name in ("none", *ctx.families):
            case = {"family": name, "n": n}
            if budget.left() <= 0:
                rows.append({**case, "skipped": "time budget spent"})
                continue
            try:
                bias = None if name == "none" else _family_bias(name, heads, n, device)
                leaves = [t.clone().requires_grad_() for t in qkv]

                def forward(leaves=leaves, bias=bias):
                    with torch.no_grad():
                        return _flex(leaves, bias)

                backward = "flex"
                prepared = None if bias is None else bias.prepare(n)
                if prepared is not None and not prepared.score_mod_trainable:
                    backward = relbias.choose_backend(*leaves, prepared)  # what auto takes

                def forward_backward(leaves=leaves, bias=bias, backward=backward):
                    if backward == "flex":
                        _flex(leaves, bias).float().sum().backward()
                    else:
                        out = relbias.biased_attention(*leaves, bias, causal=True)
                        out.float().sum().backward()

                _reset_peak(device)
                case["forward_ms"] = round(_cuda_time(forward, device), 3)
                case["forward_backward_ms"] = round(_cuda_time(forward_backward, device), 3)
                case["backward_backend"] = backward
                case["peak_mib"] = _mib(_peak_bytes(device))
            except Exception as exc:
                case.update(_failure(exc))
            rows.append(case)
    base = {r["n"]: r for r in rows if r["family"] == "none" and "forward_ms" in r}
    for r in rows:
        b = base.get(r["n"])
        if b and "forward_ms" in r and r["family"] != "none":
            r["forward_ratio"] = round(r["forward_ms"] / b["forward_ms"], 3)
            r["forward_backward_ratio"] = round(
                r["forward_backward_ms"] / b["forward_backward_ms"], 3
            )
    try:
        import flash_attn  # noqa: F401

        flash = "installed (not compared by this script yet)"
    except ImportError:
        flash = "not installed"
    return {"dtype": "bfloat16", "heads": heads, "head_dim": dim, "rows": rows, "flash_attn": flash}


def _flex(leaves, bias):
    if bias is None:
        from relbias.attention import flex

        return flex.flex_attention_with_bias(*leaves, None, causal=True)
    return relbias.biased_attention(*leaves, bias, causal=True, backend="flex")


def stage_cpu_vs_gpu(ctx, budget: Budget) -> dict:
    cfg = ctx.config
    factors = ctx.factors[:2]
    rows = {}
    for method, state in ctx.trained.items():
        if budget.left() <= 0:
            rows[method] = {"skipped": "time budget spent"}
            continue
        try:
            model = training.build_model(method, cfg)
            model.load_state_dict(state)
            row = {}
            settings = [("cpu", "cpu", False)]
            if ctx.device.type == "cuda":
                settings += [("gpu_float32", ctx.device, False), ("gpu_autocast", ctx.device, True)]
            for label, device, autocast in settings:
                evals = evaluation.evaluate_lengths(
                    model,
                    ctx.corpus.val,
                    cfg,
                    factors=factors,
                    device=device,
                    amp_dtype="auto" if autocast else None,
                )
                row[label] = {str(r["factor"]): r["bpb"] for r in evals}
            for label in list(row):
                if label != "cpu":
                    row[f"{label}_minus_cpu"] = {
                        f: row[label][f] - row["cpu"][f] for f in row["cpu"]
                    }
            rows[method] = row
        except Exception as exc:
            rows[method] = _failure(exc)
    return {"factors": list(factors), "methods": rows}


def _mib(n: int | None) -> float | None:
    return None if n is None else round(n / 1024**2, 1)


def _failure(exc: BaseException) -> dict:
    return {
        "error": f"{type(exc).__name__}: {exc}"[:2000],
        "traceback": traceback.format_exc()[-3000:],
    }


def _toc_chapters() -> list[Path]:
    """The book's chapters in the order of ``_toc.yml``."""
    import re

    toc = (ROOT / "_toc.yml").read_text()
    names = re.findall(r"(?:root|file):\s*(\S+)", toc)
    return [ROOT / f"{n}.ipynb" for n in names if (ROOT / f"{n}.ipynb").is_file()]


class Context:
    def __init__(self, args):
        self.device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.methods = args.methods
        self.families = args.families
        self.steps = args.steps
        self.factors = (1, 4, 16)
        self.flex_lengths = tuple(args.flex_lengths)
        self.speed_lengths = (4096, 8192, 16384, 32768)
        self.out = args.out
        self.chapters = [Path(p) for p in args.chapters] if args.chapters else _toc_chapters()
        self.full_methods = tuple(args.full_methods)
        self.full_overrides = {}
        overrides = {}
        if args.smoke:
            self.steps = min(self.steps, 3)
            self.factors = (1, 2)
            self.flex_lengths = (64,)
            self.speed_lengths = (256,)
            overrides = {"dim": 32, "heads": 4, "eval_tokens": 512, "train_len": 32}
            self.full_overrides = {**overrides, "steps": 3, "eval_factors": (1, 2), "val_every": 0,
                                   "eval_spread": False, "corpus_bytes": 200_000}  # fmt: skip
        self.config = lab_config.get_config(GPU_CONFIG, **overrides)
        corpus_bytes = 200_000 if args.smoke else self.config.corpus_bytes
        self.corpus = load_corpus(max_bytes=corpus_bytes)
        self.trained: dict = {}


def parse_args(argv=None):
    p = argparse.ArgumentParser(
        prog="python scripts/gpu_check.py", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--out", type=Path, default=Path("gpu_results"), help="folder for gpu_check.json"
    )
    p.add_argument("--device", help="cuda (default when available) or cpu")
    p.add_argument("--stages", default=",".join(STAGES), help=f"comma-separated, of {STAGES}")
    p.add_argument("--methods", nargs="+", default=["alibi", "t5", "fire", "nope"])
    p.add_argument(
        "--families",
        nargs="+",
        default=list(relbias.BIAS_NAMES),
        choices=relbias.BIAS_NAMES,
        metavar="FAMILY",
        help="bias families of the flex stages (default: all)",
    )
    p.add_argument("--flex-lengths", type=int, nargs="+", default=[256, 2048], metavar="N")
    p.add_argument("--steps", type=int, default=100)
    p.add_argument(
        "--chapters", nargs="+", metavar="NOTEBOOK", help="chapters to run (default: _toc.yml's)"
    )
    p.add_argument(
        "--full-methods",
        nargs="+",
        default=list(FULL_METHODS),
        help=f"methods of the full stage (default: {' '.join(FULL_METHODS)})",
    )
    p.add_argument("--budget", type=float, default=480.0, help="seconds for all stages together")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, for a CPU test")
    args = p.parse_args(argv)
    stages = [s for s in args.stages.split(",") if s]
    unknown = sorted(set(stages) - set(STAGES))
    if unknown:
        p.error(f"--stages: unknown {unknown}; choose from {STAGES}")
    if min(args.flex_lengths) < 1:
        p.error(f"--flex-lengths must be >= 1, got {args.flex_lengths}")
    missing = [c for c in args.chapters or [] if not Path(c).is_file()]
    if missing:
        p.error(f"--chapters: no such notebook {missing}")
    if args.steps < 1:
        p.error(f"--steps must be >= 1, got {args.steps}")
    if not args.budget > 0:
        p.error(f"--budget must be > 0, got {args.budget}")
    args.stages = stages
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "gpu_check.json"
    ctx = Context(args)
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "provenance": {
            "commit": checkout_commit(),
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "budget_s": args.budget,
        },
        "stages": {},
    }
    functions = {name: globals()[f"stage_{name}"] for name in STAGES}
    for name in STAGES:
        if name not in args.stages:
            continue
        start = time.perf_counter()
        budget = Budget(args.budget * STAGE_SHARE[name])
        print(f"[gpu_check] {name} ...", flush=True)
        try:
            result = functions[name](ctx) if name == "env" else functions[name](ctx, budget)
        except Exception as exc:
            result = _failure(exc)
        result = {"seconds": round(time.perf_counter() - start, 1), **result}
        report["stages"][name] = result
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(report, indent=1, default=str))
        tmp.replace(path)
        print(f"[gpu_check] {name} done in {result['seconds']} s", flush=True)
    print(json.dumps(report["stages"], default=str)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
