"""A short demo of every bias family: ``python -m relbias.demo`` prints PE(i, j) by offset."""

from __future__ import annotations

import torch

from relbias.biases.registry import BIAS_NAMES, make_bias

DEMO_KWARGS = {"offset": {"max_offset": 15}}


def bias_by_offset(name: str, num_heads: int = 4, offsets=(0, 1, 2, 4, 8, 16, 64)) -> torch.Tensor:
    """PE of head 0 for a query at position max(offsets) and keys at the given offsets back."""
    torch.manual_seed(0)
    bias = make_bias(name, num_heads, **DEMO_KWARGS.get(name, {}))
    query = max(offsets)
    with torch.no_grad():
        row = bias(1, query + 1)[0, 0]
    return torch.stack([row[query - o] for o in offsets])


def main() -> None:
    offsets = (0, 1, 2, 4, 8, 16, 64)
    header = f"{'family':<14}" + "".join(f"{'i-j=' + str(o):>10}" for o in offsets)
    print("PE(i, j) of head 0 (4 heads; learnable families at their seeded initialisation)")
    print(header)
    print("-" * len(header))
    for name in BIAS_NAMES:
        values = bias_by_offset(name, offsets=offsets)
        print(f"{name:<14}" + "".join(f"{v + 0.0:>10.4f}" for v in values.tolist()))


if __name__ == "__main__":
    main()
