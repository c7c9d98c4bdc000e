"""RotaryEmbedding: the relative property, every scaling at hand-computed points and
against HuggingFace transformers' own functions, and clear errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import relbias
from relbias import RopeScaling, RotaryEmbedding
from relbias.rotary import yarn_attention_factor

FAST = settings(max_examples=60, deadline=None)


def base_thetas(d: int, base: float) -> torch.Tensor:
    """theta_k = b^{-2(k-1)/d}, k = 1..d/2, in float64 (the book's Eqs. 2.92-2.94)."""
    return torch.tensor([base ** (-2 * k / d) for k in range(d // 2)], dtype=torch.float64)


def close(got: torch.Tensor, want, rtol: float = 2e-6):
    torch.testing.assert_close(
        got.double(), torch.as_tensor(want, dtype=torch.float64), rtol=rtol, atol=0
    )


# --- the relative property (Eq. 2.90) ---------------------------------------------------------


SCALINGS = [
    None,
    RopeScaling("linear", 4.0),
    RopeScaling("ntk", 4.0),
    RopeScaling("dynamic", 2.0, original_len=32),
    RopeScaling("yarn", 8.0, original_len=32),
]


@FAST
@given(
    seed=st.integers(0, 2**31 - 1),
    half_dim=st.integers(2, 16),
    i=st.integers(0, 400),
    j=st.integers(0, 400),
    shift=st.integers(1, 400),
    scaling=st.sampled_from(SCALINGS),
)
def test_score_depends_only_on_the_offset(seed, half_dim, i, j, shift, scaling):
    """Ro(q, i theta) Ro(k, j theta)^T == Ro(q, (i+c) theta) Ro(k, (j+c) theta)^T."""
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 2 * half_dim, generator=gen, dtype=torch.float64).unbind(0)
    rope = RotaryEmbedding(2 * half_dim, scaling=scaling)
    n = max(i, j) + shift + 1  # one sequence length for every call ("dynamic")

    def score(a, b):
        return float(rope.rotate(q, [a], n).double() @ rope.rotate(k, [b], n).double().T)

    # float32 angles of positions up to 800: about 1e-4 radians of rounding
    scale = float(q.norm() * k.norm()) * rope.attention_factor**2
    assert math.isclose(score(i, j), score(i + shift, j + shift), abs_tol=2e-4 * scale)


def test_score_is_the_unrotated_query_times_the_offset_rotation():
    """Eq. 2.90: the score equals q R_{(i-j) theta} k^T, the key at position 0."""
    torch.manual_seed(0)
    rope = RotaryEmbedding(8, base=100.0)
    q, k = torch.randn(2, 1, 8).unbind(0)
    for i, j in [(5, 2), (9, 0), (30, 27)]:
        left = rope.rotate(q, [i]) @ rope.rotate(k, [j]).T
        right = rope.rotate(q, [i - j]) @ k.T
        torch.testing.assert_close(left, right, rtol=1e-5, atol=1e-5)


def test_rotation_keeps_the_norm_and_position_zero_is_the_identity():
    torch.manual_seed(1)
    x = torch.randn(3, 10, 16)
    rope = RotaryEmbedding(16)
    out = rope(x)
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(out[:, 0], x[:, 0])


def test_consecutive_pairs_turn_by_t_theta():
    """Pair k of the token at position t turns by t theta_k (Eq. 2.85), hand-computed."""
    rope = RotaryEmbedding(4, base=100.0)  # theta = [1, 0.1]
    x = torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    out = rope.rotate(x, [3])[0]
    want = [math.cos(3), math.sin(3), math.cos(0.3), math.sin(0.3)]
    close(out, want)
    close(rope.angles([3])[0], [3.0, 0.3])


# --- each scaling at hand-computed points -----------------------------------------------------


def test_plain_thetas():
    close(RotaryEmbedding(8, base=10000.0).inv_freq(), [1.0, 0.1, 0.01, 0.001])


def test_linear_interpolation_divides_every_angle_by_s():
    """Eq. 2.100: Ro(x_i, (m_l/m) i theta), i.e. positions times m_l/m."""
    s = 4.0
    rope = RotaryEmbedding(8, scaling=RopeScaling("linear", s))
    close(rope.inv_freq(), [0.25, 0.025, 0.0025, 0.00025])
    plain = RotaryEmbedding(8)
    torch.manual_seed(2)
    x = torch.randn(5, 8)
    positions = torch.tensor([0, 3, 64, 100, 255])
    torch.testing.assert_close(rope.rotate(x, positions), plain.rotate(x, positions / s))


def test_ntk_grows_the_base_by_lambda():
    """Eqs. 2.101-2.104: lambda = s^{d/(d-2)}; theta'_1 kept, theta'_{d/2} = theta_{d/2}/s."""
    s, d, b = 4.0, 4, 100.0
    rope = RotaryEmbedding(d, base=b, scaling=RopeScaling("ntk", s))
    lam = s ** (d / (d - 2))  # 16
    close(rope.inv_freq(), [1.0, (lam * b) ** -0.5])  # [1, 1/40]
    close(rope.inv_freq(), [1.0, 0.1 / s])
    for d, s in [(8, 2.0), (16, 8.0), (64, 3.5)]:
        got = RotaryEmbedding(d, scaling=RopeScaling("ntk", s)).inv_freq().double()
        theta = base_thetas(d, 10000.0)
        close(got / theta, [s ** (-2 * k / (d - 2)) for k in range(d // 2)], rtol=5e-6)


def test_dynamic_ntk_follows_the_sequence_length():
    m_l, d = 64, 8
    rope = RotaryEmbedding(d, scaling=RopeScaling("dynamic", 1.0, original_len=m_l))
    plain = RotaryEmbedding(d).inv_freq()
    for n in (1, 10, 64):  # no change up to the training length
        assert torch.equal(rope.inv_freq(n), plain)
    assert torch.equal(rope.inv_freq(), plain)
    for s in (2, 4, 16):  # factor 1: the book's NTK with m = n
        ntk = RotaryEmbedding(d, scaling=RopeScaling("ntk", float(s))).inv_freq()
        torch.testing.assert_close(rope.inv_freq(s * m_l), ntk, rtol=0, atol=0)
    # factor 2 at n = 2 m_l: lambda = (2 * 2 - 1)^{d/(d-2)} = 3^{4/3}
    rope.scaling = rope.scaling.replace(factor=2.0)
    lam = 3.0 ** (d / (d - 2))
    close(rope.inv_freq(128), [(lam * 10000.0) ** (-2 * k / d) for k in range(d // 2)])
    # forward reads the length of the sequence
    x = torch.randn(1, 200, d)
    torch.testing.assert_close(rope(x), rope.rotate(x, torch.arange(200), 200))
    assert not torch.allclose(rope(x), rope.rotate(x, torch.arange(200), 64))


def test_yarn_ramp_at_hand_computed_pairs():
    """d = 16, b = 10^4, m_l = 2048: pair index where r = m_l / T_k is 32 and 1 is
    16 ln(2048 / (2 pi r)) / (2 ln 10^4) = 2.016 and 5.027, rounded out to 2 and 6: pairs
    0-2 are kept, 6-7 interpolated, 3, 4, 5 blended with gamma = 3/4, 1/2, 1/4."""
    s, d = 4.0, 16
    rope = RotaryEmbedding(d, scaling=RopeScaling("yarn", s, original_len=2048))
    gamma = torch.tensor([1, 1, 1, 0.75, 0.5, 0.25, 0, 0], dtype=torch.float64)
    theta = base_thetas(d, 10000.0)
    close(rope.inv_freq(), theta * (gamma + (1 - gamma) / s))
    assert math.isclose(rope.attention_factor, 0.1 * math.log(4.0) + 1)
    # without rounding: ramp from 2.016 to 5.027
    exact = RotaryEmbedding(d, scaling=RopeScaling("yarn", s, original_len=2048, truncate=False))
    low = 16 * math.log(2048 / (2 * math.pi * 32)) / (2 * math.log(10000))
    high = 16 * math.log(2048 / (2 * math.pi)) / (2 * math.log(10000))
    ramp = ((torch.arange(8, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    close(exact.inv_freq(), theta * ((1 - ramp) + ramp / s), rtol=5e-6)


def test_yarn_temperature_scales_every_score_by_its_square():
    torch.manual_seed(3)
    d = 16
    for s in (2.0, 8.0):
        rope = RotaryEmbedding(d, scaling=RopeScaling("yarn", s, original_len=64))
        t_inv = (0.1 * math.log(s) + 1) ** 2  # 1/t
        q, k = torch.randn(2, 1, 20, d).unbind(0)
        qr, kr = rope(q, k)
        # same angles without the temperature: a YaRN with attention_factor 1
        no_temp = RotaryEmbedding(
            d, scaling=RopeScaling("yarn", s, original_len=64, attention_factor=1.0)
        )
        q1, k1 = no_temp(q, k)
        torch.testing.assert_close(qr @ kr.transpose(-1, -2), t_inv * (q1 @ k1.transpose(-1, -2)))
    assert yarn_attention_factor(1.0) == 1.0


def test_scaling_can_change_after_construction():
    rope = RotaryEmbedding(8)
    before = rope.inv_freq()
    rope.scaling = {"kind": "linear", "factor": 2.0}
    assert rope.scaling == RopeScaling("linear", 2.0)
    torch.testing.assert_close(rope.inv_freq(), before / 2)
    rope.scaling = None
    assert torch.equal(rope.inv_freq(), before)
    assert "linear" not in repr(rope) and "head_dim=8" in repr(rope)


def test_forward_positions_and_decoding():
    """Queries sit at q_start.., keys at 0..; by default the queries are the last keys."""
    torch.manual_seed(4)
    rope = RotaryEmbedding(8, scaling=RopeScaling("yarn", 4.0, original_len=16))
    q, k = torch.randn(2, 2, 3, 12, 8).unbind(0)
    full_q, full_k = rope(q, k)
    last_q, keys = rope(q[..., -1:, :], k)  # decoding the last token
    torch.testing.assert_close(last_q, full_q[..., -1:, :])
    torch.testing.assert_close(keys, full_k)
    torch.testing.assert_close(rope(q[..., 4:6, :], q_start=4), full_q[..., 4:6, :])
    assert torch.equal(rope(q), rope(q, q_start=0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_is_kept(dtype):
    x = torch.randn(2, 7, 8).to(dtype)
    out = RotaryEmbedding(8, scaling=RopeScaling("ntk", 2.0))(x)
    assert out.dtype == dtype and out.shape == x.shape


# --- against HuggingFace transformers ---------------------------------------------------------


def hf_init(kind: str, d: int, base: float, max_pos: int, seq_len=None, **params):
    """inv_freq and attention factor from transformers' ROPE_INIT_FUNCTIONS."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=d * 2,
        num_attention_heads=2,
        max_position_embeddings=max_pos,
        rope_parameters={"rope_type": kind, "rope_theta": base, **params},
    )
    return ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)


@pytest.mark.parametrize("d", [4, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0, 7.5, 16.0])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
def test_linear_equals_transformers(d, factor, base):
    inv, attention = hf_init("linear", d, base, 64, factor=factor)
    rope = RotaryEmbedding(d, base, RopeScaling("linear", factor))
    assert torch.equal(rope.inv_freq(), inv) and rope.attention_factor == attention == 1.0


@pytest.mark.parametrize("d", [4, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.0, 2.0, 8.0])
@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 128, 300, 1024])
def test_dynamic_equals_transformers(d, factor, seq_len):
    inv, attention = hf_init("dynamic", d, 10000.0, 64, seq_len=seq_len, factor=factor)
    rope = RotaryEmbedding(d, scaling=RopeScaling("dynamic", factor, original_len=64))
    assert torch.equal(rope.inv_freq(seq_len), inv) and attention == 1.0


@pytest.mark.parametrize("d", [8, 16, 64, 128])
@pytest.mark.parametrize("factor", [1.5, 2.0, 4.0, 16.0])
@pytest.mark.parametrize("original_len", [64, 2048])
@pytest.mark.parametrize("extra", [{}, {"beta_fast": 16.0, "beta_slow": 2.0}, {"truncate": False}])
def test_yarn_equals_transformers(d, factor, original_len, extra):
    inv, attention = hf_init(
        "yarn",
        d,
        10000.0,
        original_len * 4,
        factor=factor,
        original_max_position_embeddings=original_len,
        **extra,
    )
    rope = RotaryEmbedding(d, scaling=RopeScaling("yarn", factor, original_len, **extra))
    torch.testing.assert_close(rope.inv_freq(), inv, rtol=1.2e-7, atol=0)
    assert math.isclose(rope.attention_factor, attention, rel_tol=1e-12)


def test_ntk_equals_transformers_dynamic_at_the_target_length():
    """Static NTK with s is HF's dynamic (factor 1) at seq_len = s * m_l."""
    for s in (2, 4, 16):
        inv, _ = hf_init("dynamic", 64, 10000.0, 64, seq_len=64 * s, factor=1.0)
        rope = RotaryEmbedding(64, scaling=RopeScaling("ntk", float(s)))
        assert torch.equal(rope.inv_freq(), inv)


def test_scores_equal_transformers_rotate_half_up_to_a_permutation():
    """HF pairs dimension k with k + d/2; the book pairs 2k with 2k+1. Same scores."""
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(5)
    d, n = 16, 40
    rope = RotaryEmbedding(d, scaling=RopeScaling("yarn", 4.0, original_len=16))
    q, k = torch.randn(2, 1, 2, n, d).unbind(0)
    angles = rope.angles(torch.arange(n))
    emb = torch.cat((angles, angles), dim=-1)[None]
    cos, sin = emb.cos() * rope.attention_factor, emb.sin() * rope.attention_factor
    perm = torch.cat((torch.arange(0, d, 2), torch.arange(1, d, 2)))  # book -> HF layout
    hf_q, hf_k = apply_rotary_pos_emb(q[..., perm], k[..., perm], cos, sin)
    ours_q, ours_k = rope(q, k)
    torch.testing.assert_close(hf_q, ours_q[..., perm], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(
        hf_q @ hf_k.transpose(-1, -2), ours_q @ ours_k.transpose(-1, -2), rtol=1e-4, atol=1e-4
    )


# --- bad settings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"head_dim": 7}, ValueError, "head_dim must be even"),
        ({"head_dim": 0}, ValueError, "head_dim must be an integer >= 2"),
        ({"head_dim": 8.0}, TypeError, "head_dim must be an integer"),
        ({"head_dim": 8, "base": 1.0}, ValueError, "base must be > 1"),
        ({"head_dim": 8, "base": -3.0}, ValueError, "base must be a positive"),
        ({"head_dim": 8, "scaling": "linear"}, TypeError, "scaling must be None, a RopeScaling"),
        ({"head_dim": 8, "scaling": {"kind": "ntk", "factr": 2}}, TypeError, "factr"),
        (
            {"head_dim": 2, "scaling": RopeScaling("ntk", 2.0)},
            ValueError,
            "needs head_dim >= 4",
        ),
    ],
)
def test_bad_embedding_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        RotaryEmbedding(**kwargs)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"kind": "ntk_aware", "factor": 2.0}, ValueError, "kind must be one of"),
        ({"kind": None}, ValueError, "kind must be one of"),
        ({"kind": "linear", "factor": 0.5}, ValueError, "factor must be >= 1"),
        ({"kind": "linear", "factor": float("nan")}, ValueError, "factor must be a positive"),
        ({"kind": "linear", "factor": "2"}, TypeError, "factor must be a positive number"),
        ({"kind": "yarn", "factor": 2.0}, ValueError, "needs original_len"),
        ({"kind": "dynamic", "factor": 2.0}, ValueError, "needs original_len"),
        ({"kind": "yarn", "factor": 2.0, "original_len": 0}, ValueError, "original_len"),
        (
            {"kind": "yarn", "factor": 2.0, "original_len": 64, "beta_fast": 1.0},
            ValueError,
            "beta_fast > beta_slow",
        ),
        (
            {"kind": "yarn", "factor": 2.0, "original_len": 64, "attention_factor": 0.0},
            ValueError,
            "attention_factor",
        ),
        ({"kind": "yarn", "factor": 2.0, "original_len": 64, "truncate": 1}, TypeError, "truncate"),
    ],
)
def test_bad_scaling_settings(kwargs, error, match):
    with pytest.raises(error, match=match):
        RopeScaling(**kwargs)


def test_bad_inputs():
    rope = RotaryEmbedding(8)
    with pytest.raises(ValueError, match=r"q must be a tensor \[..., len, head_dim=8\]"):
        rope(torch.randn(3, 6))
    with pytest.raises(ValueError, match="k must be a tensor"):
        rope(torch.randn(3, 8), torch.randn(3, 4))
    with pytest.raises(ValueError, match="q_start must be an integer >= 0"):
        rope(torch.randn(3, 8), q_start=-1)
    with pytest.raises(ValueError, match=r"positions must have shape \[len\]"):
        rope.rotate(torch.randn(3, 8), [0, 1])
    with pytest.raises(ValueError, match="x must be a tensor"):
        rope.rotate([1.0] * 8, [0])
    dynamic = RotaryEmbedding(8, scaling=RopeScaling("dynamic", 2.0, original_len=8))
    with pytest.raises(ValueError, match="seq_len must be an integer >= 1"):
        dynamic.inv_freq(0)


def test_exported_from_the_package():
    assert relbias.RotaryEmbedding is RotaryEmbedding and relbias.RopeScaling is RopeScaling
    assert relbias.SCALING_KINDS == ("linear", "ntk", "dynamic", "yarn")
