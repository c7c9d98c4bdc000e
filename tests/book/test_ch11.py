"""Chapter 11's helpers (relbias.book.retrofit) on the stored retrofit study."""

from __future__ import annotations

import statistics

import pytest

pytest.importorskip("transformers")

from relbias.book import retrofit as rf  # noqa: E402
from relbias.book import retrofit_tables as rt  # noqa: E402
from relbias.hf.retrofit import OPTIONS  # noqa: E402
from relbias.hf.retrofit_results import load_runs, option_rows, seeds_of  # noqa: E402
from relbias.hf.retrofit_study import FIRST_FOLDER  # noqa: E402


@pytest.fixture(scope="module")
def runs():
    return load_runs()


@pytest.fixture(scope="module")
def rows(runs):
    return option_rows(runs)


@pytest.fixture(scope="module")
def first_rows():
    """The first study's rows (its bases did not recall): stored curves whose words are known."""
    return option_rows(load_runs(FIRST_FOLDER))


def test_the_stored_study_has_every_option_on_every_base(runs):
    bases = seeds_of(runs, "base")
    assert len(bases) >= 3
    stored = {o for (o, _) in runs if o != "base"}
    assert stored <= set(OPTIONS)
    for option in stored:
        assert seeds_of(runs, option) == bases, option
    for record in runs.values():
        assert "+dirty" not in record["provenance"]["commit"]


def test_decision_table_has_one_row_per_option(rows, runs):
    table, headers = rf.decision_table(rows, train_len=runs[("base", 0)]["study"]["train_len"])
    options = {r["option"] for r in rows}
    assert len(table) == len(options)
    assert all(len(line) == len(headers) for line in table)
    assert {line[0] for line in table} == {rf.LABELS[o] for o in options}
    _, headers = rf.decision_table(rows, train_len=128, layers=4)
    assert headers[1] == "parameters added (total, 4 layers)"  # totals, not per layer
    assert not any("recovered" in cell for line in table for cell in line)  # not "none helped"


def test_tables_and_figures_of_the_lab_notes(rows, runs):
    for key in ("near_cost", "far_vs_control", "context_use"):
        table, headers = rf.paired_table(rows, key)
        assert len(table) == len({r["option"] for r in rows})
    table, headers = rf.curve_table(rows)
    assert headers[1] == "128 tokens"
    for task in ("recall", "latest"):
        table, headers = rf.probe_table(runs, task)
        assert table[0][0].startswith("base")
    options = sorted({r["option"] for r in rows})
    for fig in (
        rf.plot_curves(runs, options),
        rf.plot_recovery(runs, options),
        rf.plot_probe(runs, options),
        rf.plot_option(runs, options[0]),
    ):
        assert fig.axes
    setting, _ = rf.setting_rows(runs)
    share = rf.token_budget(runs[("base", seeds_of(runs, "base")[0])]["study"])["share"]
    assert any(f"{share:.1%}" in cell for row in setting for cell in row)
    assert any(name == "copy windows" and cell.startswith("100%") for name, cell in setting)
    provenance, _ = rf.provenance_rows(runs)
    assert len(provenance) == len(runs)


def test_base_path_is_the_repositorys_checkpoint():
    path = rf.base_path(0)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


def test_a_curve_is_read_whole(first_rows):
    """An "improves" that rises again at the edge says so (YaRN + ALiBi after the fine-tune);
    the words of a curve with nothing the other way are the verdict's, with the size of a
    fall that levels off."""
    table, _ = rf.curve_table(first_rows, "fine_tuned")
    words = {line[0]: line[-1] for line in table}
    assert words[rf.LABELS["yarn+alibi"]].startswith(
        'improves to 512 tokens, then higher past it, only "at the edge"'
    )
    assert words[rf.LABELS["alibi"]] == "improves by 0.003 bits to 256 tokens, then levels off"


