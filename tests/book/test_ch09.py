"""The helpers chapter 9 (the forget gate) adds: the numerical trap of a float32 F."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from relbias.book import forgetting


def _gates(n: int, rate: float, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (-2 * rate * torch.rand(n, generator=generator)).float()


def test_float32_cumulative_rounds_after_every_addition():
    log_f = _gates(5000, 2.0)
    summed = forgetting.float32_cumulative(log_f)
    assert summed.dtype == torch.float32 and summed.shape == log_f.shape
    running = np.float32(0)
    for k, value in enumerate(log_f.numpy()):
        running = np.float32(running + value)
        if k in (0, 1, 999, 4999):
            assert summed[k].item() == running
    # and it is not the float64 sum rounded once
    exact = torch.cumsum(log_f.double(), 0)
    assert (summed.double() - exact).abs().max() > (exact.float().double() - exact).abs().max()


def test_trap_errors_ways_and_their_order():
    log_f = _gates(20000, 2.5)
    offsets = [1, 16, 256, 4096]
    errors = forgetting.trap_errors(log_f, offsets, queries=64)
    assert set(errors) == set(forgetting.TRAP_WAYS)
    assert all(len(v) == len(offsets) for v in errors.values())
    # the float32 sum's error grows with the offset; the split is float32's rounding near the
    # diagonal; an exactly summed F stored in float32 is off by about an ulp of F
    assert errors["float32 sum"][-1] > 10 * errors["float32 sum"][0]
    assert errors["split"][0] <= errors["rounding"][0] + 1e-12
    assert errors["float32 F"][0] > 100 * errors["split"][0]
    assert errors["float32 F"][0] <= 2.0 ** (math.floor(math.log2(2.5 * 20000)) - 23)
    # the same draw for the same seed
    assert forgetting.trap_errors(log_f, offsets, queries=64) == errors
    with pytest.raises(ValueError):
        forgetting.trap_errors(log_f, [20000])


def test_first_query_off_by_comes_sooner_for_faster_gates():
    fast = _gates(40000, 2.5)
    slow = fast * (0.1 / 2.5)
    first_fast = forgetting.first_query_off_by(fast, 1e-3)
    first_slow = forgetting.first_query_off_by(slow, 1e-3)
    assert first_fast is not None and first_fast > 0
    assert first_slow is None or first_slow > first_fast
    assert forgetting.first_query_off_by(fast, 1e9) is None
    # the position found is one whose nearest keys are off by more than the threshold
    summed = forgetting.float32_cumulative(fast).double()
    exact = torch.cumsum(fast.double(), 0)
    i = first_fast
    worst = max(
        abs(float((summed[i] - summed[i - d]) - (exact[i] - exact[i - d])))
        for d in range(1, min(64, i) + 1)
    )
    assert worst > 1e-3


def test_plot_trap_errors_has_one_panel_per_entry_and_a_legend_below():
    log_f = _gates(3000, 1.0)
    offsets = [1, 4, 64]
    panels = {
        "a": forgetting.trap_errors(log_f, offsets),
        "b": forgetting.trap_errors(log_f / 10, offsets),
    }
    fig = forgetting.plot_trap_errors(offsets, panels)
    axes = fig.get_axes()
    assert len(axes) == 2 and [ax.get_title() for ax in axes] == ["a", "b"]
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    assert len(axes[0].get_lines()) == len(forgetting.TRAP_WAYS)


def _stored_sweep():
    """A sweep record holding two seeds' gate read-back (2 layers, 2 heads)."""

    def gate(shift):
        quantiles = {
            q: [[-2.0 + shift + d, -1.0 + d], [-0.5 + d, -3.0 + d]]
            for q, d in (("0.1", -1.0), ("0.5", 0.0), ("0.9", 0.5))
        }
        mean = [[-2.0 + shift, -1.0], [-0.5, -3.0]]
        return {"tokens": 64, "mean_log_forget": mean, "log_forget_quantiles": quantiles}

    seeds = {"1": {"learned_gate": gate(0.5)}, "0": {"learned_gate": gate(0.0)}}
    return {"methods": {"forgetting": {"seeds": seeds}}}


def test_stored_gate_heads_reads_every_head_in_order():
    heads = forgetting.stored_gate_heads(_stored_sweep())
    assert [(h["seed"], h["layer"], h["head"]) for h in heads][:3] == [
        ("0", 0, 0),
        ("0", 0, 1),
        ("0", 1, 0),
    ]
    assert len(heads) == 8 and heads[4]["seed"] == "1"
    first = heads[0]
    assert (first["q10"], first["q50"], first["q90"]) == (-3.0, -2.0, -1.5)
    assert math.isclose(first["half_life"], math.log(2) / 2.0)
    record = _stored_sweep()
    del record["methods"]["forgetting"]["seeds"]["0"]["learned_gate"]
    with pytest.raises(ValueError):
        forgetting.stored_gate_heads(record)


def test_plot_stored_gates_draws_every_head():
    fig = forgetting.plot_stored_gates(_stored_sweep())
    (ax,) = fig.get_axes()
    assert len(ax.get_xticks()) == 8 and ax.get_legend() is not None


def test_plot_gate_readback_left_panel_is_the_half_life():
    log_f = -torch.rand(2, 4, 100, generator=torch.Generator().manual_seed(0)) - 0.1
    byte_ids = torch.randint(32, 127, (100,), generator=torch.Generator().manual_seed(1))
    fig = forgetting.plot_gate_readback(log_f, byte_ids, 0, 1)
    left = fig.get_axes()[0]
    assert "half-life" in left.get_title() and "rate" not in left.get_title()
    assert left.get_ylabel() == "half-life (tokens)"
    heights = [bar.get_height() for bar in left.patches]
    expected = (math.log(2) / -log_f.double().mean(dim=-1)).flatten().tolist()
    assert np.allclose(heights, expected)


def test_plot_gate_row_names_alibis_slope_m_after_the_scaling():
    import matplotlib.pyplot as plt

    fig = forgetting.plot_gate_row(torch.full((16,), -0.1, dtype=torch.float64), 0.1, reset_at=8)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == ["forget gate", "ALiBi, m = 0.1"]
    assert fig.axes[1].get_ylabel() == "content-free attention"
    plt.close(fig)


def test_unpaired_accuracy_compares_each_sides_interval_with_the_probe_error():
    from relbias.lab import readings, stats
    from relbias.lab.results import combine, load_stored, renamed

    probe = combine(
        load_stored("retrieval"),
        renamed(load_stored("forgetting_retrieval_init5"), {"forgetting": "forgetting_b5"}),
        same_seeds=False,
    )
    long = readings.probe_lengths(probe)[-1]
    v = forgetting.unpaired_accuracy(probe, "forgetting_b5", "nope", long)
    a, samples, d = readings.seed_accuracies(probe, "forgetting_b5", long, None)
    b, _, _ = readings.seed_accuracies(probe, "nope", long, None)
    assert v["paired"] is False and v["distance"] == d and len(a) == 6 and len(b) == 3
    assert v["answer"] == stats.verdict(a, b, paired=False)["answer"] == "lower"
    error = math.hypot(stats.probe_error(a, samples), stats.probe_error(b, samples))
    assert v["error"] == pytest.approx(error)
