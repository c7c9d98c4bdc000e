"""Training and evaluation of :class:`~relbias.lab.model.TinyLM`: configs, device, seeds,
the training loop, length-extrapolation and recall-probe evaluation, results with
provenance, plots, and read-back of what a bias family learned.

Two named configurations (:func:`get_config`):

``quick``
    the default on every runtime (CPU, a Colab T4, a large GPU): sized so that training
    and evaluating one method takes about 25 s on a 2-core CPU and the whole 11-method
    extrapolation sweep stays under 10 minutes, so a chapter's live demo runs in a few
    minutes wherever it is opened, and its numbers can be compared with the stored sweep.
``medium``
    on request (``--config medium``, ``RELBIAS_CONFIG=medium``): quick's model at twice
    the training length (128) and three times the steps, with the validation loss at the
    training length recorded every 150 steps (``val_every``) and 128 kB of validation text
    drawn across the files at every length (``eval_tokens``, ``eval_spread``); its probe
    is the ``competing`` task (:mod:`relbias.lab.probe`). Sized for the stored multi-seed
    sweeps on a 2-core CPU (``relbias/lab/results/README.md``).
``full``
    on request (``get_config("full")``, ``--config full``, or the environment variable
    ``RELBIAS_CONFIG=full``): a wider, deeper model trained longer on longer sequences,
    meant for a GPU.

``quick`` keeps its evaluation small for the live demos: the first ``eval_tokens`` = 16 kB
of the validation split (``eval_spread=False``) and no validation curve (``val_every=0``).

On CUDA, training and evaluation run under autocast: bfloat16 on GPUs of compute
capability 8.0 and later, float16 with a gradient scaler before that (a T4 is 7.5: its
tensor cores have no bfloat16, and bfloat16 there runs attention's slow math kernel).
The positional biases are computed and added in float32 outside autocast
(:func:`relbias.biased_attention`). GPU runs are not bit-reproducible:
:func:`seed_everything` asks for deterministic algorithms with ``warn_only=True``, and
some CUDA kernels have no deterministic version.
"""

from __future__ import annotations

import dataclasses
import math
import os
import platform
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from relbias._stored import read_json, write_json
from relbias.biases.kerple import project_after_steps
from relbias.lab.data import (
    eval_windows,
    files_touched,
    make_recall_batch,
    random_windows,
    spread_eval_windows,
)
from relbias.lab.model import TinyLM, lm_loss

LN2 = math.log(2.0)
SYNC_EVERY = 10  # training steps between reads of the loss from the device
RESULTS_DIR = Path(__file__).with_name("results")


# --- configuration ---------------------------------------------------------------------


_NOT_POSITIVE_INTS = frozenset(
    {
        "name",
        "lr",
        "weight_decay",
        "grad_clip",
        "seed",
        "probe_distractors",
        "eval_spread",
        "val_every",
        "probe_task",
        "probe_competitors",
    }
)