def test_provenance_commands_are_code_and_keep_a_foreign_folder(runs):
    table, _ = rf.provenance_rows(runs)
    commands = [line[-1] for line in table]
    assert all(
        c.startswith("`python -m relbias.hf.retrofit_study") and c.endswith("`") for c in commands
    )
    assert not any("relbias/hf/results/retrofit" in c for c in commands)  # the default folder
    assert all(" --folder /" in c for c in commands)  # made outside the repository, then copied
    table, _ = rf.provenance_rows(load_runs(FIRST_FOLDER))
    for line in table:
        if line[0] == "dynamic_ntk":
            assert "--options dynamic_ntk --folder" in line[-1]


def test_setting_states_the_models_vocabulary(runs):
    setting, _ = rf.setting_rows(runs)
    tokenizer = next(cell for name, cell in setting if name == "tokenizer")
    assert f"{rf.base_vocab(0):,}" in tokenizer and rf.base_vocab(0) == 1025


def test_the_decision_table_speaks_of_a_rising_or_falling_loss(first_rows):
    """One vocabulary in the lesson's table: the loss "rises" or "falls" with length, and the
    context-use column says its unit and sign."""
    table, headers = rf.decision_table(first_rows, train_len=128, layers=4)
    words = {line[0]: line[3] for line in table}
    assert words[rf.LABELS["alibi"]] == "falls by 0.003 bits to 256 tokens, then levels off"
    assert words[rf.LABELS["yarn+alibi"]].startswith(
        'falls to 512 tokens, then higher past it, only "at the edge"'
    )
    assert not any("improves" in w or "degrades" in w for w in words.values())
    # where the rise starts comes from the verdicts: Kerple-log's 1,024 is above its 512 only at
    # the edge; 2,048 is the first length shown "higher" than a shorter one
    assert words[rf.LABELS["kerple_log"]] == "rises past 1024 tokens"
    assert words[rf.LABELS["linear"]] == "rises past 512 tokens"
    assert words[rf.LABELS["t5"]] == "rises"  # higher from the first length on
    assert "bits/token" in headers[5] and "above 0" in headers[5]


def _change(start, end, answer, mean):
    return {"start": start, "end": end, "answer": answer, "mean": mean}


def test_a_curves_fall_is_stated_only_as_far_as_the_verdicts_show_it(first_rows):
    """The lowest mean does not name the turn: a fall to 512 that is only "at the edge"
    (YaRN + ALiBi before the fine-tune) is stated to 256, where it is "lower"."""
    curve = {
        "answer": "improves",
        "changes": [
            _change(128, 256, "lower", -0.012),
            _change(128, 512, "at the edge", -0.016),
            _change(128, 1024, "cannot be told apart", 0.03),
            _change(256, 512, "cannot be told apart", -0.004),
            _change(256, 1024, "cannot be told apart", 0.04),
            _change(512, 1024, "at the edge", 0.05),
        ],
    }
    bits = {128: [2.0], 256: [1.99], 512: [1.98], 1024: [2.03]}  # lowest mean at 512
    assert (
        rt._curve_words(curve, bits)
        == 'improves to 256 tokens, then higher past 512 tokens, only "at the edge"'
    )
    curve["changes"][1]["answer"] = "lower"  # now the fall to 512 is shown
    assert (
        rt._curve_words(curve, bits)
        == 'improves to 512 tokens, then higher past it, only "at the edge"'
    )
    table, _ = rf.curve_table(first_rows, "zero_shot")
    words = {line[0]: line[-1] for line in table}
    assert words[rf.LABELS["yarn+alibi"]].startswith("improves to 256 tokens")
    # a degrading curve whose first fall is only at the edge: a dip, not a shown fall
    dipping = {
        "answer": "degrades",
        "changes": [
            _change(128, 256, "at the edge", -0.02),
            _change(128, 512, "cannot be told apart", 0.01),
            _change(256, 512, "cannot be told apart", 0.03),
            _change(512, 1024, "higher", 0.1),
            _change(128, 1024, "higher", 0.08),
            _change(256, 1024, "higher", 0.1),
        ],
    }
    said = rt._curve_words(dipping, {128: [2.0], 256: [1.98], 512: [2.01], 1024: [2.1]})
    assert said.endswith(', after a dip only "at the edge"') and "fall" not in said


