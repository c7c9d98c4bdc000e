"""The stored sweeps: joined over files and seeds (relbias.lab.results), verdicts that claim only
what the intervals allow (relbias.lab.stats), their tables (relbias.book.sweeps) and figures."""

from __future__ import annotations

import math
import random

import matplotlib
import pytest

from relbias.book import sweeps
from relbias.lab import plots, readback, readings, results, stats
from relbias.lab.stats import interval
from relbias.lab.summaries import summarize_extrapolation, summarize_retrieval

matplotlib.use("Agg")

FACTORS = (1, 2, 4)


def _record(bpbs, seed):
    curve = [{"step": s, "bpb": 3.0 - s / 1000 + 0.01 * seed} for s in (0, 250, 500, 750, 1000)]
    return {
        "params": 10,
        "train": {
            "steps": 1000,
            "final_loss_bits": 2.0,
            "wall_s": 1.0,
            "tokens_per_s": 1.0,
            "val_curve": curve,
        },
        "eval": [
            {
                "factor": f,
                "length": 16 * f,
                "windows": 4,
                "bytes": 131072,
                "files": 20,
                "bpb": b,
                "loss_by_position": [b] * (16 * f),
            }
            for f, b in zip(FACTORS, bpbs)
        ],
    }


def _results(per_method, first_seed=0):
    """A stored-format sweep from ``{method: [[bpb per factor] per seed]}``."""
    methods = {
        m: summarize_extrapolation({s: _record(b, s) for s, b in enumerate(seeds, first_seed)})
        for m, seeds in per_method.items()
    }
    n = len(next(iter(per_method.values())))
    seeds = list(range(first_seed, first_seed + n))
    config = {"train_len": 16, "steps": 1000}
    return {
        "kind": "extrapolation",
        "methods": methods,
        "seeds": seeds,
        "provenance": {"config": config, "commit": "abcdef0123", "wall_s": 600.0},
    }


def test_methods_verdict_is_paired_by_seed():
    res = _results(
        {
            "low": [[1.0, 1.0, 1.0], [1.01, 1.0, 1.0], [0.99, 1.0, 1.0]],
            "high": [[2.0, 2.0, 2.0], [2.01, 2.0, 2.0], [1.99, 2.0, 2.0]],
            "noisy": [[0.5, 1.0, 1.0], [2.5, 1.0, 1.0], [1.5, 1.0, 1.0]],
        }
    )
    assert readings.methods_verdict(res, "low", "high", 1)["answer"] == "lower"
    assert readings.methods_verdict(res, "high", "low", 1)["answer"] == "higher"
    assert readings.methods_verdict(res, "noisy", "low", 1)["answer"] == "cannot be told apart"
    v = readings.methods_verdict(res, "low", "high", 1)
    assert v["paired"] and v["seeds"] == [0, 1, 2] and v["error"] is None  # no spans kept
    other = _results({"low": [[3.0, 3.0, 3.0], [3.01, 3.0, 3.0], [2.99, 3.0, 3.0]]})
    assert readings.methods_verdict(res, "low", "low", 1, other=other)["answer"] == "lower"


def test_methods_verdict_agrees_with_the_paired_t_test_over_random_sweeps():
    from scipy import stats as scipy_stats

    rng = random.Random(0)
    for _ in range(200):
        per = {m: [[rng.gauss(mu, 0.3)] * 3 for _ in range(3)] for m, mu in (("a", 0), ("b", 0.5))}
        v = readings.methods_verdict(_results(per), "a", "b", 1)
        a, b = [s[0] for s in per["a"]], [s[0] for s in per["b"]]
        p = scipy_stats.ttest_rel(a, b).pvalue
        assert (v["answer"] in ("lower", "higher")) == (p < 0.05)
        if v["answer"] == "lower":
            assert sum(a) < sum(b)


