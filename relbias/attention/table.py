r"""The O(n) table path: a relative bias through strided masks of the fused SDPA kernel.

For a family that depends on the offset ``i - j`` alone, the whole bias is a Toeplitz
matrix read from a table of ``q_len + k_len - 1`` values per head
(:class:`~relbias.biases.prepared.OffsetTableBias`). Reversing the order of the query
rows turns it into a Hankel matrix, which *is* a strided view of the reversed table
(strides ``(1, 1)``, no copy): PyTorch's fused attention kernel reads that view as its
mask. Causal attention runs in blocks of query rows, each against the keys it can see,
with ``-inf`` in the table for future keys; long sequences on the CPU run in tiles that
split each block's past keys from its causal triangle and join the two by their
log-sum-exp, so that no score above the diagonal is computed in vain. FIRE, which also
depends on the absolute query position, is evaluated block by block instead
(:class:`~relbias.biases.prepared.FIREBias`), so that no ``q_len x k_len`` tensor
exists at once.

Device-agnostic: every index and mask is built on the inputs' device from O(n) tables
(the tiles, which call the CPU flash kernel for its log-sum-exp, run on the CPU only).
"""

from __future__ import annotations

import math
import threading

import torch
from torch.nn import functional as F

from relbias._cache import LRUCache
from relbias._checks import check_bool, check_int, needs_grad
from relbias.biases.prepared import OffsetTableBias, PreparedBias, reversed_hankel

__all__ = [
    "STRIP_ROWS",
    "TABLE_BLOCKS",
    "TILE_GROUP_ROWS",
    "TILE_ROWS",
    "default_block_rows",
    "table_attention",
]

#: Causal :func:`table_attention` runs in about this many blocks of query rows (each
#: block skips the keys after its last query; more blocks skip more but cost more calls).
TABLE_BLOCKS = 5
#: ... and blocks have at least this many rows.
TABLE_MIN_BLOCK_ROWS = 256
#: The default of :func:`table_attention`'s ``small_attention``: up to this many scores
#: (q_len x k_len) it favours few operations over memory (on a busy CPU every parallel
#: operation waits for a free core).
SMALL_ATTENTION = 4096 * 4096
#: At most this many bias entries (heads x rows x keys) per block for FIRE.
FIRE_BLOCK_ENTRIES = 1 << 23
#: ... and per block on a GPU, whose attention kernels copy a strided mask into an aligned
#: one (measured on CUDA: one block of all rows copied the whole [heads, n, n] bias).
DEVICE_BLOCK_ENTRIES = 1 << 23
#: The defaults of :func:`table_attention`'s tiles: causal self-attention with an
#: offset-only bias (float32 on the CPU, no gradients) runs in tiles of ``TILE_ROWS`` query
#: rows (``tile_rows``; see :func:`_tiled_table_attention`) ...
TILE_ROWS = 1024
#: ... each tile's own causal triangle in strips of ``STRIP_ROWS`` rows (``strip_rows``),
#: and up to ``TILE_GROUP_ROWS`` rows at once (``group_rows``: a few copies of that many
#: rows is the extra memory).
STRIP_ROWS = 256
TILE_GROUP_ROWS = 4096

