"""Build any bias family by name, so that chapters, models and benchmarks treat them alike."""

from __future__ import annotations

from relbias.biases.alibi import ALiBi
from relbias.biases.base import DataDependentBias, RelativeBias
from relbias.biases.fire import FIRE
from relbias.biases.forgetting import ForgettingGate
from relbias.biases.kerple import KerpleLog, KerplePower
from relbias.biases.offset import OffsetBias
from relbias.biases.sandwich import Sandwich
from relbias.biases.t5 import T5Bias

BIAS_FAMILIES: dict[str, type[RelativeBias]] = {
    "offset": OffsetBias,
    "t5": T5Bias,
    "alibi": ALiBi,
    "sandwich": Sandwich,
    "kerple_power": KerplePower,
    "kerple_log": KerpleLog,
    "fire": FIRE,
}
BIAS_NAMES: tuple[str, ...] = tuple(BIAS_FAMILIES)

#: The families computed from the layer input (prepared with ``prepare(x)``, not with
#: lengths): kept apart from :data:`BIAS_NAMES`, whose families are functions of positions.
DATA_DEPENDENT_FAMILIES: dict[str, type[DataDependentBias]] = {
    "forgetting": ForgettingGate,
}
DATA_DEPENDENT_NAMES: tuple[str, ...] = tuple(DATA_DEPENDENT_FAMILIES)


def make_bias(name: str, num_heads: int, **kwargs) -> RelativeBias | DataDependentBias:
    """Build the bias family ``name`` (one of :data:`BIAS_NAMES` or
    :data:`DATA_DEPENDENT_NAMES`) with ``num_heads`` heads.

    Keyword arguments go to the family's constructor, e.g.
    ``make_bias("offset", 8, max_offset=127)``, ``make_bias("t5", 8, num_buckets=32)`` or
    ``make_bias("forgetting", 8, dim=512)``.
    """
    families = {**BIAS_FAMILIES, **DATA_DEPENDENT_FAMILIES}
    if not isinstance(name, str) or name not in families:
        raise ValueError(f"name must be one of {list(families)}, got {name!r}")
    return families[name](num_heads, **kwargs)
