"""What only the book's chapters use: display, glue, explorers and figures.

Above the core and the lab. Chapters import it as ``from relbias import book as nb`` (the
names below) and ``from relbias.book import figures as fg`` (the figures and tables of
single chapters). Needs the ``book`` extra (matplotlib, ipywidgets).

- :mod:`relbias.book.runtime`: :func:`runtime_banner` (device, configuration, seeds);
- :mod:`relbias.book.display`: :func:`show_source`, :func:`show_cpp`, :func:`show_table`,
  :func:`show`, :func:`to_png`, :func:`glue`;
- :mod:`relbias.book.plots`: :func:`figure` (every figure is drawn through it, never
  pyplot) and the figures of any bias, among them :func:`plot_bias_by_offset`;
- :mod:`relbias.book.widgets`: :func:`explorer`;
- :mod:`relbias.book.execute`: ``python -m relbias.book execute book/<chapter>.ipynb``.
"""

from relbias.book.display import glue, show, show_cpp, show_source, show_table, to_png
from relbias.book.plots import (
    figure,
    plot_bias_by_offset,
    plot_bias_gallery,
    plot_bias_matrix,
    plot_index_matrix,
)
from relbias.book.runtime import Runtime, in_colab, runtime_banner
from relbias.book.widgets import explorer

__all__ = [
    "Runtime",
    "explorer",
    "figure",
    "glue",
    "in_colab",
    "plot_bias_by_offset",
    "plot_bias_gallery",
    "plot_bias_matrix",
    "plot_index_matrix",
    "runtime_banner",
    "show",
    "show_cpp",
    "show_source",
    "show_table",
    "to_png",
]
