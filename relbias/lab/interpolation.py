"""The interpolation experiment: RoPE trained at ``m_l``, read at 2x..16x with every scaling.

``python -m relbias.lab.experiments interpolation [--seeds 0 1 2] [--out DIR]`` runs it.
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
import time

from relbias.lab.data import load_corpus
from relbias.lab.stats import interval
from relbias.lab.training import (
    Config,
    build_model,
    evaluate_lengths,
    get_config,
    pick_device,
    provenance,
    seed_everything,
    train_lm,
)
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
    keys = ("factor", "length", "bpb") + (("loss_by_position",) if keep_positions else ())
    return [{k: round(r[k], 5) if k == "bpb" else r[k] for k in keys} for r in rows]


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
            rows += evaluate_lengths(model, corpus_val, config, factors=(factor,), device=device)
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
) -> tuple[object, dict]:
    """Train one RoPE model (``config.seed``), evaluate it zero-shot and fine-tuned.

    Returns ``(trained model, record)``.
    """
    seed_everything(config.seed)
    model = build_model("rope", config).to(device)
    history = train_lm(model, corpus.train, config, device=device, progress=progress, desc="rope")
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
) -> dict:
    """The whole experiment over ``seeds``; returns the results (see the module docstring)."""
    config = config or get_config()
    if finetune_factor not in config.eval_factors:
        raise ValueError(
            f"finetune_factor ({finetune_factor}) must be one of the evaluation factors "
            f"{config.eval_factors}"
        )
    corpus = load_corpus(max_bytes=config.corpus_bytes)
    device = device or pick_device(verbose=False)
    start, runs = time.perf_counter(), []
    for seed in seeds:
        _, record = run_seed(
            config.replace(seed=seed),
            corpus,
            finetune_factor=finetune_factor,
            finetune_steps=finetune_steps,
            device=device,
            progress=progress,
        )
        runs.append(record)
        if verbose:
            print(f"seed {seed}: done after {time.perf_counter() - start:.0f} s", flush=True)
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
        "provenance": provenance(config, device, wall_s=time.perf_counter() - start),
    }


def interpolation_table(results: dict) -> str:
    """Mean bits per byte over seeds [95 % interval] per variant and length, as text."""
    summary = results["summary"]
    lengths = list(next(iter(summary["zero_shot"].values())))
    lines = [f"{'variant':24s} " + " ".join(f"{n:>17s}" for n in lengths)]

    def line(label, cells):
        values = " ".join(
            f"{c['mean']:6.3f} [{c['low']:.2f},{c['high']:.2f}]" for c in cells.values()
        )
        return f"{label:24s} {values}"

    for name, cells in summary["zero_shot"].items():
        lines.append(line(f"{name}, zero-shot", cells))
    for name, by_steps in summary["finetuned"].items():
        for steps, cells in by_steps.items():
            lines.append(line(f"{name}, {steps} steps", cells))
    return "\n".join(lines)


def plot_interpolation(results: dict, *, steps: str | None = None, axes=None):
    """Mean bits per byte (band: 95 % interval over seeds) against length: zero-shot (left),
    fine-tuned ``steps`` steps (right; default the most). Returns the figure."""
    summary = results["summary"]
    if axes is None:
        from matplotlib.figure import Figure

        fig = Figure(figsize=(11, 3.8))
        axes = fig.subplots(1, 2, sharey=True)
    fig = axes[0].figure
    steps = steps or list(next(iter(summary["finetuned"].values())))[-1]
    panels = (
        (axes[0], summary["zero_shot"], "zero-shot (scaling set for each length)"),
        (
            axes[1],
            {name: by_steps[steps] for name, by_steps in summary["finetuned"].items()},
            f"fine-tuned {steps} steps at {results['setup']['finetune_length']} tokens",
        ),
    )
    train_len = results["provenance"]["config"]["train_len"]
    for ax, cells_by_name, title in panels:
        for name, cells in cells_by_name.items():
            x = [int(n) for n in cells]
            scaling = FINETUNE_VARIANTS.get(name, (name,))[0]
            color = f"C{SCALINGS.index(scaling)}" if scaling in SCALINGS else None
            # dashed: dynamic (NTK and dynamic coincide when whole windows are read) and the
            # variants that share a scaling's colour
            dashed = name in ("dynamic", "yarn_no_temp", "linear_lr10")
            ax.plot(
                x,
                [c["mean"] for c in cells.values()],
                marker="o",
                ms=3,
                ls="--" if dashed else "-",
                color=color,
                label=name,
            )
            lows, highs = [c["low"] for c in cells.values()], [c["high"] for c in cells.values()]
            ax.fill_between(x, lows, highs, color=color, alpha=0.2)
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length (grey: training length)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("validation bits per byte")
    return fig
