"""Extend a trained RoPE model past its training length: the retrofit options.

A model pretrained with RoPE at a short length ``m_l`` must serve a longer one after a short
fine-tune. Each option of :data:`OPTIONS` is one way to prepare the loaded checkpoint:

- ``control``: RoPE unchanged (fine-tuned the same as the others);
- ``linear``, ``dynamic_ntk``, ``yarn``: RoPE kept and scaled by a factor ``s`` through HF's
  own ``rope_parameters`` (``rope_type`` ``"linear"``: positions divided by ``s``, Chen et
  al. 2023; ``"dynamic"``: the base raised with the length read, bloc97/emozilla; ``"yarn"``:
  per-frequency interpolation and a temperature, Peng et al. 2023);
- ``alibi``, ``t5``, ``kerple_log``, ``fire``: RoPE turned off and the relbias family put
  into every layer (:func:`relbias.hf.apply`), its parameters at their initial values;
- ``yarn+alibi``: YaRN-scaled RoPE kept under ALiBi (``keep_rope=True``).

:func:`load_option` loads a saved base with one option applied; :func:`fine_tune` trains it
with HF's Trainer and records the loss at ``m_l`` along the way (the recovery curve);
:func:`params_added` counts what an option adds; :func:`rotation_rates` reads how a loaded
option's RoPE turns each pair of dimensions, as HF computes it.
"""

from __future__ import annotations

import torch

from relbias._checks import check_choice, check_int
from relbias.hf.evaluation import reset_dynamic_rope

__all__ = [
    "OPTIONS",
    "fine_tune",
    "held_out_bpb",
    "load_option",
    "params_added",
    "reset_dynamic_rope",
    "rope_parameters",
    "rotation_rates",
]

#: Every option: the RoPE scaling (``rope_type`` for HF's ``rope_parameters``, or None for
#: RoPE as trained), the relbias family (or None), whether RoPE stays under the bias, and
#: the family's keyword arguments (``"m_l"`` is replaced by the training length).
OPTIONS: dict[str, dict] = {
    "control": {"rope_type": None, "family": None},
    "linear": {"rope_type": "linear", "family": None},
    "dynamic_ntk": {"rope_type": "dynamic", "family": None},
    "yarn": {"rope_type": "yarn", "family": None},
    "alibi": {"rope_type": None, "family": "alibi"},
    "t5": {"rope_type": None, "family": "t5", "bias_kwargs": {"max_distance": "m_l"}},
    "kerple_log": {"rope_type": None, "family": "kerple_log"},
    "fire": {"rope_type": None, "family": "fire", "bias_kwargs": {"L": "m_l"}},
    "yarn+alibi": {"rope_type": "yarn", "family": "alibi", "keep_rope": True},
}


def rope_parameters(config, rope_type: str, factor: float) -> dict:
    """HF's ``rope_parameters`` for ``rope_type`` scaled by ``factor`` from the checkpoint's
    ``config`` (its ``rope_theta``; its ``max_position_embeddings`` is the original length)."""
    theta = config.rope_parameters["rope_theta"]
    params = {"rope_type": rope_type, "factor": float(factor), "rope_theta": theta}
    if rope_type == "yarn":
        params["original_max_position_embeddings"] = config.max_position_embeddings
    return params


def load_option(path, option: str, *, factor: float = 4.0):
    """The checkpoint saved in ``path`` (``save_pretrained``, a Llama-family model with RoPE),
    loaded with ``option`` applied: a ``transformers`` model ready to fine-tune."""
    from transformers import AutoConfig, AutoModelForCausalLM

    import relbias.hf as rh

    option = check_choice("option", option, set(OPTIONS))
    if not factor > 1:
        raise ValueError(f"factor must be a number > 1, got {factor!r}")
    spec = OPTIONS[option]
    kwargs = {"attn_implementation": "sdpa"}
    config = AutoConfig.from_pretrained(path)
    if spec["rope_type"] is not None:
        kwargs["rope_parameters"] = rope_parameters(config, spec["rope_type"], factor)
    model = AutoModelForCausalLM.from_pretrained(path, **kwargs)
    if spec["family"] is not None:
        m_l = config.max_position_embeddings
        bias_kwargs = {
            k: (m_l if v == "m_l" else v) for k, v in spec.get("bias_kwargs", {}).items()
        }
        rh.apply(model, spec["family"], keep_rope=spec.get("keep_rope", False), **bias_kwargs)
    return model


