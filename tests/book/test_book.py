"""The book's sources are consistent: table of contents, chapter conventions, stored outputs.

These checks need no kernel and no build; nbval (in scripts/test.sh) re-runs every
chapter and compares its outputs, and tests/test_browser.py checks the built pages.

- every notebook in book/ is in _toc.yml, and every _toc.yml entry exists;
- the first code cell of every chapter is the Colab install cell, installing from the
  repository URL of _config.yml, and prints nothing; the second picks the runtime;
- stored outputs come from one clean top-to-bottom run: execution counts 1..n, no
  errors (the build shows them as they are: myst-nb's "off" mode), no widget state, no
  SVG, no machine-specific text;
- every {glue} role has a glued value in the same notebook, every {cite} key is in
  references.bib, and a chapter that cites has a bibliography;
- every chapter has learning goals, exercises and solutions;
- every numbered chapter (01-08) ends with a summary ("What to remember") and has an
  exercise whose worked solution retrains a model; every figure has a caption and alt
  text; every equation of the book's section that a chapter displays carries the book's
  number and a label; one notation (no ``\top``, no ``b(i, j)`` for a bias);
- the cells nbval skips or does not compare are counted and listed (kept few).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from book_build import wait_for_the_build

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
ARTIFACTS = ROOT / "artifacts"

# nbval's markers: cell tags and comment lines that skip a cell or ignore its output.
NBVAL_TAGS = {"nbval-skip", "nbval-ignore-output", "raises-exception", "nbval-check-output"}
NBVAL_COMMENTS = (
    "# NBVAL_SKIP",
    "# NBVAL_IGNORE_OUTPUT",
    "# NBVAL_RAISES_EXCEPTION",
    "# PYTEST_VALIDATE_IGNORE_OUTPUT",
)
# Only training demos are marked: their numbers depend on the machine's float rounding
# (thread count, instruction set), so the cell that trains and shows them is not compared
# and the next cell asserts the claim. At most three such cells per chapter (chapter 4 trains
# the probe, ALiBi's far recall and Sandwich), 19 in all (ten chapters and the appendix;
# chapter 10: its generated text and the glued numbers of its two live runs).
MAX_MARKED_PER_CHAPTER = 3
MAX_MARKED_TOTAL = 19


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def code_cells(nb: dict) -> list[dict]:
    return [c for c in nb["cells"] if c["cell_type"] == "code"]


def markdown(nb: dict) -> str:
    return "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "markdown")


def toc_entries() -> list[str]:
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    entries = [toc["root"]]

    def walk(items):
        for item in items or []:
            if "file" in item:
                entries.append(item["file"])
            walk(item.get("sections"))

    walk(toc.get("chapters"))
    for part in toc.get("parts") or []:
        walk(part.get("chapters"))
    return entries


def config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def repository_url() -> str:
    return config()["repository"]["url"].rstrip("/")


NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
NOTEBOOK_IDS = [p.stem for p in NOTEBOOKS]
# A chapter is a lesson (book/NN_name.ipynb) and, once split, its lab notes
# (book/NN_name_lab.ipynb, a sub-page of the lesson: ../shared/BOOK_STYLE.md).
LABS = [p for p in NOTEBOOKS if p.stem.endswith("_lab")]
LAB_IDS = [p.stem for p in LABS]
LESSONS = [p for p in NOTEBOOKS if not p.stem.endswith("_lab")]
LESSON_IDS = [p.stem for p in LESSONS]


def lab_of(lesson: Path) -> Path:
    return lesson.with_name(f"{lesson.stem}_lab.ipynb")


def lesson_of(lab: Path) -> Path:
    return lab.with_name(lab.name.replace("_lab.ipynb", ".ipynb"))


LESSONS_WITH_LABS = [p for p in LESSONS if lab_of(p).is_file()]


def output_text(output: dict) -> str:
    """All textual content of one output (stream text and every text-like mime type)."""
    if output.get("output_type") == "stream":
        text = output.get("text", "")
        return "".join(text) if isinstance(text, list) else text
    parts = []
    for mime, value in (output.get("data") or {}).items():
        if mime.startswith("text/") or mime.endswith("+json") or "papermill" in mime:
            if isinstance(value, list):  # nbformat stores text as a list of lines
                value = "".join(value)
            parts.append(value if isinstance(value, str) else json.dumps(value))
    return "\n".join(parts)


# --- the table of contents -------------------------------------------------------------------


def test_config_and_toc_are_at_the_top_level():
    assert (ROOT / "_config.yml").is_file() and (ROOT / "_toc.yml").is_file()
    assert (ROOT / "references.bib").is_file()


def test_every_toc_entry_exists():
    missing = [
        e
        for e in toc_entries()
        if not any((ROOT / f"{e.removesuffix('.ipynb')}{s}").is_file() for s in (".ipynb", ".md"))
    ]
    assert not missing, f"_toc.yml lists files that do not exist: {missing}"


def test_every_notebook_is_in_the_toc():
    listed = {e.removesuffix(".ipynb") for e in toc_entries()}
    absent = [
        p.relative_to(ROOT).as_posix()
        for p in NOTEBOOKS
        if p.relative_to(ROOT).with_suffix("").as_posix() not in listed
    ]
    assert not absent, f"notebooks in book/ missing from _toc.yml: {absent}"


def _toc_children() -> dict:
    """``{entry: [its sections' files]}`` of _toc.yml, and the root's chapters under the root."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    children = {toc["root"]: [c["file"] for c in toc.get("chapters") or [] if "file" in c]}

    def walk(items):
        for item in items or []:
            if "file" in item:
                children[item["file"]] = [c["file"] for c in item.get("sections") or []]
            walk(item.get("sections"))

    walk(toc.get("chapters"))
    return children


@pytest.mark.parametrize("path", LABS, ids=LAB_IDS)
def test_lab_notes_are_a_sub_page_of_their_lesson(path):
    """Lab notes sit under their lesson (the root's: its first chapter entry)."""
    lesson = lesson_of(path)
    assert lesson.is_file(), f"{path.name} has no lesson {lesson.name}"
    children = _toc_children().get(lesson.relative_to(ROOT).with_suffix("").as_posix(), [])
    lab = path.relative_to(ROOT).with_suffix("").as_posix()
    assert lab in children[:1], f"{lab} must be the first sub-page of {lesson.name} in _toc.yml"


@pytest.mark.parametrize("path", LESSONS_WITH_LABS, ids=lambda p: p.stem)
def test_a_lesson_opens_with_the_answer_linked_to_its_lab_notes(path):
    """The answer first: a box in the lesson's first three Markdown cells whose verdicts link
    to the lab notes (a {doc} link to the page or a {ref} to one of its labels)."""
    nb = load(path)
    opening = "\n".join(source(c) for c in nb["cells"] if c["cell_type"] == "markdown")
    first = "\n".join(
        source(c) for c in [c for c in nb["cells"] if c["cell_type"] == "markdown"][:3]
    )
    assert re.search(r"\{(admonition|note|tip|important)\}", first), "no answer box up front"
    lab_text = markdown(load(lab_of(path)))
    labels = set(re.findall(r"^\(([\w-]+)\)=", lab_text, re.M))
    refs = set(re.findall(r"\{ref\}`[^`]*?<([\w-]+)>`|\{ref\}`([\w-]+)`", first))
    refs = {a or b for a, b in refs}
    doc_link = lab_of(path).stem in first
    assert doc_link or refs & labels, "the answer box links to none of the lab notes' sections"
    assert opening  # the lesson has prose


@pytest.mark.parametrize("path", LESSONS_WITH_LABS, ids=lambda p: p.stem)
def test_a_lesson_hides_its_plumbing(path):
    """The install cell and the banner run (Colab, nbval) but are not shown on the page."""
    first, second = code_cells(load(path))[:2]
    for cell, name in ((first, "install"), (second, "banner")):
        tags = set(cell.get("metadata", {}).get("tags", []))
        assert tags & {"remove-cell", "remove-input"}, f"the {name} cell is shown on the page"
    assert "remove-cell" in second.get("metadata", {}).get("tags", []), "the banner is shown"


def test_toc_has_no_duplicates():
    entries = [e.removesuffix(".ipynb") for e in toc_entries()]
    assert len(entries) == len(set(entries))


# --- _config.yml -------------------------------------------------------------------------------


def test_config_essentials():
    cfg = config()
    assert cfg["only_build_toc_files"] is True
    assert cfg["repository"]["branch"] == "main"
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", repository_url())
    buttons = cfg["launch_buttons"]
    assert buttons["colab_url"] and buttons["binderhub_url"]
    assert buttons["notebook_interface"] == "classic"
    sphinx = cfg["sphinx"]
    extensions = sphinx.get("extra_extensions", []) + sphinx["config"].get("extensions", [])
    assert "sphinx_exercise" in extensions
    assert cfg["bibtex_bibfiles"] == ["references.bib"]


def test_mathjax_is_served_by_the_book():
    """MathJax comes from node_modules (npm, package.json), copied into _static."""
    wait_for_the_build()  # scripts/book.sh copies it: built beside the tests by test.sh
    sphinx = config()["sphinx"]["config"]
    assert not sphinx["mathjax_path"].startswith(("http:", "https:", "//"))
    static = [ROOT / p for p in sphinx["html_static_path"]]
    assert any((p / sphinx["mathjax_path"]).is_file() for p in static), (
        f"{sphinx['mathjax_path']} is not in {sphinx['html_static_path']}: run `npm ci` "
        "(scripts/setup.sh does)"
    )


# --- conventions of every chapter --------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_first_code_cell_installs_relbias_only_in_colab(path):
    first = code_cells(load(path))[0]
    src = source(first)
    assert '"google.colab" in sys.modules' in src, "the first code cell must check for Colab"
    urls = re.findall(r"git\+(https://[^\s\"'@]+)@main", src)
    assert urls == [repository_url()], (
        f"the install cell must pip-install relbias from {repository_url()}@main "
        f"(_config.yml's repository.url), found {urls}"
    )
    # the book extra, with more extras where a chapter needs them (chapter 10: relbias[book,hf])
    assert re.search(r"relbias\[book(,\w+)*\]", src), "the install cell installs relbias[book]"
    assert not first.get("outputs"), "outside Colab the install cell prints nothing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_second_code_cell_picks_the_runtime(path):
    second = code_cells(load(path))[1]
    assert "runtime_banner(" in source(second), (
        "the second code cell imports and calls relbias.book.runtime_banner()"
    )


@pytest.mark.parametrize("path", LESSONS, ids=LESSON_IDS)
def test_chapter_has_goals_exercises_and_solutions(path):
    text = markdown(load(path))
    assert re.search(r"^#+ .*learning goals", text, re.I | re.M), "no 'Learning goals' heading"
    assert "{exercise}" in text or "{exercise-start}" in text, "no exercise"
    assert "{solution}" in text or "{solution-start}" in text, "no worked solution"
    # sphinx-exercise fails the build on a solution-end without its solution-start
    gated = re.findall(r"^```\{(solution-start|solution-end)\}", text, re.M)
    assert gated == ["solution-start", "solution-end"] * (len(gated) // 2), gated


@pytest.mark.parametrize("path", LESSONS, ids=LESSON_IDS)
def test_chapter_has_an_explorer_and_a_static_figure(path):
    """Sliders for a live kernel, and a PNG figure for the static book."""
    nb = load(path)
    assert any("nb.explorer(" in source(c) for c in code_cells(nb)), "no explorer"
    pngs = [
        o for c in code_cells(nb) for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    assert pngs, "no figure in the stored outputs"


# --- the shape of a chapter: summary, retrain exercise, captions, the book's equations ----------

CHAPTERS = [p for p in LESSONS if p.name[:2].isdigit()]
CHAPTER_IDS = [p.stem for p in CHAPTERS]
# A worked solution "retrains" when one of its code cells calls one of these (the lab's
# training entry points).
TRAINING_CALL = re.compile(
    r"\b(train_lm|train_and_evaluate|train_and_probe|train_with_trainer|live_retrofit)\("
)  # train_with_trainer: chapter 10's Hugging Face Trainer (relbias.book.hf_chapter);
# live_retrofit: chapter 11's fine-tune of a stored base (relbias.book.retrofit)
# The book's equations (Xiao & Zhu, arXiv 2501.09223 v2, §2.3.5) that each chapter
# displays. Each must be a displayed equation carrying the book's number as
# \tag{2.NN}, right after a MyST target (eq-2-NN)= so that any chapter can link to it
# with {ref}`Eq. (2.NN) <eq-2-NN>`. A display that holds several of the book's equations
# carries their range, \tag{2.NN–2.MM}, and the label of the first. (Sphinx's own
# equation numbers, from
# "$$ ... $$ (label)", count 1, 2, ... per page and cannot carry the book's numbers.)
BOOK_EQUATIONS = {
    "02_offset_bias": ["2.75", "2.76", "2.77"],
    "03_t5_buckets": ["2.78", "2.79", "2.80", "2.81"],
    "04_heuristic_biases": ["2.82", "2.83", "2.84"],
    "07_rope_interpolation": ["2.85", "2.90", "2.92", "2.97", "2.100", "2.101"],
}
DISPLAY = re.compile(r"^\$\$\s*\n(.*?)\n\$\$", re.S | re.M)
TAG = re.compile(r"\\tag\{([^}]*)\}")


def solution_code_cells(nb: dict) -> list[dict]:
    """The code cells between a ```{solution-start}``` and its ```{solution-end}```."""
    inside, found = False, []
    for cell in nb["cells"]:
        src = source(cell)
        if cell["cell_type"] == "markdown":
            for fence in re.findall(r"^```\{(solution-start|solution-end)\}", src, re.M):
                inside = fence == "solution-start"
        elif inside:
            found.append(cell)
    return found


def figure_cells(nb: dict) -> list[tuple[int, dict]]:
    """(code-cell index, cell) of every cell that stores a PNG, explorers excepted."""
    return [
        (i, c)
        for i, c in enumerate(code_cells(nb))
        if "nb.explorer(" not in source(c)
        and any("image/png" in o.get("data", {}) for o in c.get("outputs", []))
    ]


def displayed_equations(text: str) -> list[tuple[str, str]]:
    """(the line before, the body) of every $$ display of a chapter's Markdown."""
    found = []
    for match in DISPLAY.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        found.append((before.strip(), match.group(1)))
    return found


@pytest.mark.parametrize("path", CHAPTERS, ids=CHAPTER_IDS)
def test_chapter_has_a_summary(path):
    text = markdown(load(path))
    heading = re.search(r"^## What to remember\s*$", text, re.M)
    assert heading, "no '## What to remember' section"
    exercises = re.search(r"^## Exercises\s*$", text, re.M)
    assert exercises and heading.start() < exercises.start(), "the summary precedes the exercises"
    bullets = re.findall(r"^- ", text[heading.end() : exercises.start()], re.M)
    assert 3 <= len(bullets) <= 8, f"a summary of 3 to 8 points, found {len(bullets)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=CHAPTER_IDS)
def test_chapter_has_a_retrain_exercise(path):
    """At least one worked solution changes a setting and trains again (quick)."""
    cells = solution_code_cells(load(path))
    assert any(TRAINING_CALL.search(source(c)) for c in cells), (
        "no exercise whose solution retrains a model (a solution code cell calling "
        "train_lm, train_and_evaluate or train_and_probe)"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_every_figure_has_a_caption_and_alt_text(path):
    """myst-nb renders a cell's PNG as a numbered figure from the cell's metadata:
    ``{"mystnb": {"figure": {"caption": ..., "name": "fig-..."}, "image": {"alt": ...}}}``."""
    missing = []
    for i, cell in figure_cells(load(path)):
        meta = cell.get("metadata", {}).get("mystnb", {})
        figure, image = meta.get("figure", {}), meta.get("image", {})
        if not (figure.get("caption") and str(figure.get("name", "")).startswith("fig-")):
            missing.append(f"code cell {i}: no figure caption/name")
        if not image.get("alt"):
            missing.append(f"code cell {i}: no alt text")
        pngs = sum("image/png" in o.get("data", {}) for o in cell.get("outputs", []))
        if pngs != 1:
            missing.append(f"code cell {i}: {pngs} images in one captioned figure")
    assert not missing, missing


def test_figure_names_are_unique():
    """Figure names are Sphinx labels, global to the book: a duplicate breaks the build."""
    names = [
        c["metadata"]["mystnb"]["figure"]["name"]
        for p in NOTEBOOKS
        for _, c in figure_cells(load(p))
        if "name" in c.get("metadata", {}).get("mystnb", {}).get("figure", {})
    ]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_the_books_equations_carry_its_numbers(path):
    text = markdown(load(path))
    displays = displayed_equations(text)
    tagged = {}
    for before, body in displays:
        tags = TAG.findall(body)
        for tag in tags:
            assert re.fullmatch(r"2\.\d+(–2\.\d+)?", tag), f"\\tag{{{tag}}}: not the book's numbers"
            tag = tag.split("–")[0]
            label = f"(eq-{tag.replace('.', '-')})="
            assert before == label, f"Eq. {tag}: put {label} on the line above its $$"
            assert tag not in tagged, f"Eq. {tag} is displayed with its number twice"
            tagged[tag] = body
    expected = BOOK_EQUATIONS.get(path.stem, [])
    absent = [n for n in expected if n not in tagged]
    assert not absent, f"the book's equations {absent} are not displayed with \\tag{{...}}"


def test_equation_numbers_and_links_are_unique_and_resolve():
    tags, links = [], set()
    for path in NOTEBOOKS:
        text = markdown(load(path))
        tags += [
            t.split("–")[0] for _, body in displayed_equations(text) for t in TAG.findall(body)
        ]
        links |= set(re.findall(r"<(eq-2-\d+)>`", text))
    assert len(tags) == len(set(tags)), "an equation of the book is numbered in two chapters"
    targets = {f"eq-{t.replace('.', '-')}" for t in tags}
    assert links <= targets, f"links to equations that no chapter displays: {links - targets}"


@pytest.mark.parametrize("path", CHAPTERS, ids=CHAPTER_IDS)
def test_one_notation(path):
    r"""The transpose is the book's ^{\mathrm{T}}; b(...) is T5's bucket of an offset only."""
    nb = load(path)
    text = markdown(nb)
    assert "\\top" not in text, "write transposes as ^{\\mathrm{T}}, as the book does"
    assert not re.search(r"b\(i,\s*j\)", text), "b(i, j) is not a bias: write PE(i, j)"


def test_the_quick_brown_fox_is_asked_once():
    """The course pages' distance-penalty question is answered in one chapter only."""
    asked = [p.name for p in NOTEBOOKS if "quick brown fox" in p.read_text(encoding="utf-8")]
    assert len(asked) <= 1, asked


# --- stored outputs ----------------------------------------------------------------------------


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_outputs_are_one_clean_run(path):
    cells = code_cells(load(path))
    counts = [c.get("execution_count") for c in cells]
    assert counts == list(range(1, len(cells) + 1)), (
        f"execution counts {counts}: store the outputs of one top-to-bottom run "
        f"(python -m relbias.book execute {path.relative_to(ROOT)})"
    )
    errors = [
        i for i, c in enumerate(cells) for o in c.get("outputs", []) if o["output_type"] == "error"
    ]
    assert not errors, f"code cells {errors} stored an error"


def test_the_build_shows_the_stored_outputs():
    """The build never executes a chapter: it shows the outputs that nbval validated."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    assert config["execute"]["execute_notebooks"] == "off"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_outputs_are_portable(path):
    nb = load(path)
    assert "widgets" not in nb.get("metadata", {}), (
        "widget state is stored in the notebook: execute it with "
        "`python -m relbias.book execute`, which does not store it"
    )
    # Memory addresses, and paths of the machine that ran the notebook (this checkout, a
    # home folder, an installed package): they would differ on the machine that re-runs it.
    here = re.escape(str(ROOT))
    machine = re.compile(rf"0x[0-9a-f]{{8,}}|{here}|/home/|/Users/|site-packages")
    for i, cell in enumerate(code_cells(nb)):
        for out in cell.get("outputs", []):
            assert "image/svg+xml" not in out.get("data", {}), f"cell {i}: SVG output (use PNG)"
            text = output_text(out)
            hit = machine.search(text)
            assert not hit, f"code cell {i}: machine-specific output {hit.group(0)!r}"
            assert "\r" not in text, f"code cell {i}: a progress bar was stored"
            # nbval compares stderr too, and a warning names a temporary file of the kernel
            assert out.get("name") != "stderr", f"code cell {i}: stderr stored: {text[:200]!r}"


def nbval_sanitizers() -> list[tuple[re.Pattern, str]]:
    """The regex/replace pairs of book/sanitize.cfg, as nbval applies them."""
    pairs, pattern = [], None
    for line in (BOOK / "sanitize.cfg").read_text().splitlines():
        if line.startswith("regex:"):
            pattern = re.compile(line.partition(":")[2].strip())
        elif line.startswith("replace:") and pattern is not None:
            pairs.append((pattern, line.partition(":")[2].strip()))
            pattern = None
    return pairs


def compared_text(cell: dict) -> list[str]:
    """What nbval compares of one code cell's outputs, after the book's sanitizers (nothing
    for a cell it skips or whose output it ignores; images are never compared)."""
    tags = set(cell.get("metadata", {}).get("tags", []))
    src = source(cell)
    if tags & {"nbval-skip", "nbval-ignore-output"} or any(c in src for c in NBVAL_COMMENTS):
        return []
    texts = [output_text(out) for out in cell.get("outputs", [])]
    for pattern, replace in nbval_sanitizers():
        texts = [pattern.sub(replace, t) for t in texts]
    return texts


DECIMAL = re.compile(r"(?<![\w.])[-+]?(\d*\.\d+|\d+\.\d*)(?:[eE][-+]?\d+)?(?![\w.])")
#: Significant digits a compared output may print (a glued float keeps 6:
#: relbias.book.display.GLUED_DIGITS); more would show the last digits of a float, which
#: another CPU's floating-point path changes.
MAX_PRINTED_DIGITS = 6


def significant_digits(number: str) -> int:
    mantissa = re.split("[eE]", number.lstrip("+-"))[0].replace(".", "")
    return len(mantissa.lstrip("0")) or 1


def test_significant_digits():
    assert significant_digits("0.0039062") == 5 and significant_digits("63.94") == 4
    assert significant_digits("4.000000") == 7 and significant_digits("1.2e-07") == 2
    assert [m.group(0) for m in DECIMAL.finditer("a 1.5 b x1.2 3.25e-4 v0.1.0 7.")] == [
        "1.5",
        "3.25e-4",
        "7.",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_compared_outputs_do_not_depend_on_the_cpus_float_path(path):
    """What nbval compares must come out the same on any CPU: no image bytes inside HTML
    (an explorer's pre-drawn states are compared by their controls and settings: the
    sanitizer in book/sanitize.cfg) and no number printed to more significant digits than
    :data:`MAX_PRINTED_DIGITS` (the last digits of a float differ between CPUs). The test
    command also re-runs some notebooks under a second CPU code path (scripts/test.sh)."""
    for i, cell in enumerate(code_cells(load(path))):
        for text in compared_text(cell):
            assert "base64," not in text.replace("base64,PNG", ""), (
                f"code cell {i}: image bytes in a compared output"
            )
            long = [
                m.group(0)
                for m in DECIMAL.finditer(text)
                if significant_digits(m.group(0)) > MAX_PRINTED_DIGITS
            ]
            assert not long, (
                f"code cell {i}: {long[:5]} print more than {MAX_PRINTED_DIGITS} significant "
                "digits (round them, or glue them: relbias.book.display.glue rounds)"
            )


# --- glue, citations ---------------------------------------------------------------------------

GLUE_ROLE = re.compile(r"\{glue(?::\w+)?\}`([^`]+)`")
CITE_ROLE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")


def glued_names(nb: dict) -> set[str]:
    names = set()
    for cell in code_cells(nb):
        for out in cell.get("outputs", []):
            scrap = (out.get("metadata") or {}).get("scrapbook") or {}
            if "name" in scrap:
                names.add(scrap["name"])
    return names


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_every_glue_role_has_a_value(path):
    nb = load(path)
    used = {m.split(":")[0] for m in GLUE_ROLE.findall(markdown(nb)) if "::" not in m}
    missing = sorted(used - glued_names(nb))
    assert not missing, f"{{glue}} roles without a glued value in this notebook: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_each_glue_name_is_stored_once(path):
    """A name glued by two cells fails a clean book build ("glue key ... duplicate"), while an
    incremental build of the changed page alone may pass."""
    counts: dict[str, int] = {}
    for cell in code_cells(load(path)):
        for out in cell.get("outputs", []):
            name = ((out.get("metadata") or {}).get("scrapbook") or {}).get("name")
            if name:
                counts[name] = counts.get(name, 0) + 1
    twice = sorted(n for n, k in counts.items() if k > 1)
    assert not twice, f"glue names stored by more than one output: {twice}"


def bib_keys() -> set[str]:
    return set(re.findall(r"^@\w+\{([^,\s]+),", (ROOT / "references.bib").read_text(), re.M))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_citations_resolve(path):
    text = markdown(load(path))
    keys = {k.strip() for group in CITE_ROLE.findall(text) for k in group.split(",")}
    unknown = sorted(keys - bib_keys())
    assert not unknown, f"cited keys missing from references.bib: {unknown}"
    if keys:
        assert "{bibliography}" in text, "a chapter that cites needs a ```{bibliography}```"
    for block in re.findall(r"```\{bibliography\}(.*?)```", text, re.S):
        assert ":list: bullet" in block, (
            "a chapter's bibliography must be a ':list: bullet' filtered to the page "
            "(':filter: docname in docnames'): the citations themselves live in "
            "book/references.md, and a key defined twice breaks the build"
        )


# --- nbval ---------------------------------------------------------------------------------------


def nbval_marked_cells() -> list[tuple[str, int, str]]:
    """(notebook, code-cell index, marker) for every cell nbval skips or does not compare."""
    found = []
    for path in NOTEBOOKS:
        for i, cell in enumerate(code_cells(load(path))):
            tags = set(cell.get("metadata", {}).get("tags", [])) & NBVAL_TAGS
            comments = {
                line.strip()
                for line in source(cell).splitlines()
                if line.strip().startswith(NBVAL_COMMENTS)
            }
            for marker in sorted(tags | comments):
                found.append((path.name, i, marker))
    return found


def test_cells_that_nbval_skips_or_ignores_are_few():
    marked = nbval_marked_cells()
    ARTIFACTS.mkdir(exist_ok=True)
    lines = [f"{nb} code cell {i}: {marker}" for nb, i, marker in marked]
    (ARTIFACTS / "nbval_marked_cells.txt").write_text(
        f"{len(marked)} cells that nbval skips or does not compare\n" + "\n".join(lines) + "\n"
    )
    print("\n".join([f"nbval marked cells: {len(marked)}", *lines]))
    per_chapter: dict[str, int] = {}
    for nb, _, _ in marked:
        per_chapter[nb] = per_chapter.get(nb, 0) + 1
    crowded = {nb: n for nb, n in per_chapter.items() if n > MAX_MARKED_PER_CHAPTER}
    assert not crowded, f"more than {MAX_MARKED_PER_CHAPTER} nbval-marked cells: {crowded}"
    assert len(marked) <= MAX_MARKED_TOTAL, lines


def test_sanitize_file_is_valid():
    """book/sanitize.cfg (passed to nbval by scripts/test.sh) as nbval reads it.

    nbval takes each ``regex: ...`` line with the ``replace: ...`` line right below it, so
    every section must hold such a pair, and every regex must compile.
    """
    from nbval.plugin import get_sanitize_patterns

    text = (BOOK / "sanitize.cfg").read_text()
    sections = re.findall(r"^\[[^\]]+\]\s*$", text, re.M)
    pairs = get_sanitize_patterns(text)
    assert sections, "book/sanitize.cfg has no sanitiser"
    assert len(pairs) == len(sections), (
        f"{len(sections)} sections but nbval reads {len(pairs)} regex/replace pairs: put "
        "'replace: ...' on the line right after 'regex: ...'"
    )
    for regex, _ in pairs:
        re.compile(regex)


# --- the chapters' helpers (relbias.book) ---------------------------------------------------


def test_show_source_shows_the_real_source():
    import inspect

    import relbias
    from relbias import book as nb

    shown = nb.show_source(relbias.OffsetBias, display=False)
    bundle = shown._repr_mimebundle_()
    assert inspect.getsource(relbias.OffsetBias).strip() in bundle["text/plain"]
    header = "`relbias.biases.offset.OffsetBias`, from `relbias/biases/offset.py`"
    assert bundle["text/markdown"].startswith(header)
    assert "```python" in bundle["text/markdown"]
    short = nb.show_source(relbias.OffsetBias, docstring=False, display=False).plain
    assert '"""' not in short.split("def __init__")[0]
    # a decorated method is credited to the file that defines it, not the decorator's
    decorated = nb.show_source(relbias.biases.kerple._Kerple.project_, display=False).plain
    assert decorated.startswith(
        "`relbias.biases.kerple._Kerple.project_`, from `relbias/biases/kerple.py`"
    )


@pytest.mark.parametrize(
    "name,first,last",
    [
        ("OffsetBias", "struct OffsetBias {", "};"),
        ("attend_block", "template <typename Bias>", "}"),
        ("exp_or_zero", "inline Vec exp_or_zero(const Vec& x) {", "}"),
    ],
)
def test_show_cpp_shows_one_whole_definition(name, first, last):
    """The C++ shown in the book is a whole definition cut from the kernel's real source."""
    from relbias import book as nb
    from relbias.attention import fused

    shown = nb.show_cpp(name, display=False)
    code = shown.plain.split("\n\n", 1)[1]
    lines = code.splitlines()
    assert lines[0] == first and lines[-1] == last
    assert code in fused.SOURCE.read_text()
    assert code.count("{") == code.count("}")
    assert "```cpp" in shown._repr_mimebundle_()["text/markdown"]
    with pytest.raises(ValueError, match="no definition named 'nothing'"):
        nb.show_cpp("nothing")


@pytest.mark.parametrize(
    "text",
    [
        "20, 80, 320, 1280",
        "2.00, 1.68",
        "1.0",
        "7",
        "2^-8",
        "alibi, t5",
        "[1, 2]",
        "'quoted'",
        "None",
    ],
)
def test_glued_text_is_pasted_unchanged(text):
    """myst-nb literal_evals pasted text; nb.glue quotes what it would change."""
    from myst_nb.core.variables import format_plain_text

    from relbias.book.display import _pasteable

    assert format_plain_text(_pasteable(text), "") == text


def test_show_table_and_glue_values():
    import torch

    from relbias.book import display as nb

    table = nb.show_table(
        [[1, 2.5], [torch.tensor(3), torch.tensor(0.125)]], ["a", "b"], display=False
    )
    assert table.markdown.splitlines() == [
        "| a | b |",
        "|---:|---:|",
        "| 1 | 2.500 |",
        "| 3 | 0.125 |",
    ]
    with pytest.raises(ValueError, match="one value per header"):
        nb.show_table([[1]], ["a", "b"], display=False)
    assert nb._plain(torch.tensor(5)) == 5 and repr(nb._Text("abc")) == "abc"


def test_explorer_redraws_and_has_a_fixed_text_form():
    import relbias
    from relbias import book as nb

    def draw(n=4, name="alibi"):
        return nb.plot_bias_matrix(relbias.make_bias(name, 2), n, heads=[0])

    box = nb.explorer(draw, title="demo", n=(2, 8), name=["alibi", "sandwich"])
    assert repr(box) == "Explorer: demo (controls: n, name; live in Jupyter or Colab)"
    out = box.children[-1]
    box.children[1].value = 6
    box.children[2].value = "sandwich"
    assert len(out.outputs) == 1 and "image/png" in out.outputs[0]["data"]


def test_figures_are_png_and_repeatable():
    import relbias
    from relbias import book as nb

    def png():
        return nb.to_png(nb.plot_bias_by_offset(relbias.ALiBi(4), 32, mark=[16]))

    first = png()
    assert first.startswith(b"\x89PNG") and first == png()


def test_execute_command_checks_its_notebooks(capsys):
    """``python -m relbias.book execute`` refuses a notebook that does not exist."""
    from relbias.book.execute import main

    with pytest.raises(SystemExit) as exit_info:
        main(["execute", "no_such_chapter.ipynb"])
    assert exit_info.value.code == 2
    assert "no such notebook: no_such_chapter.ipynb" in capsys.readouterr().err


# --- one read-back of a bias by offset, one figure of it ---------------------------------------


def _randomised(name: str, heads: int = 3):
    """A bias of family ``name`` with random parameters (offset tables start at zero)."""
    import torch

    import relbias
    from relbias.lab.model import default_bias_kwargs

    torch.manual_seed(0)
    bias = relbias.make_bias(name, heads, **default_bias_kwargs(name, 16))
    with torch.no_grad():
        for weight in bias.parameters():
            weight.copy_(0.1 + torch.rand_like(weight))
    return bias


OFFSET_ONLY = ["offset", "t5", "alibi", "sandwich", "kerple_power", "kerple_log"]


@pytest.mark.parametrize("name", OFFSET_ONLY)
def test_learned_bias_is_the_offset_table(name):
    """For offset-only families the read-back is the module's own offset table."""
    import torch

    from relbias.lab.model import TinyLM
    from relbias.lab.readback import learned_bias

    bias = _randomised(name)
    assert bias.offset_only
    with torch.no_grad():
        for low, high in ((0, 40), (5, 9), (-7, 7)):
            expected = bias.offset_table(low, high).float()
            got = learned_bias(bias, high, min_offset=low)
            assert got.shape == (3, high - low + 1) and got.dtype == torch.float32
            assert torch.equal(got, expected)
        model = TinyLM(position=name, dim=12, depth=1, heads=3, train_len=16)
        model.bias.load_state_dict(bias.state_dict())
        assert torch.equal(learned_bias(model, 40), bias.offset_table(0, 40).float())


def test_learned_bias_reads_fire_at_one_query_position():
    """FIRE depends on the query position too: the row of query ``query_position``
    (default ``max_offset``) against keys ``query_position - offset``."""
    import torch

    from relbias.lab.readback import learned_bias

    fire = _randomised("fire")
    assert not fire.offset_only
    with torch.no_grad():
        for max_offset, query in ((15, None), (15, 15), (15, 100), (40, 63)):
            i = max_offset if query is None else query
            row = fire(i + 1)[:, i, :]  # keys j = 0..i
            expected = torch.stack([row[:, i - d] for d in range(max_offset + 1)], dim=1)
            got = learned_bias(fire, max_offset, query_position=query)
            assert got.shape == (3, max_offset + 1)
            torch.testing.assert_close(got, expected.float())
            sliced = learned_bias(fire, max_offset, min_offset=3, query_position=query)
            assert torch.equal(sliced, got[:, 3:])
        # beyond the threshold L the same offset reads differently from another query
        far = [learned_bias(fire, 8, query_position=q) for q in (8, 400)]
        assert not torch.allclose(far[0], far[1])
    with pytest.raises(ValueError, match="query_position"):
        learned_bias(fire, 10, query_position=5)
    with pytest.raises(ValueError, match="offsets >= 0"):
        learned_bias(fire, 10, min_offset=-1)


def _curves(ax) -> int:
    """Lines of an axes that are curves, not vertical marks (axvline)."""
    return sum(1 for line in ax.lines if len(set(line.get_xdata())) > 1)


def test_plot_bias_by_offset_draws_one_line_per_head():
    import torch
    from matplotlib.figure import Figure

    import relbias
    from relbias import book as nb
    from relbias.lab.model import TinyLM
    from relbias.lab.results import learned_bias_from_results

    fig = nb.plot_bias_by_offset(relbias.ALiBi(4), 32, mark=[16], title="ALiBi")
    assert isinstance(fig, Figure) and len(fig.axes) == 1
    (ax,) = fig.axes
    assert _curves(ax) == 4 and len(ax.lines) == 4 + 1
    assert [line.get_label() for line in ax.lines[:4]] == [f"head {h}" for h in range(4)]
    x, y = ax.lines[2].get_data()
    assert list(x) == list(range(33))
    assert torch.equal(torch.as_tensor(y), relbias.ALiBi(4).offset_table(0, 32)[2])
    assert ax.get_title() == "ALiBi" and ax.get_xlabel() == "offset i - j"

    model = TinyLM(position="fire", dim=12, depth=1, heads=3, train_len=16)
    panels = {
        "alibi": relbias.ALiBi(2),
        "fire": model,
        "stored": torch.zeros(5, 9),
        "t5": _randomised("t5", heads=2),
    }
    fig = nb.plot_bias_by_offset(
        panels, 20, reference={"ALiBi": relbias.ALiBi(2)}, mark=[15], ncols=3
    )
    assert isinstance(fig, Figure) and len(fig.axes) == 3 + 3  # 2 x 3 grid, 2 left empty
    heads = [2, 3, 5, 2]
    for ax, n in zip(fig.axes, heads):
        assert _curves(ax) == n + 2  # the reference's 2 heads in every panel
    assert [ax.get_title() for ax in fig.axes[:4]] == list(panels)
    assert len(fig.axes[2].lines[-2].get_xdata()) == 9  # a tensor keeps its own offsets

    stored = {
        "methods": {
            "alibi": {"learned_bias": {"values": [[0.0, -0.5, -1.0], [0.0, -0.1, -0.2]]}},
            "rope": {"learned_bias": None},
        }
    }
    fig = nb.plot_bias_by_offset(learned_bias_from_results(stored))
    assert len(fig.axes) == 1 and _curves(fig.axes[0]) == 2

    fig = nb.plot_bias_by_offset(relbias.T5Bias(4), 12, heads=[1, 3], step=True)
    assert _curves(fig.axes[0]) == 2

    fig, axes = nb.figure(8, 3, ncols=2)
    ax = axes.flat[1]
    for q in (16, 64):
        assert (
            nb.plot_bias_by_offset(model, q, min_offset=1, heads=[0], label=f"q {q}", ax=ax) is fig
        )
    assert _curves(ax) == 2 and ax.lines[0].get_xdata()[0] == 1
    assert [line.get_label() for line in ax.lines] == ["q 16", "q 64"]
    with pytest.raises(ValueError, match="max_offset"):
        nb.plot_bias_by_offset(relbias.ALiBi(2))


def test_the_book_never_imports_pyplot():
    """Figures are drawn on matplotlib Figures (:func:`relbias.book.figure`), not pyplot."""
    import subprocess
    import sys

    code = (
        "import sys, relbias\n"
        "from relbias import book as nb\n"
        "from relbias.book import figures as fg\n"
        "nb.to_png(nb.plot_bias_by_offset({'a': relbias.ALiBi(2)}, 8))\n"
        "nb.to_png(fg.plot_alibi_slopes())\n"
        "assert 'matplotlib.pyplot' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_no_heading_inside_a_solution(path):
    """A heading between solution-start and solution-end leaves sphinx-exercise's gated
    nodes unresolved, and the HTML build stops on them."""
    text = markdown(load(path))
    for part in text.split("{solution-start}")[1:]:
        inside = part.split("{solution-end}")[0]
        headings = [line for line in inside.splitlines() if re.match(r"#{1,6} ", line)]
        assert not headings, f"headings inside a solution: {headings}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NOTEBOOK_IDS)
def test_numbered_equations_have_no_double_backslash(path):
    r"""Sphinx wraps a display holding ``\\`` in ``split``, where MathJax refuses ``\tag``:
    rows of a numbered display are separated with ``\cr``."""
    for _, body in displayed_equations(markdown(load(path))):
        assert not ("\\tag" in body and "\\\\" in body), body[:120]
