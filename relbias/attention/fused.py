r"""A fused CPU kernel: the bias computed inside attention, one block of scores at a time.

``biased_attention(..., backend="fused")`` runs ``csrc/fused_attention.cpp``, a
flash-style attention kernel for the CPU, forward and backward. For each block of query
rows and block of keys the forward computes the scores :math:`q_i k_j^\top / \sqrt{d}`
with one matrix product, adds :math:`\mathrm{PE}(i, j)` to them in place, and folds them
into a running softmax (a running maximum and sum per row), so that no ``q_len x k_len``
tensor exists and no block above the causal diagonal is computed: FlashAttention's loop
(Dao et al., 2022, arXiv:2205.14135) with the online softmax of Rabe & Staats (2021,
arXiv:2112.05682). It keeps one number per query row, the log-sum-exp of its scores; the
backward recomputes each block's weights from it (FlashAttention-2's backward, Dao,
2023, arXiv:2307.08691) and reduces the bias's gradient as it goes, so training never
forms a ``[heads, n, n]`` tensor either. The bias comes from the O(n) pieces of a
prepared bias (:meth:`relbias.RelativeBias.prepare`), and its gradient flows back
through them to the module's parameters:

* an offset-only family reads ``PE(i, j)`` from its table: the bias of one row of a
  block is a contiguous run of the table, added with vector loads; in the backward a
  column of :math:`\partial L / \partial S^\top` (one key, consecutive queries) is a run
  of consecutive offsets, so the table's gradient is summed per offset with vector adds;
* FIRE computes :math:`f_\theta(\psi(|i-j|) / \psi(\max(L, i)))` per score, with
  :math:`\psi(|i-j|)` read the same way and the MLP folded to its switching hidden
  units (:meth:`relbias.biases.prepared.FIREBias.folded_mlp`); its backward takes
  each score's gradient through the MLP (its weights, the :math:`\psi` table and the
  per-row denominators);
* the forget gate (:class:`relbias.ForgettingGate`) adds :math:`F_i - F_j` from the
  cumulative log gates of each sequence and head, read as two float32 parts
  (:class:`~relbias.biases.prepared.ForgettingBias`); :math:`F` does not increase, so
  :math:`F_{i_0} - F_{c_1}` bounds a block of keys before its queries and strongly
  forgetting heads skip far blocks; the backward adds each score's gradient to its query's
  and subtracts it from its key's :math:`F`.

The same ops take keys with fewer heads than the queries (grouped-query attention: a
query head reads its group's keys, which are never repeated; the backward sums each
group's gradients in a fixed order), a boolean mask read as the scores are formed (a
query that sees no key gets 0), and a bias position per sequence (``starts``: query row
``r`` of sequence ``b`` at ``starts[b] + r``, while the causal rule reads the slots),
which :mod:`relbias.attention.positioned` derives from per-row positions
(:func:`placed_attention`).

Weights below :math:`2^{-64}` of their row's largest are set to zero rather than
computed: they change no float32 result (``k_len * 2^-64`` of a row's sum is far below
float32's rounding), and computing them would form denormal floats, which are slow on
x86 unless the process flushes them. A whole block of keys is skipped when a bound on its
scores (:math:`|q_i||k_j|/\sqrt{d}` plus the largest bias of its offsets) lies
:math:`64 \ln 2` below every row's running maximum; the blocks are visited in the order
of their bounds, so steep biases (ALiBi's first heads) skip most far blocks
(:func:`block_counts` tells how many).

The kernel is C++, compiled on first use with :func:`torch.utils.cpp_extension.load`
(a C++ compiler, ``ninja`` and a PyTorch whose ATen has float32
``at::native::cpublas::brgemm`` are needed; the build takes about 20 s once per machine
and is cached). The compilation is logged, not printed (logger
``relbias.attention.fused``, level INFO: a line when it starts, one with its time when it
ends; ``logging.basicConfig(level=logging.INFO)`` shows them), so that a first build inside
a notebook cell adds nothing to the cell's output; :func:`build_info` tells whether this
process compiled it and how long it took. To build it ahead of time, run::

    python -m relbias.attention.fused

which builds (or loads) the kernel, runs its self-test, prints where it is cached and
how long it took, and exits 0 (1, with the reason, where it cannot be built). It runs on
the CPU, on float32 or bfloat16 ``q``, ``k``, ``v`` (bfloat16 is read into float32 and
the results rounded back). Where it cannot be built, :func:`available` is false,
:func:`unavailable_reason` says why, and ``backend="auto"`` takes the table path (no
gradient) or the materialised path (gradients) instead. Set ``RELBIAS_FUSED=0`` to turn
it off.

The build runs in a child process (``torch.utils.cpp_extension`` in a fresh
interpreter, whose ``PATH`` may carry pip's ``ninja``); this process then loads the
library with ``torch.ops.load_library``. Nothing of this process changes: not its
environment, not any library's logger. A build whose inputs are unchanged (its stamp
matches) is loaded without a child process.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from relbias._checks import check_int, needs_grad
from relbias.biases.prepared import PreparedBias

__all__ = [
    "Q_BLOCK",
    "KV_BLOCK",
    "SOURCE",
    "DTYPES",
    "available",
    "block_counts",
    "build_info",
    "fused_attention",
    "main",
    "unavailable_reason",
]

#: The C++ source of the kernel.
SOURCE = Path(__file__).with_name("csrc") / "fused_attention.cpp"
#: The default of ``q_block``: query rows per block (each block is one task for a thread) ...
Q_BLOCK = 128
#: ... and of ``kv_block``: keys per block of scores (``q_block x kv_block`` floats stay in
#: the cache).
KV_BLOCK = 512

_LOG = logging.getLogger(__name__)
_LOCK = threading.Lock()
_BUILD: dict = {}

#: Compiler flags per CPU capability (``torch.backends.cpu.get_cpu_capability()``): the
#: vector width of ATen's ``Vectorized<float>`` that the kernel uses.
_CAPABILITY_FLAGS = {
    "AVX512": ["-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mfma"],
    "AVX2": ["-mavx2", "-mfma"],
    "DEFAULT": [],
}

#: The float32 overload of ATen's batch-reduce GEMM that the kernel calls, as declared in
#: ``ATen/native/CPUBlas.h`` (recent PyTorch releases only).
_FLOAT_BRGEMM = re.compile(r"void\s+brgemm\s*\([^;]*?const\s+float\s*\*\s*\w+\s*,[^;]*?\)\s*;")

#: What the child process runs: ``cpp_extension.load`` with the arguments in argv[1].
_CHILD = """
import json, sys
from torch.utils import cpp_extension
args = json.loads(sys.argv[1])
cpp_extension.load(is_python_module=False, verbose=False, **args)
"""


def _flags() -> tuple[str, list[str]]:
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in _CAPABILITY_FLAGS:
        capability = "DEFAULT"
    flags = ["-O3", "-fopenmp", f"-DCPU_CAPABILITY={capability}"]
    if capability != "DEFAULT":
        flags.append(f"-DCPU_CAPABILITY_{capability}")
    return capability, flags + _CAPABILITY_FLAGS[capability]


def _compiler() -> str:
    """The C++ compiler ``cpp_extension`` will call (``$CXX``, else ``c++``), or raise."""
    cxx = os.environ.get("CXX", "c++")
    words = shlex.split(cxx) or ["c++"]
    if shutil.which(words[0]) is None:
        raise RuntimeError(f"no C++ compiler: {words[0]!r} is not on PATH (set CXX or install g++)")
    return cxx


def _ninja_dir() -> str | None:
    """The folder of a ``ninja`` the child process can run: None if it is on PATH already,
    else pip's ``ninja`` package's; raise if there is none."""
    if shutil.which("ninja") is not None:
        return None
    try:
        import ninja
    except ImportError:
        raise RuntimeError("ninja is not installed (pip install ninja)") from None
    return ninja.BIN_DIR


def _check_aten() -> None:
    """Raise unless this PyTorch's ATen declares the float32 ``cpublas::brgemm`` it calls."""
    from torch.utils import cpp_extension

    for folder in cpp_extension.include_paths():
        header = Path(folder) / "ATen" / "native" / "CPUBlas.h"
        if header.is_file():
            text = header.read_text(errors="replace")
            if _FLOAT_BRGEMM.search(text) and "brgemm_release" in text:
                return
            break
    raise RuntimeError(
        f"this PyTorch ({torch.__version__}) has no float32 at::native::cpublas::brgemm "
        "in ATen/native/CPUBlas.h, which the kernel calls: it needs a more recent PyTorch"
    )