def test_method_curve_reads_the_per_seed_changes():
    # The seeds differ a lot from each other but each degrades by about 0.5: the paired
    # change is clear even though the two lengths' intervals overlap.
    res = _results({"m": [[1.0, 1.2, 1.5], [2.0, 2.2, 2.51], [3.0, 3.2, 3.49]]})
    seeds = [[r["bpb"] for r in rec["eval"]] for rec in res["methods"]["m"]["seeds"].values()]
    assert (
        stats.verdict([s[0] for s in seeds], [s[2] for s in seeds], paired=False)["answer"]
        == "cannot be told apart"
    )
    curve = readings.method_curve(res, "m")
    assert curve["answer"] == "degrades" and list(curve["by_length"]) == [16, 32, 64]
    assert {(c["start"], c["end"]) for c in curve["rises"]} == {(16, 32), (16, 64), (32, 64)}
    better = _results({"m": [[1.5, 1.2, 1.0], [2.5, 2.2, 2.01], [3.5, 3.2, 2.99]]})
    assert readings.method_curve(better, "m")["answer"] == "improves"
    mixed = _results({"m": [[1.0, 1.0, 1.3], [1.0, 1.0, 0.7], [1.0, 1.0, 1.05]]})
    assert readings.method_curve(mixed, "m")["answer"] == "cannot be told apart"


def test_table_describe_levelled_and_figure():
    res = _results({"a": [[1.0, 1.1, 1.2]] * 2 + [[1.2, 1.3, 1.4]], "b": [[2.0, 2.0, 2.0]] * 3})
    rows, headers = sweeps.bpb_table(res, ["b", "a"])
    assert headers == ["method", "16 (1x)", "32 (2x)", "64 (4x)"]
    assert [r[0] for r in rows] == ["b", "a"] and rows[0][1] == "2.00 [2.00, 2.00]"
    mean, rest = rows[1][1].split(" [")
    assert float(mean) == pytest.approx(1.0667, abs=1e-2) and rest.endswith("]")
    info = results.describe(res)
    assert info == {
        "seeds": 3,
        "steps": 1000,
        "train_len": 16,
        "commit": "abcdef0",
        "wall_min": 10,
        "eval_kb": 128,
        "files": 20,
    }
    lev = readings.levelled(res, "a")
    assert lev["seeds"] == 3 and lev["levelled_off"] is False and lev["largest_drop"] > 0.19
    assert lev["answer"] == "lower" and lev["words"] == "still improving"
    fig = plots.plot_sweep(res, ["a", "b"])
    assert len(fig.axes) == 2


def test_accuracy_table_clips_the_interval_to_probabilities():
    def rec(acc):
        return {
            "params": 1,
            "train": {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0},
            "eval": [{"length": 64, "distance": d, "accuracy": acc, "samples": 10} for d in (3, 9)],
        }

    method = summarize_retrieval({0: rec(1.0), 1: rec(0.9), 2: rec(0.2)})
    res = {
        "kind": "retrieval",
        "methods": {"alibi": method},
        "seeds": [0, 1, 2],
        "provenance": {"config": {"train_len": 16, "steps": 1, "probe_steps": 5}},
    }
    rows, headers = sweeps.accuracy_table(res, ["alibi"], 64)
    assert headers == ["method", "d = 3", "d = 9"]
    low, high = rows[0][1].split("[")[1].rstrip("]").split(", ")
    assert float(low) == 0.0 and float(high) == 1.0
    assert len(plots.plot_probe(res, ["alibi"]).axes) == 1
    far = readings.accuracy_at(res, "alibi", 64)
    assert far["distance"] == 9 and far["low"] == 0.0 and far["high"] == 1.0
    same = readings.accuracy_verdict(res, "alibi", "alibi", 64)
    assert same["answer"] == "cannot be told apart" and same["distance"] == 9
    with pytest.raises(ValueError, match="distance must be one of"):
        readings.accuracy_at(res, "alibi", 64, 5)
    with pytest.raises(ValueError, match="length 128"):
        sweeps.accuracy_table(res, ["alibi"], 128)
    assert readings.probe_lengths(res) == [64]
    assert readings.far_accuracy(res, ["alibi"]) == {"alibi": {64: far}}
    rows, headers = sweeps.far_accuracy_table(readings.far_accuracy(res, ["alibi"]))
    assert headers == ["method", "64 tokens, d = 9"]
    assert rows == [["alibi", sweeps.show_interval(far)]]
    with pytest.raises(ValueError, match="far must hold at least one method"):
        sweeps.far_accuracy_table({})


