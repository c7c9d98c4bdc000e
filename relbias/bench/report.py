"""The report: :func:`run` measures and builds it (results, machine, versions, goals);
:func:`format_tables` prints it; :func:`load_report` and :func:`provenance` read stored ones."""

from __future__ import annotations

import os
import platform
import statistics
import time
from datetime import datetime, timezone
from pathlib import Path

import torch

from relbias._json import read_json
from relbias.attention import flex
from relbias.attention.fused import available as fused_available
from relbias.bench.accuracy import bfloat16_accuracy
from relbias.bench.config import BenchConfig
from relbias.bench.goals import evaluate_goals, index
from relbias.bench.memory import MEMORY_METHOD, measure_memory
from relbias.bench.methods import FAMILY_NOTES, METHOD_NOTES, applicable
from relbias.bench.timing import TIMING_METHOD, time_family, torch_settings

#: The stored reports, shipped with the package (the appendix reads them from an install too).
RESULTS_DIR = Path(__file__).with_name("results")


def run(config: BenchConfig, log=print) -> dict:
    """Run the benchmark; the caller's thread count and denormal mode are restored after."""
    if not isinstance(config, BenchConfig):
        raise TypeError(f"config must be a BenchConfig, got {type(config).__name__}")
    with torch_settings(config.threads, config.flush_denormal):
        return _run(config, log)


