"""relbias.book.stored helpers of chapter 3: the T5 ablation's ``far_to_min`` table, the
climb of a read-back table's far end, and the figure that draws both."""

from __future__ import annotations

import matplotlib
import pytest
import torch

from relbias.book import stored
from relbias.lab.ablations import t5_details
from relbias.lab.training import Config, build_model

matplotlib.use("Agg")


def test_far_to_min_table_changes_only_the_buckets_past_the_minimum():
    table = [[0.0, 2.0, -1.0, -3.0, -2.0, -2.5], [1.0, -1.0, 0.5, -1.0, 3.0, 0.0]]
    assert stored.far_to_min_table(table) == [
        [0.0, 2.0, -1.0, -3.0, -3.0, -3.0],
        [1.0, -1.0, -1.0, -1.0, -1.0, -1.0],  # the first of two equal minima
    ]
    monotone = [[3.0, 2.0, 1.0]]
    assert stored.far_to_min_table(monotone) == monotone  # nothing past the minimum


def test_far_to_min_table_is_the_ablations_intervention():
    """The same table as relbias.lab.ablations.t5_details evaluates (it keeps the model's
    own table and reports how many entries it changed)."""
    config = Config(dim=16, depth=1, heads=2, train_len=16, eval_factors=(1,), eval_tokens=256)
    model = build_model("t5", config, bias_kwargs={"num_buckets": 8, "max_distance": 16})
    bias = model.bias_modules()[0]
    torch.manual_seed(0)
    with torch.no_grad():
        bias.weight.normal_()
    table = bias.weight.detach().tolist()
    changed = stored.far_to_min_table(table)
    expected = sum(a != b for r, c in zip(table, changed) for a, b in zip(r, c))

    class Corpus:
        val = torch.randint(0, 256, (4096,), generator=torch.Generator().manual_seed(1))

    details = t5_details(model, config, Corpus(), factors=(1,))
    assert details["interventions"]["far_to_min"]["changed"] == expected
    assert bias.weight.detach().tolist() == table  # restored


def test_edge_above_min_reads_the_farthest_offset():
    rows = [[0.0, -2.0, -1.0, -1.5], [0.0, -1.0, -2.0, -3.0]]
    res = {
        "provenance": {"config": {"train_len": 2}},
        "methods": {"t5": {"seeds": {"0": {"learned_bias": {"values": rows}}}}},
    }
    far = stored.edge_above_min(res, "t5", -1)
    assert far["values"] == [pytest.approx(0.5), 0.0] and far["above"] == 1
    assert far["below_max"] == (-3.0, -1.5)
    edge = stored.edge_above_min(res, "t5")  # default: offset m_l - 1 = 1
    assert edge["values"] == [0.0, 0.0] and edge["above"] == 0


def test_plot_t5_far_end_draws_both_runs_and_a_full_legend():
    spec = {"num_buckets": 4, "dist_max": 5}
    short = {
        "provenance": {"config": {"train_len": 4, "steps": 3000}},
        "methods": {
            "t5_small": {
                "variant": spec,
                "seeds": {"0": {"bucket_table": [[0.0, 1.0, -2.0, -1.0], [0.0, -1.0, 0.5, 0.0]]}},
            }
        },
    }
    longer = {
        "provenance": {"config": {"train_len": 4, "steps": 15000}},
        "methods": {"t5": {"seeds": {"0": {"learned_bias": {"values": [[0.0] * 8, [1.0] * 8]}}}}},
    }
    fig = stored.plot_t5_far_end(short, longer, variant="t5_small")
    left, right = fig.axes
    assert len(left.get_lines()) == 2 * 2 + 1 and len(right.get_lines()) == 2 + 1
    assert left.get_title() == "3,000 steps, seed 0" and "bytes" in left.get_xlabel()
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == ["head 0", "head 1", "as trained", "far buckets set to the minimum"]
