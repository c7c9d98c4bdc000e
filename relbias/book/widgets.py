"""Interactive explorers: sliders that redraw a figure (live Jupyter or Colab kernels).

In the static book widgets do not run; a chapter shows the figure drawn by the same
function for a few settings next to the explorer.
"""

from __future__ import annotations

from collections.abc import Callable

from IPython.display import Image

from relbias.book.display import _Text, to_png
from relbias.book.runtime import in_colab

__all__ = ["explorer"]


def _control(name: str, spec):
    """An ipywidgets control from a widget, a (min, max[, step]) tuple or a list of options."""
    import ipywidgets as widgets

    if isinstance(spec, widgets.Widget):
        return spec
    style = {"description_width": "initial"}
    if isinstance(spec, tuple) and len(spec) in (2, 3):
        low, high = spec[0], spec[1]
        integer = all(isinstance(v, int) and not isinstance(v, bool) for v in spec)
        step = spec[2] if len(spec) == 3 else 1 if integer else (high - low) / 100
        slider = widgets.IntSlider if integer else widgets.FloatSlider
        return slider(
            value=low,
            min=low,
            max=high,
            step=step,
            description=name,
            continuous_update=False,
            style=style,
        )
    if isinstance(spec, list):
        return widgets.Dropdown(options=spec, value=spec[0], description=name, style=style)
    if isinstance(spec, bool):
        return widgets.Checkbox(value=spec, description=name, style=style)
    raise TypeError(
        f"control {name!r}: give a widget, a (min, max[, step]) tuple, a list "
        f"of options or a bool, got {spec!r}"
    )


def explorer(draw: Callable, *, title: str = "explorer", initial: dict | None = None, **controls):
    """An interactive explorer: sliders that redraw ``draw(**values)`` (a matplotlib Figure).

    Each keyword names an argument of ``draw`` and gives its control: an ipywidgets
    widget, an ``(min, max[, step])`` tuple (int or float slider), a list of options
    (dropdown) or a bool (checkbox). ``initial`` sets starting values. The figure is
    drawn as a PNG into an Output widget: first when the explorer is built, again after
    every change. In the static book widgets do not run; show ``draw(...)`` for a few
    settings next to it instead.

    Returns the explorer (an ``ipywidgets.VBox`` whose plain-text form is a short,
    fixed description), to be displayed as a cell's last expression. Without ipywidgets
    it returns a short text saying so.
    """
    try:
        import ipywidgets as widgets
    except ImportError:
        return _Text(f"{title}: install ipywidgets to use the sliders")
    if in_colab():  # Colab renders ipywidgets 8 through its custom widget manager
        try:
            from google.colab import output

            output.enable_custom_widget_manager()
        except Exception:  # an older Colab: the sliders may not show
            pass
    boxes = {name: _control(name, spec) for name, spec in controls.items()}
    for name, value in (initial or {}).items():
        boxes[name].value = value
    out = widgets.Output()

    def redraw(_change=None):
        fig = draw(**{name: box.value for name, box in boxes.items()})
        image = Image(data=to_png(fig), format="png")
        out.outputs = ()
        out.append_display_data(image)

    for box in boxes.values():
        box.observe(redraw, names="value")
    redraw()
    names = ", ".join(boxes)
    return _Explorer(
        [widgets.HTML(f"<b>{title}</b>"), *boxes.values(), out],
        description=f"{title} (controls: {names}; live in Jupyter or Colab)",
    )


_EXPLORER_CLASS = None


def _Explorer(children, *, description: str):  # capitalised: it builds an instance
    """An ``ipywidgets.VBox`` whose text form is a fixed description (stable outputs)."""
    global _EXPLORER_CLASS
    if _EXPLORER_CLASS is None:
        import ipywidgets as widgets

        class Explorer(widgets.VBox):
            def __init__(self, children, *, description: str):
                super().__init__(children)
                self._description = description

            def __repr__(self) -> str:
                return f"Explorer: {self._description}"

        _EXPLORER_CLASS = Explorer
    return _EXPLORER_CLASS(children, description=description)
