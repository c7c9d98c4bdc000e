"""The attention benchmark: how fast, and in how much memory, each way of applying a bias runs.

``python -m relbias.bench`` measures, side by side in one run, for every bias family
and every length n: the forward time (and, for n <= ``--backward-max``, forward plus
backward) and the peak memory of

* ``sdpa``: plain causal ``scaled_dot_product_attention`` with no bias (the floor);
* ``materialize``, ``table``, ``flex``, ``fused``: :func:`relbias.biased_attention`
  with that backend;
* ``xt``: x-transformers' ``RelativePositionBias`` (T5) and ``AlibiPositionalBias``
  (ALiBi), applied with its ``Attend`` module (its default, non-flash path);
* ``hf_t5``: HuggingFace's ``T5Attention.compute_bias``, added with the causal mask
  to ``scaled_dot_product_attention``.

Ratios are to the floor at the same n. Results print as tables and go to JSON with
the machine, the torch version and the thread count (``--out``). ``--quick`` runs a
small configuration in about a minute. Not a test: timings vary from run to run.

Above the core. The modules: :mod:`~relbias.bench.config` (:class:`BenchConfig`),
:mod:`~relbias.bench.methods` and :mod:`~relbias.bench.references` (what is compared),
:mod:`~relbias.bench.timing` and :mod:`~relbias.bench.memory` (how it is measured),
:mod:`~relbias.bench.report` (the run and its JSON report), :mod:`~relbias.bench.goals`
(the issue's goals), :mod:`~relbias.bench.plots` (figures), :mod:`~relbias.bench.cli`.
"""

from relbias.bench.cli import build_parser, main, parse_args
from relbias.bench.config import FULL_LENGTHS, QUICK_LENGTHS, BenchConfig, ConfigError
from relbias.bench.goals import evaluate_goals, goal_rows, goal_summary_rows, summary
from relbias.bench.goals import index as rows_of_pass
from relbias.bench.methods import ALL_METHODS, FAST_METHODS, OUR_METHODS
from relbias.bench.plots import plot_forward, plot_memory
from relbias.bench.references import REFERENCES
from relbias.bench.report import RESULTS_DIR, format_tables, load_report, provenance, run
from relbias.bench.timing import compare

__all__ = [
    "ALL_METHODS",
    "FAST_METHODS",
    "FULL_LENGTHS",
    "OUR_METHODS",
    "QUICK_LENGTHS",
    "REFERENCES",
    "RESULTS_DIR",
    "BenchConfig",
    "ConfigError",
    "build_parser",
    "compare",
    "evaluate_goals",
    "format_tables",
    "goal_rows",
    "goal_summary_rows",
    "load_report",
    "main",
    "parse_args",
    "plot_forward",
    "plot_memory",
    "provenance",
    "rows_of_pass",
    "run",
    "summary",
]
