"""The core's shared rules: one backend policy, one gradient test, prepared biases read
through public methods, no process-wide state, and the small helpers of _checks."""

from __future__ import annotations

import copy
import inspect
import re
import threading
import types

import pytest
import torch
from conftest import ATTENTION_HEADS, build, family_bias, qkv

import relbias
from relbias import _compile, biased_attention, choose_backend
from relbias._checks import check_bool, float64_device, needs_grad
from relbias.attention import api, flex, fused, table
from relbias.biases import prepared
from relbias.biases.prepared import FIREBias, OffsetTableBias, PreparedBias, prepare_bias

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # from compiling

HEADS = ATTENTION_HEADS


# --- preparing is a method of the bias -------------------------------------------------------
def test_prepare_is_a_method_of_every_family(family):
    bias = family_bias(family, True)
    got = bias.prepare(12, 20, q_start=5)
    assert isinstance(got, FIREBias if family == "fire" else OffsetTableBias)
    assert got.offset_only == (family != "fire") == bias.offset_only
    assert bias.preparable
    assert (got.q_len, got.k_len, got.q_start) == (12, 20, 5)
    torch.testing.assert_close(got.materialize(), bias(12, 20, q_start=5))
    # the chapters' alias calls it, and a prepared bias stands for itself
    assert torch.equal(prepare_bias(bias, 12, 20, q_start=5).materialize(), got.materialize())
    assert relbias.prepare_bias is prepare_bias
    assert got.prepare(12, 20, q_start=5) is got
    with pytest.raises(ValueError, match="prepared for"):
        got.prepare(12, 21)
    with pytest.raises(ValueError, match="q_start"):
        bias.prepare(3, 5, q_start=-1)


def test_a_family_without_a_prepared_form():
    class Absolute(relbias.RelativeBias):
        offset_only = False

        def _position_values(self, q_len, k_len, q_start):
            return torch.zeros(self.num_heads, q_len, k_len)

    bias = Absolute(HEADS)
    assert not bias.preparable
    with pytest.raises(TypeError, match="no prepared form"):
        bias.prepare(4)
    q, k, v = qkv(4, 4)
    with torch.no_grad():
        assert choose_backend(q, k, v, bias) == "materialize"
        with pytest.raises(ValueError, match="does not support"):
            biased_attention(q, k, v, bias, backend="table")


def test_kernel_inputs_are_public_and_kept():
    for name in ("t5", "fire"):
        bias = family_bias(name, True).prepare(10)
        family, tensors, highest = bias.kernel_inputs(True)
        assert family == ("offset" if name == "t5" else "fire")
        assert bias.kernel_inputs(True)[1][0] is tensors[0]
        assert highest == bias.q_start + bias.q_len - 1
        # with gradients on, the tensors carry them back to the module's parameters
        assert tensors[0].requires_grad == (name == "t5" or bias.psi_table.requires_grad)
        with torch.no_grad():
            assert not bias.kernel_inputs(True)[1][0].requires_grad
    assert PreparedBias(1, 2, 2, 0, True).kernel_inputs(True) is None


def test_the_forget_gate_is_prepared_from_the_input():
    """A data-dependent family: prepared from x (one bias per sequence), read by the
    backends through the same public methods; the module itself is no bias."""
    gate = relbias.ForgettingGate(HEADS, 8)
    x = torch.randn(2, 10, 8)
    bias = gate.prepare(x)
    assert isinstance(bias, prepared.ForgettingBias) and isinstance(bias, PreparedBias)
    assert bias.batch == 2 and not bias.offset_only and not bias.bidirectional
    family, tensors, highest = bias.kernel_inputs(True)
    assert family == "forgetting" and highest == bias.q_start + bias.q_len - 1
    assert bias.kernel_inputs(True)[1][0] is tensors[0]
    lo, hi = tensors  # lo carries the gradient back to the gate, hi none
    assert lo.requires_grad and not hi.requires_grad
    assert lo.shape == hi.shape == (2, HEADS, 10) and lo.dtype == hi.dtype == torch.float32
    q, k, v = qkv(10, 10)
    assert choose_backend(q, k, v, bias) == "fused"
    with pytest.raises(TypeError, match="computed from the layer input"):
        choose_backend(q, k, v, gate)
    assert "forgetting" not in relbias.BIAS_NAMES  # the position families' list