@dataclass(frozen=True)
class Config:
    """Everything that sizes a run. Field names are recorded in every result file."""

    name: str = "quick"
    dim: int = 64
    depth: int = 2
    heads: int = 4
    train_len: int = 64
    batch_size: int = 32
    steps: int = 1000
    lr: float = 3e-3
    warmup: int = 50
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_factors: tuple = (1, 2, 4, 8, 16)
    eval_tokens: int = 16384
    eval_batch_size: int = 8
    corpus_bytes: int = 3_000_000
    seed: int = 0
    probe_steps: int = 600
    probe_batch_size: int = 32
    probe_num_pairs: int = 1
    probe_distractors: int = 0
    probe_eval_factors: tuple = (1, 4)
    probe_eval_samples: int = 100
    eval_spread: bool = False
    val_every: int = 0
    val_tokens: int = 16384
    probe_task: str = "recall"
    probe_competitors: int = 2

    def replace(self, **changes) -> Config:
        """A copy with some fields changed (checked like a new config)."""
        return dataclasses.replace(self, **changes)

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, list):
                value = tuple(value)
                object.__setattr__(self, f.name, value)
            if f.name in _NOT_POSITIVE_INTS:
                continue
            items = value if isinstance(value, tuple) else (value,)
            if not items or any(
                isinstance(v, bool) or not isinstance(v, int) or v < 1 for v in items
            ):
                raise ValueError(f"config field {f.name} must hold integers >= 1, got {value!r}")
        if self.dim % self.heads:
            raise ValueError(f"dim ({self.dim}) must be divisible by heads ({self.heads})")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        for name in ("seed", "val_every", "probe_competitors", "probe_distractors"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
        if not isinstance(self.eval_spread, bool):
            raise ValueError(f"eval_spread must be True or False, got {self.eval_spread!r}")
        from relbias.lab.probe import TASKS

        if self.probe_task not in TASKS:
            raise ValueError(f"probe_task must be one of {TASKS}, got {self.probe_task!r}")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


CONFIGS = {
    "quick": Config(),
    "full": Config(
        name="full",
        dim=256,
        depth=4,
        heads=8,
        train_len=256,
        batch_size=32,
        steps=4000,
        lr=1e-3,
        warmup=200,
        eval_tokens=131072,
        eval_batch_size=8,
        corpus_bytes=4_000_000,
        probe_steps=3000,
        probe_batch_size=64,
        probe_num_pairs=4,
        probe_eval_samples=200,
        eval_spread=True,
        val_every=250,
    ),
    # Between the two, for the stored multi-seed sweeps on a 2-core CPU (see
    # relbias/lab/results/README.md for the time it takes): twice quick's training length,
    # three times its steps at the same bytes per step (6.1 M bytes, about 2.3 epochs), the
    # validation curve at the training length every 150 steps, and 128 kB of validation
    # text at every length, drawn across the validation files. Its curves have not levelled
    # off at 3000 steps; at 15000 (``--steps 15000``, about 71 minutes per seed of all 11
    # methods on two cores) most have: see the results README.
    "medium": Config(
        name="medium",
        train_len=128,
        batch_size=16,
        steps=3000,
        warmup=100,
        eval_tokens=131072,
        eval_spread=True,
        val_every=150,
        val_tokens=16384,
        probe_task="competing",
        probe_competitors=1,
        probe_steps=3000,
        probe_batch_size=16,
        probe_eval_factors=(1, 4, 16),
        probe_eval_samples=100,
    ),
}


def get_config(name: str | None = None, **overrides) -> Config:
    """The named configuration, with optional field overrides.

    With ``name=None``: the environment variable ``RELBIAS_CONFIG`` if it is set (and
    ``CI`` is not: CI always runs ``quick``), else ``quick``, on every device.
    """
    if name is None:
        name = "quick" if os.environ.get("CI") else os.environ.get("RELBIAS_CONFIG") or "quick"
        if name not in CONFIGS:
            raise ValueError(
                f"the environment variable RELBIAS_CONFIG must be one of {sorted(CONFIGS)}, "
                f"got {name!r}"
            )
    if name not in CONFIGS:
        raise ValueError(f"config name must be one of {sorted(CONFIGS)}, got {name!r}")
    return CONFIGS[name].replace(**overrides) if overrides else CONFIGS[name]


# --- device and seeds ----------------------------------------------------------------------


def pick_device(preferred: str | None = None, *, verbose: bool = True) -> torch.device:
    """CUDA if available, else the CPU (or ``preferred``); printed when verbose.

    Apple's MPS is taken only when asked for (``preferred="mps"``): it has no float64 and
    this project has never run on it.
    """
    if preferred is not None:
        device = torch.device(preferred)
    elif torch.cuda.is_available():
        device = torch.device("cuda")
    else:
        device = torch.device("cpu")
    if verbose:
        print(f"relbias: using device {device_name(device)}")
    return device


def device_name(device: torch.device) -> str:
    """A readable device description (the GPU model on CUDA)."""
    device = torch.device(device)
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch; ask for deterministic algorithms (warn only)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def autocast_dtype(device) -> torch.dtype | None:
    """The autocast dtype used on ``device``: bfloat16 on CUDA devices of compute
    capability >= 8.0, float16 below (T4, V100), None (no autocast) elsewhere."""
    device = torch.device(device)
    if device.type != "cuda":
        return None
    major, _ = torch.cuda.get_device_capability(device)
    return torch.bfloat16 if major >= 8 else torch.float16


def _autocast(device: torch.device):
    """Autocast in :func:`autocast_dtype` on CUDA, nothing elsewhere."""
    dtype = autocast_dtype(device)
    return torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=dtype is not None)


def _progress_bar(total: int, desc: str | None, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, unit="step")


# --- model construction ----------------------------------------------------------------


