"""The retrofit study's pieces: the probes through a tokenizer, the BPE tokenizer and the
base's training windows, the retrofit options on a saved checkpoint, the resumable runner
and its reader."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

pytest.importorskip("transformers")

from relbias.hf import retrofit_study  # noqa: E402
from relbias.hf.pretrain import (  # noqa: E402
    MixedWindows,
    base_config,
    copy_span,
    encode_text,
    token_bytes,
    train_tokenizer,
)
from relbias.hf.recall import (  # noqa: E402
    ProbeVocabulary,
    probe_accuracy,
    probe_batch,
    repeat_loss,
    training_sequence,
)
from relbias.hf.retrofit import OPTIONS, fine_tune, load_option, params_added  # noqa: E402
from relbias.hf.retrofit_results import (  # noqa: E402
    CAUSE_TESTS,
    accuracy_by_distance,
    cause_tests,
    context_comparisons,
    context_use_verdict,
    copy_gains,
    load_runs,
    option_rows,
    range_of,
    recall_within,
    recovery_steps,
    seed_bases,
    span_means,
)

FILLER_CHARS = "abcdefghijklmnopqrstuvwxyz ."


def char_encode(s: str) -> list[int]:
    return [ord(c) for c in s]


def char_filler(n: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    pick = torch.randint(len(FILLER_CHARS), (n,), generator=g)
    return torch.tensor([ord(FILLER_CHARS[i]) for i in pick])


def text_of(ids) -> str:
    return "".join(chr(int(i)) for i in ids)


@pytest.fixture(scope="module")
def vocab():
    return ProbeVocabulary(char_encode, keys=40)


# --- the probes --------------------------------------------------------------------------


@pytest.mark.parametrize("query", ["question", "repeat"])
@pytest.mark.parametrize("task", ["recall", "latest"])
@pytest.mark.parametrize("seed", range(4))
def test_probe_batch_puts_the_answer_distance_back(query, task, seed):
    """The question form (`` QX?``) and the repeated statement prefix (`` QX=``, the copy an
    induction head makes) put the newest statement's digit ``distance`` back."""
    vocab = ProbeVocabulary(char_encode, keys=40, query=query)
    assert (vocab.queries == vocab.statements) == (query == "repeat")
    g = torch.Generator().manual_seed(seed)
    distance = int(torch.randint(5, 200, (1,), generator=g))
    x, answers = probe_batch(
        vocab, char_filler(5000, seed), count=6, distance=distance, task=task, generator=g
    )
    for row, answer in zip(x, answers):
        text = text_of(row)
        asked = re.search(r" ([A-Z]{2})[?=]$", text)
        assert asked, text[-10:]
        key = asked.group(1)
        sets = [(m.start(2), int(m.group(2))) for m in re.finditer(rf" ({key})=(\d)", text)]
        # the newest statement of the asked key: its digit exactly `distance` back, the answer
        newest_at, newest = max(sets)
        assert newest_at == len(text) - 1 - distance
        assert newest == int(answer)
        assert len(sets) == (2 if task == "latest" else 1)
        if task == "latest":
            older_at, older = min(sets)
            assert older != newest and older_at == newest_at - max(
                vocab.statement_len, distance // 4
            )
        # every other statement is another key with another digit
        for m in re.finditer(r" ([A-Z]{2})=(\d)", text):
            if m.group(1) != key:
                assert int(m.group(2)) != newest


@pytest.mark.parametrize("seed", range(6))
def test_training_sequence_answers_every_query_with_the_latest_digit(vocab, seed):
    g = torch.Generator().manual_seed(seed)
    row = training_sequence(vocab, char_filler(256, seed), items=6, generator=g)
    text = text_of(row)
    queries = list(re.finditer(r" ([A-Z]{2})\?(\d)", text))
    assert queries, "no item fitted"
    for q in queries:
        before = [int(m.group(1)) for m in re.finditer(rf" {q.group(1)}=(\d)", text[: q.start()])]
        assert before, f"query {q.group(0)!r} has no statement before it"
        assert int(q.group(2)) == before[-1]


