"""Imports point down: the core stands alone, the biases below attention, and no cycle.

``import relbias`` loads torch and the core's own modules only. Read from the sources
(every import statement, those inside functions too): the neutral modules (``relbias._*``)
import no other room, the biases (with their prepared forms) never import
``relbias.attention``, the core never imports a room above it (the lab, the book, the
benchmark), and no module of ``relbias/`` reaches itself through its imports.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import relbias

PACKAGE = Path(relbias.__file__).parent
ROOMS = ("relbias.lab", "relbias.book", "relbias.bench", "relbias.hf")
#: The rooms above the lab: they may import the lab and the core, the lab imports none of them.
ABOVE_THE_LAB = ("relbias.book", "relbias.bench", "relbias.hf")


def _modules() -> dict[str, Path]:
    """Every module of relbias/ by its dotted name (a package by its __init__.py)."""
    modules = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


MODULES = _modules()


def _type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of import nodes under ``if TYPE_CHECKING:`` (never run)."""
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skipped


def imports_of(name: str, *, runtime_only: bool = False) -> set[str]:
    """The relbias modules that module ``name`` imports, anywhere in its source (a name
    imported from a package counts as its submodule where there is one)."""
    path = MODULES[name]
    tree = ast.parse(path.read_text(), filename=str(path))
    skipped = _type_checking_only(tree) if runtime_only else set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in MODULES else base)
    return {m for m in found if m in MODULES and m != name}


def test_imports_are_read_from_the_sources():
    """The reader sees imports inside functions and resolves names to submodules."""
    assert "relbias.biases.prepared" in imports_of("relbias.biases.base")
    assert "relbias.attention.fused" in imports_of("relbias.attention.api")  # inside a function
    assert {"relbias.attention", "relbias.biases"} <= imports_of("relbias")


def test_the_biases_never_import_attention():
    """The prepared biases live with the biases: no module of relbias.biases imports
    relbias.attention, at import time or at call time."""
    biases = [m for m in MODULES if m.startswith("relbias.biases")]
    assert "relbias.biases.prepared" in biases
    upward = {
        m: sorted(t for t in imports_of(m) if t.startswith("relbias.attention")) for m in biases
    }
    assert not {m: t for m, t in upward.items() if t}


def test_the_core_never_imports_a_room_above_it():
    core = [m for m in MODULES if not m.startswith(ROOMS)]
    upward = {m: sorted(t for t in imports_of(m) if t.startswith(ROOMS)) for m in core}
    assert not {m: t for m, t in upward.items() if t}


def test_the_lab_never_imports_a_room_above_it():
    lab = [m for m in MODULES if m.startswith("relbias.lab")]
    assert "relbias.lab.context" in lab
    upward = {m: sorted(t for t in imports_of(m) if t.startswith(ABOVE_THE_LAB)) for m in lab}
    assert not {m: t for m, t in upward.items() if t}


def test_the_neutral_modules_import_only_each_other():
    neutral = [m for m in MODULES if m.rpartition(".")[2].startswith("_") and m.count(".") == 1]
    assert {"relbias._checks", "relbias._cache", "relbias._compile"} <= set(neutral)
    for name in neutral:
        assert imports_of(name) <= set(neutral), name


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle of ``graph`` as a list of nodes (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node):
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_find_cycle_finds_one():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"a"}}) == ["a", "a"]


def test_no_import_cycle_in_relbias():
    """No module reaches itself through the imports it runs (at import or at call time)."""
    graph = {name: imports_of(name, runtime_only=True) for name in MODULES}
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def test_import_relbias_loads_only_the_core():
    """In a fresh interpreter: ``import relbias`` loads torch and core modules, nothing else."""
    probe = (
        "import json, sys\n"
        "import torch\n"
        "before = set(sys.modules)\n"
        "import relbias\n"
        "print(json.dumps({'added': sorted(set(sys.modules) - before), "
        "'all': sorted(sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    added = loaded["added"]
    assert "relbias" in added
    foreign = [m for m in added if m.split(".")[0] != "relbias"]
    assert not foreign, f"import relbias loaded modules beyond torch: {foreign}"
    rooms = [m for m in added if m.startswith(ROOMS)]
    assert not rooms, f"import relbias loaded modules above the core: {rooms}"
    for heavy in ("matplotlib", "ipywidgets", "IPython", "transformers", "x_transformers"):
        assert heavy not in loaded["all"], f"import relbias loaded {heavy}"
