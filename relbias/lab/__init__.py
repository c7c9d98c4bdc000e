"""The lab: a tiny language model with every positional method, its data, training,
evaluation and the experiments behind the book's claims.

Above the core (it imports :mod:`relbias.biases` and :mod:`relbias.attention`, never the
book or the benchmarks). Needs the ``lab`` extra (numpy, tqdm).
"""

from relbias.lab.data import load_corpus, make_recall_batch
from relbias.lab.model import POSITION_NAMES, TinyLM
from relbias.lab.training import (
    Config,
    build_model,
    evaluate_lengths,
    evaluate_retrieval,
    get_config,
    learned_bias,
    learned_bias_from_results,
    load_results,
    pick_device,
    save_results,
    seed_everything,
    train_lm,
)

# The experiment entry points load on first use: importing relbias.lab.experiments here
# would make ``python -m relbias.lab.experiments`` warn that the module was imported twice.
_EXPERIMENTS = ("run_extrapolation", "run_retrieval", "train_and_evaluate", "train_and_probe")


def __getattr__(name: str):
    if name in _EXPERIMENTS:
        from relbias.lab import experiments

        return getattr(experiments, name)
    raise AttributeError(f"module 'relbias.lab' has no attribute {name!r}")


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
    "run_extrapolation",
    "run_retrieval",
    "save_results",
    "seed_everything",
    "train_and_evaluate",
    "train_and_probe",
    "train_lm",
]
