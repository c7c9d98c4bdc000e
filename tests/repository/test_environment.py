"""The reproducible set-up stays consistent: pyproject ranges, exact pins, conda file, scripts."""

from __future__ import annotations

import json
import os
import re
import sys
from importlib import metadata
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]

# The Jupyter Book 1.x stack known to build this book, and the test references.
KNOWN_GOOD = {
    "torch": "2.13.0",
    "jupyter-book": "1.0.4.post1",
    "sphinx": "7.4.7",
    "myst-parser": "3.0.1",
    "myst-nb": "1.2.0",
    "sphinx-book-theme": "1.1.4",
    "pydata-sphinx-theme": "0.15.4",
    "sphinx-design": "0.6.1",
    "sphinx-external-toc": "1.1.0",
    "sphinxcontrib-bibtex": "2.6.3",
    "docutils": "0.21.2",
    "nbval": "0.11.0",
}

PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?==([^\s;#]+)$")
REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def strip_local(version: str) -> str:
    """'2.13.0+cpu' -> '2.13.0' (a pin without a local label matches any local build)."""
    return version.split("+", 1)[0]


@pytest.fixture(scope="module")
def constraints() -> dict[str, str]:
    pins: dict[str, str] = {}
    for number, raw in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"constraints.txt:{number}: not an exact pin 'name==version': {raw!r}"
        name = canonical(match.group(1))
        assert name not in pins, f"constraints.txt pins {name} twice"
        pins[name] = match.group(3)
    return pins


@pytest.fixture(scope="module")
def pyproject() -> dict:
    with open(ROOT / "pyproject.toml", "rb") as fh:
        return tomllib.load(fh)


def _yaml():
    return pytest.importorskip("yaml")


@pytest.fixture(scope="module")
def environment() -> dict:
    with open(ROOT / "environment.yml") as fh:
        return _yaml().safe_load(fh)


def _pip_section(environment: dict) -> list[str]:
    sections = [d["pip"] for d in environment["dependencies"] if isinstance(d, dict) and "pip" in d]
    assert len(sections) == 1, "environment.yml needs exactly one pip: section"
    return [str(item).strip() for item in sections[0]]


# --- constraints.txt ----------------------------------------------------------------------------


def test_constraints_pin_torch_cpu_release(constraints):
    assert constraints.get("torch") == "2.13.0"


def test_constraints_pin_the_known_good_book_stack(constraints):
    for name, version in KNOWN_GOOD.items():
        assert constraints.get(name) == version, f"{name}: want {version}, constraints.txt has " + (
            constraints.get(name, "no pin")
        )
    exercise = constraints.get("sphinx-exercise")
    assert exercise is not None and int(exercise.split(".")[0]) >= 1


def test_constraints_do_not_pin_the_project_itself(constraints):
    assert "relbias" not in constraints


def test_every_declared_dependency_is_pinned(pyproject, constraints):
    declared = list(pyproject["project"]["dependencies"])
    for reqs in pyproject["project"]["optional-dependencies"].values():
        declared += [r for r in reqs if not r.startswith("relbias")]
    missing = sorted({canonical(REQ_NAME.match(r).group(1)) for r in declared} - set(constraints))
    assert not missing, f"not pinned in constraints.txt: {missing}"


# --- pyproject.toml -----------------------------------------------------------------------------


def test_runtime_dependencies_are_ranges(pyproject):
    deps = pyproject["project"]["dependencies"]
    names = {canonical(REQ_NAME.match(d).group(1)) for d in deps}
    assert names == {"torch"}, f"the core needs torch alone; the rest belongs in extras: {names}"
    for dep in deps:
        assert "==" not in dep and "===" not in dep, f"runtime dependency pinned exactly: {dep}"
    torch = next(d for d in deps if canonical(REQ_NAME.match(d).group(1)) == "torch")
    assert ">=2.13" in torch.replace(" ", ""), "declare the oldest torch that was tested"


def test_extras_and_tool_config(pyproject):
    extras = pyproject["project"]["optional-dependencies"]

    def names(extra):
        return {canonical(REQ_NAME.match(r).group(1)) for r in extras[extra]}

    test = names("test")
    assert {"numpy", "tqdm", "matplotlib"} <= names("lab")
    assert {"ninja", "setuptools"} <= names("fused")
    # What a chapter needs to run (Colab installs it): no book-building tools, no kernel.
    assert "ipywidgets" in names("book")
    assert not {"jupyter-book", "sphinx", "ipykernel", "ipython"} & names("book")
    assert {"jupyter-book", "sphinx-exercise", "sphinxcontrib-bibtex"} <= names("docs")
    assert {"transformers", "x-transformers"} <= names("bench")
    assert {
        "pytest",
        "hypothesis",
        "nbval",
        "transformers",
        "x-transformers",
        "ruff",
        "playwright",
    } <= test
    assert pyproject["project"]["requires-python"] == ">=3.10"
    assert pyproject["tool"]["ruff"]["line-length"] == 100
    assert pyproject["tool"]["ruff"]["target-version"] == "py310"
    assert pyproject["tool"]["pytest"]["ini_options"]["testpaths"] == ["tests"]


# --- environment.yml ----------------------------------------------------------------------------


def test_environment_uses_python_311_and_pip(environment):
    deps = [d for d in environment["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in [d.replace(" ", "") for d in deps]
    assert "pip" in deps


def test_environment_pins_agree_with_constraints(environment, constraints):
    pins = {}
    for item in _pip_section(environment):
        match = PIN.match(item)
        if match:
            pins[canonical(match.group(1))] = match.group(3)
        else:
            assert item.startswith(("-c ", "-e ", "-r ")), f"environment.yml: unpinned {item!r}"
    assert "torch" in pins and "jupyter-book" in pins
    wrong = {n: (v, constraints.get(n)) for n, v in pins.items() if constraints.get(n) != v}
    assert not wrong, f"environment.yml pin != constraints.txt (env, constraints): {wrong}"


def test_environment_installs_project_under_constraints(environment):
    items = _pip_section(environment)
    assert "-c constraints.txt" in items
    assert any(i.startswith("-e .[") and "docs" in i and "test" in i for i in items)


# --- front-end assets and scripts ---------------------------------------------------------------


def test_mathjax_pinned_to_3x_and_locked():
    package = json.loads((ROOT / "package.json").read_text())
    wanted = package["dependencies"]["mathjax"]
    assert re.fullmatch(r"3\.\d+\.\d+", wanted), f"mathjax must be an exact 3.x pin, got {wanted}"
    lock = json.loads((ROOT / "package-lock.json").read_text())
    assert lock["packages"]["node_modules/mathjax"]["version"] == wanted


@pytest.mark.parametrize(
    "path", ["scripts/setup.sh", "scripts/book.sh", "scripts/test.sh", ".ci/run"]
)
def test_scripts_are_strict_bash(path):
    text = (ROOT / path).read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    assert "set -euo pipefail" in text


def test_ci_entry_point_is_executable():
    assert os.access(ROOT / ".ci" / "run", os.X_OK)


def test_readme_opens_with_the_two_commands():
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```[a-z]*\n(.*?)```", text, re.S)
    assert first_block, "README.md has no code block"
    commands = [ln.split("#")[0].strip() for ln in first_block.group(1).splitlines()]
    assert [c for c in commands if c] == ["bash scripts/book.sh", "bash scripts/test.sh"]
    assert text.index("```") < text.index("## "), "the commands must come before any section"


# --- the running environment --------------------------------------------------------------------


@pytest.mark.skipif(
    not Path(sys.prefix).resolve().is_relative_to((ROOT / ".venv").resolve()),
    reason="only checked inside the project's .venv (created by scripts/setup.sh)",
)
def test_installed_versions_match_constraints(constraints):
    wrong = {}
    for name, version in constraints.items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            wrong[name] = (version, "not installed")
            continue
        if strip_local(installed) != version:
            wrong[name] = (version, installed)
    assert not wrong, f".venv differs from constraints.txt (pinned, installed): {wrong}"


def test_reference_implementations_import():
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    assert hasattr(t5.T5Attention, "_relative_position_bucket")
    assert hasattr(t5.T5Attention, "compute_bias")
    xt = pytest.importorskip("x_transformers.x_transformers")
    assert hasattr(xt, "RelativePositionBias") and hasattr(xt, "AlibiPositionalBias")


def test_the_fused_kernel_source_ships_with_the_package(pyproject):
    """relbias.attention.fused compiles relbias/attention/csrc/*.cpp where the package is
    installed (Colab installs a wheel), so the wheel must carry it, with what the build needs."""
    from fnmatch import fnmatch

    patterns = pyproject["tool"]["setuptools"]["package-data"]["relbias"]
    source = ROOT / "relbias" / "attention" / "csrc" / "fused_attention.cpp"
    assert source.is_file()
    assert any(fnmatch("attention/csrc/fused_attention.cpp", p) for p in patterns), patterns
    needed = {canonical(REQ_NAME.match(r).group(1)) for r in pyproject["project"]["dependencies"]}
    needed |= {
        canonical(REQ_NAME.match(r).group(1))
        for r in pyproject["project"]["optional-dependencies"]["fused"]
    }
    assert {"torch", "ninja", "setuptools"} <= needed


# --- the deploy path (.github/workflows) -------------------------------------------------------


def _workflow(name: str) -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / ".github" / "workflows" / name).read_text())


def _readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)```", readme, re.S).group(1)
    return [line.split("#")[0].strip() for line in block.splitlines() if line.strip()]


def test_the_test_workflow_runs_the_readme_test_command():
    test_command = next(c for c in _readme_commands() if "test.sh" in c)
    workflow = _workflow("test.yml")
    on = workflow.get("on", workflow.get(True))  # YAML 1.1 reads a bare `on` as True
    assert {"push", "pull_request"} <= set(on)
    steps = [s for job in workflow["jobs"].values() for s in job["steps"]]
    assert any(s.get("run", "").strip() == test_command for s in steps), steps
    ci_run = (ROOT / ".ci" / "run").read_text()
    assert test_command in ci_run


def test_the_pages_workflow_builds_with_the_readme_command_and_deploys():
    build_command = next(c for c in _readme_commands() if "book.sh" in c)
    workflow = _workflow("pages.yml")
    assert workflow["permissions"]["pages"] == "write"
    build, deploy = workflow["jobs"]["build"], workflow["jobs"]["deploy"]
    runs = [s.get("run", "").strip() for s in build["steps"]]
    assert build_command in runs, runs
    upload = next(s for s in build["steps"] if "upload-pages-artifact" in s.get("uses", ""))
    assert upload["with"]["path"] == "_build/html"
    assert deploy["needs"] == "build"
    assert any("deploy-pages" in s.get("uses", "") for s in deploy["steps"])


# --- Binder's reading environment (binder/) -----------------------------------------------------

READING_ONLY_NOT = {
    "transformers",
    "x-transformers",
    "playwright",
    "pytest",
    "hypothesis",
    "nbval",
    "ruff",
    "jupyter-book",
    "sphinx",
}


@pytest.fixture(scope="module")
def binder() -> dict:
    with open(ROOT / "binder" / "environment.yml") as fh:
        return _yaml().safe_load(fh)


def _binder_pins(binder: dict) -> dict[str, str]:
    pins = {}
    for item in _pip_section(binder):
        match = PIN.match(item)
        if match:
            pins[canonical(match.group(1))] = match.group(3)
        else:
            assert item.startswith("--extra-index-url "), f"binder: unpinned {item!r}"
    return pins


def _book_extra_needs(pyproject) -> set[str]:
    """The projects relbias[book] needs, its self-references expanded, and torch."""
    optional = pyproject["project"]["optional-dependencies"]
    names, todo, seen = {"torch"}, ["book"], set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for req in optional[extra]:
            inner = re.fullmatch(r"relbias\[([^\]]*)\]", req.strip())
            if inner:
                todo += [e.strip() for e in inner.group(1).split(",")]
            else:
                names.add(canonical(REQ_NAME.match(req).group(1)))
    return names


def test_binder_pins_the_reading_environment_of_constraints(binder, constraints, pyproject):
    deps = [d for d in binder["dependencies"] if isinstance(d, str)]
    assert "python=3.11" in [d.replace(" ", "") for d in deps]
    pins = _binder_pins(binder)
    wrong = {
        n: (v, constraints.get(n)) for n, v in pins.items() if strip_local(v) != constraints.get(n)
    }
    assert not wrong, f"binder pin != constraints.txt (binder, constraints): {wrong}"
    missing = _book_extra_needs(pyproject) - set(pins)
    assert not missing, f"binder/environment.yml lacks what relbias[book] needs: {missing}"
    extra = set(pins) & READING_ONLY_NOT
    assert not extra, f"binder/environment.yml installs the test or build environment: {extra}"


def test_binder_takes_a_cpu_torch(binder):
    items = _pip_section(binder)
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in items
    assert _binder_pins(binder)["torch"].endswith("+cpu")


def test_binder_installs_relbias_itself_without_dependencies():
    post = ROOT / "binder" / "postBuild"
    assert os.access(post, os.X_OK), "binder/postBuild must be executable"
    text = post.read_text()
    assert text.startswith("#!/usr/bin/env bash\n") and "set -euo pipefail" in text
    assert re.search(r"pip install --no-deps \.$", text, re.M)
