"""The helpers of the chapter on ALiBi and Sandwich (book/04): figures whose legends hide
no data."""

from __future__ import annotations

import torch
from conftest import legends_off_the_panels

import relbias
from relbias.book import figures as fg
from relbias.book import plots
from relbias.lab.results import describe


def test_alibi_slopes_figure_keeps_legends_off_the_panels_and_draws_every_count():
    fig = fg.plot_alibi_slopes(head_counts=(4, 6, 8, 12, 16))
    assert legends_off_the_panels(fig)
    right = fig.axes[1]
    # one row per head count: every slope of every count is a point of its own row
    points = {}
    for line in right.get_lines():
        xs, ys = line.get_data()
        for x, y in zip(xs, ys):
            points.setdefault(int(y), []).append(float(x))
    for row, n in enumerate((4, 6, 8, 12, 16)):
        assert sorted(points[row]) == sorted(relbias.alibi_slopes(n).tolist())


def test_recency_weights_label_each_head_with_its_reach():
    slopes = relbias.alibi_slopes(8)
    fig = fg.plot_recency_weights({"paper": slopes}, 64)
    spans = fg.attention_span(slopes, 64)
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels == [f"k={k + 1}: 90 % in {s} keys" for k, s in enumerate(spans)]
    assert legends_off_the_panels(fig)


def test_legend_below_moves_every_legend_off_the_panels():
    fig = plots.plot_bias_by_offset(
        {"a": relbias.Sandwich(4, dim=16), "b": relbias.ALiBi(4)},
        64,
        reference={"ALiBi": relbias.ALiBi(2)},
    )
    assert fig.axes[0].get_legend() is not None
    assert fg.legend_below(fig, ncol=5) is fig
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert [t.get_text() for t in fig.legends[0].get_texts()] == [
        "ALiBi",
        "head 0",
        "head 1",
        "head 2",
        "head 3",
    ]
    assert legends_off_the_panels(fig)


def test_legend_below_each_keeps_one_legend_per_panel():
    fig, axes = plots.figure(6, 3, ncols=2)
    for ax, name in zip(axes.flat, ("x", "y")):
        ax.plot(torch.arange(5), torch.arange(5), label=f"{name} line")
        ax.legend()
    fg.legend_below(fig, each=True)
    assert not fig.legends
    assert [ax.get_legend().get_texts()[0].get_text() for ax in axes.flat] == ["x line", "y line"]
    assert legends_off_the_panels(fig)


def test_describe_reads_a_probe_ablation():
    """An ablation on the recall probe has no text bytes: describe gives its probe fields."""
    config = {"steps": 3000, "train_len": 128, "probe_steps": 3000}
    rows = [{"length": 128, "distance": 3, "accuracy": 0.8, "samples": 100}]
    results = {
        "kind": "ablation",
        "ablation": "alibi_probe",
        "seeds": [0, 1, 2],
        "methods": {"alibi": {"eval": rows}},
        "provenance": {"config": config, "commit": "abcdef0123", "wall_s": 600},
    }
    info = describe(results)
    assert info["samples"] == 100 and info["probe_steps"] == 3000 and "eval_kb" not in info