def test_recall_above_chance_reads_each_seed_against_the_probes_own_chance():
    def rec(acc):
        return {
            "params": 1,
            "train": {"steps": 1, "final_loss_bits": 1.0, "wall_s": 1.0, "tokens_per_s": 1.0},
            "eval": [{"length": 64, "distance": 9, "accuracy": acc, "samples": 100}],
        }

    def probe(accs, competitors=1):
        return {
            "kind": "retrieval",
            "methods": {"m": summarize_retrieval({s: rec(a) for s, a in enumerate(accs)})},
            "seeds": list(range(len(accs))),
            "probe": {"num_competitors": competitors},
            "provenance": {"config": {"train_len": 16, "steps": 1, "probe_steps": 5}},
        }

    chance = readings.probe_chance(probe([0.5]))
    assert chance == pytest.approx(5 / 12)  # two or three digits present, each half the time
    high = readings.recall_above_chance(probe([0.9, 0.92, 0.88]), "m", 64)
    assert high["answer"] == "higher" and high["mean"] == pytest.approx(0.9 - chance)
    # one seed far below the others: the interval over seeds holds the chance
    wide = readings.recall_above_chance(probe([0.93, 0.3, 0.91]), "m", 64)
    assert wide["answer"] == "cannot be told apart"
    assert readings.recall_above_chance(probe([0.1, 0.12, 0.08]), "m", 64)["answer"] == "lower"
    with pytest.raises(ValueError, match="length 128"):
        readings.recall_above_chance(probe([0.9, 0.9, 0.9]), "m", 128)


def test_bad_input_is_named():
    res = _results({"a": [[1.0, 1.0, 1.0]] * 3})
    with pytest.raises(ValueError, match="kind must be one of"):
        results.load_stored("nope")
    with pytest.raises(ValueError, match=r"methods \['zz'\] are not in the results"):
        results.only(res, ["zz"])
    with pytest.raises(ValueError, match="factor must be one of"):
        readings.methods_verdict(res, "a", "a", 3)


def test_spread_by_step_follows_the_validation_curves():
    res = _results({"a": [[1.0, 1.0, 1.0]] * 3, "b": [[2.0, 2.0, 2.0]] * 3})
    # _record's curves: 3.0 - step/1000 + 0.01 * seed, the same for both methods
    rows = readings.spread_by_step(res, ["a", "b"])
    assert [r["step"] for r in rows] == [0, 250, 500, 750, 1000]
    assert all(r["spread"] == pytest.approx(0.0) for r in rows)
    assert rows[-1]["means"]["a"] == pytest.approx(2.01)
    with pytest.raises(ValueError, match="no validation curve"):
        readings.spread_by_step({"methods": {"a": {"seeds": {"0": {"train": {}}}}}}, ["a"])


def test_gap_by_step_follows_one_method_against_the_mean_of_others():
    # _record's curves are 3.0 - step/1000 + 0.01 * seed; shift method "c" by 0.3
    res = _results({m: [[1.0, 1.0, 1.0]] * 3 for m in ("a", "b", "c")})
    for record in res["methods"]["c"]["seeds"].values():
        for point in record["train"]["val_curve"]:
            point["bpb"] += 0.3 * (1 - point["step"] / 1000)
    gap = readings.gap_by_step(res, "c", ["a", "b", "c"])
    assert list(gap) == [0, 250, 500, 750, 1000]
    assert [round(g, 6) for g in gap.values()] == [0.3, 0.225, 0.15, 0.075, 0.0]
    assert readings.gap_by_step(res, "a", ["b"]) == pytest.approx(dict.fromkeys(gap, 0.0))
    assert readings.nearest_step(gap, 600) == 500 and readings.nearest_step(gap, 5000) == 1000
    with pytest.raises(ValueError, match="others must hold a method besides 'a'"):
        readings.gap_by_step(res, "a", ["a"])


