"""Every reading of every stored sweep, as one JSON-able dict: what the lab's readers say of the
stored results (curves, verdicts between methods, context use, recall, levelling off).

``tests/lab/test_readings_unchanged.py`` holds it against ``stored_readings.json``, written by
the readers before they moved out of ``relbias.lab.stats`` (``python
tests/lab/stored_readings.py OUT.json`` at that commit): a move of code that changed a stored
reading fails there.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "relbias" / "lab" / "results"


def _reader(name):
    """The reader ``name`` from wherever this checkout keeps it."""
    try:
        from relbias.lab import readings as module
    except ImportError:  # before the move
        from relbias.lab import stats as module
    return getattr(module, name)


def _clean(value):
    """Floats rounded to 10 significant digits, NaN as a string: comparable as JSON."""
    if isinstance(value, float):
        return "nan" if math.isnan(value) else float(f"{value:.10g}")
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def _try(fn, *args, **kwargs):
    try:
        return _clean(fn(*args, **kwargs))
    except (ValueError, KeyError) as err:
        return f"error: {type(err).__name__}"


def _keep(levelled: dict) -> dict:
    """The levelling verdict's fields that the one rule keeps (the per-seed count of runs
    under 0.02 bits was the second rule, removed on purpose)."""
    return {k: levelled[k] for k in ("answer", "words", "seeds", "largest_drop") if k in levelled}


def readings_of(results: dict) -> dict:
    methods = sorted(results["methods"])
    out = {}
    first = results["methods"][methods[0]]
    is_probe = "distance" in first["eval"][0]
    for m in methods:
        rec = {}
        if is_probe:
            rec["far"] = _try(_reader("far_accuracy"), results, [m])
        else:
            rec["curve"] = _try(_reader("method_curve"), results, m)
            rec["context"] = _try(_reader("context_verdict"), results, m)
            rec["within_past"] = _try(_reader("loss_within_and_past"), results, m)
        lev = _try(_reader("levelled"), results, m)
        rec["levelled"] = _keep(lev) if isinstance(lev, dict) else lev
        out[m] = rec
    pairs = {}
    for a, b in itertools.combinations(methods, 2):
        if is_probe:
            for n in _reader("probe_lengths")(results):
                pairs[f"{a}|{b}|{n}"] = _try(_reader("accuracy_verdict"), results, a, b, n)
        else:
            for row in first["eval"]:
                f = row["factor"]
                pairs[f"{a}|{b}|{f}"] = _try(_reader("methods_verdict"), results, a, b, f)
    return {"methods": out, "pairs": pairs}


def all_readings() -> dict:
    """Every stored result file with methods over seeds, and every stored sweep as the
    chapters join it (``load_stored``), with the longer-training comparison of the text
    sweeps."""
    from relbias.lab.results import STORED, load_results, load_stored

    out = {}
    for path in sorted(RESULTS.glob("*.json")):
        results = load_results(path)
        if "methods" in results and "seeds" in results:
            out[path.stem] = readings_of(results)
    for kind in sorted(STORED):
        out[f"stored:{kind}"] = readings_of(load_stored(kind))
    short, longer = load_stored("extrapolation"), load_stored("extrapolation_15000")
    shared = sorted(set(short["methods"]) & set(longer["methods"]))
    comparison = _reader("longer_training")(short, longer, shared)
    for row in comparison["methods"].values():
        row.pop("levelled", None)  # the second rule's count, removed on purpose
        row.pop("levelled_off", None)
        row.pop("words", None)
    out["longer_training"] = _clean(comparison)
    out["gap_by_step"] = {m: _try(_reader("gap_by_step"), longer, m, shared) for m in shared}
    return out


if __name__ == "__main__":
    Path(sys.argv[1]).write_text(json.dumps(all_readings(), separators=(",", ":"), sort_keys=True))
