"""Build any bias family by name, so that chapters, models and benchmarks treat them alike."""

from __future__ import annotations

from relbias.biases.alibi import ALiBi
from relbias.biases.base import RelativeBias
from relbias.biases.fire import FIRE
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


def make_bias(name: str, num_heads: int, **kwargs) -> RelativeBias:
    """Build the bias family ``name`` (one of :data:`BIAS_NAMES`) with ``num_heads`` heads.

    Keyword arguments go to the family's constructor, e.g.
    ``make_bias("offset", 8, max_offset=127)`` or ``make_bias("t5", 8, num_buckets=32)``.
    """
    if not isinstance(name, str) or name not in BIAS_FAMILIES:
        raise ValueError(f"name must be one of {list(BIAS_NAMES)}, got {name!r}")
    return BIAS_FAMILIES[name](num_heads, **kwargs)