def test_a_rise_is_stated_past_the_length_before_the_first_one_shown_higher(first_rows):
    """ "Degrades past N" names the length just before the first one the paired verdicts show
    "higher" than a shorter one: dynamic NTK before the fine-tune rises from 256 to 512
    ("higher") though 512 against 128 is only at the edge, so it degrades past 256."""
    changes = [
        _change(128, 256, "cannot be told apart", 0.01),
        _change(128, 512, "at the edge", 0.077),
        _change(128, 1024, "higher", 0.26),
        _change(256, 512, "higher", 0.066),
        _change(256, 1024, "higher", 0.25),
        _change(512, 1024, "higher", 0.19),
    ]
    assert rt._rise_start(changes) == " past 256 tokens"
    changes[3]["answer"] = "cannot be told apart"  # now 1,024 is the first shown higher
    assert rt._rise_start(changes) == " past 512 tokens"
    changes[0]["answer"] = "higher"  # higher from the first length on
    assert rt._rise_start(changes) == ""
    table, _ = rf.curve_table(first_rows, "zero_shot")
    words = {line[0]: line[-1] for line in table}
    assert words[rf.LABELS["dynamic_ntk"]] == "degrades past 256 tokens"
    assert words[rf.LABELS["linear"]] == words[rf.LABELS["yarn"]] == "degrades past 512 tokens"


def test_a_curve_that_levels_off_says_how_far_it_fell_first(first_rows):
    """ "Falls, then levels off" alone reads like a real fall: the words name its size, from
    the first length to where it levelled off (ALiBi's, after the fine-tune, is tiny)."""
    curve = {"answer": "improves, then levels off", "levels_from": 256, "changes": []}
    bits = {128: [2.0, 2.2], 256: [1.9, 2.1], 512: [1.9, 2.1], 1024: [1.91, 2.09]}
    assert rt._curve_words(curve, bits) == "improves by 0.100 bits to 256 tokens, then levels off"
    assert rt._plain_curve_words(curve, bits).startswith("falls by 0.100 bits to 256")
    alibi = rf.row_of(first_rows, "alibi", "fine_tuned")
    said = rt._curve_words(alibi["curve"], alibi["bits"])
    first, level = min(alibi["bits"]), alibi["curve"]["levels_from"]
    fall = statistics.fmean(alibi["bits"][first]) - statistics.fmean(alibi["bits"][level])
    assert said == f"improves by {fall:.3f} bits to {level} tokens, then levels off"
    assert 0 < fall < 0.01  # tiny, and now said so


def test_the_probe_columns_read_each_distance_range_against_its_level(rows):
    """The decision table's probe cells: each range's pooled accuracy, with a word only where
    the verdict against the probe's level is shown; the range table gives every verdict."""
    table, headers = rf.decision_table(rows, train_len=128, layers=4)
    assert "recall" in headers[-3] and "0.5" in headers[-2]
    cells = {line[0]: (line[-3], line[-2]) for line in table}
    recall, latest = cells[rf.LABELS["yarn"]]
    assert recall.count(";") == 2 and "within m_l" in recall and "past 4 m_l" in recall
    for name, r in rf.row_of(rows, "yarn")["probe"]["recall"].items():
        mean = statistics.fmean(r["accuracy"])
        word = {"higher": " (above)", "lower": " (below)", "at the edge": " (at the edge)"}
        assert (
            f"{rt.RANGE_WORDS[name]}: {mean:.2f}{word.get(r['vs_chance']['answer'], ';')}"
            in recall + ";"
        )
    for task in ("recall", "latest"):
        table, headers = rf.probe_range_table(rows, task)
        assert len(headers) == 4 and len(table) == len({r["option"] for r in rows})
        assert all(cell.count(";") == 2 for line in table for cell in line[1:])


