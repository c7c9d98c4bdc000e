"""The core stands alone: ``import relbias`` loads torch and the core's own modules only."""

import json
import subprocess
import sys

CORE_PACKAGES = ("relbias.biases", "relbias.attention")


def _modules_loaded(code: str) -> dict:
    probe = (
        "import json, sys\n"
        "import torch\n"
        "before = set(sys.modules)\n"
        f"{code}\n"
        "print(json.dumps({'added': sorted(set(sys.modules) - before), "
        "'all': sorted(sys.modules)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_relbias_loads_only_the_core():
    loaded = _modules_loaded("import relbias")
    added = loaded["added"]
    assert "relbias" in added
    foreign = [m for m in added if m.split(".")[0] != "relbias"]
    assert not foreign, f"import relbias loaded modules beyond torch: {foreign}"
    rooms = [
        m
        for m in added
        if m not in ("relbias", "relbias._checks", "relbias.demo", "relbias.rotary")
        and not m.startswith(CORE_PACKAGES)
    ]
    assert not rooms, f"import relbias loaded modules above the core: {rooms}"
    for heavy in ("matplotlib", "ipywidgets", "IPython", "transformers", "x_transformers"):
        assert heavy not in loaded["all"], f"import relbias loaded {heavy}"


def test_the_core_never_imports_a_room_above_it():
    """Every core module, imported alone, stays in the core (imports point down)."""
    code = (
        "import importlib, pkgutil, relbias\n"
        "for pkg in ('relbias.biases', 'relbias.attention'):\n"
        "    mod = importlib.import_module(pkg)\n"
        "    for info in pkgutil.iter_modules(mod.__path__):\n"
        "        importlib.import_module(pkg + '.' + info.name)\n"
        "import relbias.demo\n"
        "import relbias.rotary\n"
    )
    added = _modules_loaded(code)["added"]
    above = [m for m in added if m.startswith(("relbias.lab", "relbias.book", "relbias.bench"))]
    assert not above, above
