"""The attention and mask functions that ``relbias.hf`` registers with transformers.

transformers (5.x) calls an attention function ``fn(module, query, key, value,
attention_mask, scaling=..., dropout=..., **kwargs)`` from every attention layer of the
Llama family (``ALL_ATTENTION_FUNCTIONS``), with ``query`` ``[batch, heads, q_len, d]`` and
``key``/``value`` ``[batch, kv_heads, k_len, d]`` (the cache's keys included), and builds the
mask once per forward through the mask function registered under the same name
(``ALL_MASK_ATTENTION_FUNCTIONS``). Without a mask function of its own an implementation
gets ``attention_mask=None``: a left-padded row would be read unpadded. The mask function
here is HF's boolean ``sdpa_mask``, so padding, the causal and sliding-window structure
and packed sequences all arrive as one boolean ``[batch, 1, q_len, k_len]`` mask; it is
skipped (None, the causal rule) only where one query reads every key of a dynamic cache,
unpadded (:func:`relbias_mask`).

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
positions advance by one along each row (training, a prompt), the materialised bias for
packed sequences with gradients. A decoding step without gradients (one query per row)
computes what the core's table path would, with the per-step work done once: the
positions and mask work once per forward for every layer, the bias row a slice of a
table kept per bias module between steps (see "the cached decoding step" below). Under
``torch.compile`` with a static cache the graph keeps no table between steps (reading its
range would break the graph): every layer evaluates its bias at every slot, except that a
parameter-free family (ALiBi, Sandwich), whose values are the same in every layer, is read
once per forward for every layer (:func:`_shared_bias`), on a decoding step from the table
of its values that :func:`relbias.hf.apply` keeps (:func:`_kept_row`).
"""

from __future__ import annotations

import math
import threading
import weakref

import torch
from torch.nn import functional as F

from relbias._checks import (
    autocast_enabled,
    check_positive_float,
    compute_dtype,
    needs_grad,
    no_autocast,
)
from relbias.attention.api import biased_attention
from relbias.attention.positioned import check_mask
from relbias.biases.base import DataDependentBias, RelativeBias
from relbias.biases.fire import FIRE

#: The name under which the attention and mask functions are registered.
ATTN_IMPLEMENTATION = "relbias"

#: The keyword the pre-hook adds to an attention layer's call; transformers passes it on
#: to the attention function (``**kwargs``).
_OFFSETS_KW = "relbias_offsets"
_INPUT_KW = "relbias_input"
_SHARED_KW = "relbias_shared"


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
        offsets = (q_offset, kv_offset)
        if torch.compiler.is_compiling() and _all_static(cache):
            # Every full static layer's counter holds the same value before its own update:
            # the first layer's offsets serve them all, in one store per forward (_shared_bias).
            if layer_idx == 0:
                cache._relbias_shared = {"offsets": offsets}
            shared = getattr(cache, "_relbias_shared", None)
            if shared is not None:
                offsets, extra[_SHARED_KW] = shared["offsets"], shared
                if layer_idx == len(cache.layers) - 1:  # nothing kept between forwards
                    del cache._relbias_shared
        extra[_OFFSETS_KW] = offsets
    if not extra:
        return None
    return args, {**kwargs, **extra}


def _all_static(cache) -> bool:
    """Whether every layer of ``cache`` is a full static layer (HF's ``StaticLayer``)."""
    from transformers.cache_utils import StaticLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is StaticLayer for layer in layers)


def _shared_bias(module, bias, query, key, position_ids, offsets, shared):
    """The bias at the layer's positions, computed once per forward for every layer whose
    bias module gives the same values; None where that does not apply.

    Under ``torch.compile`` with a static cache the decoding step cannot keep tables between
    steps (:func:`_decoding_step`): every layer evaluates its bias at every slot of the
    cache. A parameter-free family (ALiBi, Sandwich) gives every layer the same values at
    the same positions; the layers share HF's ``position_ids`` and, through ``shared`` (a
    store per forward, :func:`attention_pre_hook`), their cache offsets: the first layer
    computes the values (a decoding step reads them from the kept table, :func:`_kept_row`)
    and stores them, the others read them. A family with parameters computes its own."""
    if shared is None or not bias.offset_only or any(True for _ in bias.parameters()):
        return None
    name = (type(bias), bias.extra_repr(), query.shape[2], key.shape[2])
    hit = shared.get(name)
    if hit is None or hit[0] is not position_ids or hit[1] is not offsets:
        values = _kept_row(module, bias, query, key, offsets)
        if values is None:
            values = bias.at_positions(*positions(query, key, position_ids, offsets))
        hit = shared[name] = (position_ids, offsets, values)
    return hit[2]


