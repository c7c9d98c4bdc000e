"""A pretrained RoPE base, as a user has one: a BPE tokenizer and a small Llama trained on
the book's text at a short length, with far-recall items in its training mix.

- :func:`train_tokenizer`: a byte-level BPE tokenizer trained with HF ``tokenizers`` on the
  training split of the lab's corpus (:func:`relbias.lab.data.load_corpus`), wrapped as a
  ``PreTrainedTokenizerFast`` (saved and loaded as any tokenizer);
- :func:`token_bytes`: how many bytes each token id stands for (bits per byte of
  :func:`relbias.hf.eval_by_length`);
- :func:`base_config`: the Llama of the retrofit study (RoPE, ``max_position_embeddings``
  the training length, so that HF's dynamic NTK and YaRN read it as the original length);
- :class:`MixedWindows`: training windows of the tokenized text, a share of them carrying
  probe items (:func:`relbias.hf.recall.training_sequence`) at distances up to the window,
  and a share (none by default) with a span of the window written again later in it, at a
  random distance (copy windows, :func:`copy_span`);
- :func:`pretrain`: HF's Trainer over them, then ``save_pretrained`` of model and tokenizer.
"""

from __future__ import annotations

import torch

from relbias._checks import check_int

__all__ = [
    "BASE_SHAPE",
    "MixedWindows",
    "base_config",
    "copy_span",
    "encode_text",
    "pretrain",
    "token_bytes",
    "train_tokenizer",
]

#: The base Llama's shape: hidden 128, 4 layers, 4 heads of dimension 32, 2 key/value heads.
BASE_SHAPE = dict(
    hidden_size=128,
    intermediate_size=352,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    rope_theta=10000.0,
    tie_word_embeddings=True,
)


def train_tokenizer(text: str, vocab_size: int = 1024):
    """A byte-level BPE tokenizer (``vocab_size`` ids, the 256 bytes included) trained on
    ``text`` with HF ``tokenizers``; returned as a ``PreTrainedTokenizerFast`` with an
    end-of-text token ``<|endoftext|>`` (its last id)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    vocab_size = check_int("vocab_size", vocab_size, minimum=257)
    if not isinstance(text, str) or not text:
        raise ValueError("text must be a non-empty str")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
        show_progress=False,
    )
    tok.train_from_iterator(_chunks(text), trainer=trainer)
    tok.add_special_tokens(["<|endoftext|>"])
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>")


def _chunks(text: str, size: int = 1 << 16):
    for i in range(0, len(text), size):
        yield text[i : i + size]


def encode_text(tokenizer, data) -> torch.Tensor:
    """The token ids of ``data`` (bytes, a uint8 tensor or str), as a 1-D LongTensor."""
    if isinstance(data, torch.Tensor):
        data = bytes(data.tolist())
    if isinstance(data, bytes):
        data = data.decode("utf-8", errors="replace")
    ids = []
    for chunk in _chunks(data):  # chunks: the fast tokenizer in pieces, same ids at the joins
        ids.extend(tokenizer.encode(chunk, add_special_tokens=False))
    return torch.tensor(ids, dtype=torch.long)


def token_bytes(tokenizer) -> torch.Tensor:
    """The byte length of every token id of a byte-level BPE tokenizer (its vocabulary's
    strings are one character per byte; special tokens count 0)."""
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    sizes = torch.zeros(len(tokenizer), dtype=torch.long)
    for piece, i in vocab.items():
        sizes[i] = 0 if i in special else len(piece)
    return sizes


def base_config(vocab_size: int, train_len: int):
    """The study's ``LlamaConfig``: :data:`BASE_SHAPE`, RoPE, ``max_position_embeddings`` =
    ``train_len`` (the original length HF's dynamic NTK and YaRN scale from)."""
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=check_int("vocab_size", vocab_size, minimum=2),
        max_position_embeddings=check_int("train_len", train_len, minimum=2),
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        **BASE_SHAPE,
    )


