"""The lab: a tiny language model with every positional method, its data, training,
evaluation, the experiments behind the book's claims and their stored results.

Above the core (it imports :mod:`relbias.biases`, :mod:`relbias.attention` and
:mod:`relbias.rotary`, never the book or the benchmarks). Needs the ``lab`` extra (numpy,
tqdm, matplotlib, scipy). One module per concept, each importing only those before it:

- :mod:`~relbias.lab.config`: the named configurations (:class:`Config`, :func:`get_config`);
- :mod:`~relbias.lab.device`: device, autocast, seeds, deterministic algorithms;
- :mod:`~relbias.lab.data`: the byte corpus (the Python standard library's source);
- :mod:`~relbias.lab.probe`: the recall probes and their batches;
- :mod:`~relbias.lab.model`: :class:`TinyLM`;
- :mod:`~relbias.lab.stats`: intervals over seeds, the one verdict function, summaries;
- :mod:`~relbias.lab.readback`: what a trained bias or gate learned, read back;
- :mod:`~relbias.lab.results`: result files, provenance, the stored sweeps;
- :mod:`~relbias.lab.context`: the context-use measure (the long reading against a sliding
  window of the training length);
- :mod:`~relbias.lab.evaluation`: bits per byte by length, recall accuracy;
- :mod:`~relbias.lab.checkpoint`, :mod:`~relbias.lab.training`: the training loop;
- :mod:`~relbias.lab.sweep`: the one sweep runner (seeds, checkpoints, summaries);
- :mod:`~relbias.lab.weights`: the final weights of a sweep's models, kept and read back;
- :mod:`~relbias.lab.experiments`, :mod:`~relbias.lab.ablations`,
  :mod:`~relbias.lab.interpolation`: the experiments;
- :mod:`~relbias.lab.plots`: every plot of the lab's results;
- :mod:`~relbias.lab.cli`: ``python -m relbias.lab``.
"""

from relbias.lab.config import Config, get_config
from relbias.lab.data import load_corpus
from relbias.lab.device import pick_device, seed_everything
from relbias.lab.evaluation import evaluate_lengths, evaluate_retrieval
from relbias.lab.experiments import (
    run_extrapolation,
    run_retrieval,
    train_and_evaluate,
    train_and_probe,
)
from relbias.lab.model import POSITION_NAMES, TinyLM
from relbias.lab.probe import make_recall_batch
from relbias.lab.readback import learned_bias
from relbias.lab.results import load_results, load_stored, made_with
from relbias.lab.training import build_model, train_lm

__all__ = [
    "POSITION_NAMES",
    "Config",
    "TinyLM",
    "build_model",
    "evaluate_lengths",
    "evaluate_retrieval",
    "get_config",
    "learned_bias",
    "load_corpus",
    "load_results",
    "load_stored",
    "made_with",
    "make_recall_batch",
    "pick_device",
    "run_extrapolation",
    "run_retrieval",
    "seed_everything",
    "train_and_evaluate",
    "train_and_probe",
    "train_lm",
]
