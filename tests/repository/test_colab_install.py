"""The reader's path in Colab: the chapters' install cell, tried as a reader would.

The first code cell of every chapter installs ``relbias[<extras>] @ git+<repository>`` in
Colab. These tests check that the extras it names pull only what a chapter needs to run
(never the book's build tools, a Jupyter kernel or a new torch), and then do what Colab
does with a wheel of this checkout: a fresh virtual environment holding only torch (the
version of constraints.txt, the oldest that pyproject.toml declares), ``pip install`` of
the wheel with exactly the install cell's extras (no constraints file: pip resolves as it
would in Colab), a check that torch was kept and nothing of the build or the kernel came
in, and a short run of what a chapter does with an install: train a model in the quick
configuration, read the stored results that ship with the package (the lab's compact
copies, the benchmark's reports) and draw a figure. (nbval runs every chapter itself.)
The wheel carries the compact copies, not the raw results with every training loss.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[2]
CHAPTER = ROOT / "book" / "02_offset_bias.ipynb"  # trains a small model (quick: about a minute)
INSTALL = re.compile(r'"relbias\[(?P<extras>[^\]]*)\] @ git\+(?P<url>[^"@]+)@(?P<ref>[^"]+)"')
# What the install must never bring into a reader's running kernel.
FORBIDDEN = {
    "jupyter-book",
    "sphinx",
    "myst-nb",
    "sphinxcontrib-bibtex",
    "ipykernel",
    "jupyter-client",
    "jupyter-server",
    "notebook",
    "jupyterlab",
    "nbclient",
    "pytest",
    "transformers",
    "x-transformers",
    "playwright",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def install_cell() -> tuple[str, dict]:
    """The install cell's source and its requirement (extras, url, ref), from CHAPTER."""
    cells = json.loads(CHAPTER.read_text(encoding="utf-8"))["cells"]
    code = next(c for c in cells if c["cell_type"] == "code")
    source = "".join(code["source"])
    match = INSTALL.search(source)
    assert match, f"{CHAPTER.name}: the first code cell installs no relbias[...] @ git+...:"
    return source, match.groupdict()


