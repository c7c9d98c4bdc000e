"""Ablations that test the chapters' explanations of T5, FIRE and the clipped offset table.

``python -m relbias.lab ablation {t5,fire,offset,kerple,alibi_probe} [--config medium]
[--seeds ...]`` runs one of them (:func:`run_ablation`); every variant is trained and
evaluated at every length like a method of the extrapolation sweep, for every seed, with
checkpoints and ``--resume``. The result, ``ablation_<which>_<config>.json``, summarises
each variant over seeds (mean and 95 % t-interval per length) and keeps every seed.

``t5``
    T5 buckets with ``max_distance`` (the book's ``dist_max``) at ``m_l/4, m_l/2, m_l,
    2 m_l`` (``dist_max_factors``) for each bucket count in ``buckets``. Where a bucket
    count leaves no logarithmic bucket below ``dist_max`` it is lowered to the largest
    that does, and the variant's name says so. For every run: the learned table per
    bucket (``bucket_table``), the first offset of each bucket, how far the last bucket
    sits above the lowest earlier bucket (``far_above_min``: positive means far keys are
    penalised less than middle ones), and an intervention: the same weights evaluated
    again with the table made non-increasing in distance (``eval_monotone``, each bucket
    lowered to the minimum of the buckets before it). If the non-monotone table is what
    breaks T5 at 16x, ``eval_monotone`` recovers there.
``fire``
    FIRE as in the sweep (``fire``), and FIRE trained with the whole sequence placed at a
    random absolute position ``s`` in ``0 .. max_shift`` at every step (``fire_shift``;
    :attr:`relbias.lab.model.TinyLM.bias_query_shift`), so that training queries reach
    ``i = m_l - 1 + max_shift`` and the MLP sees inputs ``psi(1)/psi(i)`` inside the gap
    ``(0, psi(1)/psi(L))`` that plain training never produces. ``max_shift`` defaults to
    ``(max eval factor - 1) * m_l``: the queries of the longest evaluation. Each run
    records the smallest nonzero MLP input trained (``min_trained_input``) and the one the
    longest evaluation needs, and the learned bias read at query ``16 m_l - 1``. A third
    variant starts the threshold at ``m_l / 4`` (``fire_threshold``, the ratio of Li et
    al.'s 512 for 2,048). Each trained model is evaluated again with the MLP's nonzero
    inputs clamped into the range its training produced (with its final ``c`` and ``L``):
    ``clamp_near`` lifts inputs below the smallest trained one (the gap between the
    diagonal, ``x = 0``, and offset 1 at the largest trained query), ``clamp_far`` lowers
    inputs above the largest trained one (``psi(m_l - 1) / psi(max(L, m_l - 1))``),
    ``clamp_both`` does both. Which clamp repairs the long evaluation tells which
    untrained inputs harm it.
``offset``
    The clipped offset table (``offset``) against NoPE (``nope``): the loss by position
    at the longest length, averaged inside the training length and past it
    (``within_train_len_bpb``, ``past_train_len_bpb``), to measure the remark that the
    clipped table behaves like NoPE past the training length. Each trained table is
    evaluated again with two changes to the offsets it has no parameter for (``>= m_l``),
    nothing else (``interventions``): ``far_min`` gives them the table's minimum per head
    instead of the edge ``u_{m_l-1}`` (far keys no longer favoured over middle ones), and
    ``far_masked`` removes them (a bias of ``MASKED``: every query sees its last ``m_l``
    keys, as in training).
``kerple``
    Learning the rate against learning the shape, one cause per step: ALiBi (``alibi``,
    fixed slopes), Kerple-power started at ALiBi's slopes with ``r2 = 1`` fixed
    (``kerple_power_rate``: ALiBi with learned slopes), and the same with ``r2`` learned
    from 1 (``kerple_power_rate_shape``). A given start draws no random numbers, so the
    three share every other initial weight per seed. Each run records the learned
    ``r1``, ``r2``.
``alibi_probe``
    ALiBi trained on the configured recall probe, and the same weights evaluated with the
    flattest head's slope scaled (``flattest_x0``, ``flattest_x0.5``, ``flattest_x2``) or
    every slope halved (``all_x0.5``): if the probe fails once the penalty outgrows what
    the content score can pay, a smaller slope moves the failure out.

Every intervention is an evaluation of the same trained weights with one thing changed;
the summary holds each one over seeds under ``interventions``.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from relbias.lab.config import Config, get_config
from relbias.lab.data import load_corpus
from relbias.lab.device import pick_device
from relbias.lab.evaluation import evaluate_lengths, evaluate_retrieval
from relbias.lab.experiments import train_and_evaluate, train_and_probe
from relbias.lab.probe import probe_description
from relbias.lab.readback import learned_bias
from relbias.lab.results import check_tag, split_at_train_len
from relbias.lab.stats import interval
from relbias.lab.summaries import (
    summarize_extrapolation,
    summarize_interventions,
    summarize_retrieval,
)
from relbias.lab.sweep import run_sweep

ABLATIONS = ("t5", "fire", "offset", "kerple", "alibi_probe")
DEFAULT_DIST_MAX_FACTORS = (0.25, 0.5, 1.0, 2.0)
DEFAULT_BUCKETS = (32,)
#: The bias that removes a key: its weight is exactly 0 in float32 (exp(-10^4) underflows).
MASKED = -1.0e4
#: ``alibi_probe``: (name, which heads, factor on their slope).
SLOPE_CHANGES = (
    ("flattest_x0", "flattest", 0.0),
    ("flattest_x0.5", "flattest", 0.5),
    ("flattest_x2", "flattest", 2.0),
    ("all_x0.5", "all", 0.5),
)
EVAL_KEYS = ("factor", "length", "bytes", "bpb", "loss_by_position")


def t5_variants(config: Config, dist_max_factors=DEFAULT_DIST_MAX_FACTORS, buckets=DEFAULT_BUCKETS):
    """The T5 variants: ``[{"name", "method", "model_kwargs"}, ...]``."""
    factors = tuple(dist_max_factors)
    if not factors or any(
        isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0 for f in factors
    ):
        raise ValueError(f"dist_max_factors must be numbers > 0, got {dist_max_factors!r}")
    buckets = tuple(buckets)
    if not buckets or any(isinstance(b, bool) or not isinstance(b, int) or b < 2 for b in buckets):
        raise ValueError(f"buckets must be integers >= 2, got {buckets!r}")
    out, seen = [], set()
    for nb in buckets:
        for f in factors:
            dist_max = max(2, round(f * config.train_len))
            used = min(nb, 2 * dist_max - 2)  # causal: nb // 2 exact buckets < dist_max
            name = f"t5_d{dist_max}_b{used}" + (f"_from{nb}" if used != nb else "")
            if name in seen:
                continue
            seen.add(name)
            out.append(
                {
                    "name": name,
                    "method": "t5",
                    "model_kwargs": {
                        "bias_kwargs": {"num_buckets": used, "max_distance": dist_max}
                    },
                    "dist_max_factor": f,
                    "dist_max": dist_max,
                    "num_buckets": used,
                    "num_buckets_asked": nb,
                }
            )
    return out


def fire_variants(config: Config, max_shift: int | None = None):
    """FIRE as in the sweep, FIRE trained with random query shifts up to ``max_shift``, and
    FIRE with its threshold starting at ``m_l / 4``."""
    if max_shift is None:
        max_shift = (max(config.eval_factors) - 1) * config.train_len
    if isinstance(max_shift, bool) or not isinstance(max_shift, int) or max_shift < 1:
        raise ValueError(f"max_shift must be an integer >= 1, got {max_shift!r}")
    threshold = max(1, config.train_len // 4)
    return [
        {"name": "fire", "method": "fire", "model_kwargs": {}, "max_shift": 0},
        {"name": "fire_shift", "method": "fire", "model_kwargs": {}, "max_shift": max_shift},
        {
            "name": "fire_threshold",
            "method": "fire",
            "model_kwargs": {"bias_kwargs": {"L": threshold}},
            "max_shift": 0,
            "threshold": threshold,
        },
    ]


def kerple_variants(config: Config):
    """ALiBi, then Kerple-power from ALiBi's slopes learning the rate, then rate and shape."""
    from relbias.biases.alibi import alibi_slopes

    start = {"r1_init": alibi_slopes(config.heads).tolist(), "r2_init": 1.0, "eps": 1e-3}
    return [
        {"name": "alibi", "method": "alibi", "model_kwargs": {}},
        {
            "name": "kerple_power_rate",
            "method": "kerple_power",
            "model_kwargs": {"bias_kwargs": {**start, "learn_r2": False}},
        },
        {
            "name": "kerple_power_rate_shape",
            "method": "kerple_power",
            "model_kwargs": {"bias_kwargs": {**start, "learn_r2": True}},
        },
    ]


