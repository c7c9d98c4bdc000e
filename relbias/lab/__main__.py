"""``python -m relbias.lab EXPERIMENT [options]``: the command line of :mod:`relbias.lab.cli`."""

import sys

from relbias.lab.cli import main

sys.exit(main())
