"""Timing: the interleaved timing loop of one family at one length, the torch settings it
runs under (threads, denormals), and :func:`compare`, a small live comparison."""

from __future__ import annotations

import math
import statistics
import time
from contextlib import contextmanager

import torch

from relbias.attention import fused
from relbias.bench.config import BenchConfig
from relbias.bench.methods import applicable, bias_module, inputs, runner

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


@contextmanager
def torch_settings(threads: int, flush_denormal: bool):
    """Run with ``threads`` torch threads and denormals flushed or not; the caller's thread
    count and PyTorch's default (denormals kept: there is no getter) are restored after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    torch.set_flush_denormal(flush_denormal)
    try:
        yield
    finally:
        torch.set_num_threads(before)
        torch.set_flush_denormal(False)


def default_repeats(n: int) -> int:
    return 5 if n <= 2048 else 3 if n <= 8192 else 2


def _block_counts(q, k, v, module, n) -> dict:
    """The fused kernel's (query block, key block) pairs computed and skipped."""
    counts = fused.block_counts(q, k, v, module.prepare(n))
    return {"blocks_computed": counts["computed"], "blocks_skipped": counts["skipped"]}


def time_call(fn, backward: bool):
    """Run ``fn`` once (and its backward): (wall seconds, CPU seconds, output)."""
    wall, cpu = time.perf_counter(), time.process_time()
    if backward:
        out = fn()
        out.float().square().mean().backward()
    else:
        with torch.no_grad():
            out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def time_family(n, family, methods, config: BenchConfig, backward, floor_samples, log):
    """Time the floor and ``methods`` for ``family`` at length ``n``, interleaved.

    Returns ``{method: entry}``: the samples and their summary, or why it was skipped or
    failed. Appends the floor's samples to ``floor_samples``.
    """
    heads, dim = config.heads, config.head_dim
    dtype = getattr(torch, config.dtype)
    module = bias_module(family, heads, config.seed)
    q, k, v = inputs(n, heads, dim, dtype, config.seed, grad=backward)
    entries, runners, reference_out = {}, {}, None
    for method in ("sdpa", *methods):
        reason = applicable(method, family, n, heads, config.max_dense_gib, backward)
        if reason:
            entries[method] = {"skipped": reason}
            continue
        try:
            run = runner(method, family, module, heads)
        except ImportError as err:  # a reference package is missing
            entries[method] = {"skipped": f"not installed: {err}"}
            continue
        runners[method] = lambda run=run: run(q, k, v)

    def clear_grads():
        for t in (q, k, v, *module.parameters()):
            t.grad = None

    # warm-up (and compilation), with a check that every method agrees
    for method, fn in list(runners.items()):
        try:
            wall, _, out = time_call(fn, backward)
            out = None if method == "sdpa" else out
        except Exception as err:  # record and go on
            entries[method] = {"error": f"{type(err).__name__}: {err}"[:300]}
            del runners[method]
            continue
        entries[method] = {"first_call_seconds": wall, "wall": [], "cpu": []}
        if method == "fused" and not backward:
            entries[method].update(_block_counts(q, k, v, module, n))
        if out is not None:
            out = out.detach().float()
            if reference_out is None:
                reference_out = out
            entries[method]["max_abs_diff"] = float((out - reference_out).abs().max())
        clear_grads()
    for _ in range(config.repeats or default_repeats(n)):
        for method, fn in runners.items():
            wall, cpu, _ = time_call(fn, backward)
            entries[method]["wall"].append(wall)
            entries[method]["cpu"].append(cpu)
            clear_grads()
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
    config = BenchConfig(
        lengths=[n],
        families=list(families),
        methods=list(methods),
        heads=heads,
        head_dim=head_dim,
        seed=seed,
        repeats=repeats,
        max_dense_gib=math.inf,
    )
    samples: list[float] = []
    per_family = {
        f: time_family(n, f, config.methods, config, False, samples, lambda m: None)
        for f in config.families
    }
    floor_seconds = statistics.median(samples)
    rows = []
    for family, entries in per_family.items():
        for method in config.methods:
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
