"""The interpolation experiment: RoPE trained at ``m_l``, read at 2x..16x with every scaling.

``python -m relbias.lab interpolation [--seeds 0 1 2] [--out DIR]`` runs it.
For each seed:

1. train a RoPE :class:`~relbias.lab.model.TinyLM` at the training length ``m_l``
   (the configuration's ``train_len``, 64 in ``quick``);
2. **zero-shot**: evaluate bits per byte at every length ``m = f m_l`` of the
   configuration's ``eval_factors``, with no scaling and with each scaling of
   :data:`SCALINGS` set for that length (``s = f``; dynamic NTK reads the length itself);
3. **fine-tuned**: from a copy of the trained model, train ``steps`` more steps on
   sequences of ``finetune_factor * m_l`` tokens with each scaling set for that length
   (``steps`` in ``finetune_steps``, each a separate short run from the trained model),
   and evaluate again at every length with the scaling fixed at ``finetune_factor``.

Fine-tuning keeps the tokens per step of pre-training (batch ``batch_size /
finetune_factor`` sequences), uses a tenth of the peak learning rate, with the training
loop's warm-up and cosine decay; ``100`` steps are a tenth of the quick pre-training.
Dynamic NTK is evaluated zero-shot only: at the fine-tuning length it *is* NTK.

Two variants each change one thing: ``yarn_no_temp`` is YaRN with its attention
temperature off (attention factor 1: the ramp alone, which separates YaRN's two changes
from NTK), and the fine-tuning variant ``linear_lr10`` fine-tunes linear interpolation at
the full peak learning rate, ten times the others' (:data:`FINETUNE_VARIANTS`).

The result (:func:`run_interpolation`) holds every run, a summary (mean and 95 %
Student-t interval over seeds per variant and length, :func:`relbias.lab.stats.interval`)
and the provenance; the stored copy is ``relbias/lab/results/interpolation_quick.json``.
"""

from __future__ import annotations

import copy

from relbias.lab.config import Config, get_config
from relbias.lab.data import load_corpus
from relbias.lab.device import pick_device, seed_everything
from relbias.lab.evaluation import evaluate_lengths
from relbias.lab.stats import interval
from relbias.lab.sweep import run_sweep
from relbias.lab.training import build_model, train_lm
from relbias.rotary import RopeScaling

SCALINGS = ("none", "linear", "ntk", "dynamic", "yarn", "yarn_no_temp")
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_FINETUNE_STEPS = (25, 50, 100)
DEFAULT_FINETUNE_FACTOR = 4
FINETUNE_LR_FRACTION = 0.1
#: Fine-tuning runs: name -> (scaling, fraction of the pre-training's peak learning rate).
FINETUNE_VARIANTS = {
    "none": ("none", FINETUNE_LR_FRACTION),
    "linear": ("linear", FINETUNE_LR_FRACTION),
    "ntk": ("ntk", FINETUNE_LR_FRACTION),
    "yarn": ("yarn", FINETUNE_LR_FRACTION),
    "yarn_no_temp": ("yarn_no_temp", FINETUNE_LR_FRACTION),
    "linear_lr10": ("linear", 10 * FINETUNE_LR_FRACTION),
}
FINETUNED_SCALINGS = tuple(FINETUNE_VARIANTS)


def scaling_for(name: str, factor: float, train_len: int) -> RopeScaling | None:
    """The scaling ``name`` of :data:`SCALINGS` set to read ``factor`` times ``train_len``.

    ``none``: plain RoPE; ``linear``, ``ntk``, ``yarn``: ``s = factor``; ``dynamic``:
    factor 1, so that the base follows the book's ``(m / m_l)^{d/(d-2)}`` with ``m`` the
    length being read; ``yarn_no_temp``: YaRN with attention factor 1 (no temperature).
    """
    if name not in SCALINGS:
        raise ValueError(f"scaling must be one of {SCALINGS}, got {name!r}")
    if name == "none":
        return None
    if name == "dynamic":
        return RopeScaling("dynamic", 1.0, original_len=train_len)
    if name == "yarn_no_temp":
        return RopeScaling("yarn", float(factor), original_len=train_len, attention_factor=1.0)
    return RopeScaling(name, float(factor), original_len=train_len)


def _bpb_rows(rows, keep_positions: bool = False) -> list[dict]:
    """The rows an interpolation result keeps: length, bits per byte, each span's mean and
    the context-use measure (without its sliding loss by position)."""
    keys = ("factor", "length", "bpb", "bpb_by_span", "context")
    keys += ("loss_by_position",) if keep_positions else ()
    out = []
    for r in rows:
        row = {k: round(r[k], 5) if k == "bpb" else r[k] for k in keys if k in r}
        if "context" in row:
            row["context"] = {
                k: v for k, v in row["context"].items() if k != "sliding_loss_by_position"
            }
        out.append(row)
    return out


