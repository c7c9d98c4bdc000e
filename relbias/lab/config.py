"""The named configurations of the lab: everything that sizes a run (:class:`Config`).

Three named configurations (:func:`get_config`):

``quick``
    the default on every runtime: sized so that training and evaluating one method takes
    about 25 s on a 2-core CPU and the whole 11-method extrapolation sweep stays under 10
    minutes, so a chapter's live demo runs in a few minutes wherever it is opened, and
    its numbers can be compared with the stored sweep.
``medium``
    on request (``--config medium``, ``RELBIAS_CONFIG=medium``): quick's model at twice
    the training length (128) and three times the steps, with the validation loss at the
    training length recorded every 150 steps (``val_every``) and 128 kB of validation text
    drawn across the files at every length (``eval_tokens``, ``eval_spread``); its probe
    is the ``competing`` task (:mod:`relbias.lab.probe`). Sized for the stored multi-seed
    sweeps on a 2-core CPU (``relbias/lab/results/README.md``).
``full``
    on request (``get_config("full")``, ``--config full``, or the environment variable
    ``RELBIAS_CONFIG=full``): a wider, deeper model trained longer on longer sequences,
    meant for a GPU (untested: no stored run).

``quick`` keeps its evaluation small for the live demos: the first ``eval_tokens`` = 16 kB
of the validation split (``eval_spread=False``) and no validation curve (``val_every=0``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

#: The recall probes a configuration can train (:mod:`relbias.lab.probe`).
PROBE_TASKS = ("recall", "competing")

_NOT_POSITIVE_INTS = frozenset(
    {
        "name",
        "lr",
        "weight_decay",
        "grad_clip",
        "seed",
        "probe_distractors",
        "eval_spread",
        "val_every",
        "probe_task",
        "probe_competitors",
    }
)


@dataclass(frozen=True)
class Config:
    """Everything that sizes a run. Field names are recorded in every result file."""

    name: str = "quick"
    dim: int = 64
    depth: int = 2
    heads: int = 4
    train_len: int = 64
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_factors: tuple = (1, 2, 4, 8, 16)
    eval_tokens: int = 16384
    eval_batch_size: int = 8
    corpus_bytes: int = 3_000_000
    seed: int = 0
    probe_steps: int = 600
    probe_batch_size: int = 32
    probe_num_pairs: int = 1
    probe_distractors: int = 0
    probe_eval_factors: tuple = (1, 4)
    probe_eval_samples: int = 100
    eval_spread: bool = False
    val_every: int = 0
    val_tokens: int = 16384
    probe_task: str = "recall"
    probe_competitors: int = 2

    def replace(self, **changes) -> Config:
        """A copy with some fields changed (checked like a new config)."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            if f.name in _NOT_POSITIVE_INTS:
                continue
            items = value if isinstance(value, tuple) else (value,)
            if not items or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items
            ):
                raise ValueError(f"config field {f.name} must hold integers >= 1, got {value!r}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("seed", "val_every", "probe_competitors", "probe_distractors"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.eval_spread, bool):
            raise ValueError(f"eval_spread must be True or False, got {self.eval_spread!r}")
        if self.probe_task not in PROBE_TASKS:
            raise ValueError(f"probe_task must be one of {PROBE_TASKS}, got {self.probe_task!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CONFIGS = {
    "quick": Config(),
    "full": Config(
        name="full",
        dim=256,
        depth=4,
        heads=8,
        train_len=256,
        batch_size=32,
        steps=4000,
        lr=1e-3,
        warmup=200,
        eval_tokens=131072,
        eval_batch_size=8,
        corpus_bytes=4_000_000,
        probe_steps=3000,
        probe_batch_size=64,
        probe_num_pairs=4,
        probe_eval_samples=200,
        eval_spread=True,
        val_every=250,
    ),
    # Between the two, for the stored multi-seed sweeps on a 2-core CPU (see
    # relbias/lab/results/README.md for the time it takes): twice quick's training length,
    # three times its steps at the same bytes per step (6.1 M bytes, about 2.3 epochs), the
    # validation curve at the training length every 150 steps, and 128 kB of validation
    # text at every length, drawn across the validation files. Its curves have not levelled
    # off at 3000 steps; at 15000 (``--steps 15000``, about 71 minutes per seed of all 11
    # methods on two cores) most have: see the results README.
    "medium": Config(
        name="medium",
        train_len=128,
        batch_size=16,
        steps=3000,
        warmup=100,
        eval_tokens=131072,
        eval_spread=True,
        val_every=150,
        val_tokens=16384,
        probe_task="competing",
        probe_competitors=1,
        probe_steps=3000,
        probe_batch_size=16,
        probe_eval_factors=(1, 4, 16),
        probe_eval_samples=100,
    ),
}


def get_config(name: str | None = None, **overrides) -> Config:
    """The named configuration, with optional field overrides.

    With ``name=None``: the environment variable ``RELBIAS_CONFIG`` if it is set (and
    ``CI`` is not: CI always runs ``quick``), else ``quick``, on every device.
    """
    if name is None:
        name = "quick" if os.environ.get("CI") else os.environ.get("RELBIAS_CONFIG") or "quick"
        if name not in CONFIGS:
            raise ValueError(
                f"the environment variable RELBIAS_CONFIG must be one of {sorted(CONFIGS)}, "
                f"got {name!r}"
            )
    if name not in CONFIGS:
        raise ValueError(f"config name must be one of {sorted(CONFIGS)}, got {name!r}")
    return CONFIGS[name].replace(**overrides) if overrides else CONFIGS[name]
