"""The attention and mask functions that ``relbias.hf`` registers with transformers.

transformers (5.x) calls an attention function ``fn(module, query, key, value,
attention_mask, scaling=..., dropout=..., **kwargs)`` from every attention layer of the
Llama family (``ALL_ATTENTION_FUNCTIONS``), with ``query`` ``[batch, heads, q_len, d]`` and
``key``/``value`` ``[batch, kv_heads, k_len, d]`` (the cache's keys included), and builds the
mask once per forward through the mask function registered under the same name
(``ALL_MASK_ATTENTION_FUNCTIONS``). Without a mask function of its own an implementation
gets ``attention_mask=None``: a left-padded row would be read unpadded. The mask function
here is HF's boolean ``sdpa_mask`` that never skips the mask, so padding, the causal and
sliding-window structure and packed sequences all arrive as one boolean
``[batch, 1, q_len, k_len]`` mask.

Positions come per row. The query positions are HF's ``position_ids`` (left padding:
``cumsum(attention_mask) - 1``; packed sequences: restarting at 0). The key positions:

* without a cache the keys are the queries, so the key positions are the same
  ``position_ids`` (packed sequences and left padding alike);
* with a cache, a forward pre-hook on each attention layer (:func:`attention_pre_hook`)
  reads the cache before it is updated: the query offset (the slot of the first query) and
  the key offset (the slot of the first key the layer returns: 0, or the start of a
  sliding window). Key slot ``j`` holds position ``kv_offset + j + shift[b]``, with the
  per-row shift ``shift[b] = position_ids[b, -1] - (q_offset + q_len - 1)`` read from the
  last query (never a padding token under left padding): a static cache, whose queries
  do not sit at ``k_len - q_len``, and a left-padded row both come out right.

The attention is the core's :func:`relbias.biased_attention` at those positions
(``q_positions``, ``k_positions``: PE is the family's
:meth:`~relbias.RelativeBias.at_positions`), under HF's boolean mask, with HF's
``scaling`` as its ``scale`` and the grouped keys as they come (no copy per query head);
the forget gate is prepared from the layer's input (:meth:`~relbias.ForgettingGate.prepare`).
The core computes and adds the bias in float32 (under autocast too), and a query that
sees no key (a left-padding position) gets a zero output where HF's eager attention
averages every value: only the padding positions differ. Which backend runs is the core's
``auto`` choice (:func:`relbias.choose_backend`): on the CPU the fused kernel where the
positions advance by one along each row (training, a prompt), the table path for a
decoding step, the materialised bias for packed sequences with gradients.
"""

from __future__ import annotations

import torch

from relbias.attention.api import biased_attention
from relbias.biases.base import DataDependentBias, RelativeBias

#: The name under which the attention and mask functions are registered.
ATTN_IMPLEMENTATION = "relbias"

#: The keyword the pre-hook adds to an attention layer's call; transformers passes it on
#: to the attention function (``**kwargs``).
_OFFSETS_KW = "relbias_offsets"
_INPUT_KW = "relbias_input"


def bias_of(module) -> RelativeBias | DataDependentBias:
    """The bias that :func:`relbias.hf.apply` attached to the attention layer ``module``."""
    bias = getattr(module, "_relbias_bias", None)
    if bias is None:
        raise RuntimeError(
            f"attn_implementation={ATTN_IMPLEMENTATION!r} reached {type(module).__name__} "
            "which has no relbias bias: put one in every layer with relbias.hf.apply(model, "
            "family) (or load the model with relbias.hf.from_pretrained)"
        )
    return bias


def attention_pre_hook(module, args, kwargs):
    """Read the cache's query and key offsets (before this layer updates it) into kwargs."""
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    hidden = kwargs.get("hidden_states", args[0] if args else None)
    extra = {}
    if isinstance(getattr(module, "_relbias_bias", None), DataDependentBias):
        extra[_INPUT_KW] = hidden
    if cache is not None and hidden is not None:
        layer_idx = module.layer_idx
        q_len = hidden.shape[1]
        q_offset = cache.get_query_offset(layer_idx)
        if isinstance(q_offset, torch.Tensor):
            # A static layer's counter, updated in place by cache.update: keep its value now.
            q_offset = q_offset.clone()
        _, kv_offset = cache.get_mask_sizes(q_len, layer_idx)
        extra[_OFFSETS_KW] = (q_offset, kv_offset)
    if not extra:
        return None
    return args, {**kwargs, **extra}


