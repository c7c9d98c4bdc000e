"""The helpers of the chapter on Kerple (book/05)."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import legends_off_the_panels

import relbias
from relbias.book import figures as fg


def test_kerple_settings_hold_exactly_the_values_given():
    """A setting below the default floor (1e-2) is not clamped to another curve."""
    biases = fg.kerple_settings_biases({"power": [(0.002, 2.0), (0.5, 0.5)], "log": [(4.0, 10.0)]})
    tiny = biases["power"][(0.002, 2.0)]
    assert isinstance(tiny, relbias.KerplePower) and isinstance(
        biases["log"][(4.0, 10.0)], relbias.KerpleLog
    )
    with torch.no_grad():
        table = tiny.offset_table(0, 100)[0]
        log_table = biases["log"][(4.0, 10.0)].offset_table(0, 3)[0]
    torch.testing.assert_close(table, -0.002 * torch.arange(101.0) ** 2)
    torch.testing.assert_close(log_table, -4.0 * torch.log1p(10.0 * torch.arange(4.0)))
    with pytest.raises(ValueError, match="power"):
        fg.kerple_settings_biases({"cubic": [(1.0, 1.0)]})


def test_plot_kerple_settings_labels_each_setting_and_keeps_legends_off():
    settings = {"power": [(0.5, 0.5), (0.002, 2.0)], "log": [(1.0, 0.1)]}
    fig = fg.plot_kerple_settings(settings, 64, reference={"ALiBi": relbias.ALiBi(2)})
    assert len(fig.axes) == 2
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["ALiBi", "$r_1 = 0.5$, $r_2 = 0.5$", "$r_1 = 0.002$, $r_2 = 2$"]
    # the drawn curve is the setting's own: -0.002 * 64^2 at the last offset
    ys = fig.axes[0].get_lines()[-1].get_ydata()
    assert math.isclose(float(ys[-1]), -0.002 * 64**2, rel_tol=1e-5)
    assert legends_off_the_panels(fig)