def _build_directory(name: str) -> Path:
    """Where the build lives: under ``$TORCH_EXTENSIONS_DIR`` or torch's default root, per
    Python and PyTorch version."""
    from torch.utils import cpp_extension

    root = os.environ.get("TORCH_EXTENSIONS_DIR") or cpp_extension.get_default_build_root()
    version = re.sub(r"[^0-9A-Za-z.]", "_", torch.__version__)
    tag = f"py{sys.version_info.major}{sys.version_info.minor}_torch{version}"
    return Path(root) / "relbias" / tag / name


def _stamp(cxx: str, flags: list[str]) -> str:
    """A digest of everything the build depends on: a library with this stamp is current."""
    parts = [SOURCE.read_bytes(), repr((cxx, flags, torch.__version__, sys.version)).encode()]
    return hashlib.sha256(b"\0".join(parts)).hexdigest()


def _compile(name: str, directory: Path, flags: list[str], ninja_dir: str | None) -> None:
    """Compile in a child process (its own environment): this process changes nothing."""
    env = dict(os.environ)
    if ninja_dir is not None:  # pip's ninja, on the child's PATH only
        env["PATH"] = ninja_dir + os.pathsep + env.get("PATH", "")
    args = {
        "name": name,
        "sources": [str(SOURCE)],
        "extra_cflags": flags,
        "extra_ldflags": ["-fopenmp"],
        "build_directory": str(directory),
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(args)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-12:]
        raise RuntimeError("the build failed: " + " | ".join(tail))


