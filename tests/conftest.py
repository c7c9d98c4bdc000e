"""Shared fixtures for the relbias tests: a fixed seed and one instance of every family."""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path

import pytest
import torch

import relbias

# The tests use tiny tensors: intra-op threads only add synchronisation, which costs
# several times the work on a busy 2-core machine. Set OMP_NUM_THREADS to override.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

# --- the order of the run: the longest files first ----------------------------------------
# `scripts/test.sh` spreads whole files over one pytest-xdist worker per core
# (`--dist loadfile --no-loadscope-reorder`). Handing out the longest files first (the
# chapters, the browser) lets the short ones fill the gaps at the end, so that no worker waits
# long for the other. DURATIONS holds each file's seconds in a full run; it only orders the
# files (a stale or missing entry changes the order, never a result). Refresh it with
# `bash scripts/test.sh --store-durations tests/durations.json`.
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser):
    parser.addoption(
        "--store-durations",
        metavar="PATH",
        default=None,
        help="write each test file's total seconds in this run to PATH (JSON)",
    )


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def pytest_collection_modifyitems(config, items):
    """Files in order of their stored durations, longest first; each file's tests keep
    their order (a notebook's cells run top to bottom)."""
    seconds = json.loads(DURATIONS.read_text()) if DURATIONS.is_file() else {}
    by_file: dict[str, list] = {}
    for item in items:
        by_file.setdefault(_file_of(item.nodeid), []).append(item)
    order = sorted(by_file, key=lambda f: -seconds.get(f, 0.0))  # stable: ties keep theirs
    order = _after_the_build(order, seconds)
    items[:] = [item for f in order for item in by_file[f]]


#: Files that read the built book: scripts/test.sh builds it beside the tests, so they go out
#: once BUILD_HEADSTART_S seconds of stored work precede them (both workers busy for about
#: half of that, longer than the build takes), not first, where they would wait for it.
NEEDS_THE_BUILD = ("tests/book/test_browser.py",)
BUILD_HEADSTART_S = 400.0


def _after_the_build(order: list[str], seconds: dict) -> list[str]:
    late = [f for f in order if f in NEEDS_THE_BUILD]
    rest = [f for f in order if f not in NEEDS_THE_BUILD]
    done, at = 0.0, len(rest)
    for i, f in enumerate(rest):
        if done >= BUILD_HEADSTART_S:
            at = i
            break
        done += seconds.get(f, 0.0)
    return rest[:at] + late + rest[at:]


_FILE_SECONDS: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _FILE_SECONDS[_file_of(report.nodeid)] += report.duration


def pytest_sessionfinish(session):
    path = session.config.getoption("--store-durations")
    if path and not hasattr(session.config, "workerinput"):  # the controller, or no xdist
        totals = {f: round(s, 1) for f, s in sorted(_FILE_SECONDS.items(), key=lambda x: -x[1])}
        Path(path).write_text(json.dumps(totals, indent=1) + "\n")


# Every family with small, explicit settings; FIRE's threshold L is small so that
# short test sequences reach past it.
FAMILY_KWARGS: dict[str, dict] = {
    "offset": {"max_offset": 6, "bidirectional": True},
    "t5": {"num_buckets": 16, "max_distance": 20, "bidirectional": True},
    "alibi": {"bidirectional": True},
    "sandwich": {"dim": 16},
    "kerple_power": {},
    "kerple_log": {},
    "fire": {"hidden": 8, "L": 5.5},
}


def build(name: str, num_heads: int = 3, **overrides) -> relbias.RelativeBias:
    """A family with non-trivial parameters: learnable tables are filled at random."""
    kwargs = {**FAMILY_KWARGS[name], **overrides}
    module = relbias.make_bias(name, num_heads, **kwargs)
    with torch.no_grad():
        if name in ("offset", "t5"):
            module.weight.normal_()
    return module


# --- shared by the fast-backend tests (test_flex.py, test_fused.py) -------------------------
ATTENTION_HEADS, ATTENTION_DIM = 3, 16
# Causal families are built with bidirectional=False where the family has the option.
CAUSAL_KWARGS = {
    "offset": {"bidirectional": False},
    "t5": {"bidirectional": False},
    "alibi": {"bidirectional": False},
}
# (q_len, k_len, q_start): queries at the end, queries inside the keys, square.
ATTENTION_SHAPES = [(37, 37, None), (20, 45, None), (17, 40, 9), (1, 30, None), (64, 64, 0)]


def family_bias(name: str, causal: bool):
    """``name`` with ATTENTION_HEADS heads, built causal (where it has the option) or not."""
    overrides = CAUSAL_KWARGS.get(name, {}) if causal else {}
    return build(name, ATTENTION_HEADS, **overrides)


def qkv(
    q_len,
    k_len,
    *,
    batch=2,
    dim=ATTENTION_DIM,
    v_dim=ATTENTION_DIM,
    dtype=torch.float32,
    grad=False,
):
    """Random q, k, v: [batch, ATTENTION_HEADS, len, dim] (v: v_dim)."""
    heads = ATTENTION_HEADS
    q = torch.randn(batch, heads, q_len, dim, dtype=dtype, requires_grad=grad)
    k = torch.randn(batch, heads, k_len, dim, dtype=dtype, requires_grad=grad)
    v = torch.randn(batch, heads, k_len, v_dim, dtype=dtype, requires_grad=grad)
    return q, k, v


def assert_close(actual, expected):
    """Equal within float32 rounding of attention over a few hundred keys."""
    torch.testing.assert_close(actual, expected, rtol=2e-5, atol=2e-5)


def assert_backend_matches_materialise(backend, q, k, v, bias, **kwargs):
    """``backend`` runs (it is the one taken) and equals the materialised bias, no grad."""
    with torch.no_grad():
        expected = relbias.biased_attention(q, k, v, bias, backend="materialize", **kwargs)
        got, taken = relbias.biased_attention(
            q, k, v, bias, backend=backend, return_backend=True, **kwargs
        )
    assert taken == backend
    assert_close(got, expected)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=list(FAMILY_KWARGS))
def family(request) -> str:
    return request.param


# The lab's tests train a tiny TinyLM on a small slice of the corpus; each file takes this
# shape and changes the steps and evaluation it needs.
TINY_CONFIG_FIELDS = dict(
    name="tiny",
    dim=32,
    depth=1,
    heads=2,
    train_len=16,
    batch_size=8,
    lr=1e-2,
    eval_tokens=512,
    eval_batch_size=4,
    corpus_bytes=300_000,
)


def tiny_config(**overrides):
    """The lab tests' tiny :class:`~relbias.lab.training.Config`, with ``overrides``."""
    from relbias.lab.config import Config

    return Config(**{**TINY_CONFIG_FIELDS, **overrides})


@pytest.fixture(scope="session")
def tiny_corpus():
    """The corpus of :func:`tiny_config` (its first ``corpus_bytes``), read once."""
    from relbias.lab.data import load_corpus

    return load_corpus(max_bytes=TINY_CONFIG_FIELDS["corpus_bytes"])


def legends_off_the_panels(fig) -> bool:
    """Whether no legend of ``fig`` (on an axes or on the figure) overlaps any panel."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend() is not None]
    legends += list(fig.legends)
    assert legends, "the figure has no legend"
    boxes = [ax.get_window_extent(renderer) for ax in fig.axes]
    return not any(
        leg.get_window_extent(renderer).overlaps(box) for leg in legends for box in boxes
    )
