"""Chapter 3's helpers: the climb of a read-back table's far end, and the figure that draws both."""

from __future__ import annotations

import matplotlib
import pytest

from relbias.book import figures as fg
from relbias.lab import readback

matplotlib.use("Agg")


def test_edge_above_min_reads_the_farthest_offset():
    rows = [[0.0, -2.0, -1.0, -1.5], [0.0, -1.0, -2.0, -3.0]]
    res = {
        "provenance": {"config": {"train_len": 2}},
        "methods": {"t5": {"seeds": {"0": {"learned_bias": {"values": rows}}}}},
    }
    far = readback.edge_above_min(res, "t5", -1)
    assert far["values"] == [pytest.approx(0.5), 0.0] and far["above"] == 1
    assert far["below_max"] == (-3.0, -1.5)
    edge = readback.edge_above_min(res, "t5")  # default: offset m_l - 1 = 1
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
    fig = fg.plot_t5_far_end(short, longer, variant="t5_small")
    left, right = fig.axes
    assert len(left.get_lines()) == 2 * 2 + 1 and len(right.get_lines()) == 2 + 1
    assert left.get_title() == "3,000 steps, seed 0" and "bytes" in left.get_xlabel()
    names = [t.get_text() for t in fig.legends[0].get_texts()]
    assert names == ["head 0", "head 1", "as trained", "far buckets set to the minimum"]


def test_exact_bucket_is_the_reference_away_from_whole_logarithms():
    import torch

    from relbias import t5_bucket
    from relbias.book import t5_buckets as tb

    offsets = torch.arange(0, 1025)
    for n_b, dist_max in ((31, 128), (3, 5), (15, 256)):
        ref = t5_bucket(offsets, num_buckets=n_b + 1, max_distance=dist_max, bidirectional=False)
        exact = tb.exact_bucket(offsets, n_b, dist_max)
        off = (exact != ref).nonzero().flatten().tolist()
        assert all(tb.whole_at(o, n_b, dist_max) for o in off)
    # n_b = 31, dist_max = 256, offset 64: the scaled logarithm is exactly 8
    assert tb.whole_at(64, 31, 256) and not tb.whole_at(65, 31, 256)
    assert int(tb.exact_bucket(torch.tensor([64]), 31, 256)) == 24
    assert tb.literal_bucket(64, 31, 256) == 23  # double precision lands a hair below 8
    assert tb.literal_bucket(20, 32, 1024) == 16.5  # even n_b: no parameter


def test_bucket_sides_leave_the_first_future_bucket_unused():
    from relbias.book import t5_buckets as tb

    sides = tb.bucket_sides(num_buckets=32, max_distance=128)
    assert sides["unused"] == [16]
    assert sides["past"]["own"] == list(range(8))
    assert sides["future"]["own"] == [-1, -2, -3, -4, -5, -6, -7]
    check = tb.formula_against_reference([31], [128])
    assert check["configurations"] == 1 and not check["literal_off"] and not check["exact_off"]


def test_lab_setting_text_names_a_sweep_with_no_words_of_its_own():
    from relbias.book import t5_buckets as tb

    box = tb.lab_setting_text(("extrapolation", ("t5_far", "the far-end ablation of T5")))
    assert "the far-end ablation of T5 (`t5_far`: $m_l$ = 128 bytes, 3,000 steps, 3 seeds)" in box
    assert box.count("3,000 steps") == 2 and "t5_far ($m_l$" not in box
