"""The fused C++ CPU kernel (relbias.attention.fused) against the materialised path.

The kernel is built on first use (about 15 s, then cached). It must be buildable where
these tests run: the set-up installs a C++ compiler and ninja, so a failed build is a
failure here, not a skip.

The kernel has one code path per kind of prepared bias: an offset table (every offset-only
family reaches it the same way: T5's table with random entries stands for them in the grid
of shapes and blocks), FIRE's MLP, and the forget gate (tests/core/test_forgetting.py).
Every family is compared with float64 once (:func:`test_fused_gradients_against_float64`).
"""

from __future__ import annotations

import copy
import os
import random
import re
import subprocess
import sys

import pytest
import torch
from conftest import (
    ATTENTION_HEADS,
    ATTENTION_SHAPES,
    CAUSAL_KWARGS,
    FAMILY_KWARGS,
    assert_backend_matches_materialise,
    assert_close,
    build,
    family_bias,
    qkv,
)

import relbias
from relbias import biased_attention
from relbias.attention import api, fused
from relbias.biases.prepared import PreparedBias, prepare_bias

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's imports

HEADS = ATTENTION_HEADS
FAMILIES = list(FAMILY_KWARGS)
# The kernel's kinds of bias (the forget gate's in test_forgetting.py): an offset table and FIRE.
KERNELS = ["t5", "fire"]
# ... and, for the fused kernel, enough rows and keys for several blocks of both kinds at
# the small block sizes below (causal with keys after the last query: never seen).
SHAPES = [*ATTENTION_SHAPES, (150, 300, None), (90, 90, 0)]
BLOCKS = [(fused.Q_BLOCK, fused.KV_BLOCK), (8, 16), (5, 7), (1, 1)]


def fused_blocks(q, k, v, bias, *, causal=True, q_start=None, blocks=None):
    """The fused kernel with ``blocks = (q_block, kv_block)`` (None: its defaults)."""
    if not isinstance(bias, PreparedBias):
        bias = bias.prepare(q.shape[2], k.shape[2], q_start=q_start)
    q_block, kv_block = blocks or (fused.Q_BLOCK, fused.KV_BLOCK)
    return fused.fused_attention(q, k, v, bias, causal=causal, q_block=q_block, kv_block=kv_block)


def test_the_kernel_builds_here():
    info = fused.build_info()
    assert fused.available(), info["error"]
    assert info["ok"] and info["error"] is None and info["seconds"] >= 0
    assert fused.unavailable_reason() is None


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len,q_start", SHAPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_matches_materialise(kernel, causal, q_len, k_len, q_start, blocks):
    bias = family_bias(kernel, causal)
    q, k, v = qkv(q_len, k_len)
    with torch.no_grad():
        expected = biased_attention(
            q, k, v, bias, causal=causal, q_start=q_start, backend="materialize"
        )
        got = fused_blocks(q, k, v, bias, causal=causal, q_start=q_start, blocks=blocks)
    assert_close(got, expected)


def test_backend_fused_is_the_kernel(family):
    """biased_attention(backend="fused") runs the kernel for every family (here: its
    default blocks)."""
    for causal, q_len, k_len, q_start in [(True, 20, 45, None), (False, 17, 40, 9)]:
        q, k, v = qkv(q_len, k_len)
        bias = family_bias(family, causal)
        assert_backend_matches_materialise("fused", q, k, v, bias, causal=causal, q_start=q_start)


@pytest.mark.parametrize("family", ["t5", "fire"])
def test_fused_causal_keys_after_the_last_query(family):
    """Causal attention where keys go on past the queries: those keys are never seen."""
    bias = family_bias(family, True)
    q, k, v = qkv(12, 50)
    with torch.no_grad():
        expected = biased_attention(q, k, v, bias, q_start=20, backend="materialize")
        got = biased_attention(q, k, v, bias, q_start=20, backend="fused")
    assert_close(got, expected)


