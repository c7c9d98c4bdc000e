"""What one benchmark run measures: :class:`BenchConfig`, checked when it is built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from relbias import BIAS_NAMES, DATA_DEPENDENT_NAMES
from relbias.bench.methods import ALL_METHODS

#: Every family the benchmark can time: the position families and the forget gate.
FAMILIES = (*BIAS_NAMES, *DATA_DEPENDENT_NAMES)

FULL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_LENGTHS = (256, 512)
DTYPES = ("float32", "bfloat16")


class ConfigError(ValueError):
    """A setting of :class:`BenchConfig` out of range; ``field`` names it."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field, self.problem = field, problem

    @property
    def option(self) -> str:
        """The command line's option for the field (``head_dim`` -> ``--head-dim``)."""
        return "--" + self.field.replace("_", "-")


@dataclass(frozen=True)
class BenchConfig:
    """The settings of one run of :func:`relbias.bench.run` (and of the command line).

    ``repeats=None`` times 5 repeats for n <= 2048, 3 for n <= 8192, 2 above. ``out`` is
    where the command line writes the report (``"-"``: nowhere); ``argv`` the command
    line's arguments, recorded in the report.

    Everything runs under PyTorch's default settings (denormal floats kept), as a user's
    process does; ``flush_denormal=True`` switches denormals off for the whole run
    instead. ``flush_denormal_rows`` adds the forward at the goal length (n = 4,096, or
    the largest below) timed again with denormals flushed, as separate rows (pass
    ``forward_flush_denormal``). ``training_memory`` measures the peak memory of a
    training step (forward and backward) at the largest length, ``bf16_accuracy`` the
    fused kernel's bfloat16 error against float32.
    """

    lengths: list[int] = field(default_factory=lambda: list(FULL_LENGTHS))
    families: list[str] = field(default_factory=lambda: list(FAMILIES))
    methods: list[str] = field(default_factory=lambda: list(ALL_METHODS))
    repeats: int | None = None
    heads: int = 8
    head_dim: int = 64
    dtype: str = "float32"
    threads: int = field(default_factory=torch.get_num_threads)
    seed: int = 0
    backward: bool = True
    backward_max: int = 2048
    memory: bool = True
    max_dense_gib: float = 4.0
    memory_timeout: float = 3600.0
    flush_denormal: bool = False
    flush_denormal_rows: bool = True
    training_memory: bool = True
    bf16_accuracy: bool = True
    out: str = "-"
    argv: list[str] = field(default_factory=list)

    def __post_init__(self):
        for name in ("lengths", "families", "methods", "argv"):
            value = getattr(self, name)
            if isinstance(value, str) or not hasattr(value, "__iter__"):
                raise ConfigError(name, f"must be a list, got {value!r}")
            object.__setattr__(self, name, list(value))
        for name in ("lengths", "families", "methods"):
            values = getattr(self, name)
            if not values:
                raise ConfigError(name, "must not be empty")
            repeated = sorted({v for v in values if values.count(v) > 1}, key=str)
            if repeated:
                raise ConfigError(name, f"repeats {', '.join(map(str, repeated))}")
        for n in self.lengths:
            _check_int("lengths", n, 1)
        _check_names("families", self.families, FAMILIES)
        _check_names("methods", self.methods, ALL_METHODS)
        if self.repeats is not None:
            _check_int("repeats", self.repeats, 1)
        for name in ("heads", "head_dim", "threads"):
            _check_int(name, getattr(self, name), 1)
        _check_int("seed", self.seed, None)
        _check_int("backward_max", self.backward_max, 0)
        if self.dtype not in DTYPES:
            raise ConfigError("dtype", f"must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        _check_number("max_dense_gib", self.max_dense_gib, allow_zero=True)
        _check_number("memory_timeout", self.memory_timeout, allow_zero=False)
        for name in (
            "backward",
            "memory",
            "flush_denormal",
            "flush_denormal_rows",
            "training_memory",
            "bf16_accuracy",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(name, f"must be True or False, got {getattr(self, name)!r}")
        if not isinstance(self.out, str) or not self.out:
            raise ConfigError("out", f"must be a file name or '-', got {self.out!r}")


def _check_int(name: str, value, least: int | None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(name, f"must be an integer, got {value!r}")
    if least is not None and value < least:
        raise ConfigError(name, f"must be >= {least}, got {value}")


def _check_number(name: str, value, *, allow_zero: bool) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ConfigError(name, f"must be a number {bound}, got {value!r}")


def _check_names(name: str, values, known) -> None:
    unknown = [v for v in values if v not in known]
    if unknown:
        raise ConfigError(
            name, f"unknown {', '.join(map(repr, unknown))}; choose from {','.join(known)}"
        )
