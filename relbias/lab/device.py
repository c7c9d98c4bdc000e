"""Where the lab runs: the device, autocast, seeds and deterministic algorithms.

On CUDA, training and evaluation run under autocast: bfloat16 on GPUs of compute
capability 8.0 and later, float16 with a gradient scaler before that (a T4 is 7.5: its
tensor cores have no bfloat16, and bfloat16 there runs attention's slow math kernel).
The positional biases are computed and added in float32 outside autocast
(:func:`relbias.biased_attention`).

:func:`seed_everything` seeds the random number generators and nothing else. Training
asks for deterministic algorithms only while it runs (:func:`deterministic_algorithms`,
which restores the caller's setting afterwards), so a CPU run repeats bit for bit; GPU
runs do not (some CUDA kernels have no deterministic version: ``warn_only=True``).
"""

from __future__ import annotations

import contextlib
import os
import random

import numpy as np
import torch

__all__ = [
    "attention_memory_bytes",
    "autocast",
    "autocast_dtype",
    "deterministic_algorithms",
    "device_name",
    "largest_that_fits",
    "pick_device",
    "seed_everything",
]


def pick_device(preferred: str | None = None, *, verbose: bool = True) -> torch.device:
    """CUDA if available, else the CPU (or ``preferred``); printed when verbose.

    Apple's MPS is taken only when asked for (``preferred="mps"``): it has no float64 and
    this project has never run on it.
    """
    if preferred is not None:
        device = torch.device(preferred)
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    if verbose:
        print(f"relbias: using device {device_name(device)}")
    return device


def device_name(device: torch.device) -> str:
    """A readable device description (the GPU model on CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's random number generators with ``seed``."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@contextlib.contextmanager
def deterministic_algorithms(enabled: bool = True):
    """While active, torch uses deterministic algorithms (``warn_only=True``: an operation
    without one warns instead of failing); on exit the caller's setting, and the
    ``CUBLAS_WORKSPACE_CONFIG`` environment variable cuBLAS needs for it, are restored.
    ``enabled=False`` changes nothing."""
    if not enabled:
        yield
        return
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    workspace = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        if workspace is None:
            os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        else:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace


AMP_DTYPES = ("auto", None, torch.float16, torch.bfloat16)


def autocast_dtype(device, amp_dtype="auto") -> torch.dtype | None:
    """The autocast dtype used on ``device``. ``amp_dtype="auto"``: bfloat16 on CUDA devices
    of compute capability >= 8.0, float16 below (T4, V100), None (no autocast) elsewhere;
    ``None``, ``torch.float16`` or ``torch.bfloat16`` ask for that on CUDA (a T4's float16
    on a larger GPU, say; the CPU never autocasts)."""
    if not any(amp_dtype is d or amp_dtype == d for d in AMP_DTYPES):
        raise ValueError(f"amp_dtype must be one of {AMP_DTYPES}, got {amp_dtype!r}")
    device = torch.device(device)
    if device.type != "cuda":
        return None
    if amp_dtype != "auto":
        return amp_dtype
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def autocast(device, amp_dtype="auto"):
    """Autocast in :func:`autocast_dtype` on CUDA, nothing elsewhere."""
    dtype = autocast_dtype(device, amp_dtype)
    return torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def largest_that_fits(run, sizes):
    """``(size, run(size))`` for the first of ``sizes`` (largest first) whose run fits in
    the device's memory: a CUDA out-of-memory error moves on to the next size, so a
    chapter's long evaluation sizes itself to the GPU it finds (a T4's 15 GB or more).
    Any other error, or running out at the last size, is raised."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must name at least one size")
    for i, size in enumerate(sizes):
        try:
            return size, run(size)
        except torch.cuda.OutOfMemoryError:
            if i == len(sizes) - 1:
                raise
            torch.cuda.empty_cache()
    raise AssertionError("unreachable")


def attention_memory_bytes(
    config, *, seq_len: int, batch: int, training: bool, amp_bytes: int = 2
) -> dict:
    """An estimate, for a GPU, of the largest tensors of one TinyLM forward (and backward)
    at ``seq_len`` tokens and ``batch`` sequences, when the bias is materialised (what
    ``backend="auto"`` takes on CUDA with gradients): per layer the ``[batch, heads, n, n]``
    scores and weights in the autocast dtype (``amp_bytes``: 2 for float16/bfloat16) and
    the ``[heads, n, n]`` bias in float32; training keeps every layer's for the backward,
    evaluation one layer's at a time. Also the parameters with AdamW's two moments and
    their gradients (float32) when training. Returns the parts and their ``total`` in bytes.
    The activations of the linear layers (``batch * n * dim`` each) are small beside these
    and left out, so the true peak is somewhat higher."""
    n, h = seq_len, config.heads
    scores = 2 * batch * h * n * n * amp_bytes  # scores and softmax weights
    bias = h * n * n * 4
    layers = config.depth if training else 1
    dim, vocab = config.dim, 256
    params = vocab * dim + config.depth * (12 * dim * dim + 13 * dim) + 2 * dim
    optimizer = 4 * params * 4 if training else params * 4  # weights, grads, two moments
    parts = {
        "attention": layers * scores,
        "bias": layers * bias,
        "parameters_and_optimizer": optimizer,
    }
    return {**parts, "total": sum(parts.values())}
