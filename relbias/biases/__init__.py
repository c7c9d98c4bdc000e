"""The bias families: one module each, all behind :class:`RelativeBias`.

PE(i, j) is a function of the offset ``i - j`` (FIRE also of the query position ``i``),
added to the attention scores after the ``1/sqrt(d)`` scaling (the book adds it inside:
see :class:`RelativeBias` for the factor sqrt(d) between the two).
"""

from relbias.biases.alibi import ALiBi, alibi_slopes
from relbias.biases.base import RelativeBias
from relbias.biases.fire import FIRE
from relbias.biases.kerple import KerpleLog, KerplePower
from relbias.biases.offset import OffsetBias
from relbias.biases.positions import relative_positions
from relbias.biases.registry import BIAS_FAMILIES, BIAS_NAMES, make_bias
from relbias.biases.sandwich import Sandwich
from relbias.biases.t5 import T5Bias, t5_bucket

__all__ = [
    "ALiBi",
    "BIAS_FAMILIES",
    "BIAS_NAMES",
    "FIRE",
    "KerpleLog",
    "KerplePower",
    "OffsetBias",
    "RelativeBias",
    "Sandwich",
    "T5Bias",
    "alibi_slopes",
    "make_bias",
    "relative_positions",
    "t5_bucket",
]
