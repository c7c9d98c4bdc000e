"""How much the sliding reading's stride changes the context-use measure.

The stored sweeps read each byte past ``m_l`` with a sliding window of stride ``m_l / 8`` (so
with 112 to 127 bytes of context for ``m_l = 128``); stride 1 gives every such byte exactly
``m_l - 1`` bytes, at 16 times the cost. This reads the first ``--spans`` evaluation spans of
stored models (``--weights`` files) both ways and prints the long reading, both sliding
readings and their differences on the bytes past ``m_l``::

    python scripts/context_stride.py --spans 8 \\
        relbias/lab/results/weights/extrapolation_medium_a/alibi_seed0.pt.xz \\
        relbias/lab/results/weights/extrapolation_medium_a/kerple_power_seed0.pt.xz \\
        relbias/lab/results/weights/extrapolation_medium_b/nope_seed0.pt.xz
"""

from __future__ import annotations

import argparse
import sys

import torch

from relbias.lab.context import sliding_loss, span_loss
from relbias.lab.data import load_corpus, spread_eval_windows
from relbias.lab.evaluation import default_context_stride
from relbias.lab.weights import load_weights


def compare(model, spans: int) -> dict:
    """The three readings of ``model``'s first ``spans`` evaluation spans, past ``m_l``."""
    cfg = model.lab_config
    longest = max(cfg.eval_factors) * cfg.train_len
    corpus = load_corpus(max_bytes=cfg.corpus_bytes)
    x, y, _ = spread_eval_windows(corpus.val, longest, cfg.eval_tokens, span_len=longest)
    x, y = x[:spans], y[:spans]
    window, stride = cfg.train_len, default_context_stride(cfg.train_len)
    with torch.no_grad():
        long = span_loss(model, x, y)[:, window:].mean().item()
        coarse = sliding_loss(model, x, y, window=window, stride=stride)[:, window:].mean().item()
        fine = sliding_loss(model, x, y, window=window, stride=1)[:, window:].mean().item()
    return {"long": long, f"stride {stride}": coarse, "stride 1": fine, "stride": stride}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weights", nargs="+", help="stored weights files (relbias.lab.weights)")
    parser.add_argument("--spans", type=int, default=8, help="how many spans (default 8)")
    args = parser.parse_args(argv)
    for path in args.weights:
        model = load_weights(path)
        r = compare(model, args.spans)
        coarse = r[f"stride {r['stride']}"]
        print(
            f"{model.lab_method}: long {r['long']:.4f}, stride {r['stride']} {coarse:.4f}, "
            f"stride 1 {r['stride 1']:.4f}; long - stride {r['stride']}: "
            f"{r['long'] - coarse:+.4f}, long - stride 1: {r['long'] - r['stride 1']:+.4f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
