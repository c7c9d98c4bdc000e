"""What a trained model's positional bias or forget gate learned, read back.

- :func:`learned_bias`: PE at each offset, for any bias module or a TinyLM (the one read-back
  by offset); :func:`bias_readback`: the table every result record stores;
- :func:`gate_readback`: a forget-gate model's gates on given tokens;
- :func:`far_penalty`, :func:`edge_above_min`, :func:`gate_summary`: those read-backs of a
  stored sweep, over seeds (the chapters' readings of the offset table, T5's buckets and
  the gates).
"""

from __future__ import annotations

import math

import torch

from relbias.lab.config import Config
from relbias.lab.model import TinyLM
from relbias.lab.stats import interval

__all__ = [
    "bias_readback",
    "edge_above_min",
    "far_penalty",
    "gate_readback",
    "gate_summary",
    "learned_bias",
]


@torch.no_grad()
def learned_bias(
    model_or_bias,
    max_offset: int,
    *,
    min_offset: int = 0,
    query_position: int | None = None,
    layer: int = 0,
) -> torch.Tensor:
    """PE at offsets ``min_offset .. max_offset`` for each head, as a float32 CPU tensor
    ``[num_heads, max_offset - min_offset + 1]``: the one read-back of a bias by offset.

    ``model_or_bias`` is any :class:`~relbias.RelativeBias` (learned or fixed) or a
    :class:`TinyLM` with a bias (its shared module, or layer ``layer``'s when biases are
    per layer). Offset-only families give their offset table
    (:meth:`~relbias.RelativeBias.offset_table`). FIRE depends on the query position
    too: it is read at query position ``query_position`` (default ``max_offset``, which
    must be ``>= max_offset``) against keys ``query_position - offset``, so its offsets
    are those of keys at or before the query (``0 <= min_offset``).
    """
    from relbias import RelativeBias

    bias = model_or_bias
    if isinstance(model_or_bias, TinyLM):
        modules = model_or_bias.bias_modules()
        if not modules:
            raise ValueError(f"position {model_or_bias.position!r} has no additive bias to read")
        if not 0 <= layer < len(modules):
            raise ValueError(f"layer must be in 0..{len(modules) - 1}, got {layer}")
        bias = modules[layer]
    if not isinstance(bias, RelativeBias):
        raise TypeError(f"expected a TinyLM or RelativeBias, got {type(bias).__name__}")
    for name, value in (("min_offset", min_offset), ("max_offset", max_offset)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{name} must be an integer, got {value!r}")
    if not min_offset <= max_offset:
        raise ValueError(f"need min_offset <= max_offset, got {min_offset} and {max_offset}")
    if bias.offset_only:
        return bias.offset_table(min_offset, max_offset).float().cpu()
    if min_offset < 0:
        raise ValueError(f"{type(bias).__name__} reads offsets >= 0 only, got {min_offset}")
    i = max_offset if query_position is None else query_position
    if i < max_offset:
        raise ValueError(f"query_position ({i}) must be >= max_offset ({max_offset})")
    row = bias(1, i + 1, q_start=i)[:, 0, :]  # keys j = 0..i, offsets i..0
    return row.flip(-1)[:, min_offset : max_offset + 1].float().cpu()


def bias_readback(model, config: Config) -> dict | None:
    """The learned bias at offsets 0..2*train_len-1 (FIRE: query at 2*train_len-1)."""
    if not model.uses_bias:
        return None
    max_offset = 2 * config.train_len - 1
    table = learned_bias(model, max_offset)
    return {
        "max_offset": max_offset,
        "query_position": max_offset,
        "module": repr(model.bias_modules()[0]),
        "values": [[round(v, 5) for v in row] for row in table.tolist()],
    }


def gate_readback(model, idx: torch.Tensor, distance: int | None = None) -> dict:
    """What a forget-gate model's gates learned, read on the token ids ``idx`` ``[batch, len]``.

    Per layer and head (lists ``[layers][heads]``): the mean :math:`\\log f_t` over the
    tokens and its 10 %, 50 % and 90 % quantiles; with ``distance`` also the mean bias
    the gates put between the last position and the token ``distance`` back (the sum of
    :math:`\\log f_t` over the last ``distance`` tokens: the probe's far key).
    """
    log_f = model.gate_log_forget(idx).double()  # [layers, batch, heads, len]
    per_head = log_f.permute(0, 2, 1, 3).flatten(2)  # [layers, heads, tokens]
    qs = torch.quantile(per_head, torch.tensor([0.1, 0.5, 0.9], dtype=torch.float64), dim=-1)

    def rounded(t):
        return [[round(v, 5) for v in row] for row in t.tolist()]

    out = {
        "module": repr(model.gates()[0]),
        "tokens": idx.numel(),
        "mean_log_forget": rounded(per_head.mean(-1)),
        "log_forget_quantiles": {q: rounded(qs[i]) for i, q in enumerate(("0.1", "0.5", "0.9"))},
    }
    if distance is not None:
        if not 1 <= distance < idx.shape[1]:
            raise ValueError(f"distance must be in 1..{idx.shape[1] - 1}, got {distance}")
        out["distance"] = distance
        out["bias_at_distance"] = rounded(log_f[..., -distance:].sum(-1).mean(1))
    return out


def gate_summary(results: dict, method: str) -> dict:
    """What ``method``'s forget gates learned, over seeds (the records' ``learned_gate``):
    ``mean_log_forget`` (the mean of :math:`\\log f_t` over seeds, layers, heads and
    tokens), ``half_life`` (``ln 2`` over its negative, in tokens), ``most_open`` (the
    head mean closest to 0) and, on probe sequences, ``bias_at_distance`` (the mean
    bias the gates put on the answer, ``distance`` back; ``least_bias``, the head closest
    to 0; ``least_bias_per_run``, that head's bias in each seed's run)."""
    seeds = results["methods"][method].get("seeds", {})
    gates = [rec["learned_gate"] for rec in seeds.values() if rec.get("learned_gate")]
    if not gates:
        raise ValueError(f"{method} has no gate read-back in these results")

    def flat(key):
        return [v for g in gates for row in g[key] for v in row]

    heads = flat("mean_log_forget")
    mean = sum(heads) / len(heads)
    out = {
        "seeds": len(gates),
        "mean_log_forget": mean,
        "half_life": math.log(2) / -mean if mean < 0 else math.inf,
        "most_open": max(heads),
    }
    if "bias_at_distance" in gates[0]:
        bias = flat("bias_at_distance")
        out.update(
            distance=gates[0]["distance"],
            bias_at_distance=sum(bias) / len(bias),
            least_bias=max(bias),
            least_bias_per_run=[max(max(row) for row in g["bias_at_distance"]) for g in gates],
        )
    return out


def far_penalty(results: dict, method: str) -> dict:
    """How hard ``method``'s learned table (the records' ``learned_bias``: one row per head,
    offsets 0 to the farthest read back) penalises the farthest offset, over seeds: the
    per-seed mean over heads of the farthest offset's bias minus the head's largest
    (``mean``, ``low``, ``high``: 0 is no penalty at all), and ``lowest_far`` (heads, over
    all seeds, whose farthest offset has their lowest bias: a table falling to the end)
    of ``heads``."""
    seeds = results["methods"][method].get("seeds", {})
    tables = [rec["learned_bias"]["values"] for rec in seeds.values() if rec.get("learned_bias")]
    if not tables:
        raise ValueError(f"{method} has no learned-bias read-back in these results")
    per_seed = [sum(row[-1] - max(row) for row in t) / len(t) for t in tables]
    rows = [row for t in tables for row in t]
    return {
        **interval(per_seed),
        "lowest_far": sum(row[-1] <= min(row) for row in rows),
        "heads": len(rows),
        "offset": len(rows[0]) - 1,
    }


def edge_above_min(results: dict, method: str = "offset", offset: int | None = None) -> dict:
    """How far a learned table's value at ``offset`` sits above the table's minimum up to
    that offset, per head and seed, from the records' read-back (``learned_bias``, offsets
    0 onwards). The default offset is the clipped offset table's edge ``u_{m_l-1}``, the
    value every farther offset reads; for T5 pass the farthest offset read back (``-1``).
    Returns ``values`` (every head of every seed), ``least`` and ``most`` (their range over
    heads and seeds: read-back values, not an interval),
    ``above`` (heads whose value lies above the minimum: those keys favoured over the
    middle ones) of ``heads``, and ``below_max``, the range of the value minus the table's
    largest."""
    if offset is None:
        offset = results["provenance"]["config"]["train_len"] - 1
    values, below = [], []
    for rec in results["methods"][method]["seeds"].values():
        for row in rec["learned_bias"]["values"]:
            table = row[: offset + 1] if offset >= 0 else row[: len(row) + offset + 1]
            values.append(table[-1] - min(table))
            below.append(table[-1] - max(table))
    return {
        "values": values,
        "least": min(values),
        "most": max(values),
        "above": sum(v > 0 for v in values),
        "heads": len(values),
        "below_max": (min(below), max(below)),
    }
