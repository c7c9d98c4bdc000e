"""Why does every model read positions 1,024-2,047 of a 2,048-byte window worse than
positions 512-1,023? The content at those positions, the file boundaries, or the model.
(For a sweep's longest window of ``L`` bytes: positions ``L/2 .. L-1`` against ``L/4 .. L/2-1``.)

Each cause is changed alone, on the stored weights of a sweep (``--weights``, one seed):

- **the model's use of a long context**: the same bytes read by the sliding window of the
  training length (``relbias.lab.context``: every byte with at most ``m_l - 1`` bytes of
  context). If the later positions still read worse, the long context is not the cause;
- **file boundaries**: the same readings over only the spans that hold no boundary between
  two validation files from position 512 (``L/4``) on;
- **the content, with no trained model at all**: a byte bigram model counted on the training
  split (add-one smoothing) reads the same positions. If it too finds the later positions
  harder, the text there is harder.

Writes one JSON file (``--out``) with, per method and position range, the mean bits per
byte of each reading, and the provenance (commit, command). Usage::

    python scripts/span_content.py --weights relbias/lab/results/weights/extrapolation_medium_a \
        relbias/lab/results/weights/extrapolation_medium_b --seed 0 \
        --out relbias/lab/results/span_content_medium.json
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from relbias._json import write_json
from relbias.lab.config import Config
from relbias.lab.context import sliding_loss, span_loss
from relbias.lab.data import load_corpus, spread_eval_windows
from relbias.lab.evaluation import default_context_stride
from relbias.lab.results import provenance
from relbias.lab.weights import load_weights


def position_ranges(longest: int) -> tuple:
    """The two ranges compared: ``[L/4, L/2)`` and ``[L/2, L)`` of a window of ``L`` bytes."""
    return ((longest // 4, longest // 2), (longest // 2, longest))


def eval_spans(config: Config, corpus):
    """The spans of the longest evaluation length, as ``evaluate_lengths`` reads them, and
    whether each holds a file boundary from position ``L/4`` on."""
    longest = max(config.eval_factors) * config.train_len
    x, y, starts = spread_eval_windows(corpus.val, longest, config.eval_tokens, span_len=longest)
    offsets = torch.tensor(corpus.split_offsets("val"))
    pos = starts[:, None] + torch.arange(longest + 1)
    file_of = torch.searchsorted(offsets, pos, right=True) - 1
    first = longest // 4
    crossing = (file_of[:, first:] != file_of[:, first : first + 1]).any(1)
    return x, y, crossing


def bigram_bits(train: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Bits of each target under a byte bigram model counted on ``train`` (add-one)."""
    counts = torch.ones(256, 256, dtype=torch.float64)
    prev, nxt = train[:-1].long(), train[1:].long()
    counts.index_put_((prev, nxt), torch.ones(prev.numel(), dtype=torch.float64), accumulate=True)
    logp = counts.log() - counts.sum(1, keepdim=True).log()
    return -logp[x, y] / math.log(2)


def by_range(bits: torch.Tensor, keep: torch.Tensor | None = None) -> dict:
    rows = bits if keep is None else bits[keep]
    ranges = position_ranges(bits.shape[1])
    return {f"{a}-{b - 1}": round(float(rows[:, a:b].mean()), 4) for a, b in ranges}


def read(models: dict, config: Config, corpus) -> dict:
    """Every reading of :func:`position_ranges` for each model of ``models``
    (``{method: model}``)."""
    x, y, crossing = eval_spans(config, corpus)
    clean = ~crossing
    out = {
        "spans": int(x.shape[0]),
        "spans_without_boundary": int(clean.sum()),
        "bigram": {"all": by_range(bigram_bits(corpus.train, x, y))},
        "methods": {},
    }
    out["bigram"]["without_boundary"] = by_range(bigram_bits(corpus.train, x, y), clean)
    stride = default_context_stride(config.train_len)
    for method, model in models.items():
        long = span_loss(model, x, y, batch_size=config.eval_batch_size)
        sliding = sliding_loss(model, x, y, window=config.train_len, stride=stride)
        out["methods"][method] = {
            "long": by_range(long),
            "sliding": by_range(sliding),
            "long_without_boundary": by_range(long, clean),
            "sliding_without_boundary": by_range(sliding, clean),
        }
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", nargs="+", required=True, help="weights folders of a sweep")
    parser.add_argument("--seed", type=int, default=0, help="which seed's models (default 0)")
    parser.add_argument("--out", required=True, help="the JSON file to write")
    args = parser.parse_args(argv)
    paths = sorted(
        p for folder in args.weights for p in Path(folder).glob(f"*_seed{args.seed}.pt*")
    )
    if not paths:
        parser.error(f"no weights of seed {args.seed} in {args.weights}")
    models = {}
    for path in paths:
        model = load_weights(path)
        models[model.lab_method] = model
    config = next(iter(models.values())).lab_config
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    with torch.no_grad():  # not torch.set_grad_enabled(False): main() is also called in tests
        result = read(models, config, corpus)
    result["provenance"] = provenance(config.replace(seed=args.seed), torch.device("cpu"))
    write_json(result, args.out)
    for method, row in result["methods"].items():
        print(f"{method:13s} long {row['long']}  sliding {row['sliding']}")
    print(f"bigram (no model) {result['bigram']['all']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
