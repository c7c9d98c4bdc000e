"""The built book in a real browser: Debian's headless Chromium opens every page.

Reads the HTML in ``_build/html`` (built by ``bash scripts/book.sh``; ``scripts/test.sh``
builds it before running pytest; ``RELBIAS_BOOK_HTML`` names another build) and serves it
from a local HTTP server. Every page of ``_toc.yml`` is opened twice, in light mode at 1400 px
and in dark mode at 390 px (a phone): each mode and each width once, since the colours do not
depend on the width nor the layout on the mode. Every request that leaves the machine is
blocked (and counted as a failure), and the test checks that:

- nothing is logged to the console as an error or a warning, no script raises, no request
  fails or answers an HTTP error (a missing MathJax file) and no request leaves the machine;
  the page names a favicon that loads;
- the theme shows the mode asked for;
- MathJax (served by the book itself) typeset the equations, without TeX errors, and no raw
  TeX (``$``, ``\\frac``, ``\\[``, ...) is left in the visible text outside code;
- every table cell's text contrasts with its background (WCAG ratio 4.5 at least);
- the page is no wider than the viewport, and no printed output is cut or scrolls sideways;
- every ``<img>`` loaded;
- and, once per page (in light mode at 1400 px: these do not depend on mode or width): the
  Colab and Binder launch buttons point at the page's notebook in the repository named in
  ``_config.yml``; a chapter that calls ``nb.explorer`` has its static explorers in the page,
  and moving any control of one (as a reader: the arrow keys on a slider, picking an option,
  a click on a checkbox) shows another figure, with no kernel and no network; the
  bibliography labels entries "Author et al., Year", as the citations in the text read;
  every heading of the notebook's markdown is a heading of the page, and no literal block
  that is not a code cell shows markdown or MyST syntax.

Every problem of a page is reported together, and a failing page's screenshot is saved under
``artifacts/screenshots/``. The test never downloads a browser: it needs
``/usr/bin/chromium`` and fails (not skips) without it. ``test_site_size`` needs no browser:
the built site without its PNG figures stays under 10 MB.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from book_build import wait_for_the_build

ROOT = Path(__file__).resolve().parents[2]
HTML = Path(os.environ.get("RELBIAS_BOOK_HTML") or ROOT / "_build" / "html")
CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = ROOT / "artifacts" / "screenshots"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking"]
# (mode, width): each mode and each width once; the first also checks what depends on neither
VIEWS = (("light", 1400), ("dark", 390))
MIN_CONTRAST = 4.5  # WCAG AA for normal text
SITE_LIMIT = 10 * 1024 * 1024  # bytes, without the PNG figures

pytestmark = pytest.mark.browser


def toc_pages() -> list[str]:
    """Sphinx page names from ``_toc.yml``, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    pages = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                pages.append(entry["file"])
            walk(entry.get("sections"))

    walk(toc.get("chapters"))
    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    return [p.removesuffix(".ipynb").removesuffix(".md") for p in pages]


def repository() -> tuple[str, str, str]:
    """(owner, name, branch) of the repository named in ``_config.yml``."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    url = config["repository"]["url"].rstrip("/")
    owner, name = urlparse(url).path.strip("/").split("/")[:2]
    return owner, name, config["repository"].get("branch", "main")


def explorer_calls(page_name: str) -> int:
    """How many code cells of the page's notebook call ``nb.explorer(``."""
    path = ROOT / f"{page_name}.ipynb"
    if not path.is_file():
        return 0
    cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
    return sum("nb.explorer(" in "".join(c["source"]) for c in cells if c["cell_type"] == "code")


# --- the site's weight (no browser) -------------------------------------------------------------

# base64 PNG (it starts with the PNG signature), in a data URI or a notebook's JSON
INLINE_PNG = re.compile(rb"iVBORw0KGgo[A-Za-z0-9+/=]*(?:\\n[A-Za-z0-9+/=]+)*")


def site_size(html: Path) -> tuple[int, int]:
    """(all bytes, bytes of PNG figures: files and images inlined in pages and notebooks)."""
    total = figures = 0
    for path in html.rglob("*"):
        if not path.is_file():
            continue
        size = path.stat().st_size
        total += size
        if path.suffix == ".png":
            figures += size
        elif path.suffix in (".html", ".ipynb"):
            figures += sum(len(m) for m in INLINE_PNG.findall(path.read_bytes()))
    return total, figures


