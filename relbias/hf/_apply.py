"""Put a relbias family into a Hugging Face causal LM: :func:`apply`, :func:`from_pretrained`."""

from __future__ import annotations

import copy
import json
import os

import torch
from torch import nn

from relbias._checks import check_bool
from relbias.biases.registry import BIAS_NAMES, DATA_DEPENDENT_NAMES, make_bias
from relbias.hf._attention import (
    ATTN_IMPLEMENTATION,
    KEPT_TABLE,
    attention_pre_hook,
    relbias_attention,
    relbias_mask,
)

#: Every family :func:`apply` takes: the position families, then the forget gate.
FAMILIES: tuple[str, ...] = tuple(BIAS_NAMES) + tuple(DATA_DEPENDENT_NAMES)
#: The name of the bias submodule: ``<layer>.self_attn.relbias`` per layer, or
#: ``<base model>.relbias`` when shared (the state-dict keys that hold its parameters).
BIAS_ATTRIBUTE = "relbias"
#: The config attribute that records the choice (saved in config.json).
CONFIG_ATTRIBUTE = "relbias"
#: The ``attn_implementation`` that :func:`apply` writes into the saved config.json: a name
#: transformers has no attention function for (none is registered under it), so that
#: ``AutoModelForCausalLM.from_pretrained`` (or ``from_config``) refuses a saved model with
#: this text in its error, before reading a weight, instead of building it without its
#: biases (which it would list as unexpected keys and drop). :func:`from_pretrained` passes
#: an implementation of its own, and the model runs under :data:`ATTN_IMPLEMENTATION`.
SAVED_ATTN_IMPLEMENTATION = (
    "relbias (this model's biases load only with: import relbias.hf; "
    "relbias.hf.from_pretrained(path))"
)


#: The most offsets on either side of 0 whose values :func:`apply` keeps for a parameter-free
#: family (a table of ``2 * n - 1`` columns per head; 2 MB for 32 heads).
KEPT_POSITIONS = 8192


