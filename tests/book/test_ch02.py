"""The stored-sweep readers that chapters 2 and 3 use (relbias.lab.stats, .interventions,
.plots; relbias.book.sweeps): the loss within and past the
training length, the clipped table's edge against its minimum, interventions read as
methods, the paired change, and the two figures (bytes on the axis, legends below)."""

from __future__ import annotations

import matplotlib
import pytest

from relbias.book import sweeps
from relbias.lab import interventions, readback, readings, stats
from relbias.lab import plots as lab_plots
from relbias.lab.experiments import summarize_extrapolation

matplotlib.use("Agg")

TRAIN_LEN = 4
FACTORS = (1, 2, 4)


def _record(seed: int, within: float, past: float, *, shift: float = 0.0, edge=None) -> dict:
    """One seed's record: the loss by position is ``within`` on the first TRAIN_LEN positions
    and ``past`` after them (plus ``shift`` per seed); ``edge`` adds a learned table."""
    rows = []
    for f in FACTORS:
        n = TRAIN_LEN * f
        pos = [within + shift] * TRAIN_LEN + [past + shift] * (n - TRAIN_LEN)
        rows.append(
            {
                "factor": f,
                "length": n,
                "bytes": 1024,
                "files": 3,
                "bpb": sum(pos) / n,
                "loss_by_position": pos,
            }
        )
    train = {"steps": 10, "final_loss_bits": 2.0, "wall_s": 1.0, "tokens_per_s": 1.0}
    record = {"params": 1, "train": train, "eval": rows}
    if edge is not None:  # a table falling to a minimum of -1 at offset 1, then up to ``edge``
        table = [0.5, -1.0, 0.0, edge]
        record["learned_bias"] = {"values": [table + [edge] * 4, [v - 1 for v in table] + [0] * 4]}
    return record


def _sweep(methods: dict) -> dict:
    summaries = {m: summarize_extrapolation(dict(enumerate(recs))) for m, recs in methods.items()}
    n = len(next(iter(methods.values())))
    return {
        "kind": "ablation",
        "methods": summaries,
        "seeds": list(range(n)),
        "provenance": {"config": {"train_len": TRAIN_LEN, "steps": 10}, "commit": "abc"},
    }


def test_loss_within_and_past_splits_at_the_training_length():
    res = _sweep({"m": [_record(s, 2.0, 3.0, shift=0.01 * s) for s in range(3)]})
    split = readings.loss_within_and_past(res, "m")
    assert split["length"] == TRAIN_LEN * 4 and split["train_len"] == TRAIN_LEN
    assert split["within"]["mean"] == pytest.approx(2.01)
    assert split["past"]["mean"] == pytest.approx(3.01)
    assert split["within"]["low"] < 2.01 < split["within"]["high"]


def test_edge_above_min_reads_every_head_of_every_seed():
    res = _sweep({"offset": [_record(s, 2.0, 3.0, edge=0.2 + 0.1 * s) for s in range(2)]})
    edge = readback.edge_above_min(res, "offset")
    # head 0: edge - (-1); head 1 (the table minus 1): (edge - 1) - (-2); the same value
    assert edge["heads"] == 4 and edge["above"] == 4
    assert edge["least"] == pytest.approx(1.2) and edge["most"] == pytest.approx(1.3)
    assert edge["below_max"] == (pytest.approx(-0.3), pytest.approx(-0.2))


def test_interventions_read_as_methods_and_their_paired_change():
    recs = []
    for s in range(3):
        rec = _record(s, 2.0, 3.0, shift=0.1 * s)  # the seeds differ a lot
        changed = _record(s, 2.0, 2.5, shift=0.1 * s)  # the same seed, far loss lowered
        rec["interventions"] = {"cut": {"eval": changed["eval"]}}
        rec["eval_other"] = _record(s, 2.2, 3.0, shift=0.1 * s)["eval"]
        recs.append(rec)
    res = _sweep({"v": recs})
    summary = res["methods"]["v"]
    summary["interventions"] = {
        "cut": {
            "eval": summarize_extrapolation(
                {s: {**r, "eval": r["interventions"]["cut"]["eval"]} for s, r in enumerate(recs)}
            )["eval"]
        }
    }
    summary["eval_other"] = summarize_extrapolation(
        {s: {**r, "eval": r["eval_other"]} for s, r in enumerate(recs)}
    )["eval"]
    views = interventions.interventions_as_methods(
        res, "v", ["cut", "eval_other"], labels={"v": "as trained", "cut": "cut"}
    )
    assert list(views["methods"]) == ["as trained", "cut", "v, eval_other"]
    assert readings.at_factor(views, "cut", 1)["mean"] == pytest.approx(2.1)
    assert readings.loss_within_and_past(views, "cut")["past"]["mean"] == pytest.approx(2.6)
    # the paired change is exact though the seeds' intervals overlap
    change = interventions.paired_change(views, "cut", "as trained", 4)
    assert change["mean"] == pytest.approx(-0.375) and change["answer"] == "lower"
    seeds = [
        [readings.row_at(rec, 4)["bpb"] for rec in views["methods"][m]["seeds"].values()]
        for m in ("cut", "as trained")
    ]
    assert stats.verdict(*seeds, paired=False)["answer"] == "cannot be told apart"
    change = interventions.paired_change(views, "v, eval_other", "as trained", 1)
    assert change["mean"] == pytest.approx(0.2)
    with pytest.raises(ValueError, match="no intervention"):
        interventions.interventions_as_methods(res, "v", ["missing"])


