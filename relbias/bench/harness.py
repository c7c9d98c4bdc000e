"""Benchmark: how fast, and in how much memory, each way of applying a bias runs.

``python -m relbias.bench`` measures, side by side in one run, for every bias family
and every length n: the forward time (and, for n <= ``--backward-max``, forward plus
backward) and the peak memory of

* ``sdpa``: plain causal ``scaled_dot_product_attention`` with no bias (the floor);
* ``materialize``, ``table``, ``flex``, ``fused``: :func:`relbias.biased_attention`
  with that backend (see :mod:`relbias.attention.flex` and :mod:`relbias.attention.fused`);
* ``xt``: x-transformers' ``RelativePositionBias`` (T5) and ``AlibiPositionalBias``
  (ALiBi), applied with its ``Attend`` module (its default, non-flash path);
* ``hf_t5``: HuggingFace's ``T5Attention.compute_bias``, added with the causal mask
  to ``scaled_dot_product_attention``.

Ratios are to the floor at the same n. Results print as tables and go to JSON with
the machine, the torch version and the thread count (``--out``). ``--quick`` runs a
small configuration in about a minute. Not a test: timings vary from run to run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from torch.nn import functional as F

from relbias.attention import flex, fused
from relbias.attention.api import biased_attention
from relbias.biases.registry import BIAS_NAMES, make_bias

OUR_METHODS = ("materialize", "table", "flex", "fused")
#: Our methods that never form a [H, n, n] tensor, fastest expected first.
FAST_METHODS = ("fused", "table", "flex")
ALL_METHODS = ("sdpa", *OUR_METHODS, "xt", "hf_t5")
REFERENCES = {"xt": ("t5", "alibi"), "hf_t5": ("t5",)}
#: Dense methods hold about this many [heads, n, n] float tensors at once (forward).
DENSE_COPIES = {"materialize": 2, "xt": 4, "hf_t5": 3}
FULL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 512)

METHOD_NOTES = {
    "sdpa": "F.scaled_dot_product_attention(q, k, v, is_causal=True), no bias: the floor",
    "materialize": "relbias.biased_attention(backend='materialize'): [H, n, n] bias + causal "
    "-inf as a 4-D additive mask of scaled_dot_product_attention",
    "table": "relbias.biased_attention(backend='table'): offset-only families read their "
    "O(n) table through a zero-copy strided (Hankel) mask with reversed query rows; causal "
    "attention in tiles of 1024 query rows (the keys before a tile in one call, its causal "
    "triangle in strips of 256 rows, joined by log-sum-exp), blocks of rows below that; FIRE "
    "evaluates its MLP (hidden units that do not switch on [0, 1] folded into one linear "
    "term) per block of rows with a compiled fused kernel",
    "flex": "relbias.biased_attention(backend='flex'): compiled FlexAttention, score_mod "
    "reads the O(n) table (FIRE: computes its MLP per score), causal block mask",
    "fused": "relbias.biased_attention(backend='fused'): relbias's C++ CPU kernel "
    "(relbias/attention/csrc/fused_attention.cpp; forward only, float32): "
    f"blocks of {fused.Q_BLOCK} "
    f"query rows x {fused.KV_BLOCK} keys (each thread transposes one head's keys at a time), "
    "scores by oneDNN's brgemm, the bias added in place "
    "(offset-only: a run of the reversed O(n) table; FIRE: its folded MLP per score), online "
    "softmax, no block above the causal diagonal",
    "xt": "x-transformers RelativePositionBias / AlibiPositionalBias -> [H, n, n] bias, "
    "applied by x_transformers.attend.Attend(causal=True) (its default einsum path)",
    "hf_t5": "transformers T5Attention(is_decoder=True).compute_bias -> [1, H, n, n] bias, "
    "plus causal -inf, as the mask of scaled_dot_product_attention",
}

TIMING_METHOD = (
    "Wall-clock seconds (time.perf_counter) of one call, after one warm-up call that also "
    "compiles FlexAttention. For each family and n, the floor (sdpa) and every method are "
    "called in turn within each repeat, so that load from other processes spreads over all "
    "of them; the median over repeats is reported, with every sample. ratio_to_floor divides "
    "by the floor timed in the same family's loop (rows with family null pool the floor's "
    "samples of all families at that n). compile_seconds = first call minus the median "
    "call. Process CPU time (time.process_time, all threads) is recorded as well "
    "(cpu_seconds_min: the least over repeats)."
)
MEMORY_METHOD = (
    "Peak resident memory, measured in a fresh subprocess per length with glibc's mmap "
    "threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_=65536), so that every tensor's memory "
    "is returned to the system when freed and resident memory tracks live tensors. After a "
    "warm-up call (compilation), the kernel's peak-RSS counter is reset (writing 5 to "
    "/proc/self/clear_refs) and VmHWM is read after one call: peak_extra_bytes = VmHWM - RSS "
    "before the call (the output, the bias, all temporaries, kernel workspace). peak_bytes = "
    "peak_extra_bytes + the bytes of q, k, v (the memory of the attention call, inputs "
    "included); memory ratios are of peak_bytes. persistent_bytes = RSS growth during the "
    "warm-up call (caches such as x-transformers' stored ALiBi bias, compiled code)."
)


# ---------------------------------------------------------------------------------
# Building the pieces
# ---------------------------------------------------------------------------------
def _bias_module(name: str, heads: int, seed: int):
    """A bias module with reproducible, non-trivial parameters."""
    torch.manual_seed(seed)
    kwargs = {"max_offset": 1024} if name == "offset" else {}
    module = make_bias(name, heads, **kwargs)
    if name in ("offset", "t5"):
        with torch.no_grad():
            module.weight.normal_()
    return module


def _reference(method: str, family: str, module, heads: int):
    """A callable ``(q, k, v) -> out`` running a reference implementation."""
    n_cache = {}
    if method == "xt":
        from x_transformers.attend import Attend
        from x_transformers.x_transformers import AlibiPositionalBias, RelativePositionBias

        attend = Attend(causal=True)
        if family == "t5":
            rel = RelativePositionBias(
                scale=1.0,
                causal=True,
                num_buckets=module.num_buckets,
                max_distance=module.max_distance,
                heads=heads,
            )
            with torch.no_grad():
                rel.relative_attention_bias.weight.copy_(module.weight.detach().T)
        else:
            rel = AlibiPositionalBias(heads=heads)

        def run(q, k, v):
            bias = rel(q.shape[2], k.shape[2])
            return attend(q, k, v, attn_bias=bias)[0]

        run.module = rel
        return run
    if method == "hf_t5":
        from transformers import T5Config
        from transformers.models.t5.modeling_t5 import T5Attention

        config = T5Config(
            d_model=heads * 64,
            d_kv=64,
            num_heads=heads,
            is_decoder=True,
            relative_attention_num_buckets=module.num_buckets,
            relative_attention_max_distance=module.max_distance,
        )
        t5 = T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
        with torch.no_grad():
            t5.relative_attention_bias.weight.copy_(module.weight.detach().T)

        def run(q, k, v):
            n, m = q.shape[2], k.shape[2]
            bias = t5.compute_bias(n, m, device=q.device)
            if n not in n_cache:
                i = torch.arange(m - n, m, device=q.device)
                n_cache[n] = torch.arange(m, device=q.device)[None, :] > i[:, None]
            mask = bias.masked_fill(n_cache[n], float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

        run.module = t5
        return run
    raise ValueError(method)


def _runner(method: str, family: str | None, module, heads: int):
    if method == "sdpa":
        return lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
    if method in OUR_METHODS:
        return lambda q, k, v: biased_attention(q, k, v, module, causal=True, backend=method)
    return _reference(method, family, module, heads)


def _applicable(
    method: str, family: str, n: int, heads: int, max_dense_gib: float, backward: bool
) -> str | None:
    """None when the method runs for this family and n, else why not."""
    if method in REFERENCES and family not in REFERENCES[method]:
        return "no reference implementation of this family"
    if backward and method == "flex" and not torch.cuda.is_available():
        return "FlexAttention has no backward on the CPU"
    if backward and method == "fused":
        return "the fused kernel runs forward only"
    if method == "fused" and not fused.available():
        return f"the fused kernel could not be built: {fused.unavailable_reason()}"
    copies = DENSE_COPIES.get(method)
    if copies and family == "fire":
        copies += 32 / heads  # FIRE's MLP holds its hidden layer (32 units) for every score
    if copies:
        need = copies * (3 if backward else 1) * heads * n * n * 4 / 2**30
        if need > max_dense_gib:
            return f"needs ~{need:.0f} GiB of dense [H, n, n] tensors (> --max-dense-gib)"
    return None


def _inputs(n: int, heads: int, dim: int, dtype, seed: int, grad: bool = False):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(1, heads, n, dim, generator=gen, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    ]


# ---------------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------------
def _time_call(fn, backward: bool):
    """Run ``fn`` once (and its backward): (wall seconds, CPU seconds, output)."""
    wall, cpu = time.perf_counter(), time.process_time()
    if backward:
        out = fn()
        out.float().square().mean().backward()
    else:
        with torch.no_grad():
            out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def _time_family(n, family, methods, args, backward, floor_samples, log):
    heads, dim = args.heads, args.head_dim
    dtype = getattr(torch, args.dtype)
    module = _bias_module(family, heads, args.seed)
    q, k, v = _inputs(n, heads, dim, dtype, args.seed, grad=backward)
    entries, runners, reference_out = {}, {}, None
    for method in ("sdpa", *methods):
        reason = _applicable(method, family, n, heads, args.max_dense_gib, backward)
        if reason:
            entries[method] = {"skipped": reason}
            continue
        try:
            run = _runner(method, family, module, heads)
        except ImportError as err:  # a reference package is missing
            entries[method] = {"skipped": f"not installed: {err}"}
            continue
        runners[method] = lambda run=run: run(q, k, v)
    # warm-up (and compilation), with a check that every method agrees
    for method, fn in list(runners.items()):
        try:
            wall, _, out = _time_call(fn, backward)
            out = None if method == "sdpa" else out
        except Exception as err:  # noqa: BLE001 - record and go on
            entries[method] = {"error": f"{type(err).__name__}: {err}"[:300]}
            del runners[method]
            continue
        entries[method] = {"first_call_seconds": wall, "wall": [], "cpu": []}
        if out is not None:
            out = out.detach().float()
            if reference_out is None:
                reference_out = out
            entries[method]["max_abs_diff"] = float((out - reference_out).abs().max())
        for t in (q, k, v, *module.parameters()):
            t.grad = None
    repeats = args.repeats if args.repeats else (5 if n <= 2048 else 3 if n <= 8192 else 2)
    for _ in range(repeats):
        for method, fn in runners.items():
            wall, cpu, _ = _time_call(fn, backward)
            entries[method]["wall"].append(wall)
            entries[method]["cpu"].append(cpu)
            for t in (q, k, v, *module.parameters()):
                t.grad = None
    if "sdpa" in runners:
        floor_samples.extend(entries["sdpa"]["wall"])
    for method in runners:
        e = entries[method]
        e["seconds_median"] = statistics.median(e["wall"])
        e["cpu_seconds_min"] = min(e["cpu"])
        e["compile_seconds"] = max(0.0, e["first_call_seconds"] - e["seconds_median"])
        log(
            f"  {'fwd+bwd' if backward else 'fwd'} n={n} {family:12s} {method:11s} "
            f"{e['seconds_median'] * 1e3:9.1f} ms"
        )
    return entries


# ---------------------------------------------------------------------------------
# Memory (in a subprocess)
# ---------------------------------------------------------------------------------
def _proc_status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"{field} not in /proc/self/status")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _memory_worker(spec: dict) -> list[dict]:
    """Run in a fresh process: peak memory of each (family, method) at one n."""
    torch.set_num_threads(spec["threads"])
    torch.set_flush_denormal(spec["flush_denormal"])
    n, heads, dim = spec["n"], spec["heads"], spec["head_dim"]
    dtype = getattr(torch, spec["dtype"])
    q, k, v = _inputs(n, heads, dim, dtype, spec["seed"])
    input_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
    rows = []
    for family, method in spec["jobs"]:
        row = {"family": family, "method": method, "n": n}
        try:
            module = _bias_module(family, heads, spec["seed"]) if family else None
            fn = _runner(method, family, module, heads)
            with torch.no_grad():
                gc.collect()
                before = _proc_status("VmRSS")
                fn(q, k, v)
                gc.collect()
                if not _reset_peak():
                    raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs)")
                ready = _proc_status("VmRSS")
                out = fn(q, k, v)
                peak = _proc_status("VmHWM")
                del out
            row.update(
                peak_extra_bytes=peak - ready,
                peak_bytes=peak - ready + input_bytes,
                input_bytes=input_bytes,
                persistent_bytes=ready - before,
            )
        except Exception as err:  # noqa: BLE001
            row["error"] = f"{type(err).__name__}: {err}"[:300]
        rows.append(row)
        del fn
        gc.collect()
    return rows


def _measure_memory(n, jobs, args, log) -> list[dict]:
    spec = {
        "n": n,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "seed": args.seed,
        "threads": args.threads,
        "flush_denormal": args.flush_denormal,
        "jobs": jobs,
    }
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    cmd = [sys.executable, "-m", "relbias.bench", "--memory-worker", json.dumps(spec)]
    log(f"  memory n={n}: {len(jobs)} measurements in a subprocess")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=args.memory_timeout)
    for line in proc.stdout.splitlines():
        if line.startswith("MEMORY-RESULT "):
            return json.loads(line[len("MEMORY-RESULT ") :])
    tail = (proc.stderr or "")[-500:]
    return [{"family": f, "method": m, "n": n, "error": f"worker failed: {tail}"} for f, m in jobs]


# ---------------------------------------------------------------------------------
# The run
# ---------------------------------------------------------------------------------
def _machine() -> dict:
    info = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        info["memory_bytes"] = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        info["load_average_at_start"] = os.getloadavg()
    except (OSError, ValueError, AttributeError):
        pass
    return info


def run(args, log=print) -> dict:
    """Run the benchmark; the caller's thread count and denormal mode are restored after."""
    threads = torch.get_num_threads()
    try:
        return _run(args, log)
    finally:
        torch.set_num_threads(threads)
        torch.set_flush_denormal(False)  # PyTorch's default; there is no getter


