"""The lab's stored results: a result file with its provenance, read back by name, and the
named multi-seed sweeps the book reads (several files joined into one sweep).

A result is a JSON file. The stored ones live in ``relbias/lab/results``: the raw record of
each run (every training loss, every seed's loss by position; in the repository) and a
compact copy in ``relbias/lab/results/compact`` (without those two per-step and
per-position arrays: what the package ships and what every reader gets).
:func:`load_results` reads the compact copy of a stored name (the same numbers in a
checkout and in an install), or any file by path; :func:`write_results` writes a result and
its compact copy. :func:`provenance` records where a result came from: configuration,
device, versions, the commit of the relbias checkout that ran (``+dirty`` with uncommitted
changes), time, wall time and the command line.

A sweep's result (``kind`` ``"extrapolation"``, ``"retrieval"`` or ``"ablation"``) holds per
method (or variant) a summary over seeds (:func:`summarize_extrapolation`,
:func:`summarize_retrieval`: mean and 95 % Student-t interval per length, every seed's
record under ``"seeds"``). :data:`STORED` names the stored sweeps; :func:`load_stored` reads
one, joining the files it was run in (:func:`join_parts`).
"""

from __future__ import annotations

import dataclasses
import platform
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

from relbias._json import read_json, write_json
from relbias.lab.config import Config
from relbias.lab.device import device_name
from relbias.lab.summaries import summarize_extrapolation, summarize_retrieval

#: Where the stored results live (raw), and their compact copies (shipped).
RESULTS_DIR = Path(__file__).with_name("results")
COMPACT_DIR = RESULTS_DIR / "compact"
#: The relbias checkout: ``relbias/lab/results.py`` is two folders below it.
CHECKOUT = Path(__file__).resolve().parents[2]

INTERVAL_NOTE = {
    "confidence": 0.95,
    "method": "two-sided Student-t interval of the mean over seeds (relbias.lab.stats)",
}

#: The stored sweeps the book reads, by name: a file of ``relbias/lab/results`` or the
#: files of one sweep run in several sittings (joined by :func:`load_stored`).
STORED = {
    # every method, the forget gate included, with the context-use measure, each span's loss
    # and the final weights kept (relbias/lab/results/weights): two processes of six methods
    "extrapolation": ("extrapolation_medium_a", "extrapolation_medium_b"),
    "retrieval": "retrieval_medium",
    "t5": "ablation_t5_medium",
    "t5_far": "ablation_t5_medium_farmin",
    "fire": "ablation_fire_medium",
    "offset": "ablation_offset_medium",
    "kerple": "ablation_kerple_medium",
    "alibi_probe": "ablation_alibi_probe_medium",
    # the forget gate (issue 17), swept later with the same configuration and seeds
    "forgetting_extrapolation": "extrapolation_medium_forgetting",
    # the medium sweep trained five times as long (--steps 15000), each sitting run as two
    # processes of different methods: seed 0 of every method, T5's seeds 1 and 2 (one
    # process each), then seeds 1 and 2 of the six other bias families, then seeds 1 and 2
    # of the four baselines
    "extrapolation_15000": (
        "extrapolation_medium_steps15000_a",
        "extrapolation_medium_steps15000_b",
        "extrapolation_medium_steps15000_t5_seed1",
        "extrapolation_medium_steps15000_t5_seed2",
        "extrapolation_medium_steps15000_seeds12_a",
        "extrapolation_medium_steps15000_seeds12_b",
        "extrapolation_medium_steps15000_seeds12_c",
        "extrapolation_medium_steps15000_seeds12_d",
    ),
    # the forget gate on the probe, started at b = 0 (the reference) and at b = 5
    # (f = 0.993): seeds 0-2 first, seeds 3-5 added later (pooled by ``load_stored``)
    "forgetting_retrieval": ("retrieval_medium_forgetting", "retrieval_medium_forgetting_seeds345"),
    "forgetting_retrieval_init5": (
        "retrieval_medium_forgetting_init5",
        "retrieval_medium_forgetting_init5_seeds345",
    ),
}