def _build() -> None:
    if os.environ.get("RELBIAS_FUSED", "1") == "0":
        raise RuntimeError("turned off by RELBIAS_FUSED=0")
    cxx = _compiler()
    ninja_dir = _ninja_dir()
    _check_aten()
    capability, flags = _flags()
    name = f"relbias_fused_{capability.lower()}"
    directory = _build_directory(name)
    library = directory / f"{name}.so"
    stamp_file = directory / "relbias-stamp.txt"
    stamp = _stamp(cxx, flags)
    start = time.perf_counter()
    compiled = not (
        library.is_file() and stamp_file.is_file() and stamp_file.read_text().strip() == stamp
    )
    if compiled:
        _LOG.info(
            "relbias: compiling the fused attention kernel (%s, first use; "
            "about 15 s, cached after)...",
            capability,
        )
        directory.mkdir(parents=True, exist_ok=True)
        _compile(name, directory, flags, ninja_dir)
        partial = stamp_file.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(stamp + "\n")
        os.replace(partial, stamp_file)
    torch.ops.load_library(str(library))
    _self_test()
    seconds = time.perf_counter() - start
    if compiled:
        _LOG.info(
            "relbias: fused attention kernel compiled in %.1f s (cached in %s)", seconds, directory
        )
    _BUILD.update(
        capability=capability,
        flags=flags,
        seconds=seconds,
        compiled=compiled,
        library=str(library),
    )


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
    got, _, _ = torch.ops.relbias_fused.offset_forward(q, k, v, table, 8, 0, True, 4, 4)
    if not torch.allclose(got, expected, rtol=1e-4, atol=1e-5):
        raise RuntimeError("the kernel's self-test gave wrong values")