@pytest.mark.parametrize("seed", range(4))
def test_training_sequences_of_recall_items_only_set_each_key_once(vocab, seed):
    """tasks=("recall",): every query has exactly one statement of its key before it; the
    default draws the same rows as both tasks named."""
    g = torch.Generator().manual_seed(seed)
    row = training_sequence(vocab, char_filler(256, seed), items=6, generator=g, tasks=["recall"])
    text = text_of(row)
    queries = list(re.finditer(r" ([A-Z]{2})\?(\d)", text))
    assert queries, "no item fitted"
    for q in queries:
        before = re.findall(rf" {q.group(1)}=(\d)", text[: q.start()])
        assert before == [q.group(2)]
    both = [
        training_sequence(
            vocab,
            char_filler(256, seed),
            items=6,
            generator=torch.Generator().manual_seed(seed),
            **kw,
        )
        for kw in ({}, {"tasks": ("recall", "latest")})
    ]
    assert torch.equal(*both)
    with pytest.raises(ValueError, match="tasks"):
        training_sequence(vocab, char_filler(256, seed), items=2, generator=g, tasks=["nearest"])
    with pytest.raises(ValueError, match="tasks"):
        MixedWindows(char_filler(512, seed), vocab, count=4, seq_len=128, seed=0, tasks=())


@pytest.mark.parametrize("seed", range(3))
def test_a_training_sequence_with_repeated_queries_keeps_one_digit_per_key(seed):
    vocab = ProbeVocabulary(char_encode, keys=40, query="repeat")
    g = torch.Generator().manual_seed(seed)
    row = training_sequence(vocab, char_filler(256, seed), items=6, generator=g)
    text = text_of(row)
    for key in {m.group(1) for m in re.finditer(r" ([A-Z]{2})=\d", text)}:
        digits = re.findall(rf" {key}=(\d)", text)  # one item per key: its statements agree
        assert len(set(digits)) <= 2 and (len(digits) == 1 or digits[-1] == digits[-2])


def test_probe_vocabulary_refuses_digits_of_several_tokens():
    with pytest.raises(ValueError, match="every digit to be one token"):
        ProbeVocabulary(lambda s: [1, 2] if s.isdigit() else [3])
    with pytest.raises(TypeError, match="encode must be a callable"):
        ProbeVocabulary("not callable")
    with pytest.raises(ValueError, match="query must be one of"):
        ProbeVocabulary(char_encode, query="ask")


def test_probe_batch_checks_its_arguments(vocab):
    g = torch.Generator().manual_seed(0)
    with pytest.raises(ValueError, match="task"):
        probe_batch(vocab, char_filler(500), count=2, distance=20, task="nearest", generator=g)
    with pytest.raises(ValueError, match="distance"):
        probe_batch(vocab, char_filler(500), count=2, distance=1, generator=g)
    with pytest.raises(ValueError, match="filler"):
        probe_batch(vocab, char_filler(30), count=2, distance=40, generator=g)


def oracle(ids: torch.Tensor) -> torch.Tensor:
    """A 'model' that reads the newest statement of the asked key: logits [batch, n, 128]."""
    out = torch.zeros(ids.shape[0], ids.shape[1], 128)
    for b, row in enumerate(ids):
        text = text_of(row)
        key = re.search(r" ([A-Z]{2})\?$", text).group(1)
        digit = re.findall(rf" {key}=(\d)", text)[-1]
        out[b, -1, ord(digit)] = 1.0
    return out


def test_probe_accuracy_of_an_oracle_and_of_a_constant_model(vocab):
    filler = char_filler(4000)
    rows = probe_accuracy(oracle, vocab, filler, [10, 300], task="latest", samples=20)
    assert [r["accuracy"] for r in rows] == [1.0, 1.0]
    assert [r["distance"] for r in rows] == [10, 300]

    def constant(ids):
        out = torch.zeros(ids.shape[0], ids.shape[1], 128)
        out[..., ord("3")] = 1.0
        return out

    rows = probe_accuracy(constant, vocab, filler, [50], samples=200, seed=1)
    assert 0.03 < rows[0]["accuracy"] < 0.2  # the share of answers that are 3


