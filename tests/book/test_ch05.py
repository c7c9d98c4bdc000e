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


def test_head_parameters_give_back_a_kerple_read_back():
    """(r1, r2) read back from a bias table give the same table, and the formula past it."""
    from relbias.book import kerple_heads as kh

    r1, r2 = [0.3, 0.02, 1.2], [1.7, 0.05, 1.0]
    power = relbias.KerplePower(3, r1_init=r1, r2_init=r2)
    log = relbias.KerpleLog(3, r1_init=r1, r2_init=r2)
    for bias, form in ((power, "power"), (log, "log")):
        with torch.no_grad():
            table = bias.offset_table(0, 255).double()
            far = bias.offset_table(0, 2044)[:, [124, 508, 2044]].double()
        got1, got2 = kh.head_parameters(table, form)
        torch.testing.assert_close(got1, torch.tensor(r1, dtype=torch.float64), rtol=1e-4, atol=0)
        torch.testing.assert_close(got2, torch.tensor(r2, dtype=torch.float64), rtol=1e-4, atol=0)
        torch.testing.assert_close(
            kh.penalty_at(got1, got2, form, [124, 508, 2044]), -far, rtol=1e-4, atol=1e-6
        )
    with pytest.raises(ValueError, match="power"):
        kh.head_parameters(table, "cubic")


def test_formula_reach_is_the_first_offset_at_the_threshold():
    """The reach by formula agrees with scanning the penalty offset by offset."""
    from relbias.book import kerple_heads as kh

    heads = {"power": ([0.3, 0.02, 1.2, 6.0], [1.7, 0.8, 1.0, 0.5])}
    heads["log"] = ([2.0, 1.0, 4.0, 6.0], [0.5, 0.1, 1.0, 2.0])
    for form, (r1, r2) in heads.items():
        scan = kh.penalty_at(r1, r2, form, range(1, 5_001))
        want = [1 + int(torch.nonzero(row >= 5)[0]) for row in scan]
        assert kh.formula_reach(r1, r2, form) == want
    assert kh.formula_reach([0.1], [1.0], "power") == [50]
    assert kh.formula_reach([0.02], [0.05], "power")[0] > 10**40  # far, and no scan needed
    with pytest.raises(ValueError, match="power"):
        kh.formula_reach([0.1], [1.0], "cubic")


def test_reach_moves_compare_each_trained_head_with_its_start(monkeypatch):
    """+1 farther, -1 nearer, 0 the same offset: each head against its own start."""
    from relbias.book import kerple_heads as kh

    start = {"0": (torch.tensor([0.5, 0.5, 0.5]), torch.tensor([1.0, 1.0, 1.0]))}
    trained = {"0": (torch.tensor([0.25, 1.0, 0.5]), torch.tensor([1.0, 1.0, 1.0]))}
    monkeypatch.setattr(kh, "initial_parameters", lambda results, method: start)
    monkeypatch.setattr(kh, "stored_heads", lambda results, method: trained)
    assert kh.reach_moves({}, "kerple_power") == [1, -1, 0]  # reach 20, 5, 10 against 10


def test_stored_heads_refuses_a_read_back_of_another_form():
    from relbias.book import kerple_heads as kh

    with torch.no_grad():
        values = relbias.KerpleLog(2, r1_init=[1.0, 2.0], r2_init=[0.5, 0.1]).offset_table(0, 63)
    results = {
        "methods": {"kerple_power": {"seeds": {"0": {"learned_bias": {"values": values.tolist()}}}}}
    }
    with pytest.raises(ValueError, match="not a power-form bias"):
        kh.stored_heads(results, "kerple_power")
    results["methods"]["kerple_log"] = results["methods"].pop("kerple_power")
    r1, r2 = kh.stored_heads(results, "kerple_log")["0"]
    torch.testing.assert_close(r2, torch.tensor([0.5, 0.1], dtype=torch.float64), rtol=1e-4, atol=0)


def test_penalty_table_and_plot():
    from relbias.book import kerple_heads as kh

    pen = {
        "kerple_power": {"0": torch.tensor([[0.05, 0.06], [100.0, 900.0]])},
        "kerple_log": {"0": torch.tensor([[1.0, 2.0], [3.0, 4.0]])},
        "alibi": {"0": torch.tensor([[8.0, 32.0]])},
    }
    rows = kh.penalty_table(pen, {"0": 0})
    assert rows[0] == ["power: each model's flattest head", "0.05 to 0.05", "0.06 to 0.06"]
    assert rows[1][1:] == ["100 to 100", "900 to 900"] and rows[2][1:] == ["1 to 3", "2 to 4"]
    heads = {
        "power form": ("power", {"0": (torch.tensor([0.1]), torch.tensor([1.5]))}),
        "ALiBi": ("power", {"every seed": (torch.tensor([0.25]), torch.tensor([1.0]))}),
    }
    fig = kh.plot_penalties(heads, (124, 508), trained=128, level=5)
    assert len(fig.axes) == 2 and [t.get_text() for t in fig.legends[0].get_texts()] == [
        "seed 0",
        "every seed",
    ]


def test_show_difference_keeps_the_sign_of_an_end_near_zero():
    """An end that would print as 0.000 shows its sign and the digits it needs."""
    from relbias.book import kerple_heads as kh

    assert kh.show_difference({"mean": -0.0569, "low": -0.1138, "high": 0.0001}) == (
        "-0.057 [-0.114, +0.0001]"
    )
    assert kh.show_difference({"mean": -0.0155, "low": -0.031, "high": -0.00004}) == (
        "-0.015 [-0.031, -0.00004]"
    )
    assert kh.show_difference({"mean": 0.5, "low": 0.25, "high": 0.75}, 2) == "0.50 [0.25, 0.75]"
    assert kh.show_difference({"mean": 0.0, "low": math.nan, "high": math.nan}) == (
        "0.000 (one seed)"
    )
