"""The full run's order (tests/conftest.py): files longest first, each file's tests in order."""

from __future__ import annotations

import json
from types import SimpleNamespace

import conftest


def test_files_go_longest_first_and_keep_their_tests_in_order(tmp_path, monkeypatch):
    seconds = {"book/ch.ipynb": 90.0, "tests/b.py": 5.0}
    (tmp_path / "durations.json").write_text(json.dumps(seconds))
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "durations.json")
    ids = [
        "tests/a.py::test_1",
        "tests/b.py::test_1",
        "book/ch.ipynb::Cell 0",
        "tests/a.py::test_2",
        "book/ch.ipynb::Cell 1",
        "tests/b.py::test_2[x]",
        "tests/new.py::test_1",  # not in the stored durations: after those that are
    ]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == [
        "book/ch.ipynb::Cell 0",
        "book/ch.ipynb::Cell 1",
        "tests/b.py::test_1",
        "tests/b.py::test_2[x]",
        "tests/a.py::test_1",
        "tests/a.py::test_2",
        "tests/new.py::test_1",
    ]


def test_without_stored_durations_the_files_keep_their_collection_order(tmp_path, monkeypatch):
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "missing.json")
    ids = ["tests/a.py::t1", "tests/b.py::t1", "tests/a.py::t2"]
    items = [SimpleNamespace(nodeid=i) for i in ids]
    conftest.pytest_collection_modifyitems(None, items)
    assert [i.nodeid for i in items] == ["tests/a.py::t1", "tests/a.py::t2", "tests/b.py::t1"]


def test_the_stored_durations_name_files_that_exist():
    seconds = json.loads(conftest.DURATIONS.read_text())
    root = conftest.DURATIONS.parents[1]
    missing = [f for f in seconds if not (root / f).is_file()]
    assert not missing, (
        f"refresh tests/durations.json (scripts/test.sh --store-durations): {missing}"
    )
    assert all(s >= 0 for s in seconds.values())


def test_the_files_that_read_the_build_wait_for_its_headstart(tmp_path, monkeypatch):
    """The browser test goes out after BUILD_HEADSTART_S seconds of longer files, so that the
    book's build, run beside the tests, has ended when it starts."""
    browser = "tests/book/test_browser.py"
    seconds = {"book/a.ipynb": 300.0, "book/b.ipynb": 200.0, browser: 100.0, "tests/c.py": 50.0}
    (tmp_path / "durations.json").write_text(json.dumps(seconds))
    monkeypatch.setattr(conftest, "DURATIONS", tmp_path / "durations.json")
    collected = ["tests/c.py", browser, "book/a.ipynb", "book/b.ipynb"]
    items = [SimpleNamespace(nodeid=f"{f}::t") for f in collected]
    conftest.pytest_collection_modifyitems(None, items)
    files = [i.nodeid.split("::")[0] for i in items]
    assert files == ["book/a.ipynb", "book/b.ipynb", browser, "tests/c.py"]
    assert conftest.BUILD_HEADSTART_S <= 300.0 + 200.0