def _run(args, log=print) -> dict:
    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(args.flush_denormal)
    started = time.time()
    families = args.families
    methods = [m for m in args.methods if m != "sdpa"]
    results = []
    floor = {}
    for n in args.lengths:
        for backward in (False, True):
            if backward and (n > args.backward_max or not args.backward):
                continue
            samples: list[float] = []
            per_family = {}
            for family in families:
                per_family[family] = _time_family(n, family, methods, args, backward, samples, log)
            floor_median = statistics.median(samples) if samples else None
            floor[(n, backward)] = floor_median
            pass_ = "forward_backward" if backward else "forward"
            if floor_median:
                results.append(
                    {
                        "family": None,
                        "n": n,
                        "method": "sdpa",
                        "pass": pass_,
                        "seconds_median": floor_median,
                        "wall": samples,
                        "note": "all families' floor samples at this n, pooled",
                    }
                )
            for family, entries in per_family.items():
                # Ratios use the floor timed in the same loop (interleaved with the
                # method), so that load that changes over the run cancels out.
                own_floor = entries.get("sdpa", {}).get("seconds_median")
                for method, e in entries.items():
                    row = {"family": family, "n": n, "method": method, "pass": pass_, **e}
                    if "seconds_median" in row and own_floor:
                        row["ratio_to_floor"] = row["seconds_median"] / own_floor
                    results.append(row)
        if args.memory:
            jobs = [[None, "sdpa"]] + [
                [family, method]
                for family in families
                for method in methods
                if not _applicable(method, family, n, args.heads, args.max_dense_gib, False)
            ]
            mem = _measure_memory(n, jobs, args, log)
            floor_mem = next((r.get("peak_bytes") for r in mem if r["method"] == "sdpa"), None)
            for r in mem:
                r["pass"] = "memory"
                if floor_mem and "peak_bytes" in r:
                    r["ratio_to_floor"] = r["peak_bytes"] / floor_mem
                    r["extra_ratio_to_floor"] = r["peak_extra_bytes"] / max(
                        1, next(x["peak_extra_bytes"] for x in mem if x["method"] == "sdpa")
                    )
            results.extend(mem)
    report = {
        "schema": 1,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m relbias.bench " + " ".join(args.argv),
        "machine": _machine(),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "flush_denormal": args.flush_denormal,
        "config": {
            "device": "cpu",
            "dtype": args.dtype,
            "batch": 1,
            "heads": args.heads,
            "head_dim": args.head_dim,
            "lengths": list(args.lengths),
            "families": families,
            "methods": ["sdpa", *methods],
            "backward_max": args.backward_max,
            "repeats": args.repeats or "5 (n <= 2048), 3 (n <= 8192), 2 (larger)",
            "seed": args.seed,
            "causal": True,
            "max_dense_gib": args.max_dense_gib,
            "bias_parameters": "offset (max_offset=1024) and t5 tables ~ N(0, 1); "
            "kerple, fire: default initialisation (seeded)",
        },
        "methods": {m: METHOD_NOTES[m] for m in ["sdpa", *methods]},
        "timing_method": TIMING_METHOD,
        "memory_method": MEMORY_METHOD,
        "versions": _versions(),
        "flex_compile_stats": {k: v for k, v in flex.compile_stats().items() if k != "per_key"},
        "elapsed_seconds": time.time() - started,
        "results": results,
    }
    report["goals"] = evaluate_goals(report)
    return report