def test_figures_put_bytes_on_the_axis_and_the_legend_below():
    res = _sweep(
        {
            m: [_record(s, 2.0 + k, 3.0, shift=0.01 * s) for s in range(2)]
            for k, m in enumerate(("offset", "nope"))
        }
    )
    fig = lab_plots.plot_bpb_by_length({"a": res, "b": res}, ["offset", "nope"])
    axes = fig.axes
    assert len(axes) == 2 and all("bytes" in ax.get_xlabel() for ax in axes)
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["offset", "nope"]
    fig = lab_plots.plot_position_loss(res, ["offset", "nope"], window=2)
    (ax,) = fig.axes
    assert "bytes" in ax.get_xlabel() and len(ax.get_lines()) == 3  # two methods, one marker
    assert len(fig.legends) == 1


def test_bpb_table_by_length_has_one_row_per_length_and_one_column_per_run():
    a = _sweep({"m": [_record(s, 2.0, 3.0, shift=0.01 * s) for s in range(3)]})
    b = _sweep({"m": [_record(s, 1.0, 1.0) for s in range(3)]})
    rows, headers = sweeps.bpb_table_by_length({"first": (a, "m"), "second": (b, "m")})
    assert headers == ["window (bytes)", "first", "second"]
    assert [r[0] for r in rows] == ["4 (1x)", "8 (2x)", "16 (4x)"]
    assert rows[0][1] == sweeps.show_interval(readings.at_factor(a, "m", 1))
    assert rows[2][2] == "1.00 [1.00, 1.00]"


def test_stored_tables_are_drawn_after_the_scaling_on_one_scale():
    from relbias.book import offset_table

    a = _sweep({"offset": [_record(s, 2.0, 3.0, edge=0.2 + 0.1 * s) for s in range(2)]})
    b = _sweep({"offset": [_record(s, 2.0, 3.0, edge=2.0) for s in range(2)]})
    table = offset_table.stored_table(a, "offset", 1)
    assert table.shape == (2, 8) and float(table[0, -1]) == pytest.approx(0.3)
    for fig in (
        offset_table.plot_stored_tables({"a": a, "b": b}),
        offset_table.plot_stored_seeds(a),
    ):
        axes = [ax for ax in fig.axes if ax.lines]
        assert len(axes) == 2
        assert all(ax.get_ylabel() == offset_table.Y_LABEL for ax in axes)
        assert "√d" in offset_table.Y_LABEL  # the library's number, PE(i, j)/sqrt(d)
        assert axes[0].get_ylim() == axes[1].get_ylim()  # one scale for the compared panels
        # two heads and the dashed line at the last trained offset m_l - 1
        assert any(list(line.get_xdata()) == [TRAIN_LEN - 1] * 2 for line in axes[0].lines)


def test_edge_rows_read_every_head_of_every_seed():
    from relbias.book import offset_table

    res = _sweep({"offset": [_record(s, 2.0, 3.0, edge=0.2 + 0.1 * s) for s in range(2)]})
    rows, headers = offset_table.edge_rows({"short": res}, digits=2)
    assert headers[0] == "trained" and len(rows) == 1
    assert rows[0] == ["short", "1.20 to 1.30", "0.20 to 0.30", "4 of 4"]


def test_answer_key_names_every_run_set_from_the_records():
    from relbias.book import offset_table
    from relbias.lab.config import get_config
    from relbias.lab.results import load_stored

    key = offset_table.answer_key(
        load_stored("extrapolation_15000"),
        load_stored("extrapolation"),
        load_stored("offset"),
        load_stored("retrieval"),
        get_config("quick"),
    ).data
    for term in ("*15,000-step runs*", "*3,000-step runs*", "*medium*", "*Ablation models*"):
        assert term in key
    assert "*Quick*" in key and "5/12" in key
    assert "ong runs" not in key and "hort runs" not in key  # budgets named by their steps
    assert "within about 0.03 bits" in key  # the largest gap is 0.032: "about"
    assert "$" not in key  # a glued block: no maths
