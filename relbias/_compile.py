"""Compile accounting shared by the compiled kernels (FlexAttention, FIRE's block kernel)."""

from __future__ import annotations

import contextlib
import time

import torch

from relbias._cache import LRUCache

#: At most this many kernels' compile times are kept (the latest): as many as dynamo
#: compiles of one function (:data:`_RECOMPILE_LIMITS`), so that a process meeting ever new
#: shapes keeps a bounded record. A kernel dropped from it is timed again on its next call.
TIMED_KERNELS = 1024

_STATS = {"compiles": 0, "compile_seconds": 0.0, "calls": 0}
_COMPILE_TIMES = LRUCache(TIMED_KERNELS)

#: dynamo's limits on recompilations, raised while a kernel compiles once per shape (the
#: names of recent torch first, then those of older releases; any a torch lacks is skipped).
_RECOMPILE_LIMITS = (
    ("recompile_limit", 1024),
    ("accumulated_recompile_limit", 4096),
    ("cache_size_limit", 1024),
    ("accumulated_cache_size_limit", 4096),
)


def compile_stats() -> dict:
    """Compilations of the compiled kernels so far, and their cost.

    ``compiles``: distinct kernels compiled (FlexAttention: one per shape, dtype, family
    kind and mask); ``compile_seconds``: the wall time of their first calls (compilation
    plus one run); ``calls``: FlexAttention calls in all; ``per_key``: seconds per kernel
    (the latest :data:`TIMED_KERNELS`).
    """
    return {**_STATS, "per_key": dict(_COMPILE_TIMES)}


def _recompile_limits():
    """``torch._dynamo.config.patch`` of the limits this torch has (none: no patch)."""
    try:
        config = torch._dynamo.config
    except AttributeError:  # a torch without dynamo
        return contextlib.nullcontext()
    limits = {}
    for name, value in _RECOMPILE_LIMITS:
        if hasattr(config, name) and not (
            name.startswith(("cache_size", "accumulated_cache")) and limits
        ):
            limits[name] = value
    return config.patch(**limits) if limits else contextlib.nullcontext()


def timed(fn, key):
    """``fn``, recording its first call per ``key`` as a compilation."""

    def call(*args, **kwargs):
        with _recompile_limits():
            if key in _COMPILE_TIMES:
                _COMPILE_TIMES.move_to_end(key)
                return fn(*args, **kwargs)
            start = time.perf_counter()
            out = fn(*args, **kwargs)
        seconds = time.perf_counter() - start
        _COMPILE_TIMES[key] = seconds
        _STATS["compiles"] += 1
        _STATS["compile_seconds"] += seconds
        return out

    return call
