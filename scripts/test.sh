#!/usr/bin/env bash
# Everything CI checks, in order: set-up (idempotent), ruff (lint and format), the book build
# (the browser test reads _build/html), then ONE pytest run over tests/ and the notebooks
# in book/ (validated with nbval), spread over one worker per core, which prints its slowest
# tests; then a few notebooks again under a second CPU code path (ATEN_CPU_CAPABILITY=default),
# so that a stored output that depends on the machine's floating-point rounding fails.
#
#   bash scripts/test.sh            everything (CI runs this)
#   bash scripts/test.sh --quick    the quick tier for iteration: ruff and the tests not
#                                   marked slow or browser; no book build, no notebooks
#
# Other arguments go to pytest after these (e.g. `bash scripts/test.sh --quick -x -k fire`;
# `bash scripts/test.sh --store-durations tests/durations.json` refreshes the seconds per
# file that order the full run, longest first: tests/conftest.py).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

quick=0
if [[ "${1:-}" == "--quick" ]]; then
    quick=1
    shift
fi

start=$SECONDS
bash scripts/setup.sh
export RELBIAS_SETUP_DONE=1
echo "[test] set-up done in $((SECONDS - start)) s"

echo "[test] ruff check, ruff format --check"
.venv/bin/ruff check .
.venv/bin/ruff format --check .

if [[ $quick -eq 1 ]]; then
    targets=(tests)
    pytest_args=(-m "not slow and not browser")
else
    t0=$SECONDS
    bash scripts/book.sh
    echo "[test] book built in $((SECONDS - t0)) s"
    targets=(tests book)
    nbval_args=(--nbval --nbval-kernel-name python3 --nbval-sanitize-with book/sanitize.cfg
        --nbval-kernel-startup-timeout 180)
    pytest_args=("${nbval_args[@]}")
    # One worker per core (pytest-xdist), each test file and each notebook on one worker
    # (a notebook's cells run in order in one kernel), and one torch thread per worker and
    # per notebook kernel, so that the workers share the cores instead of contending. The
    # files go out longest first (tests/conftest.py, tests/durations.json), not xdist's order.
    pytest_args+=(--numprocesses auto --dist loadfile --no-loadscope-reorder)
    export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
    # TorchInductor (FlexAttention on the CPU) compiles in the worker that needs it, not in a
    # pool of its own processes that would take the other worker's core.
    export TORCHINDUCTOR_COMPILE_THREADS="${TORCHINDUCTOR_COMPILE_THREADS:-1}"
fi
echo "[test] pytest ${targets[*]} ${pytest_args[*]} $*"
rc=0
.venv/bin/python -m pytest "${targets[@]}" "${pytest_args[@]}" -p no:cacheprovider \
    --durations=25 "$@" || rc=$?
if [[ $rc -eq 5 ]]; then
    echo "[test] ERROR: pytest collected no tests" >&2
    exit 1
fi
if [[ $quick -eq 0 && $# -eq 0 ]]; then
    # A second CPU code path. The stored outputs must not depend on the machine's
    # floating-point path (a reader's CPU, Colab's and CI's differ from the one that stored
    # them), so these notebooks run again with ATen's scalar kernels instead of the
    # vectorised ones this CPU picks (ATEN_CPU_CAPABILITY=default), against the same stored
    # outputs: an output that depends on the last digits of a float fails here. Chosen: the
    # notebooks whose outputs are computed from kernels and formulas rather than read from
    # stored results, and that run in under a minute (tests/book/test_book.py checks every
    # notebook's compared outputs for printed digits and image bytes).
    second_path=(book/01_introduction.ipynb book/appendix_fast_biases.ipynb)
    t0=$SECONDS
    echo "[test] the second CPU code path: ATEN_CPU_CAPABILITY=default pytest ${second_path[*]}"
    # One process, one kernel at a time: with two workers, the two kernels started at the
    # same instant and one once did not answer within 60 s (cause not established; ports
    # picked by jupyter_client before the kernel binds them can race between simultaneous
    # starts). Kernels get 180 s to start in both runs.
    ATEN_CPU_CAPABILITY=default .venv/bin/python -m pytest "${second_path[@]}" \
        "${nbval_args[@]}" -p no:cacheprovider -q || rc=$((rc ? rc : 1))
    echo "[test] second CPU code path done in $((SECONDS - t0)) s"
fi
echo "[test] total $((SECONDS - start)) s, pytest exit code $rc"
exit "$rc"
