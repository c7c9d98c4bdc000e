"""scripts/hf_bench.py: RoPE is timed beside each family, alternating, and a ratio is the
median of the per-repeat ratios."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("hf_bench", ROOT / "scripts" / "hf_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_rope_and_the_family_alternate_after_one_warm_up_each():
    bench = load_script()
    calls = []
    rope_t, fam_t = bench.paired_seconds(
        lambda: calls.append("rope"), lambda: calls.append("family"), 3
    )
    assert calls == ["rope", "family"] + ["rope", "family", "family", "rope", "rope", "family"]
    assert len(rope_t) == len(fam_t) == 3 and all(t >= 0 for t in rope_t + fam_t)


@pytest.mark.parametrize("repeats", [0, -2])
def test_no_repeats_is_refused_by_name(repeats):
    bench = load_script()
    with pytest.raises(ValueError, match="repeats must be >= 1"):
        bench.paired_seconds(lambda: None, lambda: None, repeats)


def test_a_ratio_is_the_median_of_the_per_repeat_ratios():
    bench = load_script()
    # RoPE drifts 1 -> 4 s while the family stays 1.5x it: the ratio of medians (2.25 / 1.5)
    # is not what a repeat shows; the median of per-repeat ratios is.
    row = bench.row_of({"decode": ([1.0, 2.0, 4.0], [1.5, 3.0, 6.0])})
    assert row["decode_ratio"] == pytest.approx(1.5)
    assert row["decode_ratios"] == pytest.approx([1.5, 1.5, 1.5])
    assert row["decode_s"] == 3.0 and row["rope_decode_s"] == 2.0


def test_a_tiny_run_writes_every_family_beside_rope(tmp_path):
    bench = load_script()
    out = tmp_path / "bench.json"
    result = bench.main(
        ["--families", "alibi", "--repeats", "1", "--hidden", "32", "--layers", "1",
         "--heads", "2", "--kv-heads", "1", "--batch", "1", "--train-len", "16",
         "--decode-len", "4", "--out", str(out)]
    )  # fmt: skip
    assert out.exists() and set(result["results"]) == {"rope", "alibi"}
    alibi = result["results"]["alibi"]
    assert alibi["train_step_ratio"] > 0 and len(alibi["decode_ratios"]) == 1
    assert "compiled_decode_ratio" not in alibi


def test_an_unknown_family_is_named():
    bench = load_script()
    with pytest.raises(SystemExit):
        bench.main(["--families", "rotary"])


def test_the_benchmarks_fire_takes_the_default_threshold():
    """Chapter 11's lab notes: the timed FIRE keeps its default L (512 positions), which a
    512-token decode after a 16-token prompt passes only in its last steps."""
    import relbias

    assert load_script().FAMILIES["fire"] == {}
    assert float(relbias.FIRE(4).L.detach()) == 512
