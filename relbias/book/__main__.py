"""``python -m relbias.book execute book/<chapter>.ipynb ...``: see :mod:`relbias.book.execute`."""

from relbias.book.execute import main

raise SystemExit(main())
