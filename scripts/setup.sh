#!/usr/bin/env bash
# Reproducible set-up for relbias: a virtual environment at .venv with every
# Python package pinned by constraints.txt, MathJax 3 (npm) for the offline
# book, Debian's Chromium for the browser test, a C++ compiler for relbias's
# fused kernel, and a Jupyter kernel named "python3" that runs the venv's interpreter.
#
# Idempotent and safe to rerun: the pip step is skipped while the stamp
# .venv/.relbias-setup-complete matches the current constraints.txt and
# pyproject.toml; the other steps check their own result first.
#
# Environment overrides: PYTHON (interpreter used to create .venv),
# RELBIAS_SKIP_APT=1 (never call apt-get), RELBIAS_FORCE_SETUP=1 (ignore stamp).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="$ROOT/.venv"
VPY="$VENV/bin/python"
STAMP="$VENV/.relbias-setup-complete"
LOCK="$VENV/.relbias-setup.lock"

log()  { printf '[setup] %s\n' "$*"; }
warn() { printf '[setup] WARNING: %s\n' "$*" >&2; }

# --- 1. the virtual environment -------------------------------------------
if [[ ! -x "$VPY" ]]; then
    PY="${PYTHON:-}"
    if [[ -z "$PY" ]]; then
        for cand in python3.11 python3; do
            if command -v "$cand" >/dev/null 2>&1; then PY="$cand"; break; fi
        done
    fi
    [[ -n "$PY" ]] || { echo "[setup] ERROR: no python3.11 or python3 on PATH" >&2; exit 1; }
    "$PY" - <<'PYEOF' || { echo "[setup] ERROR: Python >= 3.10 is required (3.11 is the tested version)" >&2; exit 1; }
import sys
raise SystemExit(0 if sys.version_info >= (3, 10) else 1)
PYEOF
    log "creating .venv with $("$PY" --version 2>&1) ($(command -v "$PY"))"
    "$PY" -m venv "$VENV"
fi

# One set-up at a time (several helpers may start it together).
exec 9>"$LOCK"
if command -v flock >/dev/null 2>&1; then flock 9; fi

stamp_value() {
    {
        "$VPY" -c 'import sys; print(sys.version)'
        cat constraints.txt pyproject.toml
    } | sha256sum | cut -d' ' -f1
}

# --- 2. Python packages, pinned -------------------------------------------
WANT="$(stamp_value)"
if [[ "${RELBIAS_FORCE_SETUP:-0}" != "1" && -f "$STAMP" && "$(cat "$STAMP")" == "$WANT" ]]; then
    log "Python packages up to date (stamp matches)"
else
    rm -f "$STAMP"
    log "installing Python packages (pip install -c constraints.txt -e .[docs,bench,test,hf])"
    # The constraint file also applies inside pip's isolated build environments.
    export PIP_CONSTRAINT="$ROOT/constraints.txt"
    "$VPY" -m pip install --quiet --disable-pip-version-check --upgrade pip
    "$VPY" -m pip install --quiet --disable-pip-version-check \
        -c constraints.txt -e ".[docs,bench,test,hf]"
    unset PIP_CONSTRAINT
    "$VPY" -m pip check
    NEED_STAMP=1
fi

# --- 3. Jupyter kernel "python3" -> this venv's interpreter -----------------
KERNEL_PY="$("$VPY" - <<'PYEOF'
import json, os, sys
path = os.path.join(sys.prefix, "share", "jupyter", "kernels", "python3", "kernel.json")
try:
    with open(path) as fh:
        print(json.load(fh)["argv"][0])
except (OSError, ValueError, KeyError, IndexError):
    print("")
PYEOF
)"
if [[ "$KERNEL_PY" != "$VPY" ]]; then
    log "registering Jupyter kernel 'python3' for $VPY"
    "$VPY" -m ipykernel install --sys-prefix --name python3 \
        --display-name "Python 3 (relbias)" >/dev/null
fi

# --- 4. MathJax 3 for the offline book (npm) ---------------------------------
MATHJAX_WANT="$("$VPY" -c 'import json; print(json.load(open("package-lock.json"))["packages"]["node_modules/mathjax"]["version"])')"
MATHJAX_HAVE="$("$VPY" - <<'PYEOF'
import json
try:
    print(json.load(open("node_modules/mathjax/package.json"))["version"])
except (OSError, ValueError, KeyError):
    print("")
PYEOF
)"
if [[ "$MATHJAX_HAVE" == "$MATHJAX_WANT" && -f node_modules/mathjax/es5/tex-mml-chtml.js ]]; then
    log "MathJax $MATHJAX_HAVE present (node_modules/mathjax/es5/tex-mml-chtml.js)"
elif command -v npm >/dev/null 2>&1; then
    log "installing MathJax $MATHJAX_WANT with npm ci"
    npm ci --no-audit --no-fund --loglevel=error
else
    warn "npm not found: MathJax is not installed; the built book cannot render maths offline"
fi

# --- 5. Chromium for the browser test ----------------------------------------
if [[ -x /usr/bin/chromium ]]; then
    log "Chromium present: /usr/bin/chromium"
elif [[ "$(id -u)" == "0" && "${RELBIAS_SKIP_APT:-0}" != "1" ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's chromium with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
    warn "/usr/bin/chromium is missing and cannot be installed here (not root or no apt-get)."
    warn "Install it (e.g. 'sudo apt-get install chromium'); the browser test will fail without it."
fi

# --- 6. a C++ compiler for relbias.attention.fused, and its kernel built ahead of time ---
if command -v c++ >/dev/null 2>&1; then
    log "C++ compiler present: $(command -v c++)"
elif [[ "$(id -u)" == "0" && "${RELBIAS_SKIP_APT:-0}" != "1" ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing Debian's g++ with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends g++ >/dev/null
else
    warn "no C++ compiler (c++) and none can be installed here (not root or no apt-get)."
    warn "Install one (e.g. 'sudo apt-get install g++'): without it backend='fused' is"
    warn "unavailable, backend='auto' takes the slower table path and tests/core/test_fused.py fails."
fi
# Build (or load) the kernel now rather than on first use; it prints where it is cached.
if command -v c++ >/dev/null 2>&1; then
    log "building the fused attention kernel (python -m relbias.attention.fused)"
    if ! "$VPY" -m relbias.attention.fused; then
        warn "the fused kernel could not be built (reason above): backend='auto' takes the"
        warn "table path instead, and tests/core/test_fused.py fails until it builds."
    fi
fi

# --- done ----------------------------------------------------------------------
if [[ "${NEED_STAMP:-0}" == "1" ]]; then
    printf '%s\n' "$WANT" > "$STAMP"
    log "set-up complete; stamp written to .venv/.relbias-setup-complete"
else
    log "set-up complete"
fi
