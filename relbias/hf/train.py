"""Train a small Llama with a relbias bias on the book's byte corpus with HF's Trainer.

The road to many processes is HF's: the same script runs in one process or under
``torchrun --nproc_per_node N`` (DDP; gloo on the CPU, NCCL on GPUs), or through
``accelerate launch`` (DDP or FSDP). It trains on the GPU where CUDA is available (one per
process), else on the CPU; ``--cpu`` keeps it on the CPU. For the same global batch
(``--global-batch``, split evenly across the processes, each step reading the same
examples in order) the loss curve is the one-process curve within float tolerance::

    python -m relbias.hf.train --family kerple_log --out one.json
    torchrun --nproc_per_node 2 -m relbias.hf.train --family kerple_log --out two.json

The training windows are drawn once from the training split (seeded) and read in order
(``train_sampling_strategy="sequential"``), so that every process count sees the same
global batches. Rank 0 writes ``--out`` (JSON): the settings, the logged losses and the
held-out loss before and after.
"""

from __future__ import annotations

import argparse
import json
import os

import torch

from relbias._checks import check_int

__all__ = ["ByteWindows", "build_model", "byte_trainer", "main", "train_on_bytes"]


#: The small byte-level Llama of :func:`build_model` (and of the book's chapter 10): vocabulary
#: 256 (one token per byte), hidden size 64, 2 layers, 4 query heads of dimension 16 sharing
#: 2 key/value heads (grouped-query attention).
SMALL_LLAMA = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
    bos_token_id=None,
    eos_token_id=None,
    pad_token_id=None,
    tie_word_embeddings=True,
)


def build_model(family: str | None, *, seed: int = 0, **bias_kwargs):
    """A small byte-level Llama (vocab 256, hidden 64, 2 layers, 4 heads, 2 key heads),
    with the relbias ``family`` applied, or RoPE (``family=None``)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    import relbias.hf as rh

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMALL_LLAMA))
    if family is not None:
        rh.apply(model, family, **bias_kwargs)
    return model


class ByteWindows(torch.utils.data.Dataset):
    """``count`` random windows of ``seq_len`` bytes of ``data`` (a 1-D tensor), drawn once
    (seeded), as the Trainer's examples (``input_ids`` and ``labels``)."""

    def __init__(self, data: torch.Tensor, count: int, seq_len: int, seed: int):
        from relbias.lab.data import random_windows

        g = torch.Generator().manual_seed(seed)
        self.x, _ = random_windows(data, count, seq_len, g)

    def __len__(self):
        return self.x.shape[0]

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


@torch.no_grad()
def _held_out_loss(model, data: torch.Tensor) -> float:
    was = model.training
    model.eval()
    batch = data.to(next(model.parameters()).device)
    loss = float(model(input_ids=batch, labels=batch, use_cache=False).loss)
    model.train(was)
    return loss


def byte_trainer(
    model,
    dataset,
    output_dir,
    *,
    steps,
    batch_size,
    lr,
    seed,
    logging_steps,
    use_cpu=True,
    torch_compile=False,
    ddp=False,
    quiet=False,
):
    """The one ``transformers.Trainer`` set-up of this room (the train script and chapter 10):
    ``steps`` optimiser steps of ``batch_size`` windows per process, taken in order, no
    warm-up, no checkpoints, no trackers, no progress bar; a loss logged every
    ``logging_steps``. ``quiet`` drops HF's printed log lines (the losses stay in
    ``trainer.state.log_history``); ``ddp``: several processes, gloo on the CPU."""
    from transformers import PrinterCallback, Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(output_dir),
        max_steps=steps,
        per_device_train_batch_size=batch_size,
        learning_rate=lr,
        warmup_steps=0,
        logging_steps=logging_steps,
        save_strategy="no",
        report_to=[],  # no trackers
        use_cpu=use_cpu,
        seed=seed,
        data_seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,  # no progress bar
        train_sampling_strategy="sequential",  # the windows in the order drawn
        torch_compile=torch_compile,
        ddp_backend="gloo" if use_cpu and ddp else None,
        ddp_find_unused_parameters=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=dataset)
    if quiet:
        trainer.remove_callback(PrinterCallback)  # the losses stay in the log history
    return trainer


def train_on_bytes(
    model,
    output_dir,
    *,
    steps=40,
    global_batch=16,
    seq_len=32,
    lr=3e-3,
    seed=0,
    corpus_bytes=100_000,
    logging_steps=5,
    use_cpu=True,
    torch_compile=False,
) -> dict:
    """Train ``model`` with ``transformers.Trainer`` on byte windows of the lab's corpus.

    ``global_batch`` examples per optimiser step, divided evenly among the processes
    (``WORLD_SIZE``, set by torchrun). Returns the logged losses (one per
    ``logging_steps``) and the held-out loss (16 validation windows) before and after.
    """
    from relbias.lab.data import load_corpus, random_windows

    steps = check_int("steps", steps, minimum=1)
    global_batch = check_int("global_batch", global_batch, minimum=1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if global_batch % world:
        raise ValueError(
            f"global_batch ({global_batch}) must be divisible by the number of processes ({world})"
        )
    corpus = load_corpus(max_bytes=corpus_bytes)
    train = ByteWindows(corpus.train, steps * global_batch, seq_len, seed)
    held_out, _ = random_windows(corpus.val, 16, seq_len, torch.Generator().manual_seed(seed + 1))
    before = _held_out_loss(model, held_out)
    trainer = byte_trainer(
        model,
        train,
        output_dir,
        steps=steps,
        batch_size=global_batch // world,
        lr=lr,
        seed=seed,
        logging_steps=logging_steps,
        use_cpu=use_cpu,
        torch_compile=torch_compile,
        ddp=world > 1,
    )
    trainer.train()
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    return {
        "world_size": world,
        "steps": steps,
        "global_batch": global_batch,
        "seq_len": seq_len,
        "losses": losses,
        "held_out_before": before,
        "held_out_after": _held_out_loss(model, held_out),
    }


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default="kerple_log", help="a relbias family, or 'rope'")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus-bytes", type=int, default=100_000)
    parser.add_argument("--output-dir", default=None, help="the Trainer's folder (a temp one)")
    parser.add_argument("--out", default=None, help="write the result here (JSON, rank 0)")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--cpu", action="store_true", help="train on the CPU even where CUDA is available"
    )
    args = parser.parse_args(argv)
    import tempfile

    family = None if args.family == "rope" else args.family
    model = build_model(family, seed=args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        result = train_on_bytes(
            model,
            args.output_dir or tmp,
            steps=args.steps,
            global_batch=args.global_batch,
            seq_len=args.seq_len,
            lr=args.lr,
            seed=args.seed,
            corpus_bytes=args.corpus_bytes,
            use_cpu=args.cpu or not torch.cuda.is_available(),
            torch_compile=args.compile,
        )
    result["family"] = args.family
    if args.out and int(os.environ.get("RANK", "0")) == 0:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":  # pragma: no cover - run as python -m relbias.hf.train
    main()
