"""Far recall and far precision for any causal LM, through its own tokenizer.

The probes of :mod:`relbias.lab.probe` write bytes; a user's model reads its tokenizer's ids.
This module writes the same kind of task in any vocabulary, so a checkpoint the user already
has can be asked whether it recalls a fact from far back, and whether it still tells a fact
``d`` tokens back from one a little farther:

- a **statement** sets a key (two uppercase letters) to a digit: the ids of ``" QX="`` then
  the digit's id;
- a **query** asks for it: the ids of ``" QX?"`` (``query="question"``), or the statement's
  own prefix ``" QX="`` again (``query="repeat"``: the copy an induction head makes); the
  answer is the next token, the digit;
- ``"recall"``: one statement of the asked key, its digit ``distance`` tokens before the
  position that predicts the answer (the query's last token), and ``distractors`` statements
  of other keys anywhere in the sequence;
- ``"latest"``: the asked key is set twice, to different digits: the newer statement
  ``distance`` back, the older ``distance + gap`` back (``gap``: by default ``distance // 4``,
  at least a statement's length); the answer is the newer digit. A model that cannot tell
  the two offsets apart is right about half of the time; one that ignores both, a tenth.

Everything else in a sequence is real text (``filler``: the token ids of held-out text), so
the model reads the task inside text of the kind it was trained on.

:func:`probe_accuracy` scores a model: the digit with the highest logit among the ten, at the
query's last position, is its answer. :func:`repeat_loss` asks the question under both
probes: does the model copy from its context at all (a span of text read a second time, right
after the first, reads far better where it does: what an induction head does).
:func:`training_sequence` writes the same items, several per sequence, into training text
(a base model is trained on them within its training length, so that recall past it can be
read after a retrofit).
"""

from __future__ import annotations

import torch

from relbias._checks import check_choice, check_int

__all__ = [
    "QUERIES",
    "TASKS",
    "check_tasks",
    "ProbeVocabulary",
    "probe_accuracy",
    "probe_batch",
    "repeat_loss",
    "training_sequence",
]

TASKS = ("recall", "latest")
QUERIES = ("question", "repeat")
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


class ProbeVocabulary:
    """The probe's pieces in one tokenizer's ids: a statement prefix and a query per key,
    and the ten digits (each must be one token).

    ``encode``: ``str -> list[int]`` without special tokens (e.g. ``lambda s:
    tokenizer.encode(s, add_special_tokens=False)``); ``keys``: how many two-letter keys
    (``AA``, ``AB``, ...; at most 676); ``query``: how a query is written, ``"question"``
    (``" QX?"``) or ``"repeat"`` (``" QX="``, the statement's prefix)."""

    def __init__(self, encode, *, keys: int = 64, query: str = "question"):
        if not callable(encode):
            raise TypeError(f"encode must be a callable str -> list[int], got {type(encode)}")
        keys = check_int("keys", keys, minimum=3)
        self.query = check_choice("query", query, set(QUERIES))
        if keys > len(_LETTERS) ** 2:
            raise ValueError(f"keys must be at most {len(_LETTERS) ** 2}, got {keys}")
        digits = []
        for v in range(10):
            ids = list(encode(str(v)))
            if len(ids) != 1:
                raise ValueError(
                    f"the probe needs every digit to be one token; this tokenizer encodes "
                    f"{str(v)!r} as {ids}"
                )
            digits.append(ids[0])
        self.digits = torch.tensor(digits)
        names = [a + b for a in _LETTERS for b in _LETTERS]
        step = len(names) // keys  # spread over the alphabet, not AA..CL
        self.names = names[::step][:keys]
        self.statements = [list(encode(f" {k}=")) for k in self.names]
        mark = "?" if self.query == "question" else "="
        self.queries = [list(encode(f" {k}{mark}")) for k in self.names]
        if any(not ids for ids in self.statements + self.queries):
            raise ValueError("encode returned no ids for a key")
        self.query_len = max(len(q) for q in self.queries)
        self.statement_len = max(len(s) for s in self.statements) + 1

    def min_distance(self) -> int:
        """The nearest answer a query can ask for (the statement's digit just before it)."""
        return self.query_len

    def max_distance(self, window: int) -> int:
        """The farthest answer :func:`training_sequence` writes into a window of ``window``
        tokens: room for the query and for a statement before it."""
        return window - 2 * self.statement_len - 2


def _filler(filler: torch.Tensor, length: int, gen: torch.Generator) -> torch.Tensor:
    if filler.dim() != 1 or filler.numel() <= length:
        raise ValueError(
            f"filler must be a 1-D tensor of token ids longer than the sequence ({length}), "
            f"got shape {tuple(filler.shape)}"
        )
    start = int(torch.randint(filler.numel() - length, (1,), generator=gen))
    return filler[start : start + length].clone().long()


def _free(taken: torch.Tensor, start: int, length: int) -> bool:
    return (
        start >= 0 and start + length <= taken.numel() and not taken[start : start + length].any()
    )


