"""Training :class:`~relbias.lab.model.TinyLM`: the model of a configuration and the loop.

:func:`train_lm` trains a model in place with AdamW (linear warm-up, cosine decay to a
tenth of the peak) and returns its history. It runs with deterministic algorithms on
(:func:`~relbias.lab.device.deterministic_algorithms`, restored afterwards), so two runs of
the same configuration and seed on the CPU give the same numbers, and a run interrupted
and resumed from its checkpoint (:mod:`relbias.lab.checkpoint`) gives the numbers of an
uninterrupted one.
"""

from __future__ import annotations

import math
import signal
import threading
import time
from pathlib import Path

import torch

from relbias.biases.kerple import project_after_steps
from relbias.lab.checkpoint import (
    TrainingInterrupted,
    load_checkpoint,
    rng_states,
    save_checkpoint,
    set_rng_states,
)
from relbias.lab.config import Config
from relbias.lab.data import random_windows
from relbias.lab.device import autocast, autocast_dtype, deterministic_algorithms
from relbias.lab.evaluation import LN2, validation_bpb, validation_windows
from relbias.lab.model import TinyLM, lm_loss

__all__ = ["build_model", "lr_at", "make_optimizer", "train_lm"]


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


def lr_at(step: int, config: Config, steps: int) -> float:
    """The learning rate of ``step``: linear warm-up, then cosine decay to 10 % of the peak."""
    warm = min(config.warmup, max(steps // 10, 1))
    if step < warm:
        return config.lr * (step + 1) / warm
    frac = (step - warm) / max(steps - warm, 1)
    return config.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))


def make_optimizer(model: torch.nn.Module, config: Config) -> torch.optim.Optimizer:
    """AdamW; weight decay only on matrices outside the bias modules; parameters that do
    not learn (``requires_grad=False``) are left out."""
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


def _check_int(name: str, value, minimum: int, *, optional: bool = False):
    if optional and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or None" if optional else ""
        raise ValueError(f"{name} must be an integer >= {minimum}{extra}, got {value!r}")
    return value


