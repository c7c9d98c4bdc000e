#!/usr/bin/env bash
# Everything CI checks: set-up (idempotent), ruff (lint and format), then the book build
# (scripts/book.sh) in the background BESIDE one pytest run over tests/ and the notebooks in
# book/ (validated with nbval), spread over one worker per core, which prints its slowest
# tests. The tests that read _build wait for the build (tests/book/book_build.py), and a
# failed build fails the run. A few notebooks run again under a second CPU code path
# (ATEN_CPU_CAPABILITY=default, tests/book/test_second_code_path.py, in the same pool), so that
# a stored output that depends on the machine's floating-point rounding fails.
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
    # The build runs on one core; beside the tests it takes no wall time of its own.
    build_dir="$(mktemp -d)"
    build_status="$build_dir/status"
    build_log="$build_dir/book.log"
    (
        t0=$SECONDS
        rc_build=0
        bash scripts/book.sh >"$build_log" 2>&1 || rc_build=$?
        echo "[test] book built in $((SECONDS - t0)) s (exit code $rc_build)" >>"$build_log"
        echo "$rc_build" >"$build_status.partial"
        mv "$build_status.partial" "$build_status"
    ) &
    build_pid=$!
    export RELBIAS_BOOK_BUILD_STATUS="$build_status"
    echo "[test] building the book in the background (log: $build_log)"
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
if [[ $quick -eq 0 ]]; then
    wait "$build_pid" || true
    cat "$build_log"
    if [[ "$(cat "$build_status" 2>/dev/null)" != "0" ]]; then
        echo "[test] ERROR: the book's build failed" >&2
        rc=$((rc ? rc : 1))
    fi
fi
echo "[test] total $((SECONDS - start)) s, pytest exit code $rc"
exit "$rc"