BACKEND_MODULES = [api, table, flex, fused]


@pytest.mark.parametrize("module", BACKEND_MODULES, ids=lambda m: m.__name__)
def test_backends_read_prepared_biases_through_public_methods(module):
    """No family type tests, no type tags, no private fields of a prepared bias."""
    source = inspect.getsource(module)
    assert "FIRE)" not in source and "_is_fire" not in source
    assert ".kind" not in source
    assert not re.search(r"\bbias\._(?!prepare\b)", source), "a private field of the bias"
    assert "requires_grad for" not in source  # the one gradient test: needs_grad


# --- one auto policy ---------------------------------------------------------------------------
def _fake(device: str, grad: bool = False):
    """A stand-in for a tensor on a device this machine may not have (the policy reads
    the device, the dtype and requires_grad)."""
    return types.SimpleNamespace(
        device=torch.device(device), dtype=torch.float32, requires_grad=grad
    )


def test_the_auto_policy():
    t5, alibi = family_bias("t5", True), family_bias("alibi", True)
    with torch.no_grad():
        # CUDA without gradients: the O(n) table path (never flex, never an n x n tensor)
        assert api._choose("auto", *[_fake("cuda")] * 3, t5, False) == "table"
        assert api._choose("auto", *[_fake("mps")] * 3, t5, False) == "materialize"
    # CUDA with gradients: materialise (FlexAttention training is not verified)
    assert api._choose("auto", _fake("cuda", True), _fake("cuda"), _fake("cuda"), alibi, False) == (
        "materialize"
    )
    assert api._choose("auto", *[_fake("cuda")] * 3, t5, False) == "materialize"  # t5 learns
    q, k, v = qkv(8, 8)
    assert choose_backend(q, k, v, t5) == "fused"  # the bias needs a gradient: the backward
    with torch.no_grad():
        assert choose_backend(q, k, v, t5) == "fused"
        assert choose_backend(q, k, v, t5, "table") == "table"
        assert choose_backend(q, k, v, None) == "materialize"
        _, taken = biased_attention(q, k, v, t5, return_backend=True)
        assert taken == choose_backend(q, k, v, t5)
    with pytest.raises(ValueError, match="backend must be one of"):
        choose_backend(q, k, v, t5, "fast")
    with pytest.raises(TypeError, match="bias must be"):
        choose_backend(q, k, v, "alibi")


def test_no_module_level_backend_state():
    for name in ("last_backend", "_set_last_backend", "_LAST_BACKEND", "clear_cache"):
        assert not hasattr(flex, name), name
        assert not hasattr(api, name), name


# --- no hidden global state: tunables are arguments, every cache has a bound --------------------
def test_tunables_are_keyword_arguments():
    """Block sizes, tiles and FIRE's compiled blocks are arguments with documented defaults,
    not module settings a caller flips."""
    assert not hasattr(prepared, "FUSE_FIRE")
    for function, defaults in [
        (fused.fused_attention, {"q_block": fused.Q_BLOCK, "kv_block": fused.KV_BLOCK}),
        (fused.block_counts, {"q_block": fused.Q_BLOCK, "kv_block": fused.KV_BLOCK}),
        (
            table.table_attention,
            {
                "tile_rows": table.TILE_ROWS,
                "strip_rows": table.STRIP_ROWS,
                "group_rows": table.TILE_GROUP_ROWS,
                "small_attention": table.SMALL_ATTENTION,
                "compiled": True,
            },
        ),
    ]:
        parameters = inspect.signature(function).parameters
        for name, default in defaults.items():
            assert parameters[name].kind is inspect.Parameter.KEYWORD_ONLY, name
            assert parameters[name].default == default, name
            assert f"``{name}``" in function.__doc__, name  # documented
    q, k, v = qkv(20, 20)
    with pytest.raises(ValueError, match="q_block must be an integer >= 1"):
        with torch.no_grad():
            fused.fused_attention(q, k, v, family_bias("t5", True).prepare(20), q_block=0)


