"""Rotary position embedding (RoPE) and position interpolation, in the book's notation.

RoPE (Su et al., 2021/2024; the book's §2.3.5.3) makes positions *multiplicative*: the
query or key vector ``x`` of the token at position ``t`` is rotated, pair of dimensions
by pair of dimensions, by the angles ``t theta``:

    Ro(x, t theta) = x R_{t theta}                                       (Eq. 2.85)

where ``R_{t theta}`` is block diagonal with the 2 x 2 rotations of the angles
``t theta_k`` on the pairs ``(x_{2k-1}, x_{2k})``, ``k = 1 .. d/2``, and

    theta_k = b^{-2(k-1)/d},   b = 10000                                 (Eqs. 2.92-2.94)

Rotations compose, so the score of a rotated query and key depends on the offset only:

    Ro(x, t theta) [Ro(y, s theta)]^T = x R_{(t-s) theta} y^T            (Eq. 2.90)

The period of dimension pair ``k`` is ``T_k = 2 pi b^{2(k-1)/d}`` (Eq. 2.98): the first
pairs turn many times within a training length ``m_l``, the last ones not even once, so
a longer sequence shows them angles they never had in training. Position
*interpolation* (§2.3.5.4) changes the angles so that a sequence of length ``m > m_l``
stays inside the trained range. With ``s = factor`` (``m / m_l``) this module offers:

``"linear"`` -- linear position interpolation (Chen et al., 2023)
    every position is scaled by ``m_l / m``: ``Ro'(x_i, i theta) = Ro(x_i, (m_l/m) i theta)``
    (Eq. 2.100), i.e. ``theta'_k = theta_k / s``. All angles stay in the trained range,
    but neighbouring tokens are ``s`` times closer in angle than in training.
``"ntk"`` -- "NTK-aware" base scaling (bloc97, 2023)
    the base grows to ``lambda b`` with ``lambda = s^{d/(d-2)}`` (Eqs. 2.101-2.104), so
    ``theta'_k = (lambda b)^{-2(k-1)/d}``: the highest frequency (``k = 1``) is kept, the
    lowest (``k = d/2``) is divided by exactly ``s``, and those between by ``s`` to the
    power ``2(k-1)/(d-2)``.
``"dynamic"`` -- dynamic NTK (emozilla, 2023; HuggingFace's ``"dynamic"``)
    the NTK base chosen from the *current* sequence length ``n``: no change while
    ``n <= m_l``, and beyond it ``lambda = (s n / m_l - (s - 1))^{d/(d-2)}``. With
    ``factor = 1`` this is the book's ``lambda = (m/m_l)^{d/(d-2)}`` with ``m = n``.
``"yarn"`` -- YaRN (Peng et al., 2023)
    "NTK-by-parts" plus an attention temperature. A pair that turns more than
    ``beta_fast`` (32) times within ``m_l`` is kept, one that turns fewer than
    ``beta_slow`` (1) times is interpolated (``theta_k / s``), and those between are
    blended with a linear ramp ``gamma``: ``theta'_k = (1 - gamma_k) theta_k / s +
    gamma_k theta_k``. The paper writes the ramp as linear in the number of rotations
    ``r = m_l / T_k``; its reference code (and HuggingFace) make it linear in the pair
    index ``k`` between the (rounded) indices where ``r = beta_fast`` and
    ``r = beta_slow``. This module follows the code. The temperature ``t`` has
    ``sqrt(1/t) = 0.1 ln s + 1`` (the *attention factor*); like the reference code this
    module multiplies cos and sin by it, so every query-key score is multiplied by its
    square, ``1/t``.

HuggingFace transformers implements ``"linear"``, ``"dynamic"`` and ``"yarn"`` in
``modeling_rope_utils.ROPE_INIT_FUNCTIONS``; this module computes the same inverse
frequencies (in the same float32 order) and attention factor, which the tests check.
One difference: this module rotates *consecutive* pairs ``(x_{2k-1}, x_{2k})`` as the
book and Su et al. write it, while HuggingFace's Llama code pairs dimension ``k`` with
``k + d/2`` ("rotate half"); the two are the same up to a fixed permutation of the
dimensions and give the same scores.

Positions are 0-based; the library's convention for queries and keys applies: queries
sit at ``q_start ..``, keys at ``0 ..``, and ``q_start`` defaults to ``k_len - q_len``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
from torch import nn

from relbias._checks import check_choice, check_int, check_positive_float

SCALING_KINDS = ("linear", "ntk", "dynamic", "yarn")


@dataclass(frozen=True)
class RopeScaling:
    """How a :class:`RotaryEmbedding` changes its angles to read longer sequences.

    Parameters
    ----------
    kind:
        ``"linear"`` (position interpolation), ``"ntk"`` (NTK-aware base scaling),
        ``"dynamic"`` (NTK with the base chosen from the current length) or ``"yarn"``;
        see :mod:`relbias.rotary` for the formulas.
    factor:
        ``s = m / m_l >= 1``: how many times the training length should fit.
        ``factor = 1`` changes nothing (``"dynamic"``: the book's NTK formula with the
        current length).
    original_len:
        ``m_l``, the training length; required by ``"dynamic"`` and ``"yarn"``, unused
        by ``"linear"`` and ``"ntk"``.
    beta_fast, beta_slow:
        ``"yarn"`` only: pairs turning more than ``beta_fast`` times within ``m_l``
        are kept, fewer than ``beta_slow`` times interpolated (defaults 32 and 1).
    attention_factor:
        ``"yarn"`` only: the factor on cos and sin; default ``0.1 ln(factor) + 1``.
    truncate:
        ``"yarn"`` only: round the ramp's ends outwards to whole pair indices (the
        reference code's default, True).
    """

    kind: str
    factor: float = 1.0
    original_len: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self):
        check_choice("RopeScaling kind", self.kind, SCALING_KINDS)
        factor = check_positive_float("RopeScaling factor", self.factor)
        if factor < 1:
            raise ValueError(
                f"RopeScaling factor must be >= 1 (m / m_l: how many times the training "
                f"length should fit), got {factor}"
            )
        object.__setattr__(self, "factor", factor)
        if self.original_len is not None:
            check_int("RopeScaling original_len", self.original_len, minimum=1)
        elif self.kind in ("dynamic", "yarn"):
            raise ValueError(
                f"RopeScaling kind {self.kind!r} needs original_len (the training length m_l)"
            )
        fast = check_positive_float("RopeScaling beta_fast", self.beta_fast)
        slow = check_positive_float("RopeScaling beta_slow", self.beta_slow)
        if not fast > slow:
            raise ValueError(
                f"RopeScaling needs beta_fast > beta_slow (rotations within m_l of the pairs "
                f"kept and of those interpolated), got beta_fast={fast}, beta_slow={slow}"
            )
        if self.attention_factor is not None:
            check_positive_float("RopeScaling attention_factor", self.attention_factor)
        if not isinstance(self.truncate, bool):
            raise TypeError(f"RopeScaling truncate must be True or False, got {self.truncate!r}")

    def replace(self, **changes) -> RopeScaling:
        """A copy with some fields changed (checked like a new one)."""
        return dataclasses.replace(self, **changes)


def _as_scaling(scaling) -> RopeScaling | None:
    if scaling is None or isinstance(scaling, RopeScaling):
        return scaling
    if isinstance(scaling, dict):
        return RopeScaling(**scaling)
    raise TypeError(
        "scaling must be None, a RopeScaling or a dict of its fields "
        f"(kind, factor, original_len, ...), got {type(scaling).__name__} {scaling!r}"
    )


def yarn_attention_factor(factor: float) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 ln(s) + 1`` (1 for ``s <= 1``), Peng et al. (2023)."""
    return 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0


