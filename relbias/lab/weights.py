"""The final weights of a sweep's models, kept so that a later reading or intervention need
not retrain.

:func:`save_weights` writes one trained :class:`~relbias.lab.model.TinyLM` with what rebuilds
it (the method, the configuration, the model's keyword arguments, the seed, the sweep's
file name); :func:`load_weights` rebuilds the model and loads them. The stored sweeps' weights
live in ``relbias/lab/results/weights/<result name>/<method>_seed<k>.pt.xz`` in the repository
(not in the wheel): ``torch.save``'s file, xz-compressed (about 0.38 MB a model; the output
projection tied to the embedding is stored once). Files are read with
``torch.load(weights_only=True)``: tensors and plain Python values only, nothing is executed.
"""

from __future__ import annotations

import io
import lzma
from pathlib import Path

import torch

from relbias.lab.config import Config
from relbias.lab.training import build_model

__all__ = ["load_weights", "save_weights", "weights_path"]


def weights_path(folder, method: str, seed: int) -> Path:
    """Where :func:`save_weights` puts ``method``'s model of ``seed`` in ``folder``."""
    return Path(folder) / f"{method}_seed{seed}.pt.xz"


def save_weights(
    model: torch.nn.Module,
    folder,
    *,
    method: str,
    config: Config,
    model_kwargs: dict | None = None,
    result: str | None = None,
) -> Path:
    """Write ``model``'s parameters and buffers (float32, CPU) to
    :func:`weights_path` ``(folder, method, config.seed)`` (atomically); returns the path."""
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}  # tied: one storage
    payload = {
        "method": method,
        "config": config.to_dict(),
        "model_kwargs": dict(model_kwargs or {}),
        "result": result,
        "state_dict": state,
    }
    raw = io.BytesIO()
    torch.save(payload, raw)
    path = weights_path(folder, method, config.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(lzma.compress(raw.getvalue(), preset=9))
    tmp.replace(path)
    return path


def load_weights(path, device="cpu"):
    """The :class:`~relbias.lab.model.TinyLM` stored at ``path``, on ``device``, in evaluation
    mode; its ``config`` (:class:`~relbias.lab.config.Config`) is attached as
    ``model.lab_config`` and the stored method as ``model.lab_method``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no stored weights at {path}")
    data = path.read_bytes()
    if path.suffix == ".xz":
        data = lzma.decompress(data)
    payload = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    missing = {"method", "config", "model_kwargs", "state_dict"} - set(payload)
    if missing:
        raise ValueError(f"{path} is not a weights file of relbias.lab (lacks {sorted(missing)})")
    config = Config(**payload["config"])
    kwargs = dict(payload["model_kwargs"])
    if payload["method"] == "learned":
        kwargs.setdefault("learned_fallback", "clip")  # as the sweeps build it
    model = build_model(payload["method"], config, **kwargs)
    model.load_state_dict(payload["state_dict"])
    model.lab_config = config
    model.lab_method = payload["method"]
    return model.to(device).eval()
