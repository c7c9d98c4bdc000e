"""The attention benchmark: time and memory of every backend for every bias family.

Above the core. ``python -m relbias.bench`` runs it (``--help`` for the options).
"""

from relbias.bench.harness import *  # noqa: F403
