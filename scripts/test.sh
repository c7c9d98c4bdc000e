#!/usr/bin/env bash
# Everything CI checks, in order: set-up (idempotent), ruff (lint and format), the book build
# (the browser test reads _build/html), then ONE pytest run over tests/ and the
# notebooks in book/ (validated with nbval). Extra arguments go to pytest.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

start=$SECONDS
bash scripts/setup.sh
export RELBIAS_SETUP_DONE=1
echo "[test] set-up done in $((SECONDS - start)) s"

echo "[test] ruff check, ruff format --check"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

if [[ -f _toc.yml ]]; then
    t0=$SECONDS
    bash scripts/book.sh
    echo "[test] book built in $((SECONDS - t0)) s"
else
    echo "[test] no _toc.yml yet: skipping the book build"
fi

targets=(tests)
nbval_args=()
if compgen -G "book/*.ipynb" >/dev/null; then
    targets+=(book)
    nbval_args+=(--nbval --nbval-kernel-name python3)
    if [[ -f book/sanitize.cfg ]]; then
        nbval_args+=(--nbval-sanitize-with book/sanitize.cfg)
    fi
fi

echo "[test] pytest ${targets[*]} ${nbval_args[*]}"
rc=0
.venv/bin/python -m pytest "${targets[@]}" "${nbval_args[@]}" -p no:cacheprovider "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "[test] ERROR: pytest collected no tests" >&2
    exit 1
fi
echo "[test] total $((SECONDS - start)) s, pytest exit code $rc"
exit "$rc"
