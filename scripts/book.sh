#!/usr/bin/env bash
# Build the relbias book into _build/html (after the idempotent set-up).
# Until the book exists (no _toc.yml at the repository root), run the library's
# short demo instead: a table of every bias family.
# Extra arguments are passed to `jupyter-book build`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ "${RELBIAS_SETUP_DONE:-0}" != "1" ]]; then
    bash scripts/setup.sh
fi

if [[ -f _toc.yml ]]; then
    echo "[book] jupyter-book build --warningiserror --keep-going ."
    .venv/bin/jupyter-book build --warningiserror --keep-going "$@" .
    echo "[book] built: $ROOT/_build/html/index.html"
else
    echo "[book] no _toc.yml yet: running the library demo instead (python -m relbias.demo)"
    .venv/bin/python -m relbias.demo
fi