def _versions() -> dict:
    out = {}
    for name in ("x_transformers", "transformers", "numpy"):
        try:
            module = __import__(name)
            out[name] = getattr(module, "__version__", "unknown")
        except ImportError:
            out[name] = None
    if out.get("x_transformers") in (None, "unknown"):
        try:
            from importlib.metadata import version

            out["x_transformers"] = version("x-transformers")
        except Exception:  # noqa: BLE001
            pass
    return out


# ---------------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------------
def _index(report, pass_):
    return {(r["family"], r["n"], r["method"]): r for r in report["results"] if r["pass"] == pass_}


def _best_ours(rows, family, n):
    """Our fastest non-materialising backend at (family, n): (method, row)."""
    found = [(m, rows.get((family, n, m))) for m in FAST_METHODS]
    found = [(m, r) for m, r in found if r and r.get("seconds_median")]
    return min(found, key=lambda mr: mr[1]["seconds_median"], default=(None, None))


def evaluate_goals(report) -> dict:
    """The issue's goals, checked against this run (None where not measured)."""
    fwd, bwd, mem = (_index(report, p) for p in ("forward", "forward_backward", "memory"))
    families = report["config"]["families"]
    goals = {}
    n = 4096 if any(k[1] == 4096 for k in fwd) else max((k[1] for k in fwd), default=None)
    if n is not None:
        speed = {}
        for family in families:
            method, row = _best_ours(fwd, family, n)
            if row is None:
                continue
            limit = 1.5 if family == "fire" else 1.15
            refs = {
                m: fwd[(family, n, m)]["seconds_median"] / row["seconds_median"]
                for m in ("xt", "hf_t5")
                if fwd.get((family, n, m), {}).get("seconds_median")
            }
            speed[family] = {
                "backend": method,
                "ratio_to_floor": row.get("ratio_to_floor"),
                "limit": limit,
                "met": bool(row.get("ratio_to_floor", math.inf) <= limit),
                "speedup_vs_references": refs,
                "references_5x_met": all(v >= 5 for v in refs.values()) if refs else None,
                "speedup_vs_materialize": (
                    fwd[(family, n, "materialize")]["seconds_median"] / row["seconds_median"]
                    if fwd.get((family, n, "materialize"), {}).get("seconds_median")
                    else None
                ),
                "table_ratio_to_floor": fwd.get((family, n, "table"), {}).get("ratio_to_floor"),
                "flex_ratio_to_floor": fwd.get((family, n, "flex"), {}).get("ratio_to_floor"),
                "fused_ratio_to_floor": fwd.get((family, n, "fused"), {}).get("ratio_to_floor"),
            }
        goals[f"forward_n{n}"] = speed
    mem_n = max((k[1] for k in mem), default=None)
    if mem_n is not None:
        memory = {}
        for family in families:
            for method in FAST_METHODS:
                r = mem.get((family, mem_n, method))
                if r and "ratio_to_floor" in r:
                    memory.setdefault(family, {})[method] = {
                        "ratio_to_floor": r["ratio_to_floor"],
                        "extra_ratio_to_floor": r.get("extra_ratio_to_floor"),
                        "met": r["ratio_to_floor"] <= 1.5,
                    }
        goals[f"memory_n{mem_n}"] = memory
    bn = 2048 if any(k[1] == 2048 for k in bwd) else max((k[1] for k in bwd), default=None)
    if bn is not None:
        train = {}
        for family in families:
            row = bwd.get((family, bn, "materialize"))
            best = min(
                (
                    bwd[(family, bn, m)]
                    for m in ("materialize", "table")
                    if bwd.get((family, bn, m), {}).get("seconds_median")
                ),
                key=lambda r: r["seconds_median"],
                default=None,
            )
            if row is None or best is None:
                continue
            xt = bwd.get((family, bn, "xt"), {}).get("seconds_median")
            train[family] = {
                "backend": best["method"],
                "ratio_to_floor": best.get("ratio_to_floor"),
                "materialize_ratio_to_floor": row.get("ratio_to_floor"),
                "speedup_vs_xt": xt / best["seconds_median"] if xt else None,
                "met": (xt / best["seconds_median"] >= 1.0) if xt else None,
            }
        goals[f"forward_backward_n{bn}"] = train
    return goals


