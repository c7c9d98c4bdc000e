"""Shared fixtures for the relbias tests: a fixed seed and one instance of every family."""

from __future__ import annotations

import os

import pytest
import torch

import relbias

# The tests use tiny tensors: intra-op threads only add synchronisation, which costs
# several times the work on a busy 2-core machine. Set OMP_NUM_THREADS to override.
if "OMP_NUM_THREADS" not in os.environ:
    torch.set_num_threads(1)

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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(params=list(FAMILY_KWARGS))
def family(request) -> str:
    return request.param