def _require_build():
    wait_for_the_build()  # scripts/test.sh builds the book beside the tests
    if not (HTML / "index.html").is_file():
        pytest.fail(
            f"no built book in {HTML}: build it first with `bash scripts/book.sh` "
            "(scripts/test.sh does this before running the tests)"
        )


def test_site_size():
    """The site without its figures stays under 10 MB: MathJax ships only what pages load."""
    _require_build()
    total, figures = site_size(HTML)
    assert total - figures < SITE_LIMIT, (
        f"the built site is {(total - figures) / 2**20:.1f} MB without its "
        f"{figures / 2**20:.1f} MB of PNG figures (limit 10 MB)"
    )
    mathjax = HTML / "_static" / "mathjax"
    assert (mathjax / "es5" / "tex-chtml.js").is_file()
    shipped = {p.relative_to(mathjax).parts[:2] for p in mathjax.rglob("*") if p.is_file()}
    unused = {("es5", "sre"), ("es5", "tex-svg.js"), ("es5", "tex-chtml-full-speech.js")}
    assert not shipped & unused, f"MathJax files no page loads: {shipped & unused}"
    assert SITE_LIMIT > 0 and figures <= total


def test_site_size_counts_inline_figures(tmp_path):
    """The size count treats PNG inlined in a page or a notebook as figures, nothing else."""
    png = b"iVBORw0KGgo" + b"A" * 989
    (tmp_path / "page.html").write_bytes(b'<img src="data:image/png;base64,' + png + b'">')
    (tmp_path / "nb.ipynb").write_bytes(b'{"image/png": "' + png + b"\\n" + b"B" * 100 + b'"}')
    (tmp_path / "figure.png").write_bytes(b"x" * 300)
    (tmp_path / "script.js").write_bytes(b"y" * 700)
    total, figures = site_size(tmp_path)
    assert figures == 1000 + 1102 + 300
    assert total - figures == (len(b'<img src="data:image/png;base64,">') + 17 + 700)


# --- the browser --------------------------------------------------------------------------------


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):  # keep pytest's output clean
        pass