#: The buffer of the base model that holds a parameter-free family's values at every offset
#: from ``-(n - 1)`` to ``n - 1`` (kept by :func:`relbias.hf.apply`; read by :func:`_kept_row`).
KEPT_TABLE = "relbias_offset_table"


def _kept_row(module, bias, query, key, offsets):
    """A decoding step's bias row ``[1, heads, 1, k_len]`` read from the table that
    :func:`relbias.hf.apply` keeps for a parameter-free family (a compiled graph keeps no
    table of its own, and Sandwich's cosines at every slot cost more than the step's
    attention); None where it does not serve: more than one query, a static cache longer
    than the table, or a table no longer in the module's compute dtype or on the query's
    device (a model cast or moved after ``apply``; the values are then computed).

    On a step, key slot ``j`` is at offset ``q_offset - kv_offset - j`` in every row (a
    row's shift cancels), between ``-(k_len - 1)`` and ``k_len - 1``."""
    home = getattr(module, "_relbias_table_home", None)
    if home is None or offsets is None or query.shape[2] != 1:
        return None
    table = getattr(home, KEPT_TABLE)
    middle, k_len = (table.shape[-1] - 1) // 2, key.shape[2]
    if (
        k_len > middle + 1
        or table.dtype != home._relbias_table_dtype
        or table.dtype != compute_dtype(*bias._tensors())
        or table.device != query.device
    ):
        return None
    q_offset, kv_offset = offsets
    if isinstance(q_offset, torch.Tensor):
        q_offset = q_offset.to(query.device)
    slots = torch.arange(k_len, device=query.device)
    return table.index_select(1, middle + (q_offset - kv_offset) - slots)[None, :, None]


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
        out = _decoding_step(
            module, bias_module, query, key, value, attention_mask, scaling, kwargs
        )
        if out is not None:
            return out, None
        position_ids, offsets = kwargs.get("position_ids"), kwargs.get(_OFFSETS_KW)
        shared = kwargs.get(_SHARED_KW)
        values = _shared_bias(module, bias_module, query, key, position_ids, offsets, shared)
        if values is not None:  # HF's mask holds the causal rule and the empty slots
            bias, placed = values, {"causal": attention_mask is None}
        else:
            qpos, kpos = positions(query, key, position_ids, offsets)
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


# -- the cached decoding step ----------------------------------------------------------------
#
# A decoding step (one query per row, a cache, no gradient) computes what the core's table
# path computes for it, one block of one row (:func:`relbias.biased_attention` with
# ``q_positions``/``k_positions`` and HF's mask: the bias at the positions, ``-inf`` where
# the mask hides a key, SDPA on the grouped keys, a zero output for a row that sees no
# key), without the work that path repeats in every layer and every step. What depends on
# the forward alone (the positions, the mask's complement, whether every row sees a key)
# is computed by the first layer and read by the others (:class:`_Step`), and the bias row
# is a slice of a table of the module's values kept between steps (:func:`_step_table`):
# on a step, key slot ``j`` is at offset ``q_offset - kv_offset - j`` from the query in
# every row (a row's shift cancels), so no position is read to place the bias.

#: Counts of the decoding step's caches (for tests): ``steps`` shared states built (one
#: per forward and kind of layer), ``step_reuses`` read by the later layers; ``tables``
#: built (a module's first step, positions beyond its table, changed parameters),
#: ``table_reuses``.
STEP_STATS = {"steps": 0, "step_reuses": 0, "tables": 0, "table_reuses": 0}
#: The shared states kept (the latest forwards'; a model with sliding-window and full
#: layers uses two per forward).
STEP_STATES = 4
#: A table outgrown by the positions grows by at least this many offsets (and doubles).
TABLE_GROWTH = 64

_LOCAL = threading.local()
#: Per bias module: ``(its tensors' versions, lowest offset, highest offset, tables)``.
_TABLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clear_step_caches() -> None:
    """Drop the decoding step's kept state and tables (rebuilt on the next step).

    Not needed after an in-place update of a bias parameter (an optimiser step,
    ``load_state_dict``, ``copy_``, moving the module), which the tables follow through the
    tensors' versions and storage; only after a write that bypasses them
    (``param.data.copy_(...)``)."""
    _TABLES.clear()
    _LOCAL.steps = []


_UNREAD = object()


def _version(t):
    if t is None:
        return None
    try:
        return t._version
    except RuntimeError:  # an inference tensor has no version counter
        return None


class _Step:
    """What every layer of one decoding forward shares, for one ``(position_ids, mask,
    offsets, shape)``: FIRE's query positions ``qpos`` ``[rows, 1]`` and their highest
    ``qmax`` (read on the CPU, else None; both read by its first layer), the offset
    ``distance`` of key slot 0 (slot ``j``: ``distance - j``), ``hidden`` (True where the
    mask hides a key, 4-D; None where it hides none, read on the CPU) and ``seen``
    (``[batch, 1, 1, 1]``, False for a row that sees no key; None where every row sees
    one, read on the CPU)."""

    __slots__ = ("position_ids", "mask", "key", "qpos", "qmax", "distance", "hidden", "seen")


