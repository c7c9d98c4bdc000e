"""relbias: relative positional biases for transformer attention, exact and tested.

The executable companion to §2.3.5 of *Foundations of Large Language Models*
(Xiao & Zhu). Offsets are ``i - j`` (query minus key), positions are 0-based.
"""

from .alibi import ALiBi, alibi_slopes
from .attention import biased_attention
from .base import RelativeBias
from .fire import FIRE
from .kerple import KerpleLog, KerplePower
from .offset import OffsetBias
from .positions import relative_positions
from .registry import BIAS_FAMILIES, BIAS_NAMES, make_bias
from .sandwich import Sandwich
from .t5 import T5Bias, t5_bucket

__version__ = "0.1.0"

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
    "biased_attention",
    "make_bias",
    "relative_positions",
    "t5_bucket",
]
