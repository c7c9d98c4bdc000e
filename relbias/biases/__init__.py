"""The bias families: one module each, behind :class:`RelativeBias` (functions of positions)
or :class:`DataDependentBias` (computed from the layer input: :class:`ForgettingGate`), and
their prepared forms (:mod:`relbias.biases.prepared`: the O(n) ingredients of one attention
shape that the backends of :mod:`relbias.attention` read).

PE(i, j) is a function of the offset ``i - j`` (FIRE also of the query position ``i``, the
forget gate of the input between ``j`` and ``i``),
added to the attention scores after the ``1/sqrt(d)`` scaling (the book adds it inside:
see :class:`RelativeBias` for the factor sqrt(d) between the two).
"""

from relbias.biases.alibi import ALiBi, alibi_slopes
from relbias.biases.base import DataDependentBias, RelativeBias
from relbias.biases.fire import FIRE
from relbias.biases.forgetting import ForgettingGate
from relbias.biases.kerple import KerpleLog, KerplePower
from relbias.biases.offset import OffsetBias
from relbias.biases.positions import relative_positions
from relbias.biases.prepared import (
    FIREBias,
    ForgettingBias,
    OffsetTableBias,
    PreparedBias,
    prepare_bias,
)
from relbias.biases.registry import (
    BIAS_FAMILIES,
    BIAS_NAMES,
    DATA_DEPENDENT_FAMILIES,
    DATA_DEPENDENT_NAMES,
    make_bias,
)
from relbias.biases.sandwich import Sandwich
from relbias.biases.t5 import T5Bias, t5_bucket

__all__ = [
    "ALiBi",
    "BIAS_FAMILIES",
    "BIAS_NAMES",
    "DATA_DEPENDENT_FAMILIES",
    "DATA_DEPENDENT_NAMES",
    "DataDependentBias",
    "FIRE",
    "FIREBias",
    "ForgettingBias",
    "ForgettingGate",
    "KerpleLog",
    "KerplePower",
    "OffsetBias",
    "OffsetTableBias",
    "PreparedBias",
    "RelativeBias",
    "Sandwich",
    "T5Bias",
    "alibi_slopes",
    "make_bias",
    "prepare_bias",
    "relative_positions",
    "t5_bucket",
]
