"""Argument checks shared by every public function: clear errors naming the parameter."""

from __future__ import annotations

import contextlib
import numbers

import torch


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Return ``value`` as an ``int`` or raise naming ``name`` and what is allowed."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def check_bool(name: str, value) -> bool:
    """Return ``value`` if it is ``True`` or ``False``, else raise naming ``name``."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_positive_ints(**values) -> None:
    """Each keyword's value must be an integer >= 1 (the error names the keyword)."""
    for name, value in values.items():
        check_int(name, value, minimum=1)


def check_positive_float(name: str, value) -> float:
    """Return ``value`` as a positive finite float or raise naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a positive number, got {type(value).__name__} {value!r}")
    value = float(value)
    if not (value > 0 and value < float("inf")):
        raise ValueError(f"{name} must be a positive finite number, got {value}")
    return value


def check_choice(name: str, value, allowed) -> str:
    try:
        known = value in allowed
    except TypeError:  # an unhashable value (a list, a dict) is no choice either
        known = False
    if not known:
        raise ValueError(f"{name} must be one of {sorted(allowed)}, got {value!r}")
    return value


def check_lengths(q_len, k_len, q_start) -> tuple[int, int, int]:
    """Validate attention lengths and fill the defaults of the book's convention.

    ``k_len`` defaults to ``q_len``; queries default to the *last* ``q_len`` of the
    ``k_len`` positions, so ``q_start = k_len - q_len``.
    """
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=0)
    if q_start is None:
        if k_len < q_len:
            raise ValueError(
                f"k_len ({k_len}) must be >= q_len ({q_len}) when q_start is not given: "
                "queries are the last q_len of the k_len key positions"
            )
        q_start = k_len - q_len
    else:
        q_start = check_int("q_start", q_start, minimum=0)
    return q_len, k_len, q_start


def check_broadcasts(name: str, tensor, target: tuple) -> None:
    """``tensor`` (a bias or a mask) broadcasts to ``[batch, heads, q_len, k_len] = target``
    (each dimension 1 or the target's, at most 4), else ``ValueError`` naming it."""
    if tensor.dim() > 4 or any(
        size not in (1, t) for size, t in zip(reversed(tensor.shape), reversed(target))
    ):
        raise ValueError(
            f"{name} of shape {tuple(tensor.shape)} does not broadcast to "
            f"[batch, heads, q_len, k_len] = {list(target)}"
        )


def compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """float64 when any parameter is float64 (for gradcheck), else float32.

    Positions and formulas are always evaluated in at least float32 so that a
    module cast to float16/bfloat16 never rounds an integer offset.
    """
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def needs_grad(*inputs) -> bool:
    """Whether a result computed from ``inputs`` needs a gradient: the one test of every backend.

    True when grad mode is on and any input asks for one: a tensor (or a prepared bias)
    with ``requires_grad``, or a module with a parameter that requires grad. ``None``
    inputs are skipped.
    """
    if not torch.is_grad_enabled():
        return False
    for x in inputs:
        if isinstance(x, torch.nn.Module):
            if any(p.requires_grad for p in x.parameters()):
                return True
        elif x is not None and getattr(x, "requires_grad", False):
            return True
    return False


def autocast_enabled(device: torch.device | str) -> bool:
    """Whether ``torch.autocast`` is on for ``device``'s type (False where torch cannot say)."""
    device_type = torch.device(device).type
    try:
        return torch.is_autocast_enabled(device_type)
    except (TypeError, RuntimeError):  # an older torch: no device argument
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return device_type == "cuda" and torch.is_autocast_enabled()


def no_autocast(device: torch.device | str):
    """A context in which ``torch.autocast`` is off for ``device``'s type.

    Biases are computed (FIRE's MLP included) and added in float32 whatever autocast a
    caller runs under. A device type that autocast does not know needs nothing turned off.
    """
    device_type = torch.device(device).type
    try:
        return torch.autocast(device_type, enabled=False)
    except (RuntimeError, ValueError):
        return contextlib.nullcontext()


def float64_device(device: torch.device | str) -> torch.device:
    """Where float64 arithmetic for ``device`` can run: the device itself, or the CPU for
    MPS (which has no float64)."""
    device = torch.device(device)
    return torch.device("cpu") if device.type == "mps" else device