def _fmt_ratio(row) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "error"
    if "skipped" in row:
        return "skip"
    ratio = row.get("ratio_to_floor")
    return "-" if ratio is None else f"{ratio:.2f}x"


def format_tables(report) -> str:
    lines = []
    methods = report["config"]["methods"]
    for pass_, title in (
        ("forward", "Forward time"),
        ("forward_backward", "Forward + backward time"),
        ("memory", "Peak memory (inputs included)"),
    ):
        rows = _index(report, pass_)
        if not rows:
            continue
        lengths = sorted({k[1] for k in rows})
        cols = [m for m in methods if m != "sdpa"]
        floor_name = "floor s" if pass_ != "memory" else "floor MiB"
        lines.append(f"\n{title}: ratio to no-bias causal SDPA (the floor)")
        header = f"{'family':13s}{'n':>7s}{floor_name:>11s}" + "".join(f"{m:>13s}" for m in cols)
        lines.append(header)
        lines.append("-" * len(header))
        for family in report["config"]["families"]:
            for n in lengths:
                floor_row = rows.get((None, n, "sdpa"), {})
                if pass_ == "memory":
                    f = floor_row.get("peak_bytes")
                    floor_txt = f"{f / 2**20:.0f}" if f else "-"
                else:
                    f = floor_row.get("seconds_median")
                    floor_txt = f"{f:.4f}" if f else "-"
                cells = "".join(f"{_fmt_ratio(rows.get((family, n, m))):>13s}" for m in cols)
                lines.append(f"{family:13s}{n:>7d}{floor_txt:>11s}{cells}")
    lines.append("\nGoals (see 'goals' in the JSON):")
    for name, per_family in report.get("goals", {}).items():
        for family, g in per_family.items():
            details = ", ".join(f"{k}={_short(v)}" for k, v in g.items() if k not in ("limit",))
            lines.append(f"  {name:24s} {family:13s} {details}")
    return "\n".join(lines)