def register() -> None:
    """Register the ``"relbias"`` attention and mask functions with transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, relbias_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, relbias_mask)


def _check_model(model):
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        raise TypeError(f"model must be a transformers PreTrainedModel, got {type(model).__name__}")
    implementation = model.config._attn_implementation
    if isinstance(implementation, str) and "flash" in implementation:
        raise ValueError(
            f"model's attn_implementation={implementation!r} is a flash-attention kernel, "
            "which takes no additive bias and would drop the relbias bias; load the model "
            "with attn_implementation='sdpa' or 'eager' before relbias.hf.apply"
        )
    if not type(model)._can_set_attn_implementation():
        raise ValueError(
            f"{type(model).__name__}'s attention does not go through transformers' "
            "AttentionInterface, so relbias cannot add a bias to it (relbias.hf serves the "
            "Llama family: Llama, Qwen2, Mistral, ...)"
        )
    layers = getattr(model.base_model, "layers", None)
    if not isinstance(layers, nn.ModuleList) or not all(
        isinstance(getattr(layer, "self_attn", None), nn.Module)
        and isinstance(getattr(layer.self_attn, "layer_idx", None), int)
        for layer in layers
    ):
        raise ValueError(
            f"{type(model).__name__} has no decoder layers with an attention module at "
            "model.base_model.layers[i].self_attn (with a layer_idx): relbias.hf serves the "
            "Llama family (Llama, Qwen2, Mistral, ...)"
        )
    return [layer.self_attn for layer in layers]


def _check_family(family):
    if not isinstance(family, str) or family not in FAMILIES:
        raise ValueError(f"family must be one of {list(FAMILIES)}, got {family!r}")


def _build(family: str, num_heads: int, hidden_size: int, bias_kwargs: dict):
    kwargs = dict(bias_kwargs)
    if family in DATA_DEPENDENT_NAMES:
        kwargs.setdefault("dim", hidden_size)
    try:
        return make_bias(family, num_heads, **kwargs)
    except TypeError as error:
        raise TypeError(
            f"bias_kwargs {sorted(bias_kwargs)} do not fit family {family!r}: {error}"
        ) from error


def _identity_rotary(module, args, output):
    """RoPE off: cos = 1, sin = 0, so ``q * cos + rotate_half(q) * sin`` is ``q`` exactly."""
    cos, sin = output
    return torch.ones_like(cos), torch.zeros_like(sin)


def _guard(model, args, kwargs):
    implementation = model.config._attn_implementation
    if implementation != ATTN_IMPLEMENTATION:
        raise RuntimeError(
            f"this model carries relbias biases but its attn_implementation is now "
            f"{implementation!r}, which would drop them; set it back with "
            f"model.set_attn_implementation({ATTN_IMPLEMENTATION!r})"
        )


def rotary_modules(model) -> list[nn.Module]:
    """The rotary embedding modules of ``model`` (``...RotaryEmbedding``)."""
    return [m for m in model.modules() if type(m).__name__.endswith("RotaryEmbedding")]


def _keep_offset_table(model, attentions, bias, config) -> None:
    """For a parameter-free family that depends on the offset alone (ALiBi, Sandwich): its
    values at every offset that a static cache of up to ``max_position_embeddings`` slots (at
    most :data:`KEPT_POSITIONS`) meets, kept as a non-persistent buffer of the base model
    (not saved; moved with the model) for a compiled decoding step to read
    (:func:`relbias.hf._attention._kept_row`), the same values in every layer."""
    if not getattr(bias, "offset_only", False) or any(True for _ in bias.parameters()):
        return
    n = min(int(getattr(config, "max_position_embeddings", 0) or 0), KEPT_POSITIONS)
    if n < 1:
        return
    with torch.no_grad():
        table = bias.offset_table(-(n - 1), n - 1)  # [heads, 2n - 1]: offset -(n - 1) first
    home = model.base_model
    home.register_buffer(KEPT_TABLE, table, persistent=False)
    # The dtype it was computed in: a model cast later (its buffers with it) reads no table.
    object.__setattr__(home, "_relbias_table_dtype", table.dtype)
    for attention in attentions:
        object.__setattr__(attention, "_relbias_table_home", home)


def apply(model, family, *, shared=False, keep_rope=False, **bias_kwargs):
    """Put the relbias bias ``family`` into every decoder layer of ``model``, in place.

    ``model`` is a transformers causal LM whose attention goes through transformers'
    ``AttentionInterface`` (the Llama family: Llama, Qwen2, Mistral, ...), built from a
    config or loaded with ``attn_implementation="sdpa"`` or ``"eager"``. ``family`` is one
    of :data:`FAMILIES` (:data:`relbias.BIAS_NAMES` and the forget gate ``"forgetting"``,
    which serves training and evaluation without a cache); ``bias_kwargs`` go to its
    constructor (:func:`relbias.make_bias`, with ``num_heads`` the model's attention heads;
    the forget gate's ``dim`` defaults to the hidden size) and must be JSON values.

    ``shared=False`` (default) gives every layer its own bias (its own parameters);
    ``shared=True`` one bias for all layers, as T5 shares its table. ``keep_rope=False``
    (default) turns RoPE off (the rotary embedding returns cos = 1, sin = 0, which leaves
    queries and keys exactly as they are); ``keep_rope=True`` keeps it under the bias.

    The model's attention implementation becomes ``"relbias"`` (registered with
    ``AttentionInterface`` and ``AttentionMaskInterface``), and the choice is recorded in
    ``model.config.relbias``, so ``model.save_pretrained(path)`` and
    :func:`from_pretrained` give the same model back (the bias parameters are in the state
    dict: ``...self_attn.relbias.*`` per layer, ``model.relbias.*`` shared). The config also
    gets ``attn_implementation`` = :data:`SAVED_ATTN_IMPLEMENTATION`, saved in config.json, so
    that transformers' own ``AutoModelForCausalLM.from_pretrained(path)`` fails with an error
    naming :func:`from_pretrained` rather than loading the model without its biases (an
    ``attn_implementation`` passed to it explicitly overrides that guard). Returns ``model``.
    """
    attentions = _check_model(model)
    _check_family(family)
    shared = check_bool("shared", shared)
    keep_rope = check_bool("keep_rope", keep_rope)
    if getattr(model, "_relbias_handles", None):
        raise ValueError("model already carries relbias biases; apply to a fresh model")
    try:
        json.dumps(bias_kwargs)
    except TypeError as error:
        raise TypeError(
            f"bias_kwargs must be JSON values (they are saved in config.json): {error}"
        ) from error
    config = _own_config(model)
    num_heads = config.num_attention_heads
    hidden_size = config.hidden_size
    device = next(model.parameters()).device
    register()

    def build():
        return _build(family, num_heads, hidden_size, bias_kwargs).to(device)

    if shared:
        bias = build()
        model.base_model.add_module(BIAS_ATTRIBUTE, bias)
        biases = [bias] * len(attentions)
    else:
        biases = [build() for _ in attentions]
    handles = []
    for attention, bias in zip(attentions, biases):
        if not shared:
            attention.add_module(BIAS_ATTRIBUTE, bias)
        # A plain reference (not a submodule): a shared bias stays one entry in the state dict.
        object.__setattr__(attention, "_relbias_bias", bias)
        object.__setattr__(attention, "_relbias_family", family)
        handles.append(attention.register_forward_pre_hook(attention_pre_hook, with_kwargs=True))
    _keep_offset_table(model, attentions, biases[0], config)
    rotaries = [] if keep_rope else rotary_modules(model)
    handles += [r.register_forward_hook(_identity_rotary) for r in rotaries]
    handles.append(model.register_forward_pre_hook(_guard, with_kwargs=True))
    object.__setattr__(model, "_relbias_handles", handles)
    setattr(
        config,
        CONFIG_ATTRIBUTE,
        {
            "family": family,
            "shared": shared,
            "keep_rope": keep_rope,
            "bias_kwargs": dict(bias_kwargs),
        },
    )
    # A plain attribute (not the internal ``_attn_implementation``, which is not saved):
    # config.json records it as ``attn_implementation``, read back on load.
    config.attn_implementation = SAVED_ATTN_IMPLEMENTATION
    model.set_attn_implementation(ATTN_IMPLEMENTATION)
    return model


def _own_config(model):
    """Give ``model`` a config object of its own before :func:`apply` writes into it.

    Models built from one ``PretrainedConfig`` object share it (every layer keeps a reference),
    so writing the attention implementation into it would switch the other models too, and
    they would fail at their next forward. Every module that holds the shared object gets
    the copy."""
    shared = model.config
    own = copy.deepcopy(shared)
    for module in model.modules():
        if getattr(module, "config", None) is shared:
            module.config = own
    return own


def biases(model) -> list[nn.Module]:
    """The bias module of every decoder layer of a model that :func:`apply` prepared
    (the same module in every entry when shared)."""
    attentions = _check_model(model)
    found = [getattr(a, "_relbias_bias", None) for a in attentions]
    if any(b is None for b in found):
        raise ValueError("model carries no relbias biases: call relbias.hf.apply first")
    return found


def _checkpoint_tensors(path: str, names: set[str]) -> dict[str, torch.Tensor]:
    """The tensors ``names`` from a saved model directory (safetensors, sharded or not)."""
    from safetensors import safe_open

    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            weight_map = json.load(f)["weight_map"]
        files = sorted({weight_map[n] for n in names if n in weight_map})
    elif os.path.isfile(os.path.join(path, "model.safetensors")):
        files = ["model.safetensors"]
    else:
        raise FileNotFoundError(
            f"no model.safetensors (or model.safetensors.index.json) in {path!r}"
        )
    out = {}
    for name in files:
        with safe_open(os.path.join(path, name), framework="pt") as f:
            for key in f.keys():
                if key in names:
                    out[key] = f.get_tensor(key)
    return out


def from_pretrained(path, **kwargs):
    """Load a model saved after :func:`apply` (``model.save_pretrained(path)``), biases included.

    ``path`` is a local directory; ``kwargs`` go to
    ``transformers.AutoModelForCausalLM.from_pretrained`` (``dtype``, ``device_map``, ...).
    The family, sharing and RoPE choice are read from ``config.relbias``; every bias
    parameter and persistent buffer is read from the checkpoint (a missing one is an error).
    The base architecture is loaded with ``attn_implementation="sdpa"``, which overrides the
    :data:`SAVED_ATTN_IMPLEMENTATION` guard of config.json, and :func:`apply` sets it again
    (a model saved again keeps the guard).
    """
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    path = os.fspath(path)
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f"path must be a local directory written by save_pretrained, got {path!r}"
        )
    if "attn_implementation" in kwargs:
        raise ValueError(
            "attn_implementation is set by relbias (to 'relbias'); do not pass it to "
            "relbias.hf.from_pretrained"
        )
    register()
    config = AutoConfig.from_pretrained(path)
    spec = getattr(config, CONFIG_ATTRIBUTE, None)
    if not isinstance(spec, dict) or "family" not in spec:
        raise ValueError(
            f"{path!r} holds no relbias model (its config has no 'relbias' entry); load it "
            "with transformers and call relbias.hf.apply"
        )
    delattr(config, CONFIG_ATTRIBUTE)
    # HF reports the bias parameters as unexpected keys of the bare architecture: they are
    # loaded below, so its report is silenced for this one call.
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, config=config, attn_implementation="sdpa", **kwargs
        )
    finally:
        hf_logging.set_verbosity(verbosity)
    apply(
        model,
        spec["family"],
        shared=spec.get("shared", False),
        keep_rope=spec.get("keep_rope", False),
        **spec.get("bias_kwargs", {}),
    )
    expected = {name for name in model.state_dict() if f".{BIAS_ATTRIBUTE}." in f".{name}"}
    found = _checkpoint_tensors(path, expected)
    missing = sorted(expected - set(found))
    if missing:
        raise ValueError(f"the checkpoint in {path!r} lacks relbias tensors {missing}")
    state = model.state_dict()
    with torch.no_grad():
        for name, tensor in found.items():
            state[name].copy_(tensor)
    return model