# --- files and provenance -------------------------------------------------------------------


def provenance(config: Config, device, *, wall_s: float | None = None) -> dict:
    """Where a result came from: config, device, versions, the relbias checkout's commit,
    time, wall time and the command line."""
    from relbias import __version__

    return {
        "config": config.to_dict(),
        "device": device_name(device),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "relbias": __version__,
        "commit": checkout_commit(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall_s,
        "command": " ".join(sys.argv),
    }


def checkout_commit(root: Path | None = None) -> str | None:
    """The commit of the relbias checkout this code runs from (``+dirty`` when its tree has
    uncommitted changes), or None where relbias is not a git checkout's top level (an
    installed package: whatever repository the caller stands in is not relbias)."""
    root = Path(root) if root is not None else CHECKOUT

    def git(*args):
        return subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10
        )

    try:
        top = git("rev-parse", "--show-toplevel")
        if top.returncode != 0 or Path(top.stdout.strip()).resolve() != root.resolve():
            return None
        head = git("rev-parse", "HEAD")
        if head.returncode != 0:
            return None
        dirty = git("status", "--porcelain")
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def check_tag(tag: str | None) -> str | None:
    """A variant's tag: None, or lower-case letters, digits and ``_`` (it ends a file name)."""
    if tag is None:
        return None
    if not isinstance(tag, str) or not re.fullmatch(r"[a-z0-9][a-z0-9_]*", tag):
        raise ValueError(
            f"tag must be lower-case letters, digits and '_' (starting with a letter or "
            f"digit), got {tag!r}"
        )
    return tag


def file_stem(kind: str, config_name: str, tag: str | None = None) -> str:
    """A result's file name without ``.json``: ``<kind>_<config>`` and ``_<tag>`` for a
    tagged variant (an ablation's kind is ``ablation_<which>``)."""
    return f"{kind}_{config_name}" + (f"_{tag}" if tag else "")


def result_name(results: dict) -> str:
    """The file name (without ``.json``) of ``results``: :func:`file_stem` of its kind."""
    kind = results["kind"]
    if kind == "ablation":
        kind = f"ablation_{results['ablation']}"
    return file_stem(kind, results["provenance"]["config"]["name"], results.get("tag"))


def compact(results: dict) -> dict:
    """``results`` without the arrays no reader needs: every record's per-step training
    losses (``train.losses``) and the per-seed loss by position of every evaluation row and
    of its context-use measure's sliding reading (the summary's means over seeds stay). In
    their place each per-seed row keeps the two numbers a chapter reads from it, the mean
    loss within the training length and past it (``within_train_len_bpb``,
    ``past_train_len_bpb``; see :func:`relbias.lab.readings.loss_within_and_past`). Everything
    else is kept as it is."""
    train_len = results.get("provenance", {}).get("config", {}).get("train_len")

    def strip(value, in_seed: bool):
        if isinstance(value, dict):
            out = {}
            for key, item in value.items():
                if key == "losses" and isinstance(item, list):
                    continue
                if key == "loss_by_position" and in_seed:
                    if item and train_len and len(item) > train_len:
                        out.update(split_at_train_len(item, train_len))
                    continue
                if key == "sliding_loss_by_position" and in_seed:
                    continue
                out[key] = strip(item, in_seed or key == "seeds")
            return out
        if isinstance(value, list):
            return [strip(item, in_seed) for item in value]
        return value

    return strip(results, False)


def split_at_train_len(loss_by_position, train_len: int) -> dict:
    """The mean loss over the first ``train_len`` positions of a window and over the rest."""
    pos = list(loss_by_position)
    return {
        "within_train_len_bpb": sum(pos[:train_len]) / train_len,
        "past_train_len_bpb": sum(pos[train_len:]) / (len(pos) - train_len),
    }


