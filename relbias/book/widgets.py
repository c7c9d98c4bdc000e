"""Interactive explorers: controls that redraw a figure, live and in the static book.

:func:`explorer` returns an ipywidgets box whose sliders redraw the figure in a live
Jupyter or Colab kernel. Displayed, it also carries a ``text/html`` form for pages with no
kernel (the built book, a notebook viewer): the figure pre-drawn for a small grid of
control values (:data:`MAX_STATES` at most), plain HTML controls, and a few lines of
inline JavaScript that show the figure of the chosen values. No external script, no
network: moving a control in the static page changes the figure. Jupyter and Colab
render the widget and ignore the HTML; the book's build (``_config.yml``) shows the HTML.
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import math
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from IPython.display import Image

from relbias.book.display import _Text, to_png
from relbias.book.runtime import in_colab

__all__ = ["MAX_STATES", "SLIDER_POINTS", "explorer", "static_grid"]

# The static form draws at most this many figures per explorer (its page weight grows with
# it), and a slider at most SLIDER_POINTS of its values.
MAX_STATES = 16
SLIDER_POINTS = 5


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
        if not spec:
            raise ValueError(f"control {name!r}: the list of options is empty")
        return widgets.Dropdown(options=spec, value=spec[0], description=name, style=style)
    if isinstance(spec, bool):
        return widgets.Checkbox(value=spec, description=name, style=style)
    raise TypeError(
        f"control {name!r}: give a widget, a (min, max[, step]) tuple, a list "
        f"of options or a bool, got {spec!r}"
    )


# --- the static form --------------------------------------------------------------------------


@dataclass(frozen=True)
class _Choices:
    """The values one control takes in the static page: ``kind`` is range, select or check."""

    name: str
    kind: str
    values: tuple  # every value the static page may show, ascending for a range
    labels: tuple[str, ...]
    initial: int  # index of the starting value in ``values``


def _label(value) -> str:
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _slider_values(low, high, step, value, points: int) -> list:
    """``points`` values of a slider from ``low`` to ``high`` on its step, with ``value``."""
    integer = all(isinstance(v, int) and not isinstance(v, bool) for v in (low, high, step))
    if points <= 1 or high <= low:
        return [value]
    grid = [low + (high - low) * i / (points - 1) for i in range(points)]
    if step:
        grid = [low + round((g - low) / step) * step for g in grid]
    grid = [int(round(g)) if integer else round(float(g), 10) for g in grid]
    nearest = min(range(len(grid)), key=lambda i: abs(grid[i] - value))
    grid[nearest] = value
    return sorted(set(grid))


def _choices(name: str, box, points: int) -> _Choices:
    """The static values of one ipywidgets control, ``points`` of them at most."""
    import ipywidgets as widgets

    value = box.value
    if isinstance(box, (widgets.IntSlider, widgets.FloatSlider)):
        values = _slider_values(box.min, box.max, box.step, value, points)
        kind = "range"
    elif isinstance(box, (widgets.Checkbox, widgets.ToggleButton)):
        values = [False, True] if points >= 2 else [value]
        kind = "check"
    elif hasattr(box, "options"):
        pairs = [o if isinstance(o, tuple) and len(o) == 2 else (_label(o), o) for o in box.options]
        start = next(i for i, (_, v) in enumerate(pairs) if v == value)
        keep = _spread(list(range(len(pairs))), start, points)
        return _Choices(
            name,
            "select",
            tuple(pairs[i][1] for i in keep),
            tuple(pairs[i][0] for i in keep),
            keep.index(start),
        )
    else:  # any other widget: the page shows its starting value only
        values, kind = [value], "range"
    labels = tuple(_label(v) for v in values)
    return _Choices(name, kind, tuple(values), labels, values.index(value))


def _spread(options: list, start: int, points: int) -> list:
    """``points`` of ``options`` spread evenly over the list, always with ``options[start]``."""
    if points >= len(options):
        return list(options)
    picked = {round(i * (len(options) - 1) / max(points - 1, 1)) for i in range(points)}
    if start not in picked:
        picked.remove(min(picked, key=lambda i: abs(i - start)))
        picked.add(start)
    return [options[i] for i in sorted(picked)]


def _capacity(name: str, box) -> int:
    """How many values a control could show in the static page."""
    import ipywidgets as widgets

    if isinstance(box, (widgets.IntSlider, widgets.FloatSlider)):
        return min(SLIDER_POINTS, len(_slider_values(box.min, box.max, box.step, box.value, 99)))
    if isinstance(box, (widgets.Checkbox, widgets.ToggleButton)):
        return 2
    if hasattr(box, "options"):
        return len(box.options)
    return 1


def static_grid(boxes: dict, max_states: int = MAX_STATES) -> list[_Choices]:
    """The values each control takes in the static page, at most ``max_states`` in all.

    Every control that can move gets two values (its starting one and another) while the
    product stays within ``max_states``; a control left over keeps its starting value.
    Then, in turns, each control (lists of options first, sliders next) gains a value while
    the product stays within the limit.
    """
    if not isinstance(max_states, int) or max_states < 1:
        raise ValueError(f"max_states must be a positive int, got {max_states!r}")
    capacity = {name: _capacity(name, box) for name, box in boxes.items()}
    points = {name: 1 for name in boxes}
    for name in boxes:
        if capacity[name] >= 2 and math.prod(points.values()) * 2 <= max_states:
            points[name] = 2
    order = sorted(boxes, key=lambda n: not hasattr(boxes[n], "options"))
    grown = True
    while grown:
        grown = False
        for name in order:
            if points[name] < 2 or points[name] >= capacity[name]:
                continue
            bigger = math.prod(points.values()) // points[name] * (points[name] + 1)
            if bigger <= max_states:
                points[name] += 1
                grown = True
    return [_choices(name, box, points[name]) for name, box in boxes.items()]


_SCRIPT = """<script>
(function () {
  document.querySelectorAll(".relbias-explorer:not([data-ready])").forEach(function (box) {
    box.setAttribute("data-ready", "");
    var controls = Array.prototype.slice.call(box.querySelectorAll("[data-control]"));
    function index(c) { return c.type === "checkbox" ? (c.checked ? 1 : 0) : Number(c.value); }
    function update() {
      var key = controls.map(index).join("-");
      controls.forEach(function (c) {
        var out = c.parentNode.querySelector("output");
        if (out) { out.textContent = JSON.parse(c.getAttribute("data-labels"))[index(c)]; }
      });
      box.querySelectorAll("img[data-state]").forEach(function (img) {
        img.hidden = img.getAttribute("data-state") !== key;
      });
    }
    controls.forEach(function (c) {
      c.addEventListener("input", update);
      c.addEventListener("change", update);
    });
    update();
  });
})();
</script>"""


def _control_html(choice: _Choices) -> str:
    name = html.escape(choice.name)
    if len(choice.values) == 1:
        return (
            f'<span class="relbias-explorer-fixed">{name} = {html.escape(choice.labels[0])}</span>'
        )
    labels = html.escape(json.dumps(list(choice.labels)), quote=True)
    if choice.kind == "select":
        options = "".join(
            f'<option value="{i}"{" selected" if i == choice.initial else ""}>'
            f"{html.escape(label)}</option>"
            for i, label in enumerate(choice.labels)
        )
        return (
            f'<label>{name} <select data-control="{name}" data-labels="{labels}" '
            f'autocomplete="off">{options}</select></label>'
        )
    if choice.kind == "check":
        checked = " checked" if choice.values[choice.initial] else ""
        return (
            f'<label><input type="checkbox" data-control="{name}" data-labels="{labels}" '
            f'autocomplete="off"{checked}> {name}</label>'
        )
    return (
        f'<label>{name} <input type="range" min="0" max="{len(choice.values) - 1}" step="1" '
        f'value="{choice.initial}" data-control="{name}" data-labels="{labels}" '
        f'autocomplete="off"> <output>{html.escape(choice.labels[choice.initial])}</output>'
        "</label>"
    )


def _png_of(draw: Callable, values: dict) -> bytes:
    fig = draw(**values)
    try:
        return to_png(fig)
    finally:
        pyplot = sys.modules.get("matplotlib.pyplot")
        if pyplot is not None:
            pyplot.close(fig)


def static_html(draw: Callable, title: str, grid: Sequence[_Choices]) -> str:
    """The explorer for a page with no kernel: figures pre-drawn for every state of ``grid``.

    Each state's figure is an ``<img>`` (a PNG data URI, ``hidden`` but for the chosen
    state, whose ``data-state`` is the indices of the moving controls joined by ``-``).
    Without JavaScript the page shows the starting figure.
    """
    moving = [c for c in grid if len(c.values) > 1]
    fixed = {c.name: c.values[0] for c in grid if len(c.values) == 1}
    start = "-".join(str(c.initial) for c in moving)
    images = []
    for indices in itertools.product(*(range(len(c.values)) for c in moving)):
        values = dict(fixed)
        values.update({c.name: c.values[i] for c, i in zip(moving, indices)})
        key = "-".join(map(str, indices))
        data = base64.b64encode(_png_of(draw, values)).decode("ascii")
        described = ", ".join(
            f"{c.name} = {c.labels[c.values.index(values[c.name])]}" for c in grid
        )
        alt = html.escape(f"{title}: {described}", quote=True)
        hidden = "" if key == start else " hidden"
        images.append(
            f'<img src="data:image/png;base64,{data}" alt="{alt}" data-state="{key}"{hidden}>'
        )
    states = len(images)
    note = (
        f"{states} settings drawn when the chapter ran; every setting in Jupyter or Colab"
        if moving
        else "drawn when the chapter ran; move the controls in Jupyter or Colab"
    )
    controls = " ".join(_control_html(c) for c in grid)
    return (
        '<div class="relbias-explorer">'
        f'<p class="relbias-explorer-title"><strong>{html.escape(title)}</strong> '
        f'<span class="relbias-explorer-note">({note})</span></p>'
        f'<div class="relbias-explorer-controls">{controls}</div>'
        f'<div class="relbias-explorer-figure">{"".join(images)}</div>'
        f"{_SCRIPT}</div>"
    )


# --- the explorer -----------------------------------------------------------------------------


def explorer(draw: Callable, *, title: str = "explorer", initial: dict | None = None, **controls):
    """An interactive explorer: sliders that redraw ``draw(**values)`` (a matplotlib Figure).

    Each keyword names an argument of ``draw`` and gives its control: an ipywidgets
    widget, an ``(min, max[, step])`` tuple (int or float slider), a list of options
    (dropdown) or a bool (checkbox). ``initial`` sets starting values. The figure is
    drawn as a PNG into an Output widget: first when the explorer is built, again after
    every change.

    Returns the explorer (an ``ipywidgets.VBox`` whose plain-text form is a short,
    fixed description), to be displayed as a cell's last expression. Displayed, it also
    gives a ``text/html`` form for pages without a kernel (:func:`static_html`): the
    figure for at most :data:`MAX_STATES` settings (:func:`static_grid`), switched by
    plain HTML controls. Without ipywidgets it returns a short text saying so.
    """
    if not callable(draw):
        raise TypeError(f"draw must be a callable returning a matplotlib Figure, got {draw!r}")
    if not controls:
        raise ValueError("explorer needs at least one control (a keyword argument of draw)")
    unknown = sorted(set(initial or {}) - set(controls))
    if unknown:
        raise ValueError(f"initial names no control: {unknown}; the controls are {list(controls)}")
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
    grid = static_grid(boxes)  # from the starting values, before a reader moves anything
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
        [widgets.HTML(f"<b>{html.escape(title)}</b>"), *boxes.values(), out],
        description=f"{title} (controls: {names}; live in Jupyter or Colab)",
        static=lambda: static_html(draw, title, grid),
    )


_EXPLORER_CLASS = None


def _Explorer(children, *, description: str, static: Callable[[], str]):  # builds an instance
    """An ``ipywidgets.VBox`` whose text form is a fixed description (stable outputs), and
    whose ``text/html`` form is ``static()`` (computed once, when first displayed)."""
    global _EXPLORER_CLASS
    if _EXPLORER_CLASS is None:
        import ipywidgets as widgets

        class Explorer(widgets.VBox):
            def __init__(self, children, *, description: str, static: Callable[[], str]):
                super().__init__(children)
                self._description = description
                self._static = static
                self._static_html: str | None = None

            def __repr__(self) -> str:
                return f"Explorer: {self._description}"

            def static_html(self) -> str:
                """The page form: pre-drawn figures and plain HTML controls."""
                if self._static_html is None:
                    self._static_html = self._static()
                return self._static_html

            def _repr_mimebundle_(self, **kwargs):
                bundle = super()._repr_mimebundle_(**kwargs)
                if not in_colab():  # Colab shows the widget: no need to pre-draw there
                    bundle["text/html"] = self.static_html()
                return bundle

        _EXPLORER_CLASS = Explorer
    return _EXPLORER_CLASS(children, description=description, static=static)
