"""Data: the Python standard library's own source as bytes, and a long-range recall probe.

Nothing is downloaded. The text corpus is read from the running interpreter's
installation (``sysconfig.get_paths()["stdlib"]``):

- every ``*.py`` file below that folder, except test folders (``test``, ``tests``,
  ``idle_test``), ``site-packages``/``dist-packages`` and ``__pycache__``;
- files larger than ``max_file_bytes`` (default 200 kB) are skipped, so that no single
  file (such as ``pydoc_data/topics.py``) dominates;
- the files are put in a fixed order, by the SHA-256 of their relative path (a
  deterministic shuffle that mixes packages), and taken in that order until the
  size cap ``max_bytes`` (default 3 MB) would be exceeded;
- a file goes to validation when the SHA-256 of its relative path is divisible by
  ``val_every`` (default 10, about 10 % of the files), otherwise to training. The
  split depends on the path alone, so a file never changes sides when the cap changes.

The vocabulary is the 256 byte values. :meth:`ByteCorpus.describe` lists the chosen
files, their sizes and split, and a SHA-256 of each split, for every result file.
"""

from __future__ import annotations

import hashlib
import sys
import sysconfig
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path

import torch

from relbias._checks import check_int, check_positive_ints

EXCLUDED_DIRS = frozenset(
    {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
)
DEFAULT_MAX_BYTES = 3_000_000
DEFAULT_MAX_FILE_BYTES = 200_000
DEFAULT_VAL_EVERY = 10


def stdlib_root() -> Path:
    """The folder of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def _path_hash(rel: str) -> str:
    return hashlib.sha256(rel.encode("utf-8")).hexdigest()


def list_source_files(root: Path | str | None = None) -> list[str]:
    """Relative POSIX paths of the eligible ``*.py`` files under ``root``, sorted."""
    root = Path(root) if root is not None else stdlib_root()
    if not root.is_dir():
        raise FileNotFoundError(f"standard library folder not found: {root}")
    found = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS.isdisjoint(rel.parts[:-1]) and path.is_file():
            found.append(rel.as_posix())
    return sorted(found)


@dataclass
class ByteCorpus:
    """Train and validation bytes (uint8 tensors) and the files they came from."""

    train: torch.Tensor
    val: torch.Tensor
    files: list[dict] = field(default_factory=list)
    root: str = ""
    max_bytes: int = DEFAULT_MAX_BYTES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    val_every: int = DEFAULT_VAL_EVERY

    def describe(self, *, with_files: bool = True) -> dict:
        """Provenance: root, Python version, caps, sizes, SHA-256 per split, file list."""
        info = {
            "source": "Python standard library *.py files",
            "root": self.root,
            "python": sys.version.split()[0],
            "max_bytes": self.max_bytes,
            "max_file_bytes": self.max_file_bytes,
            "val_every": self.val_every,
            "train_bytes": int(self.train.numel()),
            "val_bytes": int(self.val.numel()),
            "train_sha256": _tensor_hash(self.train),
            "val_sha256": _tensor_hash(self.val),
            "num_files": {s: sum(f["split"] == s for f in self.files) for s in ("train", "val")},
        }
        if with_files:
            info["files"] = self.files
        return info

    def split_offsets(self, split: str = "val") -> list[int]:
        """Start of each file of ``split`` inside that split's bytes, plus the end."""
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        out = [0]
        for f in self.files:
            if f["split"] == split:
                out.append(out[-1] + f["bytes"])
        return out

    def sources(self, num_bytes: int, split: str = "val") -> list[tuple[str, int]]:
        """The files that the first ``num_bytes`` bytes of ``split`` come from, in order, with
        how many of those bytes each gives (what an evaluation that reads the start of the
        split reads)."""
        num_bytes = check_int("num_bytes", num_bytes, minimum=1)
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        out, need = [], num_bytes
        for f in (f for f in self.files if f["split"] == split):
            if need <= 0:
                break
            out.append((f["path"], min(f["bytes"], need)))
            need -= out[-1][1]
        return out

    def share_seen_in_training(self, num_bytes: int) -> float:
        """The share of the first ``num_bytes`` validation bytes that lie in non-blank lines
        appearing verbatim in the training split: the split holds out files, not lines."""
        num_bytes = check_int("num_bytes", num_bytes, minimum=1)
        train_lines = set(bytes(self.train.tolist()).split(b"\n"))
        text = bytes(self.val[:num_bytes].tolist())
        seen = sum(len(ln) + 1 for ln in text.split(b"\n") if ln.strip() and ln in train_lines)
        return min(seen, len(text)) / len(text)


def _tensor_hash(t: torch.Tensor) -> str:
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def select_files(
    root: Path | str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    val_every: int = DEFAULT_VAL_EVERY,
) -> list[dict]:
    """The chosen files in corpus order, each ``{"path", "bytes", "split"}``."""
    check_positive_ints(max_bytes=max_bytes, max_file_bytes=max_file_bytes, val_every=val_every)
    root = Path(root) if root is not None else stdlib_root()
    chosen, total = [], 0
    for rel in sorted(list_source_files(root), key=_path_hash):
        size = (root / rel).stat().st_size
        if size == 0 or size > max_file_bytes or total + size > max_bytes:
            continue
        split = "val" if int(_path_hash(rel), 16) % val_every == 0 else "train"
        chosen.append({"path": rel, "bytes": size, "split": split})
        total += size
    return chosen


#: The corpora read so far, most recent last: at most :data:`CACHED_CORPORA` of them.
_CACHE: OrderedDict = OrderedDict()
CACHED_CORPORA = 4


def load_corpus(
    root: Path | str | None = None,
    *,
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    val_every: int = DEFAULT_VAL_EVERY,
) -> ByteCorpus:
    """Read the corpus. The last :data:`CACHED_CORPORA` argument sets are kept in memory,
    so that a chapter or a sweep reads the files once. Raises if either split is empty."""
    root = Path(root) if root is not None else stdlib_root()
    key = (str(root), max_bytes, max_file_bytes, val_every)
    if key in _CACHE:
        _CACHE.move_to_end(key)
    else:
        files = select_files(
            root, max_bytes=max_bytes, max_file_bytes=max_file_bytes, val_every=val_every
        )
        parts = {"train": [], "val": []}
        for f in files:
            parts[f["split"]].append((root / f["path"]).read_bytes())
        if not parts["train"] or not parts["val"]:
            raise ValueError(
                f"the corpus under {root} has {len(parts['train'])} train and "
                f"{len(parts['val'])} validation files; raise max_bytes or lower val_every"
            )
        train, val = (_to_tensor(b"".join(parts[s])) for s in ("train", "val"))
        _CACHE[key] = ByteCorpus(train, val, files, str(root), max_bytes, max_file_bytes, val_every)
        while len(_CACHE) > CACHED_CORPORA:
            _CACHE.popitem(last=False)
    return _CACHE[key]


def _to_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).clone()