def _timed_rows(n, backward, methods, config, log, pass_=None) -> list[dict]:
    """The timing rows of every family at length n: the pooled floor, then each method."""
    samples: list[float] = []
    per_family = {
        family: time_family(n, family, methods, config, backward, samples, log)
        for family in config.families
    }
    floor_median = statistics.median(samples) if samples else None
    pass_ = pass_ or ("forward_backward" if backward else "forward")
    rows = []
    if floor_median:
        rows.append(
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
            rows.append(row)
    return rows


def _memory_rows(n, methods, config, log, backward=False) -> list[dict]:
    jobs = [[None, "sdpa"]] + [
        [family, method]
        for family in config.families
        for method in methods
        if not applicable(method, family, n, config.heads, config.max_dense_gib, backward)
    ]
    mem = measure_memory(n, jobs, config, log, backward=backward)
    floor = next((r for r in mem if r["method"] == "sdpa" and "peak_bytes" in r), None)
    for r in mem:
        r["pass"] = "training_memory" if backward else "memory"
        if floor and "peak_bytes" in r:
            r["ratio_to_floor"] = r["peak_bytes"] / floor["peak_bytes"]
            r["extra_ratio_to_floor"] = r["peak_extra_bytes"] / max(1, floor["peak_extra_bytes"])
    return mem


def goal_length(lengths) -> int:
    """The length of the forward goal: 4,096, else the largest below it, else the least."""
    below = [n for n in lengths if n <= 4096]
    return max(below) if below else min(lengths)


def _run(config: BenchConfig, log) -> dict:
    started = time.time()
    load_at_start = _load_average()
    methods = [m for m in config.methods if m != "sdpa"]
    results = []
    for n in config.lengths:
        results.extend(_timed_rows(n, False, methods, config, log))
        if config.backward and n <= config.backward_max:
            results.extend(_timed_rows(n, True, methods, config, log))
        if config.memory:
            results.extend(_memory_rows(n, methods, config, log))
    if config.flush_denormal_rows and not config.flush_denormal:
        # a process-wide switch a user would not set: separate rows, never the headline
        flushed = [m for m in methods if m in ("fused", "table")]
        if flushed:
            log("  forward again with denormals flushed (torch.set_flush_denormal(True))")
            with torch_settings(config.threads, True):
                n = goal_length(config.lengths)
                results.extend(
                    _timed_rows(n, False, flushed, config, log, pass_="forward_flush_denormal")
                )
    trainable = [m for m in methods if m in ("fused", "materialize")]
    if config.memory and config.training_memory and trainable:
        results.extend(_memory_rows(max(config.lengths), trainable, config, log, backward=True))
    accuracy = None
    if config.bf16_accuracy and "fused" in methods and fused_available():
        log("  the fused kernel's bfloat16 accuracy")
        accuracy = bfloat16_accuracy(
            config.families,
            min(1024, max(config.lengths)),
            config.heads,
            config.head_dim,
            config.seed,
        )
    report = {
        "schema": 1,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m relbias.bench " + " ".join(config.argv),
        "commit": _git_commit(),
        "machine": {
            **_machine(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": _load_average(),
        },
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "flush_denormal": config.flush_denormal,
        "config": {
            "device": "cpu",
            "dtype": config.dtype,
            "batch": 1,
            "heads": config.heads,
            "head_dim": config.head_dim,
            "lengths": list(config.lengths),
            "families": list(config.families),
            "methods": ["sdpa", *methods],
            "backward_max": config.backward_max,
            "repeats": config.repeats or "5 (n <= 2048), 3 (n <= 8192), 2 (larger)",
            "seed": config.seed,
            "causal": True,
            "max_dense_gib": config.max_dense_gib,
            "bias_parameters": "offset (max_offset=1024) and t5 tables ~ N(0, 1); "
            "kerple, fire: default initialisation (seeded)",
            "family_notes": {f: FAMILY_NOTES[f] for f in config.families if f in FAMILY_NOTES},
        },
        "methods": {m: METHOD_NOTES[m] for m in ["sdpa", *methods]},
        "timing_method": TIMING_METHOD,
        "memory_method": MEMORY_METHOD,
        "versions": _versions(),
        "flex_compile_stats": {k: v for k, v in flex.compile_stats().items() if k != "per_key"},
        "elapsed_seconds": time.time() - started,
        "bfloat16_accuracy": accuracy,
        "results": results,
    }
    report["goals"] = evaluate_goals(report)
    return report


def _git_commit() -> str | None:
    """The repository's HEAD commit (``+dirty`` when the tree has changes), or None."""
    import subprocess

    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True
        )
    except OSError:
        return None
    if head.returncode != 0:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def _load_average() -> list | None:
    """The 1, 5 and 15 minute load averages now (None where the OS has none). Files written
    before 2026-12-06 hold, under ``load_average_at_start``, the averages at their *end*."""
    try:
        return list(os.getloadavg())
    except (OSError, AttributeError):
        return None


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
    except (OSError, ValueError, AttributeError):
        pass
    return info


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
        except Exception:
            pass
    return out


# ---------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------
def _fmt_ratio(row) -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "error"
    if "skipped" in row:
        return "skip"
    ratio = row.get("ratio_to_floor")
    return "-" if ratio is None else f"{ratio:.2f}x"


def _floor_text(row, pass_) -> str:
    if pass_.endswith("memory"):
        f = row.get("peak_bytes")
        return f"{f / 2**20:.0f}" if f else "-"
    f = row.get("seconds_median")
    return f"{f:.4f}" if f else "-"


def format_tables(report) -> str:
    """The report as text: a table of ratios to the floor per pass, then the goals."""
    lines = []
    methods = report["config"]["methods"]
    for pass_, title in (
        ("forward", "Forward time"),
        ("forward_flush_denormal", "Forward time, denormals flushed (not PyTorch's default)"),
        ("forward_backward", "Forward + backward time"),
        ("memory", "Peak memory (inputs included)"),
        ("training_memory", "Peak memory of a training step (forward + backward)"),
    ):
        rows = index(report, pass_)
        if not rows:
            continue
        lengths = sorted({k[1] for k in rows})
        cols = [m for m in methods if m != "sdpa"]
        memory = pass_.endswith("memory")
        floor_name = "floor MiB" if memory else "floor s"
        lines.append(f"\n{title}: ratio to no-bias causal SDPA (the floor)")
        header = f"{'family':13s}{'n':>7s}{floor_name:>11s}" + "".join(f"{m:>13s}" for m in cols)
        lines.append(header)
        lines.append("-" * len(header))
        for family in report["config"]["families"]:
            for n in lengths:
                floor_txt = _floor_text(rows.get((None, n, "sdpa"), {}), pass_)
                cells = "".join(f"{_fmt_ratio(rows.get((family, n, m))):>13s}" for m in cols)
                lines.append(f"{family:13s}{n:>7d}{floor_txt:>11s}{cells}")
    skips = [r for r in report["results"] if r["pass"] == "forward" and "blocks_skipped" in r]
    if skips:
        lines.append("\nFused kernel, forward: key blocks skipped (weights all below 2^-64)")
        for r in skips:
            total = r["blocks_skipped"] + r["blocks_computed"]
            lines.append(f"  {r['family']:13s} n={r['n']:<6d} {r['blocks_skipped']} of {total}")
    accuracy = report.get("bfloat16_accuracy")
    if accuracy:
        lines.append(f"\nbfloat16 fused kernel, n = {accuracy['n']}: largest error / largest value")
        for family, a in accuracy["families"].items():
            cells = ", ".join(f"{k} {v:.1e}" for k, v in a["vs_float32"].items())
            lines.append(f"  {family:13s} vs float32: {cells}")
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
# Stored reports
# ---------------------------------------------------------------------------------
def load_report(path=None, *, name: str = "cpu") -> dict:
    """A stored benchmark JSON: ``path``, or ``relbias/bench/results/<name>.json``.

    ``name="cpu"`` (default) is the full CPU run; ``"cpu_n4096_quiet"`` a second run of
    the n = 4,096 forward timings only. The stored files ship with the package.
    """
    if path is not None:
        return read_json(Path(path), RESULTS_DIR, what="benchmark")
    if not isinstance(name, str) or "/" in name or "\\" in name:  # a name, never a path
        raise ValueError(f"name must be a file name without folders, got {name!r}")
    return read_json(name, RESULTS_DIR, what="benchmark")


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
        f"command: {report['command']}; commit {str(report.get('commit'))[:12]}"
    )
