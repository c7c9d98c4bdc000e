"""What only the book's chapters use: display, glue, explorers and figures.

Above the core and the lab. Chapters import it as ``from relbias import book as nb``
(the display helpers of :mod:`relbias.book.notebook`) and ``from relbias.book import
figures as fg``. Needs the ``book`` extra (matplotlib, ipywidgets).
"""

from relbias.book.notebook import *  # noqa: F403
from relbias.book.notebook import __all__  # noqa: F401
