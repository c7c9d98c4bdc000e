"""Read the stored retrofit study (:mod:`relbias.hf.retrofit_study`) through the lab's one
verdict function (:func:`relbias.lab.stats.verdict`), paired on the base's seed.

- :func:`load_runs`: every stored run, ``{(option, seed): record}`` (``option`` ``"base"``
  for the pretrained bases);
- :func:`option_rows`: one row per option and stage (zero-shot, fine-tuned) with every
  reading of the decision table: the cost at ``m_l`` against the base, the whole curve to
  ``16 m_l``, the loss at ``16 m_l`` against the control, the context-use measure (at
  ``16 m_l``; at every length past ``m_l``: ``context_use_at``), far recall
  and far "latest" precision against chance (pooled past ``m_l``; by distance range:
  :func:`probe_verdicts`), parameters added, the fine-tune steps to
  return to the base's loss at ``m_l`` and how far above it the fine-tune ends;
- :func:`context_comparisons`: every stored context-use comparison past ``m_l`` and the
  ones that read "lower";
- :func:`cause_tests`: the stored one-seed tests of a cause of the first study's bases'
  missing recall (:data:`CAUSE_TESTS`), each checked to change only its own settings;
- :func:`seed_bases`: the bases of one stored test, every seed it holds (the tests repeated
  over seeds), with their recall within ``m_l`` and :func:`copy_gains`.

Errors: the text's own sampling error from the bits per span (:func:`relbias.lab.stats.
text_error`), the probe's from its sample count (:func:`relbias.lab.stats.probe_error`).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from relbias.lab.stats import curve_verdict, probe_error, text_error, verdict

__all__ = [
    "CAUSE_TESTS",
    "CHANCE",
    "RANGES",
    "RECALL_CHANCE",
    "LATEST_CHANCE",
    "cause_tests",
    "context_comparisons",
    "copy_gains",
    "seed_bases",
    "context_use_verdict",
    "recall_within",
    "span_means",
    "load_runs",
    "option_rows",
    "accuracy_by_distance",
    "probe_verdicts",
    "range_of",
    "final_gap",
    "recovery_steps",
    "seeds_of",
]

#: Chance on the recall probe (one of ten digits) and on "latest" (one of the two set).
RECALL_CHANCE = 0.1
LATEST_CHANCE = 0.5
STAGES = ("zero_shot", "fine_tuned")


def load_runs(folder=None) -> dict:
    """Every stored run of the study in ``folder`` (default: the repository's)."""
    from relbias.hf.retrofit_study import FOLDER

    folder = Path(folder) if folder is not None else FOLDER
    runs = {}
    for path in sorted((folder / "runs").glob("*.json")):
        record = json.loads(path.read_text())
        runs[(record["option"], record["seed"])] = record
    if not runs:
        raise FileNotFoundError(f"no stored runs in {folder / 'runs'}")
    return runs


def seeds_of(runs: dict, option: str) -> list[int]:
    """The seeds ``option`` was run on (sorted)."""
    return sorted(seed for (o, seed) in runs if o == option)


def reading(runs: dict, option: str, seed: int, stage: str) -> dict:
    """One model's reading: the base's for ``"base"`` and for the control's zero shot."""
    if option == "base" or (option == "control" and stage == "zero_shot"):
        return runs[("base", seed)]["reading"]
    return runs[(option, seed)][stage]


def _at(read: dict, length: int) -> dict:
    return next(e for e in read["by_length"]["by_length"] if e["length"] == length)


def _far_accuracy(read: dict, task: str, train_len: int) -> float:
    rows = [r for r in read[task] if r["distance"] > train_len]
    return statistics.fmean(r["accuracy"] for r in rows)


#: The probes' distance ranges: within ``m_l``; past it, up to the fine-tune's length (its
#: windows hold probe items out to a little short of that length:
#: :meth:`relbias.hf.recall.ProbeVocabulary.max_distance`); past the fine-tune's length (no
#: training window held an item that far back).
RANGES = ("within", "to_fine_tune", "past_fine_tune")
#: The level each probe is read against: recall's chance (one digit in ten) and "latest"'s
#: (a model that recalls both digits of the key but cannot tell the newer statement from
#: the older is right half of the time: above it, it tells the two offsets apart).
CHANCE = {"recall": RECALL_CHANCE, "latest": LATEST_CHANCE}


def range_of(distance: int, study: dict) -> str:
    """The range of :data:`RANGES` that ``distance`` (tokens back) falls in."""
    if distance < study["train_len"]:
        return "within"
    return "to_fine_tune" if distance <= study["fine_tune_len"] else "past_fine_tune"


def accuracy_by_distance(runs: dict, option: str, stage: str, task: str) -> dict[int, list]:
    """``{distance: [accuracy of each seed]}`` on the probe ``task`` (``recall`` or
    ``latest``) for ``option`` at ``stage`` (``"base"``: the base as pretrained), the
    seeds in :func:`seeds_of`'s order and the distances in the reading's."""
    reads = [reading(runs, option, s, stage)[task] for s in seeds_of(runs, option)]
    return {x["distance"]: [r[i]["accuracy"] for r in reads] for i, x in enumerate(reads[0])}


def probe_verdicts(runs: dict, option: str, stage: str) -> dict:
    """``{task: {range: reading}}`` for the probes (:data:`CHANCE`) over :data:`RANGES`: the
    distances, each seed's accuracy pooled over them, and three verdicts with the probe's
    own error: against the task's level (``vs_chance``), and paired on the seed against
    RoPE unchanged at the same stage (``vs_control``) and against the base (``vs_base``)."""
    study = runs[("base", seeds_of(runs, "base")[0])]["study"]

    def pooled(o: str, st: str, task: str, name: str) -> tuple[list, list]:
        by = accuracy_by_distance(runs, o, st, task)
        ds = [d for d in by if range_of(d, study) == name]
        if not ds:
            return ds, []
        return ds, [statistics.fmean(seed) for seed in zip(*(by[d] for d in ds))]

    out = {}
    for task, level in CHANCE.items():
        out[task] = {}
        for name in RANGES:
            distances, acc = pooled(option, stage, task, name)
            if not distances:
                continue
            n = study["probe_samples"] * len(distances)
            control = pooled("control", stage, task, name)[1]
            base = pooled("base", "zero_shot", task, name)[1]
            out[task][name] = {
                "distances": distances,
                "accuracy": acc,
                "vs_chance": verdict([a - level for a in acc], error=probe_error(acc, n)),
                "vs_control": verdict(
                    acc, control, paired=True, error=probe_error(acc, n, minus=control)
                ),
                "vs_base": verdict(acc, base, paired=True, error=probe_error(acc, n, minus=base)),
            }
    return out


def span_means(values, spans: int) -> list[float]:
    """Per span, the mean of its windows' values: ``values`` holds one value per window,
    the windows of each span in order (a length of ``L`` tokens cuts each span of the
    longest length into the same number of windows), so ``spans`` values come back."""
    values = list(values)
    per = len(values) // spans if spans > 0 else 0
    if spans < 1 or per < 1 or per * spans != len(values):
        raise ValueError(f"{len(values)} window values cannot be cut into {spans} equal spans")
    return [statistics.fmean(values[i * per : (i + 1) * per]) for i in range(spans)]


def context_use_verdict(uses: list[dict], spans: int) -> dict:
    """The verdict on the context-use measure over the seeds (``uses``: one
    ``context_use`` entry per seed), its text error one standard error over the ``spans``
    spans: each span's windows averaged first (:func:`span_means`), not counted as spans."""
    return verdict(
        [u["difference"] for u in uses],
        error=text_error([span_means(u["difference_by_span"], spans) for u in uses]),
    )


def recovery_steps(record: dict, base_bpb: float) -> int | None:
    """The first fine-tune step from which the loss at ``m_l`` (on the held-out windows)
    stays at or below the base's ``base_bpb`` at every later reading; ``None`` where the
    fine-tune ends above it (the step-0 reading, the option before any training, counts:
    an option that never rises above the base recovers at 0)."""
    curve = record["fine_tune"]["recovery"]
    if curve[-1]["bpb"] > base_bpb:
        return None
    step = curve[-1]["step"]
    for point in reversed(curve):
        if point["bpb"] > base_bpb:
            break
        step = point["step"]
    return step


def final_gap(record: dict, base_bpb: float) -> float:
    """The loss at ``m_l`` at the end of the fine-tune minus the base's (bits per byte)."""
    return record["fine_tune"]["recovery"][-1]["bpb"] - base_bpb


def option_rows(runs: dict) -> list[dict]:
    """One row per option and stage; each row's verdicts paired on the base's seeds."""
    study = runs[("base", seeds_of(runs, "base")[0])]["study"]
    m_l, longest = study["train_len"], study["lengths"][-1]
    samples = study["probe_samples"]
    from relbias.hf.retrofit import OPTIONS

    stored = {o for (o, _) in runs if o != "base"}
    options = [o for o in OPTIONS if o in stored]  # in the order of OPTIONS
    rows = []
    for option in options:
        seeds = seeds_of(runs, option)
        base = [reading(runs, "base", s, "zero_shot") for s in seeds]
        control_ft = [reading(runs, "control", s, "fine_tuned") for s in seeds]
        for stage in STAGES:
            reads = [reading(runs, option, s, stage) for s in seeds]
            row = {"option": option, "stage": stage, "seeds": seeds}
            row["params_added"] = runs[(option, seeds[0])]["parameters_added"]
            row["bits"] = {n: [_at(r, n)["bits"] for r in reads] for n in study["lengths"]}
            by_span = {n: [_at(r, n)["bits_by_span"] for r in reads] for n in study["lengths"]}
            base_near = [_at(r, m_l) for r in base]
            row["near_cost"] = verdict(
                row["bits"][m_l],
                [e["bits"] for e in base_near],
                paired=True,
                error=text_error(by_span[m_l], [e["bits_by_span"] for e in base_near]),
            )
            row["curve"] = curve_verdict(row["bits"], by_span=by_span)
            far_control = [_at(r, longest) for r in control_ft]
            row["far_vs_control"] = verdict(
                row["bits"][longest],
                [e["bits"] for e in far_control],
                paired=True,
                error=text_error(by_span[longest], [e["bits_by_span"] for e in far_control]),
            )
            row["context_use_at"] = {
                n: context_use_verdict([_at(r, n)["context_use"] for r in reads], study["spans"])
                for n in study["lengths"]
                if n > m_l
            }
            row["context_use"] = row["context_use_at"][longest]
            for task, chance in (("recall", RECALL_CHANCE), ("latest", LATEST_CHANCE)):
                acc = [_far_accuracy(r, task, m_l) for r in reads]
                far = [x for x in reads[0][task] if x["distance"] > m_l]
                row[f"far_{task}"] = {
                    "accuracy": acc,
                    "distances": [x["distance"] for x in far],
                    **verdict(
                        [a - chance for a in acc],
                        error=probe_error(acc, samples * len(far)),
                    ),
                }
            row["probe"] = probe_verdicts(runs, option, stage)
            if stage == "fine_tuned":
                base_bpb = [runs[("base", s)]["held_out_bpb"] for s in seeds]
                records = [runs[(option, s)] for s in seeds]
                row["recovery_steps"] = [recovery_steps(r, b) for r, b in zip(records, base_bpb)]
                row["final_gap"] = verdict([final_gap(r, b) for r, b in zip(records, base_bpb)])
            rows.append(row)
    return rows


def context_comparisons(runs: dict) -> dict:
    """Every context-use verdict the stored runs hold below the longest length: each option,
    both stages, at 2, 4 and 8 ``m_l`` (:func:`context_use_verdict`). Returns ``compared``
    (how many) and ``lower`` (``(option, stage, length)`` of each that reads "lower": the
    far tokens read better with them in view)."""
    study = runs[("base", seeds_of(runs, "base")[0])]["study"]
    m_l, spans = study["train_len"], study["spans"]
    compared, lower = 0, []
    for option in sorted({o for o, _ in runs if o != "base"}):
        for stage in STAGES:
            for n in (2 * m_l, 4 * m_l, 8 * m_l):
                uses = [
                    _at(reading(runs, option, k, stage), n)["context_use"]
                    for k in seeds_of(runs, option)
                ]
                compared += 1
                if context_use_verdict(uses, spans)["answer"] == "lower":
                    lower.append((option, stage, n))
    return {"compared": compared, "lower": lower}


#: The stored tests of one cause of the bases' missing recall, in the order they were made
#: (``relbias/hf/results/README.md``): each folder beside the study's holds one base (seed 0)
#: pretrained and read as the study's, one or two settings changed.
CAUSE_TESTS = (
    "retrofit_repeat_query",
    "retrofit_probe_share",
    "retrofit_probe_keys",
    "retrofit_base_steps",
    "retrofit_copy_windows",
    "retrofit_copy_repeat",
    "retrofit_copy_all",
)


def recall_within(record: dict) -> tuple[int, int]:
    """A base's correct answers on the recall probe within its training length, and how
    many it was asked (``record``: a stored base's run)."""
    m_l = record["study"]["train_len"]
    items = [x for x in record["reading"]["recall"] if x["distance"] < m_l]
    return round(sum(x["accuracy"] * x["samples"] for x in items)), sum(x["samples"] for x in items)


def copy_gains(record: dict) -> dict[int, float]:
    """How much better a stored base reads a span of held-out text the second time, right
    after the first (:func:`relbias.hf.recall.repeat_loss`, stored as ``record["repeat"]``):
    ``{span: first - second}`` in nats per token; a base that copies by content gains far
    more than one that does not."""
    if "repeat" not in record:
        raise ValueError(
            f"the {record.get('option', '?')} run of seed {record.get('seed', '?')} stores no "
            "repeat reading (it predates it): read its checkpoint with repeat_loss"
        )
    return {r["span"]: r["first"] - r["second"] for r in record["repeat"]}


def seed_bases(folder: str, results=None) -> list[dict]:
    """Every base stored in the test ``folder`` (in ``results``: default the folder that
    holds the study's), by seed: ``seed``, its recall within ``m_l`` (``got``, ``asked``:
    :func:`recall_within`), its loss at ``m_l`` (``bpb``), :func:`copy_gains` (``gains``)
    and the record. Raises ValueError where the folder holds no base, or bases pretrained
    with different settings."""
    from relbias.hf.retrofit_study import FOLDER, settled

    results = Path(results) if results is not None else FOLDER.parent
    paths = sorted((results / folder / "runs").glob("base_seed*.json"))
    records = sorted((json.loads(p.read_text()) for p in paths), key=lambda r: r["seed"])
    if not records:
        raise ValueError(f"{folder}: no base_seed*.json in {results / folder / 'runs'}")
    studies = {json.dumps(settled(r["study"]), sort_keys=True) for r in records}
    if len(studies) != 1:
        raise ValueError(f"{folder}: its bases were pretrained with different settings")
    out = []
    for record in records:
        got, asked = recall_within(record)
        out.append(
            {
                "seed": record["seed"],
                "got": got,
                "asked": asked,
                "bpb": _at(record["reading"], record["study"]["train_len"])["bits"],
                "gains": copy_gains(record),
                "record": record,
            }
        )
    return out


def cause_tests(study: dict, results=None) -> list[dict]:
    """Each stored cause test (:data:`CAUSE_TESTS`, in ``results``: default the folder that
    holds the study's): ``folder``, ``changed`` (``{setting: (the study's value, the
    test's)}``), its recall within ``m_l`` (``got``, ``asked``: :func:`recall_within`), its
    loss at ``m_l`` (``bpb``) and the record. Raises ValueError where a test's base is not
    seed 0 or changes no setting of ``study``."""
    from relbias.hf.retrofit_study import FOLDER, settled

    results = Path(results) if results is not None else FOLDER.parent
    same = settled(study)
    tests = []
    for folder in CAUSE_TESTS:
        record = json.loads((results / folder / "runs" / "base_seed0.json").read_text())
        test = settled(record["study"])
        changed = {k: (same.get(k), test.get(k)) for k in same.keys() | test.keys()}
        changed = {k: v for k, v in changed.items() if v[0] != v[1]}
        if record["seed"] != 0 or not changed:
            raise ValueError(f"{folder}: a cause test is seed 0 with a setting changed")
        got, asked = recall_within(record)
        tests.append(
            {
                "folder": folder,
                "changed": changed,
                "got": got,
                "asked": asked,
                "bpb": _at(record["reading"], record["study"]["train_len"])["bits"],
                "record": record,
            }
        )
    return tests