def _query_positions(position_ids, batch: int, q_len: int, q_offset, device) -> torch.Tensor:
    """``[rows, q_len]`` LongTensor of query positions: ``rows`` is 1 where every row of the
    batch has the same positions (HF's default ``position_ids``, ``[1, q_len]``), so that
    the bias is computed once and broadcast; else ``batch``."""
    if position_ids is None:
        base = torch.arange(q_len, device=device)
        if isinstance(q_offset, torch.Tensor):
            base = base + q_offset.to(device)
        else:
            base = base + int(q_offset)
        return base[None]
    if (
        position_ids.dim() != 2
        or position_ids.shape[-1] != q_len
        or position_ids.shape[0] not in (1, batch)
    ):
        raise ValueError(
            f"position_ids must have shape [batch={batch} or 1, q_len={q_len}], got "
            f"{tuple(position_ids.shape)}"
        )
    return position_ids.to(device=device, dtype=torch.long)


def positions(query, key, position_ids, offsets) -> tuple[torch.Tensor, torch.Tensor]:
    """Query positions ``[rows, q_len]`` and key positions ``[rows, k_len]`` (LongTensors;
    ``rows`` is the batch, or 1 where all rows share their positions).

    ``offsets`` is ``(q_offset, kv_offset)`` from the cache (:func:`attention_pre_hook`), or
    None without a cache.
    """
    batch, q_len, k_len = query.shape[0], query.shape[2], key.shape[2]
    device = query.device
    if offsets is None:
        if k_len != q_len:
            raise ValueError(
                f"without a cache the keys must be the queries (k_len == q_len), got "
                f"q_len={q_len}, k_len={k_len}"
            )
        qpos = _query_positions(position_ids, batch, q_len, 0, device)
        return qpos, qpos
    q_offset, kv_offset = offsets
    qpos = _query_positions(position_ids, batch, q_len, q_offset, device)
    last_slot = q_offset + (q_len - 1)
    if isinstance(last_slot, torch.Tensor):
        last_slot = last_slot.to(device)
    shift = qpos[:, -1:] - last_slot  # [rows, 1]: position minus slot, per row
    kpos = torch.arange(k_len, device=device)[None, :] + int(kv_offset) + shift
    return qpos, kpos


def relbias_attention(
    module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
):
    """The attention function registered as ``"relbias"`` (see the module's docstring).

    Returns ``(output [batch, q_len, heads, d], None)`` as transformers' attention functions do.
    """
    bias_module = bias_of(module)
    batch, heads, q_len, head_dim = query.shape
    if key.shape[1] == 0 or heads % key.shape[1]:
        raise ValueError(f"query heads ({heads}) must be a multiple of key heads ({key.shape[1]})")
    if bias_module.num_heads != heads:
        raise ValueError(
            f"the bias has {bias_module.num_heads} heads but the layer's query has {heads}"
        )
    if dropout and module.training:
        raise ValueError(
            f"relbias attention has no attention dropout, but the layer asks for {dropout}: "
            "set the config's attention_dropout to 0.0"
        )
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError(
            f"relbias attention takes the boolean mask of its own mask function, got a "
            f"{attention_mask.dtype} mask (a 4-D float mask passed by hand is not supported)"
        )
    if isinstance(bias_module, DataDependentBias):
        if key.shape[2] != q_len:
            raise ValueError(
                f"family {module._relbias_family!r} (the forget gate) cannot decode with a "
                f"cache ({key.shape[2]} keys for {q_len} queries): relbias.hf does not hold "
                "its cumulative gate state between calls; use use_cache=False (training, "
                "evaluation, or generate(..., use_cache=False))"
            )
        # F_i - F_j from the layer input; without a cache the slots are the positions.
        bias = bias_module.prepare(kwargs[_INPUT_KW])
        placed = {"causal": True}
    else:
        qpos, kpos = positions(query, key, kwargs.get("position_ids"), kwargs.get(_OFFSETS_KW))
        bias = bias_module
        # HF's mask holds the causal rule (and padding, windows, a static cache's empty
        # slots); the positions place the bias.
        placed = {"q_positions": qpos, "k_positions": kpos, "causal": attention_mask is None}
    out = biased_attention(
        query,
        key,
        value,
        bias,
        mask=attention_mask,
        scale=_float_scale(scaling, head_dim),
        **placed,
    )
    return out.transpose(1, 2).contiguous(), None


def _float_scale(scaling, head_dim: int):
    """HF's ``scaling`` as the core's ``scale`` (None: 1/sqrt(d), the core's default)."""
    if scaling is None or scaling == head_dim**-0.5:
        return None
    return float(scaling)


def relbias_mask(*args, **kwargs):
    """The mask function registered as ``"relbias"``: HF's boolean SDPA mask, never skipped.

    ``[batch, 1, q_len, k_len]``, True where a query may read a key (causal, padding,
    sliding window and packed sequences included).
    """
    from transformers.masking_utils import sdpa_mask

    kwargs["allow_is_causal_skip"] = False
    kwargs.pop("allow_is_bidirectional_skip", None)
    return sdpa_mask(*args, **kwargs)
