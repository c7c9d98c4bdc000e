"""The recall probes: recall a digit from far back, alone or past nearer competitors.

Two tasks (:data:`TASKS`), chosen by a configuration's ``probe_task``:

``recall`` (:func:`make_recall_batch`, the ``quick`` configuration's probe)
    lowercase filler with key-value pairs (an uppercase key and a digit); the last
    position repeats a key and the target there is its digit, ``distance`` back.
``competing`` (:func:`make_competing_batch`, the ``medium`` configuration's probe)
    the far key against nearer competitors: a probe where a distance penalty matters.

The second half of this module serves a :class:`~relbias.lab.config.Config`: training
batches (:func:`probe_batches`), one batch at a distance (:func:`probe_batch`), the
distances a sequence allows, and a description of the task for result files.

The competing task in detail:

:func:`make_competing_batch` writes sequences of lowercase filler holding one *target* pair
(an uppercase key and a digit, ``...X7...``) whose digit sits exactly ``distance`` tokens
before the last position, and *competing* pairs written the same way (another uppercase
key, another digit): between 1 and ``num_competitors`` of them strictly **nearer** the
query, and 0 to ``num_competitors`` farther, so that with two or more competitors the
target's rank among the pairs says nothing. With one (the stored medium probe's), exactly
one pair sits nearer: the target is always the second pair from the end, and a rule that
ignores the keys ("the digit of the second pair from the end") is always right. The last
position repeats the target key; the target there is the target's digit.

With two or more competitors the answer is recoverable only from the far key: the target key
appears once before the query, every competing key differs from it, and every competing
digit differs from the answer, so "copy the nearest digit" or "copy a digit after an
uppercase letter" is always wrong (accuracy 0), and "copy one of the digits present" is
right 1 / (k + 1) of the time in a sequence with k competing pairs (from 1 /
(num_competitors + 1) down to 1 / (2 num_competitors + 1); the mean over the draws:
:func:`chance_among_present`). A model must match the query key to the far key (an
induction-like circuit) and then reach past nearer keys of the same kind: exactly what a
steep distance penalty makes hard, and what a bias that stops decaying (NoPE, T5's last
bucket) does not.

The quick probe of :func:`make_recall_batch` has none of this (its stored result is 100 %
for every method).
"""

from __future__ import annotations

import torch

from relbias._checks import check_positive_ints
from relbias.lab.config import PROBE_TASKS, Config

TASKS = PROBE_TASKS
FILLER = b"abcdefghijklmnopqrstuvwxyz"
KEYS = b"ABCDEFGHIJKLMNOPQRSTUVWXYZ"
VALUES = b"0123456789"


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


def chance_among_present(num_competitors: int) -> float:
    """The competing probe's chance: the recall of "copy one of the digits present".

    :func:`make_competing_batch` writes ``near`` nearer pairs, uniform in 1..k (0 when
    ``num_competitors`` k is 0), and ``far`` farther ones, uniform in 0..k; a digit picked
    at random among the ``1 + near + far`` present is the answer ``1 / (1 + near + far)``
    of the time, so chance is the mean of that over the draws: 5/12 with one competitor
    (1/2 and 1/3, each half the time). The result files' ``guess_among_present``,
    ``1 / (k + 1)``, is its bound with no farther pair.
    """
    k = _check_competitors(num_competitors)
    nears = range(1, k + 1) if k else (0,)
    draws = [1 / (1 + near + far) for near in nears for far in range(k + 1)]
    return sum(draws) / len(draws)


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
    """One batch of probe ``task``: ``"recall"`` (:func:`make_recall_batch`) or
    ``"competing"`` (:func:`make_competing_batch`)."""
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


