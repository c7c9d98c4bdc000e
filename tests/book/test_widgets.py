"""The explorers' static form: the grid of pre-drawn settings and the HTML that switches them.

The browser test (tests/book/test_browser.py) moves the controls in the built pages; these
tests check the grid and the HTML without a browser or a build.
"""

from __future__ import annotations

import html
import math
import re
import sys

import pytest

pytest.importorskip("ipywidgets")

import relbias  # noqa: E402
from relbias import book as nb  # noqa: E402
from relbias.book import widgets  # noqa: E402


def _draw(name="alibi", n=4, flip=False):
    bias = relbias.make_bias(name, 2)
    fig = nb.plot_bias_matrix(bias, n, heads=[1 if flip else 0], title=f"{name} {n} {flip}")
    return fig


def _boxes(**controls):
    return {name: widgets._control(name, spec) for name, spec in controls.items()}


def test_grid_keeps_starting_values_and_the_limit():
    boxes = _boxes(name=["alibi", "sandwich", "kerple_log", "fire"], n=(2, 64), flip=False)
    boxes["n"].value = 24
    boxes["name"].value = "sandwich"
    grid = widgets.static_grid(boxes)
    assert math.prod(len(c.values) for c in grid) <= widgets.MAX_STATES
    by_name = {c.name: c for c in grid}
    assert all(len(c.values) >= 2 for c in grid), "every control moves in the page"
    assert by_name["n"].values[by_name["n"].initial] == 24
    assert by_name["name"].values[by_name["name"].initial] == "sandwich"
    assert list(by_name["n"].values) == sorted(by_name["n"].values)
    assert by_name["flip"].values == (False, True) and by_name["flip"].kind == "check"


def test_grid_fixes_controls_beyond_the_limit_and_rejects_a_bad_limit():
    boxes = _boxes(a=(0, 9), b=(0, 9), c=(0, 9), d=(0, 9), e=(0, 9))
    grid = widgets.static_grid(boxes, max_states=8)
    assert [len(c.values) for c in grid] == [2, 2, 2, 1, 1]
    with pytest.raises(ValueError, match="max_states must be a positive int"):
        widgets.static_grid(boxes, max_states=0)


def test_slider_values_snap_to_the_step_and_keep_the_value():
    assert widgets._slider_values(0.01, 5.0, 0.01, 0.1, 3) == [0.1, 2.51, 5.0]
    assert widgets._slider_values(8, 512, 8, 64, 2) == [64, 512]
    assert widgets._slider_values(3, 3, 1, 3, 4) == [3]


def test_static_html_draws_every_state_and_shows_one():
    box = nb.explorer(_draw, title="demo <b>", name=["alibi", "sandwich"], n=(2, 8), flip=False)
    bundle = box._repr_mimebundle_()
    assert (
        bundle["text/plain"]
        == repr(box)
        == ("Explorer: demo <b> (controls: name, n, flip; live in Jupyter or Colab)")
    )
    page = bundle["text/html"]
    assert "demo &lt;b&gt;" in page and "<b>" not in page.split("<script>")[0].replace(
        "<strong>", ""
    )
    states = re.findall(
        r'<img src="data:image/png;base64,([^"]+)" alt="[^"]*" data-state="([^"]+)"'
        r"( hidden)?>",
        page,
    )
    assert len(states) == 16  # 2 names x 4 lengths x 2 flips: the grid fills MAX_STATES
    assert [s[1] for s in states if not s[2]] == ["0-0-0"], "only the starting figure shows"
    assert len({s[0] for s in states}) == 16, "every state has its own figure"
    assert page.count("data-control=") == 3
    assert "<script>" in page and 'src="http' not in page and "://" not in page
    labels = re.search(r'data-control="n" data-labels="([^"]+)"', page).group(1)
    assert html.unescape(labels) == '["2", "4", "6", "8"]'
    assert box._repr_mimebundle_()["text/html"] is page, "drawn once, then reused"


def test_explorer_rejects_bad_input():
    with pytest.raises(TypeError, match="draw must be a callable"):
        nb.explorer(None, n=(2, 8))
    with pytest.raises(ValueError, match="at least one control"):
        nb.explorer(_draw)
    with pytest.raises(ValueError, match=r"initial names no control: \['m'\]"):
        nb.explorer(_draw, n=(2, 8), initial={"m": 3})
    with pytest.raises(TypeError, match="control 'n': give a widget"):
        nb.explorer(_draw, n="wide")
    with pytest.raises(ValueError, match="control 'name': the list of options is empty"):
        nb.explorer(_draw, name=[])


def test_colab_gets_the_widget_without_the_static_form(monkeypatch):
    import types

    box = nb.explorer(_draw, title="demo", n=(2, 8))
    monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
    bundle = box._repr_mimebundle_()
    assert "text/html" not in bundle
    assert "application/vnd.jupyter.widget-view+json" in bundle