def test_repeat_loss_tells_a_copying_model_from_one_that_does_not_copy():
    filler = char_filler(4000)
    span = 24

    def copier(ids):  # each token predicts the one that followed it a span earlier
        out = torch.zeros(ids.shape[0], ids.shape[1], 128)
        out[:, span - 1 :].scatter_(-1, ids[:, : ids.shape[1] - span + 1, None], 30.0)
        return out

    def uniform(ids):
        return torch.zeros(ids.shape[0], ids.shape[1], 128)

    got = repeat_loss(copier, filler, span=span, count=5)
    assert got["second"] < 1e-6 and got["first"] == pytest.approx(math.log(128))
    assert len(got["second_by_sequence"]) == 5 and (got["span"], got["count"]) == (span, 5)
    flat = repeat_loss(uniform, filler, span=span, count=5)
    assert flat["first"] == pytest.approx(flat["second"]) == pytest.approx(math.log(128))
    with pytest.raises(ValueError, match="span"):
        repeat_loss(uniform, filler, span=1)
    with pytest.raises(ValueError, match="filler"):
        repeat_loss(uniform, char_filler(10), span=span)


# --- the tokenizer and the base's windows ------------------------------------------------

TEXT = "def add(a, b):\n    return a + b\n\n# caf\u00e9 \u2014 notes\n" * 200


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(TEXT, vocab_size=300)


def test_tokenizer_round_trip_and_token_bytes(tokenizer, tmp_path):
    ids = encode_text(tokenizer, TEXT.encode())
    assert tokenizer.decode(ids.tolist()) == TEXT
    assert ids.numel() < len(TEXT.encode()) / 2  # merges learned
    sizes = token_bytes(tokenizer)
    assert int(sizes[ids].sum()) == len(TEXT.encode())
    tokenizer.save_pretrained(tmp_path)
    from transformers import AutoTokenizer

    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again.encode(TEXT, add_special_tokens=False) == ids.tolist()


def test_train_tokenizer_checks_its_arguments():
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(TEXT, vocab_size=100)
    with pytest.raises(ValueError, match="text"):
        train_tokenizer("", vocab_size=300)


def test_mixed_windows_are_reproducible_and_carry_items(vocab):
    ids = char_filler(3000)
    a = MixedWindows(ids, vocab, count=8, seq_len=128, seed=3, probe_share=0.5)
    b = MixedWindows(ids, vocab, count=8, seq_len=128, seed=3, probe_share=0.5)
    for i in range(8):
        assert torch.equal(a[i]["input_ids"], b[i]["input_ids"])
        has_items = "?" in text_of(a[i]["input_ids"])
        assert has_items == (i % 2 == 0)
    with pytest.raises(ValueError, match="probe_share"):
        MixedWindows(ids, vocab, count=8, seq_len=128, seed=3, probe_share=2)


def test_copy_windows_write_a_span_again_and_keep_the_probe_windows(vocab):
    ids = char_filler(3000)
    plain = MixedWindows(ids, vocab, count=8, seq_len=128, seed=3, probe_share=0.25)
    mixed = MixedWindows(
        ids, vocab, count=8, seq_len=128, seed=3, probe_share=0.25, copy_share=0.25
    )
    for i in range(8):
        x, y = mixed[i]["input_ids"], plain[i]["input_ids"]
        if i % 4 == 2:  # a quarter: windows 2 and 6, none of them a probe window
            assert not torch.equal(x, y) and "?" not in text_of(x)
        else:
            assert torch.equal(x, y)
    with pytest.raises(ValueError, match="copy_share"):
        MixedWindows(ids, vocab, count=8, seq_len=128, seed=3, copy_share=-0.1)


def test_copy_span_writes_an_earlier_span_again_at_varying_distances():
    x = torch.arange(128)  # every token distinct: a copy shows where it came from
    distances, lengths = set(), set()
    for seed in range(200):
        out, source, dest, length = copy_span(x, torch.Generator().manual_seed(seed))
        assert 4 <= length <= 64 and source + length <= dest and dest + length <= 128
        assert torch.equal(out[dest : dest + length], x[source : source + length])
        kept = torch.ones(128, dtype=torch.bool)
        kept[dest : dest + length] = False
        assert torch.equal(out[kept], x[kept]) and torch.equal(x, torch.arange(128))
        distances.add(dest - source)
        lengths.add(length)
    assert len(distances) > 50 and len(lengths) > 30  # no fixed distance to learn by position
    with pytest.raises(ValueError, match="8 tokens"):
        copy_span(torch.arange(6), torch.Generator())


