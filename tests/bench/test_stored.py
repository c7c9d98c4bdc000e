"""relbias._stored: one reader of stored JSON results (by path, by name, or downloaded from
the repository) and an atomic writer."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from relbias import _stored
from relbias._stored import NotStoredError, read_json, write_json


def test_write_then_read_by_path_and_by_name(tmp_path, monkeypatch):
    data = {"a": [1, 2.5, None], "b": "x"}
    path = write_json(data, tmp_path / "sub" / "r.json")
    assert path == tmp_path / "sub" / "r.json"
    assert path.read_text().endswith("\n")
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind
    folder = path.parent
    assert read_json(path, folder) == data
    assert read_json(str(path), tmp_path) == data
    assert read_json("r", folder) == data
    monkeypatch.chdir(folder)
    assert read_json("r.json", tmp_path) == data  # an existing file, not a stored name
    write_json({"c": 1}, path)
    assert read_json("r", folder) == {"c": 1}


def test_unknown_and_bad_names(tmp_path):
    write_json({}, tmp_path / "one.json")
    with pytest.raises(
        NotStoredError, match=r"no stored benchmark named 'two'; stored benchmarks: \['one'\]"
    ):
        read_json("two", tmp_path, what="benchmark")
    with pytest.raises(FileNotFoundError, match="stored results"):
        read_json("two", tmp_path)
    with pytest.raises(ValueError, match="name must be a file name"):
        read_json("../two", tmp_path)
    with pytest.raises(FileNotFoundError):
        read_json(tmp_path / "two.json", tmp_path)  # a path is never a name
    with pytest.raises(TypeError):
        read_json(3, tmp_path)


def test_a_missing_folder_of_the_repository_is_downloaded(tmp_path, monkeypatch):
    """Installed without the repository's folder: the file comes from the repository."""
    asked = []

    def fake_urlopen(url, timeout):
        asked.append(url)
        return io.BytesIO(json.dumps({"from": url}).encode())

    monkeypatch.setattr(_stored, "urlopen", fake_urlopen)
    monkeypatch.setattr(_stored, "ROOT", tmp_path)
    got = read_json("cpu", tmp_path / "benchmarks" / "results")
    assert asked == [_stored.REPOSITORY_URL + "benchmarks/results/cpu.json"]
    assert got == {"from": asked[0]}
    with pytest.raises(NotStoredError, match="does not exist"):
        read_json("cpu", Path("/nonexistent-relbias-folder"))
