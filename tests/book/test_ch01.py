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


# --- chapter 1's readings of trained models (relbias.book.introduction) ---------------------


def _tiny(position="alibi", train_len=8):
    from relbias.lab.model import TinyLM

    torch.manual_seed(0)
    return TinyLM(256, dim=16, depth=2, heads=4, position=position, train_len=train_len)


def test_far_attention_share_is_a_weight_per_layer_and_head():
    from relbias.book.introduction import far_attention_share

    model = _tiny()
    idx = torch.randint(0, 256, (2, 32))
    share = far_attention_share(model, idx, 8)
    assert share.shape == (2, 4)
    assert bool(((share >= 0) & (share <= 1)).all())
    # ALiBi's steepest head (slope 1/4) gives keys 8 or more back almost nothing, its
    # flattest (1/256) a good part of its weight
    assert float(share[:, 0].max()) < 0.2 and float(share[:, -1].min()) > 0.3
    with pytest.raises(ValueError, match="length"):
        far_attention_share(model, idx[:, :8], 8)


def test_far_attention_share_matches_a_hand_computation():
    from relbias.book.introduction import far_attention_share

    model = _tiny(position="nope")
    model.blocks = model.blocks[:1]  # one layer: its input is the embedding's LayerNorm
    idx = torch.randint(0, 256, (1, 12))
    share = far_attention_share(model, idx, 4)
    with torch.no_grad():
        block = model.blocks[0]
        h = block.norm1(model.embed(idx))
        q, k, _ = block.attn.qkv(h).view(1, 12, 3, 4, 4).permute(2, 0, 3, 1, 4)
        scores = q @ k.transpose(-2, -1) / 2 + torch.full((12, 12), float("-inf")).triu(1)
        alpha = scores.softmax(-1)[0]  # [heads, 12, 12]
        far = (torch.arange(12)[:, None] - torch.arange(12)[None, :]) >= 4
        expect = (alpha * far).sum(-1)[:, 4:].mean(-1)
    torch.testing.assert_close(share[0], expect)


def test_held_out_windows_and_the_library_number_label():
    from relbias.book.introduction import LIBRARY_NUMBER, held_out_windows, label_library_number

    windows = held_out_windows(torch.arange(100), 3, 20)
    assert windows.shape == (3, 20) and windows[1, 0] == 20
    with pytest.raises(ValueError, match="need more"):
        held_out_windows(torch.arange(10), 2, 8)
    fig = plot_bias_gallery(_gallery_biases(), q_len=6)
    label_library_number(fig)
    assert fig.axes[-1].get_ylabel().startswith(LIBRARY_NUMBER) and "√d" in LIBRARY_NUMBER
    from relbias.book.plots import plot_bias_by_offset

    fig = plot_bias_by_offset(relbias.ALiBi(2), 8)
    label_library_number(fig, what="y axis")
    assert fig.axes[0].get_ylabel() == LIBRARY_NUMBER
    with pytest.raises(ValueError, match="what"):
        label_library_number(fig, what="title")


def test_uniform_far_share_by_hand_and_as_a_model_with_flat_scores_reads_it():
    from relbias.book.introduction import far_attention_share, uniform_far_share

    # queries 2 and 3 of a 4-byte window: 1 of 3 and 2 of 4 keys at least 2 back
    assert abs(uniform_far_share(4, 2) - (1 / 3 + 2 / 4) / 2) < 1e-12
    with pytest.raises(ValueError, match="train_len"):
        uniform_far_share(4, 4)
    model = _tiny(position="nope")
    for block in model.blocks:  # zero queries: every score equal, attention uniform
        with torch.no_grad():
            block.attn.qkv.weight[:16].zero_()
            if block.attn.qkv.bias is not None:
                block.attn.qkv.bias[:16].zero_()
    share = far_attention_share(model, torch.randint(0, 256, (1, 24)), 8)
    torch.testing.assert_close(share, torch.full_like(share, uniform_far_share(24, 8)))


def test_context_readings_join_only_the_two_readings_of_the_same_bytes():
    from relbias.book.introduction import plot_context_readings

    readings = {"m": {"within": [2.0, 2.1], "long": [1.9, 2.0], "sliding": [1.8, 1.9]}}
    fig = plot_context_readings(readings, train_len=128)
    (ax,) = fig.axes
    lines = ax.get_lines()
    assert len(lines) == 2  # one per seed
    for line, long, sliding in zip(lines, readings["m"]["long"], readings["m"]["sliding"]):
        assert list(line.get_xdata()) == [1, 2]  # the first point (other bytes) not joined
        assert list(line.get_ydata()) == [long, sliding]
    assert "first 128" in ax.get_xticklabels()[0].get_text()