def _short(v):
    if isinstance(v, float):
        return f"{v:.2f}"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{k}: {_short(x)}" for k, x in v.items()) + "}"
    return str(v)


# ---------------------------------------------------------------------------------
# For the book: a small live comparison, the stored results, and their figures
# ---------------------------------------------------------------------------------
RESULTS_DIR = Path(__file__).resolve().parents[2] / "benchmarks" / "results"
METHOD_STYLE = {
    "sdpa": ("no bias (floor)", "black", "-"),
    "materialize": ("materialise", "tab:red", "-"),
    "table": ("O(n) table (strided)", "tab:green", "-"),
    "flex": ("FlexAttention", "tab:blue", "-"),
    "fused": ("fused C++ kernel", "tab:cyan", "-"),
    "xt": ("x-transformers", "tab:orange", "--"),
    "hf_t5": ("HF T5 compute_bias", "tab:purple", "--"),
}


def compare(
    n: int,
    families,
    methods=("materialize", "table", "fused", "xt", "hf_t5"),
    *,
    repeats: int = 3,
    heads: int = 8,
    head_dim: int = 64,
    seed: int = 0,
) -> dict:
    """Time the forward pass of ``methods`` for ``families`` at one length n.

    Returns ``{"floor_seconds": ..., "rows": [{family, method, seconds_median,
    ratio_to_floor, max_abs_diff} ...]}``; ``max_abs_diff`` is the largest difference
    of each method's output from the first method's (the materialised path).
    """
    args = argparse.Namespace(
        heads=heads,
        head_dim=head_dim,
        dtype="float32",
        seed=seed,
        repeats=repeats,
        max_dense_gib=math.inf,
    )
    samples: list[float] = []
    per_family = {
        f: _time_family(n, f, list(methods), args, False, samples, lambda m: None) for f in families
    }
    floor_seconds = statistics.median(samples)
    rows = []
    for family, entries in per_family.items():
        for method in methods:
            e = entries.get(method, {})
            if "seconds_median" not in e:
                continue
            rows.append(
                {
                    "family": family,
                    "method": method,
                    "seconds_median": e["seconds_median"],
                    "ratio_to_floor": e["seconds_median"] / floor_seconds,
                    "max_abs_diff": e.get("max_abs_diff", 0.0),
                }
            )
    return {"n": n, "floor_seconds": floor_seconds, "rows": rows}