def test_lru_cache():
    from relbias._cache import LRUCache

    cache = LRUCache(3)
    for key in "abc":
        cache[key] = key.upper()
    assert cache["a"] == "A"  # a read makes it the most recent: b is the oldest now
    cache["d"] = "D"
    assert list(cache) == ["c", "a", "d"]
    assert cache.memo("e", lambda: "E") == "E" and "c" not in cache and len(cache) == 3
    assert cache.memo("e", lambda: pytest.fail("made twice")) == "E"
    copied = copy.deepcopy(cache)
    assert copied == cache and copied.maxsize == 3
    copied["f"] = 1
    assert len(copied) == 3
    for bad in (0, 2.0, True):
        with pytest.raises(ValueError, match="maxsize"):
            LRUCache(bad)


def test_compile_accounting_is_bounded(monkeypatch):
    """The compile times of the latest TIMED_KERNELS kernels are kept; an older one is timed
    again (counted again) when it returns."""
    assert _compile._COMPILE_TIMES.maxsize == _compile.TIMED_KERNELS
    from relbias._cache import LRUCache

    monkeypatch.setattr(_compile, "_COMPILE_TIMES", LRUCache(_compile.TIMED_KERNELS))
    monkeypatch.setattr(_compile, "_STATS", {"compiles": 0, "compile_seconds": 0.0, "calls": 0})
    keys = [("test-bound", i) for i in range(_compile.TIMED_KERNELS + 5)]
    for key in keys:
        assert _compile.timed(lambda x: x + 1, key)(1) == 2
    stats = _compile.compile_stats()
    assert len(stats["per_key"]) == _compile.TIMED_KERNELS
    assert keys[0] not in stats["per_key"] and keys[-1] in stats["per_key"]
    assert stats["compiles"] == len(keys)
    _compile.timed(lambda x: x, keys[-1])(0)  # kept: not a compilation
    _compile.timed(lambda x: x, keys[0])(0)  # dropped: timed again
    assert _compile.compile_stats()["compiles"] == len(keys) + 1


def test_block_masks_are_bounded(monkeypatch):
    from relbias._cache import LRUCache

    assert flex._BLOCK_MASKS.maxsize == flex.BLOCK_MASKS_KEPT
    assert flex._SMALL_KERNEL_KEYS.maxsize == flex.SMALL_KERNEL_KEYS_KEPT
    monkeypatch.setattr(flex, "_BLOCK_MASKS", LRUCache(flex.BLOCK_MASKS_KEPT))
    first = flex.causal_block_mask(1, 1, 0, "cpu")
    for n in range(2, flex.BLOCK_MASKS_KEPT + 5):
        last = flex.causal_block_mask(n, n, 0, "cpu")
    assert len(flex._BLOCK_MASKS) == flex.BLOCK_MASKS_KEPT
    assert flex.causal_block_mask(n, n, 0, "cpu") is last  # kept
    again = flex.causal_block_mask(1, 1, 0, "cpu")  # dropped: built anew, the same mask
    assert again is not first and torch.equal(again.to_dense(), first.to_dense())


def test_the_table_workspace_is_bounded():
    """The tiles' buffers: at most WORKSPACE_BUFFERS per thread, the latest shapes."""
    sizes = []

    def fill():
        like = torch.zeros(1)
        for n in range(1, table.WORKSPACE_BUFFERS + 4):
            kept = table._workspace("q", (n, 2), like)
            assert table._workspace("q", (n, 2), like) is kept
            sizes.append(len(table._WORKSPACE.buffers))

    thread = threading.Thread(target=fill)  # the workspace is per thread: a fresh one
    thread.start()
    thread.join()
    assert sizes == [min(n, table.WORKSPACE_BUFFERS) for n in range(1, table.WORKSPACE_BUFFERS + 4)]


