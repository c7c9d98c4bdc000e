"""relbias: relative positional biases for transformer attention, exact and tested.

The executable companion to §2.3.5 of *Foundations of Large Language Models*
(Xiao & Zhu). Offsets are ``i - j`` (query minus key), positions are 0-based.
"""

from . import flex, fused  # noqa: F401 (the fast backends, as relbias.flex and relbias.fused)
from .alibi import ALiBi, alibi_slopes
from .attention import biased_attention
from .base import RelativeBias

# The training side (issue 3): a tiny language model and its experiments.
from .data import load_corpus, make_recall_batch  # noqa: E402
from .fire import FIRE
from .flex import prepare_bias
from .kerple import KerpleLog, KerplePower
from .model import POSITION_NAMES, TinyLM  # noqa: E402
from .offset import OffsetBias
from .positions import relative_positions
from .registry import BIAS_FAMILIES, BIAS_NAMES, make_bias
from .sandwich import Sandwich
from .t5 import T5Bias, t5_bucket
from .training import (  # noqa: E402
    Config,
    build_model,
    evaluate_lengths,
    evaluate_retrieval,
    get_config,
    learned_bias,
    learned_bias_from_results,
    load_results,
    pick_device,
    plot_learned_bias,
    plot_results,
    save_results,
    seed_everything,
    train_lm,
)

__version__ = "0.1.0"

# The experiment entry points are loaded on first use, not here: importing
# relbias.experiments from this file would make ``python -m relbias.experiments``
# warn that the module was imported twice.
_EXPERIMENTS = ("run_extrapolation", "run_retrieval", "train_and_evaluate", "train_and_probe")


def __getattr__(name: str):
    if name in _EXPERIMENTS:
        from . import experiments

        return getattr(experiments, name)
    raise AttributeError(f"module 'relbias' has no attribute {name!r}")


__all__ = [
    "POSITION_NAMES",
    "Config",
    "TinyLM",
    "build_model",
    "evaluate_lengths",
    "evaluate_retrieval",
    "get_config",
    "learned_bias",
    "learned_bias_from_results",
    "load_corpus",
    "load_results",
    "make_recall_batch",
    "pick_device",
    "plot_learned_bias",
    "plot_results",
    "run_extrapolation",
    "run_retrieval",
    "save_results",
    "seed_everything",
    "train_and_evaluate",
    "train_and_probe",
    "train_lm",
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
    "prepare_bias",
    "relative_positions",
    "t5_bucket",
]