def test_combine_joins_sweeps_of_one_configuration_only():
    a = _results({"a": [[1.0, 1.0, 1.0]] * 3})
    b = _results({"b": [[2.0, 2.0, 2.0]] * 3})
    b["provenance"] = {**b["provenance"], "commit": "1234567890"}
    both = results.combine(a, b)
    assert list(both["methods"]) == ["a", "b"] and both["methods"]["b"] is b["methods"]["b"]
    # the provenance of every file, as join_parts records it
    assert [(p["methods"], p["wall_s"]) for p in both["parts"]] == [(["a"], 600.0), (["b"], 600.0)]
    assert both["provenance"]["wall_s"] == 1200.0
    assert results.describe(both)["commit"] == "abcdef0, 1234567"
    assert results.describe(results.only(both, ["b"]))["commit"] == "1234567"
    other = {**b, "provenance": {**b["provenance"], "config": {"train_len": 32, "steps": 1}}}
    with pytest.raises(ValueError, match="different configurations"):
        results.combine(a, other)
    with pytest.raises(ValueError, match="differ in seeds"):
        results.combine(a, {**b, "seeds": [0]})
    with pytest.raises(ValueError, match="more than one sweep"):
        results.combine(a, a)


def test_renamed_puts_a_variant_beside_its_method():
    a = _results({"a": [[1.0, 1.0, 1.0]] * 3})
    both = results.combine(a, results.renamed(a, {"a": "a_variant"}))
    assert list(both["methods"]) == ["a", "a_variant"]
    # the variant's file is found under its new name, also when it is itself joined
    assert [p["methods"] for p in results.only(both, ["a_variant"])["parts"]] == [["a_variant"]]
    joined = results.join_parts([a, _results({"a": [[1.0, 1.0, 1.0]] * 3}, 3)])
    variant = results.combine(a, results.renamed(joined, {"a": "v"}), same_seeds=False)
    variant = results.only(variant, ["v"])
    assert [p["seeds"] for p in variant["parts"]] == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError, match=r"methods \['b'\] are not in the results"):
        results.renamed(a, {"b": "c"})


def test_gate_summary_averages_the_read_back_over_seeds():
    res = _results({"g": [[1.0, 1.0, 1.0]] * 2})
    gates = [
        {"mean_log_forget": [[-0.1, -0.3]], "bias_at_distance": [[-2.0, -6.0]], "distance": 20},
        {"mean_log_forget": [[-0.2, -0.2]], "bias_at_distance": [[-4.0, -4.0]], "distance": 20},
    ]
    for rec, gate in zip(res["methods"]["g"]["seeds"].values(), gates):
        rec["learned_gate"] = gate
    out = readback.gate_summary(res, "g")
    assert out["seeds"] == 2 and out["distance"] == 20
    assert out["mean_log_forget"] == pytest.approx(-0.2)
    assert out["half_life"] == pytest.approx(math.log(2) / 0.2)
    assert out["most_open"] == pytest.approx(-0.1) and out["least_bias"] == pytest.approx(-2.0)
    assert out["bias_at_distance"] == pytest.approx(-4.0)
    assert out["least_bias_per_run"] == pytest.approx([-2.0, -4.0])
    with pytest.raises(ValueError, match="no gate read-back"):
        readback.gate_summary(_results({"h": [[1.0, 1.0, 1.0]] * 2}), "h")


def test_pool_seeds_recomputes_the_interval_over_every_seed():
    rows = [[1.0, 1.1, 1.2], [1.2, 1.3, 1.1], [1.1, 1.0, 1.3], [1.3, 1.2, 1.0]]
    pooled = results.pool_seeds(_results({"a": rows[:2]}), _results({"a": rows[2:]}, 2))
    assert pooled["seeds"] == [0, 1, 2, 3] and len(pooled["parts"]) == 2
    whole = _results({"a": rows})
    for f in FACTORS:
        assert readings.at_factor(pooled, "a", f) == pytest.approx(
            readings.at_factor(whole, "a", f)
        )
    assert pooled["provenance"]["wall_s"] == 1200.0
    with pytest.raises(ValueError, match="share seeds"):
        results.pool_seeds(_results({"a": rows[:2]}), _results({"a": rows[2:]}))
    with pytest.raises(ValueError, match="differ in model_kwargs"):
        results.pool_seeds(
            _results({"a": rows[:2]}),
            {**_results({"a": rows[2:]}, 2), "model_kwargs": {"bias_kwargs": {}}},
        )
    with pytest.raises(ValueError, match="different methods"):
        results.pool_seeds(_results({"a": rows[:2]}), _results({"b": rows[2:]}, 2))