def _random_case(seed: int) -> dict:
    """A random family, causality, lengths, prefix, head sizes, batch and block sizes."""
    rng = random.Random(seed)
    blocks = (rng.choice([1, 3, 16, 64, 128]), rng.choice([1, 8, 33, 512]))
    family, causal = rng.choice(FAMILIES), rng.random() < 0.7
    q_len = rng.randint(1, 120)
    k_len = q_len + rng.randint(0, 80)
    q_start = k_len - q_len if causal else rng.randint(0, 200)
    dim, v_dim = rng.choice([(8, 8), (16, 24), (64, 64), (5, 3)])
    return {
        "bias": family_bias(family, causal),
        "causal": causal,
        "q_len": q_len,
        "k_len": k_len,
        "q_start": q_start,
        "shape": {"batch": rng.randint(1, 3), "dim": dim, "v_dim": v_dim},
        "blocks": blocks,
    }


@pytest.mark.parametrize("seed", range(20))
def test_fused_random_shapes_and_blocks(seed):
    """Random families, lengths, prefixes, head sizes, batch and block sizes."""
    case = _random_case(seed)
    causal, q_start, bias = case["causal"], case["q_start"], case["bias"]
    q, k, v = qkv(case["q_len"], case["k_len"], **case["shape"])
    with torch.no_grad():
        expected = biased_attention(
            q, k, v, bias, causal=causal, q_start=q_start, backend="materialize"
        )
        got = fused_blocks(q, k, v, bias, causal=causal, q_start=q_start, blocks=case["blocks"])
    assert_close(got, expected)


def test_fused_takes_any_memory_layout():
    """Inputs that are views with other strides give the same result as contiguous ones."""
    bias = family_bias("alibi", True)
    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in qkv(40, 40))
    assert not q.is_contiguous()
    with torch.no_grad():
        got = biased_attention(q, k, v, bias, backend="fused")
        expected = biased_attention(
            q.contiguous(), k.contiguous(), v.contiguous(), bias, backend="materialize"
        )
    assert_close(got, expected)


def test_fused_long_sequence_with_steep_biases():
    """A long sequence with large bias values (ALiBi's steepest slope is 1/2 per token and
    a learned table with large entries): no overflow, no NaN, the same values."""
    torch.manual_seed(3)
    alibi = relbias.ALiBi(8)
    t5 = relbias.make_bias("t5", 8, bidirectional=False)
    with torch.no_grad():
        t5.weight.normal_(0.0, 30.0)
    q, k, v = (torch.randn(1, 8, 1200, 32) for _ in range(3))
    for bias in (alibi, t5):
        with torch.no_grad():
            got = biased_attention(q, k, v, bias, backend="fused")
            expected = biased_attention(q, k, v, bias, backend="materialize")
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)


def test_fused_with_a_prepared_bias_shared_by_layers():
    bias = family_bias("fire", True)
    q, k, v = qkv(70, 70)
    with torch.no_grad():
        prepared = prepare_bias(bias, 70)
        first = biased_attention(q, k, v, prepared, backend="fused")
        second = biased_attention(q, k, v, prepared, backend="fused")
        expected = biased_attention(q, k, v, bias, backend="materialize")
    assert torch.equal(first, second)
    assert_close(first, expected)


def test_auto_takes_the_fused_kernel_on_the_cpu(family):
    """Without gradients and with them (training), in float32 and in bfloat16."""
    bias = family_bias(family, True)
    q, k, v = qkv(30, 30)
    assert api.CPU_INFERENCE_BACKENDS[0] == "fused" and api.CPU_TRAINING_BACKENDS[0] == "fused"
    with torch.no_grad():
        assert biased_attention(q, k, v, bias, return_backend=True)[1] == "fused"
        _, backend = biased_attention(*(t.bfloat16() for t in (q, k, v)), bias, return_backend=True)
    assert backend == "fused"
    q.requires_grad_(True)
    assert biased_attention(q, k, v, bias, return_backend=True)[1] == "fused"
    # float16 is not the kernel's: the table path without gradients, materialised with them
    with torch.no_grad():
        _, backend = biased_attention(*(t.half() for t in (q, k, v)), bias, return_backend=True)
    assert backend == "table"
    assert biased_attention(*(t.half() for t in (q, k, v)), bias, return_backend=True)[1] == (
        "materialize"
    )