def build_model(position: str, config: Config, **kwargs) -> TinyLM:
    """A :class:`TinyLM` sized by ``config``; extra keyword arguments go to TinyLM."""
    return TinyLM(
        dim=config.dim,
        depth=config.depth,
        heads=config.heads,
        position=position,
        train_len=config.train_len,
        **kwargs,
    )


# --- training ------------------------------------------------------------------------------


def _lr_at(step: int, config: Config, steps: int) -> float:
    """Linear warm-up, then cosine decay to 10 % of the peak."""
    warm = min(config.warmup, max(steps // 10, 1))
    if step < warm:
        return config.lr * (step + 1) / warm
    frac = (step - warm) / max(steps - warm, 1)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def train_lm(
    model: TinyLM,
    data,
    config: Config,
    *,
    steps: int | None = None,
    device=None,
    progress: bool = True,
    desc: str | None = None,
    seed: int | None = None,
    val_data: torch.Tensor | None = None,
    val_every: int | None = None,
    checkpoint=None,
    checkpoint_every: int | None = None,
    checkpoint_seconds: float | None = None,
    resume: bool = False,
    run_id: str | None = None,
    before_step=None,
    after_step=None,
) -> dict:
    """Train ``model`` in place with AdamW and return its training history.

    ``data`` is either a uint8 tensor of training bytes (random windows of
    ``config.train_len``) or a function ``batch(generator) -> (inputs, targets)``.
    Batches come from a ``torch.Generator`` seeded with ``seed`` (default
    ``config.seed``), so every method sees the same batches. ``progress`` shows a
    tqdm bar with loss and speed (``tqdm.auto``: the notebook widget in Jupyter).

    Returns ``{"steps", "tokens", "wall_s", "tokens_per_s", "losses", "final_loss_bits"}``
    where ``losses`` is the training loss in bits per step.

    Optional (all off by default):

    - ``val_data`` (validation bytes) and ``val_every`` (default ``config.val_every``; 0 is
      off): every ``val_every`` steps and at the end, bits per byte at the training length
      on :func:`validation_windows` (``config.val_tokens`` bytes drawn across the split),
      returned as ``"val_curve": [{"step", "bpb"}, ...]`` (``step`` = steps done).
    - ``checkpoint`` (a path): the training state (:mod:`relbias.lab.checkpoint`) is
      written atomically every ``checkpoint_every`` steps and/or ``checkpoint_seconds``
      seconds, at the end, and when Ctrl-C (SIGINT) arrives, which then ends the run at the
      next step boundary with :class:`~relbias.lab.checkpoint.TrainingInterrupted` (without
      a checkpoint, Ctrl-C interrupts as usual).
      ``resume=True`` continues from that file when it exists; the result equals an
      uninterrupted run's. ``run_id`` is stored with it (a sweep's run name).
    - ``before_step(step, model)`` runs before each step's batch, ``after_step(step, model)``
      after each step (``step`` counts from 0). A ``KeyboardInterrupt`` raised by
      ``after_step`` is handled like Ctrl-C.
    """
    from relbias.lab.checkpoint import (
        TrainingInterrupted,
        load_checkpoint,
        rng_states,
        save_checkpoint,
        set_rng_states,
    )

    steps = config.steps if steps is None else steps
    val_every = config.val_every if val_every is None else val_every
    if isinstance(val_every, bool) or not isinstance(val_every, int) or val_every < 0:
        raise ValueError(f"val_every must be an integer >= 0, got {val_every!r}")
    for name, value in (("checkpoint_every", checkpoint_every),):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 1
        ):
            raise ValueError(f"{name} must be an integer >= 1 or None, got {value!r}")
    if checkpoint_seconds is not None and not checkpoint_seconds > 0:
        raise ValueError(f"checkpoint_seconds must be > 0 or None, got {checkpoint_seconds!r}")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint (the path of the saved state)")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).train()
    gen = torch.Generator().manual_seed(config.seed if seed is None else seed)
    batch = data if callable(data) else _text_batches(data, config)
    opt = _optimizer(model, config)
    # Kerple's constraints (r1 > 0, 0 < r2 <= 2) are restored after every step of this
    # optimiser (the module also clamps them when it computes a bias).
    projection = project_after_steps(opt, model)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast_dtype(device) == torch.float16)
    on_cuda = device.type == "cuda"
    val_x = val_y = None
    if val_data is not None and val_every:
        val_x, val_y = validation_windows(val_data, config)
    # Losses stay on the device and are read every SYNC_EVERY steps: a .item() per step
    # would wait for the GPU at every step.
    losses, pending, tokens, val_curve, first, elapsed = [], [], 0, [], 0, 0.0
    resumed_at = []
    if resume and Path(checkpoint).is_file():
        state = load_checkpoint(checkpoint)
        if state.get("total_steps") != steps or (run_id is not None and state["run"] != run_id):
            raise ValueError(
                f"the checkpoint {checkpoint} is of another run ({state.get('run')}, "
                f"{state.get('total_steps')} steps), not of {run_id} with {steps} steps"
            )
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        gen.set_state(state["generator"])
        set_rng_states(state["rng"])
        first, losses, tokens = state["step"], state["losses"], state["tokens"]
        val_curve, elapsed = state["val_curve"], state["wall_s"]
        resumed_at = [*state.get("resumed_at", []), first]

    start = time.perf_counter()
    last_save = start

    def flush():
        nonlocal pending, losses
        if pending:
            losses += (torch.stack(pending).float().cpu() / LN2).tolist()
            pending = []

    def save(step_done: int):
        nonlocal last_save
        flush()
        save_checkpoint(
            checkpoint,
            {
                "run": run_id,
                "total_steps": steps,
                "step": step_done,
                "model": model.state_dict(),
                "optimizer": opt.state_dict(),
                "scaler": scaler.state_dict(),
                "generator": gen.get_state(),
                "rng": rng_states(),
                "losses": list(losses),
                "tokens": tokens,
                "val_curve": list(val_curve),
                "wall_s": elapsed + time.perf_counter() - start,
                "resumed_at": resumed_at,
                "config": config.to_dict(),
            },
        )
        last_save = time.perf_counter()

    def interrupted(step_done: int, cause=None):
        where = None
        if checkpoint is not None:
            save(step_done)
            where = Path(checkpoint)
        saved = (
            f"saved the training state after step {step_done} of {steps} to {where}"
            if where is not None
            else "nothing was saved (no checkpoint path was given)"
        )
        raise TrainingInterrupted(
            f"training interrupted (Ctrl-C): {saved}", checkpoint=where, step=step_done
        ) from cause

    with (
        _progress_bar(steps, desc, progress) as bar,
        _sigint_flag(checkpoint is not None) as sigint,
    ):
        bar.update(first)
        for step in range(first, steps):
            if before_step is not None:
                before_step(step, model)
            for group in opt.param_groups:
                group["lr"] = _lr_at(step, config, steps)
            x, y = batch(gen)
            if on_cuda:
                x, y = (
                    x.pin_memory().to(device, non_blocking=True),
                    y.pin_memory().to(device, non_blocking=True),
                )
            else:
                x, y = x.to(device), y.to(device)
            with _autocast(device):
                loss = lm_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.grad_clip)
            scaler.step(opt)
            scaler.update()
            pending.append(loss.detach())
            tokens += x.numel()
            done = step + 1
            if len(pending) == SYNC_EVERY or done == steps:
                flush()
                bar.update(done - bar.n)
                bar.set_postfix(bits=f"{losses[-1]:.3f}", refresh=False)
            if val_x is not None and (done % val_every == 0 or done == steps):
                val_curve.append(
                    {"step": done, "bpb": _validation_bpb(model, val_x, val_y, config, device)}
                )
                model.train()
            if after_step is not None:
                try:
                    after_step(step, model)
                except KeyboardInterrupt as err:
                    interrupted(done, err)
            if sigint.fired:
                interrupted(done)
            if checkpoint is not None and (
                done == steps
                or (checkpoint_every and done % checkpoint_every == 0)
                or (checkpoint_seconds and time.perf_counter() - last_save >= checkpoint_seconds)
            ):
                save(done)
    flush()
    wall = elapsed + time.perf_counter() - start
    projection.remove()
    model.eval()
    tail = losses[-max(1, min(20, steps)) :]
    history = {
        "steps": steps,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / max(wall, 1e-9),
        "losses": losses,
        "final_loss_bits": sum(tail) / len(tail),
    }
    if val_x is not None:
        history["val_curve"] = val_curve
    if resumed_at:
        history["resumed_at"] = resumed_at
    return history