@pytest.fixture(scope="module")
def server():
    _require_build()
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.is_file():
        pytest.fail(
            f"{CHROMIUM} is missing: install Debian's Chromium (`apt-get install chromium`, "
            "which scripts/setup.sh does when run as root). The browser test never "
            "downloads a browser of its own."
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # pragma: no cover - a broken environment
        pytest.fail(f"the playwright package is not installed: {exc}")
    with sync_playwright() as p:
        chromium = p.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield chromium
        finally:
            chromium.close()


# The text of the page outside code, after MathJax ran. MathJax output (mjx-container)
# is removed too: its assistive MathML is not raw TeX but would only add noise.
VISIBLE_TEXT_JS = """() => {
  const body = document.querySelector('main') || document.body;
  const copy = body.cloneNode(true);
  copy.querySelectorAll('pre, code, script, style, mjx-container, .highlight')
      .forEach(e => e.remove());
  return copy.innerText;
}"""
RAW_TEX = re.compile(r"\$|\\[A-Za-z]+|\\[\[\](){}]")

IMAGES_JS = """async () => {
  const imgs = Array.from(document.images);
  imgs.forEach(i => { i.loading = 'eager'; });
  await Promise.all(imgs.map(i => i.complete ? null :
      new Promise(r => { i.addEventListener('load', r); i.addEventListener('error', r); })));
  return imgs.map(i => ({src: (i.getAttribute('src') || '').slice(0, 80),
                         ok: i.complete && i.naturalWidth > 0}));
}"""

MATHJAX_JS = """async () => {
  const mathNodes = document.querySelectorAll('.math').length;
  if (!window.MathJax || !MathJax.startup || !MathJax.startup.promise) {
    return {loaded: false, mathNodes: mathNodes};
  }
  await MathJax.startup.promise;
  return {
    loaded: true,
    containers: document.querySelectorAll('mjx-container').length,
    mathNodes: document.querySelectorAll('.math').length,
    errors: document.querySelectorAll('mjx-merror, [data-mjx-error]').length,
  };
}"""

# The WCAG contrast ratio of every table cell's text against what is painted behind it
# (the background colours of the cell and its ancestors, composited).
CONTRAST_JS = """(minimum) => {
  function parse(c) {
    const m = /^rgba?\\(([^)]*)\\)$/.exec(c.trim());
    if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number);
    return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1];
  }
  function over(top, bottom) {
    const a = top[3] + bottom[3] * (1 - top[3]);
    return [0, 1, 2].map(i => (top[i] * top[3] + bottom[i] * bottom[3] * (1 - top[3])) / a)
        .concat([a]);
  }
  function behind(el) {
    const layers = [];
    for (let e = el; e; e = e.parentElement) {
      const c = parse(getComputedStyle(e).backgroundColor);
      if (c === null) return null;
      if (c[3] > 0) layers.push(c);
      if (c[3] >= 1) break;
    }
    let paint = [255, 255, 255, 1];  // the canvas
    for (let i = layers.length - 1; i >= 0; i--) paint = over(layers[i], paint);
    return paint;
  }
  function luminance(c) {
    const f = v => {
      v /= 255;
      return v <= 0.03928 ? v / 12.92 : Math.pow((v + 0.055) / 1.055, 2.4);
    };
    return 0.2126 * f(c[0]) + 0.7152 * f(c[1]) + 0.0722 * f(c[2]);
  }
  const main = document.querySelector('main') || document.body;
  const cells = Array.from(main.querySelectorAll('table th, table td'))
      .filter(c => c.innerText.trim() && c.offsetParent !== null);
  const bad = [];
  for (const cell of cells) {
    const style = getComputedStyle(cell);
    const back = behind(cell);
    const fore = parse(style.color);
    if (back === null || fore === null) {
      bad.push({text: cell.innerText.trim().slice(0, 30), ratio: null,
                color: style.color, background: style.backgroundColor});
      continue;
    }
    const text = over(fore, back);
    const [hi, lo] = [luminance(text), luminance(back)].sort((a, b) => b - a);
    const ratio = (hi + 0.05) / (lo + 0.05);
    if (ratio < minimum) {
      bad.push({text: cell.innerText.trim().slice(0, 30), ratio: Math.round(ratio * 100) / 100,
                color: style.color, background: 'rgb(' + back.slice(0, 3).map(Math.round) + ')'});
    }
  }
  return {cells: cells.length, bad: bad};
}"""

# Horizontal overflow: the page wider than the viewport (with the widest culprits), and
# printed outputs that do not fit their box (cut, or scrolled sideways).
OVERFLOW_JS = """() => {
  const width = document.documentElement.clientWidth;
  const page = document.documentElement.scrollWidth;
  const describe = e => e.tagName.toLowerCase() + (e.className && e.className.baseVal === undefined
      ? '.' + String(e.className).trim().split(/\\s+/).join('.') : '') +
      ' "' + (e.innerText || e.textContent || '').trim().slice(0, 40) + '"';
  let culprits = [];
  if (page > width + 1) {
    const clipped = e => {  // inside a box that scrolls or clips: it cannot widen the page
      for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
        if (getComputedStyle(a).overflowX !== 'visible') return true;
      }
      return false;
    };
    const wide = Array.from(document.querySelectorAll('body *')).filter(e => {
      const r = e.getBoundingClientRect();
      return r.width > 0 && r.right > width + 1 && !clipped(e);
    });
    culprits = wide.filter(e => !wide.some(o => o !== e && e.contains(o)))
        .slice(0, 5)
        .map(e => describe(e) + ' right=' + Math.round(e.getBoundingClientRect().right));
  }
  const outputs = Array.from(document.querySelectorAll('div.cell_output pre'))
      .filter(p => p.offsetParent !== null && p.scrollWidth > p.clientWidth + 1)
      .slice(0, 5).map(p => describe(p) + ' ' + p.scrollWidth + ' px in ' + p.clientWidth);
  return {width: width, page: page, culprits: culprits, outputs: outputs};
}"""

EXPLORER_STATE_JS = """(box) => {
  const shown = Array.from(box.querySelectorAll('img[data-state]'))
      .filter(i => !i.hidden && getComputedStyle(i).display !== 'none');
  return shown.map(i => i.getAttribute('data-state') + ':' + i.src.length + ':' +
                   i.src.slice(-64));
}"""

# Headless Chromium does not ask for a favicon, a reader's browser does: the page must name
# one that loads (else browsers ask for /favicon.ico, a 404).
FAVICON_JS = """async () => {
  const link = document.querySelector('link[rel~="icon"]');
  if (!link) return 'no <link rel="icon">';
  const response = await fetch(link.href);
  return response.status;
}"""

# textContent, not innerText: a citation inside a closed fold has no rendered text
CITATIONS_JS = """() => Array.from(document.querySelectorAll('a[href*="references.html#"]'))
    .filter(a => a.closest('span[id]'))
    .map(a => ({target: a.getAttribute('href').split('#')[1],
                text: a.closest('span[id]').textContent}))"""

LABELS_JS = """() => Array.from(document.querySelectorAll('div.citation'))
    .map(d => ({id: d.id, label: (d.querySelector('.label') || d).innerText}))"""


def _context(text: str, matches) -> list[str]:
    """A little text around each match, for the failure message."""
    out = []
    for match in matches[:5]:
        at = match.start()
        out.append(text[max(at - 50, 0) : at + 50].replace("\n", " "))
    return out


def _norm_citation(text: str) -> str:
    return " ".join(re.sub(r"[\[\](),]", " ", text).split())


def _open(browser, server, page_name, *, mode="light", width=1400):
    """Open one page; return (context, page, response, problems list filled as it runs)."""
    context = browser.new_context(
        viewport={"width": width, "height": 900}, color_scheme=mode, java_script_enabled=True
    )
    page = context.new_page()
    problems: list[str] = []
    origin = urlparse(server)

    def route(r):
        url = urlparse(r.request.url)
        local = url.scheme in ("data", "blob") or (
            url.scheme == "http" and url.hostname == origin.hostname and url.port == origin.port
        )
        if local:
            r.continue_()
        else:
            problems.append(f"a request left the machine: {r.request.url[:120]}")
            r.abort()

    def console(message):
        if message.type in ("error", "warning"):
            problems.append(f"console {message.type}: {message.text[:300]}")

    def response(resp):
        if resp.status >= 400:
            problems.append(f"HTTP {resp.status}: {resp.url}")

    def failed(request):
        if urlparse(request.url).hostname == origin.hostname:
            problems.append(f"request failed: {request.url} ({request.failure})")

    page.route("**/*", route)
    page.on("console", console)
    page.on("pageerror", lambda exc: problems.append(f"JavaScript error: {exc}"))
    page.on("response", response)
    page.on("requestfailed", failed)
    resp = page.goto(f"{server}/{page_name}.html", wait_until="load")
    return context, page, resp, problems


@pytest.fixture(scope="module")
def bibliography(browser, server) -> dict[str, str]:
    """The References page's labels by anchor id."""
    context, page, _, _ = _open(browser, server, "book/references")
    try:
        return {e["id"]: e["label"] for e in page.evaluate(LABELS_JS)}
    finally:
        context.close()


def _move(control) -> None:
    """Move one control of a static explorer as a reader would."""
    kind = control.evaluate("c => c.tagName.toLowerCase() + ':' + (c.type || '')")
    if kind.startswith("select"):
        count = control.evaluate("c => c.options.length")
        current = control.evaluate("c => c.selectedIndex")
        control.select_option(index=(current + 1) % count)
    elif kind.endswith("checkbox"):
        control.click()
    else:  # a range: the arrow keys, one step
        at_end = control.evaluate("c => Number(c.value) >= Number(c.max)")
        control.focus()
        control.press("ArrowLeft" if at_end else "ArrowRight")


def _check_explorers(page, page_name: str, problems: list[str]) -> None:
    wanted = explorer_calls(page_name)
    boxes = page.locator(".relbias-explorer")
    found = boxes.count()
    if found < wanted:
        problems.append(
            f"{wanted} explorer(s) in the notebook, {found} in the page: the static form is "
            "missing (re-execute the chapter: python -m relbias.book execute)"
        )
    for i in range(found):
        box = boxes.nth(i)
        controls = box.locator("[data-control]")
        if controls.count() == 0:
            problems.append(f"explorer {i}: no control moves in the page")
        for j in range(controls.count()):
            control = controls.nth(j)
            name = control.get_attribute("data-control")
            before = box.evaluate(EXPLORER_STATE_JS)
            control.scroll_into_view_if_needed()
            _move(control)
            after = box.evaluate(EXPLORER_STATE_JS)
            if len(before) != 1 or len(after) != 1:
                problems.append(f"explorer {i}: {len(before)}, then {len(after)} figures shown")
            elif before == after:
                problems.append(f"explorer {i}: moving {name!r} did not change the figure")


CASES = [
    pytest.param(p, m, w, id=f"{p.split('/')[-1]}-{m}-{w}") for p in toc_pages() for m, w in VIEWS
]


@pytest.mark.parametrize(("page_name", "mode", "width"), CASES)
def test_page_in_chromium(browser, server, bibliography, page_name, mode, width):
    context, page, response, problems = _open(browser, server, page_name, mode=mode, width=width)
    try:
        assert response is not None and response.ok, f"{page_name}.html did not load"
        title = page.title()
        assert title and "404" not in title

        theme = page.evaluate("document.documentElement.dataset.theme")
        if theme != mode:
            problems.append(f"the page shows the {theme!r} theme, not {mode!r}")

        math = page.evaluate(MATHJAX_JS)
        if math["mathNodes"]:  # Sphinx loads MathJax only on pages with equations
            if not math["loaded"]:
                problems.append("MathJax did not load (is node_modules/mathjax installed?)")
            elif not math["containers"]:
                problems.append("the page has equations but MathJax typeset none")
            elif math["errors"]:
                problems.append(f"MathJax reported {math['errors']} TeX errors")

        text = page.evaluate(VISIBLE_TEXT_JS)
        raw = list(RAW_TEX.finditer(text))
        if raw:
            problems.append(f"raw TeX in the visible text: {_context(text, raw)}")
        fence = list(RAW_FENCE.finditer(text))
        if fence:
            problems.append(f"an unrendered directive in the visible text: {_context(text, fence)}")

        contrast = page.evaluate(CONTRAST_JS, MIN_CONTRAST)
        if contrast["bad"]:
            problems.append(
                f"{len(contrast['bad'])} of {contrast['cells']} table cells have a contrast "
                f"under {MIN_CONTRAST}: {contrast['bad'][:3]}"
            )

        overflow = page.evaluate(OVERFLOW_JS)
        if overflow["page"] > overflow["width"] + 1:
            problems.append(
                f"the page is {overflow['page']} px wide in a {overflow['width']} px "
                f"viewport: {overflow['culprits']}"
            )
        if overflow["outputs"]:
            problems.append(f"outputs wider than their box: {overflow['outputs']}")

        icon = page.evaluate(FAVICON_JS)
        if icon != 200:
            problems.append(f"the favicon: {icon}")

        images = page.evaluate(IMAGES_JS)
        broken = [i["src"] for i in images if not i["ok"]]
        if broken:
            problems.append(f"images that did not load: {broken}")

        if (mode, width) == VIEWS[0]:
            _check_once_per_page(page, page_name, bibliography, problems)

        assert not problems, f"{page_name} ({mode}, {width} px):\n- " + "\n- ".join(problems)
    except BaseException:
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        shot = SCREENSHOTS / f"{page_name.replace('/', '__')}-{mode}-{width}.png"
        page.screenshot(path=str(shot), full_page=True)
        raise
    finally:
        context.close()


# Each heading's text without its maths (MathJax's rendering, or the TeX before it runs),
# as the source's heading is compared without its $...$.
HEADINGS_JS = """() => Array.from(document.querySelectorAll(
    'main h1, main h2, main h3, main h4, main h5, main h6')).map(h => {
        const c = h.cloneNode(true);
        c.querySelectorAll('mjx-container, .math, script').forEach(e => e.remove());
        return c.textContent; })"""
# Literal blocks of the page that are not a code cell's input or output: [language, text].
LITERALS_JS = """() => Array.from(document.querySelectorAll('main div[class*="highlight-"]'))
    .filter(d => !d.closest('.cell'))
    .map(d => [(d.className.match(/highlight-([\\w-]+)/) || [null, ''])[1], d.innerText])"""
# Markdown or MyST that should have been rendered: roles and directives anywhere; in a block
# of no programming language also headings, bold, links and dropdown fences.
MYST_SYNTAX = re.compile(
    r"\{(glue|ref|numref|cite|doc|eq|math)(:\w+)?\}`|^\s*(```+|:::+)\s*\{", re.M
)
MARKDOWN_SYNTAX = re.compile(r"^#{1,6} \S|\*\*[^*\n]+\*\*|\]\([^)\s]+\)", re.M)
# A directive's fence in the visible text outside code: a fence whose title holds a backtick is
# no fence in CommonMark, and the block renders as a paragraph that starts with the fence.
RAW_FENCE = re.compile(r"(```+|:::+)\s*\{[a-z]")
PLAIN_LANGUAGES = {"", "default", "none", "text", "md", "markdown", "myst"}


def markdown_headings(page_name: str) -> list[str]:
    """The headings of the page's notebook's markdown cells (outside fenced blocks)."""
    path = ROOT / f"{page_name}.ipynb"
    if not path.is_file():
        return []
    found = []
    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        fence = None
        for line in "".join(cell["source"]).splitlines():
            opened = re.match(r"^\s*(`{3,}|:{3,})", line)
            if opened:
                mark = opened.group(1)
                if fence is None:
                    fence = mark
                elif (
                    mark[0] == fence[0]
                    and len(mark) >= len(fence)
                    and not line.strip()[len(mark) :]
                ):
                    fence = None
                continue
            heading = re.match(r"^(#{1,6})\s+(.*)$", line)
            if heading and fence is None:
                found.append(heading.group(2))
    return found


def _plain(text: str) -> str:
    """A heading's words without markup, for comparing the source with the page."""
    text = re.sub(r"\{[a-z:-]+\}`([^`<]*)(<[^>]*>)?`", r"\1", text)  # roles: their text
    text = re.sub(r"\$[^$]*\$", "", text)  # maths renders differently
    return re.sub(r"[^0-9a-z]+", "", text.lower())


def _check_rendering(page, page_name: str, problems: list[str]) -> None:
    """Every heading of the notebook's markdown is a heading of the page, and no literal block
    that is not a code cell shows markdown or MyST syntax (a fence closed too early or too
    late turns the rest of a section into a code block)."""
    shown = {_plain(h) for h in page.evaluate(HEADINGS_JS)}
    missing = [h for h in markdown_headings(page_name) if _plain(h) and _plain(h) not in shown]
    if missing:
        problems.append(f"markdown headings that are not headings of the page: {missing[:5]}")
    for language, text in page.evaluate(LITERALS_JS):
        raw = MYST_SYNTAX.search(text) or (
            language in PLAIN_LANGUAGES and MARKDOWN_SYNTAX.search(text)
        )
        if raw:
            problems.append(
                f"a literal block ({language or 'no language'}) shows unrendered syntax "
                f"{raw.group(0)!r}: {text[:120]!r}"
            )


def test_markdown_headings_skip_fenced_blocks():
    # a heading inside a fenced block is not a heading; ``{dropdown}`` blocks are skipped
    # like code (what they hold is checked by the page's headings anyway)
    assert "Learning goals" in markdown_headings("book/08_side_by_side")
    assert _plain("Sixteen times the training length") == "sixteentimesthetraininglength"
    assert _plain("T5's buckets, {ref}`Fig. 1 <fig-x>`") == "t5sbucketsfig1"
    assert MYST_SYNTAX.search("see {ref}`sec-x`") and MYST_SYNTAX.search("````{dropdown} x")
    assert RAW_FENCE.search("```{dropdown} Which backend") and RAW_FENCE.search(":::{note}")
    assert not RAW_FENCE.search('a dict {"alibi": 1} and ``` alone')
    assert MARKDOWN_SYNTAX.search("## Chapter map") and not MARKDOWN_SYNTAX.search("x = a ** 2")


def _check_once_per_page(page, page_name: str, bibliography, problems: list[str]) -> None:
    """What depends on neither mode nor width: launch buttons, citations, explorers."""
    owner, name, branch = repository()
    notebook = f"{page_name}.ipynb"
    if (ROOT / notebook).is_file():
        hrefs = page.eval_on_selector_all("a[href]", "els => els.map(e => e.href)")
        colab = f"https://colab.research.google.com/github/{owner}/{name}/blob/{branch}/{notebook}"
        binder = f"https://mybinder.org/v2/gh/{owner}/{name}/{branch}?urlpath=tree/{notebook}"
        if colab not in hrefs:
            problems.append(f"no Colab launch button to {colab}")
        if binder not in hrefs:
            problems.append(f"no Binder launch button to {binder}")

    labels = [e["label"] for e in page.evaluate(LABELS_JS)]
    not_author_year = [x for x in labels if not re.fullmatch(r"\[?[^\[\]]+, \d{4}[a-z]?\]?", x)]
    if not_author_year:
        problems.append(f"bibliography labels not 'Author, Year': {not_author_year[:5]}")
    for cite in page.evaluate(CITATIONS_JS):
        label = bibliography.get(cite["target"])
        if label is None:
            problems.append(f"a citation links to no reference: #{cite['target']}")
        elif _norm_citation(label) not in _norm_citation(cite["text"]):
            problems.append(f"citation {cite['text']!r} differs from its label {label!r}")

    _check_rendering(page, page_name, problems)
    _check_explorers(page, page_name, problems)  # last: it moves controls
