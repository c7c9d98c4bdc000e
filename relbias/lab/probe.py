"""A recall probe where a distance penalty matters: the far key against nearer competitors.

:func:`make_competing_batch` writes sequences of lowercase filler holding one *target* pair
(an uppercase key and a digit, ``...X7...``) whose digit sits exactly ``distance`` tokens
before the last position, and *competing* pairs written the same way (another uppercase
key, another digit): between 1 and ``num_competitors`` of them strictly **nearer** the
query, and 0 to ``num_competitors`` farther, so that the target's rank
among the pairs says nothing. The last position repeats the target key; the target there
is the target's digit.

The answer is recoverable only from the far key: the target key appears once before the
query, every competing key differs from it, and every competing digit differs from the
answer, so "copy the nearest digit" or "copy a digit after an uppercase letter" is always
wrong (accuracy 0), and "copy one of the digits present" is right 1 / (num_competitors + 1)
of the time. A model must match the query key to the far key (an induction-like circuit)
and then reach past nearer keys of the same kind: exactly what a steep distance penalty
makes hard, and what a bias that stops decaying (NoPE, T5's last bucket) does not.

The quick probe of :func:`relbias.lab.data.make_recall_batch` has none of this (its stored
result is 100 % for every method).
"""

from __future__ import annotations

import torch

from relbias._checks import check_positive_ints
from relbias.lab.data import FILLER, KEYS, VALUES

TASKS = ("recall", "competing")


def min_distance(num_competitors: int) -> int:
    """The smallest distance that leaves room for every competitor nearer the query."""
    _check_competitors(num_competitors)
    return 2 * num_competitors + 1


def max_distance(seq_len: int, num_competitors: int) -> int:
    """The farthest distance that still leaves room for ``num_competitors`` pairs farther
    than the target (so that "the farthest pair" is never a sure answer)."""
    _check_competitors(num_competitors)
    return seq_len - 2 - 2 * num_competitors


def _check_competitors(num_competitors) -> int:
    most = (len(VALUES) - 1) // 2  # up to 2k competitors and the answer: distinct digits
    if (
        isinstance(num_competitors, bool)
        or not isinstance(num_competitors, int)
        or not 0 <= num_competitors <= most
    ):
        raise ValueError(
            f"num_competitors must be an integer in 0..{most}, got {num_competitors!r}"
        )
    return num_competitors


def make_competing_batch(
    batch_size: int,
    seq_len: int,
    distance,
    *,
    num_competitors: int = 2,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recall of the far key's digit with 1..``num_competitors`` nearer competing pairs.

    ``distance`` (an int or a LongTensor ``[batch_size]``) is how far back the answer
    digit sits from the last position; it must lie in
    ``min_distance(num_competitors) .. max_distance(seq_len, num_competitors)``
    (``2k + 1 .. seq_len - 2 - 2k``: room for ``k`` pairs on either side). Returns
    ``(inputs, targets)``, LongTensors ``[batch_size, seq_len]``, every target but the last -100.
    """
    check_positive_ints(batch_size=batch_size, seq_len=seq_len)
    _check_competitors(num_competitors)
    dist = torch.as_tensor(distance, dtype=torch.long).expand(batch_size)
    lo, hi = min_distance(num_competitors), max_distance(seq_len, num_competitors)
    if lo > hi:
        raise ValueError(
            f"num_competitors={num_competitors} does not fit in seq_len={seq_len}: "
            f"need seq_len >= {4 * num_competitors + 3}"
        )
    if int(dist.min()) < lo or int(dist.max()) > hi:
        raise ValueError(
            f"distance must lie in {lo}..{hi} (2 * num_competitors + 1 .. "
            f"seq_len - 2 - 2 * num_competitors) with num_competitors={num_competitors}, "
            f"got {distance}"
        )
    filler = torch.tensor(list(FILLER))
    x = filler[torch.randint(len(FILLER), (batch_size, seq_len), generator=generator)]
    y = torch.full((batch_size, seq_len), -100, dtype=torch.long)
    for b in range(batch_size):
        y[b, -1] = _write_row(x[b], int(dist[b]), num_competitors, generator)
    return x, y


def _write_row(row: torch.Tensor, distance: int, k: int, gen: torch.Generator) -> int:
    """Write the target pair, its competitors and the query into ``row``; return the answer.

    ``1..k`` competitors (uniform) go nearer than the answer and ``0..k`` farther, so
    that neither "the farthest pair" nor "the (k+1)-th pair from the end" is a rule that
    finds the answer: only matching the key does.
    """
    n = row.numel()
    near = int(torch.randint(1, k + 1, (1,), generator=gen)) if k else 0
    far = int(torch.randint(0, k + 1, (1,), generator=gen))
    keys = torch.tensor(list(KEYS))[torch.randperm(len(KEYS), generator=gen)[: 1 + near + far]]
    values = torch.tensor(list(VALUES))[
        torch.randperm(len(VALUES), generator=gen)[: 1 + near + far]
    ]
    value_pos = n - 1 - distance
    row[value_pos - 1], row[value_pos] = keys[0], values[0]
    # Between the answer and the query: d - 1 positions for `near` pairs and filler;
    # before the target key: n - 2 - d positions for `far` pairs and filler.
    _place_pairs(row, value_pos + 1, distance - 1, keys[1 : 1 + near], values[1 : 1 + near], gen)
    _place_pairs(row, 0, n - 2 - distance, keys[1 + near :], values[1 + near :], gen)
    row[n - 1] = keys[0]
    return int(values[0])


def _place_pairs(row, start: int, length: int, keys, values, gen) -> None:
    """Write the pairs at random, non-overlapping places in ``row[start : start + length]``."""
    k = len(keys)
    if k == 0:
        return
    free = length - 2 * k
    # Items: `free` filler bytes and k pairs; choose which items are pairs.
    slots = sorted(torch.randperm(free + k, generator=gen)[:k].tolist())
    for i, slot in enumerate(slots):
        key_pos = start + slot + i
        row[key_pos], row[key_pos + 1] = keys[i], values[i]


def make_probe_batch(
    task: str,
    batch_size: int,
    seq_len: int,
    distance,
    *,
    num_pairs: int = 1,
    num_distractors: int = 0,
    num_competitors: int = 2,
    generator: torch.Generator,
):
    """One batch of probe ``task``: ``"recall"`` (:func:`~relbias.lab.data.make_recall_batch`)
    or ``"competing"`` (:func:`make_competing_batch`)."""
    from relbias.lab.data import make_recall_batch

    if task == "recall":
        return make_recall_batch(
            batch_size,
            seq_len,
            distance,
            num_pairs=num_pairs,
            num_distractors=num_distractors,
            generator=generator,
        )
    if task == "competing":
        return make_competing_batch(
            batch_size, seq_len, distance, num_competitors=num_competitors, generator=generator
        )
    raise ValueError(f"probe task must be one of {TASKS}, got {task!r}")
