import sys

from relbias.bench.harness import main

sys.exit(main())