def _bench(ratios: dict) -> dict:
    """A made-up benchmark file: per family, 15 repeats' ratios for every measure."""
    results = {"rope": {"train_step_ratio": 1.0, "decode_ratio": 1.0, "compiled_decode_ratio": 1.0}}
    for family, by_measure in ratios.items():
        results[family] = {}
        for measure, values in by_measure.items():
            results[family][f"{measure}_ratios"] = values
            results[family][f"{measure}_ratio"] = statistics.median(values)
    return {"results": results, "machine": {"commit": "abc"}, "settings": {"repeats": 15}}


def test_latency_verdicts_read_the_interval_of_the_median_against_each_goal():
    """Within: the whole 95 % interval of the median below the goal; over: the whole interval
    above; at the edge: the interval holds it. FIRE's training step has its own goal (1.5);
    RoPE, the baseline, gets no verdict."""
    low = [1.0 + 0.001 * k for k in range(15)]  # the 4th..12th: 1.003..1.011
    wide = [0.8 + 0.05 * k for k in range(15)]  # 0.95..1.35: holds 1.1 and 1.2
    high = [1.6 + 0.001 * k for k in range(15)]
    bench = _bench(
        {
            "alibi": {"train_step": low, "decode": wide, "compiled_decode": high},
            "fire": {"train_step": high, "decode": low, "compiled_decode": wide},
        }
    )
    got = rt.latency_verdicts(bench)
    assert got["train_step"] == {"within": ["alibi"], "over": ["fire"], "at the edge": []}
    assert got["decode"] == {"within": ["fire"], "over": [], "at the edge": ["alibi"]}
    assert got["compiled_decode"] == {"within": [], "over": ["alibi"], "at the edge": ["fire"]}
    nearly = [1.3 + 0.01 * k for k in range(15)]  # FIRE's step: 1.33..1.41 < 1.5
    fire_step = rt.latency_verdicts(_bench({"fire": {"train_step": nearly}}))["train_step"]
    assert fire_step["within"] == ["fire"]
    assert rt.latency_goal("fire", "train_step") == 1.5 and rt.latency_goal("fire", "decode") == 1.2
    with pytest.raises(ValueError, match="measure must be one of"):
        rt.latency_goal("alibi", "prefill")


def test_latency_rows_show_each_median_with_its_interval(tmp_path):
    import json

    ratios = [1.0 + 0.01 * k for k in range(15)]
    path = tmp_path / "bench.json"
    path.write_text(
        json.dumps(_bench({"t5": {m: ratios for m in ("train_step", "decode", "compiled_decode")}}))
    )
    rows, headers, machine, settings = rt.latency_rows(path)
    assert rows == [["t5", *["1.07 [1.03, 1.11]"] * 3]]
    assert headers[0] == "family" and len(headers) == 4 and machine["commit"] == "abc"


def test_families_in_words():
    assert rt.families_in_words(["t5", "kerple_log"]) == "T5 and Kerple-log"
    assert rt.families_in_words(["alibi", "kerple_power", "sandwich", "offset"]) == (
        "ALiBi, Kerple-power, Sandwich and the offset bias"
    )
    assert rt.families_in_words(["fire"]) == "FIRE" and rt.families_in_words([]) == "none"


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ({"mean": 0.043, "low": 0.0003, "high": 0.085}, "+0.043 [+0.0003, +0.085]"),
        ({"mean": -0.02, "low": -0.041, "high": -0.0004}, "-0.020 [-0.041, -0.0004]"),
        ({"mean": 0.0, "low": 0.0, "high": 0.0}, "+0.000 [+0.000, +0.000]"),
        ({"mean": 1e-9, "low": -2e-7, "high": 0.2}, "+0.000 [-0.000, +0.200]"),
    ],
)
def test_an_interval_end_that_is_not_zero_does_not_print_as_zero(value, text):
    """A seed interval's end of +0.0003 printed as +0.000 reads as if the interval touched 0
    while its verdict says above (the fine-tune's gap at m_l in the decision table)."""
    assert rt._signed(value, 3, interval=True) == text