def params_added(model, base) -> int:
    """Parameters of ``model`` beyond those of ``base``."""
    return sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in base.parameters())


def rotation_rates(config, length: int | None = None) -> tuple[torch.Tensor, float]:
    """How a RoPE model with ``config`` turns its pairs of dimensions, as HF computes it:
    each pair's angle per position (radians, float64, pair 1 first: ``theta_k``) and the
    factor HF puts on cos and sin (YaRN's temperature; 1 otherwise), for an input of
    ``length`` tokens (default: the training length, ``max_position_embeddings``; only
    dynamic NTK depends on it, raising its base past the training length)."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = config.rope_parameters
    rope_type = check_choice(
        "rope_type", params.get("rope_type", "default"), {"default", "linear", "dynamic", "yarn"}
    )
    m_l = config.max_position_embeddings
    length = m_l if length is None else check_int("length", length, minimum=1)
    if rope_type == "default":
        d = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        steps = torch.arange(0, d, 2, dtype=torch.float64) / d
        return float(params["rope_theta"]) ** -steps, 1.0
    kwargs = {"seq_len": length} if rope_type == "dynamic" else {}
    inv_freq, scale = ROPE_INIT_FUNCTIONS[rope_type](config, None, **kwargs)
    return inv_freq.double(), float(scale)


def _recovery_callback(read, every: int, curve: list):
    """A Trainer callback: ``read(model)`` before the first step and every ``every`` steps."""
    from transformers import TrainerCallback

    class _Recovery(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            curve.append({"step": 0, "bpb": read(model)})

        def on_step_end(self, args, state, control, model=None, **kwargs):
            if state.global_step % every == 0:
                curve.append({"step": state.global_step, "bpb": read(model)})

    return _Recovery()


@torch.no_grad()
def held_out_bpb(model, x, sizes) -> float:
    """Bits per byte of ``model`` on the windows ``x`` (``[windows, n]`` token ids), every
    window read from position 0; ``sizes``: the byte length of each token id."""
    was = model.training
    model.eval()
    reset_dynamic_rope(model)  # read at this length, not at the longest length read before
    logits = model(input_ids=x[:, :-1], use_cache=False).logits.float()
    nats = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1), reduction="sum"
    )
    model.train(was)
    return float(nats) / torch.log(torch.tensor(2.0)).item() / int(sizes[x[:, 1:]].sum())


def fine_tune(model, dataset, output_dir, *, steps, batch_size, lr, seed, held_out, sizes, every):
    """Fine-tune ``model`` on ``dataset`` with HF's Trainer (:func:`relbias.hf.pretrain.
    pretrain`, the room's one set-up); every ``every`` steps, its bits per byte on
    ``held_out`` (windows of the training length). Returns ``{"losses": [...],
    "recovery": [{"step", "bpb"}, ...]}``."""
    from relbias.hf.pretrain import pretrain

    every = check_int("every", every, minimum=1)
    curve: list = []
    recovery = _recovery_callback(lambda m: held_out_bpb(m, held_out, sizes), every, curve)
    losses = pretrain(
        model,
        dataset,
        output_dir,
        steps=steps,
        batch_size=batch_size,
        lr=lr,
        seed=seed,
        logging_steps=every,
        callbacks=[recovery],
    )
    return {"losses": losses, "recovery": curve}