@pytest.mark.parametrize("name", ["t5", "fire"])
def test_a_prepared_bias_keeps_a_bounded_number_of_pieces(name):
    """A prepared bias keeps its tables and the kernel's inputs per dtype, causality and grad
    mode: at most KEPT_PIECES of them, and a dropped one is made again the same."""
    bias = family_bias(name, False).prepare(12)
    first = [t.clone() for t in bias.kernel_inputs(True)[1]]
    for grad in (True, False):
        with torch.set_grad_enabled(grad):
            for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
                for causal in (True, False):
                    bias.flipped_rows(0, 12, 12, causal, dtype, compiled=False)
                    bias.kernel_inputs(causal)
                    assert len(bias._pieces) <= PreparedBias.KEPT_PIECES
    assert len(bias._pieces) == PreparedBias.KEPT_PIECES
    for kept, again in zip(first, bias.kernel_inputs(True)[1], strict=True):
        assert torch.equal(kept, again)


def test_table_attention_builds_no_square_tensor(monkeypatch):
    """The table path (what auto takes on CUDA without gradients) never calls
    relative_positions nor builds a q_len x k_len index."""
    import relbias.biases.prepared as prep

    def refuse(*args, **kwargs):
        raise AssertionError("an n x n index was built")

    monkeypatch.setattr(prep, "relative_positions", refuse)
    monkeypatch.setattr(api, "causal_mask", refuse)
    for name in ("t5", "fire"):
        q, k, v = qkv(50, 50)
        with torch.no_grad():
            table.table_attention(q, k, v, family_bias(name, True).prepare(50))


# --- q_start is checked once along a call -------------------------------------------------------
@pytest.mark.parametrize("backend", ["table", "fused"])
def test_lengths_are_checked_once(backend, monkeypatch):
    import relbias._checks as checks
    import relbias.biases.base as base

    calls = []
    real = checks.check_lengths

    def counted(*args):
        calls.append(args)
        return real(*args)

    for module in (api, prepared, base):
        monkeypatch.setattr(module, "check_lengths", counted)
    q, k, v = qkv(20, 30)
    with torch.no_grad():
        biased_attention(q, k, v, family_bias("t5", True), q_start=4, backend=backend)
        biased_attention(q, k, v, family_bias("fire", True), q_start=4, backend=backend)
    assert len(calls) == 2


# --- the small shared helpers ---------------------------------------------------------------------
def test_check_bool():
    assert check_bool("causal", True) is True
    for bad in (1, 0, "yes", None):
        with pytest.raises(TypeError, match="flag must be True or False"):
            check_bool("flag", bad)
    q, k, v = qkv(4, 4)
    with pytest.raises(TypeError, match="causal must be True or False"):
        biased_attention(q, k, v, causal=1)
    with pytest.raises(TypeError, match="bidirectional must be True or False"):
        relbias.ALiBi(2, bidirectional="no")


def test_needs_grad():
    q = torch.zeros(2, requires_grad=True)
    assert needs_grad(q) and needs_grad(None, torch.zeros(2), q)
    assert not needs_grad(torch.zeros(2), None, relbias.ALiBi(2))
    assert needs_grad(build("t5", 2))
    prepared_bias = build("t5", 2).prepare(4)
    assert needs_grad(prepared_bias)
    with torch.no_grad():
        assert not needs_grad(q, build("t5", 2))


def test_float64_device():
    assert float64_device("mps") == torch.device("cpu")
    assert float64_device("cpu") == torch.device("cpu")
    assert float64_device("cuda:1") == torch.device("cuda:1")


def test_compile_limits_skip_options_this_torch_lacks(monkeypatch):
    """An older torch lacks some of dynamo's options: they are skipped, not an error."""
    monkeypatch.setattr(
        _compile, "_RECOMPILE_LIMITS", (("no_such_option_in_any_torch", 1), ("another", 2))
    )
    call = _compile.timed(lambda x: x + 1, ("test-key-no-such-option",))
    assert call(1) == 2 and call(2) == 3
    assert _compile.compile_stats()["per_key"][("test-key-no-such-option",)] >= 0
    assert flex.compile_stats is _compile.compile_stats