def test_combine_joins_a_variant_with_more_seeds_only_when_asked():
    three = _results({"a": [[1.0, 1.1, 1.2]] * 3})
    six = _results({"b": [[1.0, 1.1, 1.2], [1.1, 1.2, 1.3]] * 3})
    with pytest.raises(ValueError, match="differ in seeds"):
        results.combine(three, six)
    both = results.combine(three, six, same_seeds=False)
    assert both["seeds"] == list(range(6))
    assert results.seed_count(both, "a") == 3 and results.seed_count(both, "b") == 6


def test_join_parts_combines_a_split_sitting_and_pools_later_seeds():
    rows = [[1.0, 1.1, 1.2], [1.2, 1.3, 1.1], [1.1, 1.0, 1.3]]
    first_a = _results({"a": rows[:2]})
    first_b = _results({"b": rows[:2]})
    later_a = _results({"a": rows[2:]}, 2)
    later_b = _results({"b": rows[2:]}, 2)
    joined = results.join_parts([first_a, first_b, later_a, later_b])
    assert list(joined["methods"]) == ["a", "b"] and joined["seeds"] == [0, 1, 2]
    whole = _results({"a": rows, "b": rows})
    for m in ("a", "b"):
        for f in FACTORS:
            assert readings.at_factor(joined, m, f) == pytest.approx(
                readings.at_factor(whole, m, f)
            )
    assert [p["seeds"] for p in joined["parts"]] == [[0, 1], [0, 1], [2], [2]]
    assert joined["provenance"]["wall_s"] == 4 * 600.0
    assert results.join_parts([first_a]) is first_a
    with pytest.raises(ValueError, match="at least one"):
        results.join_parts([])


def test_join_parts_lets_methods_stand_on_different_seeds():
    rows = [[1.0, 1.1, 1.2], [1.2, 1.3, 1.1], [1.1, 1.0, 1.3]]
    # seed 0 of both methods, then seeds 1 and 2 of "a" only, in the order the files come
    joined = results.join_parts(
        [_results({"a": rows[:1], "b": rows[:1]}), _results({"a": rows[1:]}, 1)]
    )
    assert joined["seeds"] == [0, 1, 2]
    assert results.seed_count(joined, "a") == 3 and results.seed_count(joined, "b") == 1
    for f in FACTORS:
        assert readings.at_factor(joined, "a", f) == pytest.approx(
            readings.at_factor(_results({"a": rows}), "a", f)
        )
    one = readings.at_factor(joined, "b", 1)
    assert one["n"] == 1 and math.isnan(one["low"])
    assert sweeps.show_interval(one) == "1.00 (one seed)"
    assert readings.method_curve(joined, "b")["answer"] == "one seed"
    assert results.only(joined, ["b"])["seeds"] == [0]
    with pytest.raises(ValueError, match=r"method 'a' holds seeds \[1\] in more than one file"):
        results.join_parts([_results({"a": rows[1:2]}, 1), _results({"a": rows[1:]}, 1)])
    other = _results({"c": rows[:1]})
    other["provenance"] = {**other["provenance"], "config": {"train_len": 32, "steps": 1000}}
    with pytest.raises(ValueError, match="different configurations"):
        results.join_parts([_results({"a": rows[:1]}), other])
    with pytest.raises(ValueError, match="can join extrapolation or retrieval"):
        results.join_parts([{**other, "kind": "ablation"}, other])


def test_describe_names_every_commit_of_a_joined_sweep():
    first = _results({"a": [[1.0, 1.1, 1.2]]})
    later = _results({"a": [[1.2, 1.3, 1.1]]}, 1)
    later["provenance"] = {**later["provenance"], "commit": "1234567890"}
    assert results.describe(results.join_parts([first, later]))["commit"] == "abcdef0, 1234567"
    assert results.describe(first)["commit"] == "abcdef0"
    both = results.join_parts([first, results.renamed(later, {"a": "b"})])
    assert results.describe(results.only(both, ["b"]))["commit"] == "1234567"
    assert results.only(both, ["b"])["provenance"]["wall_s"] == 600.0


