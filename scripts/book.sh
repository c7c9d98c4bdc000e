#!/usr/bin/env bash
# Build the relbias book into _build/html (after the idempotent set-up), and print the
# built site's size.
# Extra arguments are passed to `jupyter-book build` (e.g. `--path-output DIR` builds into
# DIR/_build/html).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

if [[ "${RELBIAS_SETUP_DONE:-0}" != "1" ]]; then
    bash scripts/setup.sh
fi

# The part of MathJax 3 the pages load (html_static_path in _config.yml copies it into
# _static/): the combined TeX-to-CommonHTML component, its woff-v2 fonts, and the TeX
# extensions its autoload may fetch for a macro; plus the licence. Not the whole npm
# package (24 MB: SVG output, speech, other combined components).
MATHJAX_SRC=node_modules/mathjax
MATHJAX_DST=_build/mathjax/mathjax
if [[ ! -f "$MATHJAX_SRC/es5/tex-chtml.js" ]]; then
    echo "[book] ERROR: $MATHJAX_SRC/es5/tex-chtml.js is missing (npm ci installs it;" \
        "scripts/setup.sh runs it when npm is on the PATH)" >&2
    exit 1
fi
rm -rf _build/mathjax
mkdir -p "$MATHJAX_DST/es5/output/chtml/fonts" "$MATHJAX_DST/es5/input/tex"
cp "$MATHJAX_SRC/LICENSE" "$MATHJAX_SRC/package.json" "$MATHJAX_DST/"
cp "$MATHJAX_SRC/es5/tex-chtml.js" "$MATHJAX_DST/es5/"
cp -r "$MATHJAX_SRC/es5/output/chtml/fonts/woff-v2" "$MATHJAX_DST/es5/output/chtml/fonts/"
cp -r "$MATHJAX_SRC/es5/input/tex/extensions" "$MATHJAX_DST/es5/input/tex/"

# Where the HTML goes: _build/html, or DIR/_build/html with --path-output DIR.
OUT="$ROOT"
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
    case "${args[$i]}" in
        --path-output=*) OUT="${args[$i]#--path-output=}" ;;
        --path-output) OUT="${args[$((i + 1))]:-$ROOT}" ;;
    esac
done
HTML="$OUT/_build/html"

echo "[book] jupyter-book build --warningiserror --keep-going $* ."
.venv/bin/jupyter-book build --warningiserror --keep-going "$@" .
# Sphinx 7.4 neither overwrites a static file left by an earlier build nor copies static
# files when no page is out of date: bring the book's own (_assets/, MathJax) up to date.
cp _assets/* "$HTML/_static/"
rm -rf "$HTML/_static/mathjax"
cp -r "$MATHJAX_DST" "$HTML/_static/mathjax"
# The theme's source maps (about 1.3 MB) serve only a developer's browser tools, which fetch
# them on demand: they are not shipped.
find "$HTML/_static" -name '*.map' -delete
# The theme's Font Awesome gives each webfont as woff2, then as a TrueType fallback; the pages
# preload the woff2, and a browser that reads woff2 (every one that runs the pages' scripts)
# never fetches the fallback (about 0.65 MB): it is not shipped.
find "$HTML/_static/vendor" -path '*fontawesome*/webfonts/*.ttf' -delete
echo "[book] built: $HTML/index.html"

# The site's size, as tests/book/test_browser.py counts it: figures are the PNG files and
# the PNG images inlined in pages (the explorers' pre-drawn states) and in the notebooks
# offered for download (_sources/); the rest must stay under 10 MB.
.venv/bin/python - "$HTML" <<'PYEOF'
import re
import sys
from pathlib import Path

html = Path(sys.argv[1])
total = figures = 0
# base64 PNG (it starts with the PNG signature), in a data URI or a notebook's JSON
inline = re.compile(rb"iVBORw0KGgo[A-Za-z0-9+/=]*(?:\\n[A-Za-z0-9+/=]+)*")
for path in html.rglob("*"):
    if not path.is_file():
        continue
    size = path.stat().st_size
    total += size
    if path.suffix == ".png":
        figures += size
    elif path.suffix in (".html", ".ipynb"):
        figures += sum(len(m) for m in inline.findall(path.read_bytes()))
mb = 1024 * 1024
print(
    f"[book] site size: {total / mb:.1f} MB in all; {figures / mb:.1f} MB of PNG figures; "
    f"{(total - figures) / mb:.1f} MB without them (the limit is 10 MB)"
)
PYEOF
