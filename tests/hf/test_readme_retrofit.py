"""The README's path for a user's RoPE checkpoint runs as written: scale RoPE (or swap in a
bias), fine-tune with HF's Trainer, read by length and on far recall."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]


def readme_block() -> str:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Extending a trained RoPE model", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_retrofit_path_runs(tmp_path, monkeypatch, capsys):
    """The block as written (YaRN; the bias swap beside it is tests/hf/test_retrofit.py's
    ``load_option``), run from the repository root with the stored base."""
    code = readme_block().replace('output_dir="retrofit-out"', f'output_dir="{tmp_path}"')
    monkeypatch.chdir(ROOT)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert namespace["model"].config.rope_parameters["rope_type"] == "yarn"
    *_, readings, copies = capsys.readouterr().out.strip().splitlines()
    bits, acc = eval(readings.replace("] [", "], ["))
    assert len(bits) == 3 and all(0 < b < 10 for b in bits)
    assert len(acc) == 2 and all(0 <= a <= 1 for a in acc)
    first, second = map(float, copies.split())
    assert 0 < first < 10 and 0 < second < 10  # nats per token on each copy
