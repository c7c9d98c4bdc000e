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


def check_positions(q_positions, k_positions) -> tuple[torch.Tensor, torch.Tensor]:
    """Check per-row query and key positions: integer tensors ``[rows, q_len]`` and
    ``[rows, k_len]`` on one device, whose rows agree or are 1. Returns them as int64."""
    for name, t in (("q_positions", q_positions), ("k_positions", k_positions)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool:
            raise TypeError(f"{name} must be an integer tensor, got {t.dtype}")
        if t.dim() != 2:
            raise ValueError(f"{name} must have shape [rows, len], got {tuple(t.shape)}")
    rows = (q_positions.shape[0], k_positions.shape[0])
    if rows[0] != rows[1] and 1 not in rows:
        raise ValueError(
            f"q_positions and k_positions must have the same number of rows (or 1), got "
            f"{rows[0]} and {rows[1]}"
        )
    if q_positions.device != k_positions.device:
        raise ValueError(
            f"q_positions and k_positions must be on one device, got {q_positions.device} "
            f"and {k_positions.device}"
        )
    return q_positions.long(), k_positions.long()
