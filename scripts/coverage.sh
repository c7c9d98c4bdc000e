#!/usr/bin/env bash
# Line coverage of relbias/ by the tests in tests/ (coverage.py; not the notebooks, not the
# browser test, which reads the built pages only). Every Python process the tests start
# measures itself (COVERAGE_PROCESS_START: xdist's workers, the command-line runs), then
# `coverage combine` joins them and the report ends with the total. Needs the environment of
# scripts/setup.sh (coverage comes with nbval).
#
#   bash scripts/coverage.sh            report by file and the total
#   bash scripts/coverage.sh -k fire    extra arguments go to pytest
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
rm -f .coverage .coverage.*
export COVERAGE_PROCESS_START="$ROOT/pyproject.toml" COVERAGE_FILE="$ROOT/.coverage"
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
rc=0
.venv/bin/python -m pytest tests -m "not browser" --numprocesses auto --dist loadfile \
    --no-loadscope-reorder -p no:cacheprovider -q "$@" || rc=$?
.venv/bin/python -m coverage combine -q
.venv/bin/python -m coverage report --include="$ROOT/relbias/*"  # not the copies a wheel build makes
exit "$rc"