# --- ALiBi's slopes and Sandwich's float64 ---------------------------------------------
def test_alibi_slopes_are_a_float32_buffer_that_follows_the_module():
    bias = relbias.ALiBi(6)
    assert "slopes" in dict(bias.named_buffers())
    assert "slopes" not in bias.state_dict()  # not saved: old checkpoints still load
    assert torch.equal(bias.slopes, relbias.alibi_slopes(6))
    slopes = bias.slopes
    assert bias._offset_values(torch.arange(3)) is not None and bias.slopes is slopes
    for dtype in (torch.bfloat16, torch.float16):
        low = relbias.ALiBi(6).to(dtype)
        assert low.slopes.dtype == torch.float32 and low.dtype == dtype
        assert torch.equal(low.slopes, relbias.alibi_slopes(6))
    assert relbias.ALiBi(6).double().slopes.dtype == torch.float64
    meta = relbias.ALiBi(6).to("meta")
    assert meta.slopes.device.type == "meta"
    relbias.ALiBi(6).load_state_dict(relbias.ALiBi(6).state_dict())


def test_sandwich_computes_float64_where_the_device_has_it(monkeypatch):
    """A module on MPS (no float64) computes on the CPU: simulated by sending float64 work
    of the CPU elsewhere, the values are the same."""
    import relbias.biases.sandwich as sandwich

    bias = relbias.Sandwich(4, dim=16)
    expected = bias(9, 13)
    seen = []

    def where(device):
        seen.append(torch.device(device).type)
        return torch.device("cpu")

    monkeypatch.setattr(sandwich, "float64_device", where)
    assert torch.equal(bias(9, 13), expected)
    assert seen and bias.head_scales().dtype == torch.float64


def test_blocks_on_a_gpu_bound_the_mask_copy():
    """CUDA's attention kernels copy a strided mask into an aligned one: off the CPU the
    table path keeps every block's mask small, causal or not (here on the meta device)."""
    heads, n = 8, 8192
    on_cpu = OffsetTableBias(torch.zeros(heads, 2 * n - 1), n)
    on_gpu = OffsetTableBias(torch.zeros(heads, 2 * n - 1, device="meta"), n)
    assert table.default_block_rows(on_cpu, causal=False) == n
    for causal in (True, False):
        rows = table.default_block_rows(on_gpu, causal=causal)
        assert rows * heads * n <= table.DEVICE_BLOCK_ENTRIES and rows >= 16


# --- docstrings point at what exists --------------------------------------------------------------
_REFERENCE = re.compile(r":(?:func|class|meth|mod|data|attr|exc):`~?([^`<>]+?)(?:\s*<[^>]*>)?`")


def _resolves(dotted: str) -> bool:
    """Whether ``dotted`` names a module, or an attribute reached from one."""
    import importlib

    parts = dotted.split(".")
    for split in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for name in parts[split:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def test_every_cross_reference_resolves():
    """Each :func:, :class:, :meth:, :mod:, :data: reference in a docstring of ``relbias``
    (the core and every room) names something that exists: a dotted name as written, else a name of
    the module itself, of one of its classes, or of the package ``relbias``."""
    from pathlib import Path

    root = Path(relbias.__file__).parent
    dangling = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        module = ".".join(p for p in parts if p != "__init__")
        text = path.read_text()
        classes = re.findall(r"^class (\w+)", text, flags=re.M)
        for number, line in enumerate(text.splitlines(), 1):
            for target in _REFERENCE.findall(line):
                target = target.strip()
                where = [target, f"{module}.{target}", f"relbias.{target}"]
                where += [f"{module}.{c}.{target}" for c in classes]
                where.append(f"{module.rpartition('.')[0]}.{target}")
                if not any(_resolves(name) for name in where):
                    dangling.append(f"{path.relative_to(root.parent)}:{number}: {target}")
    assert not dangling, dangling
    assert _resolves("relbias.biases.prepared.FIREBias.folded_mlp")
    assert not _resolves("relbias.attention.prepared.FIREBias")  # moved to the biases
