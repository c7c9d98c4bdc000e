"""The context-use measure: the long reading against the sliding one (relbias.lab.context),
and the stored weights that let a sweep's models be read again (relbias.lab.weights)."""

from __future__ import annotations

import random

import pytest
import torch

from relbias.lab import get_config
from relbias.lab.context import context_use, sliding_loss, sliding_positions, span_loss
from relbias.lab.evaluation import default_context_stride, evaluate_lengths
from relbias.lab.experiments import run_extrapolation
from relbias.lab.training import build_model
from relbias.lab.weights import load_weights, save_weights, weights_path

VOCAB = 11


class LocalModel(torch.nn.Module):
    """Logits that depend on the current token and the ``reach - 1`` before it only (an
    n-gram model, positions ignored): it never uses context past ``reach`` tokens."""

    def __init__(self, reach: int):
        super().__init__()
        self.reach = reach
        torch.manual_seed(0)
        self.table = torch.randn(reach, VOCAB, VOCAB)

    def forward(self, ids):
        out = torch.zeros(*ids.shape, VOCAB)
        for back in range(self.reach):
            shifted = torch.roll(ids, back, dims=1)
            valid = torch.arange(ids.shape[1]) >= back
            out += self.table[back][shifted] * valid[None, :, None]
        return out


class PrefixModel(torch.nn.Module):
    """Logits from the running mean of one-hot tokens over the whole prefix: every earlier
    token counts, however far back."""

    def forward(self, ids):
        onehot = torch.nn.functional.one_hot(ids, VOCAB).double()
        counts = onehot.cumsum(1) / torch.arange(1, ids.shape[1] + 1)[None, :, None]
        return 4 * counts.float()


