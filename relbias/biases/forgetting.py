"""The Forgetting Transformer's forget gate (Lin et al., ICLR 2025): a data-dependent bias."""

from __future__ import annotations

import numbers

import torch
from torch import nn
from torch.nn import functional as F

from relbias._checks import check_int, compute_dtype, no_autocast
from relbias.biases.base import DataDependentBias
from relbias.biases.prepared import ForgettingBias

#: The gate logits' initial bias, as the reference code's data-dependent gate (zeros):
#: f = sigmoid(0) = 0.5 at the start of training, so a key's weight halves per token until
#: the gate learns otherwise. A larger value (e.g. 5.0: f ~ 0.993, halving about every
#: 100 tokens) starts by forgetting little.
DEFAULT_BIAS_INIT = 0.0
#: The standard deviation of the gate's initial weights (the reference code's
#: ``initializer_range``).
WEIGHT_INIT_STD = 0.02


class ForgettingGate(DataDependentBias):
    r"""The Forgetting Transformer's gate: :math:`\mathrm{PE}(i,j) = \sum_{t=j+1}^{i} \log f_t`.

    Per head :math:`h`, a scalar forget gate :math:`f_t = \sigma(w_h^\top x_t + b_h)` is
    computed from the layer input :math:`x_t` (``x`` is ``[batch, len, dim]``). With the
    cumulative sum :math:`F_i = \sum_{t \le i} \log f_t` (0-based positions),

    .. math::
        \mathrm{PE}(i, j) = F_i - F_j = \sum_{t = j+1}^{i} \log f_t \quad (j \le i),

    0 on the diagonal and non-increasing as :math:`j` moves away from :math:`i`: the bias
    decays at a rate chosen by the data instead of by the distance :math:`i - j` (ALiBi is
    the special case of a constant gate, :math:`\log f_t = -m_h`). Causal only. In the
    softmax :math:`F_i` is a per-row constant that cancels, so attention needs only the O(n)
    values :math:`-F_j` per sequence and head.

    Numerics: :math:`\log f` is computed in float32 (outside ``torch.autocast``), its
    cumulative sum :math:`F` in float64. At long lengths :math:`F` is a large negative
    number (about -6,000 after 64k tokens forgetting 0.1 each), and :math:`F_i - F_j` of
    float32 values would lose digits (``ulp(6000)`` ~ ``5e-4``); every backend reads
    :math:`F` as two float32 parts, ``hi`` (float32's rounding of :math:`F`, no gradient)
    and ``lo = F - hi`` (carrying the gradient), and computes
    :math:`(hi_i - hi_j) + (lo_i - lo_j)`: :math:`hi_i - hi_j` is exact when the two lie
    within a factor 2 (Sterbenz), so the bias has float32's rounding of the true difference
    (:class:`~relbias.biases.prepared.ForgettingBias`).

    The gate is ``nn.Linear(dim, num_heads)``: weights drawn from
    :math:`\mathcal{N}(0, 0.02^2)` as in the reference code; its bias starts at
    ``bias_init`` (one number, or one per head), by default 0 as in the reference code
    (:math:`f \approx 0.5` at the start); ``bias_init=5.0`` (:math:`f \approx 0.993`)
    would start by forgetting little, a key's weight halving about every 100 tokens.

    Lin et al., "Forgetting Transformer: Softmax Attention with a Forget Gate", ICLR 2025.

    Use: ``prepared = gate.prepare(x)`` once per layer, then
    ``biased_attention(q, k, v, prepared)`` with any backend. Decoding with a cache keeps
    ``prepared.cumulative`` and passes it as ``past`` for the next tokens. Calling the module
    returns the dense bias ``[batch, heads, q_len, k_len]`` (no mask).
    """

    def __init__(self, num_heads, dim, *, bias_init=DEFAULT_BIAS_INIT):
        super().__init__(num_heads)
        self.dim = check_int("dim", dim, minimum=1)
        init = _bias_init(bias_init, self.num_heads)
        self.proj = nn.Linear(self.dim, self.num_heads)
        with torch.no_grad():
            self.proj.weight.normal_(0.0, WEIGHT_INIT_STD)
            self.proj.bias.copy_(init)

    @property
    def device(self) -> torch.device:
        return self.proj.weight.device

    @property
    def dtype(self) -> torch.dtype:
        """The compute dtype: float32, or float64 for a float64 module (for gradcheck)."""
        return compute_dtype(self.proj.weight)

    def _check_x(self, x) -> None:
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x must be a torch.Tensor [batch, len, dim], got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating-point tensor, got {x.dtype}")
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(
                f"x must have shape [batch, len, dim={self.dim}], got {tuple(x.shape)}"
            )

    def _check_past(self, past, batch: int) -> None:
        if past is None:
            return
        if not isinstance(past, torch.Tensor) or past.dtype != torch.float64:
            got = past.dtype if isinstance(past, torch.Tensor) else type(past).__name__
            raise TypeError(
                "past must be a float64 tensor [batch, heads, past_len] (the .cumulative of "
                f"an earlier prepared bias), got {got}"
            )
        if past.dim() != 3 or past.shape[0] != batch or past.shape[1] != self.num_heads:
            raise ValueError(
                f"past must have shape [batch={batch}, heads={self.num_heads}, past_len], "
                f"got {tuple(past.shape)}"
            )

    def log_forget(self, x) -> torch.Tensor:
        r""":math:`\log f_t = \log\sigma(w_h^\top x_t + b_h)` as ``[batch, heads, len]`` (<= 0).

        In float32 (float64 for a float64 module), outside ``torch.autocast``, whatever
        floating dtype ``x`` has.
        """
        self._check_x(x)
        dtype = self.dtype
        with no_autocast(x.device):
            logits = F.linear(x.to(dtype), self.proj.weight.to(dtype), self.proj.bias.to(dtype))
            return F.logsigmoid(logits).transpose(1, 2)

    def cumulative(self, x, past=None) -> torch.Tensor:
        r""":math:`F_i = \sum_{t \le i} \log f_t` in float64, ``[batch, heads, len]``.

        With ``past`` (the float64 ``F`` of the earlier positions, ``[batch, heads,
        past_len]``), the sum continues from its last column: ``x`` holds the positions
        ``past_len ..``.
        """
        log_f = self.log_forget(x)
        self._check_past(past, x.shape[0])
        F_new = torch.cumsum(log_f.to(torch.float64), dim=-1)
        if past is not None and past.shape[-1] > 0:
            F_new = F_new + past[..., -1:]
        return F_new

    def prepare(self, x, *, past=None):
        """The bias for queries at ``x``'s positions: a
        :class:`~relbias.biases.prepared.ForgettingBias`.

        Its keys are the ``past_len`` earlier positions and then ``x``'s (``k_len =
        past_len + q_len``, ``q_start = past_len``). Pass it as ``bias`` to
        :func:`relbias.biased_attention` (any backend, causal); keep its ``.cumulative``
        (float64 ``F`` of every key) as ``past`` for the next decoding step.
        """
        F_new = self.cumulative(x, past)
        past_len = 0 if past is None else past.shape[-1]
        F_all = F_new if past is None else torch.cat([past, F_new], dim=-1)
        q_len = x.shape[1]
        return ForgettingBias._unchecked(F_all, q_len, past_len + q_len, past_len, self.dtype)

    def forward(self, x, *, past=None) -> torch.Tensor:
        """The dense bias ``[batch, heads, q_len, k_len]`` in float32 (float64 for a float64
        module): ``F_i - F_j`` for every pair, without the causal mask (attention adds it)."""
        return self.prepare(x, past=past).materialize()

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, dim={self.dim}"


def _bias_init(value, num_heads: int) -> torch.Tensor:
    """``bias_init`` as a float32 tensor ``[num_heads]``: one finite number or one per head."""
    if isinstance(value, bool):
        raise TypeError(f"bias_init must be a number or {num_heads} numbers, got {value!r}")
    if isinstance(value, numbers.Real):
        init = torch.full((num_heads,), float(value))
    else:
        try:
            init = torch.as_tensor(value, dtype=torch.float32).reshape(-1)
        except (TypeError, ValueError, RuntimeError):
            raise TypeError(
                f"bias_init must be a number or {num_heads} numbers (one per head), "
                f"got {type(value).__name__}"
            ) from None
        if init.numel() != num_heads:
            raise ValueError(
                f"bias_init must be a number or {num_heads} numbers (one per head), got {value!r}"
            )
    if not torch.isfinite(init).all():
        raise ValueError(f"bias_init must be finite, got {value!r}")
    return init