RESULTS_URL = "https://raw.githubusercontent.com/relbias/relbias/main/benchmarks/results/"


def load_report(path=None, *, name: str = "cpu") -> dict:
    """A stored benchmark JSON: ``path``, or ``benchmarks/results/<name>.json``.

    ``name="cpu"`` (default) is the full CPU run; ``"cpu_n4096_quiet"`` a second run of
    the n = 4,096 forward timings only. Where the package was installed without
    the repository (Colab), the named file is downloaded from the repository instead.
    """
    if path is not None:
        return json.loads(Path(path).read_text())
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name must be a file name without folders, got {name!r}")
    local = RESULTS_DIR / f"{name}.json"
    if local.exists():
        return json.loads(local.read_text())
    if RESULTS_DIR.is_dir():  # running from the repository, which has no such result
        known = sorted(p.stem for p in RESULTS_DIR.glob("*.json"))
        raise ValueError(f"no stored benchmark named {name!r}; stored: {known}")
    from urllib.request import urlopen

    with urlopen(RESULTS_URL + f"{name}.json", timeout=30) as response:
        return json.loads(response.read().decode())


def provenance(report) -> str:
    """One paragraph saying where and how the stored results were measured."""
    m = report["machine"]
    cfg = report["config"]
    return (
        f"measured {report['created']} on {m.get('cpu', m.get('machine'))} "
        f"({m.get('cpu_count')} cores, {report['threads']} torch threads), "
        f"torch {report['torch']}, {cfg['dtype']}, batch {cfg['batch']}, "
        f"{cfg['heads']} heads of dimension {cfg['head_dim']}, causal; "
        f"flush denormals: {report['flush_denormal']}; load average (1, 5, 15 min) at the "
        f"start: {', '.join(f'{x:.1f}' for x in m.get('load_average_at_start', []))}; "
        f"command: {report['command']}"
    )