def write_results(results: dict, path) -> Path:
    """Write ``results`` to ``path`` (JSON, atomically: a killed run never leaves a truncated
    file) and its :func:`compact` copy to ``compact/`` beside it; returns the path."""
    path = Path(path)
    write_json(compact(results), path.parent / "compact" / path.name, indent=None)
    return write_json(results, path)


def write_compact_copies(folder=None) -> list[Path]:
    """Rewrite the compact copy of every result in ``folder`` (default the stored results)
    and remove copies whose raw file is gone; returns the copies written."""
    folder = Path(folder) if folder is not None else RESULTS_DIR
    written = []
    for path in sorted(folder.glob("*.json")):
        target = folder / "compact" / path.name
        written.append(write_json(compact(read_json(path, folder)), target, indent=None))
    for stale in (folder / "compact").glob("*.json"):
        if not (folder / stale.name).is_file():
            stale.unlink()
    return written


def load_results(path_or_name, *, raw: bool = False) -> dict:
    """Read a result: a path, or the name of a stored one (``load_results("extrapolation_quick")``
    reads ``relbias/lab/results/compact/extrapolation_quick.json``; ``raw=True`` the raw file,
    which only a checkout has)."""
    return read_json(path_or_name, RESULTS_DIR if raw else COMPACT_DIR, what="result")


def made_with(results: dict, config: Config) -> bool:
    """Whether a stored result was made with ``config``: every field equal, where a field
    the file does not record (added to :class:`Config` later) counts at its default."""
    stored = results["provenance"]["config"]
    for field in dataclasses.fields(Config):
        value = stored.get(field.name, field.default)
        if isinstance(value, list):
            value = tuple(value)
        if value != getattr(config, field.name):
            return False
    return True


def learned_bias_from_results(results: dict) -> dict:
    """The read-back stored in an extrapolation result: ``{method: tensor [heads, offsets]}``."""
    return {
        name: torch.tensor(rec["learned_bias"]["values"])
        for name, rec in results["methods"].items()
        if rec.get("learned_bias")
    }


# --- the stored sweeps ----------------------------------------------------------------------


def load_stored(kind: str = "extrapolation") -> dict:
    """The stored sweep ``kind`` (one of :data:`STORED`'s keys).

    A kind stored in several files comes as one sweep (:func:`join_parts`): each method
    summarised over every seed any file holds of it. An entry ``(name, methods)`` of
    :data:`STORED` reads file ``name`` without ``methods`` (runs a later file holds again)."""
    if kind not in STORED:
        raise ValueError(f"kind must be one of {list(STORED)}, got {kind!r}")
    names = STORED[kind] if isinstance(STORED[kind], tuple) else (STORED[kind],)
    parts = []
    for entry in names:
        name, dropped = (entry, ()) if isinstance(entry, str) else entry
        results = load_results(name)
        if "seeds" not in results:
            raise ValueError(f"{name}.json holds no multi-seed sweep")
        if dropped:  # methods a later file holds again (rerun with more recorded)
            results = only(results, [m for m in results["methods"] if m not in dropped])
        parts.append(results)
    return join_parts(parts)