def test_auto_falls_back_to_the_table_where_the_kernel_cannot_be_built(monkeypatch):
    monkeypatch.setattr(fused, "_BUILD", {"ok": False, "error": "RuntimeError: no compiler"})
    bias = family_bias("t5", True)
    q, k, v = qkv(30, 30)
    with torch.no_grad():
        out, backend = biased_attention(q, k, v, bias, return_backend=True)
        expected = biased_attention(q, k, v, bias, backend="materialize")
        assert backend == "table"
        assert_close(out, expected)
        assert fused.unavailable_reason() == "RuntimeError: no compiler"
        with pytest.raises(RuntimeError, match="could not be built here.*no compiler"):
            biased_attention(q, k, v, bias, backend="fused")


def test_turned_off_by_the_environment(monkeypatch):
    monkeypatch.setattr(fused, "_BUILD", {})
    monkeypatch.setenv("RELBIAS_FUSED", "0")
    assert not fused.available()
    assert "RELBIAS_FUSED=0" in fused.unavailable_reason()


def test_fused_refuses_what_it_cannot_compute():
    q, k, v = qkv(10, 10)
    with torch.no_grad():
        with pytest.raises(RuntimeError, match="float32 or bfloat16"):
            biased_attention(
                *(t.double() for t in (q, k, v)), relbias.ALiBi(HEADS), backend="fused"
            )
        with pytest.raises(ValueError, match="needs a bias"):
            biased_attention(q, k, v, None, backend="fused")
        with pytest.raises(ValueError, match="dense tensor"):
            biased_attention(q, k, v, torch.zeros(HEADS, 10, 10), backend="fused")
        with pytest.raises(ValueError, match="bidirectional"):
            biased_attention(q, k, v, relbias.ALiBi(HEADS), causal=False, backend="fused")
        with pytest.raises(ValueError, match="return_weights"):
            biased_attention(q, k, v, relbias.ALiBi(HEADS), backend="fused", return_weights=True)


def test_the_kernel_checks_its_own_inputs():
    """The C++ operators refuse tables that do not cover the attention's offsets, and
    tensors of the wrong shapes or dtypes."""
    assert fused.available()
    q, k, v = qkv(10, 10)
    table = torch.zeros(HEADS, 19)
    ops = torch.ops.relbias_fused
    forward, backward = ops.offset_forward, ops.offset_backward
    with pytest.raises(RuntimeError, match="does not cover"):
        forward(q, k, v, torch.zeros(HEADS, 5), 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="rtable must be"):
        forward(q, k, v, table.double(), 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="q_block and kv_block"):
        forward(q, k, v, table, 9, 0, True, 0, 4)
    with pytest.raises(RuntimeError, match="float32 or all bfloat16"):
        forward(q.half(), k.half(), v.half(), table, 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="float32 or all bfloat16"):
        forward(q, k.bfloat16(), v, table, 9, 0, True, 4, 4)
    for bad in (k[:, :, :, :8], k[:1], k[:, :2]):  # another dim, batch or head count
        with pytest.raises(RuntimeError, match="must agree"):
            forward(q, bad, v, table, 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="must agree"):  # values of another length
        forward(q, k, v[:, :, :9], table, 9, 0, True, 4, 4)
    out, lse, _ = forward(q, k, v, table, 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="out and dout"):
        backward(q, k, v, out, out[:, :, :5], lse, table, 9, 0, True, 4, 4)
    with pytest.raises(RuntimeError, match="lse must be"):
        backward(q, k, v, out, out, lse[:, :, :5], table, 9, 0, True, 4, 4)


CAPABILITY_CHECK = """
import torch
from relbias import biased_attention, make_bias
from relbias.attention import fused
info = fused.build_info()
assert info["ok"], info["error"]
print(info["capability"])
torch.manual_seed(0)
for name in ("t5", "fire"):
    bias = make_bias(name, 2, **({"bidirectional": False} if name == "t5" else {}))
    q, k, v = (torch.randn(1, 2, 70, 24) for _ in range(3))
    with torch.no_grad():
        got = biased_attention(q, k, v, bias, backend="fused")
        expected = biased_attention(q, k, v, bias, backend="materialize")
    torch.testing.assert_close(got, expected, rtol=2e-5, atol=2e-5)
    grads = []
    for backend in ("fused", "materialize"):
        q.grad = None
        q.requires_grad_(True)
        biased_attention(q, k, v, bias, backend=backend).square().sum().backward()
        grads.append(q.grad)
    torch.testing.assert_close(*grads, rtol=1e-4, atol=1e-4)
"""