def _longer(sweep, steps):
    config = {**sweep["provenance"]["config"], "steps": steps}
    return {**sweep, "provenance": {**sweep["provenance"], "config": config}}


def test_longer_training_compares_the_shared_seeds_of_each_method():
    short = _results({"a": [[2.0, 2.2, 2.4], [2.2, 2.4, 2.6]], "b": [[3.0, 3.0, 3.0]] * 2})
    longer = _longer(
        results.join_parts(
            [
                _results({"a": [[1.5, 1.6, 1.7]], "b": [[2.5, 2.5, 2.5]]}),
                _results({"a": [[1.7, 1.8, 1.9]]}, 1),
            ]
        ),
        5000,
    )
    out = readings.longer_training(short, longer, ["a", "b"])
    assert out["steps"] == [1000, 5000] and out["end"] == 4
    a, b = out["methods"]["a"], out["methods"]["b"]
    assert a["seeds"] == [0, 1] and b["seeds"] == [0]
    assert a["short_1x"] == interval([2.0, 2.2]) and a["longer_1x"] == interval([1.5, 1.7])
    assert a["short_end"] == interval([2.4, 2.6]) and a["longer_end"] == interval([1.7, 1.9])
    assert b["longer_1x"]["mean"] == 2.5 and b["longer_1x"]["n"] == 1
    # the test curves fall 0.2 bits over their last fifth: not levelled
    assert a["levelled_off"] is False and a["words"] == "still improving"
    assert a["runs"] == 2 and a["drop"] == pytest.approx(0.25)
    fig = plots.plot_longer_training(short, longer, [["a"], ["b"]])
    assert len(fig.axes) == 2 and len(fig.axes[0].get_lines()) == 2
    # the solid line is the mean of the two seeds' curves
    xs, ys = fig.axes[0].get_lines()[0].get_data()
    curves = [longer["methods"]["a"]["seeds"][s]["train"]["val_curve"] for s in ("0", "1")]
    assert list(ys) == pytest.approx([(p["bpb"] + q["bpb"]) / 2 for p, q in zip(*curves)])
    assert fig.axes[0].get_legend().get_texts()[0].get_text() == "a (2 seeds)"
    with pytest.raises(ValueError, match="more steps"):
        readings.longer_training(longer, short, ["a"])
    wider = {**longer, "provenance": {"config": {"train_len": 32, "steps": 5000}}}
    with pytest.raises(ValueError, match=r"differ in \['steps', 'train_len'\]"):
        readings.longer_training(short, wider, ["a"])
    with pytest.raises(ValueError, match="share no seed"):
        readings.longer_training(short, _longer(_results({"a": [[1.0] * 3]}, 7), 5000), ["a"])


@pytest.mark.parametrize("kind", list(results.STORED))
def test_every_stored_kind_loads_as_one_multi_seed_sweep(kind):
    sweep = results.load_stored(kind)
    assert sweep["kind"] in ("extrapolation", "retrieval", "ablation")
    assert sweep["seeds"] and sweep["methods"]
    held = [set(map(int, record["seeds"])) for record in sweep["methods"].values()]
    assert set().union(*held) == set(sweep["seeds"])


def test_far_penalty_reads_the_learned_tables_of_every_seed():
    res = _results({"t": [[1.0, 1.0, 1.0]] * 2})
    tables = [[[0.0, 1.0, -2.0], [0.0, -1.0, -0.5]], [[2.0, 0.0, -3.0], [0.0, 0.0, 0.0]]]
    for rec, values in zip(res["methods"]["t"]["seeds"].values(), tables):
        rec["learned_bias"] = {"values": values}
    out = readback.far_penalty(res, "t")
    # seed 0: (-2 - 1 + -0.5 - 0) / 2 = -1.75; seed 1: (-3 - 2 + 0 - 0) / 2 = -2.5
    assert out["mean"] == pytest.approx(-2.125) and out["n"] == 2
    assert out["lowest_far"] == 3 and out["heads"] == 4 and out["offset"] == 2
    with pytest.raises(ValueError, match="no learned-bias read-back"):
        readback.far_penalty(_results({"h": [[1.0, 1.0, 1.0]] * 2}), "h")
