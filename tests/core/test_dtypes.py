"""Low-precision modules: positions stay exact, the output is the float32 value rounded once."""

from __future__ import annotations

import copy

import pytest
import torch
from conftest import FAMILY_KWARGS, build

from relbias import FIRE, ALiBi, KerplePower, biased_attention

LOW = [torch.bfloat16, torch.float16]


def rounded_reference(module, dtype):
    """A float32 copy whose parameters and buffers hold exactly the low-precision values."""
    return copy.deepcopy(module).to(dtype).float()


def test_alibi_bfloat16_keeps_offsets_2048_and_2049_apart():
    low = ALiBi(8).to(torch.bfloat16)
    assert low.dtype == torch.bfloat16
    table = low.offset_table(2048, 2049)
    assert table.dtype == torch.float32
    assert (table[:, 0] != table[:, 1]).all()
    assert torch.equal(table, ALiBi(8).offset_table(2048, 2049))
    # bfloat16 itself cannot tell 2048 from 2049:
    assert torch.tensor(2049.0).bfloat16() == torch.tensor(2048.0).bfloat16()


@pytest.mark.parametrize("dtype", LOW)
def test_alibi_forward_is_float32_rounded_once(dtype):
    heads = 12  # slopes that are not powers of two
    low = ALiBi(heads).to(dtype)
    out = low(2, 4096)
    assert out.dtype == dtype
    exact = ALiBi(heads)(2, 4096)
    assert torch.equal(out, exact.to(dtype))
    # Rounding the positions first would give something else.
    d = torch.arange(4095, -1, -1).to(dtype).float()
    positions_first = (-ALiBi(heads).slopes[:, None] * d).to(dtype)
    assert not torch.equal(out[:, 1], positions_first)


def test_alibi_float16_at_65536_positions_is_finite():
    # 65535 itself overflows float16's range (max 65504) if cast before the product.
    out = ALiBi(8).half()(1, 65_536)
    assert torch.isfinite(out).all()
    assert torch.equal(out, ALiBi(8)(1, 65_536).half())


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", list(FAMILY_KWARGS))
def test_every_family_is_its_float32_value_rounded_once(name, dtype):
    module = build(name, 3)
    low = copy.deepcopy(module).to(dtype)
    reference = rounded_reference(module, dtype)
    for q_len, k_len, q_start in ((5, 9, None), (2, 3000, None), (1, 2100, 2049)):
        out = low(q_len, k_len, q_start=q_start)
        assert out.dtype == dtype
        expected = reference(q_len, k_len, q_start=q_start)
        info = torch.finfo(dtype)
        assert torch.equal(out, expected.clamp(info.min, info.max).to(dtype)), (q_len, k_len)


def test_float64_modules_compute_in_float64():
    for name in FAMILY_KWARGS:
        out = build(name, 2).double()(4, 6)
        assert out.dtype == torch.float64, name
        assert build(name, 2).double().dtype == torch.float64


def test_kerple_float16_saturates_instead_of_overflowing():
    module = KerplePower(2)
    with torch.no_grad():
        module.r1.fill_(1.0)
        module.r2.fill_(2.0)
    half = module.half()
    out = half(1, 65_536)  # -|i-j|^2 reaches -4.3e9, far below float16's -65504
    assert out.dtype == torch.float16
    assert torch.isfinite(out).all()
    assert out.min().item() == torch.finfo(torch.float16).min
    assert out[0, 0, -1].item() == 0.0
    assert out[0, 0, -101].item() == -10_000.0  # offset 100, exact in float16
    # Attention with a saturated bias still gives a proper distribution.
    q = torch.randn(1, 2, 1, 4, dtype=torch.float16)
    k = torch.randn(1, 2, 300, 4, dtype=torch.float16)
    v = torch.randn(1, 2, 300, 4, dtype=torch.float16)
    _, w = biased_attention(q, k, v, half, return_weights=True)
    assert torch.isfinite(w).all()
    torch.testing.assert_close(w.float().sum(-1), torch.ones(1, 2, 1), rtol=1e-2, atol=1e-2)


def test_fire_threshold_is_not_rounded_by_a_low_precision_cast():
    # L is the position where progressive interpolation starts; 513 is not a bfloat16
    # number (it rounds to 512), yet the cast module must still switch at i = 513.
    low = FIRE(2, L=513.0).to(torch.bfloat16)
    assert low.L.float().item() == 513.0


@pytest.mark.parametrize("dtype", LOW)
def test_fire_positions_are_exact_far_out(dtype):
    fire = build("fire", 2)
    low = copy.deepcopy(fire).to(dtype)
    reference = rounded_reference(fire, dtype)
    # Queries at 65,534 and 65,535: not representable in either low-precision dtype.
    out = low(2, 65_536)
    assert torch.isfinite(out).all()
    assert torch.equal(out, reference(2, 65_536).to(dtype))
