import sys

from relbias.bench.cli import main

sys.exit(main())