def zero_shot(
    model, corpus_val, config: Config, scalings=SCALINGS, device=None, keep_positions=False
) -> dict:
    """Bits per byte at every length with each scaling set for that length, no training.

    Returns ``{scaling: [{"factor", "length", "bpb"}, ...]}`` (with ``keep_positions``
    also ``"loss_by_position"``); the model is left with no scaling.
    """
    out = {}
    for name in scalings:
        rows = []
        for factor in config.eval_factors:
            model.rope_scaling = scaling_for(name, factor, config.train_len)
            rows += evaluate_lengths(
                model,
                corpus_val,
                config,
                factors=(factor,),
                device=device,
                span_factor=max(config.eval_factors),
            )
        out[name] = _bpb_rows(rows, keep_positions)
    model.rope_scaling = None
    return out


def finetune(
    model, corpus, config: Config, name: str, steps: int, *, factor: int, device=None
) -> tuple[object, dict]:
    """A copy of ``model`` trained ``steps`` steps at ``factor * m_l``: the fine-tuning
    variant ``name`` of :data:`FINETUNE_VARIANTS` (a scaling and a learning rate).

    Returns ``(model, record)``: the record has the training summary and the bits per
    byte at every evaluation length (the scaling fixed for ``factor``).
    """
    if name not in FINETUNE_VARIANTS:
        raise ValueError(f"fine-tuning variant must be one of {FINETUNED_SCALINGS}, got {name!r}")
    scaling, lr_fraction = FINETUNE_VARIANTS[name]
    tuned = copy.deepcopy(model)
    tuned.rope_scaling = scaling_for(scaling, factor, config.train_len)
    long = config.replace(
        train_len=factor * config.train_len,
        batch_size=max(1, config.batch_size // factor),
        lr=config.lr * lr_fraction,
    )
    history = train_lm(tuned, corpus.train, long, steps=steps, device=device, progress=False)
    rows = evaluate_lengths(tuned, corpus.val, config, device=device)
    record = {
        "steps": steps,
        "wall_s": round(history["wall_s"], 2),
        "final_loss_bits": round(history["final_loss_bits"], 4),
        "eval": _bpb_rows(rows),
    }
    return tuned, record


def run_seed(
    config: Config,
    corpus,
    *,
    finetune_factor: int = DEFAULT_FINETUNE_FACTOR,
    finetune_steps=DEFAULT_FINETUNE_STEPS,
    scalings=SCALINGS,
    finetuned_scalings=FINETUNED_SCALINGS,
    device=None,
    progress: bool = False,
    train_kwargs: dict | None = None,
) -> tuple[object, dict]:
    """Train one RoPE model (``config.seed``), evaluate it zero-shot and fine-tuned.

    ``train_kwargs`` go to the pre-training's :func:`~relbias.lab.training.train_lm`
    (checkpointing). Returns ``(trained model, record)``.
    """
    seed_everything(config.seed)
    model = build_model("rope", config).to(device)
    history = train_lm(
        model,
        corpus.train,
        config,
        device=device,
        progress=progress,
        desc="rope",
        **(train_kwargs or {}),
    )
    record = {
        "seed": config.seed,
        "train": {
            "steps": history["steps"],
            "wall_s": round(history["wall_s"], 2),
            "final_loss_bits": round(history["final_loss_bits"], 4),
        },
        "zero_shot": zero_shot(model, corpus.val, config, scalings, device),
        "finetuned": {},
    }
    for name in finetuned_scalings:
        record["finetuned"][name] = {}
        for steps in finetune_steps:
            _, rec = finetune(
                model, corpus, config, name, steps, factor=finetune_factor, device=device
            )
            record["finetuned"][name][str(steps)] = rec
    return model, record


def _spread(values: list[float]) -> dict:
    iv = interval(values)
    return {k: round(iv[k], 5) if isinstance(iv[k], float) else iv[k] for k in iv}


def summarize(runs: list[dict]) -> dict:
    """Mean and 95 % t-interval over seeds (``mean``, ``low``, ``high``, ``sd``, ``n``):
    ``{"zero_shot": {scaling: {length: ...}}, "finetuned": {variant: {steps: {length:
    ...}}}}`` (lengths and steps as strings)."""

    def by_length(row_lists):
        lengths = [r["length"] for r in row_lists[0]]
        return {
            str(n): _spread([rows[i]["bpb"] for rows in row_lists]) for i, n in enumerate(lengths)
        }

    first = runs[0]
    return {
        "zero_shot": {
            name: by_length([run["zero_shot"][name] for run in runs]) for name in first["zero_shot"]
        },
        "finetuned": {
            name: {
                steps: by_length([run["finetuned"][name][steps]["eval"] for run in runs])
                for steps in first["finetuned"][name]
            }
            for name in first["finetuned"]
        },
    }


def run_interpolation(
    config: Config | None = None,
    seeds=DEFAULT_SEEDS,
    *,
    finetune_factor: int = DEFAULT_FINETUNE_FACTOR,
    finetune_steps=DEFAULT_FINETUNE_STEPS,
    device=None,
    progress: bool = False,
    verbose: bool = True,
    checkpoint_dir=None,
    resume: bool = False,
    checkpoint_seconds: float | None = 120.0,
    checkpoint_every: int | None = None,
) -> dict:
    """The whole experiment over ``seeds`` through the sweep runner
    (:func:`relbias.lab.sweep.run_sweep`: checkpoints of the pre-training and resuming);
    returns the results (see the module docstring)."""
    config = config or get_config()
    if finetune_factor not in config.eval_factors:
        raise ValueError(
            f"finetune_factor ({finetune_factor}) must be one of the evaluation factors "
            f"{config.eval_factors}"
        )
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=False)

    def run_one(name, seed, train_kwargs):
        return run_seed(
            config.replace(seed=seed),
            corpus,
            finetune_factor=finetune_factor,
            finetune_steps=finetune_steps,
            device=device,
            progress=progress,
            train_kwargs=train_kwargs,
        )[1]

    swept = run_sweep(
        "interpolation",
        config,
        ["rope"],
        list(seeds),
        run_one,
        lambda per_seed: list(per_seed.values()),
        device=device,
        identity_extra={"finetune_factor": finetune_factor, "finetune_steps": list(finetune_steps)},
        checkpoint_dir=checkpoint_dir,
        resume=resume,
        checkpoint_seconds=checkpoint_seconds,
        checkpoint_every=checkpoint_every,
        verbose=verbose,
    )
    runs = swept["methods"]["rope"]
    return {
        "kind": "interpolation",
        "setup": {
            "model": "rope",
            "seeds": list(seeds),
            "scalings": {
                "none": "plain RoPE",
                "linear": "linear position interpolation, s = m / m_l (Chen et al., 2023)",
                "ntk": "NTK-aware base scaling, lambda = s^(d/(d-2)) (bloc97, 2023)",
                "dynamic": "dynamic NTK, factor 1: lambda = (n / m_l)^(d/(d-2)) for n > m_l",
                "yarn": "YaRN, beta_fast 32, beta_slow 1, temperature 0.1 ln s + 1",
                "yarn_no_temp": "YaRN's ramp with attention factor 1 (no temperature)",
            },
            "zero_shot": "scaling set for each evaluation length (s = length / m_l)",
            "finetune_factor": finetune_factor,
            "finetune_length": finetune_factor * config.train_len,
            "finetune_steps": list(finetune_steps),
            "finetune_batch_size": max(1, config.batch_size // finetune_factor),
            "finetune_lr": config.lr * FINETUNE_LR_FRACTION,
            "finetune_variants": {
                name: {"scaling": scaling, "lr": config.lr * fraction}
                for name, (scaling, fraction) in FINETUNE_VARIANTS.items()
            },
            "finetuned_eval": f"scaling fixed at s = {finetune_factor} at every length",
        },
        "runs": runs,
        "summary": summarize(runs),
        "corpus": corpus.describe(),
        "interval": swept["interval"],
        "provenance": swept["provenance"],
    }


def as_sweep(results: dict, phase: str = "zero_shot", steps: int | None = None) -> dict:
    """The runs of an interpolation result as a sweep whose methods are its variants, so
    that the readers of :mod:`relbias.lab.stats` (curves, paired verdicts) take them like
    any sweep: ``phase="zero_shot"`` (every scaling, no training) or ``"finetuned"`` after
    ``steps`` fine-tuning steps. Every variant of one seed starts from that seed's trained
    model (and fine-tunes on the same batches), so two variants are paired by seed."""
    if phase not in ("zero_shot", "finetuned"):
        raise ValueError(f"phase must be 'zero_shot' or 'finetuned', got {phase!r}")
    runs = results["runs"]
    if phase == "finetuned":
        held = sorted(int(k) for k in runs[0]["finetuned"][next(iter(runs[0]["finetuned"]))])
        if steps not in held:
            raise ValueError(f"steps must be one of {held} for the fine-tuned runs, got {steps!r}")
    names = list(runs[0][phase])
    methods = {}
    for name in names:
        seeds = {}
        for run in runs:
            rows = run[phase][name] if phase == "zero_shot" else run[phase][name][str(steps)]
            seeds[str(run["seed"])] = {"eval": rows if phase == "zero_shot" else rows["eval"]}
        first = next(iter(seeds.values()))["eval"]
        summary = []
        for i, r in enumerate(first):
            iv = interval([rec["eval"][i]["bpb"] for rec in seeds.values()])
            summary.append(
                {
                    "factor": r["factor"],
                    "length": r["length"],
                    "bpb": iv["mean"],
                    "bpb_low": iv["low"],
                    "bpb_high": iv["high"],
                    "n": iv["n"],
                }
            )
        methods[name] = {"eval": summary, "seeds": seeds}
    kind = f"interpolation_{phase}"
    return {"kind": kind, "methods": methods, "provenance": results["provenance"]}