def available() -> bool:
    """Whether the kernel is built and loaded (building it on the first call)."""
    with _LOCK:
        if "ok" not in _BUILD:
            try:
                _build()
                _BUILD["ok"], _BUILD["error"] = True, None
            except Exception as err:  # no compiler, no ninja, an old ATen, turned off
                _BUILD["ok"], _BUILD["error"] = False, f"{type(err).__name__}: {err}"[:500]
    return _BUILD["ok"]


def unavailable_reason() -> str | None:
    """Why the kernel cannot be used here (None when it can)."""
    return None if available() else _BUILD["error"]


def build_info() -> dict:
    """The build: ``ok``, ``error``, ``capability``, compiler ``flags``, ``seconds``
    (compiling, or loading the cached build), ``compiled`` (whether this process compiled
    it) and ``library`` (the path of the cached build)."""
    available()
    return dict(_BUILD)


#: The dtypes of ``q``, ``k``, ``v`` the kernel takes (bfloat16 is computed in float32).
DTYPES = (torch.float32, torch.bfloat16)


def _why_not(q, k, v, bias) -> str | None:
    """None when the kernel can compute this attention, else why not."""
    if not isinstance(bias, PreparedBias) or bias.kernel_inputs(True) is None:
        return "it needs a bias of an offset-only family, FIRE or the forget gate (ForgettingGate)"
    if any(t.device.type != "cpu" for t in (q, k, v)):
        return "it runs on the CPU only"
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return f"it takes float32 or bfloat16 q, k, v, got {q.dtype}, {k.dtype}, {v.dtype}"
    return None


def _op_arguments(tensors: tuple, highest: int) -> tuple:
    """The bias's arguments of an op: its first tensor, the highest offset (the forget
    gate: the last query's position), the others."""
    return (tensors[0], highest, *tensors[1:])


class _FusedAttention(torch.autograd.Function):
    """The kernel's forward and backward as one differentiable operation."""

    @staticmethod
    def forward(ctx, family, highest, extra, q, k, v, *tensors):
        # extra: (q_start, causal, q_block, kv_block[, starts, mask])
        ops = torch.ops.relbias_fused
        out, lse, _ = getattr(ops, f"{family}_forward")(
            q, k, v, *_op_arguments(tensors, highest), *extra
        )
        ctx.save_for_backward(q, k, v, out, lse, *tensors)  # out in float32
        ctx.call = (family, highest, extra)
        return out.to(q.dtype)

    @staticmethod
    def backward(ctx, dout):
        family, highest, extra = ctx.call
        q, k, v, out, lse, *tensors = ctx.saved_tensors
        grads = getattr(torch.ops.relbias_fused, f"{family}_backward")(
            q, k, v, out, dout.contiguous(), lse, *_op_arguments(tuple(tensors), highest), *extra
        )
        dq, dk, dv, *bias_grads = grads
        # an op returns the gradients of the first tensors (the forget gate: of lo, not of
        # hi, which carries none)
        bias_grads += [None] * (len(tensors) - len(bias_grads))
        return (None, None, None, dq, dk, dv, *bias_grads)


def _run(q, k, v, bias: PreparedBias, causal: bool, q_block: int, kv_block: int):
    """The kernel's forward: ``(out, lse, counts)``, after the checks of :func:`fused_attention`."""
    reason = _why_not(q, k, v, bias)
    if reason is None and not available():
        reason = f"it could not be built here ({unavailable_reason()})"
    if reason is not None:
        raise RuntimeError(f"backend='fused' cannot compute this attention: {reason}")
    bias.check_shape(q.shape[1], q.shape[2], k.shape[2], bias.q_start, causal, batch=q.shape[0])
    q_block = check_int("q_block", q_block, minimum=1)
    kv_block = check_int("kv_block", kv_block, minimum=1)
    family, tensors, highest = bias.kernel_inputs(causal)
    return _call(q, k, v, family, tensors, highest, (bias.q_start, causal, q_block, kv_block))


