"""Attention with a relative bias: :func:`biased_attention` and its backends.

``api`` holds the one entry point and its ``auto`` policy (:func:`choose_backend`);
``table`` the O(n) table path; ``flex`` FlexAttention; ``fused`` the C++ CPU kernel
(``csrc/``), imported on first use (``relbias.attention.fused`` works as an attribute too).
What the backends read of a bias is a prepared bias (the O(n) ingredients of one shape),
which lives with the biases (:mod:`relbias.biases.prepared`) and is re-exported here.
"""

import importlib

from relbias.attention.api import BACKENDS, biased_attention, choose_backend
from relbias.biases.prepared import (
    FIREBias,
    ForgettingBias,
    OffsetTableBias,
    PreparedBias,
    prepare_bias,
)

__all__ = [
    "BACKENDS",
    "FIREBias",
    "ForgettingBias",
    "OffsetTableBias",
    "PreparedBias",
    "biased_attention",
    "choose_backend",
    "prepare_bias",
]


def __getattr__(name: str):
    # `relbias.attention.fused` without importing it with the package: its module runs as
    # `python -m relbias.attention.fused`, which must not find it imported already.
    if name == "fused":
        return importlib.import_module("relbias.attention.fused")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
