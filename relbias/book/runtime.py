"""The runtime of a chapter: device, configuration and seeds, printed in stable words.

:func:`runtime_banner` picks the device and the quick/full configuration, seeds
everything, selects PNG figures and prints which, in words that are the same on every
CPU run.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import torch
from IPython import get_ipython

from relbias import __version__
from relbias.lab.training import Config, get_config, pick_device, seed_everything

__all__ = ["Runtime", "in_colab", "runtime_banner"]


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


def runtime_banner(config: str | None = None, *, seed: int = 0, verbose: bool = True) -> Runtime:
    """Pick the device and configuration, seed everything, and print which were chosen.

    - configuration: ``config`` if given, else :func:`relbias.lab.training.get_config`'s
      choice: ``quick`` on every device, unless the environment variable
      ``RELBIAS_CONFIG`` names another (and ``CI`` is not set: CI always runs ``quick``);
    - device: the CPU whenever ``CI`` is set (the stored outputs of the book come from a
      CPU run, and CI must reproduce them), else :func:`relbias.lab.training.pick_device`'s
      choice (CUDA if available, else the CPU);
    - seeds Python, NumPy and torch with ``seed`` and selects PNG inline figures.

    The printed line names only the device type and the configuration, so that it is
    identical on every CPU run. Returns a :class:`Runtime`.
    """
    cfg = get_config(config)
    if os.environ.get("CI"):
        device = torch.device("cpu")
    else:
        device = pick_device(verbose=False)
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
        print("(quick on every device; RELBIAS_CONFIG=full for the full configuration)")
    return Runtime(device=device, config=cfg)
