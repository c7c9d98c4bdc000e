r"""A fused CPU kernel: the bias computed inside attention, one block of scores at a time.

``biased_attention(..., backend="fused")`` runs ``csrc/fused_attention.cpp``, a
flash-style attention kernel for the CPU: for each block of query rows and block of
keys it computes the scores :math:`q_i k_j^\top / \sqrt{d}` with one matrix product,
adds :math:`\mathrm{PE}(i, j)` to them in place, and folds them into a running softmax
(a running maximum and sum per row), so that no ``q_len x k_len`` tensor exists and
no block above the causal diagonal is computed: FlashAttention's loop (Dao et al.,
2022, arXiv:2205.14135) with the online softmax of Rabe & Staats (2021,
arXiv:2112.05682). The bias comes from the O(n) pieces of a prepared bias
(:func:`relbias.attention.flex.prepare_bias`):

* an offset-only family reads ``PE(i, j)`` from its table: the bias of one row of a
  block is a contiguous run of the reversed table, added with vector loads;
* FIRE computes :math:`f_\theta(\psi(|i-j|) / \psi(\max(L, i)))` per score, with
  :math:`\psi(|i-j|)` read the same way and the MLP folded to its switching hidden
  units (:meth:`relbias.attention.flex.FIREBias.folded_mlp`).

The kernel is C++, compiled on first use with :func:`torch.utils.cpp_extension.load`
(a C++ compiler and ``ninja`` are needed; the build takes about 15 s once per
machine and is cached). It runs forward only, in float32, on the CPU. Where it cannot
be built, :func:`available` is false, :func:`unavailable_reason` says why, and
``backend="auto"`` takes the table path instead. Set ``RELBIAS_FUSED=0`` to turn it
off.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import torch

from relbias.attention.flex import PreparedBias

__all__ = [
    "Q_BLOCK",
    "KV_BLOCK",
    "SOURCE",
    "available",
    "build_info",
    "fused_attention",
    "unavailable_reason",
]

#: The C++ source of the kernel.
SOURCE = Path(__file__).with_name("csrc") / "fused_attention.cpp"
#: Query rows per block (each block is one task for a thread) ...
Q_BLOCK = 128
#: ... and keys per block of scores (``Q_BLOCK x KV_BLOCK`` floats stay in the cache).
KV_BLOCK = 512

_LOCK = threading.Lock()
_BUILD: dict = {}

#: Compiler flags per CPU capability (``torch.backends.cpu.get_cpu_capability()``): the
#: vector width of ATen's ``Vectorized<float>`` that the kernel uses.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
    "DEFAULT": [],
}


def _flags() -> tuple[str, list[str]]:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _CAPABILITY_FLAGS:
        capability = "DEFAULT"
    flags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY={capability}"]
    if capability != "DEFAULT":
        flags.append(f"-DCPU_CAPABILITY_{capability}")
    return capability, flags + _CAPABILITY_FLAGS[capability]


def _build() -> None:
    if os.environ.get("RELBIAS_FUSED", "1") == "0":
        raise RuntimeError("turned off by RELBIAS_FUSED=0")
    try:  # the ninja of the pip package, which need not be on PATH
        import ninja

        if ninja.BIN_DIR not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + os.environ.get("PATH", "")
    except ImportError:
        pass
    import logging

    from torch.utils import cpp_extension

    capability, flags = _flags()
    start = time.perf_counter()
    # the build logs at INFO level (and its compiler's output on failure only)
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        cpp_extension.load(
            name=f"relbias_fused_{capability.lower()}",
            sources=[str(SOURCE)],
            extra_cflags=flags,
            extra_ldflags=["-fopenmp"],
            is_python_module=False,
            verbose=False,
        )
    finally:
        logger.setLevel(level)
    _self_test()
    _BUILD.update(capability=capability, flags=flags, seconds=time.perf_counter() - start)


def _self_test() -> None:
    """One small attention through the loaded kernel, checked against plain PyTorch.

    Its matrix products need oneDNN's CPU micro-kernels, which a PyTorch build or a CPU
    may lack: then the kernel raises, and ``backend="auto"`` must not take it.
    """
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 9, 8, generator=gen) for _ in range(3))
    table = torch.randn(2, 17, generator=gen)  # offsets -8 .. 8, reversed: entry 0 is 8
    offsets = torch.arange(9)[:, None] - torch.arange(9)[None, :]
    scores = q @ k.transpose(-1, -2) / 8**0.5 + table[:, 8 - offsets]
    scores = scores.masked_fill(offsets < 0, float("-inf"))
    expected = torch.softmax(scores, dim=-1) @ v
    got = torch.ops.relbias_fused.offset_attention(q, k, v, table, 8, 0, True, 4, 4)
    if not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError("the kernel's self-test gave wrong values")


def available() -> bool:
    """Whether the kernel is built and loaded (building it on the first call)."""
    with _LOCK:
        if "ok" not in _BUILD:
            try:
                _build()
                _BUILD["ok"], _BUILD["error"] = True, None
            except Exception as err:  # noqa: BLE001 - no compiler, no ninja, turned off
                _BUILD["ok"], _BUILD["error"] = False, f"{type(err).__name__}: {err}"[:500]
    return _BUILD["ok"]


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used here (None when it can)."""
    return None if available() else _BUILD["error"]