def join_parts(parts) -> dict:
    """One sweep from the files of one kind, each a sitting of some methods and seeds
    (one sitting split over processes, later seeds added, more seeds for some methods):
    every method's per-seed records are gathered from all the files that hold it and its
    summary (mean and interval per length) recomputed over them. Methods keep the order in
    which they first appear and may stand on different seeds (:func:`seed_count`);
    ``"seeds"`` is the union and ``"parts"`` lists each file's commit, command, time, wall
    time, seeds and methods. A method given the same seed twice is refused."""
    if not parts:
        raise ValueError("parts must hold at least one sweep")
    if len(parts) == 1:
        return parts[0]
    first = parts[0]
    summarize = {"extrapolation": summarize_extrapolation, "retrieval": summarize_retrieval}
    if first.get("kind") not in summarize:
        raise ValueError(f"can join extrapolation or retrieval sweeps, got {first.get('kind')!r}")
    for other in parts[1:]:
        for key in ("kind", "model_kwargs"):
            if other.get(key) != first.get(key):
                raise ValueError(f"the runs differ in {key}: {first.get(key)} and {other.get(key)}")
        if other["provenance"]["config"] != first["provenance"]["config"]:
            raise ValueError("the runs were made with different configurations")
    per_method: dict[str, dict] = {}
    for results in parts:
        for m, record in results["methods"].items():
            gathered = per_method.setdefault(m, {})
            twice = sorted(int(s) for s in record["seeds"] if int(s) in gathered)
            if twice:
                raise ValueError(f"method {m!r} holds seeds {twice} in more than one file")
            gathered.update({int(s): rec for s, rec in record["seeds"].items()})
    methods = {
        m: summarize[first["kind"]]({s: recs[s] for s in sorted(recs)})
        for m, recs in per_method.items()
    }
    if first["kind"] == "extrapolation":
        for m, summary in methods.items():
            _pool_loss_by_position(summary, [r["methods"][m] for r in parts if m in r["methods"]])
    return _with_parts(first, methods, parts)


def _pool_loss_by_position(summary: dict, pieces: list[dict]) -> None:
    """Fill a joined summary's mean loss by position from its pieces' means, weighted by
    their seed counts, where the records (compact ones) no longer hold their own."""
    for i, row in enumerate(summary["eval"]):
        if row["loss_by_position"] is not None:
            continue
        weights = [len(p["seeds"]) for p in pieces]
        means = [p["eval"][i]["loss_by_position"] for p in pieces]
        row["loss_by_position"] = [
            round(sum(w * v for w, v in zip(weights, at)) / sum(weights), 4) for at in zip(*means)
        ]


def _parts_of(results: dict) -> list[dict]:
    """Where each file behind ``results`` came from: its commit, command, time, wall time,
    seeds and methods (a joined sweep's own ``"parts"``)."""
    if "parts" in results:
        return results["parts"]
    keys = ("commit", "command", "created_utc", "wall_s")
    return [
        {
            **{k: results["provenance"].get(k) for k in keys},
            "seeds": results["seeds"],
            "methods": list(results["methods"]),
        }
    ]


def _with_parts(first: dict, methods: dict, sweeps) -> dict:
    """``first`` holding ``methods``, with the seeds, ``"parts"`` and summed wall time of
    all ``sweeps``."""
    sources = [part for r in sweeps for part in _parts_of(r)]
    return {
        **first,
        "methods": methods,
        "seeds": sorted({int(s) for r in sweeps for s in r["seeds"]}),
        "provenance": {
            **first["provenance"],
            "wall_s": sum(part["wall_s"] or 0 for part in sources),
        },
        "parts": sources,
    }


def pool_seeds(first: dict, *more: dict) -> dict:
    """One sweep from runs of the same methods, configuration and variant with different
    seeds (:func:`join_parts` where every file holds every method, checked here): each
    method's summary recomputed over all the seeds, ``"parts"`` listing each file."""
    for other in more:
        if list(other["methods"]) != list(first["methods"]):
            raise ValueError("the runs hold different methods")
    seeds = [s for r in (first, *more) for s in r["seeds"]]
    if len(set(seeds)) != len(seeds):
        raise ValueError(f"the runs share seeds: {seeds}")
    return join_parts([first, *more])