def _step_state(position_ids, mask, q_offset: int, kv_offset: int, batch, heads, k_len, device):
    """The forward's :class:`_Step` (built by its first layer), or None where the position
    ids do not have one position per row (the general path then raises its error)."""
    key = (q_offset, kv_offset, batch, heads, k_len, _version(position_ids), _version(mask))
    steps = getattr(_LOCAL, "steps", None)
    if steps is None:
        steps = _LOCAL.steps = []
    for step in steps:
        if step.position_ids is position_ids and step.mask is mask and step.key == key:
            STEP_STATS["step_reuses"] += 1
            return step
    rows = position_ids.shape[0] if position_ids.dim() == 2 else 0
    if position_ids.dim() != 2 or position_ids.shape[1] != 1 or rows not in (1, batch):
        return None
    on_cpu = device.type == "cpu"
    step = _Step()
    # The step holds its position ids and mask, so that no other tensor takes their ids.
    step.position_ids, step.mask, step.key = position_ids, mask, key
    step.qpos = step.qmax = _UNREAD  # FIRE's (its first layer reads them)
    step.distance = q_offset - kv_offset
    step.hidden = step.seen = None
    if mask is not None:
        check_mask(mask, batch, heads, 1, k_len)
        seen = mask
        while seen.dim() < 4:
            seen = seen.unsqueeze(0)
        if not (on_cpu and bool(seen.all())):
            step.hidden = ~seen
            any_seen = seen.any(-1, keepdim=True)
            step.seen = None if on_cpu and bool(any_seen.all()) else any_seen
    steps.append(step)
    del steps[:-STEP_STATES]
    STEP_STATS["steps"] += 1
    return step


def _tensors_version(bias):
    """What identifies the values of ``bias``'s tensors (its submodules' included): their
    storage and in-place versions; None for inference tensors, which have no version."""
    version, modules = [], [bias]
    try:
        while modules:
            module = modules.pop()
            for group in (module._parameters, module._buffers):
                for t in group.values():
                    if t is not None:
                        version.append((t.data_ptr(), t._version))
            modules.extend(module._modules.values())
    except RuntimeError:  # an inference tensor has no version counter
        return None
    return tuple(version)


def _reversed_tables(bias, low: int, high: int):
    """The tables of ``bias`` at offsets ``high, high - 1, .., low`` (last dimension).

    An offset-only family: ``(values [1, heads, 1, n],)``. FIRE:
    ``(values [1, heads, 1, n], psi [n], L)``: ``psi(|offset|)``, and the values of a query
    at a position up to the threshold ``L`` (a float), whose denominator is ``psi(L)``.
    """
    offsets = torch.arange(high, low - 1, -1, device=bias.device)
    with no_autocast(offsets.device):
        if not isinstance(bias, FIRE):
            return (bias._offset_values(offsets)[None, :, None],)
        dtype = compute_dtype(bias.c)
        psi = bias.psi(offsets.abs().to(dtype))
        threshold = bias.L.to(dtype).reshape(1)
        # max(i, L) = L for every query at i <= L: its denominator, as a row there gets it
        x = psi[None, :] / bias.denominator(threshold)[:, None]
        values = bias.mlp(x)[0].transpose(0, 1).contiguous()[None, :, None]
        return values, psi, float(threshold)


def _step_table(bias, low: int, high: int):
    """``(tables, top)``: ``tables[0][..., m]`` is the value of ``bias`` at offset
    ``top - m`` (:func:`_reversed_tables`), for every offset from ``high`` down to ``low``
    at least; kept per module between steps while its tensors are unchanged (an in-place
    update changes their version), grown when the positions outgrow it."""
    version = _tensors_version(bias)
    entry = _TABLES.get(bias) if version is not None else None
    if entry is not None and entry[0] == version:
        if entry[1] <= low and high <= entry[2]:
            STEP_STATS["table_reuses"] += 1
            return entry[3], entry[2]
        low, high = min(low, entry[1]), max(high, entry[2])
    grown = high + max(TABLE_GROWTH, high - low + 1)
    try:
        tables, high = _reversed_tables(bias, low, grown), grown
    except ValueError:  # offsets beyond those the family has (an offset bias that raises)
        tables = _reversed_tables(bias, low, high)
    STEP_STATS["tables"] += 1
    version = _tensors_version(bias)  # after: Kerple projects its parameters as it computes
    if version is not None:
        _TABLES[bias] = (version, low, high, tables)
    return tables, high