def _pair_exponents(head_dim: int, device=None) -> torch.Tensor:
    """``2(k-1)/d`` for ``k = 1 .. d/2`` in float32 (the reference code's order)."""
    return torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim


def _yarn_ramp_ends(scaling: RopeScaling, head_dim: int, base: float) -> tuple[float, float]:
    """Pair indices (0-based) where a pair turns ``beta_fast`` and ``beta_slow`` times."""

    def index(rotations: float) -> float:
        # T_k = 2 pi b^{2k/d} (0-based k) turns m_l / T_k = rotations times within m_l
        ratio = scaling.original_len / (rotations * 2 * math.pi)
        return head_dim * math.log(ratio) / (2 * math.log(base))

    low, high = index(scaling.beta_fast), index(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, head_dim - 1)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding with optional position interpolation.

    Parameters
    ----------
    head_dim:
        ``d``, the dimension of one head's queries and keys (even, >= 2; >= 4 for the
        NTK-based scalings, whose exponent is ``d/(d-2)``).
    base:
        ``b`` of ``theta_k = b^{-2(k-1)/d}`` (default 10000, > 1).
    scaling:
        ``None`` (plain RoPE), a :class:`RopeScaling` or a dict of its fields. An
        attribute: it can be changed after training (``emb.scaling = RopeScaling(...)``).

    ``forward(q, k=None, q_start=None)`` rotates queries ``[..., q_len, d]`` at positions
    ``q_start .. q_start + q_len - 1`` and keys ``[..., k_len, d]`` at ``0 .. k_len - 1``
    (``q_start`` defaults to ``k_len - q_len``, 0 without keys); it returns the rotated
    queries, or ``(queries, keys)``. ``"dynamic"`` reads the sequence length
    ``max(q_start + q_len, k_len)``. The angles are computed in float32 and the result
    has the input's dtype.
    """

    def __init__(self, head_dim: int, base: float = 10000.0, scaling=None):
        super().__init__()
        head_dim = check_int("head_dim", head_dim, minimum=2)
        if head_dim % 2:
            raise ValueError(
                f"head_dim must be even (RoPE rotates pairs of dimensions), got {head_dim}"
            )
        base = check_positive_float("base", base)
        if not base > 1:
            raise ValueError(f"base must be > 1 (theta_k = base^(-2(k-1)/d)), got {base}")
        self.head_dim, self.base = head_dim, base
        self.scaling = scaling

    @property
    def scaling(self) -> RopeScaling | None:
        return self._scaling

    @scaling.setter
    def scaling(self, value) -> None:
        value = _as_scaling(value)
        if value is not None and value.kind in ("ntk", "dynamic") and self.head_dim < 4:
            raise ValueError(
                f"RopeScaling kind {value.kind!r} needs head_dim >= 4 (its exponent is "
                f"d/(d-2)), got head_dim={self.head_dim}"
            )
        self._scaling = value

    @property
    def attention_factor(self) -> float:
        """The factor on cos and sin: YaRN's ``sqrt(1/t)``, 1 for every other scaling."""
        s = self._scaling
        if s is None or s.kind != "yarn":
            return 1.0
        if s.attention_factor is not None:
            return s.attention_factor
        return yarn_attention_factor(s.factor)

    def inv_freq(self, seq_len: int | None = None, *, device=None) -> torch.Tensor:
        """``theta'_k`` for ``k = 1 .. d/2`` (float32), after scaling.

        ``seq_len`` matters only for ``"dynamic"`` (default: ``original_len``, i.e. no
        change); the other kinds ignore it.
        """
        d, base, s = self.head_dim, self.base, self._scaling
        exponents = _pair_exponents(d, device)
        if s is None:
            return 1.0 / (base**exponents)
        if s.kind == "linear":  # Eq. 2.100: positions times m_l / m
            return 1.0 / (base**exponents) / s.factor
        if s.kind in ("ntk", "dynamic"):  # Eqs. 2.101-2.104: base times lambda
            if s.kind == "ntk":
                growth = s.factor
            else:
                n = s.original_len if seq_len is None else check_int("seq_len", seq_len, minimum=1)
                n = max(n, s.original_len)
                growth = s.factor * n / s.original_len - (s.factor - 1)
            scaled_base = base * growth ** (d / (d - 2))
            return 1.0 / (scaled_base**exponents)
        # yarn: keep the fast pairs, interpolate the slow ones, ramp between
        periods = base**exponents
        keep, interpolate = 1.0 / periods, 1.0 / (s.factor * periods)
        low, high = _yarn_ramp_ends(s, d, base)
        if low == high:
            high += 0.001  # the reference code's guard against a zero-width ramp
        ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        gamma = (1 - ramp).to(keep.device)  # 1: kept, 0: interpolated
        return interpolate * (1 - gamma) + keep * gamma

    def angles(self, positions, seq_len: int | None = None) -> torch.Tensor:
        """The rotation angles ``t theta'_k``: ``[*positions.shape, d/2]`` (float32).

        ``positions`` is a tensor or a sequence of (0-based) positions; ``seq_len`` (for
        ``"dynamic"``) defaults to the largest position plus one.
        """
        positions = torch.as_tensor(positions)
        if positions.is_floating_point() or positions.is_complex():
            positions = positions.float()
        if seq_len is None and self._scaling is not None and self._scaling.kind == "dynamic":
            seq_len = int(positions.max()) + 1 if positions.numel() else 1
        inv = self.inv_freq(seq_len, device=positions.device)
        return positions.float()[..., None] * inv

    def rotate(self, x: torch.Tensor, positions, seq_len: int | None = None) -> torch.Tensor:
        """``Ro(x_t, t theta')`` for ``x`` of shape ``[..., len, d]`` at ``positions`` ``[len]``.

        Pairs ``(x_{2k-1}, x_{2k})`` turn by ``t theta'_k``; with ``"yarn"`` the result is
        also multiplied by :attr:`attention_factor` (as the reference code does to cos and
        sin).
        """
        self._check_input("x", x)
        positions = torch.as_tensor(positions, device=x.device)
        if positions.shape != (x.shape[-2],):
            raise ValueError(
                f"positions must have shape [len] = ({x.shape[-2]},) to match x, "
                f"got {tuple(positions.shape)}"
            )
        angles = self.angles(positions, seq_len)
        factor = self.attention_factor
        cos, sin = (angles.cos() * factor).to(x.dtype), (angles.sin() * factor).to(x.dtype)
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1).flatten(-2)

    def forward(self, q: torch.Tensor, k: torch.Tensor | None = None, q_start: int | None = None):
        q_len = self._check_input("q", q)
        k_len = 0 if k is None else self._check_input("k", k)
        if q_start is None:
            q_start = 0 if k is None else max(k_len - q_len, 0)
        q_start = check_int("q_start", q_start, minimum=0)
        seq_len = max(q_start + q_len, k_len, 1)
        q_pos = torch.arange(q_start, q_start + q_len, device=q.device)
        q_rot = self.rotate(q, q_pos, seq_len)
        if k is None:
            return q_rot
        return q_rot, self.rotate(k, torch.arange(k_len, device=k.device), seq_len)

    def _check_input(self, name: str, x) -> int:
        """The length of ``x`` ``[..., len, head_dim]``, or a ValueError naming ``name``."""
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-1] != self.head_dim:
            shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            raise ValueError(
                f"{name} must be a tensor [..., len, head_dim={self.head_dim}], got {shape}"
            )
        return x.shape[-2]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, base={self.base:g}, scaling={self._scaling!r}"
