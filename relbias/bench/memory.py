"""Peak memory: each length measured in a fresh subprocess (``--memory-worker``)."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys

import torch

from relbias.bench.config import BenchConfig
from relbias.bench.methods import bias_module, inputs, runner
from relbias.bench.timing import torch_settings

MEMORY_METHOD = (
    "Peak resident memory, measured in a fresh subprocess per length with glibc's mmap "
    "threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_=65536), so that every tensor's memory "
    "is returned to the system when freed and resident memory tracks live tensors. After a "
    "warm-up call (compilation), the kernel's peak-RSS counter is reset (writing 5 to "
    "/proc/self/clear_refs) and VmHWM is read after one call: peak_extra_bytes = VmHWM - RSS "
    "before the call (the output, the bias, all temporaries, kernel workspace). peak_bytes = "
    "peak_extra_bytes + the bytes of q, k, v (the memory of the attention call, inputs "
    "included); memory ratios are of peak_bytes. persistent_bytes = RSS growth during the "
    "warm-up call (caches such as x-transformers' stored ALiBi bias, compiled code). A "
    "training step (pass training_memory) is one forward and backward of "
    "out.float().square().mean() with q, k, v requiring gradients: its peak includes their "
    "gradients and what the forward keeps for the backward."
)
#: The worker prints its rows on one line that starts with this.
RESULT_PREFIX = "MEMORY-RESULT "


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


def _call(fn, q, k, v, backward: bool):
    """One call of ``fn`` (and its backward, the gradients then dropped)."""
    if not backward:
        with torch.no_grad():
            return fn(q, k, v)
    out = fn(q, k, v)
    out.float().square().mean().backward()
    for t in (q, k, v):
        t.grad = None
    return out.detach()


def _peak(fn, q, k, v, backward: bool = False) -> dict:
    """The memory of one call of ``fn`` after a warm-up call (see :data:`MEMORY_METHOD`)."""
    gc.collect()
    before = _proc_status("VmRSS")
    _call(fn, q, k, v, backward)
    gc.collect()
    if not _reset_peak():
        raise RuntimeError("cannot reset the peak RSS (/proc/self/clear_refs)")
    ready = _proc_status("VmRSS")
    out = _call(fn, q, k, v, backward)
    peak = _proc_status("VmHWM")
    del out
    input_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
    return {
        "peak_extra_bytes": peak - ready,
        "peak_bytes": peak - ready + input_bytes,
        "input_bytes": input_bytes,
        "persistent_bytes": ready - before,
    }


def memory_worker(spec: dict) -> list[dict]:
    """Run in a fresh process: peak memory of each (family, method) at one n."""
    n, heads = spec["n"], spec["heads"]
    rows = []
    with torch_settings(spec["threads"], spec["flush_denormal"]):
        backward = spec.get("backward", False)
        dtype = getattr(torch, spec["dtype"])
        q, k, v = inputs(n, heads, spec["head_dim"], dtype, spec["seed"], grad=backward)
        for family, method in spec["jobs"]:
            row = {"family": family, "method": method, "n": n}
            try:
                module = bias_module(family, heads, spec["seed"]) if family else None
                row.update(_peak(runner(method, family, module, heads), q, k, v, backward))
            except Exception as err:
                row["error"] = f"{type(err).__name__}: {err}"[:300]
            rows.append(row)
            gc.collect()
    return rows


def worker_main(spec_json: str) -> int:
    """The subprocess's entry point: measure, and print the rows on one line."""
    rows = memory_worker(json.loads(spec_json))
    print(RESULT_PREFIX + json.dumps(rows), flush=True)
    return 0


def measure_memory(n: int, jobs, config: BenchConfig, log, backward: bool = False) -> list[dict]:
    """Peak memory of ``jobs`` (``[family, method]`` pairs) at length n, in a subprocess:
    of the forward, or with ``backward`` of a training step."""
    spec = {
        "n": n,
        "heads": config.heads,
        "head_dim": config.head_dim,
        "dtype": config.dtype,
        "seed": config.seed,
        "threads": config.threads,
        "flush_denormal": config.flush_denormal,
        "jobs": jobs,
        "backward": backward,
    }
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    cmd = [sys.executable, "-m", "relbias.bench", "--memory-worker", json.dumps(spec)]
    what = "training-step memory" if backward else "memory"
    log(f"  {what} n={n}: {len(jobs)} measurements in a subprocess")
    proc = subprocess.run(
        cmd, capture_output=True, text=True, env=env, timeout=config.memory_timeout
    )
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX) :])
    tail = (proc.stderr or "")[-500:]
    return [{"family": f, "method": m, "n": n, "error": f"worker failed: {tail}"} for f, m in jobs]
