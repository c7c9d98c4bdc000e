"""Chapter 7's helpers: the setting box with the interpolation experiment
(relbias.book.setting.interpolation_words, setting_text_with)."""

from __future__ import annotations

import pytest

from relbias.book import setting
from relbias.lab.config import get_config


def _interpolation(train_len=64, steps=1000, seeds=(0, 1, 2), finetune=(25, 50, 100)):
    return {
        "provenance": {"config": {"train_len": train_len, "steps": steps}},
        "setup": {
            "seeds": list(seeds),
            "finetune_steps": list(finetune),
            "finetune_length": 4 * train_len,
        },
    }


def test_interpolation_words_name_the_training_and_the_fine_tuning():
    words = setting.interpolation_words(_interpolation())
    assert words == (
        "the interpolation experiment ($m_l$ = 64 bytes, 1,000 steps, 3 seeds, fine-tuned "
        "25, 50, 100 steps at 256 bytes)"
    )


def test_setting_text_with_adds_the_runs_after_the_stored_sweeps():
    config = get_config("quick")
    plain = setting.setting_text(config, ("extrapolation_15000",))
    # nothing more: the box setting_text gives
    assert setting.setting_text_with(config, ("extrapolation_15000",)) == plain
    more = setting.interpolation_words(_interpolation())
    text = setting.setting_text_with(config, ("extrapolation_15000",), more=[more])
    runs = next(line for line in text.splitlines() if line.startswith("- **The runs**"))
    assert runs.endswith(f" and {more}. {{ref}}`Chapter 1 <sec-setting>` says more.")
    assert "the medium sweep trained longer" in runs
    # every other line of the box is setting_text's
    assert [x for x in text.splitlines() if "**The runs**" not in x] == [
        x for x in plain.splitlines() if "**The runs**" not in x
    ]


def test_setting_text_with_needs_a_stored_sweep():
    with pytest.raises(ValueError, match="findings must name"):
        setting.setting_text_with(get_config("quick"), (), more=["x"])
