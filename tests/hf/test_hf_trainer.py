"""HF's Trainer trains a small Llama with a relbias bias on the book's byte corpus."""

from __future__ import annotations

import pytest
import torch
from hf_helpers import FAMILY_KWARGS, tiny_model
from transformers import Trainer, TrainingArguments

import relbias.hf as rh
from relbias.hf.train import ByteWindows
from relbias.lab.data import load_corpus

SEQ = 32


@torch.no_grad()
def mean_loss(model, dataset):
    model.eval()
    batch = torch.stack([dataset[i]["input_ids"] for i in range(len(dataset))])
    return float(model(input_ids=batch, labels=batch, use_cache=False).loss)


@pytest.mark.parametrize("family", ["kerple_log", "t5"])
def test_trainer_trains_a_biased_llama_and_the_loss_falls(tmp_path, family):
    corpus = load_corpus(max_bytes=100_000)
    train, held_out = ByteWindows(corpus.train, 256, SEQ, 0), ByteWindows(corpus.val, 16, SEQ, 1)
    torch.manual_seed(0)
    model = tiny_model(vocab_size=256)
    rh.apply(model, family, **FAMILY_KWARGS[family])
    before = [p.detach().clone() for b in rh.biases(model) for p in b.parameters()]
    start = mean_loss(model, held_out)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=40,
        per_device_train_batch_size=16,
        learning_rate=3e-3,
        warmup_steps=0,
        logging_steps=10,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.train()
    end = mean_loss(model, held_out)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert len(losses) == 4 and losses[-1] < losses[0]
    # nats per byte: from about ln 256 = 5.5 (uniform) to about 3.5 after 40 steps
    assert end < start - 1.0, (start, end)
    after = [p.detach() for b in rh.biases(model) for p in b.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after)), "the bias did not learn"
    assert model.config._attn_implementation == rh.ATTN_IMPLEMENTATION


@pytest.mark.parametrize(
    ("cuda", "flag", "cpu"), [(False, [], True), (True, [], False), (True, ["--cpu"], True)]
)
def test_the_script_trains_on_the_gpu_where_there_is_one(monkeypatch, cuda, flag, cpu):
    """`python -m relbias.hf.train` (the page's torchrun/accelerate road) takes the GPU where
    CUDA is available and `--cpu` keeps it on the CPU."""
    import relbias.hf.train as script

    seen = {}
    monkeypatch.setattr(script.torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(script, "train_on_bytes", lambda model, out, **kw: seen.update(kw) or {})
    script.main(["--family", "alibi", "--steps", "1", *flag])
    assert seen["use_cpu"] is cpu