def placed_attention(
    q, k, v, family, tensors, highest, *, q_start, causal, starts=None, mask=None
) -> torch.Tensor:
    """The kernel on inputs its caller prepared (:mod:`relbias.attention.positioned`).

    ``family``, ``tensors`` and ``highest`` are what a prepared bias's
    :meth:`~relbias.biases.prepared.PreparedBias.kernel_inputs` returns, for a table that
    covers every offset met; ``k`` and ``v`` may have fewer heads than ``q`` (a divisor);
    ``starts`` (int64 ``[batch]``) puts query row ``r`` of sequence ``b`` at bias position
    ``starts[b] + r`` (else ``q_start + r``), while the causal rule reads the slots
    (``q_start + r``); ``mask`` (bool, 4-D, broadcastable to ``[batch, heads, q_len,
    k_len]``) hides keys, and a query that sees none gets 0. Differentiable as
    :func:`fused_attention`.
    """
    if not available():
        raise RuntimeError(
            f"backend='fused' cannot compute this attention: it could not be built here "
            f"({unavailable_reason()})"
        )
    return _call(
        q, k, v, family, tensors, highest, (q_start, causal, Q_BLOCK, KV_BLOCK, starts, mask)
    )[0]


def _call(q, k, v, family, tensors, highest, extra):
    """The op's forward (with its backward where a gradient is needed): ``(out, lse, counts)``."""
    if needs_grad(q, k, v, *tensors):
        return _FusedAttention.apply(family, highest, extra, q, k, v, *tensors), None, None
    with torch.no_grad():
        out, lse, counts = getattr(torch.ops.relbias_fused, f"{family}_forward")(
            q, k, v, *_op_arguments(tensors, highest), *extra
        )
    return out.to(q.dtype), lse, counts


def fused_attention(
    q,
    k,
    v,
    bias: PreparedBias,
    *,
    causal: bool = True,
    q_block: int = Q_BLOCK,
    kv_block: int = KV_BLOCK,
) -> torch.Tensor:
    """Attention with ``bias`` computed inside the fused kernel: ``[batch, heads, q_len, v_dim]``.

    Differentiable: with gradients on, the kernel's backward gives the gradients of
    ``q``, ``k``, ``v`` and of the prepared bias's tensors (hence of the module's
    parameters). Equal to the materialised path within float32 rounding (bfloat16
    inputs: within bfloat16's rounding of the inputs and the output), whatever the
    blocks: ``q_block`` query rows (one task for a thread) against ``kv_block`` keys at a
    time (defaults :data:`Q_BLOCK`, :data:`KV_BLOCK`). The bias's gradient is summed in a
    fixed order: the same bits on every run, whatever the threads. Raises
    ``RuntimeError`` naming the reason where the kernel cannot run (see
    :func:`unavailable_reason`).
    """
    return _run(q, k, v, bias, causal, q_block, kv_block)[0]


def block_counts(
    q,
    k,
    v,
    bias: PreparedBias,
    *,
    causal: bool = True,
    q_block: int = Q_BLOCK,
    kv_block: int = KV_BLOCK,
) -> dict:
    """How many (query block, key block) pairs the forward computed and how many it skipped.

    A block is skipped when no weight in it can reach :math:`2^{-64}` of its row's
    largest (the module docstring). Runs the forward once, without gradients, in blocks of
    ``q_block`` query rows and ``kv_block`` keys (as :func:`fused_attention`).
    """
    with torch.no_grad():
        _, _, counts = _run(q, k, v, bias, causal, q_block, kv_block)
    computed, skipped = (int(c) for c in counts)
    return {"computed": computed, "skipped": skipped}


def main() -> int:
    """``python -m relbias.attention.fused``: build (or load) the kernel ahead of time."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    start = time.perf_counter()
    if not available():
        print(f"relbias fused kernel unavailable: {unavailable_reason()}", file=sys.stderr)
        return 1
    info = build_info()
    how = "compiled" if info["compiled"] else "loaded from the cache"
    print(
        f"relbias fused kernel ({info['capability']}): {how}, self-test passed, "
        f"in {time.perf_counter() - start:.1f} s; cached in {Path(info['library']).parent}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