def combine(first: dict, *more: dict, same_seeds: bool = True) -> dict:
    """One sweep holding the methods of several stored sweeps of the same kind,
    configuration and seeds (e.g. the forget gate's, run later, with the others'), each
    method's summary as its sweep gives it; ``"parts"`` lists every file as
    :func:`join_parts` does.

    ``same_seeds=False`` joins sweeps run with different seeds (a variant given more
    seeds): each method keeps its own interval, ``"seeds"`` becomes the union, and
    :func:`seed_count` tells how many seeds stand behind a method."""
    for other in more:
        for key in ("kind", "seeds") if same_seeds else ("kind",):
            if other.get(key) != first.get(key):
                raise ValueError(
                    f"the sweeps differ in {key}: {first.get(key)} and {other.get(key)}"
                )
        if other["provenance"]["config"] != first["provenance"]["config"]:
            raise ValueError("the sweeps were made with different configurations")
    methods = {}
    for results in (first, *more):
        twice = [m for m in results["methods"] if m in methods]
        if twice:
            raise ValueError(
                f"methods {twice} are in more than one sweep; rename a variant first "
                "(relbias.lab.results.renamed)"
            )
        methods.update(results["methods"])
    return _with_parts(first, methods, (first, *more))


def seed_count(results: dict, method: str) -> int:
    """How many seeds ``method``'s summary in ``results`` averages."""
    return len(results["methods"][method]["seeds"])


def renamed(results: dict, names: dict) -> dict:
    """``results`` with methods renamed by ``names`` (``{old: new}``), e.g. to put a
    variant beside the method it varies (:func:`combine` needs distinct names)."""
    missing = [m for m in names if m not in results["methods"]]
    if missing:
        raise ValueError(f"methods {missing} are not in the results: {list(results['methods'])}")
    methods = {names.get(m, m): rec for m, rec in results["methods"].items()}
    parts = [{**p, "methods": [names.get(m, m) for m in p["methods"]]} for p in _parts_of(results)]
    return {**results, "methods": methods, "parts": parts}


def only(results: dict, methods) -> dict:
    """``results`` with only ``methods`` (in that order), for the tables and figures;
    ``"seeds"`` becomes the seeds those methods stand on and ``"parts"`` (of a joined
    sweep) the files that hold them, whose wall times make the provenance's."""
    missing = [m for m in methods if m not in results["methods"]]
    if missing:
        raise ValueError(f"methods {missing} are not in the results: {list(results['methods'])}")
    chosen = {m: results["methods"][m] for m in methods}
    out = {**results, "methods": chosen}
    seeds = sorted({int(s) for rec in chosen.values() for s in rec.get("seeds", {})})
    if seeds:
        out["seeds"] = seeds
    if "parts" in results:
        out["parts"] = [p for p in results["parts"] if set(p["methods"]) & set(methods)]
        wall_s = sum(p["wall_s"] or 0 for p in out["parts"])
        out["provenance"] = {**results["provenance"], "wall_s": wall_s}
    return out


def describe(results: dict) -> dict:
    """What a sweep read and where it came from, for the prose: ``seeds``, ``steps``,
    ``train_len``, ``eval_kb`` (validation kB at every length), ``files`` (the fewest
    validation files any length touched), ``commit`` (every commit of a joined sweep's
    parts) and ``wall_min``."""
    config = results["provenance"]["config"]
    rows = next(iter(results["methods"].values()))["eval"]
    info = {
        "seeds": len(results["seeds"]),
        "steps": config["steps"],
        "train_len": config["train_len"],
        "commit": ", ".join(
            dict.fromkeys(
                (p.get("commit") or "unknown")[:7]
                for p in results.get("parts", [results["provenance"]])
            )
        ),
        "wall_min": round((results["provenance"].get("wall_s") or 0) / 60),
    }
    if results["kind"] in ("extrapolation", "ablation") and "bytes" in rows[0]:  # text, not probe
        info["eval_kb"] = min(row["bytes"] for row in rows) // 1024
        info["files"] = min(row.get("files", 0) for row in rows)
    else:
        info["probe_steps"] = config["probe_steps"]
        info["samples"] = min(row["samples"] for row in rows)
    return info
