"""Checkpoints for long runs: atomic writes, RNG states, and a sweep's progress.

A training checkpoint (:func:`save_checkpoint`) holds everything that decides the rest of a
run: the model's and the optimiser's state, the gradient scaler's, the step, the history
so far, the batch generator's state and the global RNG states (Python, NumPy, torch). The
learning rate is a function of the step (:func:`relbias.lab.training.lr_at`), so the step
is the scheduler's whole state. Resuming from it gives the same result as a run that was
never stopped (``tests/lab/test_checkpoint.py`` compares them exactly on the CPU).

A sweep (:class:`SweepProgress`) keeps, in one folder, ``progress.json`` (what the sweep
is, and the record of every finished run) and ``current.pt`` (the run in progress).
Every file is written to a temporary file beside it and renamed over it
(:func:`atomic_torch_save`, :func:`relbias._json.write_json`), so a killed run never
leaves a truncated file.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import torch

from relbias._json import write_json


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during training: what was saved (``checkpoint``, ``step``) travels with it."""

    def __init__(self, message: str, *, checkpoint=None, step: int | None = None):
        super().__init__(message)
        self.checkpoint = checkpoint
        self.step = step


def atomic_torch_save(obj, path) -> Path:
    """``torch.save`` into a temporary file beside ``path``, then rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def rng_states() -> dict:
    """The global RNG states: Python's, NumPy's, torch's CPU (and CUDA when present)."""
    states = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict) -> None:
    """Restore what :func:`rng_states` returned."""
    random.setstate(states["python"])
    np.random.set_state(states["numpy"])
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(path, state: dict) -> Path:
    """Write a training state (a dict of tensors, numbers and lists) atomically."""
    return atomic_torch_save({"format": 1, **state}, path)


def load_checkpoint(path) -> dict:
    """Read a training state written by :func:`save_checkpoint`."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint at {path}")
    state = torch.load(path, map_location="cpu", weights_only=False)
    if not isinstance(state, dict) or state.get("format") != 1:
        raise ValueError(f"{path} is not a relbias training checkpoint")
    return state


class SweepProgress:
    """The progress of a sweep (runs keyed by name and seed) in a checkpoint folder.

    ``identity`` describes the sweep (kind, config, jobs, seeds); ``resume=True`` loads
    the finished runs of an earlier sweep with the same identity and refuses one with a
    different identity; ``resume=False`` starts a new sweep and refuses to overwrite a
    saved one (so that a forgotten ``--resume`` never discards an hour of runs).
    """

    def __init__(self, folder, identity: dict, *, resume: bool = False):
        self.folder = Path(folder)
        self.identity = identity
        self.records: dict = {}
        self.folder.mkdir(parents=True, exist_ok=True)
        # Git ignores the folder (so that a sweep's checkpoints inside the repository do not
        # make the commit recorded in its provenance "+dirty").
        ignore = self.folder / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")
        path = self.folder / "progress.json"
        if resume:
            if not path.is_file():
                raise FileNotFoundError(
                    f"--resume: no sweep to resume in {self.folder} (no progress.json); "
                    "run the same command without --resume to start one"
                )
            import json

            saved = json.loads(path.read_text())
            if saved.get("identity") != _plain(identity):
                raise ValueError(
                    f"--resume: the sweep saved in {self.folder} was started with other "
                    "settings (config, methods or seeds differ); use the same command line, "
                    "or another --checkpoint-dir"
                )
            self.records = saved.get("records", {})
        else:
            if path.is_file() or self.current_path.is_file():
                raise FileExistsError(
                    f"a sweep is already saved in {self.folder}: add --resume (resume=True) "
                    "to continue it, or delete that folder (or choose another "
                    "--checkpoint-dir) to start again"
                )
            self._write()

    @property
    def current_path(self) -> Path:
        """Where the run in progress keeps its training checkpoint."""
        return self.folder / "current.pt"

    @staticmethod
    def key(name: str, seed: int) -> str:
        return f"{name}/seed{seed}"

    def done(self, name: str, seed: int) -> bool:
        return self.key(name, seed) in self.records

    def get(self, name: str, seed: int) -> dict:
        return self.records[self.key(name, seed)]

    def finish(self, name: str, seed: int, record: dict) -> None:
        """Store a finished run's record and drop the run's training checkpoint."""
        self.records[self.key(name, seed)] = record
        self._write()
        self.current_path.unlink(missing_ok=True)

    def current_matches(self, name: str, seed: int) -> bool:
        """True when ``current.pt`` belongs to run ``name``/``seed``."""
        if not self.current_path.is_file():
            return False
        return load_checkpoint(self.current_path).get("run") == self.key(name, seed)

    def remove(self) -> None:
        """Delete this sweep's files (once its results are written): :func:`remove_sweep`."""
        remove_sweep(self.folder)

    def _write(self) -> None:
        write_json(
            {"identity": _plain(self.identity), "records": self.records},
            self.folder / "progress.json",
        )


def remove_sweep(folder) -> None:
    """Delete the files a sweep keeps in ``folder``, and the folder when nothing else is in it."""
    folder = Path(folder)
    for name in ("progress.json", "current.pt", ".gitignore"):
        (folder / name).unlink(missing_ok=True)
    try:
        folder.rmdir()
    except OSError:
        pass


def _plain(value):
    """JSON's view of ``value`` (tuples become lists), to compare identities."""
    import json

    return json.loads(json.dumps(value))
