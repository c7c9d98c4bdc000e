"""Speed of relbias.hf against the same Llama with RoPE on HF's SDPA, on the CPU.

Three measurements per family, each against a RoPE model timed beside it:

- a training step (forward, backward, AdamW step) on ``--batch`` x ``--train-len`` tokens;
- a cached greedy decode of ``--decode-len`` tokens (DynamicCache) after a 16-token prompt;
- with ``--compiled``, also that decode with a static cache through the forward compiled by
  ``torch.compile`` (``--compile-backend``, default inductor; one warm-up generation compiles
  the prompt's and the step's graphs).

The RoPE model is timed in the same repeats as the family, alternating (RoPE first in even
repeats, the family first in odd ones), after one warm-up of each: a machine that drifts
(load, clock, memory) moves both timings of a repeat alike. The ratio a family reports is
the median over the repeats of its time over RoPE's in that repeat (``*_ratio``), with every
repeat's ratio stored (``*_ratios``) and printed as a range; ``rope`` holds RoPE's medians
over every pairing. An earlier version timed RoPE once, before every family, and its ratios
moved by up to 0.5 between two passes on the same machine.

Prints one line per family with its seconds and its ratio to RoPE + SDPA, and writes them
(with the settings and the machine) as JSON to ``--out`` when given::

    .venv/bin/python scripts/hf_bench.py --repeats 15 --compiled \
        --out relbias/hf/results/bench_cpu.json

under PyTorch's default settings (no thread or denormal switches), with nothing else
running in the session, from a clean commit (the JSON records it); 15 repeats, since the
interval of a median from the order statistics (chapter 11's lab notes; 95 % for independent
repeats) needs at least 6 and narrows with more. A benchmark, not a
test: the numbers depend on the machine and its load.
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


def paired_seconds(rope_fn, family_fn, repeats):
    """Seconds of ``rope_fn`` and ``family_fn`` in alternating order, after one warm-up each:
    ``(rope_times, family_times)``, one pair per repeat."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    rope_fn()
    family_fn()
    times = {"rope": [], "family": []}
    for r in range(repeats):
        order = [("rope", rope_fn), ("family", family_fn)]
        for name, fn in order if r % 2 == 0 else order[::-1]:
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times["rope"], times["family"]


def train_step(model, batch, length):
    """One training step of ``model`` (a closure) on a fixed batch of random tokens."""
    model.train()
    ids = torch.randint(0, 256, (batch, length), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        opt.zero_grad(set_to_none=True)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        opt.step()

    return step


def decode(model, length, *, static=False):
    """A greedy decode of ``length`` tokens after a 16-token prompt (a closure); ``static``:
    through a static cache (what a compiled forward needs)."""
    prompt = torch.randint(0, 256, (1, 16), generator=torch.Generator().manual_seed(1))
    extra = {"cache_implementation": "static"} if static else {}

    @torch.no_grad()
    def run():
        model.eval()
        out = model.generate(
            prompt, max_new_tokens=length, min_new_tokens=length, do_sample=False, **extra
        )
        assert out.shape[1] == 16 + length

    return run


def compile_forward(model, backend):
    """Replace ``model.forward`` by its compiled version; returns the eager one."""
    eager = model.forward
    model.forward = torch.compile(eager, backend=backend, fullgraph=True)
    return eager


def measure(family, rope, args, shape):
    """A family's timings beside ``rope`` (the RoPE model): ``{name: (rope_times,
    family_times)}`` for the training step, the decode and (``args.compiled``) the compiled
    static-cache decode."""
    model = small_llama(family, **shape)
    out = {
        "train_step": paired_seconds(
            train_step(rope, args.batch, args.train_len),
            train_step(model, args.batch, args.train_len),
            args.repeats,
        ),
        "decode": paired_seconds(
            decode(rope, args.decode_len), decode(model, args.decode_len), args.repeats
        ),
    }
    if args.compiled:
        # Every model's forward is the same code object (transformers' wrapper), so their
        # graphs share one recompile limit: each pairing starts from a reset (4 graphs).
        torch._dynamo.reset()
        eager = {m: compile_forward(m, args.compile_backend) for m in (rope, model)}
        try:
            out["compiled_decode"] = paired_seconds(
                decode(rope, args.decode_len, static=True),
                decode(model, args.decode_len, static=True),
                args.repeats,
            )
        finally:
            for m, fn in eager.items():
                m.forward = fn
    return out


def row_of(times):
    """A family's row: per measurement its median seconds, RoPE's beside it, the median of
    the per-repeat ratios and every ratio."""
    row = {}
    for name, (rope_t, fam_t) in times.items():
        ratios = [f / r for r, f in zip(rope_t, fam_t)]
        row[f"{name}_s"] = statistics.median(fam_t)
        row[f"rope_{name}_s"] = statistics.median(rope_t)
        row[f"{name}_ratio"] = statistics.median(ratios)
        row[f"{name}_ratios"] = ratios
    return row


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
    rope = small_llama("rope", **shape)
    rows, rope_times = {}, {}
    for family in args.families:
        times = measure(family, rope, args, shape)
        rows[family] = r = row_of(times)
        for name, (rope_t, _) in times.items():
            rope_times.setdefault(name, []).extend(rope_t)
        line = f"{family:13s}"
        for name, label in (
            ("train_step", "train step"),
            ("decode", f"decode {args.decode_len}"),
            ("compiled_decode", "compiled static decode"),
        ):
            if f"{name}_ratio" in r:
                lo, hi = min(r[f"{name}_ratios"]), max(r[f"{name}_ratios"])
                line += f"   {label} {r[f'{name}_ratio']:.2f}x [{lo:.2f}-{hi:.2f}]"
        print(line, flush=True)
    rows = {
        "rope": {
            **{f"{n}_s": statistics.median(t) for n, t in rope_times.items()},
            **{f"{n}_ratio": 1.0 for n in rope_times},
        },
        **rows,
    }
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
        "baseline": "the same Llama with RoPE on HF's sdpa attention, timed beside each family "
        "in alternating order; a ratio is the median of the per-repeat ratios",
        "results": rows,
    }
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