class _SigintFlag:
    fired = False


class _sigint_flag:  # noqa: N801 (a context manager used like a function)
    """While active (in the main thread, when ``enabled``: a run with a checkpoint), Ctrl-C
    sets ``.fired`` instead of raising, so that the training loop stops at a step boundary
    with a consistent state to save. A second Ctrl-C raises at once."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def __enter__(self):
        import signal
        import threading

        self.flag = _SigintFlag()
        self.previous = None
        if self.enabled and threading.current_thread() is threading.main_thread():
            self.previous = signal.getsignal(signal.SIGINT)

            def handler(signum, frame):
                if self.flag.fired:  # a second Ctrl-C: stop at once
                    raise KeyboardInterrupt
                self.flag.fired = True

            signal.signal(signal.SIGINT, handler)
        return self.flag

    def __exit__(self, *exc):
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False


def validation_windows(data: torch.Tensor, config: Config):
    """The validation windows of the training-length curve: ``config.val_tokens`` bytes in
    windows of ``config.train_len``, drawn evenly across the split."""
    x, y, _ = spread_eval_windows(data, config.train_len, config.val_tokens)
    return x, y


@torch.no_grad()
def _validation_bpb(model, x, y, config: Config, device) -> float:
    model.eval()
    return round(float(_loss_by_position(model, x, y, config.eval_batch_size, device).mean()), 5)


def _text_batches(data: torch.Tensor, config: Config):
    def batch(gen):
        return random_windows(data, config.batch_size, config.train_len, gen)

    return batch


def _optimizer(model: torch.nn.Module, config: Config) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices outside the bias modules."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        is_bias_module = name.startswith("bias.") or ".bias." in name
        (decay if p.dim() == 2 and not is_bias_module else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": config.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95))


# --- evaluation ----------------------------------------------------------------------------


@torch.no_grad()
def evaluate_lengths(
    model: TinyLM,
    data: torch.Tensor,
    config: Config,
    *,
    factors=None,
    device=None,
    progress: bool = False,
    file_offsets=None,
) -> list[dict]:
    """Bits per byte on validation text at each length ``factor * train_len``.

    Every length reads the same bytes, cut into non-overlapping windows, so lengths differ
    only in how much context each prediction has:

    - ``config.eval_spread=False`` (``quick``): the first ``config.eval_tokens`` bytes
      (rounded down to whole windows of the longest length);
    - ``config.eval_spread=True`` (``medium``, ``full``): ``config.eval_tokens`` bytes
      (rounded up to whole windows of the longest length) in spans of the longest length
      spread evenly across the whole split (:func:`~relbias.lab.data.spread_eval_windows`).

    Returns one dict per factor: ``factor``, ``length``, ``windows``, ``bytes`` (bytes
    predicted), ``bpb`` and ``loss_by_position`` (mean bits at each position inside the
    window); with ``file_offsets`` (:meth:`~relbias.lab.data.ByteCorpus.split_offsets`)
    also ``files``, how many validation files those bytes come from.
    """
    factors = tuple(config.eval_factors if factors is None else factors)
    if not factors or any(isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in factors):
        raise ValueError(f"factors must be integers >= 1, got {factors!r}")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    longest = max(factors) * config.train_len
    num_tokens = max(config.eval_tokens // longest, 1) * longest
    model.to(device).eval()
    rows = []
    for factor in _progress_iter(factors, "eval", progress):
        length = factor * config.train_len
        if config.eval_spread:
            x, y, starts = spread_eval_windows(data, length, config.eval_tokens, span_len=longest)
        else:
            x, y = eval_windows(data, length, num_tokens)
            starts = torch.tensor([0])
            starts_len = x.numel()
        per_pos = _loss_by_position(model, x, y, config.eval_batch_size, device)
        row = {
            "factor": factor,
            "length": length,
            "windows": int(x.shape[0]),
            "bytes": int(x.numel()),
            "bpb": float(per_pos.mean()),
            "loss_by_position": [round(v, 4) for v in per_pos.tolist()],
        }
        if file_offsets is not None:
            span = longest if config.eval_spread else starts_len
            row["files"] = files_touched(starts, span, file_offsets)
        rows.append(row)
    return rows


def _progress_iter(items, desc: str, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, disable=not enabled, leave=False)


def _loss_by_position(model, x, y, batch_size, device) -> torch.Tensor:
    """Mean loss in bits at each window position, over all windows."""
    total = torch.zeros(x.shape[1], dtype=torch.float64)
    for start in range(0, x.shape[0], batch_size):
        xb, yb = x[start : start + batch_size].to(device), y[start : start + batch_size].to(device)
        with _autocast(device):
            logits = model(xb)
        loss = torch.nn.functional.cross_entropy(
            logits.float().transpose(1, 2), yb, reduction="none"
        )
        if not torch.isfinite(loss).all():
            raise FloatingPointError("evaluation produced a non-finite loss")
        total += loss.sum(0).cpu().double()
    return total / x.shape[0] / LN2


# --- the recall probe --------------------------------------------------------------------


def probe_batches(config: Config, *, max_distance: int | None = None):
    """Training batches for the recall probe: distances uniform in 1..max_distance.

    The default ``max_distance`` is the farthest that fits (:func:`probe_max_distance`);
    the ``competing`` task starts at :func:`probe_min_distance`.
    """
    if max_distance is None:
        max_distance = probe_max_distance(config, config.train_len)
    low = probe_min_distance(config)

    def batch(gen):
        dist = torch.randint(low, max_distance + 1, (config.probe_batch_size,), generator=gen)
        return probe_batch(config, config.probe_batch_size, config.train_len, dist, gen)

    return batch


def probe_min_distance(config: Config) -> int:
    """The nearest distance the configured probe task allows (1 for ``recall``;
    ``2 * probe_competitors + 1`` for ``competing``)."""
    from relbias.lab.probe import min_distance

    return min_distance(config.probe_competitors) if config.probe_task == "competing" else 1


def probe_max_distance(config: Config, seq_len: int) -> int:
    """The farthest distance the configured probe allows in ``seq_len`` tokens
    (``seq_len - 2``; ``competing``: ``seq_len - 2 - 2 * probe_competitors``)."""
    if config.probe_task == "competing":
        return seq_len - 2 - 2 * config.probe_competitors
    return seq_len - 2


def probe_batch(config: Config, batch_size: int, seq_len: int, distance, gen):
    """One batch ``(inputs, targets)`` of the configured probe task with the answer
    ``distance`` back (an int or one per sequence), drawn with ``gen``."""
    if config.probe_task == "recall":  # the original call, so that stored runs reproduce
        return make_recall_batch(
            batch_size,
            seq_len,
            distance,
            num_pairs=config.probe_num_pairs,
            num_distractors=config.probe_distractors,
            generator=gen,
        )
    from relbias.lab.probe import make_probe_batch

    return make_probe_batch(
        config.probe_task,
        batch_size,
        seq_len,
        distance,
        num_competitors=config.probe_competitors,
        generator=gen,
    )


def default_distances(seq_len: int) -> list[int]:
    """Distances 1, 2, 4, ... and seq_len - 2: every power of two that fits, and the farthest."""
    out, d = [], 1
    while d <= seq_len - 2:
        out.append(d)
        d *= 2
    if out[-1] != seq_len - 2:
        out.append(seq_len - 2)
    return out


def largest_that_fits(run, sizes):
    """``(size, run(size))`` for the first of ``sizes`` (largest first) whose run fits in
    the device's memory: a CUDA out-of-memory error moves on to the next size, so a
    chapter's long evaluation sizes itself to the GPU it finds (a T4's 15 GB or more).
    Any other error, or running out at the last size, is raised."""
    sizes = list(sizes)
    if not sizes:
        raise ValueError("sizes must name at least one size")
    for i, size in enumerate(sizes):
        try:
            return size, run(size)
        except torch.cuda.OutOfMemoryError:
            if i == len(sizes) - 1:
                raise
            torch.cuda.empty_cache()
    raise AssertionError("unreachable")


@torch.no_grad()
def evaluate_retrieval(
    model: TinyLM,
    config: Config,
    *,
    seq_len: int,
    distances=None,
    samples: int | None = None,
    device=None,
    seed: int = 1234,
) -> list[dict]:
    """Recall accuracy at each distance, in sequences of ``seq_len`` tokens.

    ``samples`` sequences per distance (default ``config.probe_eval_samples``), from a
    generator seeded with ``seed`` (different from training). Returns one dict per
    distance: ``length``, ``distance``, ``accuracy``, ``samples``.
    """
    low, high = probe_min_distance(config), probe_max_distance(config, seq_len)
    if distances is None:
        distances = [d for d in default_distances(seq_len) if low <= d <= high]
        if high >= low:
            distances = sorted({low, *distances, high})
    distances = list(distances)
    samples = config.probe_eval_samples if samples is None else samples
    device = torch.device(device) if device is not None else next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    model.to(device).eval()
    rows = []
    for d in distances:
        x, y = probe_batch(config, samples, seq_len, d, gen)
        correct = 0
        for start in range(0, samples, config.eval_batch_size * 4):
            xb = x[start : start + config.eval_batch_size * 4].to(device)
            with _autocast(device):
                pred = model(xb)[:, -1].argmax(-1).cpu()
            correct += int((pred == y[start : start + xb.shape[0], -1]).sum())
        rows.append(
            {"length": seq_len, "distance": d, "accuracy": correct / samples, "samples": samples}
        )
    return rows


# --- results and provenance ------------------------------------------------------------------


def provenance(config: Config, device, *, wall_s: float | None = None) -> dict:
    """Where a result came from: config, device, versions, commit, time, wall time."""
    from relbias import __version__

    return {
        "config": config.to_dict(),
        "device": device_name(device),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "relbias": __version__,
        "commit": _git_commit(),
        "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall_s,
        "command": " ".join(sys.argv),
    }


def _git_commit() -> str | None:
    """The repository's HEAD commit (with ``+dirty`` when the tree has changes), or None."""
    here = Path(__file__).resolve().parent
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "status", "--porcelain"], cwd=here, capture_output=True, text=True, timeout=10
        )
        return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def save_results(results: dict, path) -> Path:
    """Write ``results`` as JSON (creating folders, atomically: a killed run never leaves
    a truncated file); returns the path."""
    return write_json(results, path)