class _Run:
    """One training run's state: model, optimiser, gradient scaler, batch generator and
    what has been recorded so far. It saves itself to a checkpoint and restores from one."""

    def __init__(self, model, config: Config, steps: int, device, seed, run_id, amp_dtype):
        self.model, self.config, self.steps, self.device = model, config, steps, device
        self.run_id, self.amp_dtype = run_id, amp_dtype
        self.gen = torch.Generator().manual_seed(config.seed if seed is None else seed)
        self.opt = make_optimizer(model, config)
        self.scaler = torch.amp.GradScaler(
            "cuda", enabled=autocast_dtype(device, amp_dtype) == torch.float16
        )
        self.first, self.tokens, self.elapsed = 0, 0, 0.0
        self.losses, self.pending, self.val_curve, self.resumed_at = [], [], [], []
        self.start = time.perf_counter()

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> None:
        for group in self.opt.param_groups:
            group["lr"] = lr_at(step, self.config, self.steps)
        if self.device.type == "cuda":
            x = x.pin_memory().to(self.device, non_blocking=True)
            y = y.pin_memory().to(self.device, non_blocking=True)
        else:
            x, y = x.to(self.device), y.to(self.device)
        with autocast(self.device, self.amp_dtype):
            loss = lm_loss(self.model(x), y)
        self.opt.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        self.scaler.unscale_(self.opt)
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.config.grad_clip)
        self.scaler.step(self.opt)
        self.scaler.update()
        self.pending.append(loss.detach())  # read from the device every few steps (flush)
        self.tokens += x.numel()

    def flush(self) -> None:
        if self.pending:
            self.losses += (torch.stack(self.pending).float().cpu() / LN2).tolist()
            self.pending = []

    def wall_s(self) -> float:
        return self.elapsed + time.perf_counter() - self.start

    def save(self, path, step_done: int) -> None:
        self.flush()
        save_checkpoint(
            path,
            {
                "run": self.run_id,
                "total_steps": self.steps,
                "step": step_done,
                "model": self.model.state_dict(),
                "optimizer": self.opt.state_dict(),
                "scaler": self.scaler.state_dict(),
                "generator": self.gen.get_state(),
                "rng": rng_states(),
                "losses": list(self.losses),
                "tokens": self.tokens,
                "val_curve": list(self.val_curve),
                "wall_s": self.wall_s(),
                "resumed_at": self.resumed_at,
                "config": self.config.to_dict(),
            },
        )

    def restore(self, path) -> None:
        state = load_checkpoint(path)
        if state.get("total_steps") != self.steps or (
            self.run_id is not None and state["run"] != self.run_id
        ):
            raise ValueError(
                f"the checkpoint {path} is of another run ({state.get('run')}, "
                f"{state.get('total_steps')} steps), not of {self.run_id} with {self.steps} steps"
            )
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["optimizer"])
        self.scaler.load_state_dict(state["scaler"])
        self.gen.set_state(state["generator"])
        set_rng_states(state["rng"])
        self.first, self.losses, self.tokens = state["step"], state["losses"], state["tokens"]
        self.val_curve, self.elapsed = state["val_curve"], state["wall_s"]
        self.resumed_at = [*state.get("resumed_at", []), self.first]

    def history(self, with_val_curve: bool) -> dict:
        self.flush()
        wall = self.wall_s()
        tail = self.losses[-max(1, min(20, self.steps)) :]
        out = {
            "steps": self.steps,
            "tokens": self.tokens,
            "wall_s": wall,
            "tokens_per_s": self.tokens / max(wall, 1e-9),
            "losses": self.losses,
            "final_loss_bits": sum(tail) / len(tail),
        }
        if with_val_curve:
            out["val_curve"] = self.val_curve
        if self.resumed_at:
            out["resumed_at"] = self.resumed_at
        return out


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
    sync_every: int = 10,
    deterministic: bool = True,
    amp_dtype="auto",
) -> dict:
    """Train ``model`` in place with AdamW and return its training history.

    ``data`` is either a uint8 tensor of training bytes (random windows of
    ``config.train_len``) or a function ``batch(generator) -> (inputs, targets)``.
    Batches come from a ``torch.Generator`` seeded with ``seed`` (default
    ``config.seed``), so every method sees the same batches. ``progress`` shows a
    tqdm bar with loss and speed (``tqdm.auto``: the notebook widget in Jupyter).

    Returns ``{"steps", "tokens", "wall_s", "tokens_per_s", "losses", "final_loss_bits"}``
    where ``losses`` is the training loss in bits per step.

    Optional:

    - ``val_data`` (validation bytes) and ``val_every`` (default ``config.val_every``; 0 is
      off): every ``val_every`` steps and at the end, bits per byte at the training length
      on :func:`~relbias.lab.evaluation.validation_windows`, returned as
      ``"val_curve": [{"step", "bpb"}, ...]`` (``step`` = steps done).
    - ``checkpoint`` (a path): the training state is written atomically every
      ``checkpoint_every`` steps and/or ``checkpoint_seconds`` seconds, at the end, and
      when Ctrl-C (SIGINT) arrives, which then ends the run at the next step boundary with
      :class:`~relbias.lab.checkpoint.TrainingInterrupted` (without a checkpoint, Ctrl-C
      interrupts as usual). ``resume=True`` continues from that file when it exists; the
      result equals an uninterrupted run's. ``run_id`` is stored with it.
    - ``before_step(step, model)`` runs before each step's batch, ``after_step(step, model)``
      after each step (``step`` counts from 0). A ``KeyboardInterrupt`` raised by
      ``after_step`` is handled like Ctrl-C.
    - ``sync_every``: steps between reads of the loss from the device (a read per step
      would make the CPU wait for the GPU at every step).
    - ``deterministic``: run with deterministic algorithms (the caller's setting is
      restored afterwards).
    - ``amp_dtype``: the autocast dtype on CUDA (:func:`~relbias.lab.device.autocast_dtype`:
      ``"auto"`` picks it from the GPU; float16 brings a gradient scaler).
    """
    steps = _check_int("steps", config.steps if steps is None else steps, 1)
    val_every = _check_int("val_every", config.val_every if val_every is None else val_every, 0)
    checkpoint_every = _check_int("checkpoint_every", checkpoint_every, 1, optional=True)
    sync_every = _check_int("sync_every", sync_every, 1)
    if checkpoint_seconds is not None and not checkpoint_seconds > 0:
        raise ValueError(f"checkpoint_seconds must be > 0 or None, got {checkpoint_seconds!r}")
    if resume and checkpoint is None:
        raise ValueError("resume=True needs checkpoint (the path of the saved state)")
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).train()
    batch = data if callable(data) else _text_batches(data, config)
    autocast_dtype(device, amp_dtype)  # a bad amp_dtype fails here, before any work
    run = _Run(model, config, steps, device, seed, run_id, amp_dtype)
    # Kerple's constraints (r1 > 0, 0 < r2 <= 2) are restored after every step of this
    # optimiser (the module also clamps them when it computes a bias).
    projection = project_after_steps(run.opt, model)
    val_x = val_y = None
    if val_data is not None and val_every:
        val_x, val_y = validation_windows(val_data, config)
    if resume and Path(checkpoint).is_file():
        run.restore(checkpoint)
    last_save = time.perf_counter()

    def interrupted(step_done: int, cause=None):
        if checkpoint is not None:
            run.save(checkpoint, step_done)
            saved = f"saved the training state after step {step_done} of {steps} to {checkpoint}"
        else:
            saved = "nothing was saved (no checkpoint path was given)"
        raise TrainingInterrupted(
            f"training interrupted (Ctrl-C): {saved}",
            checkpoint=Path(checkpoint) if checkpoint is not None else None,
            step=step_done,
        ) from cause

    with (
        deterministic_algorithms(deterministic),
        _progress_bar(steps, desc, progress) as bar,
        _sigint_flag(checkpoint is not None) as sigint,
    ):
        bar.update(run.first)
        for step in range(run.first, steps):
            if before_step is not None:
                before_step(step, model)
            run.step(step, *batch(run.gen))
            done = step + 1
            if len(run.pending) == sync_every or done == steps:
                run.flush()
                bar.update(done - bar.n)
                bar.set_postfix(bits=f"{run.losses[-1]:.3f}", refresh=False)
            if val_x is not None and (done % val_every == 0 or done == steps):
                bpb = validation_bpb(model, val_x, val_y, config, device, amp_dtype)
                run.val_curve.append({"step": done, "bpb": bpb})
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
                run.save(checkpoint, done)
                last_save = time.perf_counter()
    projection.remove()
    model.eval()
    return run.history(with_val_curve=val_x is not None)


def _text_batches(data: torch.Tensor, config: Config):
    def batch(gen):
        return random_windows(data, config.batch_size, config.train_len, gen)

    return batch


def _progress_bar(total: int, desc: str | None, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, unit="step")


class _SigintFlag:
    fired = False


class _sigint_flag:  # noqa: N801 (a context manager used like a function)
    """While active (in the main thread, when ``enabled``: a run with a checkpoint), Ctrl-C
    sets ``.fired`` instead of raising, so that the training loop stops at a step boundary
    with a consistent state to save. A second Ctrl-C raises at once."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled

    def __enter__(self):
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
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)
        return False