def make_recall_batch(
    batch_size: int,
    seq_len: int,
    distance,
    *,
    num_pairs: int = 1,
    num_distractors: int = 0,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Key-value recall where the answer lies exactly ``distance`` positions back.

    Each sequence is lowercase filler with ``num_pairs`` key-value pairs written as
    an uppercase key followed by a digit (``...qwXy7bn...``); the last position holds
    one of those keys again and the target there is its digit. The target value sits
    at position ``seq_len - 1 - distance``, so the model must copy it from exactly
    ``distance`` tokens back (``1 <= distance <= seq_len - 2``). The other pairs use
    other keys, at random positions. ``num_distractors`` lone digits (not preceded by
    a key) are scattered over the filler, so that the answer cannot be found as "the
    only digit" but only as "the digit after the key". Every other target is -100.

    ``distance`` is an int or a LongTensor ``[batch_size]``. Returns ``(inputs, targets)``
    as LongTensors ``[batch_size, seq_len]``.
    """
    check_positive_ints(batch_size=batch_size, seq_len=seq_len, num_pairs=num_pairs)
    if (
        isinstance(num_distractors, bool)
        or not isinstance(num_distractors, int)
        or num_distractors < 0
    ):
        raise ValueError(f"num_distractors must be an integer >= 0, got {num_distractors!r}")
    dist = torch.as_tensor(distance, dtype=torch.long).expand(batch_size)
    if int(dist.min()) < 1 or int(dist.max()) > seq_len - 2:
        raise ValueError(f"distance must lie in 1..seq_len-2 = 1..{seq_len - 2}, got {distance}")
    if num_pairs > len(KEYS) or 2 * num_pairs + num_distractors + 1 > seq_len:
        raise ValueError(
            f"num_pairs={num_pairs} pairs and {num_distractors} distractors "
            f"do not fit in seq_len={seq_len}"
        )
    filler = torch.tensor(list(FILLER))
    x = filler[torch.randint(len(FILLER), (batch_size, seq_len), generator=generator)]
    y = torch.full((batch_size, seq_len), -100, dtype=torch.long)
    for b in range(batch_size):
        _write_pairs(x[b], int(dist[b]), num_pairs, num_distractors, generator)
        y[b, -1] = x[b, seq_len - 1 - int(dist[b])]
    return x, y


def _write_pairs(
    row: torch.Tensor, distance: int, num_pairs: int, num_distractors: int, gen: torch.Generator
) -> None:
    """Write the target pair, the other pairs, lone digits and the query key into ``row``."""
    n = row.numel()
    keys = torch.tensor(list(KEYS))[torch.randperm(len(KEYS), generator=gen)[:num_pairs]]
    values = torch.tensor(list(VALUES))[torch.randint(len(VALUES), (num_pairs,), generator=gen)]
    value_pos = n - 1 - distance
    taken = {value_pos - 1, value_pos, n - 1}
    slots, lone = [value_pos], []
    for p in torch.randperm(n - 2, generator=gen).tolist():
        pos = p + 1  # a value position in 1..n-2, its key at pos - 1
        if len(slots) < num_pairs:
            if pos not in taken and pos - 1 not in taken:
                taken.update({pos - 1, pos})
                slots.append(pos)
        elif len(lone) < num_distractors and pos not in taken:
            lone.append(pos)
        if len(slots) == num_pairs and len(lone) == num_distractors:
            break
    if len(slots) < num_pairs or len(lone) < num_distractors:
        raise ValueError(
            f"num_pairs={num_pairs} pairs and {num_distractors} distractors "
            f"do not fit in seq_len={n}"
        )
    for key, value, pos in zip(keys, values, slots):
        row[pos - 1], row[pos] = key, value
    digits = torch.tensor(list(VALUES))
    for pos in lone:
        row[pos] = digits[torch.randint(len(VALUES), (1,), generator=gen)]
    row[n - 1] = keys[0]


# --- the probe of a configuration ----------------------------------------------------------


def probe_batches(config: Config, *, max_distance: int | None = None):
    """Training batches for the recall probe: distances uniform in 1..max_distance.

    The default ``max_distance`` is the farthest that fits (:func:`probe_max_distance`);
    the ``competing`` task starts at :func:`probe_min_distance`.
    """
    if max_distance is None:
        max_distance = probe_max_distance(config, config.train_len)
    low = probe_min_distance(config)

    def batch(gen):
        dist = torch.randint(low, max_distance + 1, (config.probe_batch_size,), generator=gen)
        return probe_batch(config, config.probe_batch_size, config.train_len, dist, gen)

    return batch


def probe_min_distance(config: Config) -> int:
    """The nearest distance the configured probe task allows (1 for ``recall``;
    ``2 * probe_competitors + 1`` for ``competing``)."""
    return min_distance(config.probe_competitors) if config.probe_task == "competing" else 1


def probe_max_distance(config: Config, seq_len: int) -> int:
    """The farthest distance the configured probe allows in ``seq_len`` tokens
    (``seq_len - 2``; ``competing``: ``seq_len - 2 - 2 * probe_competitors``)."""
    if config.probe_task == "competing":
        return max_distance(seq_len, config.probe_competitors)
    return seq_len - 2


def probe_batch(config: Config, batch_size: int, seq_len: int, distance, gen):
    """One batch ``(inputs, targets)`` of the configured probe task with the answer
    ``distance`` back (an int or one per sequence), drawn with ``gen``."""
    return make_probe_batch(
        config.probe_task,
        batch_size,
        seq_len,
        distance,
        num_pairs=config.probe_num_pairs,
        num_distractors=config.probe_distractors,
        num_competitors=config.probe_competitors,
        generator=gen,
    )


def default_distances(seq_len: int) -> list[int]:
    """Distances 1, 2, 4, ... and seq_len - 2: every power of two that fits, and the farthest."""
    out, d = [], 1
    while d <= seq_len - 2:
        out.append(d)
        d *= 2
    if out[-1] != seq_len - 2:
        out.append(seq_len - 2)
    return out


def probe_description(config: Config) -> dict:
    """The configured probe task in words and numbers, for a result file."""
    if config.probe_task == "competing":
        return {
            "task": "competing: recall the far key's digit past nearer key-digit pairs",
            "num_competitors": config.probe_competitors,
            "min_distance": probe_min_distance(config),
            "chance": 0.1,
            "guess_among_present": 1 / (config.probe_competitors + 1),
        }
    return {
        "task": "key-value recall, answer copied from `distance` back",
        "num_pairs": config.probe_num_pairs,
        "num_distractors": config.probe_distractors,
        "chance": 0.1,
    }