# --- the options on a saved checkpoint ---------------------------------------------------


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    config = base_config(vocab_size=128, train_len=64)
    config.hidden_size, config.intermediate_size = 32, 64
    config.num_hidden_layers, config.num_attention_heads, config.num_key_value_heads = 2, 4, 2
    config.head_dim = 8
    path = tmp_path_factory.mktemp("base")
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("option", list(OPTIONS))
def test_each_option_loads_as_specified(base_dir, option):
    from transformers import AutoModelForCausalLM

    import relbias.hf as rh

    spec = OPTIONS[option]
    model = load_option(base_dir, option, factor=4.0)
    base = AutoModelForCausalLM.from_pretrained(base_dir)
    rotary = model.model.rotary_emb
    assert rotary.rope_type == (spec["rope_type"] or "default")
    if spec["rope_type"] in ("linear", "yarn"):
        assert torch.allclose(rotary.inv_freq[-1], base.model.rotary_emb.inv_freq[-1] / 4)
    ids = torch.randint(128, (1, 40))
    if spec["family"] is None:
        assert model.config._attn_implementation == "sdpa" and params_added(model, base) == 0
    else:
        assert model.config.relbias["family"] == spec["family"]
        assert model.config.relbias["keep_rope"] == spec.get("keep_rope", False)
        added = sum(p.numel() for b in rh.biases(model) for p in b.parameters())
        assert params_added(model, base) == added
    logits = model(input_ids=ids).logits
    assert torch.isfinite(logits).all()
    if option == "control":
        assert torch.equal(logits, base(input_ids=ids).logits)


def test_dynamic_ntk_reads_m_l_with_its_original_base_after_a_reset(base_dir):
    """HF keeps the base grown for the longest input until one *shorter* than m_l comes; a
    reading resets it (relbias.hf.retrofit.reset_dynamic_rope)."""
    from relbias.hf.retrofit import reset_dynamic_rope

    model = load_option(base_dir, "dynamic_ntk")
    rotary = model.model.rotary_emb
    original = rotary.inv_freq.clone()
    with torch.no_grad():
        model(input_ids=torch.randint(128, (1, 256)))
        grown = rotary.inv_freq.clone()
        model(input_ids=torch.randint(128, (1, 64)))  # exactly m_l: HF keeps the grown base
    assert not torch.equal(grown, original) and torch.equal(rotary.inv_freq, grown)
    reset_dynamic_rope(model)
    assert torch.equal(rotary.inv_freq, original)
    ids = torch.randint(128, (1, 64))
    fresh = load_option(base_dir, "dynamic_ntk")
    assert torch.equal(model(input_ids=ids).logits, fresh(input_ids=ids).logits)


def test_every_reading_of_dynamic_ntk_reads_each_input_at_its_own_length(base_dir):
    """The readers (eval_by_length's sliding windows, the probes) reset HF's dynamic base
    before every input: an m_l-token window read after a long one reads as a fresh model."""
    from relbias.hf.evaluation import _forward_of

    model = load_option(base_dir, "dynamic_ntk").eval()
    forward = _forward_of(model)
    ids = torch.randint(128, (1, 64))  # exactly m_l tokens
    with torch.no_grad():
        forward(torch.randint(128, (1, 256)))
        after_long = forward(ids)
        fresh = load_option(base_dir, "dynamic_ntk").eval()(input_ids=ids).logits
    assert torch.equal(after_long, fresh)


