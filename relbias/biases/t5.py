"""T5 buckets (Raffel et al., 2020): the book's Eqs. 2.78-2.81."""

from __future__ import annotations

import math

import torch
from torch import nn

from relbias._checks import check_bool, check_int, compute_dtype
from relbias.biases.base import RelativeBias
from relbias.biases.positions import take_columns


def _check_bucket_settings(num_buckets, max_distance, bidirectional) -> tuple[int, int, int]:
    num_buckets = check_int("num_buckets", num_buckets, minimum=1)
    max_distance = check_int("max_distance", max_distance, minimum=1)
    check_bool("bidirectional", bidirectional)
    per_side = num_buckets // 2 if bidirectional else num_buckets
    exact = per_side // 2
    if exact < 1:
        least = 4 if bidirectional else 2
        raise ValueError(
            f"num_buckets must be >= {least} when bidirectional={bidirectional} "
            f"(got {num_buckets}): no bucket would hold an exact offset"
        )
    if max_distance <= exact:
        raise ValueError(
            f"max_distance must be > {exact} (the number of exact buckets for "
            f"num_buckets={num_buckets}, bidirectional={bidirectional}), got {max_distance}: "
            "no logarithmic buckets could be formed"
        )
    return num_buckets, max_distance, per_side


def t5_bucket(offset, *, num_buckets=32, max_distance=128, bidirectional=True) -> torch.Tensor:
    r"""Map offsets ``i - j`` (an integer tensor) to T5 buckets.

    With :math:`n_b + 1` buckets per side and :math:`h = \lfloor (n_b+1)/2 \rfloor`
    exact buckets (the book's Eq. 2.79, for odd :math:`n_b`):

    .. math::
        b(i-j) = \begin{cases} i-j & 0 \le i-j < h \\
        \min\!\big(n_b,\; h + \big\lfloor \frac{\log(i-j) - \log h}
        {\log \mathrm{dist}_{\max} - \log h}\, (n_b + 1 - h) \big\rfloor\big) & i-j \ge h
        \end{cases}

    Causal (``bidirectional=False``): future keys (``i - j < 0``) go to bucket 0.
    Bidirectional: half of ``num_buckets`` for each sign, future keys in the upper half.

    This returns exactly what HuggingFace's ``T5Attention._relative_position_bucket``
    returns for ``relative_position = j - i`` (the opposite sign), including its
    float32 logarithm and truncation, which make the last bucket start before
    ``max_distance`` (at offset 91 bidirectional, 113 causal, for 32 / 128).
    """
    if not isinstance(offset, torch.Tensor):
        raise TypeError(f"offset must be an integer torch.Tensor, got {type(offset).__name__}")
    if offset.is_floating_point() or offset.is_complex() or offset.dtype == torch.bool:
        raise TypeError(f"offset must be an integer tensor (e.g. torch.long), got {offset.dtype}")
    num_buckets, max_distance, per_side = _check_bucket_settings(
        num_buckets, max_distance, bidirectional
    )
    offset = offset.long()
    if bidirectional:
        base = (offset < 0).long() * per_side
        distance = offset.abs()
    else:
        base = torch.zeros_like(offset)
        distance = offset.clamp(min=0)
    exact = per_side // 2
    # The logarithmic branch, in float32 as the reference computes it. Distances
    # below `exact` take the exact branch; clamping keeps log() finite for them.
    far = distance.clamp(min=exact).float()
    log_ratio = torch.log(far / exact) / math.log(max_distance / exact)
    log_bucket = exact + (log_ratio * (per_side - exact)).to(torch.long)
    log_bucket = log_bucket.clamp(max=per_side - 1)
    return base + torch.where(distance < exact, distance, log_bucket)


class T5Bias(RelativeBias):
    r"""T5's bias: one learnable scalar per head and bucket, :math:`\mathrm{PE}(i,j) = u_{b(i-j)}`.

    Buckets come from :func:`t5_bucket`. The table ``weight`` is
    ``[num_heads, num_buckets]`` and starts at zero. T5 itself shares one table across
    all layers (a choice of the model: one module, or one prepared bias, passed to every
    layer). Raffel et al. (2020).
    """

    def __init__(self, num_heads, *, num_buckets=32, max_distance=128, bidirectional=False):
        super().__init__(num_heads, bidirectional=bidirectional)
        self.num_buckets, self.max_distance, _ = _check_bucket_settings(
            num_buckets, max_distance, bidirectional
        )
        self.weight = nn.Parameter(torch.zeros(self.num_heads, self.num_buckets))

    def buckets(self, offsets: torch.Tensor) -> torch.Tensor:
        return t5_bucket(
            offsets,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
            bidirectional=self.bidirectional,
        )

    def _offset_values(self, offsets):
        return take_columns(self.weight.to(compute_dtype(self.weight)), self.buckets(offsets))

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, num_buckets={self.num_buckets}, "
            f"max_distance={self.max_distance}"
        )