def _capability_check(env_overrides: dict, capability: str) -> None:
    """CAPABILITY_CHECK in a fresh process (one process loads one build) with ``env``."""
    env = {**os.environ, **env_overrides, "ATEN_CPU_CAPABILITY": capability}
    proc = subprocess.run(
        [sys.executable, "-c", CAPABILITY_CHECK],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [capability.upper()]


@pytest.mark.slow
def test_the_kernel_builds_without_vector_extensions():
    """Built for no vector extension (as on other CPUs; AVX2 in
    :func:`test_python_m_builds_ahead_of_time_and_says_so`): the same values."""
    _capability_check({}, "default")


def test_threads_do_not_change_the_result():
    """Blocks go to whichever thread is free; each block's arithmetic is the same, so two
    threads give the same bits as one."""
    bias = family_bias("kerple_log", True)
    q, k, v = qkv(300, 300, batch=3)
    threads = torch.get_num_threads()
    outs = []
    try:
        for count in (1, 2):
            torch.set_num_threads(count)
            with torch.no_grad():
                outs.append(biased_attention(q, k, v, bias, backend="fused"))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("heads,batch", [(1, 1), (1, 2), (3, 1), (2, 3)])
@pytest.mark.parametrize("causal", [True, False])
def test_work_shared_by_two_threads(heads, batch, causal):
    """With two threads a head's blocks of rows are cut into runs of about equal cost (one
    head: several runs); every split gives the materialised result."""
    name = "t5" if causal else "alibi"
    bias = relbias.make_bias(name, heads, bidirectional=not causal)
    q, k, v = (torch.randn(batch, heads, 90, 16) for _ in range(3))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        with torch.no_grad():
            got = fused_blocks(q, k, v, bias, causal=causal, blocks=(8, 16))
            expected = biased_attention(q, k, v, bias, causal=causal, backend="materialize")
    finally:
        torch.set_num_threads(threads)
    assert_close(got, expected)


# --- the build: visible, ahead of time, feature-detected, without process-wide changes -----------
def _run_module(env_overrides, timeout=600):
    env = {**os.environ, **env_overrides}
    return subprocess.run(
        [sys.executable, "-m", "relbias.attention.fused"],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_python_m_builds_ahead_of_time_and_says_so(tmp_path):
    """A fresh cache: the build is logged (``-m`` shows the log on stderr) with its time; the
    second run loads it (no compiling line); both print where it is cached and exit 0.
    Built for AVX2 (narrower vectors than AVX-512's, as on other CPUs), whose kernel then
    gives the values of the materialised path."""
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path), "ATEN_CPU_CAPABILITY": "avx2"}
    first = _run_module(env)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "compiling the fused attention kernel" in first.stderr
    assert re.search(r"compiled in \d+\.\d s", first.stderr)
    assert "self-test passed" in first.stdout and str(tmp_path) in first.stdout
    assert "RuntimeWarning" not in first.stderr  # -m finds the module not imported yet
    assert "relbias fused kernel (AVX2)" in first.stdout
    second = _run_module(env)
    assert second.returncode == 0, second.stderr[-2000:]
    assert "compiling" not in second.stderr
    assert "loaded from the cache" in second.stdout and str(tmp_path) in second.stdout
    _capability_check(env, "avx2")


@pytest.mark.parametrize(
    "env,reason",
    [({"RELBIAS_FUSED": "0"}, "RELBIAS_FUSED=0"), ({"CXX": "/no/such/c++"}, "no C++ compiler")],
)
@pytest.mark.slow
def test_python_m_exits_1_with_the_reason(env, reason, tmp_path):
    proc = _run_module({**env, "TORCH_EXTENSIONS_DIR": str(tmp_path)}, timeout=300)
    assert proc.returncode == 1
    assert "unavailable" in proc.stderr and reason in proc.stderr