def _put(row, taken, start: int, ids) -> None:
    row[start : start + len(ids)] = torch.as_tensor(ids)
    taken[start : start + len(ids)] = True


def _other_digit(gen, *avoid) -> int:
    while True:
        v = int(torch.randint(10, (1,), generator=gen))
        if v not in avoid:
            return v


def _place_item(row, taken, vocab, *, task, end, distance, gap, gen, used=()) -> int | None:
    """Write one query ending at ``end`` (the position that predicts the answer) and its
    statements, of a key not in ``used``; return the key's index, or None (writing nothing)
    where a place is taken."""
    while True:
        key = int(torch.randint(len(vocab.names), (1,), generator=gen))
        if key not in used:
            break
    query, prefix = vocab.queries[key], vocab.statements[key]
    value = int(torch.randint(10, (1,), generator=gen))
    spots = [(end - len(query) + 1, query), (end - distance - len(prefix), prefix)]
    if task == "latest":
        older = _other_digit(gen, value)
        spots.append((end - distance - gap - len(prefix), [*prefix, int(vocab.digits[older])]))
    spots[1] = (spots[1][0], [*prefix, int(vocab.digits[value])])
    trial = taken.clone()  # the item's own pieces must not overlap either
    for s, ids in spots:
        if not _free(trial, s, len(ids)):
            return None
        trial[s : s + len(ids)] = True
    for s, ids in spots:
        _put(row, taken, s, ids)
    return key


