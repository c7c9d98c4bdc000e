"""Speed of relbias.hf against the same Llama with RoPE on HF's SDPA, on the CPU.

Two measurements per family, each the median of ``--repeats`` runs after a warm-up:

- a training step (forward, backward, AdamW step) on ``--batch`` x ``--train-len`` tokens;
- a cached greedy decode of ``--decode-len`` tokens (DynamicCache) after a 16-token prompt;
- with ``--compiled``, also that decode with a static cache through the forward compiled by
  ``torch.compile`` (``--compile-backend``, default inductor; one warm-up generation compiles
  the prompt's and the step's graphs).

Prints one line per family with its seconds and its ratio to RoPE + SDPA, and writes them
(with the settings and the machine) as JSON to ``--out`` when given::

    .venv/bin/python scripts/hf_bench.py --repeats 5 --out relbias/hf/results/bench_cpu.json

under PyTorch's default settings (no thread or denormal switches), on a quiet machine, from
a clean commit (the JSON records it). A benchmark, not a test: the numbers depend on the
machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import torch

from relbias.lab.results import checkout_commit

FAMILIES = {
    "alibi": {},
    "t5": {},
    "kerple_power": {},
    "kerple_log": {},
    "sandwich": {},
    "offset": {"max_offset": 511},
    "fire": {},
}


def small_llama(family, *, hidden, layers, heads, kv_heads, seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    import relbias.hf as rh

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=256,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=4096,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(config)
    if family != "rope":
        rh.apply(model, family, **FAMILIES[family])
    return model


def median_seconds(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def train_step_seconds(model, batch, length, repeats):
    model.train()
    ids = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()

    return median_seconds(step, repeats)


def decode_seconds(model, length, repeats):
    model.eval()
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))

    @torch.no_grad()
    def decode():
        out = model.generate(prompt, max_new_tokens=length, min_new_tokens=length, do_sample=False)
        assert out.shape[1] == 16 + length

    return median_seconds(decode, repeats)


def compiled_decode_seconds(model, length, repeats, backend):
    model.eval()
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    eager_forward = model.forward
    # Every family's forward is the same code object (transformers' wrapper): without a reset
    # their graphs (a prompt and a step each) share one recompile limit, and the fifth family
    # fails under fullgraph. Each family is compiled afresh.
    torch._dynamo.reset()
    model.forward = torch.compile(eager_forward, backend=backend, fullgraph=True)

    @torch.no_grad()
    def decode():
        out = model.generate(
            prompt,
            max_new_tokens=length,
            min_new_tokens=length,
            do_sample=False,
            cache_implementation="static",
        )
        assert out.shape[1] == 16 + length

    try:
        return median_seconds(decode, repeats)
    finally:
        model.forward = eager_forward


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="*", default=list(FAMILIES))
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--train-len", type=int, default=256)
    parser.add_argument("--decode-len", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--compiled", action="store_true", help="also a compiled static decode")
    parser.add_argument("--compile-backend", default="inductor")
    parser.add_argument("--out", default=None, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.families) - set(FAMILIES))
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {list(FAMILIES)}")
    shape = dict(hidden=args.hidden, layers=args.layers, heads=args.heads, kv_heads=args.kv_heads)
    rows = {}
    for family in ["rope", *args.families]:
        model = small_llama(family, **shape)
        rows[family] = {
            "train_step_s": train_step_seconds(model, args.batch, args.train_len, args.repeats),
            "decode_s": decode_seconds(model, args.decode_len, args.repeats),
        }
        if args.compiled:
            rows[family]["compiled_decode_s"] = compiled_decode_seconds(
                model, args.decode_len, args.repeats, args.compile_backend
            )
        base = rows["rope"]
        rows[family]["train_step_ratio"] = rows[family]["train_step_s"] / base["train_step_s"]
        rows[family]["decode_ratio"] = rows[family]["decode_s"] / base["decode_s"]
        r = rows[family]
        compiled = ""
        if args.compiled:
            r["compiled_decode_ratio"] = r["compiled_decode_s"] / base["compiled_decode_s"]
            compiled = (
                f"   compiled static decode {r['compiled_decode_s']:7.2f} s "
                f"({r['compiled_decode_ratio']:.2f}x)"
            )
        print(
            f"{family:13s} train step {r['train_step_s'] * 1e3:8.1f} ms "
            f"({r['train_step_ratio']:.2f}x)   decode {args.decode_len} tokens "
            f"{r['decode_s']:7.2f} s ({r['decode_ratio']:.2f}x){compiled}",
            flush=True,
        )
    result = {
        "settings": vars(args),
        "machine": {
            "platform": platform.platform(),
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "commit": checkout_commit(),
            "command": " ".join(sys.argv),
        },
        "baseline": "the same Llama with RoPE on HF's sdpa attention",
        "results": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