def offset_variants(config: Config):
    """The clipped offset table and NoPE."""
    return [
        {"name": "offset", "method": "offset", "model_kwargs": {}},
        {"name": "nope", "method": "nope", "model_kwargs": {}},
    ]


def variants_for(which: str, config: Config, *, variants=None, **options) -> list[dict]:
    """The variants of ablation ``which`` (one of :data:`ABLATIONS`); ``variants``: the names
    to keep (default all)."""
    if which == "t5":
        out = t5_variants(config, **options)
    elif which == "fire":
        out = fire_variants(config, **options)
    elif which in ("offset", "kerple", "alibi_probe"):
        if options:
            raise ValueError(f"the {which} ablation takes no options, got {sorted(options)}")
        if which == "offset":
            out = offset_variants(config)
        elif which == "kerple":
            out = kerple_variants(config)
        else:
            out = [{"name": "alibi", "method": "alibi", "model_kwargs": {}}]
    else:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {which!r}")
    if variants is None:
        return out
    names = [v["name"] for v in out]
    unknown = [v for v in variants if v not in names]
    if unknown or not variants:
        raise ValueError(f"variants must name some of {names}, got {list(variants)!r}")
    return [v for v in out if v["name"] in variants]


def shift_at(seed: int, step: int, max_shift: int) -> int:
    """The query shift of training step ``step``: uniform in ``0..max_shift``, a function of
    ``(seed, step)`` alone, so that a resumed run draws the same shifts."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return int(torch.randint(0, max_shift + 1, (1,), generator=gen))


def _eval_rows(model, config: Config, corpus, factors=None, device=None) -> list[dict]:
    rows = evaluate_lengths(model, corpus.val, config, factors=factors, device=device)
    return [{k: r[k] for k in EVAL_KEYS} for r in rows]


def within_and_past(row: dict, train_len: int) -> dict:
    """Mean loss of one evaluation row inside the training length and past it."""
    return {"length": row["length"], **split_at_train_len(row["loss_by_position"], train_len)}


def far_buckets_to_min(table: torch.Tensor) -> torch.Tensor:
    """A bucket table (heads x buckets) with every bucket past each head's minimum set to
    that minimum (the first minimum where several tie); the near buckets are unchanged."""
    table = torch.as_tensor(table)
    out = table.clone()
    for h, b in enumerate(table.argmin(dim=1).tolist()):
        out[h, b + 1 :] = table[h, b]
    return out


@torch.no_grad()
def t5_details(model, config: Config, corpus, factors=None, device=None) -> dict:
    """Read back a trained T5 model's table and evaluate it with two changed tables.

    ``eval_monotone``: every bucket lowered to the minimum of the buckets before it (this
    also flattens the nearest buckets wherever offset 0 is not the largest).
    ``interventions["far_to_min"]``: only the buckets past each head's minimum set to that
    minimum (the near buckets, up to the minimum, unchanged).
    """
    bias = model.bias_modules()[0]
    table = bias.weight.detach().float().cpu()
    longest = max(config.eval_factors if factors is None else factors) * config.train_len
    buckets = bias.buckets(torch.arange(longest))
    first_offset = [int((buckets == b).nonzero()[0]) for b in buckets.unique().tolist()]
    far_above_min = (table[:, -1] - table[:, :-1].min(dim=1).values).tolist()
    saved = bias.weight.detach().clone()
    lowest = saved.argmin(dim=1)
    far_to_min = far_buckets_to_min(saved)
    try:
        bias.weight.copy_(torch.cummin(saved, dim=1).values)
        monotone = _eval_rows(model, config, corpus, factors, device)
        bias.weight.copy_(far_to_min)
        far = _eval_rows(model, config, corpus, factors, device)
    finally:
        bias.weight.copy_(saved)
    return {
        "bucket_table": [[round(v, 5) for v in row] for row in table.tolist()],
        "bucket_first_offset": first_offset,
        "far_above_min": [round(v, 5) for v in far_above_min],
        "eval_monotone": monotone,
        "interventions": {
            "far_to_min": {
                "eval": far,
                "min_bucket": lowest.tolist(),
                "changed": far_to_min.ne(saved).sum().item(),
            }
        },
    }


def fire_trained_range(bias, train_len: int, max_shift: int = 0) -> tuple[float, float]:
    """The smallest nonzero and the largest MLP input a training run produced, with the
    module's current ``c`` and ``L``: offset 1 at the farthest trained query
    (``m_l - 1 + max_shift``), and offset ``m_l - 1`` at query ``m_l - 1``."""
    with torch.no_grad():
        L = float(bias.L)

        def x(offset: int, query: int) -> float:
            psi = bias.psi(torch.tensor([float(offset), float(max(L, query))]))
            return float(psi[0] / (psi[1] + bias.eps))

        return x(1, train_len - 1 + max_shift), x(train_len - 1, train_len - 1)


class ClampedFIRE(nn.Module):
    """Evaluation only: a trained FIRE whose nonzero MLP inputs are clamped into
    ``[low, high]`` (the diagonal, input 0, is left alone). Its :meth:`prepare` returns
    the dense bias, which :func:`relbias.biased_attention` takes as it is."""

    def __init__(self, fire, low: float, high: float):
        super().__init__()
        if not 0 < low <= high:
            raise ValueError(f"need 0 < low <= high, got low={low}, high={high}")
        self.fire, self.low, self.high = fire, low, high

    def prepare(self, q_len, k_len=None, *, q_start=None) -> torch.Tensor:
        x = self.fire.normalized_input(q_len, k_len, q_start=q_start)
        x = torch.where(x > 0, x.clamp(self.low, self.high), x)
        return self.fire.mlp(x).permute(2, 0, 1)


@torch.no_grad()
def fire_details(
    model, config: Config, max_shift: int, corpus=None, factors=None, device=None
) -> dict:
    """FIRE's trained input range against the one the longest evaluation needs, and (with
    ``corpus``) the evaluation with the inputs clamped into the trained range."""
    bias = model.bias_modules()[0]
    longest = max(config.eval_factors if factors is None else factors) * config.train_len
    c = float(bias.c.detach().abs())
    L = float(bias.L.detach())
    low, high = fire_trained_range(bias, config.train_len, max_shift)
    query = longest - 1
    read = learned_bias(model, max_offset=2 * config.train_len - 1, query_position=query)
    out = {
        "c": round(c, 5),
        "L": round(L, 3),
        "max_shift": max_shift,
        "min_trained_input": round(low, 5),
        "max_trained_input": round(high, 5),
        "min_eval_input": round(fire_trained_range(bias, longest, 0)[0], 5),
        "bias_at_longest_query": {
            "query_position": query,
            "values": [[round(v, 5) for v in row] for row in read.tolist()],
        },
    }
    if corpus is not None:
        out["interventions"] = {}
        for name, lo, hi in (
            ("clamp_near", low, max(1.0, high)),
            ("clamp_far", 1e-12, high),
            ("clamp_both", low, high),
        ):
            changed = copy.deepcopy(model)
            changed.bias = ClampedFIRE(changed.bias, min(lo, hi), hi)
            out["interventions"][name] = {
                "eval": _eval_rows(changed, config, corpus, factors, device),
                "range": [lo, hi],
            }
    return out


def offset_details(record: dict, config: Config) -> dict:
    """Mean loss at the longest length inside and past the training length."""
    return within_and_past(record["eval"][-1], config.train_len)


@torch.no_grad()
def offset_interventions(model, config: Config, corpus, factors=None, device=None) -> dict:
    """The trained table evaluated with the offsets it has no parameter for (``>= m_l``)
    reading the table's minimum per head (``far_min``) or masked (``far_masked``)."""
    table = model.bias_modules()[0].weight.detach()
    far_values = {
        "far_min": table.min(dim=1).values,
        "far_masked": torch.full_like(table[:, 0], MASKED),
    }
    out = {}
    for name, value in far_values.items():
        changed = copy.deepcopy(model)
        for bias in changed.bias_modules():
            bias.weight = nn.Parameter(torch.cat([bias.weight.detach(), value[:, None]], 1))
            bias.max_offset += 1
        rows = _eval_rows(changed, config, corpus, factors, device)
        out[name] = {
            "eval": rows,
            "far_value": [round(v, 5) for v in value.tolist()],
            **within_and_past(rows[-1], config.train_len),
        }
    return {
        "edge_above_min": [round(v, 5) for v in (table[:, -1] - table.min(dim=1).values).tolist()],
        "interventions": out,
    }