def summary(report) -> dict:
    """Key numbers of a report for the book's prose (ranges over families)."""
    goals = report["goals"]
    fwd = next((v for k, v in goals.items() if k.startswith("forward_n")), {})
    mem = next((v for k, v in goals.items() if k.startswith("memory_n")), {})
    bwd = next((v for k, v in goals.items() if k.startswith("forward_backward_n")), {})
    offset_only = [f for f in fwd if f != "fire"]

    def span(values):
        values = [v for v in values if v is not None]
        return (min(values), max(values)) if values else (math.nan, math.nan)

    out = {
        "n_forward": next((int(k[9:]) for k in goals if k.startswith("forward_n")), None),
        "n_memory": next((int(k[8:]) for k in goals if k.startswith("memory_n")), None),
        "n_backward": next(
            (int(k[18:]) for k in goals if k.startswith("forward_backward_n")), None
        ),
        "table": span(fwd[f].get("table_ratio_to_floor") for f in offset_only),
        "flex": span(fwd[f]["flex_ratio_to_floor"] for f in offset_only),
        "fused": span(fwd[f].get("fused_ratio_to_floor") for f in offset_only),
        "fire": fwd.get("fire", {}).get("table_ratio_to_floor", math.nan),
        "fire_flex": fwd.get("fire", {}).get("flex_ratio_to_floor", math.nan),
        "fire_fused": fwd.get("fire", {}).get("fused_ratio_to_floor") or math.nan,
        "vs_references": span(v for f in fwd.values() for v in f["speedup_vs_references"].values()),
        "vs_materialize": span(f["speedup_vs_materialize"] for f in fwd.values()),
        "memory_table": span(m["table"]["ratio_to_floor"] for m in mem.values() if "table" in m),
        "memory_flex": span(m["flex"]["ratio_to_floor"] for m in mem.values() if "flex" in m),
        "memory_fused": span(m["fused"]["ratio_to_floor"] for m in mem.values() if "fused" in m),
        "backward_vs_xt": {f: g["speedup_vs_xt"] for f, g in bwd.items() if g.get("speedup_vs_xt")},
        "backward_floor": span(g["ratio_to_floor"] for g in bwd.values()),
        "forward_met": [f for f, g in fwd.items() if g["met"]],
        "forward_missed": [f for f, g in fwd.items() if not g["met"]],
    }
    return out


def _length_axis(ax, lengths) -> None:
    from matplotlib.ticker import FuncFormatter, NullLocator

    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted(lengths))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.xaxis.set_major_formatter(
        FuncFormatter(lambda n, _: f"{n / 1024:g}k" if n >= 1024 else f"{n:g}")
    )
    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda y, _: ""))
    ax.set_xlabel("sequence length n")


def _figure_legend(fig) -> None:
    seen = {}
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    per_row = max(2, int(fig.get_figwidth() / 1.7))
    fig.legend(
        list(seen.values()),
        list(seen),
        loc="outside lower center",
        ncols=min(len(seen), per_row),
        fontsize=8,
        frameon=False,
    )


def plot_forward(report, families, *, methods=None, pass_="forward"):
    """Time per length, as a ratio to the floor, one panel per family (log scales)."""
    from relbias.book.notebook import figure

    rows = _index(report, pass_)
    methods = methods or [m for m in report["config"]["methods"] if m != "sdpa"]
    fig, axes = figure(2.7 * len(families) + 0.5, 3.4, ncols=len(families), sharey=True)
    axes = list(getattr(axes, "flat", [axes]))
    for ax, family in zip(axes, families):
        lengths = set()
        for method in methods:
            pts = sorted(
                (n, r["ratio_to_floor"])
                for (f, n, m), r in rows.items()
                if f == family and m == method and r.get("ratio_to_floor")
            )
            if not pts:
                continue
            lengths.update(n for n, _ in pts)
            label, color, style = METHOD_STYLE[method]
            ax.plot(*zip(*pts), marker="o", ms=3, color=color, ls=style, label=label)
        ax.axhline(1.0, color="black", lw=0.8, label=METHOD_STYLE["sdpa"][0])
        _length_axis(ax, lengths)
        ax.set_title(family, fontsize=9)
    axes[0].set_ylabel("time / no-bias attention")
    _figure_legend(fig)
    return fig