def probe_batch(
    vocab: ProbeVocabulary,
    filler: torch.Tensor,
    *,
    count: int,
    distance: int,
    task: str = "recall",
    gap: int | None = None,
    distractors: int = 2,
    seq_len: int | None = None,
    generator: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``count`` test sequences: the query at the end, its answer ``distance`` tokens back.

    ``seq_len`` defaults to the shortest that holds the items (a few tokens of text before the
    farthest statement). Returns ``(input_ids [count, seq_len], answers [count])``: the answer
    digit (0-9) of each sequence, predicted at its last position."""
    task = check_choice("task", task, set(TASKS))
    count = check_int("count", count, minimum=1)
    distance = check_int("distance", distance, minimum=vocab.min_distance())
    distractors = check_int("distractors", distractors, minimum=0)
    least = vocab.statement_len  # the two statements of "latest" must not overlap
    gap = max(least, distance // 4) if gap is None else check_int("gap", gap, minimum=least)
    reach = distance + vocab.statement_len + (gap + vocab.statement_len if task == "latest" else 0)
    seq_len = reach + 8 if seq_len is None else check_int("seq_len", seq_len, minimum=reach + 1)
    rows, answers = [], []
    for _ in range(count):
        row = _filler(filler, seq_len, generator)
        taken = torch.zeros(seq_len, dtype=torch.bool)
        key = _place_item(
            row, taken, vocab, task=task, end=seq_len - 1, distance=distance, gap=gap, gen=generator
        )
        if key is None:  # pragma: no cover - the first item always fits (seq_len > reach)
            raise RuntimeError("the probe's item did not fit")
        answer = vocab.digits.tolist().index(int(row[seq_len - 1 - distance]))
        for _ in range(distractors):
            _distractor(row, taken, vocab, key, answer, generator)
        rows.append(row)
        answers.append(answer)
    return torch.stack(rows), torch.tensor(answers)


def _distractor(row, taken, vocab, asked: int, answer, gen, tries: int = 50) -> None:
    """A statement of another key than ``asked`` (another digit) anywhere free in ``row``."""
    for _ in range(tries):
        key = int(torch.randint(len(vocab.names), (1,), generator=gen))
        if key == asked:
            continue
        ids = [*vocab.statements[key], int(vocab.digits[_other_digit(gen, answer)])]
        start = int(torch.randint(max(1, row.numel() - len(ids)), (1,), generator=gen))
        if _free(taken, start, len(ids)):
            _put(row, taken, start, ids)
            return


def check_tasks(tasks) -> tuple[str, ...]:
    """``tasks`` as a tuple: a non-empty choice among :data:`TASKS`, else ValueError."""
    tasks = tuple(tasks)
    if not tasks or any(t not in TASKS for t in tasks):
        raise ValueError(f"tasks must be a non-empty choice among {TASKS}, got {tasks}")
    return tasks


def training_sequence(
    vocab: ProbeVocabulary,
    text: torch.Tensor,
    *,
    items: int,
    generator: torch.Generator,
    max_distance: int | None = None,
    tasks=TASKS,
) -> torch.Tensor:
    """``text`` (a 1-D window of token ids, copied) with up to ``items`` probe items written
    into it: each a query and its statement(s), its task drawn from ``tasks`` (default
    ``recall`` or ``latest`` at random; ``("recall",)``: no key is ever set twice), the
    distance uniform from the nearest to ``max_distance`` (default: what the window allows).
    Each item asks a key of its own (no other item sets it), so every query's answer is the
    newest statement of its key before it. Items that do not fit beside the earlier ones are
    skipped."""
    items = check_int("items", items, minimum=0)
    tasks = check_tasks(tasks)
    row = text.clone().long()
    n = row.numel()
    taken = torch.zeros(n, dtype=torch.bool)
    low = vocab.min_distance()
    high = vocab.max_distance(n) if max_distance is None else max_distance
    if high < low:
        raise ValueError(f"a window of {n} tokens holds no probe item")
    if items > len(vocab.names):
        raise ValueError(f"items must be at most the number of keys ({len(vocab.names)})")
    used: set[int] = set()  # one item per key: no statement of another item in between
    for _ in range(items):
        task = tasks[int(torch.randint(len(tasks), (1,), generator=generator))]
        distance = int(torch.randint(low, high + 1, (1,), generator=generator))
        gap = max(vocab.statement_len, distance // 4)
        reach = distance + vocab.statement_len + (gap + vocab.statement_len) * (task == "latest")
        if reach >= n:
            continue
        end = int(torch.randint(reach, n, (1,), generator=generator))
        # the answer follows the query: the digit is the next token after ``end``
        if end + 1 >= n or taken[end + 1]:
            continue
        taken[end + 1] = True
        key = _place_item(
            row,
            taken,
            vocab,
            task=task,
            end=end,
            distance=distance,
            gap=gap,
            gen=generator,
            used=used,
        )
        if key is None:
            taken[end + 1] = False
        else:
            used.add(key)
            row[end + 1] = row[end - distance]
    return row


@torch.no_grad()
def probe_accuracy(
    model,
    vocab: ProbeVocabulary,
    filler: torch.Tensor,
    distances,
    *,
    task: str = "recall",
    samples: int = 64,
    seed: int = 1234,
    batch_size: int = 16,
    **batch_options,
) -> list[dict]:
    """Accuracy of ``model`` (a transformers causal LM, or a callable ``ids -> logits``) at
    each distance: the share of ``samples`` sequences whose answer digit has the highest
    logit of the ten digits at the last position. Rows: ``task``, ``distance``, ``length``
    (the sequences' tokens), ``accuracy``, ``samples``."""
    from relbias.hf.evaluation import _forward_of, evaluating

    samples = check_int("samples", samples, minimum=1)
    forward = _forward_of(model)
    device = _device_of(model)
    gen = torch.Generator().manual_seed(seed)
    rows = []
    with evaluating(model):
        for distance in distances:
            x, answers = probe_batch(
                vocab,
                filler,
                count=samples,
                distance=distance,
                task=task,
                generator=gen,
                **batch_options,
            )
            correct = 0
            for start in range(0, samples, batch_size):
                logits = forward(x[start : start + batch_size].to(device))[:, -1]
                pred = logits[:, vocab.digits.to(logits.device)].argmax(-1).cpu()
                correct += int((pred == answers[start : start + batch_size]).sum())
            rows.append(
                {
                    "task": task,
                    "distance": int(distance),
                    "length": int(x.shape[1]),
                    "accuracy": correct / samples,
                    "samples": samples,
                }
            )
    return rows


@torch.no_grad()
def repeat_loss(
    model, filler: torch.Tensor, *, span: int = 64, count: int = 16, seed: int = 1234
) -> dict:
    """Whether ``model`` copies from its context: ``count`` spans of ``span`` token ids of
    ``filler`` (random starts, seeded), each written twice in a row, read once. Returns the
    mean loss in nats per token on the first copy (``first``: its tokens after the first,
    each predicted from the tokens before it) and on the second (``second``: its tokens
    after the first, each of which also stood ``span`` tokens back), per sequence too
    (``first_by_sequence``, ``second_by_sequence``), ``span`` and ``count``. A model that
    copies reads the second copy far better; one that does not, about as the first.
    ``model``: a transformers causal LM, or a callable ``ids -> logits``."""
    from relbias.hf.evaluation import _forward_of, evaluating

    span = check_int("span", span, minimum=2)
    count = check_int("count", count, minimum=1)
    forward = _forward_of(model)
    gen = torch.Generator().manual_seed(seed)
    spans = torch.stack([_filler(filler, span, gen) for _ in range(count)])
    ids = torch.cat([spans, spans], dim=1)
    with evaluating(model):
        logits = forward(ids).float().cpu()
    nll = -torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, ids[:, 1:, None])[..., 0]
    first, second = nll[:, : span - 1].mean(1), nll[:, span:].mean(1)  # targets 1.., span+1..
    return {
        "first": float(first.mean()),
        "second": float(second.mean()),
        "first_by_sequence": first.tolist(),
        "second_by_sequence": second.tolist(),
        "span": span,
        "count": count,
    }


def _device_of(model) -> torch.device:
    if isinstance(model, torch.nn.Module):
        first = next(model.parameters(), None)
        if first is not None:
            return first.device
    return torch.device("cpu")
