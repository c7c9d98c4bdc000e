"""relbias.book.execute.chapter_report: a chapter run through every cell, claims counted."""

from __future__ import annotations

import nbformat
import pytest

from relbias.book.execute import chapter_report


@pytest.mark.slow
def test_chapter_report_runs_every_cell_and_names_the_claims_that_failed(tmp_path):
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# A chapter"),
        nbformat.v4.new_code_cell("print('relbias x | device: CPU | configuration: quick')"),
        nbformat.v4.new_code_cell("x = 2\nassert x == 2"),
        nbformat.v4.new_code_cell("assert x == 3, 'the claim'", metadata={"tags": ["remove-cell"]}),
        nbformat.v4.new_code_cell("1 / 0"),
        nbformat.v4.new_code_cell("y = x + 1\nassert y == 3"),  # runs after the failures
    ]
    path = tmp_path / "chapter.ipynb"
    nbformat.write(nb, path)
    before = path.read_text()
    report = chapter_report(path, timeout=120)
    assert path.read_text() == before  # the chapter itself is not changed
    assert report["banner"] == "relbias x | device: CPU | configuration: quick"
    assert report["claims"] == 3 and report["claims_held"] is False
    assert [(f["cell"], f["error"]) for f in report["failed"]] == [
        (3, "AssertionError"),
        (4, "ZeroDivisionError"),
    ]
    assert report["failed"][0]["tags"] == ["remove-cell"]
    assert report["failed"][0]["message"] == "the claim"
    assert report["peak_gpu_mib"] is None and report["seconds"] > 0
