"""Waiting for the book's build when ``scripts/test.sh`` runs it beside the tests.

``scripts/test.sh`` builds the book (``scripts/book.sh``) in the background while pytest runs
the tests and notebooks, so that the build's one core is not idle time. It sets
``RELBIAS_BOOK_BUILD_STATUS`` to a file that the build writes its exit code into when it
ends; a test that reads ``_build`` calls :func:`wait_for_the_build` first. Without the
variable (the book built beforehand, or not at all), it returns at once.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

#: How long a test waits for the book's build (it takes one to three minutes on 2 cores).
TIMEOUT_S = 900


def wait_for_the_build() -> None:
    status = os.environ.get("RELBIAS_BOOK_BUILD_STATUS")
    if not status:
        return
    path = Path(status)
    deadline = time.monotonic() + TIMEOUT_S
    while not path.is_file():
        if time.monotonic() > deadline:
            pytest.fail(f"the book's build did not end within {TIMEOUT_S} s ({path} absent)")
        time.sleep(1.0)
    code = path.read_text().strip()
    if code != "0":
        pytest.fail(f"the book's build failed (exit code {code}): see its log in the run")
