"""Relative positions d(i, j) = i - j (query position minus key position), 0-based."""

from __future__ import annotations

import torch

from relbias._checks import check_lengths


def relative_positions(q_len, k_len=None, *, q_start=None, device=None) -> torch.Tensor:
    """Return the LongTensor ``[q_len, k_len]`` of offsets ``i - j``.

    Query row ``r`` sits at absolute position ``i = q_start + r`` and key column ``j``
    at position ``j``. By default the queries are the last ``q_len`` of ``k_len``
    positions (``q_start = k_len - q_len``), as when decoding with a key/value cache.

    >>> relative_positions(3)
    tensor([[ 0, -1, -2],
            [ 1,  0, -1],
            [ 2,  1,  0]])
    """
    q_len, k_len, q_start = check_lengths(q_len, k_len, q_start)
    i = torch.arange(q_start, q_start + q_len, device=device)
    j = torch.arange(k_len, device=device)
    return i[:, None] - j[None, :]


def take_columns(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table[:, index]`` for a 2-D ``table`` and an integer ``index`` of any shape:
    ``[table.shape[0], *index.shape]``.

    The same values and gradient as advanced indexing, through ``index_select`` (about
    50x faster on the CPU for a table of a few heads and a thousand offsets).
    """
    picked = table.index_select(1, index.reshape(-1))
    return picked.view(table.shape[0], *index.shape)
