"""A tiny decoder-only language model whose positional scheme is chosen by name.

:class:`TinyLM` is the model every chapter trains. Its ``position`` argument picks
either a relative bias family of :func:`relbias.make_bias` (added to the attention
scores in every layer) or one of the baselines readers compare against:

``nope``
    no positional information at all (the causal mask alone);
``sinusoidal``
    the fixed sinusoidal absolute embedding of Vaswani et al. (2017) times a learned
    scalar, added to the token embeddings;
``learned``
    a learned absolute embedding with one vector per position ``0 .. train_len - 1``;
``rope``
    rotary position embedding (Su et al., 2021) applied to queries and keys
    (:class:`relbias.RotaryEmbedding`; ``rope_scaling`` interpolates positions).

and, after the book, a bias computed from the tokens:

``forgetting``
    the Forgetting Transformer's forget gate (Lin et al., 2025;
    :class:`relbias.ForgettingGate`): no positional embedding; every layer has its own
    gate, read from the layer's normalised input (the input of its attention, as in the
    reference code), and adds the sum of log f_t over j < t <= i to the scores.

Scales: token embeddings, the learned absolute table and all linear weights start with
std 0.02 (GPT-2's initialisation); input and output embeddings are tied. The sinusoid
(RMS 0.707 per dimension) would drown such token embeddings, so it is multiplied by a
learned scalar (as x-transformers' ScaledSinusoidalEmbedding) initialised to
:data:`SIN_SCALE` so that it starts at the token embeddings' RMS, 0.02 per dimension.
(Unscaled, this baseline stayed near 3.3 bits per byte even at the training length in
our quick runs, against about 2.0 for the others; with x-transformers' initial scale
``dim ** -0.5`` it still lagged.)

Bias sharing: by default (``share_bias=True``) one bias module serves every layer,
as T5 shares its bucket table across layers; ``share_bias=False`` gives every layer
its own module (own parameters for learnable families).

The bias reaches attention prepared (:func:`relbias.prepare_bias`): each forward
computes a module's O(n) table (FIRE: its O(n) ingredients) once and hands it to the
layers that share it. :func:`relbias.biased_attention` then picks the backend: in
training it materialises the bias from that table (gradients reach the parameters),
and in evaluation on a CPU (no gradients) it adds the bias inside relbias's fused
kernel (:mod:`relbias.attention.fused`; the strided-table path where that kernel cannot be
built), with no ``len x len`` tensor per head, so 16x-length evaluations stay cheap.
``attention_backend`` (an attribute, changeable after training) overrides the choice;
``"auto"`` (the default) leaves it to :func:`relbias.biased_attention`'s one policy, on
every device (on CUDA: materialised when training, the O(n) table path in evaluation).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from relbias._checks import check_positive_ints
from relbias.attention.api import BACKENDS, biased_attention
from relbias.biases.prepared import prepare_bias
from relbias.biases.registry import BIAS_NAMES as _BIAS_NAMES
from relbias.biases.registry import DATA_DEPENDENT_NAMES, make_bias
from relbias.rotary import RopeScaling, RotaryEmbedding

BIAS_POSITIONS = tuple(_BIAS_NAMES)
BASELINE_POSITIONS = ("nope", "sinusoidal", "learned", "rope")
#: Biases computed from each layer's input (the forget gate): one module per layer.
GATED_POSITIONS = tuple(DATA_DEPENDENT_NAMES)
POSITION_NAMES = BIAS_POSITIONS + BASELINE_POSITIONS + GATED_POSITIONS
LEARNED_FALLBACKS = ("error", "clip")
SIN_SCALE = 0.02 * math.sqrt(2.0)  # the sinusoid times this has RMS 0.02 per dimension


def default_bias_kwargs(position: str, train_len: int) -> dict:
    """Keyword arguments :class:`TinyLM` passes to ``make_bias`` unless told otherwise.

    - ``offset``: ``max_offset = train_len - 1`` (exactly the offsets a causal model
      sees in training) and ``unseen="clip"`` (farther offsets share the edge
      parameter, Shaw et al.).
    - ``t5``: 32 causal buckets (``train_len`` buckets when shorter than 32) with
      ``max_distance = train_len``, so the last bucket is trained and every longer
      offset shares it (as T5 trains on 512 tokens with ``max_distance = 128``).
    - ``fire``: threshold ``L = train_len`` (learnable), so progressive interpolation
      starts where the training length ends.
    - every other family: the library's defaults.
    """
    if position == "offset":
        return {"max_offset": train_len - 1, "unseen": "clip"}
    if position == "t5":
        return {"num_buckets": max(2, min(32, train_len)), "max_distance": train_len}
    if position == "fire":
        return {"L": train_len}
    return {}


class LearnedPositions(nn.Module):
    """Learned absolute embeddings for positions ``0 .. size - 1``.

    ``fallback="error"`` (default) raises a ``ValueError`` for a longer sequence;
    ``fallback="clip"`` gives every position ``>= size`` the last trained vector.
    """

    def __init__(self, size: int, dim: int, fallback: str = "error"):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(size, dim) * 0.02)
        self.fallback = _check_fallback(fallback)

    def forward(self, seq_len: int) -> torch.Tensor:
        size = self.weight.shape[0]
        if seq_len > size and self.fallback == "error":
            raise ValueError(
                f"learned absolute positions exist for 0..{size - 1} (train_len={size}), "
                f"but the input has {seq_len} tokens; pass learned_fallback='clip' to give "
                "later positions the last trained embedding"
            )
        index = torch.arange(seq_len, device=self.weight.device).clamp(max=size - 1)
        return self.weight[index]


def _check_fallback(fallback) -> str:
    if fallback not in LEARNED_FALLBACKS:
        raise ValueError(f"learned_fallback must be one of {LEARNED_FALLBACKS}, got {fallback!r}")
    return fallback


def sinusoidal_positions(seq_len: int, dim: int, *, device=None) -> torch.Tensor:
    """The fixed sinusoidal embedding ``[seq_len, dim]`` (sin on even, cos on odd dims)."""
    pos = torch.arange(seq_len, dtype=torch.float32, device=device)[:, None]
    freq = torch.exp(
        torch.arange(0, dim, 2, dtype=torch.float32, device=device) * (-math.log(10000.0) / dim)
    )
    table = torch.zeros(seq_len, dim, device=device)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : dim // 2]
    return table


class Attention(nn.Module):
    """Causal multi-head self-attention through :func:`relbias.biased_attention`."""

    def __init__(self, dim: int, heads: int, rotary: RotaryEmbedding | None = None):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim, bias=False)
        self.rotary = rotary

    def forward(self, x: torch.Tensor, bias=None, backend: str = "auto") -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if self.rotary is not None:
            q, k = self.rotary(q, k)
        out = biased_attention(q, k, v, bias=bias, causal=True, backend=backend)
        return self.proj(out.transpose(1, 2).reshape(b, t, c))


class Block(nn.Module):
    """A pre-norm transformer block: ``x + Att(LN(x))`` then ``x + MLP(LN(x))``."""

    def __init__(
        self, dim: int, heads: int, *, mlp_ratio: int = 4, rotary=None, bias=None, gate=None
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, rotary)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(
            nn.Linear(dim, mlp_ratio * dim), nn.GELU(), nn.Linear(mlp_ratio * dim, dim)
        )
        self.bias = bias
        self.gate = gate

    def forward(
        self, x: torch.Tensor, bias=None, backend: str = "auto", query_shift: int = 0
    ) -> torch.Tensor:
        h = self.norm1(x)
        if self.bias is not None:
            bias = layer_bias(self.bias, x.shape[1], query_shift)
        elif self.gate is not None:
            bias = self.gate.prepare(h)  # the forget gate reads the attention's input
        x = x + self.attn(h, bias, backend)
        return x + self.mlp(self.norm2(x))


def layer_bias(module, seq_len: int, query_shift: int = 0):
    """The bias a layer adds for a sequence of ``seq_len`` tokens.

    With ``query_shift = 0`` (always, except in the FIRE ablation): the module prepared for
    that length. With ``query_shift = s > 0``: the dense ``[heads, seq_len, seq_len]`` bias
    of the same sequence placed at absolute positions ``s .. s + seq_len - 1`` (queries and
    keys shifted together, so offsets ``i - j`` are unchanged). Only a bias that reads the
    absolute query position (FIRE's ``psi(max(L, i))``) changes under the shift.
    """
    if query_shift == 0:
        return prepare_bias(module, seq_len)
    full = module(seq_len, seq_len + query_shift, q_start=query_shift)
    return full[:, :, query_shift:]


class TinyLM(nn.Module):
    """A small decoder-only transformer LM with a named positional scheme.

    Parameters
    ----------
    vocab_size, dim, depth, heads:
        vocabulary (256 for bytes), width, number of blocks, attention heads.
    position:
        one of :data:`POSITION_NAMES`: a bias family name of ``make_bias`` or
        ``nope``, ``sinusoidal``, ``learned``, ``rope``.
    train_len:
        the training sequence length; sizes the learned absolute table and the
        defaults of :func:`default_bias_kwargs`.
    share_bias:
        True (default, like T5): one bias module for all layers; False: one per layer.
        (The forget gate is always one per layer: it reads each layer's input.)
    bias_kwargs:
        overrides of :func:`default_bias_kwargs`, passed to ``make_bias``.
    learned_fallback:
        ``position="learned"`` only. ``"error"`` (default): a sequence longer than
        ``train_len`` raises ``ValueError``; ``"clip"``: positions ``>= train_len``
        reuse the last trained embedding. Can be changed after training.
    rope_base, rope_scaling:
        ``position="rope"`` only: the rotation base ``b`` and how the angles are scaled
        for longer inputs: None (plain RoPE), or a :class:`relbias.RopeScaling` (or a dict
        of its fields): linear interpolation, NTK, dynamic NTK or YaRN
        (:mod:`relbias.rotary`). ``rope_scaling`` is an attribute: set it after training.
    attention_backend:
        ``backend`` of :func:`relbias.biased_attention` for every layer: ``"auto"``
        (default; see the module docstring), ``"materialize"``, ``"table"``,
        ``"flex"`` or ``"fused"``. Can be changed after training.

    ``forward(idx)`` takes byte ids ``[batch, len]`` and returns logits
    ``[batch, len, vocab_size]``. Input and output embeddings are tied.
    """

    def __init__(
        self,
        vocab_size: int = 256,
        dim: int = 64,
        depth: int = 2,
        heads: int = 4,
        *,
        position: str = "alibi",
        train_len: int = 64,
        share_bias: bool = True,
        bias_kwargs: dict | None = None,
        learned_fallback: str = "error",
        rope_base: float = 10000.0,
        rope_scaling=None,
        mlp_ratio: int = 4,
        attention_backend: str = "auto",
    ):
        super().__init__()
        check_positive_ints(
            vocab_size=vocab_size, dim=dim, depth=depth, heads=heads, train_len=train_len
        )
        if dim % heads:
            raise ValueError(f"dim ({dim}) must be divisible by heads ({heads})")
        if position not in POSITION_NAMES:
            raise ValueError(f"position must be one of {POSITION_NAMES}, got {position!r}")
        if not isinstance(share_bias, bool):
            raise TypeError(f"share_bias must be True or False, got {share_bias!r}")
        self.position, self.train_len, self.dim = position, train_len, dim
        self.heads, self.depth, self.share_bias = heads, depth, share_bias
        self.bias_kwargs = {**default_bias_kwargs(position, train_len), **(bias_kwargs or {})}
        self.attention_backend = attention_backend
        self.bias_query_shift = 0
        self.embed = nn.Embedding(vocab_size, dim)
        self.sin_scale = nn.Parameter(torch.tensor(SIN_SCALE)) if position == "sinusoidal" else None
        self.abs_pos = (
            LearnedPositions(train_len, dim, learned_fallback) if position == "learned" else None
        )
        _check_fallback(learned_fallback)
        rotary = (
            RotaryEmbedding(dim // heads, rope_base, scaling=rope_scaling)
            if position == "rope"
            else None
        )
        self.rotary = rotary
        self.bias = self._new_bias() if self.uses_bias and share_bias else None
        per_layer = self.uses_bias and not share_bias
        gated = position in GATED_POSITIONS
        self.blocks = nn.ModuleList(
            Block(
                dim,
                heads,
                mlp_ratio=mlp_ratio,
                rotary=rotary,
                bias=self._new_bias() if per_layer else None,
                gate=make_bias(position, heads, dim=dim, **self.bias_kwargs) if gated else None,
            )
            for _ in range(depth)
        )
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab_size, bias=False)
        self.head.weight = self.embed.weight
        self._init_weights()

    @property
    def attention_backend(self) -> str:
        return self._attention_backend

    @attention_backend.setter
    def attention_backend(self, value: str) -> None:
        if value not in BACKENDS:
            raise ValueError(f"attention_backend must be one of {list(BACKENDS)}, got {value!r}")
        self._attention_backend = value

    @property
    def bias_query_shift(self) -> int:
        """Absolute position of the first token as the bias sees it (default 0).

        Set it (an integer >= 0) to train a bias that reads absolute query positions
        (FIRE) on sequences that pretend to start later: offsets are unchanged, the
        query positions grow by the shift. The bias is then materialised. Token
        embeddings, absolute positions and RoPE ignore it.
        """
        return self._bias_query_shift

    @bias_query_shift.setter
    def bias_query_shift(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"bias_query_shift must be an integer >= 0, got {value!r}")
        self._bias_query_shift = value

    @property
    def rope_scaling(self) -> RopeScaling | None:
        """The rotary embedding's scaling (None: plain RoPE, or no rotary embedding)."""
        return self.rotary.scaling if self.rotary is not None else None

    @rope_scaling.setter
    def rope_scaling(self, value) -> None:
        if self.rotary is None:
            raise ValueError(f"rope_scaling needs position='rope', not {self.position!r}")
        self.rotary.scaling = value

    @property
    def uses_bias(self) -> bool:
        """True when the positional scheme is an additive relative bias."""
        return self.position in BIAS_POSITIONS

    @property
    def learned_fallback(self) -> str | None:
        return self.abs_pos.fallback if self.abs_pos is not None else None

    @learned_fallback.setter
    def learned_fallback(self, value: str) -> None:
        if self.abs_pos is not None:
            self.abs_pos.fallback = _check_fallback(value)

    def gates(self) -> list:
        """The forget gates, one per layer (``position="forgetting"``), else empty."""
        return [blk.gate for blk in self.blocks if blk.gate is not None]

    @torch.no_grad()
    def gate_log_forget(self, idx: torch.Tensor) -> torch.Tensor:
        r"""Every layer's forget-gate :math:`\log f_t` on the token ids ``idx`` ``[batch, len]``:
        float ``[layers, batch, heads, len]``, each layer's gate applied to the normalised
        input it reads in :meth:`forward` (evaluation mode; no gradients)."""
        if not self.gates():
            raise ValueError(
                f"gate_log_forget needs position='forgetting', this model has {self.position!r}"
            )
        if idx.dim() != 2:
            raise ValueError(f"idx must be [batch, len], got shape {tuple(idx.shape)}")
        was_training = self.training
        self.eval()
        x, per_layer = self.embed(idx), []
        for block in self.blocks:
            per_layer.append(block.gate.log_forget(block.norm1(x)))
            x = block(x, backend=self._attention_backend)
        self.train(was_training)
        return torch.stack(per_layer)

    def bias_modules(self) -> list:
        """The bias modules: one when shared, one per layer otherwise, none for baselines."""
        if self.bias is not None:
            return [self.bias]
        return [blk.bias for blk in self.blocks if blk.bias is not None]

    def _new_bias(self):
        return make_bias(self.position, self.heads, **self.bias_kwargs)

    def _init_weights(self) -> None:
        for name, p in self.named_parameters():
            if name.startswith("bias") or ".bias." in name or ".gate." in name:
                continue  # the bias families and gates initialise themselves
            if p.dim() == 2 and not name.startswith("abs_pos"):
                nn.init.normal_(p, std=0.02)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if idx.dim() != 2:
            raise ValueError(f"idx must be [batch, len], got shape {tuple(idx.shape)}")
        t = idx.shape[1]
        x = self.embed(idx)
        if self.position == "sinusoidal":
            table = sinusoidal_positions(t, self.dim, device=x.device)
            x = x + (self.sin_scale * table).to(x.dtype)
        elif self.abs_pos is not None:
            x = x + self.abs_pos(t)
        shift = getattr(self, "_bias_query_shift", 0) if self.uses_bias else 0
        shared = layer_bias(self.bias, t, shift) if self.bias is not None else None
        backend = "materialize" if shift else self._attention_backend
        for block in self.blocks:
            x = block(x, shared, backend, shift)
        return self.head(self.norm(x))

    def extra_repr(self) -> str:
        return (
            f"position={self.position!r}, train_len={self.train_len}, share_bias={self.share_bias}"
        )


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy in nats; targets equal to -100 are ignored."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=-100)
