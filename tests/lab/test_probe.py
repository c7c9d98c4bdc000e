"""The competing-keys probe: the answer only behind the far key, competitors nearer."""

import pytest
import torch

from relbias.lab.config import Config
from relbias.lab.evaluation import evaluate_retrieval
from relbias.lab.probe import (
    KEYS,
    VALUES,
    chance_among_present,
    make_competing_batch,
    make_probe_batch,
    make_recall_batch,
    max_distance,
    min_distance,
    probe_batches,
)

UPPER = set(KEYS)
DIGITS = set(VALUES)


def _batch(seed=0, batch=64, seq_len=48, distance=None, k=3):
    gen = torch.Generator().manual_seed(seed)
    if distance is None:
        high = max_distance(seq_len, k)
        distance = torch.randint(min_distance(k), high + 1, (batch,), generator=gen)
    return make_competing_batch(batch, seq_len, distance, num_competitors=k, generator=gen)


def test_layout_target_far_competitors_near():
    k, n = 3, 48
    gen = torch.Generator().manual_seed(1)
    dist = torch.randint(min_distance(k), max_distance(n, k) + 1, (200,), generator=gen)
    x, y = make_competing_batch(200, n, dist, num_competitors=k, generator=gen)
    assert x.shape == y.shape == (200, n)
    assert (y[:, :-1] == -100).all()
    nearer_counts, farther_counts = set(), set()
    for b in range(200):
        row, d = x[b].tolist(), int(dist[b])
        value_pos = n - 1 - d
        query = row[-1]
        assert row[value_pos] == y[b, -1] and row[value_pos - 1] == query
        keys_before = [i for i in range(n - 1) if row[i] in UPPER]
        digits_before = [i for i in range(n - 1) if row[i] in DIGITS]
        assert len(keys_before) == len(digits_before)
        assert all(row[i + 1] in DIGITS for i in keys_before)  # every key has its digit
        # the query key appears once before the query: the target key
        assert [i for i in keys_before if row[i] == query] == [value_pos - 1]
        nearer = [i for i in keys_before if i > value_pos]
        farther = [i for i in keys_before if i < value_pos - 1]
        assert 1 <= len(nearer) <= k and len(farther) <= k
        assert all(i + 1 < n - 1 for i in nearer)
        nearer_counts.add(len(nearer))
        farther_counts.add(len(farther))
        # no competing digit equals the answer, so copying another digit is always wrong
        assert [row[i] for i in digits_before].count(int(y[b, -1])) == 1
    # neither the pair's rank from the end nor "the farthest pair" gives the answer
    assert nearer_counts == {1, 2, 3} and farther_counts == {0, 1, 2, 3}


def test_answer_needs_the_far_key():
    x, y = _batch(seed=2)
    answers = y[:, -1]
    nearest, matched = [], []
    for row in x.tolist():
        nearest.append(next(row[i] for i in range(len(row) - 2, -1, -1) if row[i] in DIGITS))
        key_pos = row.index(row[-1])
        matched.append(row[key_pos + 1])
    assert (torch.tensor(nearest) != answers).all()  # the nearest digit: always wrong
    assert (torch.tensor(matched) == answers).all()  # the digit after the query key: right


def test_seeded_and_deterministic():
    a, b, c = _batch(seed=5), _batch(seed=5), _batch(seed=6)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[0], c[0])


def test_farthest_and_nearest_distances():
    k, n = 2, 20
    assert max_distance(n, k) == n - 2 - 2 * k
    for d in (min_distance(k), max_distance(n, k)):
        x, y = _batch(distance=d, seq_len=n, k=k, batch=8)
        assert (x[:, n - 1 - d] == y[:, -1]).all()
    assert min_distance(0) == 1 and min_distance(4) == 9


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"distance": 4, "k": 2}, "distance must lie in 5..42"),
        ({"distance": 43, "k": 2}, "distance must lie"),
        ({"distance": 5, "k": 5}, "num_competitors must be an integer in 0..4"),
        ({"distance": 5, "k": -1}, "num_competitors"),
        ({"distance": 5, "k": 2, "seq_len": 10}, "need seq_len >= 11"),
    ],
)
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        _batch(**kwargs)