def build_info() -> dict:
    """The build: ``ok``, ``error``, ``capability``, compiler ``flags`` and ``seconds``
    (compiling, or loading the cached build)."""
    available()
    return dict(_BUILD)


def _why_not(q, k, v, bias) -> str | None:
    """None when the kernel can compute this attention, else why not."""
    if not isinstance(bias, PreparedBias) or bias.kind not in ("offset", "fire"):
        return "it needs a bias of an offset-only family or FIRE"
    if any(t.device.type != "cpu" for t in (q, k, v)):
        return "it runs on the CPU only"
    if any(t.dtype != torch.float32 for t in (q, k, v)):
        return f"it runs in float32 only, got {q.dtype}"
    if torch.is_grad_enabled() and (bias.requires_grad or any(t.requires_grad for t in (q, k, v))):
        return "it has no backward: use backend='materialize' or torch.no_grad()"
    return None


def _kernel_inputs(bias: PreparedBias, causal: bool) -> tuple:
    """The bias's O(n) tensors as the kernel reads them, cached on the prepared bias."""
    key = ("fused", causal)
    cache = bias._backend_inputs
    if key not in cache:
        if bias.kind == "offset":
            cache[key] = (bias._reversed_table(False, torch.float32),)
        else:
            psi, _ = bias._reversed(False, torch.float32)
            w1, b1, w2, slope, intercept = bias.folded_mlp(causal)
            cache[key] = tuple(
                t.detach().float().contiguous()
                for t in (psi, 1.0 / bias.denominator, w1, b1, w2, slope, intercept)
            )
    return cache[key]


def fused_attention(q, k, v, bias: PreparedBias, *, causal: bool = True) -> torch.Tensor:
    """Attention with ``bias`` computed inside the fused kernel: ``[batch, heads, q_len, v_dim]``.

    Equal to the materialised path within float32 rounding. Raises ``RuntimeError``
    naming the reason where the kernel cannot run (see :func:`unavailable_reason`).
    """
    reason = _why_not(q, k, v, bias)
    if reason is None and not available():
        reason = f"it could not be built here ({unavailable_reason()})"
    if reason is not None:
        raise RuntimeError(f"backend='fused' cannot compute this attention: {reason}")
    batch, heads, q_len, _ = q.shape
    bias.check_shape(heads, q_len, k.shape[2], bias.q_start, causal)
    highest = bias.q_start + bias.q_len - 1  # the offset of the reversed table's entry 0
    inputs = _kernel_inputs(bias, causal)
    ops = torch.ops.relbias_fused
    with torch.no_grad():
        if bias.kind == "offset":
            return ops.offset_attention(
                q, k, v, inputs[0], highest, bias.q_start, causal, Q_BLOCK, KV_BLOCK
            )
        return ops.fire_attention(
            q, k, v, inputs[0], highest, *inputs[1:], bias.q_start, causal, Q_BLOCK, KV_BLOCK
        )