def random_windows(
    data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of random windows: inputs and next-byte targets, both ``[batch, seq_len]``."""
    check_positive_ints(batch_size=batch_size, seq_len=seq_len)
    if data.numel() < seq_len + 1:
        raise ValueError(f"data has {data.numel()} bytes, fewer than seq_len + 1 = {seq_len + 1}")
    starts = torch.randint(0, data.numel() - seq_len, (batch_size,), generator=generator)
    idx = starts[:, None] + torch.arange(seq_len + 1)
    chunk = data[idx].long()
    return chunk[:, :-1], chunk[:, 1:]


def eval_windows(data: torch.Tensor, seq_len: int, num_tokens: int) -> tuple:
    """Non-overlapping windows over the first ``num_tokens`` predicted bytes of ``data``.

    Window ``w`` holds inputs ``data[w*L : (w+1)*L]`` and targets shifted by one, so
    every target byte is predicted exactly once. Returns ``(inputs, targets)``, each
    ``[num_tokens // L, L]``; raises when not even one window fits.
    """
    check_positive_ints(seq_len=seq_len, num_tokens=num_tokens)
    count = min(num_tokens, data.numel() - 1) // seq_len
    if count < 1:
        raise ValueError(
            f"validation text of {data.numel()} bytes has no window of length {seq_len}"
        )
    span = count * seq_len
    x = data[:span].long().view(count, seq_len)
    y = data[1 : span + 1].long().view(count, seq_len)
    return x, y


def spread_eval_windows(
    data: torch.Tensor, seq_len: int, num_tokens: int, *, span_len: int | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Windows of ``seq_len`` covering ``num_tokens`` bytes drawn across all of ``data``.

    The text is read in ``ceil(num_tokens / span_len)`` spans of ``span_len`` bytes (default
    ``seq_len``; a multiple of it) whose starts are spread evenly from the first byte to the
    last span that fits, so that they come from many files of the concatenated validation
    split rather than from its first few. Each span is cut into ``span_len // seq_len``
    non-overlapping windows. With the same ``span_len`` (the longest evaluation length),
    every length reads exactly the same bytes and differs only in context. Spans overlap
    only when ``data`` is shorter than the bytes asked for.

    Returns ``(inputs, targets, starts)``: ``[windows, seq_len]`` each, and the span starts.
    """
    span_len = seq_len if span_len is None else span_len
    check_positive_ints(seq_len=seq_len, num_tokens=num_tokens, span_len=span_len)
    if span_len % seq_len:
        raise ValueError(f"span_len ({span_len}) must be a multiple of seq_len ({seq_len})")
    last = data.numel() - 1 - span_len  # the last start whose targets fit
    if last < 0:
        raise ValueError(
            f"validation text of {data.numel()} bytes has no span of length {span_len}"
        )
    spans = -(-num_tokens // span_len)
    if spans == 1:
        starts = torch.zeros(1, dtype=torch.long)
    else:
        starts = torch.round(torch.linspace(0, last, spans, dtype=torch.float64)).long()
    idx = starts[:, None] + torch.arange(span_len + 1)
    chunk = data[idx].long()
    x = chunk[:, :-1].reshape(-1, seq_len)
    y = chunk[:, 1:].reshape(-1, seq_len)
    return x, y, starts


def files_touched(starts, span_len: int, offsets) -> int:
    """How many files (``offsets`` from :meth:`ByteCorpus.split_offsets`) the spans touch."""
    bounds = torch.as_tensor(offsets, dtype=torch.long)
    starts = torch.as_tensor(starts, dtype=torch.long)
    first = torch.searchsorted(bounds, starts, right=True) - 1
    last = torch.searchsorted(bounds, starts + span_len, right=True) - 1
    touched = set()
    for a, b in zip(first.tolist(), last.tolist()):
        touched.update(range(max(a, 0), min(b, len(offsets) - 2) + 1))
    return len(touched)
