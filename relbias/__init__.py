"""relbias: relative positional biases for transformer attention, exact and tested.

The executable companion to §2.3.5 of *Foundations of Large Language Models*
(Xiao & Zhu). Offsets are ``i - j`` (query minus key), positions are 0-based.

``import relbias`` gives the core: the bias families (:mod:`relbias.biases`) and attention
with a bias (:mod:`relbias.attention`); it needs only torch. The rooms above it are
imported by name: :mod:`relbias.lab` (a tiny language model, training, experiments),
:mod:`relbias.book` (the chapters' display helpers and figures) and :mod:`relbias.bench`
(the attention benchmark).
"""

from relbias.attention import BACKENDS, biased_attention, choose_backend
from relbias.biases import (
    BIAS_FAMILIES,
    BIAS_NAMES,
    DATA_DEPENDENT_FAMILIES,
    DATA_DEPENDENT_NAMES,
    FIRE,
    ALiBi,
    DataDependentBias,
    ForgettingGate,
    KerpleLog,
    KerplePower,
    OffsetBias,
    PreparedBias,
    RelativeBias,
    Sandwich,
    T5Bias,
    alibi_slopes,
    make_bias,
    prepare_bias,
    relative_positions,
    t5_bucket,
)
from relbias.rotary import SCALING_KINDS, RopeScaling, RotaryEmbedding

__version__ = "0.1.0"

__all__ = [
    "ALiBi",
    "BACKENDS",
    "BIAS_FAMILIES",
    "BIAS_NAMES",
    "DATA_DEPENDENT_FAMILIES",
    "DATA_DEPENDENT_NAMES",
    "DataDependentBias",
    "FIRE",
    "ForgettingGate",
    "KerpleLog",
    "KerplePower",
    "OffsetBias",
    "PreparedBias",
    "RelativeBias",
    "RopeScaling",
    "RotaryEmbedding",
    "SCALING_KINDS",
    "Sandwich",
    "T5Bias",
    "alibi_slopes",
    "biased_attention",
    "choose_backend",
    "make_bias",
    "prepare_bias",
    "relative_positions",
    "t5_bucket",
]
