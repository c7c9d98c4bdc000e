"""The runtime of a chapter: device, configuration and seeds, printed in stable words.

:func:`runtime_banner` picks the device and the configuration (:func:`choose_config`:
``quick`` on a CPU and in CI, the stored sweeps' ``medium`` on a GPU), seeds everything,
selects PNG figures and prints which and why, in words that are the same on every CPU run.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from IPython import get_ipython

from relbias import __version__
from relbias.lab.config import Config, get_config
from relbias.lab.device import pick_device, seed_everything

__all__ = ["CPU_REASON", "GPU_CONFIG", "Runtime", "choose_config", "in_colab", "runtime_banner"]


@dataclass(frozen=True)
class Runtime:
    """What :func:`runtime_banner` chose: the torch device and the training configuration."""

    device: torch.device
    config: Config

    @property
    def quick(self) -> bool:
        return self.config.name == "quick"


def in_colab() -> bool:
    """True inside Google Colab."""
    return "google.colab" in sys.modules


def _use_png_figures() -> None:
    """Inline figures as PNG (SVG output carries random ids that differ on every run)."""
    shell = get_ipython()
    if shell is not None and hasattr(shell, "run_line_magic"):
        try:
            shell.run_line_magic("config", "InlineBackend.figure_formats = ['png']")
        except Exception:  # a shell without the inline backend
            pass


#: Why a CPU runs ``quick``: the same words with and without ``CI``, so that a reader's CPU
#: run prints what the stored outputs (a CI-like run) print.
CPU_REASON = "on a CPU: the small configuration (a GPU trains the stored sweeps' one)"

#: The configuration a chapter's live demo runs on a GPU: the stored sweeps' own, so that the
#: live result can stand beside the stored interval of the same method.
GPU_CONFIG = "medium"


def choose_config(device: torch.device, config: str | None = None) -> tuple[str, str]:
    """The configuration a chapter runs on ``device``, and why, in words.

    ``config`` if given; else ``quick`` whenever ``CI`` is set (the book's stored outputs
    come from a quick CPU run, which CI reproduces; the reason printed is the CPU's); else
    the environment variable ``RELBIAS_CONFIG`` if set; else :data:`GPU_CONFIG` on a CUDA
    GPU and ``quick`` elsewhere.
    """
    if config is not None:
        return config, "asked for"
    if os.environ.get("CI"):  # CI runs on the CPU and must print what a reader's CPU prints
        return "quick", CPU_REASON
    if os.environ.get("RELBIAS_CONFIG"):
        return os.environ["RELBIAS_CONFIG"], "RELBIAS_CONFIG"
    if device.type == "cuda":
        return GPU_CONFIG, "on a GPU: the stored sweeps' configuration"
    return "quick", CPU_REASON


def runtime_banner(config: str | None = None, *, seed: int = 0, verbose: bool = True) -> Runtime:
    """Pick the device and configuration, seed everything, and print which were chosen.

    - device: the CPU whenever ``CI`` is set (the stored outputs of the book come from a
      CPU run, and CI must reproduce them), else :func:`relbias.lab.device.pick_device`'s
      choice (CUDA if available, else the CPU);
    - configuration: :func:`choose_config` (``quick`` on a CPU, the stored sweeps'
      ``medium`` on a GPU, ``RELBIAS_CONFIG`` or ``config`` when given);
    - seeds Python, NumPy and torch with ``seed`` and selects PNG inline figures.

    The printed lines name the device type, the configuration and why it was chosen, so
    that they are identical on every CPU run. Returns a :class:`Runtime`.
    """
    if os.environ.get("CI"):
        device = torch.device("cpu")
    else:
        device = pick_device(verbose=False)
    name, why = choose_config(device, config)
    cfg = get_config(name)
    seed_everything(seed)
    _use_png_figures()
    if verbose:
        where = {"cpu": "CPU", "cuda": "GPU (CUDA)", "mps": "Apple GPU (MPS)"}.get(
            device.type, device.type
        )
        print(
            f"relbias {__version__} | device: {where} | configuration: {cfg.name} "
            f"(train_len={cfg.train_len}, {cfg.steps} steps)"
        )
        print(f"(why this configuration: {why})")
    return Runtime(device=device, config=cfg)
