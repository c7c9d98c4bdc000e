"""The byte corpus: deterministic, split by file, no overlap; training and evaluation windows."""

import pytest
import torch

from relbias.lab.data import (
    ByteCorpus,
    eval_windows,
    list_source_files,
    load_corpus,
    random_windows,
    select_files,
)

SMALL = 400_000


@pytest.fixture
def fake_stdlib(tmp_path):
    files = {
        "a.py": 100,
        "pkg/b.py": 200,
        "pkg/sub/c.py": 50,
        "test/t.py": 10,
        "pkg/tests/u.py": 10,
        "site-packages/x/y.py": 10,
        "idlelib/idle_test/z.py": 10,
        "notes.txt": 10,
        "empty.py": 0,
    }
    for rel, size in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * size)
    return tmp_path


def test_excluded_folders(fake_stdlib):
    assert list_source_files(fake_stdlib) == ["a.py", "empty.py", "pkg/b.py", "pkg/sub/c.py"]


def test_caps_and_empty_files(fake_stdlib):
    chosen = select_files(fake_stdlib, max_bytes=10_000, max_file_bytes=150, val_every=2)
    assert {f["path"] for f in chosen} == {"a.py", "pkg/sub/c.py"}
    capped = select_files(fake_stdlib, max_bytes=120, val_every=2)
    assert sum(f["bytes"] for f in capped) <= 120


def test_missing_root(tmp_path):
    with pytest.raises(FileNotFoundError):
        list_source_files(tmp_path / "nope")


def test_split_is_deterministic_and_disjoint():
    first = select_files(max_bytes=SMALL)
    assert first == select_files(max_bytes=SMALL)
    train = {f["path"] for f in first if f["split"] == "train"}
    val = {f["path"] for f in first if f["split"] == "val"}
    assert train and val and not train & val
    assert sum(f["bytes"] for f in first) <= SMALL
    assert not any("test" in f["path"].split("/")[:-1] for f in first)
    # a file keeps its side when the cap grows
    bigger = {f["path"]: f["split"] for f in select_files(max_bytes=2 * SMALL)}
    assert all(bigger.get(f["path"], f["split"]) == f["split"] for f in first)


def test_corpus_bytes_and_description():
    corpus = load_corpus(max_bytes=SMALL)
    info = corpus.describe()
    assert corpus.train.dtype == torch.uint8
    assert info["train_bytes"] + info["val_bytes"] == sum(f["bytes"] for f in info["files"])
    assert len(info["train_sha256"]) == 64 and info["train_sha256"] != info["val_sha256"]
    assert "files" not in corpus.describe(with_files=False)


def test_random_windows_are_shifted_targets():
    data = torch.arange(100, dtype=torch.uint8)
    x, y = random_windows(data, 4, 10, torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 10)
    assert torch.equal(y[:, :-1], x[:, 1:])
    with pytest.raises(ValueError):
        random_windows(data, 4, 100, torch.Generator())


def test_eval_windows_do_not_overlap():
    data = torch.arange(50, dtype=torch.uint8)
    x, y = eval_windows(data, 8, 40)
    assert x.shape == (5, 8)
    assert torch.equal(x.flatten(), torch.arange(40))
    assert torch.equal(y.flatten(), torch.arange(1, 41))
    with pytest.raises(ValueError):
        eval_windows(data, 64, 1000)


def test_spread_windows_read_the_same_bytes_at_every_length():
    from relbias.lab.data import spread_eval_windows

    data = torch.arange(10_000) % 251
    x64, y64, starts = spread_eval_windows(data, 64, 1000, span_len=256)
    x16, y16, starts16 = spread_eval_windows(data, 16, 1000, span_len=256)
    assert torch.equal(starts, starts16) and len(starts) == 4  # ceil(1000 / 256) spans
    assert x64.shape == (16, 64) and x16.shape == (64, 16)
    assert torch.equal(x64.reshape(-1), x16.reshape(-1))  # same bytes, less context
    assert torch.equal(y16, (x16 + 1) % 251)  # targets: the next byte
    # spread over the whole text: the first span at 0, the last one ending at the end
    assert int(starts[0]) == 0 and int(starts[-1]) == 10_000 - 1 - 256
    assert (starts.diff() >= 256).all()  # no overlap when the text is long enough
    with pytest.raises(ValueError, match="multiple of seq_len"):
        spread_eval_windows(data, 48, 1000, span_len=256)
    with pytest.raises(ValueError, match="no span"):
        spread_eval_windows(data[:100], 16, 1000, span_len=256)


def test_spread_windows_come_from_many_validation_files():
    from relbias.lab.data import files_touched, spread_eval_windows

    corpus = load_corpus(max_bytes=SMALL)
    offsets = corpus.split_offsets("val")
    assert offsets[0] == 0 and offsets[-1] == corpus.val.numel()
    _, _, starts = spread_eval_windows(corpus.val, 256, 8192, span_len=256)
    first_only = files_touched(torch.tensor([0]), 8192, offsets)
    assert files_touched(starts, 256, offsets) > max(first_only, 1)
    assert files_touched(torch.tensor([0]), 1, [0, 10, 20]) == 1
    assert files_touched(torch.tensor([5]), 10, [0, 10, 20]) == 2
    with pytest.raises(ValueError, match="split"):
        corpus.split_offsets("test")


def test_the_corpus_cache_keeps_the_last_few():
    from relbias.lab import data

    sizes = [60_000 + 1000 * i for i in range(data.CACHED_CORPORA + 2)]
    corpora = [load_corpus(max_bytes=n) for n in sizes]
    assert len(data._CACHE) <= data.CACHED_CORPORA
    assert load_corpus(max_bytes=sizes[-1]) is corpora[-1]  # the most recent are kept
    assert load_corpus(max_bytes=sizes[0]) is not corpora[0]  # the oldest were dropped


def test_sources_and_lines_seen_in_training_read_the_start_of_the_split():
    files = [
        {"path": "a.py", "bytes": 9, "split": "val"},
        {"path": "t.py", "bytes": 12, "split": "train"},
        {"path": "b.py", "bytes": 6, "split": "val"},
    ]
    val = torch.tensor(list(b"x = 1\nab\ny = 2\n"), dtype=torch.uint8)  # a.py 9 bytes, b.py 6
    train = torch.tensor(list(b"x = 1\nz = 3\n"), dtype=torch.uint8)
    corpus = ByteCorpus(train=train, val=val, files=files)
    assert corpus.sources(10) == [("a.py", 9), ("b.py", 1)]
    assert corpus.sources(3) == [("a.py", 3)]
    assert corpus.sources(5, split="train") == [("t.py", 5)]
    # "x = 1" (5 bytes and its newline) is a training line; "ab" and "y = 2" are not
    assert corpus.share_seen_in_training(val.numel()) == pytest.approx(6 / 15)
    with pytest.raises(ValueError, match="num_bytes"):
        corpus.sources(0)
    with pytest.raises(ValueError, match="split must be"):
        corpus.sources(4, split="test")