def test_an_aten_without_float32_brgemm_falls_back(monkeypatch):
    """Feature detection: where ATen lacks the float32 brgemm the kernel calls, no build is
    tried, available() is False, auto takes the table path and backend='fused' names why."""
    monkeypatch.setattr(fused, "_BUILD", {})
    monkeypatch.setattr(fused, "_FLOAT_BRGEMM", re.compile("no such declaration anywhere"))
    monkeypatch.setattr(fused, "_compile", lambda *a: pytest.fail("a build was tried"))
    assert not fused.available()
    assert "cpublas::brgemm" in fused.unavailable_reason()
    bias = family_bias("alibi", True)
    q, k, v = qkv(20, 20)
    with torch.no_grad():
        out, backend = biased_attention(q, k, v, bias, return_backend=True)
        assert backend == "table"
        assert_close(out, biased_attention(q, k, v, bias, backend="materialize"))
        with pytest.raises(RuntimeError, match="could not be built here.*brgemm"):
            biased_attention(q, k, v, bias, backend="fused")


def test_the_build_changes_nothing_process_wide(monkeypatch, tmp_path, capsys, caplog):
    """With no ninja on PATH, pip's ninja goes to the child process's PATH only; the
    parent's environment and torch's loggers are left as they were. The build is logged,
    never printed (a notebook cell's outputs do not depend on the kernel cache)."""
    import logging

    caplog.set_level(logging.INFO, logger="relbias.attention.fused")
    import ninja

    monkeypatch.setattr(fused, "_BUILD", {})
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    real_which = fused.shutil.which
    monkeypatch.setattr(
        fused.shutil, "which", lambda name: None if name == "ninja" else real_which(name)
    )
    seen = []
    monkeypatch.setattr(fused, "_compile", lambda *args: seen.append(args))
    path, environ = os.environ.get("PATH"), dict(os.environ)
    level = logging.getLogger("torch.utils.cpp_extension").level
    assert not fused.available()  # nothing was compiled into tmp_path: no library to load
    assert seen and seen[0][3] == ninja.BIN_DIR
    assert os.environ.get("PATH") == path and dict(os.environ) == environ
    assert logging.getLogger("torch.utils.cpp_extension").level == level
    assert "compiling the fused attention kernel" in caplog.text
    printed = capsys.readouterr()
    assert "compiling" not in printed.err and "compiling" not in printed.out


# --- the backward: gradients of q, k, v and of the bias's parameters ------------------------
def _gradients(backend, q, k, v, bias, dout, blocks=None, **kwargs):
    """The output and the gradients of q, k, v and of every parameter of ``bias`` (the fused
    kernel with ``blocks``, when given)."""
    for t in (q, k, v):
        t.grad = None
    bias.zero_grad()
    if blocks is not None:
        assert backend == "fused"
        out = fused_blocks(q, k, v, bias, blocks=blocks, **kwargs)
    else:
        out = biased_attention(q, k, v, bias, backend=backend, **kwargs)
    (out * dout).sum().backward()
    params = [p.grad if p.grad is not None else torch.zeros_like(p) for p in bias.parameters()]
    return [out.detach(), q.grad, k.grad, v.grad, *params]


def _perturbed(bias):
    """The family with every parameter moved off its initial value (all gradients live)."""
    with torch.no_grad():
        for p in bias.parameters():
            p.add_(0.3 * torch.randn_like(p))
    return bias


def assert_gradients_close(got, expected, tol=2e-5, params_from=4):
    """Each tensor equal within ``tol`` of its own largest entry (float32 rounding of sums
    over a few hundred scores), the parameters' gradients (from index ``params_from``)
    within ``5 * tol``: a parameter's gradient sums every score's, with cancellations
    (FIRE's ``c``: both float32 paths are about 1e-5 from float64), and one that is zero
    in exact arithmetic (FIRE's output bias) is rounding noise on both sides."""
    for index, (g, e) in enumerate(zip(got, expected)):
        scale = max(float(e.abs().max()), 1.0) * (5 if index >= params_from else 1)
        torch.testing.assert_close(g, e, rtol=0, atol=tol * scale)


