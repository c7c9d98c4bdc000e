"""relbias._json: one reader of stored JSON results (by path or by name; nothing is
downloaded) and an atomic writer; the stored benchmark results ship with the package."""

from __future__ import annotations

from pathlib import Path

import pytest

from relbias._json import NotStoredError, read_json, write_json


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


def test_nothing_is_downloaded_and_the_benchmarks_ship_with_the_package(tmp_path):
    import relbias._json as module
    from relbias.bench.report import RESULTS_DIR, load_report

    assert "urlopen" not in vars(module) and "REPOSITORY_URL" not in vars(module)
    with pytest.raises(NotStoredError, match=r"stored results: \[\]"):
        read_json("cpu", tmp_path / "no-such-folder")
    assert RESULTS_DIR.parent == Path(module.__file__).parent / "bench"
    assert load_report(name="cpu")["commit"]  # read from the package's own folder
