"""Interventions: the same trained weights evaluated with one thing changed (the ablations
of :mod:`relbias.lab.ablations`), read as intervals over seeds.

An ablation's record holds, per method and per seed, ``interventions[name]["eval"]``: the
evaluation rows of the trained model read again with ``name`` applied (a clamp, a mask, a
table changed). :func:`intervention_at` reads one such reading at a length,
:func:`intervention_effect` the per-seed change it makes (the same weights read twice, so
the change is paired), and :func:`interventions_as_methods` turns each intervention into a
method of its own, so that every reader of a sweep takes it like any method.
"""

from __future__ import annotations

from relbias.lab.readings import methods_verdict, row_at
from relbias.lab.stats import verdict

__all__ = [
    "intervention_at",
    "intervention_effect",
    "interventions_as_methods",
    "paired_change",
]


def intervention_at(results: dict, method: str, intervention: str, factor: int) -> dict:
    """Mean and 95 % interval of ``method``'s bits per byte at ``factor`` x the training
    length, evaluated with the stored ``intervention`` (an ablation's
    ``methods[method]["interventions"][intervention]``: the same trained weights with one
    thing changed). Same keys as :func:`~relbias.lab.readings.at_factor`."""
    held = results["methods"][method].get("interventions", {})
    if intervention not in held:
        raise ValueError(
            f"intervention must be one of {list(held)} for {method!r}, got {intervention!r}"
        )
    row = row_at(held[intervention], factor)
    return {"mean": row["bpb"], "low": row["bpb_low"], "high": row["bpb_high"], "n": row["n"]}


def intervention_effect(
    results: dict, method: str, intervention: str, factor: int, *, against: int | None = None
) -> dict:
    """What ``intervention`` does to ``method``'s bits per byte at ``factor`` x: the verdict
    (:func:`relbias.lab.stats.verdict`, paired: both readings come from the same trained
    weights of each seed) of the intervened reading against the reading as trained, with the
    text's error from their spans where the records keep them. ``"lower"``: the intervention
    lowers the loss beyond the interval; ``"higher"``: it raises it.

    ``against``: compare with the as-trained reading at that factor instead (e.g. 1: does
    the intervened reading at 16x still lie above the model's reading at the training
    length?)."""
    against = factor if against is None else against
    as_methods = interventions_as_methods(
        results, method, [intervention], labels={intervention: "intervened"}
    )
    if against == factor:
        return methods_verdict(as_methods, "intervened", method, factor)
    seeds = as_methods["methods"][method]["seeds"]
    changed = as_methods["methods"]["intervened"]["seeds"]
    keys = sorted(seeds, key=int)
    return verdict(
        [row_at(changed[s], factor)["bpb"] for s in keys],
        [row_at(seeds[s], against)["bpb"] for s in keys],
        paired=True,
    )


def _intervention_rows(record: dict, name: str) -> list[dict]:
    """The evaluation rows of ``record`` (one seed's or the summary over seeds) with
    intervention ``name``: ``record["interventions"][name]["eval"]``, or ``record[name]``
    where the rows sit at the top level (the T5 ablation's ``eval_monotone``)."""
    if name in record.get("interventions", {}):
        return record["interventions"][name]["eval"]
    if isinstance(record.get(name), list):
        return record[name]
    known = [*record.get("interventions", {}), *(k for k in record if k.startswith("eval_"))]
    raise ValueError(f"no intervention {name!r} in this record; it has {known}")


def interventions_as_methods(results: dict, variant: str, names, *, labels=None) -> dict:
    """``results`` with ``variant`` as trained and once per intervention of ``names`` (the
    same trained weights evaluated with one thing changed), each as a method of its own,
    named by ``labels`` (``{name: label}``; ``variant`` may be renamed too; default
    ``"<variant>, <name>"``): its summary rows and every seed's rows, so that
    :func:`~relbias.lab.readings.at_factor`, :func:`~relbias.lab.readings.method_curve`,
    :func:`~relbias.lab.readings.loss_within_and_past` and
    :func:`~relbias.lab.plots.plot_bpb_by_length` read it like any method."""
    labels = dict(labels or {})
    record = results["methods"][variant]
    methods = {labels.get(variant, variant): record}
    for name in names:
        seeds = {
            s: {**rec, "eval": _intervention_rows(rec, name)} for s, rec in record["seeds"].items()
        }
        label = labels.get(name, f"{variant}, {name}")
        methods[label] = {**record, "eval": _intervention_rows(record, name), "seeds": seeds}
    return {**results, "methods": methods}


def paired_change(results: dict, a: str, b: str, factor: int) -> dict:
    """``a``'s bits per byte at ``factor`` x against ``b``'s, seed by seed (two methods of
    ``results`` that hold the same seeds, e.g. a model as trained and with an intervention,
    from :func:`interventions_as_methods`): :func:`relbias.lab.readings.methods_verdict`."""
    seeds_a, seeds_b = results["methods"][a]["seeds"], results["methods"][b]["seeds"]
    if set(seeds_a) != set(seeds_b):
        raise ValueError(
            f"{a!r} and {b!r} hold different seeds: {sorted(seeds_a)}, {sorted(seeds_b)}"
        )
    return methods_verdict(results, a, b, factor)