def test_probe_task_dispatch_and_config():
    gen = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="probe task"):
        make_probe_batch("copy", 2, 16, 3, generator=gen)
    with pytest.raises(ValueError, match="probe_task"):
        Config(probe_task="copy")
    with pytest.raises(ValueError, match="probe_competitors"):
        Config(probe_competitors=-1)
    cfg = Config(train_len=24, probe_batch_size=16, probe_task="competing", probe_competitors=3)
    x, y = probe_batches(cfg)(gen)
    assert x.shape == (16, 24)
    value_pos = (x == y[:, -1:]).int().argmax(dim=1)  # the answer digit is unique in the row
    dist = 24 - 1 - value_pos
    assert (dist >= min_distance(3)).all() and (dist <= max_distance(24, 3)).all()


def test_evaluate_retrieval_skips_distances_that_leave_no_room():
    from relbias.lab.model import TinyLM

    cfg = Config(train_len=16, probe_task="competing", probe_competitors=2, probe_eval_samples=4)
    model = TinyLM(dim=16, depth=1, heads=2, position="alibi", train_len=16)
    rows = evaluate_retrieval(model, cfg, seq_len=32)
    assert [r["distance"] for r in rows][0] == min_distance(2)
    assert [r["distance"] for r in rows][-1] == 26  # 32 - 2 - 2 * 2
    assert all(min_distance(2) <= r["distance"] <= 26 for r in rows)


@pytest.mark.parametrize("num_pairs", [1, 4])
def test_recall_answer_sits_at_distance(num_pairs):
    dist = torch.tensor([1, 5, 17, 30])
    x, y = make_recall_batch(
        4, 32, dist, num_pairs=num_pairs, generator=torch.Generator().manual_seed(3)
    )
    assert (y[:, :-1] == -100).all()
    for row, target, d in zip(x, y[:, -1], dist.tolist()):
        pos = 31 - d
        assert int(row[pos]) == int(target) and int(target) in VALUES
        assert int(row[pos - 1]) == int(row[-1]) and int(row[-1]) in KEYS
        assert sum(int(b) in VALUES for b in row) == num_pairs
        keys = [int(b) for b in row[:-1] if int(b) in KEYS]
        assert len(keys) == len(set(keys)) == num_pairs


def test_recall_is_seeded_and_checks_distance():
    def batch(seed):
        return make_recall_batch(3, 20, 7, generator=torch.Generator().manual_seed(seed))

    assert all(torch.equal(a, b) for a, b in zip(batch(1), batch(1)))
    assert not torch.equal(batch(1)[0], batch(2)[0])
    for bad in (0, 19):
        with pytest.raises(ValueError, match="distance"):
            make_recall_batch(1, 20, bad, generator=torch.Generator())


def test_recall_distractors_are_lone_digits():
    x, y = make_recall_batch(
        8, 40, 10, num_pairs=2, num_distractors=5, generator=torch.Generator().manual_seed(0)
    )
    for row, target in zip(x, y[:, -1]):
        assert sum(int(b) in VALUES for b in row) == 2 + 5
        assert int(row[-11]) == int(target) and int(row[-12]) == int(row[-1])
        digits_after_keys = [
            i for i in range(1, 40) if int(row[i]) in VALUES and int(row[i - 1]) in KEYS
        ]
        assert len(digits_after_keys) == 2
    with pytest.raises(ValueError, match="do not fit"):
        make_recall_batch(1, 10, 3, num_pairs=2, num_distractors=6, generator=torch.Generator())
    with pytest.raises(ValueError, match="num_distractors"):
        make_recall_batch(1, 10, 3, num_distractors=-1, generator=torch.Generator())


@pytest.mark.parametrize("k", [1, 2, 3])
def test_chance_among_present_is_the_generated_sequences_mean(k):
    """Chance is the mean of 1 / (digits present) over what make_competing_batch writes."""
    x, _ = _batch(seed=k, batch=4000, seq_len=64, k=k)
    present = sum((x == v).sum(1) for v in VALUES).float()
    empirical = float((1 / present).mean())
    assert abs(chance_among_present(k) - empirical) < 0.01
    assert chance_among_present(k) < 1 / (k + 1)  # guess_among_present: the bound


def test_chance_among_present_with_one_competitor_is_five_twelfths():
    assert chance_among_present(1) == pytest.approx(5 / 12)
    assert chance_among_present(0) == 1.0  # the target's digit alone


@pytest.mark.parametrize("bad", [-1, 5, 1.0, True, "1"])
def test_chance_among_present_names_a_bad_count(bad):
    with pytest.raises(ValueError, match="num_competitors must be an integer"):
        chance_among_present(bad)