@pytest.mark.parametrize("option", ["control", "linear", "dynamic_ntk", "yarn", "yarn+alibi"])
def test_rotation_rates_are_what_the_loaded_model_turns_by(base_dir, option):
    """rotation_rates reads HF's own numbers: the rotary embedding's inv_freq and cos/sin
    factor, for dynamic NTK after a forward of 4 m_l tokens (its base grown)."""
    from relbias.hf.retrofit import rotation_rates

    model = load_option(base_dir, option, factor=4.0)
    config, rotary = model.config, model.model.rotary_emb
    m_l, d = config.max_position_embeddings, config.head_dim
    rates, scale = rotation_rates(config)
    assert rates.dtype == torch.float64 and rates.shape == (d // 2,)
    assert torch.allclose(rates.float(), rotary.inv_freq) and scale == rotary.attention_scaling
    plain = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    if option == "control":
        assert torch.allclose(rates, plain) and scale == 1.0
    if option == "linear":
        assert torch.allclose(rates, plain / 4)
    if option.startswith("yarn"):  # the fastest pair kept, the slowest slowed by the factor
        assert torch.isclose(rates[0], plain[0]) and torch.isclose(
            plain[-1] / rates[-1], torch.tensor(4.0, dtype=torch.float64)
        )
        assert scale == pytest.approx(0.1 * math.log(4) + 1)
    if option == "dynamic_ntk":
        assert torch.allclose(rates, plain)  # at m_l: the trained base
        with torch.no_grad():
            model(input_ids=torch.randint(128, (1, 4 * m_l)))
        grown, _ = rotation_rates(config, length=4 * m_l)
        assert torch.allclose(grown.float(), rotary.inv_freq)
        assert float(plain[-1] / grown[-1]) == pytest.approx(4 * 4 - 3, rel=1e-4)  # s m/m_l - (s-1)


def test_rotation_rates_check_their_arguments(base_dir):
    from relbias.hf.retrofit import rotation_rates

    config = load_option(base_dir, "linear").config
    with pytest.raises(ValueError, match="length"):
        rotation_rates(config, length=0)
    config.rope_parameters["rope_type"] = "longrope"
    with pytest.raises(ValueError, match="rope_type"):
        rotation_rates(config)


def test_load_option_checks_its_arguments(base_dir):
    with pytest.raises(ValueError, match="option"):
        load_option(base_dir, "xpos")
    with pytest.raises(ValueError, match="factor"):
        load_option(base_dir, "linear", factor=1.0)


def test_fine_tune_records_the_recovery_curve(base_dir, vocab, tmp_path):
    model = load_option(base_dir, "alibi")
    ids = torch.randint(128, (2000,))
    windows = MixedWindows(ids, vocab, count=12, seq_len=32, seed=0, probe_share=0)
    held_out = torch.randint(128, (4, 17))
    sizes = torch.ones(128, dtype=torch.long)
    out = fine_tune(
        model,
        windows,
        tmp_path,
        steps=6,
        batch_size=2,
        lr=1e-3,
        seed=0,
        held_out=held_out,
        sizes=sizes,
        every=3,
    )
    assert [p["step"] for p in out["recovery"]] == [0, 3, 6]
    assert all(p["bpb"] > 0 for p in out["recovery"])
    assert recovery_steps({"fine_tune": out}, base_bpb=1e9) == 0
    assert recovery_steps({"fine_tune": out}, base_bpb=0.0) is None
    # below the base from step 6 on, above it before: recovers at 6
    curve = {
        "fine_tune": {
            "recovery": [{"step": k, "bpb": b} for k, b in ((0, 2.0), (3, 1.6), (6, 1.5), (9, 1.4))]
        }
    }
    assert recovery_steps(curve, base_bpb=1.5) == 6


# --- the runner and its reader -----------------------------------------------------------

TINY = [
    "vocab_size=300",
    "train_len=16",
    "base_steps=3",
    "base_batch=2",
    "fine_tune_len=32",
    "fine_tune_steps=2",
    "fine_tune_batch=2",
    "recovery_every=1",
    "recovery_windows=4",
    "spans=2",
    "context_stride=8",
    "probe_samples=3",
    "probe_keys=8",
]


def test_runner_is_resumable_and_its_reader_reads_it(tmp_path, monkeypatch):
    monkeypatch.setitem(retrofit_study.STUDY, "lengths", [16, 32, 64])
    monkeypatch.setitem(retrofit_study.STUDY, "recall_distances", [8, 40])
    monkeypatch.setitem(retrofit_study.STUDY, "latest_distances", [8, 40])
    folder = str(tmp_path)
    args = ["--folder", folder, "--seeds", "0", "1", "--set", *TINY]
    assert retrofit_study.main(["base", *args]) == 0
    assert retrofit_study.main(["retrofit", "--options", "control", "alibi", *args]) == 0
    first = (tmp_path / "runs" / "alibi_seed1.json").stat().st_mtime_ns
    assert retrofit_study.main(["retrofit", "--options", "alibi", *args]) == 0
    assert (tmp_path / "runs" / "alibi_seed1.json").stat().st_mtime_ns == first
    assert (tmp_path / "base_seed0" / "tokenizer.json").exists()
    runs = load_runs(tmp_path)
    assert sorted(runs) == [
        ("alibi", 0),
        ("alibi", 1),
        ("base", 0),
        ("base", 1),
        ("control", 0),
        ("control", 1),
    ]
    rows = option_rows(runs)
    assert [(r["option"], r["stage"]) for r in rows] == [
        ("control", "zero_shot"),
        ("control", "fine_tuned"),
        ("alibi", "zero_shot"),
        ("alibi", "fine_tuned"),
    ]
    control_zero = rows[0]
    assert control_zero["near_cost"]["mean"] == 0  # the control's zero shot is the base
    for row in rows:
        assert set(row["bits"]) == {16, 32, 64}
        assert row["near_cost"]["answer"] in (
            "lower",
            "higher",
            "at the edge",
            "cannot be told apart",
        )
        assert row["far_recall"]["distances"] == [40]
        # the probe ranges: 8 back within m_l (16), 40 past the fine-tune's length (32)
        assert set(row["probe"]["recall"]) == {"within", "past_fine_tune"}
        assert row["probe"]["latest"]["past_fine_tune"]["distances"] == [40]
        for reading in (r for task in row["probe"].values() for r in task.values()):
            assert len(reading["accuracy"]) == 2 and reading["vs_chance"]["answer"]
        if row["option"] == "control":
            assert all(
                r["vs_control"]["mean"] == 0 for t in row["probe"].values() for r in t.values()
            )
    by = accuracy_by_distance(runs, "alibi", "fine_tuned", "recall")
    assert list(by) == [8, 40] and all(len(a) == 2 for a in by.values())  # a value per seed
    alibi = next(r for r in rows if (r["option"], r["stage"]) == ("alibi", "fine_tuned"))
    assert (
        alibi["probe"]["recall"]["past_fine_tune"]["accuracy"] == by[40]
    )  # the range's one distance


def test_runner_refuses_an_unknown_setting(tmp_path):
    with pytest.raises(SystemExit):
        retrofit_study.main(["base", "--folder", str(tmp_path), "--set", "steps=3"])


def test_context_use_error_is_taken_over_spans_not_windows():
    # two spans of two windows each: the error is that of the two span means
    assert span_means([1.0, 3.0, 5.0, 7.0], 2) == [2.0, 6.0]
    with pytest.raises(ValueError):
        span_means([1.0, 2.0, 3.0], 2)
    uses = [
        {"difference": 4.0 + k, "difference_by_span": [1.0 + k, 3.0 + k, 5.0 + k, 7.0 + k]}
        for k in (0.0, 0.1, 0.2)
    ]
    got = context_use_verdict(uses, 2)
    assert got["error"] == pytest.approx(2.0)  # stdev of (2.1, 6.1) over sqrt(2)


def _base_record(study, seed=0, accuracies=(0.5, 0.25, 0.0)):
    recall = [
        {"distance": d, "accuracy": a, "samples": 8}
        for d, a in zip((4, 12, study["train_len"] + 4), accuracies)
    ]
    by_length = {"by_length": [{"length": study["train_len"], "bits": 1.5}]}
    return {"seed": seed, "study": study, "reading": {"recall": recall, "by_length": by_length}}


def test_recall_within_counts_the_answers_inside_the_training_length():
    study = {"train_len": 16}
    assert recall_within(_base_record(study)) == (6, 16)  # 4 + 2 right of 8 + 8; 20 is past m_l


def test_cause_tests_name_what_each_changed_and_refuse_a_test_that_changed_nothing(tmp_path):
    study = {"train_len": 16, "probe_share": 0.25, "probe_keys": 64}  # no probe_query: stored
    changes = [
        {"probe_query": "repeat"},
        {"probe_share": 1.0},
        {"probe_keys": 8},
        {"base_steps": 9},
        {"copy_share": 0.25},
        {"copy_share": 0.25, "probe_query": "repeat"},
        {"copy_share": 1.0},
    ]
    for folder, change in zip(CAUSE_TESTS, changes, strict=True):
        record = _base_record({**study, **change})
        (tmp_path / folder / "runs").mkdir(parents=True)
        (tmp_path / folder / "runs" / "base_seed0.json").write_text(json.dumps(record))
    tests = cause_tests(study, tmp_path)
    assert [t["folder"] for t in tests] == list(CAUSE_TESTS)
    assert tests[0]["changed"] == {"probe_query": ("question", "repeat")}
    assert tests[1]["changed"] == {"probe_share": (0.25, 1.0)}
    assert tests[3]["changed"] == {"base_steps": (None, 9)}
    assert tests[4]["changed"] == {"copy_share": (0.0, 0.25)}  # absent from the stored study
    assert tests[5]["changed"] == {"copy_share": (0.0, 0.25), "probe_query": ("question", "repeat")}
    assert (tests[2]["got"], tests[2]["asked"], tests[2]["bpb"]) == (6, 16, 1.5)
    same = tmp_path / CAUSE_TESTS[1] / "runs" / "base_seed0.json"
    same.write_text(json.dumps(_base_record(study)))
    with pytest.raises(ValueError, match="retrofit_probe_share"):
        cause_tests(study, tmp_path)


def test_copy_gains_read_each_span_and_refuse_a_run_without_the_reading():
    record = _base_record({"train_len": 16})
    record["repeat"] = [
        {"span": 8, "first": 3.0, "second": 1.0},
        {"span": 64, "first": 2.5, "second": 2.75},
    ]
    assert copy_gains(record) == {8: 2.0, 64: -0.25}  # a worse second copy stays negative
    del record["repeat"]
    with pytest.raises(ValueError, match="repeat_loss"):
        copy_gains(record)


def test_seed_bases_reads_every_seed_in_order_and_refuses_mixed_settings(tmp_path):
    study = {"train_len": 16, "copy_share": 1.0}
    runs = tmp_path / "t" / "runs"
    runs.mkdir(parents=True)
    for seed, acc in ((2, (0.0, 0.0, 0.0)), (0, (1.0, 1.0, 0.0)), (1, (0.5, 0.25, 0.0))):
        record = _base_record(study, seed=seed, accuracies=acc)
        record["repeat"] = [{"span": 8, "first": 3.0, "second": 3.0 - seed}]
        (runs / f"base_seed{seed}.json").write_text(json.dumps(record))
    bases = seed_bases("t", tmp_path)
    assert [(b["seed"], b["got"], b["asked"]) for b in bases] == [
        (0, 16, 16),
        (1, 6, 16),
        (2, 0, 16),
    ]
    assert [b["gains"] for b in bases] == [{8: 0.0}, {8: 1.0}, {8: 2.0}]
    other = _base_record({**study, "base_steps": 9}, seed=3)
    other["repeat"] = []
    (runs / "base_seed3.json").write_text(json.dumps(other))
    with pytest.raises(ValueError, match="different settings"):
        seed_bases("t", tmp_path)
    with pytest.raises(ValueError, match="no base_seed"):
        seed_bases("empty", tmp_path)


def test_the_stored_copy_tests_hold_three_seeds_each_with_its_reading():
    """The stored tests repeated over seeds: every window a copy window at 3,000, 6,000 and
    9,000 steps, and at 6,000 with the query as a repeat, with probe items in every window and
    with recall items only (``relbias/hf/results/README.md``)."""
    tests = (
        ("retrofit_copy_all", None),
        ("retrofit_copy_all_6k", 6000),
        ("retrofit_copy_all_9k", 9000),
        ("retrofit_copy_repeat_6k", 6000),
        ("retrofit_copy_probe_6k", 6000),
        ("retrofit_copy_recall_6k", 6000),
    )
    for folder, steps in tests:
        bases = seed_bases(folder)
        assert [b["seed"] for b in bases] == [0, 1, 2]
        assert all(b["record"]["study"]["copy_share"] == 1.0 for b in bases)
        assert all(b["record"]["study"]["base_steps"] == (steps or 3000) for b in bases)
        assert all(sorted(b["gains"]) == [8, 16, 64] for b in bases)
        assert all("+dirty" not in b["record"]["provenance"]["commit"] for b in bases)


def test_the_stored_recall_study_holds_every_option_on_three_bases_that_recall():
    """``retrofit_recall/``: the study rerun on bases pretrained with every window a copy
    window for 6,000 steps, the seeds whose base learned the probe within m_l (0, 1 and 3;
    seed 2 did not: ``retrofit_copy_all_6k/``), every option on each, from a clean commit."""
    folder = retrofit_study.FOLDER.parent / "retrofit_recall"
    runs = load_runs(folder)
    seeds = sorted(s for o, s in runs if o == "base")
    assert seeds == [0, 1, 3]
    assert {o for o, _ in runs} == {"base", *OPTIONS}
    assert all(sorted(s for o, s in runs if o == option) == seeds for option in OPTIONS)
    for (option, seed), record in runs.items():
        study = retrofit_study.settled(record["study"])
        assert (study["copy_share"], study["base_steps"], study["train_tasks"]) == (
            1.0,
            6000,
            "recall,latest",
        ), (option, seed)
        assert "+dirty" not in record["provenance"]["commit"], (option, seed)
    for seed in seeds:
        right, asked = recall_within(runs[("base", seed)])
        assert right > asked / 2, (seed, right, asked)  # learned: more than half right
        assert (folder / f"base_seed{seed}" / "model.safetensors").exists()
    seed2 = seed_bases("retrofit_copy_all_6k")[2]  # the same settings: seed 2 did not learn
    assert seed2["seed"] == 2 and seed2["got"] < seed2["asked"] / 2


def test_the_stored_context_comparisons_cover_every_option_stage_and_length():
    runs = load_runs()
    options = {o for o, _ in runs if o != "base"}
    got = context_comparisons(runs)
    assert got["compared"] == len(options) * 2 * 3
    m_l = runs[("base", 0)]["study"]["train_len"]
    for option, stage, n in got["lower"]:
        assert (
            option in options
            and stage in ("zero_shot", "fine_tuned")
            and n in (2 * m_l, 4 * m_l, 8 * m_l)
        )


def test_copies_kept_counts_the_copied_tokens_the_probe_items_leave(vocab):
    """Without probe items every copied token stays a copy; with items in every window some
    are overwritten, and more than with items in a quarter of them (the same windows)."""
    ids = char_filler(4096, seed=5)
    kept = {
        share: MixedWindows(
            ids, vocab, count=64, seq_len=128, seed=1, probe_share=share, copy_share=1.0
        ).copies_kept()
        for share in (0.0, 0.25, 1.0)
    }
    assert kept[0.0] == 1.0 and kept[1.0] < kept[0.25] < 1.0
    windows = MixedWindows(ids, vocab, count=8, seq_len=128, seed=1, copy_share=1.0)
    with pytest.raises(ValueError, match="copy window"):
        MixedWindows(ids, vocab, count=8, seq_len=128, seed=1).copies_kept()
    with pytest.raises(ValueError, match="windows"):
        windows.copies_kept(0)


def test_range_of_cuts_the_distances_at_m_l_and_the_fine_tune_length():
    study = {"train_len": 128, "fine_tune_len": 512}
    got = {d: range_of(d, study) for d in (16, 127, 128, 256, 512, 513, 1920)}
    assert got == {
        16: "within",
        127: "within",
        128: "to_fine_tune",
        256: "to_fine_tune",
        512: "to_fine_tune",
        513: "past_fine_tune",
        1920: "past_fine_tune",
    }


def test_a_training_window_holds_items_out_to_max_distance_and_no_farther(vocab):
    """``max_distance(n)``: the farthest answer a window of ``n`` tokens takes (a statement
    and the query after it fit); a window whose farthest is nearer than the nearest answer
    holds none."""
    n = vocab.min_distance() + 2 * vocab.statement_len + 2
    assert vocab.max_distance(n) == vocab.min_distance()
    text = char_filler(4 * n, seed=2)[:n]
    row = training_sequence(vocab, text, items=1, generator=torch.Generator().manual_seed(0))
    assert row.shape == text.shape
    with pytest.raises(ValueError, match="holds no probe item"):
        training_sequence(vocab, text[:-1], items=1, generator=torch.Generator().manual_seed(0))
    assert vocab.max_distance(512) == 512 - 2 * vocab.statement_len - 2