class MixedWindows(torch.utils.data.Dataset):
    """``count`` training windows of ``seq_len`` tokens of ``ids`` (random starts, seeded per
    index); a share ``probe_share`` of them carry ``items`` probe items at distances up to
    the window (:func:`relbias.hf.recall.training_sequence`: windows ``0, k, 2k, ..`` for
    ``k = round(1 / probe_share)``). A share ``copy_share`` are copy windows
    (:func:`copy_span`: a span of the window written again later in it, at a random
    distance), what a model learns to copy from its context on (windows ``k // 2, k // 2 +
    k, ..`` for ``k = round(1 / copy_share)``; probe items written after, where both fall on
    one window). ``tasks``: the probe tasks the items are drawn from (``("recall",)``: no
    key set twice). Examples are made on demand, the same for the same ``seed`` and index."""

    def __init__(
        self,
        ids,
        vocab,
        *,
        count,
        seq_len,
        seed,
        probe_share=0.25,
        items=4,
        copy_share=0.0,
        tasks=("recall", "latest"),
    ):
        from relbias.hf.recall import check_tasks

        self.ids, self.vocab, self.tasks = ids, vocab, check_tasks(tasks)
        self.count = check_int("count", count, minimum=1)
        self.seq_len = check_int("seq_len", seq_len, minimum=8)
        self.seed = check_int("seed", seed, minimum=0)
        if not 0 <= probe_share <= 1:
            raise ValueError(f"probe_share must lie in [0, 1], got {probe_share}")
        self.probe_every = round(1 / probe_share) if probe_share else 0
        if not 0 <= copy_share <= 1:
            raise ValueError(f"copy_share must lie in [0, 1], got {copy_share}")
        self.copy_every = round(1 / copy_share) if copy_share else 0
        self.items = check_int("items", items, minimum=0)
        if ids.numel() <= seq_len:
            raise ValueError(f"ids ({ids.numel()} tokens) must be longer than seq_len ({seq_len})")

    def __len__(self):
        return self.count

    def _window(self, i):
        """Window ``i`` and its copy (``(source, destination, length)``, or None)."""
        from relbias.hf.recall import training_sequence

        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        start = int(torch.randint(self.ids.numel() - self.seq_len, (1,), generator=gen))
        x, copy = self.ids[start : start + self.seq_len], None
        if self.copy_every and i % self.copy_every == self.copy_every // 2:
            x, *copy = copy_span(x, gen)
        if self.probe_every and i % self.probe_every == 0:
            x = training_sequence(self.vocab, x, items=self.items, generator=gen, tasks=self.tasks)
        return x, copy

    def __getitem__(self, i):
        x = self._window(i)[0]
        return {"input_ids": x, "labels": x}

    def copies_kept(self, windows: int | None = None) -> float:
        """The share of the copy windows' copied tokens that the probe items, written after,
        leave as copied (the token at the second place still equals the one at the first),
        over the first ``windows`` windows (default: all); 1.0 where no item falls on a copy.
        """
        windows = self.count if windows is None else check_int("windows", windows, minimum=1)
        kept = total = 0
        for i in range(min(windows, self.count)):
            x, copy = self._window(i)
            if copy:
                source, dest, length = copy
                kept += int((x[dest : dest + length] == x[source : source + length]).sum())
                total += length
        if not total:
            raise ValueError("these windows hold no copy window (copy_share is 0)")
        return kept / total


def copy_span(x: torch.Tensor, generator: torch.Generator):
    """``x`` (a 1-D window, copied) with a span of it written again later in it: the span's
    length uniform from 4 to half the window, where it is written again uniform among the
    places after it, so that the distance back to the first copy varies from window to window
    (a copy at one fixed distance is learnt by position, not by content). Returns ``(window,
    source, destination, length)``."""
    n = x.numel()
    if n < 8:
        raise ValueError(f"a copy window needs at least 8 tokens, got {n}")
    length = int(torch.randint(4, n // 2 + 1, (1,), generator=generator))
    dest = int(torch.randint(length, n - length + 1, (1,), generator=generator))
    source = int(torch.randint(0, dest - length + 1, (1,), generator=generator))
    out = x.clone()
    out[dest : dest + length] = x[source : source + length]
    return out, source, dest, length


def pretrain(
    model, dataset, output_dir, *, steps, batch_size, lr, seed, logging_steps=50, callbacks=()
):
    """Train ``model`` on ``dataset`` with HF's Trainer (the room's one set-up,
    :func:`relbias.hf.train.byte_trainer`: in order, linear decay, no warm-up), with
    ``callbacks`` (``TrainerCallback``\\ s) added; returns the logged losses
    ``[{"step", "loss"}, ...]``. The base's pretraining and every retrofit's fine-tune
    (:func:`relbias.hf.retrofit.fine_tune`) train through it."""
    from relbias.hf.train import byte_trainer

    trainer = byte_trainer(
        model,
        dataset,
        output_dir,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        logging_steps=logging_steps,
        quiet=True,
    )
    for callback in callbacks:
        trainer.add_callback(callback)
    trainer.train()
    return [
        {"step": e["step"], "loss": e["loss"]} for e in trainer.state.log_history if "loss" in e
    ]
