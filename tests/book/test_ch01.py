"""Chapter 1's library changes: the bias gallery compares its panels on one colour scale;
the context-use measure's figure draws both readings of the same bytes."""

from __future__ import annotations

import matplotlib
import pytest
import torch

import relbias
from relbias.book.context import plot_context_reading, running_mean
from relbias.book.plots import plot_bias_gallery

matplotlib.use("Agg")


def _gallery_biases():
    small = torch.full((2, 6, 6), -0.05) + 0.004 * torch.randn(2, 6, 6)  # FIRE-like, nearly flat
    return {"alibi": relbias.ALiBi(2), "small": small}


def _images(fig):
    return [im for ax in fig.axes for im in ax.get_images()]


def test_gallery_shares_one_colour_scale_and_one_bar():
    fig = plot_bias_gallery(_gallery_biases(), q_len=6)
    images = _images(fig)
    assert len(images) == 2
    limits = {im.get_clim() for im in images}
    assert len(limits) == 1, "every panel on the same colour scale"
    low, high = limits.pop()
    # the scale spans both panels: ALiBi's deepest penalty (slope 1/16 for 2 heads, offset 5)
    assert low == -5 / 16 and high >= -0.06
    # one colour bar for the whole figure (its own axes), not one per panel
    assert len(fig.axes) == 2 + 1
    # each title gives the panel's range, so a nearly flat panel says so
    titles = [ax.get_title() for ax in fig.axes[:2]]
    assert titles[0] == "alibi\n-0.312 to 0"


def test_gallery_separate_scales_keep_a_bar_per_panel():
    fig = plot_bias_gallery(_gallery_biases(), q_len=6, shared=False)
    images = _images(fig)
    assert len({im.get_clim() for im in images}) == 2
    assert len(fig.axes) == 2 + 2
    flat = images[1].get_clim()
    assert flat[1] - flat[0] < 0.1  # the small panel on its own (narrow) scale


def test_gallery_blanks_future_keys_and_accepts_the_library_families():
    torch.manual_seed(0)
    biases = {
        name: relbias.make_bias(name, 4, **({"max_offset": 7} if name == "offset" else {}))
        for name in relbias.BIAS_NAMES
    }
    fig = plot_bias_gallery(biases, q_len=8)
    array = _images(fig)[0].get_array()
    assert array.mask[0, 1] or not (array[0, 1] == array[0, 1])  # j > i is blank (NaN)
    assert len(_images(fig)) == len(relbias.BIAS_NAMES)


def _row(long, sliding, window):
    return {
        "loss_by_position": long,
        "context": {"window": window, "sliding_loss_by_position": sliding},
    }


def test_running_mean_averages_consecutive_values_and_checks_its_window():
    assert running_mean([1.0, 2.0, 3.0, 4.0], 2).tolist() == [1.5, 2.5, 3.5]
    assert running_mean([1.0, 2.0], 1).tolist() == [1.0, 2.0]
    for bad in (0, 3, True):
        with pytest.raises(ValueError, match="window"):
            running_mean([1.0, 2.0], bad)


def test_context_reading_draws_both_readings_per_model_and_the_training_length():
    long, sliding = [2.0] * 4 + [4.0] * 12, [2.0] * 16
    fig = plot_context_reading(
        {"breaks": _row(long, sliding, 4), "holds": _row(sliding, sliding, 4)}, window=2
    )
    left, right = fig.axes
    assert left.get_title() == "breaks" and "bytes" in left.get_xlabel()
    lines = [ln for ln in left.get_lines() if len(ln.get_xdata()) > 2]
    assert len(lines) == 2  # the whole window and the sliding one (plus the grey marker)
    whole, slid = (ln.get_ydata() for ln in lines)
    assert whole[-1] == 4.0 and slid[-1] == 2.0 and len(whole) == 15
    assert any(list(ln.get_xdata()) == [4, 4] for ln in left.get_lines())  # m_l marked
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == ["whole window", "sliding window of 4 bytes"]
    assert right.get_shared_y_axes().joined(left, right)


def test_context_reading_refuses_rows_without_the_measure():
    with pytest.raises(ValueError, match="no context-use measure"):
        plot_context_reading({"old": {"loss_by_position": [1.0, 2.0]}})