def plot_memory(report, family, *, methods=None):
    """Peak memory of one family's forward pass against n, with the floor (log scales)."""
    from relbias.book.notebook import figure

    rows = _index(report, "memory")
    methods = methods or list(report["config"]["methods"])
    fig, ax = figure(5.0, 3.6)
    lengths = set()
    for method in methods:
        key_family = None if method == "sdpa" else family
        pts = sorted(
            (n, r["peak_bytes"] / 2**20)
            for (f, n, m), r in rows.items()
            if f == key_family and m == method and r.get("peak_bytes")
        )
        if pts:
            lengths.update(n for n, _ in pts)
            label, color, style = METHOD_STYLE[method]
            ax.plot(*zip(*pts), marker="o", ms=3, color=color, ls=style, label=label)
    _length_axis(ax, lengths)
    ax.set_ylabel("peak memory, MiB (inputs included)")
    ax.set_title(f"{family}: forward pass", fontsize=9)
    _figure_legend(fig)
    return fig


def goal_rows(report) -> list[list]:
    """The issue's goals as table rows: goal, family, measured, target, met."""
    rows = []
    for name, per_family in report.get("goals", {}).items():
        for family, g in per_family.items():
            if name.startswith("forward_n"):
                rows.append(
                    [
                        name,
                        family,
                        f"{g['backend']} {g['ratio_to_floor']:.2f}x floor",
                        f"<= {g['limit']}x",
                        g["met"],
                    ]
                )
                for ref, speedup in g["speedup_vs_references"].items():
                    rows.append(
                        [name, family, f"{speedup:.1f}x faster than {ref}", ">= 5x", speedup >= 5]
                    )
            elif name.startswith("memory"):
                for method, m in g.items():
                    rows.append(
                        [
                            name,
                            family,
                            f"{method} {m['ratio_to_floor']:.2f}x floor",
                            "<= 1.5x",
                            m["met"],
                        ]
                    )
            elif g.get("speedup_vs_xt") is not None:
                rows.append(
                    [
                        name,
                        family,
                        f"{g['speedup_vs_xt']:.2f}x x-transformers' speed",
                        ">= 1x",
                        g["met"],
                    ]
                )
    return rows


# ---------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------
def _csv(kind):
    def parse(text):
        return [kind(x) for x in text.split(",") if x]

    return parse


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m relbias.bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="small run: n = 256, 512, 3 repeats (about a minute)"
    )
    p.add_argument(
        "--lengths",
        type=_csv(int),
        default=None,
        help="comma-separated lengths (default 512,...,16384)",
    )
    p.add_argument(
        "--families",
        type=_csv(str),
        default=None,
        help=f"comma-separated families (default all: {','.join(BIAS_NAMES)})",
    )
    p.add_argument(
        "--methods",
        type=_csv(str),
        default=None,
        help=f"comma-separated methods (default all: {','.join(ALL_METHODS)})",
    )
    p.add_argument("--repeats", type=int, default=None, help="timed repeats per method")
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
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
        "--no-flush-denormal",
        dest="flush_denormal",
        action="store_false",
        help="keep denormal floats (slow on x86: strong biases underflow exp)",
    )
    p.add_argument(
        "--out",
        default=None,
        help="JSON file to write (default benchmarks/results/cpu.json, or "
        "cpu-quick.json with --quick; '-' for none)",
    )
    p.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    if args.lengths is None:
        args.lengths = list(QUICK_LENGTHS if args.quick else FULL_LENGTHS)
    if args.quick and args.repeats is None:
        args.repeats = 3
    if args.quick:
        args.backward_max = min(args.backward_max, max(args.lengths))
    args.families = args.families or list(BIAS_NAMES)
    args.methods = args.methods or list(ALL_METHODS)
    for name in args.families:
        if name not in BIAS_NAMES:
            p.error(f"unknown family {name!r}; choose from {','.join(BIAS_NAMES)}")
    for name in args.methods:
        if name not in ALL_METHODS:
            p.error(f"unknown method {name!r}; choose from {','.join(ALL_METHODS)}")
    if args.out is None:
        args.out = "benchmarks/results/" + ("cpu-quick.json" if args.quick else "cpu.json")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.memory_worker is not None:
        rows = _memory_worker(json.loads(args.memory_worker))
        print("MEMORY-RESULT " + json.dumps(rows), flush=True)
        return 0

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    report = run(args, log=log)
    print(format_tables(report))
    if args.out != "-":
        path = Path(args.out)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