def extra_closure(extras: list[str]) -> set[str]:
    """Every project an install of relbias[extras] asks for (self-references expanded)."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    optional = project["optional-dependencies"]
    names = {canonical(re.match(r"[A-Za-z0-9._-]+", d).group(0)) for d in project["dependencies"]}
    todo, seen = list(extras), set()
    while todo:
        extra = todo.pop()
        if extra in seen:
            continue
        assert extra in optional, f"the install cell names an unknown extra {extra!r}"
        seen.add(extra)
        for req in optional[extra]:
            inner = re.fullmatch(r"relbias\[([^\]]*)\]", req.strip())
            if inner:
                todo += [e.strip() for e in inner.group(1).split(",")]
            else:
                names.add(canonical(re.match(r"[A-Za-z0-9._-]+", req).group(0)))
    return names


def test_the_install_cell_installs_the_book_extra_and_shows_what_pip_did():
    source, req = install_cell()
    assert req["extras"] == "book"
    assert req["url"] == "https://github.com/relbias/relbias" and req["ref"] == "main"
    assert "google.colab" in source, "the cell must do nothing outside Colab"
    pip_args = re.findall(r'"(-[-\w]+)"', source)
    hidden = {"-q", "--quiet", "-U", "--upgrade", "--force-reinstall", "--no-deps"} & set(pip_args)
    assert not hidden, f"the install cell passes {hidden} to pip"
    assert "print(" in source, "the install cell must show what pip installed"


def test_the_book_extra_needs_no_build_tools_kernel_or_tests():
    names = extra_closure(["book"])
    assert {"torch", "matplotlib", "numpy", "ipywidgets", "ninja"} <= names
    assert not names & FORBIDDEN, names & FORBIDDEN


def test_extra_closure_expands_self_references_and_rejects_unknown_extras():
    assert "jupyter-book" in extra_closure(["docs"])  # docs = relbias[book] + the build
    assert "ipywidgets" in extra_closure(["docs"])
    with pytest.raises(AssertionError, match="unknown extra 'nope'"):
        extra_closure(["nope"])


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#") and "==" in line:
            name, version = line.split("==", 1)
            pins[canonical(name)] = version.strip()
    return pins


def _run(cmd, *, timeout=600, **kwargs) -> str:
    done = subprocess.run(
        [str(c) for c in cmd], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    assert done.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed ({done.returncode}):\n"
        f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return done.stdout


def _build_wheel(tmp_path: Path) -> Path:
    """A wheel of this checkout, built from a copy (nothing is written into the checkout)."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(
        ROOT / "relbias",
        src / "relbias",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build"),
    )
    wheels = tmp_path / "wheels"
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            wheels,
            src,
        ]
    )
    (wheel,) = wheels.glob("relbias-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """One wheel of this checkout for the module's tests (each reads it, none changes it)."""
    return _build_wheel(tmp_path_factory.mktemp("wheel"))


def _freeze(python: Path) -> dict[str, str]:
    out = _run([python, "-m", "pip", "list", "--format=json", "--disable-pip-version-check"])
    return {canonical(p["name"]): p["version"] for p in json.loads(out)}


def test_oldest_declared_torch_is_the_tested_one():
    """pyproject.toml declares the torch versions this test runs with: from constraints.txt's."""
    with open(ROOT / "pyproject.toml", "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    torch = next(d for d in deps if canonical(re.match(r"[A-Za-z0-9._-]+", d).group(0)) == "torch")
    lower = re.search(r">=\s*([0-9.]+)", torch).group(1)
    tested = _pins()["torch"].split("+")[0]
    assert tested.split(".")[:2] == lower.split(".")[:2], (
        f"pyproject.toml declares torch>={lower}, the tests run torch {tested}"
    )


# What a chapter does with an install: the runtime, a short training, the stored results.
SMOKE = textwrap.dedent(
    """
    import relbias
    from relbias import book as nb
    from relbias.bench.report import load_report
    from relbias.lab import build_model, evaluate_lengths, load_corpus, load_stored, train_lm
    from relbias.lab.results import load_results
    from relbias.lab.plots import plot_sweep

    rt = nb.runtime_banner()
    cfg = rt.config.replace(steps=20)
    corpus = load_corpus(max_bytes=cfg.corpus_bytes)
    model = build_model("alibi", cfg)
    history = train_lm(model, corpus.train, cfg, progress=False)
    rows = evaluate_lengths(model, corpus.val, cfg, factors=(1, 2))
    assert history["losses"][-1] < history["losses"][0]
    sweep = load_stored("extrapolation_15000")
    assert len(sweep["seeds"]) == 3 and "alibi" in sweep["methods"]
    assert load_results("interpolation_quick")["summary"]
    assert load_report(name="cpu")["commit"]
    nb.show(plot_sweep(sweep, ["alibi", "rope"]), display=False)
    print("SMOKE DONE", relbias.__file__)
    """
)


@pytest.mark.slow
def test_colab_install_in_a_fresh_environment_trains_and_reads_the_stored_results(tmp_path, wheel):
    _, req = install_cell()
    pins = _pins()
    python = sys.executable

    # 1. a wheel of this checkout, built from a copy (nothing is written into the checkout):
    # the module's fixture ``wheel``

    # 2. a fresh environment with torch alone
    venv = tmp_path / "venv"
    _run([python, "-m", "venv", venv])
    vpy = venv / "bin" / "python"
    pip = [vpy, "-m", "pip", "install", "--no-compile"]  # no .pyc for all of torch: faster
    _run([*pip, f"torch=={pins['torch']}", "-c", ROOT / "constraints.txt"])
    before = _freeze(vpy)

    # 3. the install cell's requirement, the wheel in place of the git URL, no constraints
    out = _run([*pip, f"relbias[{req['extras']}] @ {wheel.as_uri()}"])
    after = _freeze(vpy)
    assert after["torch"] == before["torch"], f"pip replaced torch: {out[-2000:]}"
    changed = {n for n in before if before[n] != after.get(n)}
    assert not changed, f"the install changed packages that were there: {changed}"
    pulled = set(after) & FORBIDDEN
    assert not pulled, f"the install pulled {pulled}"
    _run([vpy, "-m", "pip", "check"])

    # 4. what a chapter does: train briefly (quick), read the shipped results, draw
    (tmp_path / "smoke.py").write_text(SMOKE)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "CI")}
    env.update(CI="1", MPLBACKEND="Agg", OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"))
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    out = _run([vpy, tmp_path / "smoke.py"], cwd=tmp_path, env=env, timeout=900)
    assert "SMOKE DONE" in out and str(venv) in out, out[-2000:]
    assert "configuration: quick" in out, out[:2000]


def test_the_wheel_ships_compact_results_not_the_raw_ones(wheel):
    """What ships: the compact copies and the benchmark's results, a few MB in all (not the
    raw results, not the stored models' weights)."""
    import zipfile

    names = zipfile.ZipFile(wheel).namelist()
    compact = [n for n in names if n.startswith("relbias/lab/results/compact/")]
    raw = [n for n in names if n.startswith("relbias/lab/results/") and n.count("/") == 3]
    assert compact and not [n for n in raw if n.endswith((".json", ".png"))], raw
    # the stored sweeps' weights stay in the repository (relbias/lab/results/weights)
    assert not [n for n in names if "/results/weights/" in n or n.endswith((".pt", ".pt.xz"))]
    assert any(n.startswith("relbias/bench/results/cpu.json") for n in names)
    assert "relbias/attention/csrc/fused_attention.cpp" in names
    assert wheel.stat().st_size < 8_000_000, wheel.stat().st_size
