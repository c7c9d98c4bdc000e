"""JSON files of stored results: read one by path or by name, write one atomically (stdlib only).

The lab's results (``relbias/lab/results``) and the benchmark's (``relbias/bench/results``)
ship with the package, so :func:`read_json` finds them in a checkout and in an install
alike; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class NotStoredError(FileNotFoundError, ValueError):
    """No stored result of that name (both a FileNotFoundError and a ValueError)."""


def read_json(
    source: str | os.PathLike, folder: str | os.PathLike, *, what: str = "result"
) -> dict:
    """Read a stored JSON result: a path, or the name of ``<folder>/<name>.json``.

    ``source`` is a path when it is an :class:`os.PathLike`; a string is a name (letters,
    digits, ``_``, ``.``, ``-``) when ``<folder>/<name>.json`` exists, else a path when it
    names an existing file. A name that is not stored raises :class:`NotStoredError`
    listing the stored names (``what`` names the kind in that message).
    """
    if isinstance(source, os.PathLike):
        return json.loads(Path(source).read_text())
    if not isinstance(source, str):
        raise TypeError(f"source must be a path or a name, got {source!r}")
    folder = Path(folder)
    local = folder / f"{source}.json"
    if _NAME.fullmatch(source) and local.is_file():
        return json.loads(local.read_text())
    if Path(source).is_file():
        return json.loads(Path(source).read_text())
    if not _NAME.fullmatch(source):
        raise ValueError(
            f"name must be a file name without folders (or an existing file), got {source!r}"
        )
    known = sorted(p.stem for p in folder.glob("*.json")) if folder.is_dir() else []
    raise NotStoredError(f"no stored {what} named {source!r}; stored {what}s: {known}")


def write_json(data, path: str | os.PathLike, *, indent: int | None = 1) -> Path:
    """Write ``data`` as JSON to ``path`` (creating folders; ``indent`` as in
    :func:`json.dumps`, None for one line), atomically: into a temporary file beside it,
    then renamed over it. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=indent) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
