"""relbias.book.sweeps.beside_stored: a chapter's live run beside the stored sweep (issue 30)."""

from __future__ import annotations

import pytest

from relbias.book import sweeps
from relbias.lab import get_config


def stored_sweep(config_name: str = "medium") -> dict:
    config = get_config(config_name)
    kept = {k: getattr(config, k) for k in sweeps.SAME_RUN}
    seeds = {
        str(s): {"eval": [{"factor": f, "bpb": 2.0 + s / 10} for f in (1, 4, 16)]}
        for s in (0, 1, 2)
    }
    rows = [
        {
            "factor": f,
            "length": f * config.train_len,
            "bpb": 2.1,
            "bpb_low": 2.0,
            "bpb_high": 2.2,
            "n": 3,
        }
        for f in (1, 4, 16)
    ]
    return {
        "kind": "extrapolation",
        "methods": {"alibi": {"eval": rows, "seeds": seeds}},
        "provenance": {"config": {"name": config_name, **kept}, "commit": "abc", "wall_s": 60},
    }


def test_a_live_run_of_the_stored_configuration_is_one_more_seed():
    table = sweeps.beside_stored(
        {
            "alibi": [
                {"factor": 1, "bpb": 2.05},
                {"factor": 2, "bpb": 2.0},
                {"factor": 16, "bpb": 2.3},
            ]
        },
        stored_sweep("medium"),
        get_config("medium"),
        display=False,
    )
    shown = table.markdown
    assert "the same configuration" in shown and "one more seed" in shown
    assert "2.10 [2.00, 2.20]" in shown and "2.05" in shown
    assert "2x" not in shown  # only the factors both hold


def test_a_quick_live_run_says_it_is_not_the_stored_configuration():
    table = sweeps.beside_stored(
        {"alibi": [{"factor": 1, "bpb": 1.8}]},
        stored_sweep("medium"),
        get_config("quick"),
        display=False,
    )
    shown = table.markdown
    assert "not the same configuration" in shown and "training length 64" in shown


def test_bad_input_names_what_is_allowed():
    with pytest.raises(ValueError, match="among the stored"):
        sweeps.beside_stored(
            {"rope": [{"factor": 1, "bpb": 2.0}]}, stored_sweep(), get_config("medium")
        )
    with pytest.raises(ValueError, match="share no factor"):
        sweeps.beside_stored(
            {"alibi": [{"factor": 3, "bpb": 2.0}]}, stored_sweep(), get_config("medium")
        )