def _spans(num=3, length=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a text whose next token is the most frequent so far, half of the time
    x = torch.randint(0, VOCAB, (num, length + 1), generator=g)
    return x[:, :-1], x[:, 1:]


def test_sliding_positions_score_every_byte_once_with_bounded_context():
    rng = random.Random(0)
    for _ in range(200):
        window = rng.randint(1, 40)
        stride = rng.randint(1, window)
        span = rng.randint(window, 200)
        plan = sliding_positions(span, window, stride)
        scored = [p for _, first, end in plan for p in range(first, end)]
        assert scored == list(range(span))
        for start, first, end in plan:
            assert 0 <= start <= first < end <= start + window
            if first >= window:  # context of each scored byte: p - start earlier bytes
                assert all(window - stride <= p - start <= window - 1 for p in range(first, end))


def test_a_model_that_never_looks_past_the_window_reads_both_ways_alike():
    x, y = _spans()
    for reach, window, stride in ((3, 8, 4), (5, 5, 1), (1, 6, 6), (4, 10, 3)):
        model = LocalModel(reach)
        long = span_loss(model, x, y)
        sliding = sliding_loss(model, x, y, window=window, stride=stride)
        # reach - 1 earlier tokens are used; the sliding reading gives >= window - stride
        assert reach - 1 <= window - stride
        torch.testing.assert_close(long, sliding, rtol=0, atol=1e-5)  # float32 logits
        assert context_use(long, sliding, window)["difference"] == pytest.approx(0, abs=1e-6)


def test_a_model_that_uses_the_whole_prefix_reads_the_far_bytes_differently():
    x, y = _spans(length=60)
    model = PrefixModel()
    long = span_loss(model, x, y)
    sliding = sliding_loss(model, x, y, window=8, stride=2)
    torch.testing.assert_close(long[:, :8], sliding[:, :8])  # the first window is the same
    use = context_use(long, sliding, 8)
    assert abs(use["difference"]) > 1e-3
    assert use["bytes"] == 3 * 52 and len(use["difference_by_span"]) == 3
    assert use["long_bpb"] - use["sliding_bpb"] == pytest.approx(use["difference"])


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: sliding_positions(10, 12, 1), "window"),
        (lambda: sliding_positions(10, 4, 5), "stride"),
        (lambda: sliding_positions(10, 0, 1), "window"),
        (
            lambda: span_loss(PrefixModel(), torch.zeros(2, 3).long(), torch.zeros(2, 4).long()),
            "x and y",
        ),
        (lambda: context_use(torch.zeros(2, 8), torch.zeros(2, 8), 8), "shorter"),
        (lambda: context_use(torch.zeros(2, 8), torch.zeros(2, 9), 4), "same spans"),
        (lambda: span_loss(lambda ids: torch.zeros(1), *_spans()), "logits"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_a_nan_never_escapes():
    x, y = _spans()
    with pytest.raises(FloatingPointError, match="non-finite"):
        span_loss(lambda ids: torch.full((*ids.shape, VOCAB), float("nan")), x, y)


def _tiny():
    return get_config("quick").replace(
        dim=16, heads=2, depth=1, train_len=16, steps=3, eval_tokens=512, eval_factors=(1, 4)
    )


def test_every_evaluation_records_the_measure_and_its_spans():
    from relbias.lab.data import load_corpus

    cfg = _tiny()
    corpus = load_corpus(max_bytes=cfg.corpus_bytes)
    model = build_model("alibi", cfg).eval()
    rows = evaluate_lengths(model, corpus.val, cfg)
    short, longest = rows
    assert "context" not in short and longest["context"]["window"] == cfg.train_len
    ctx = longest["context"]
    assert ctx["stride"] == default_context_stride(cfg.train_len) == 2
    assert len(ctx["sliding_loss_by_position"]) == longest["length"]
    spans = cfg.eval_tokens // longest["length"]
    assert len(longest["bpb_by_span"]) == len(short["bpb_by_span"]) == spans
    # every length reads the same bytes: the spans' means average to the row's bits per byte
    for row in rows:
        assert sum(row["bpb_by_span"]) / spans == pytest.approx(row["bpb"], abs=1e-4)
    # the sliding reading of the first train_len bytes is the long reading's
    assert ctx["sliding_loss_by_position"][:16] == pytest.approx(
        longest["loss_by_position"][:16], abs=1e-3
    )
    # at the training length itself the sliding window is the window
    assert ctx["sliding_bpb"] == pytest.approx(
        sum(ctx["sliding_loss_by_position"][16:]) / (longest["length"] - 16), abs=1e-3
    )
    off = evaluate_lengths(model, corpus.val, cfg, context=False)
    assert "context" not in off[-1] and off[-1]["bpb"] == longest["bpb"]


def test_weights_of_a_sweep_read_back_to_the_same_logits(tmp_path):
    cfg = _tiny()
    results = run_extrapolation(
        cfg,
        ["t5", "learned"],
        seeds=[0, 1],
        progress=False,
        verbose=False,
        weights_dir=tmp_path / "w",
    )
    ids = torch.randint(0, 256, (2, 40))
    for method in ("t5", "learned"):
        for seed in (0, 1):
            path = weights_path(tmp_path / "w", method, seed)
            model = load_weights(path)
            assert model.lab_method == method and model.lab_config.seed == seed
            again = load_weights(path)
            assert torch.equal(model(ids), again(ids))  # 40 > train_len: learned clips
        # the stored weights are the evaluated ones: read them again, get the same numbers
        row = results["methods"][method]["seeds"]["1"]["eval"][-1]
        from relbias.lab.data import load_corpus

        corpus = load_corpus(max_bytes=cfg.corpus_bytes)
        reread = evaluate_lengths(
            load_weights(weights_path(tmp_path / "w", method, 1)), corpus.val, cfg
        )[-1]
        assert reread["bpb"] == row["bpb"] and reread["context"] == row["context"]


def test_weights_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no stored weights"):
        load_weights(tmp_path / "none.pt")
    torch.save({"state_dict": {}}, tmp_path / "other.pt")  # a plain .pt is read too
    with pytest.raises(ValueError, match="not a weights file"):
        load_weights(tmp_path / "other.pt")
    cfg = _tiny()
    path = save_weights(build_model("nope", cfg), tmp_path, method="nope", config=cfg)
    assert path == weights_path(tmp_path, "nope", cfg.seed) and path.is_file()