def made_with(results: dict, config: Config) -> bool:
    """Whether a stored result was made with ``config``: every field equal, where a field
    the file does not record (added to :class:`Config` later) counts at its default."""
    stored = results["provenance"]["config"]
    for field in dataclasses.fields(Config):
        value = stored.get(field.name, field.default)
        if isinstance(value, list):
            value = tuple(value)
        if value != getattr(config, field.name):
            return False
    return True


def load_results(path_or_name) -> dict:
    """Read a result file: a path, or the name of one stored in ``relbias/lab/results``.

    ``load_results("quick_extrapolation")`` reads ``relbias/lab/results/quick_extrapolation.json``.
    """
    return read_json(path_or_name, RESULTS_DIR, what="result")


# --- learned-bias read-back ------------------------------------------------------------


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


def learned_bias_from_results(results: dict) -> dict:
    """The read-back stored in an extrapolation result: ``{method: tensor [heads, offsets]}``."""
    return {
        name: torch.tensor(rec["learned_bias"]["values"])
        for name, rec in results["methods"].items()
        if rec.get("learned_bias")
    }


# --- plots -------------------------------------------------------------------------------


def plot_results(results: dict, path=None, *, factor: int | None = None):
    """Plot any result of :mod:`relbias.lab.experiments`; save to ``path`` if given.

    Extrapolation: bits per byte against evaluation length, and the loss by position
    at the longest (or given) length. Retrieval: accuracy against distance per length.
    Returns a :class:`matplotlib.figure.Figure` (not registered with pyplot, so nothing
    is left open behind it).
    """
    from matplotlib.figure import Figure

    kind = results.get("kind")
    if kind == "extrapolation":
        curves = any(_val_curves(rec) for rec in results["methods"].values())
        fig = Figure(figsize=(18 if curves else 12, 4.2))
        axes = fig.subplots(1, 3 if curves else 2)
        plot_extrapolation(results, ax=axes[0])
        plot_loss_by_position(results, factor=factor, ax=axes[1])
        if curves:
            plot_val_curves(results, ax=axes[2])
    elif kind == "retrieval":
        lengths = sorted({r["length"] for m in results["methods"].values() for r in m["eval"]})
        fig = Figure(figsize=(6 * len(lengths), 4.2))
        axes = fig.subplots(1, len(lengths), squeeze=False)
        for ax, length in zip(axes[0], lengths):
            plot_retrieval(results, length=length, ax=ax)
    else:
        raise ValueError(f"results kind must be 'extrapolation' or 'retrieval', got {kind!r}")
    fig.suptitle(_title(results), fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _new_axes():
    from matplotlib.figure import Figure

    return Figure(figsize=(6, 4.2)).subplots()


def _title(results: dict) -> str:
    prov = results.get("provenance", {})
    cfg = prov.get("config", {})
    return (
        f"{results.get('kind')} - config {cfg.get('name')}, train_len {cfg.get('train_len')}, "
        f"{cfg.get('steps')} steps, {prov.get('device')}"
    )


def shade_interval(ax, xs, rows, key: str, color) -> None:
    """Shade the 95 % interval over seeds (``<key>_low`` .. ``<key>_high``) where rows have it."""
    lows = [r.get(f"{key}_low") for r in rows]
    highs = [r.get(f"{key}_high") for r in rows]
    if any(v is None or not math.isfinite(v) for v in lows + highs):
        return
    ax.fill_between(xs, lows, highs, color=color, alpha=0.2, linewidth=0)


def method_style(name: str, index: int = 0) -> dict:
    """A fixed colour per method (tab10 plus black); dashed lines for the baselines.
    Names that are not methods (ablation variants) take the colour of their ``index``."""
    import matplotlib

    from relbias.lab.model import BASELINE_POSITIONS, POSITION_NAMES

    colors = [*matplotlib.colormaps["tab10"].colors, "black"]
    index = POSITION_NAMES.index(name) if name in POSITION_NAMES else index
    return {
        "linestyle": "--" if name in BASELINE_POSITIONS else "-",
        "marker": "o",
        "markersize": 3,
        "color": colors[index % len(colors)],
    }


def plot_extrapolation(results: dict, ax=None):
    """Bits per byte against evaluation length (log scale), one line per method."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        lengths = [r["length"] for r in res["eval"]]
        style = method_style(name, i)
        ax.plot(lengths, [r["bpb"] for r in res["eval"]], label=name, **style)
        shade_interval(ax, lengths, res["eval"], "bpb", style["color"])
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("evaluation length (tokens); grey line: training length")
    ax.set_ylabel("validation bits per byte")
    ax.legend(fontsize=7, ncol=2)
    return ax


def _val_curves(record: dict) -> list:
    """The validation curves of a method's record: one, or one per seed."""
    if "seeds" in record:
        return [
            r["train"]["val_curve"] for r in record["seeds"].values() if "val_curve" in r["train"]
        ]
    curve = record.get("train", {}).get("val_curve")
    return [curve] if curve else []


def plot_val_curves(results: dict, ax=None):
    """Validation bits per byte at the training length against training step, one line per
    method and seed (``config.val_every``): shows whether training levelled off."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        style = method_style(name, i)
        for k, curve in enumerate(_val_curves(res)):
            ax.plot(
                [p["step"] for p in curve],
                [p["bpb"] for p in curve],
                label=name if k == 0 else None,
                lw=1,
                linestyle=style["linestyle"],
                color=style["color"],
            )
    ax.set_xlabel("training step")
    ax.set_ylabel("validation bits per byte at the training length")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_loss_by_position(results: dict, factor: int | None = None, ax=None, *, window: int = 16):
    """Loss (bits) against position in the window at one length, smoothed over ``window``."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        rows = res["eval"]
        row = rows[-1] if factor is None else next(r for r in rows if r["factor"] == factor)
        y = np.convolve(row["loss_by_position"], np.ones(window) / window, mode="valid")
        style = method_style(name, i)
        ax.plot(
            np.arange(len(y)) + window - 1,
            y,
            label=name,
            lw=1,
            linestyle=style["linestyle"],
            color=style["color"],
        )
    ax.axvline(results["provenance"]["config"]["train_len"], color="grey", lw=0.8)
    ax.set_xlabel(f"position in the window (length {row['length']}, mean of {window})")
    ax.set_ylabel("bits per byte")
    ax.legend(fontsize=7, ncol=2)
    return ax


def plot_retrieval(results: dict, length: int | None = None, ax=None):
    """Recall accuracy against distance at one sequence length, one line per method."""
    ax = ax if ax is not None else _new_axes()
    for i, (name, res) in enumerate(results["methods"].items()):
        rows = [r for r in res["eval"] if length is None or r["length"] == length]
        style = method_style(name, i)
        distances = [r["distance"] for r in rows]
        ax.plot(distances, [r["accuracy"] for r in rows], label=name, **style)
        shade_interval(ax, distances, rows, "accuracy", style["color"])
    ax.axvline(results["provenance"]["config"]["train_len"] - 2, color="grey", lw=0.8)
    ax.axhline(0.1, color="grey", lw=0.8, linestyle=":")
    ax.set_xscale("log", base=2)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("distance back to the answer (grey: farthest trained; dotted: chance)")
    ax.set_ylabel("accuracy")
    ax.set_title(f"sequence length {length}" if length else "", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    return ax