@torch.no_grad()
def kerple_details(model) -> dict:
    """The learned Kerple parameters (nothing for ALiBi)."""
    bias = model.bias_modules()[0]
    if not hasattr(bias, "r2"):
        return {}
    return {
        "r1": [round(v, 6) for v in bias.r1.tolist()],
        "r2": [round(v, 6) for v in bias.r2.tolist()],
    }


@torch.no_grad()
def alibi_probe_interventions(model, config: Config, factors=None, device=None) -> dict:
    """The probe evaluated again with the slopes of :data:`SLOPE_CHANGES`."""
    bias = model.bias_modules()[0]
    saved = bias.slopes.clone()
    out = {}
    try:
        for name, heads, factor in SLOPE_CHANGES:
            changed = saved.clone()
            if heads == "flattest":
                changed[saved.argmin()] *= factor
            else:
                changed *= factor
            bias.slopes.copy_(changed)
            rows = []
            for f in factors or config.probe_eval_factors:
                rows += evaluate_retrieval(
                    model, config, seq_len=f * config.train_len, device=device
                )
            out[name] = {"eval": rows, "slopes": changed.tolist()}
    finally:
        bias.slopes.copy_(saved)
    return {"interventions": out}


def run_ablation(
    which: str,
    config: Config | None = None,
    *,
    seeds=(0,),
    device=None,
    progress: bool = True,
    factors=None,
    verbose: bool = True,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
    variants=None,
    tag: str | None = None,
    **options,
) -> dict:
    """Run ablation ``which`` for every variant and seed through the sweep runner
    (:func:`relbias.lab.sweep.run_sweep`); returns the results.

    ``options``: ``dist_max_factors``, ``buckets`` (t5); ``max_shift`` (fire).
    ``variants``: the variant names to run (default all); ``tag`` names the file
    ``ablation_<which>_<config>_<tag>.json``.
    """
    tag = check_tag(tag)
    config = config or get_config()
    chosen = {v["name"]: v for v in variants_for(which, config, variants=variants, **options)}
    probe = which == "alibi_probe"
    corpus = None if probe else load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=verbose)

    def run_one(name, seed, train_kwargs):
        v = chosen[name]
        cfg = config.replace(seed=seed)
        shift = v.get("max_shift", 0)
        if shift:
            last = cfg.steps - 1
            train_kwargs = {
                **train_kwargs,
                "before_step": lambda step, model: setattr(
                    model, "bias_query_shift", shift_at(seed, step, shift)
                ),
                # after the last step the model is evaluated: from position 0, like every
                # other model (no training shift left behind)
                "after_step": lambda step, model: (
                    setattr(model, "bias_query_shift", 0) if step == last else None
                ),
            }
        common = {
            "device": device,
            "progress": progress,
            "factors": factors,
            "model_kwargs": v["model_kwargs"],
            "train_kwargs": train_kwargs,
        }
        if probe:
            model, record = train_and_probe(v["method"], cfg, **common)
            record.update(alibi_probe_interventions(model, cfg, factors, device))
            return record
        model, record = train_and_evaluate(v["method"], cfg, corpus=corpus, **common)
        model.bias_query_shift = 0
        if which == "t5":
            record.update(t5_details(model, cfg, corpus, factors, device))
        elif which == "fire":
            record.update(fire_details(model, cfg, shift, corpus, factors, device))
        elif which == "kerple":
            record.update(kerple_details(model))
        elif name == "offset":
            record.update(offset_details(record, cfg))
            record.update(offset_interventions(model, cfg, corpus, factors, device))
        else:
            record.update(offset_details(record, cfg))
        return record

    summarize = summarize_retrieval if probe else summarize_extrapolation
    results = run_sweep(
        "ablation",
        config,
        list(chosen),
        seeds,
        run_one,
        lambda per_seed: _ablation_summary(per_seed, summarize),
        device=device,
        identity_extra={"ablation": which, "factors": factors, "options": options},
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_seconds=checkpoint_seconds,
        checkpoint_every=checkpoint_every,
        verbose=verbose,
    )
    results["ablation"] = which
    for name, v in chosen.items():
        results["methods"][name]["variant"] = {k: val for k, val in v.items() if k != "name"}
    if probe:
        results["probe"] = probe_description(config)
    else:
        results["corpus"] = corpus.describe(with_files=False)
    if tag is not None:
        results["tag"] = tag
    return results


def _ablation_summary(per_seed: dict, summarize) -> dict:
    """A variant's summary over seeds: the plain one, T5's monotone evaluation, the
    interval of the per-seed numbers (inside and past the training length) and every
    intervention (:func:`~relbias.lab.summaries.summarize_interventions`)."""
    summary = summarize(per_seed)
    records = list(per_seed.values())
    if "eval_monotone" in records[0]:
        mono = {s: {**r, "eval": r["eval_monotone"]} for s, r in per_seed.items()}
        summary["eval_monotone"] = summarize_extrapolation(mono)["eval"]
    for key in ("within_train_len_bpb", "past_train_len_bpb"):
        if key in records[0]:
            summary[key] = interval([r[key] for r in records])
    interventions = summarize_interventions(per_seed, summarize)
    if interventions:
        summary["interventions"] = interventions
    return summary
