"""Stored JSON results: read one by path or by name, write one atomically (stdlib only).

Results live in folders of the repository (``benchmarks/results``, ``relbias/lab/results``).
:func:`read_json` reads one by its path, or by its name in such a folder; where the package
was installed without that folder (Colab), it downloads the file from the repository.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from urllib.error import HTTPError
from urllib.request import urlopen

#: The repository's root: ``relbias/_stored.py`` is one folder below it.
ROOT = Path(__file__).resolve().parents[1]
#: Where a folder below :data:`ROOT` is downloaded from when it is not on this machine.
REPOSITORY_URL = "https://raw.githubusercontent.com/relbias/relbias/main/"
_NAME = re.compile(r"[A-Za-z0-9_.-]+")


class NotStoredError(FileNotFoundError, ValueError):
    """No stored result of that name (both a FileNotFoundError and a ValueError)."""


def read_json(
    source: str | os.PathLike, folder: str | os.PathLike, *, what: str = "result"
) -> dict:
    """Read a stored JSON result: a path, or the name of ``<folder>/<name>.json``.

    ``source`` is a path when it is an :class:`os.PathLike`; a string is a name (letters,
    digits, ``_``, ``.``, ``-``) when ``<folder>/<name>.json`` exists, else a path when it
    names an existing file. A name missing from an existing ``folder`` raises
    :class:`NotStoredError` listing the stored names (``what`` names the kind in that
    message). Where ``folder`` does not exist (the package was installed without it), the
    file is downloaded from the same folder of the repository (:data:`REPOSITORY_URL`).
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
    missing = f"no stored {what} named {source!r}"
    if folder.is_dir():  # running from the repository, which has no such result
        known = sorted(p.stem for p in folder.glob("*.json"))
        raise NotStoredError(f"{missing}; stored {what}s: {known}")
    try:
        below = folder.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        raise NotStoredError(f"{missing}: {folder} does not exist") from None
    url = f"{REPOSITORY_URL}{below}/{source}.json"
    try:
        with urlopen(url, timeout=30) as response:
            return json.loads(response.read().decode())
    except HTTPError as err:
        if err.code == 404:
            raise NotStoredError(f"{missing} (not at {url})") from None
        raise


def write_json(data, path: str | os.PathLike) -> Path:
    """Write ``data`` as indented JSON to ``path`` (creating folders), atomically: into a
    temporary file beside it, then renamed over it. Returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=1) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path