def _decoding_step(module, bias, query, key, value, attention_mask, scaling, kwargs):
    """The attention of a cached decoding step (see above), or None where this path does
    not serve the call: more than one query, no cache, gradients, autocast,
    ``torch.compile``, a static cache's offset on a device (reading it would wait)."""
    offsets = kwargs.get(_OFFSETS_KW)
    position_ids = kwargs.get("position_ids")
    if (
        offsets is None
        or query.shape[2] != 1
        or key.shape[2] == 0
        or not isinstance(position_ids, torch.Tensor)
        or not (bias.offset_only or isinstance(bias, FIRE))
        or torch.compiler.is_compiling()
        or needs_grad(query, key, value, bias)
        or autocast_enabled(query.device)
    ):
        return None
    q_offset, kv_offset = offsets
    if isinstance(q_offset, torch.Tensor):
        if q_offset.device.type != "cpu":
            return None
        q_offset = int(q_offset)
    batch, heads, _, head_dim = query.shape
    k_len = key.shape[2]
    offsets = (int(q_offset), int(kv_offset))
    step = _step_state(position_ids, attention_mask, *offsets, batch, heads, k_len, query.device)
    if step is None:
        return None
    top = step.distance  # the offset of key slot 0; slot k_len - 1 is at top - (k_len - 1)
    tables, table_top = _step_table(bias, top - (k_len - 1), top)
    start = table_top - top
    if len(tables) == 3 and step.qmax is _UNREAD:  # FIRE: read once per forward
        step.qpos = position_ids.to(device=query.device, dtype=torch.long)
        step.qmax = int(step.qpos.max()) if query.device.type == "cpu" else None
    if len(tables) == 1 or (step.qmax is not None and step.qmax <= tables[2]):
        additive = tables[0][..., start : start + k_len]  # [1, heads, 1, k_len]: every row's
    else:  # FIRE past its threshold: every row's own denominator
        x = tables[1][start : start + k_len] / bias.denominator(step.qpos)[:, :, None]
        additive = bias.mlp(x).permute(0, 3, 1, 2)  # [rows, heads, 1, k_len]
    scale = _float_scale(scaling, head_dim)
    if scale is not None:
        query = query * (check_positive_float("scale", scale) * math.sqrt(head_dim))
    if additive.dtype != query.dtype:
        additive = additive.to(query.dtype)
    if step.hidden is not None:
        additive = additive.masked_fill(step.hidden, float("-inf"))
    out = F.scaled_dot_product_attention(
        query, key, value, attn_mask=additive, enable_gqa=key.shape[1] != heads
    )
    if step.seen is not None:
        out = torch.where(step.seen, out, 0.0)
    return out.transpose(1, 2).contiguous()


def _float_scale(scaling, head_dim: int):
    """HF's ``scaling`` as the core's ``scale`` (None: 1/sqrt(d), the core's default)."""
    if scaling is None or scaling == head_dim**-0.5:
        return None
    return float(scaling)


def relbias_mask(*args, **kwargs):
    """The mask function registered as ``"relbias"``: HF's boolean SDPA mask.

    ``[batch, 1, q_len, k_len]``, True where a query may read a key (causal, padding,
    sliding window and packed sequences included). Skipped (None) only for one query that
    reads every key of a cache (:func:`_reads_every_key`): there None is the causal rule,
    which the attention applies, and the mask would hide nothing.
    """
    from transformers.masking_utils import sdpa_mask

    if _reads_every_key(*args, **kwargs):
        return None
    kwargs["allow_is_causal_skip"] = False
    kwargs.pop("allow_is_bidirectional_skip", None)
    return sdpa_mask(*args, **kwargs)


def _reads_every_key(
    batch_size=None,
    q_length=None,
    kv_length=None,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    local_size=None,
    allow_is_causal_skip=True,
    **kwargs,
) -> bool:
    """Whether the mask would be all True because its one query reads every key: HF
    allows a skip (not a packed sequence, an extra mask pattern or a static cache's
    decoding step), the plain causal rule, no window, the keys exactly the slots
    ``0 .. q_offset`` (a dynamic cache), no padding (read on the CPU only), not under
    ``torch.compile``."""
    from transformers.masking_utils import causal_mask_function

    if not (
        allow_is_causal_skip
        and q_length == 1
        and mask_function is causal_mask_function
        and local_size is None
        and isinstance(q_offset, int)
        and kv_offset == 0
        and kv_length == q_offset + 1
        and not torch.compiler.is_compiling()
    ):
        return False
    if attention_mask is None:
        return True
    return (
        isinstance(attention_mask, torch.Tensor)
        and attention_mask.device.type == "cpu"
        and attention_mask.dim() == 2
        and attention_mask.shape == (batch_size, kv_length)
        and bool(attention_mask.all())
    )