@pytest.mark.parametrize("blocks", BLOCKS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("q_len,k_len,q_start", SHAPES)
@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_gradients_match_materialise(kernel, causal, q_len, k_len, q_start, blocks):
    bias = _perturbed(family_bias(kernel, causal))
    q, k, v = qkv(q_len, k_len, grad=True)
    dout = torch.randn(q.shape[:3] + v.shape[3:])
    kwargs = {"causal": causal, "q_start": q_start}
    got = _gradients("fused", q, k, v, bias, dout, blocks=blocks, **kwargs)
    expected = _gradients("materialize", q, k, v, bias, dout, **kwargs)
    assert_gradients_close(got, expected)


@pytest.mark.parametrize("seed", range(20))
def test_fused_gradients_random_shapes_and_blocks(seed):
    case = _random_case(seed)
    bias = _perturbed(case["bias"])
    q, k, v = qkv(case["q_len"], case["k_len"], **case["shape"], grad=True)
    dout = torch.randn(q.shape[:3] + (case["shape"]["v_dim"],))
    kwargs = {"causal": case["causal"], "q_start": case["q_start"]}
    got = _gradients("fused", q, k, v, bias, dout, blocks=case["blocks"], **kwargs)
    expected = _gradients("materialize", q, k, v, bias, dout, **kwargs)
    assert_gradients_close(got, expected)


@pytest.mark.parametrize("causal", [True, False])
def test_fused_gradients_against_float64(family, causal):
    """The kernel computes in float32, so gradcheck (float64) cannot run it: its gradients
    are compared with the materialised path's in float64 instead."""
    bias = _perturbed(family_bias(family, causal))
    q, k, v = qkv(70, 90, grad=True)
    dout = torch.randn(q.shape)
    got = _gradients("fused", q, k, v, bias, dout, causal=causal)
    bias64 = copy.deepcopy(bias).double()
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    expected = _gradients("materialize", q64, k64, v64, bias64, dout.double(), causal=causal)
    assert_gradients_close(got, [e.float() for e in expected], tol=1e-5)


@pytest.mark.parametrize("kernel", KERNELS)
def test_fused_backward_keeps_no_quadratic_tensor(kernel):
    """What the backward keeps of a fused attention is O(n): q, k, v, the output, one
    log-sum-exp per row and the prepared bias's O(n) tables, never [heads, n, n]."""
    n = 256
    bias = family_bias(kernel, True)
    q, k, v = qkv(n, n, batch=1, grad=True)
    saved = []

    def pack(t):
        saved.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = biased_attention(q, k, v, bias, backend="fused")
    out.sum().backward()
    assert saved and max(saved) <= q.numel() < HEADS * n * n // 8


def test_fused_gradients_reach_a_shared_prepared_bias():
    """One prepared bias used by two layers: its parameters get both layers' gradients."""
    bias = _perturbed(family_bias("t5", True))
    q, k, v = qkv(50, 50, grad=True)
    grads = []
    for backend in ("fused", "materialize"):
        bias.zero_grad()
        prepared = bias.prepare(50)
        first = biased_attention(q, k, v, prepared, backend=backend)
        biased_attention(first, k, v, prepared, backend=backend).square().sum().backward()
        grads.append(bias.weight.grad.clone())
    assert_gradients_close(*([g] for g in grads), params_from=0)


# --- bfloat16 ---------------------------------------------------------------------------------
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", KERNELS)
def test_bfloat16_forward_and_backward(kernel, causal):
    """bfloat16 q, k, v are computed in float32 and rounded back: the output and gradients
    agree with the float32 kernel on the same (rounded) inputs within bfloat16's rounding
    (2^-8 relative)."""
    bias = _perturbed(family_bias(kernel, causal))
    q, k, v = (t.bfloat16().requires_grad_(True) for t in qkv(60, 80))
    dout = torch.randn(q.shape).bfloat16()
    got = _gradients("fused", q, k, v, bias, dout, causal=causal)
    assert all(t.dtype == torch.bfloat16 for t in got[:4])
    q32, k32, v32 = (t.detach().float().requires_grad_(True) for t in (q, k, v))
    expected = _gradients("fused", q32, k32, v32, bias, dout.float(), causal=causal)
    for g, e in zip(got[:4], expected[:4]):
        torch.testing.assert_close(g.float(), e, rtol=2**-7, atol=2**-7 * float(e.abs().max()))
    assert_gradients_close(got[4:], expected[4:], params_from=0)


# --- small weights are dropped, whole blocks skipped ----------------------------------------
def test_steep_biases_skip_blocks_and_give_the_same_values():
    """ALiBi's first heads (slopes 1/2, 1/4, ...) make far keys' weights vanish: whole
    blocks are skipped, and output and gradients stay those of the materialised path."""
    torch.manual_seed(0)
    bias = relbias.ALiBi(8)
    q, k, v = (torch.randn(1, 8, 1024, 32, requires_grad=True) for _ in range(3))
    counts = fused.block_counts(q, k, v, bias.prepare(1024), kv_block=64)
    total = counts["computed"] + counts["skipped"]
    assert total == 8 * sum(min(r + 128, 1024) // 64 for r in range(0, 1024, 128)), counts
    assert counts["skipped"] > total / 10, counts  # ALiBi's first heads: the far blocks
    dout = torch.randn(q.shape)
    got = _gradients("fused", q, k, v, bias, dout, blocks=(fused.Q_BLOCK, 64))
    expected = _gradients("materialize", q, k, v, bias, dout)
    assert_gradients_close(got, expected, tol=5e-5)


def test_a_flat_bias_skips_nothing():
    bias = relbias.make_bias("offset", HEADS, max_offset=8, bidirectional=False)  # zeros
    q, k, v = qkv(300, 300)
    counts = fused.block_counts(q, k, v, bias.prepare(300))
    assert counts["skipped"] == 0 and counts["computed"] > 0


def test_no_denormal_is_formed():
    """Weights below 2^-64 of their row's largest are never computed, so the process's
    flush-denormal setting changes no bit of the output or of any gradient."""
    torch.manual_seed(1)
    bias = relbias.ALiBi(4)
    q, k, v = (torch.randn(1, 4, 600, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(q.shape)
    runs = []
    try:
        for flush in (False, True):
            torch.set_flush_denormal(flush)
            runs.append(_gradients("fused", q, k, v, bias, dout))
    finally:
        torch.set_flush_denormal(False)
    for off, on in zip(*runs):
        assert torch.equal(off, on)


# --- the backward is deterministic ------------------------------------------------------------
LEARNED = ["offset", "t5", "kerple_power", "kerple_log", "fire", "forgetting"]


@pytest.mark.parametrize("family", LEARNED)
def test_backward_gives_the_same_bits_on_every_run(family):
    """Threads take the (batch, head) pairs, whichever is next; each pair's gradient of the
    bias is kept apart and the pairs are summed in their order, so repeated backward passes
    of every learned family give identical bits, with two threads or one."""
    torch.manual_seed(0)
    heads, batch, n = 4, 4, 96
    if family == "forgetting":
        gate = relbias.ForgettingGate(heads, 8)
        x = torch.randn(batch, n, 8)
        params = list(gate.parameters())

        def bias():
            return gate.prepare(x)
    else:
        module = _perturbed(build(family, heads, **CAUSAL_KWARGS.get(family, {})))
        params = list(module.parameters())

        def bias():
            return module

    q, k, v = (torch.randn(batch, heads, n, 16, requires_grad=True) for _ in range(3))
    dout = torch.randn(q.shape)
    threads = torch.get_num_threads()
    runs = []
    try:
        for count in (2,) * 8 + (1,):
            torch.set_num_threads(count)
            for t in (q, k, v, *params):
                t.grad = None
            out = biased_attention(q, k, v, bias(), backend="fused")
            (out * dout).sum().backward()
            runs.append([t.grad.clone() for t in (q, k, v, *params) if t.grad is not None])
    finally:
        torch.set_num_threads(threads)
    assert len(runs[0]) > 3  # the bias's parameters got gradients
    for run in runs[1:]:
        for first, again in zip(runs[0], run, strict=True):
            assert torch.equal(first, again)