_flash_cpu = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def table_attention(
    q,
    k,
    v,
    bias: PreparedBias,
    *,
    causal=True,
    block_rows=None,
    tile_rows=TILE_ROWS,
    strip_rows=STRIP_ROWS,
    group_rows=TILE_GROUP_ROWS,
    small_attention=SMALL_ATTENTION,
    compiled=True,
):
    """Attention with ``bias`` added through a strided mask, no ``q_len x k_len`` tensor.

    ``q`` is ``[batch, heads, q_len, head_dim]``, ``bias`` a
    :class:`~relbias.biases.prepared.PreparedBias` of this shape (its ``q_start``
    places the queries); the query rows run in reversed order so that an offset-only
    bias is a zero-copy view of its table (see the module docstring). Causal attention
    runs in blocks of ``block_rows`` query rows (default: :func:`default_block_rows`),
    each against the keys it can see. Unless ``block_rows`` is given, long causal
    self-attention with an offset-only bias (float32 on the CPU, no gradients, at least
    ``tile_rows`` queries) runs in tiles of ``tile_rows`` rows instead, each tile's causal
    triangle in strips of ``strip_rows`` rows (a divisor of ``tile_rows``), ``group_rows``
    rows of tiles at a time (:func:`_tiled_table_attention`; defaults :data:`TILE_ROWS`,
    :data:`STRIP_ROWS`, :data:`TILE_GROUP_ROWS`). Up to ``small_attention`` scores
    (``q_len * k_len``, default :data:`SMALL_ATTENTION`) the blocks run as few large
    operations, beyond it one block at a time (the least memory). ``compiled``: FIRE's
    blocks may use its compiled block kernel (False: eager PyTorch). Equal to the
    materialised path within float rounding.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    bias.check_shape(heads, q_len, k_len, bias.q_start, causal, batch=batch)
    tile_rows = check_int("tile_rows", tile_rows, minimum=1)
    strip_rows = check_int("strip_rows", strip_rows, minimum=1)
    group_rows = check_int("group_rows", group_rows, minimum=1)
    small_attention = check_int("small_attention", small_attention, minimum=0)
    compiled = check_bool("compiled", compiled)
    if tile_rows % strip_rows:
        raise ValueError(f"tile_rows ({tile_rows}) must be a multiple of strip_rows ({strip_rows})")
    out, tiled = None, 0
    if block_rows is None and _tiles_apply(q, k, v, bias, causal, tile_rows):
        out = q.new_empty(batch, heads, q_len, v.shape[-1])
        tiled = _tiled_table_attention(q, k, v, bias, out, tile_rows, strip_rows, group_rows)
        block_rows = strip_rows  # the rows after the last whole tile
    if block_rows is None:
        block_rows = default_block_rows(bias, causal)
    block_rows = check_int("block_rows", block_rows, minimum=1)
    blocks = [(start, min(q_len, start + block_rows)) for start in range(tiled, q_len, block_rows)]

    def block(rows, start, stop):  # rows: the queries start..stop-1 in reversed order
        k_stop = min(k_len, bias.q_start + stop) if causal else k_len
        mask = bias.flipped_rows(start, stop, k_stop, causal, q.dtype, compiled=compiled)
        return F.scaled_dot_product_attention(
            rows, k[:, :, :k_stop], v[:, :, :k_stop], attn_mask=mask
        )

    if out is None and q_len * k_len <= small_attention:
        # Few large operations (each one a parallel region): reverse q once, join the
        # blocks once, reverse the output once.
        reversed_q = q.flip(2)
        pieces = [
            block(reversed_q[:, :, q_len - stop : q_len - start], start, stop)
            for start, stop in blocks
        ]
        joined = pieces[0] if len(pieces) == 1 else torch.cat(pieces[::-1], dim=2)
        del pieces
        return joined.flip(2)
    # Long sequences: the least memory, one block of rows at a time.
    if out is None:
        out = q.new_empty(batch, heads, q_len, v.shape[-1])
    for start, stop in blocks:
        out[:, :, start:stop] = block(q[:, :, start:stop].flip(2), start, stop).flip(2)
    return out


def default_block_rows(bias: PreparedBias, causal: bool = True) -> int:
    """The rows per block that :func:`table_attention` takes when it uses blocks."""
    if not bias.offset_only:  # a block's bias is computed (not a view): bound its memory
        per_row = (
            (bias.batch or 1) * bias.num_heads * bias.k_len
        )  # a data-dependent bias: per sequence
        return max(16, FIRE_BLOCK_ENTRIES // max(1, per_row))
    if bias.device.type != "cpu":  # the kernel copies each block's mask: bound the copy
        return max(16, DEVICE_BLOCK_ENTRIES // max(1, bias.num_heads * bias.k_len))
    if not causal:
        return bias.q_len
    return max(TABLE_MIN_BLOCK_ROWS, math.ceil(bias.q_len / TABLE_BLOCKS))


def _tiles_apply(q, k, v, bias, causal, tile_rows=TILE_ROWS) -> bool:
    """Whether :func:`_tiled_table_attention` can compute (part of) this attention."""
    return (
        causal
        and bias.offset_only
        and q.device.type == "cpu"
        and q.dtype == torch.float32
        and k.dtype == v.dtype == torch.float32
        and q.shape[-1] == v.shape[-1]
        and bias.k_len == bias.q_start + bias.q_len
        and bias.q_len >= tile_rows
        and not needs_grad(q, k, v, bias)
    )


def _tiled_table_attention(
    q, k, v, bias: OffsetTableBias, out: torch.Tensor, tile: int, strip: int, group_rows: int
) -> int:
    """Causal attention of the first ``q_len // tile`` tiles of query rows, into ``out``.

    Returns the number of rows done.

    Blocks of rows with ``-inf`` for future keys compute, and throw away, the upper
    half of every block's diagonal square. Tiles waste no more than the kernel's own
    causal shortcut: a tile meets the keys before it in one call (every one of them
    visible), and its own causal triangle in strips of ``strip`` rows; the
    triangle's bias is the same in every tile, so one call runs a strip of several
    tiles. The fused kernel returns each part's log-sum-exp, which weighs the two
    parts: ``lerp(triangle, past, sigmoid(lse_past - lse_triangle))``. Query rows run
    reversed within each tile (a Hankel mask), ``group_rows`` rows at a time, in
    buffers kept between calls.
    """
    batch, heads, q_len, dim = q.shape
    table = bias.reversed_table(True, q.dtype)  # offsets in reversed order, -inf < 0

    def by_tile(x):  # [batch, heads, tiles, ...] -> [batch * tiles, heads, ...]
        return x.transpose(1, 2).flatten(0, 1)

    def from_tiles(x, tiles):
        return x.unflatten(0, (batch, tiles)).transpose(1, 2)

    all_rows, group = q_len // tile * tile, max(1, group_rows // tile) * tile
    for start in range(0, all_rows, group):
        stop = min(all_rows, start + group)
        tiles, first_key = (stop - start) // tile, bias.q_start + start
        rows = torch.arange(stop - 1, start - 1, -1, device=q.device).view(tiles, tile).flip(0)
        reversed_q = _workspace("q", (batch, heads, stop - start, dim), q)
        torch.index_select(q, 2, rows.flatten(), out=reversed_q)
        reversed_q = reversed_q.unflatten(2, (tiles, tile))
        keys, values = (
            x[:, :, first_key : first_key + stop - start].unflatten(2, (tiles, tile))
            for x in (k, v)
        )
        group_out = _workspace("out", (batch, heads, tiles, tile, dim), q)
        lse = q.new_empty(batch, heads, tiles, tile)
        for s in range(tile // strip):  # strip s: rows s*strip .. (s+1)*strip-1 of a tile
            lo, hi, width = tile - (s + 1) * strip, tile - s * strip, (s + 1) * strip
            # the mask of the group's first tile, the same in every tile
            mask = reversed_hankel(
                table,
                q_len,
                start + s * strip,
                start + (s + 1) * strip,
                first_key + width,
                k_start=first_key,
            )
            o, log_sum = _flash_cpu(
                by_tile(reversed_q[:, :, :, lo:hi]),
                by_tile(keys[:, :, :, :width]),
                by_tile(values[:, :, :, :width]),
                0.0,
                False,
                attn_mask=mask,
            )
            group_out[:, :, :, lo:hi] = from_tiles(o, tiles)
            lse[:, :, :, lo:hi] = from_tiles(log_sum, tiles)
        for t in range(tiles):  # every key before tile t: offsets from 1 up, all visible
            past = first_key + t * tile
            if past > 0:
                mask = reversed_hankel(table, q_len, start + t * tile, start + (t + 1) * tile, past)
                o, log_sum = _flash_cpu(
                    reversed_q[:, :, t], k[:, :, :past], v[:, :, :past], 0.0, False, attn_mask=mask
                )
                group_out[:, :, t].lerp_(o, torch.sigmoid(log_sum - lse[:, :, t])[..., None])
        out.index_copy_(2, rows.flatten(), group_out.flatten(2, 3))  # rows back in order
    return all_rows


_WORKSPACE = threading.local()
#: Buffers ``_workspace`` keeps per thread (the latest shapes).
WORKSPACE_BUFFERS = 4


def _workspace(name: str, shape, like: torch.Tensor) -> torch.Tensor:
    """A buffer kept between calls of this thread, for the latest few shapes.

    Memory that the allocator has just returned to the system page-faults on first use;
    keeping the tiles' two group-sized buffers saves that on every call.
    """
    if not hasattr(_WORKSPACE, "buffers"):
        _WORKSPACE.buffers = LRUCache(WORKSPACE_BUFFERS)
    key = (name, tuple(shape), like.dtype, like.device)
    return _WORKSPACE.buffers.memo(key, lambda: like.new_empty(shape))
