"""Attention with a relative bias: :func:`biased_attention` and its backends.

``api`` holds the one entry point and its ``auto`` policy; ``flex`` the prepared biases,
the O(n) table path and FlexAttention; ``fused`` the C++ CPU kernel (``csrc/``).
"""

from relbias.attention.api import BACKENDS, biased_attention
from relbias.attention.flex import PreparedBias, prepare_bias

__all__ = ["BACKENDS", "PreparedBias", "biased_attention", "prepare_bias"]
