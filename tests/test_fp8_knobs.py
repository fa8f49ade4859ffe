"""Each fp8 knob and each preset, on the inputs where it matters, with hand-derived bytes.

Format facts used below (OCP FP8 spec and the fnuz variants):
  e4m3fn   bias 7,  max 448   = 0x7E, NaN S.1111.111, no inf, min subnormal 2**-9
  e5m2     bias 15, max 57344 = 0x7B, inf 0x7C|S, NaN 0x7D..0x7F|S, min subnormal 2**-16
  e4m3fnuz bias 8,  max 240   = 0x7F, single NaN 0x80, no -0, no inf, min subnormal 2**-10
  e5m2fnuz bias 16, max 57344 = 0x7F, single NaN 0x80, no -0, no inf, min subnormal 2**-17
A code is sign<<7 | biased_exponent<<mantissa_bits | mantissa.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference.fp8 import quantize
from oracle.reference.presets import PRESETS

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

INF = float("inf")
NAN = float("nan")


def q1(value, fmt, **kw) -> int:
    """The code of one float32 value (given as a float or as float32 bits)."""
    if isinstance(value, int):
        x = np.array([value], np.uint32).view(np.float32)
    else:
        x = np.array([value], np.float32)
    out = quantize(x, fmt, **kw)
    assert out.dtype == np.uint8 and out.shape == (1,)
    return int(out[0])


NEG_NAN_BITS = 0xFFC00000  # -NaN (quiet)
POS_NAN_BITS = 0x7FC00000


# --- saturate ----------------------------------------------------------------------------------
# 500: e4m3fn/e4m3fnuz overflow (above the tie 464 / 248 over max); e5m2: 500 lies between
# 448 = 1.75*2**8 and 512 = 2**9, above the midpoint 480 -> 512 = biased exponent 9+15 = 24
# -> 24<<2 = 0x60; e5m2fnuz: 9+16 = 25 -> 0x64. 1e30 overflows everywhere.
# Non-saturating overflow: e4m3fn NaN 0x7F|S, e5m2 inf 0x7C|S, fnuz 0x80.
SATURATE_CASES = [
    # fmt, x, saturate=True, saturate=False
    ("e4m3fn", 500.0, 0x7E, 0x7F),
    ("e4m3fn", -500.0, 0xFE, 0xFF),
    ("e4m3fn", 1e30, 0x7E, 0x7F),
    ("e4m3fn", -1e30, 0xFE, 0xFF),
    ("e4m3fn", INF, 0x7E, 0x7F),   # inf knob default: "max" when saturating, "nan" otherwise
    ("e4m3fn", -INF, 0xFE, 0xFF),
    ("e5m2", 500.0, 0x60, 0x60),
    ("e5m2", -500.0, 0xE0, 0xE0),
    ("e5m2", 1e30, 0x7B, 0x7C),
    ("e5m2", -1e30, 0xFB, 0xFC),
    ("e5m2", INF, 0x7B, 0x7C),     # inf knob default: "max" / "inf"
    ("e5m2", -INF, 0xFB, 0xFC),
    ("e4m3fnuz", 500.0, 0x7F, 0x80),
    ("e4m3fnuz", -500.0, 0xFF, 0x80),
    ("e4m3fnuz", 1e30, 0x7F, 0x80),
    ("e4m3fnuz", INF, 0x7F, 0x80),
    ("e4m3fnuz", -INF, 0xFF, 0x80),
    ("e5m2fnuz", 500.0, 0x64, 0x64),
    ("e5m2fnuz", 1e30, 0x7F, 0x80),
    ("e5m2fnuz", -1e30, 0xFF, 0x80),
    ("e5m2fnuz", INF, 0x7F, 0x80),
    ("e5m2fnuz", -INF, 0xFF, 0x80),
    # The ties above max: e4m3fn 464 rounds to even 448 (not an overflow); the others round up
    # to the code past max, an overflow.
    ("e4m3fn", 464.0, 0x7E, 0x7E),
    ("e5m2", 61440.0, 0x7B, 0x7C),
    ("e4m3fnuz", 248.0, 0x7F, 0x80),
    ("e5m2fnuz", 61440.0, 0x7F, 0x80),
]


@pytest.mark.parametrize("preset", sorted(p for p in PRESETS if p not in ("cuda_satfinite",
                                                                         "cuda_nosat",
                                                                         "triton_sm90",
                                                                         "torch_2_11_cuda")))
@pytest.mark.parametrize("fmt,x,sat,nonsat", SATURATE_CASES)
def test_saturate(fmt, x, sat, nonsat, preset):
    """Naming saturate alone decides overflow and ±inf on every preset (those with the canonical
    NaN byte here; tests/test_fp8_saturate_vs_ml_dtypes.py covers all of them): the preset's
    own inf applies only when the caller names neither saturate nor inf."""
    assert q1(x, fmt, preset=preset, saturate=True) == sat
    assert q1(x, fmt, preset=preset, saturate=False) == nonsat
    assert q1(x, fmt, saturate=True) == sat  # the default preset, ocp_satfinite
    assert q1(x, fmt, saturate=False) == nonsat


# --- how saturate, inf and a preset combine -------------------------------------------------
def test_saturate_false_alone_is_non_saturating_for_inf_too():
    """The default preset (ocp_satfinite) sends ±inf to ±max, but naming saturate=False gives the
    non-saturating rule for inf as for finite overflow: NaN S.1111.111 (e4m3fn), inf S.11111.00
    (e5m2), 0x80 (fnuz)."""
    x = np.array([INF, 1e30, -INF, -1e30], np.float32)
    assert quantize(x, "e4m3fn").tolist() == [0x7E, 0x7E, 0xFE, 0xFE]
    assert quantize(x, "e4m3fn", saturate=False).tolist() == [0x7F, 0x7F, 0xFF, 0xFF]
    assert quantize(x, "e5m2", saturate=False).tolist() == [0x7C, 0x7C, 0xFC, 0xFC]
    assert quantize(x, "e4m3fnuz", saturate=False).tolist() == [0x80] * 4
    assert quantize(x, "e5m2fnuz", saturate=False).tolist() == [0x80] * 4


def test_a_named_inf_wins_over_the_saturation_mode():
    # inf="max" named with saturate=False: ±inf -> ±max, finite overflow still NaN
    x = np.array([INF, 1e30, -INF, -1e30], np.float32)
    assert quantize(x, "e4m3fn", saturate=False, inf="max").tolist() == [0x7E, 0x7F, 0xFE, 0xFF]
    # inf named alone keeps the preset's saturate: ml_dtypes does not saturate 1e30
    assert quantize(x, "e4m3fn", preset="ml_dtypes", inf="max").tolist() == [0x7E, 0x7F, 0xFE, 0xFF]


def test_a_preset_keeps_its_inf_until_saturate_is_named():
    """onnx_saturate saturates but keeps e5m2 inf as inf (0x7C) and sends fnuz inf to 0x80.
    Naming saturate=True (even the preset's own value) chooses the saturating inf rule, ±max;
    naming inf as well restores the preset's choice. inf=None is the rule of whichever saturate
    applies, here the preset's (True): ±max."""
    assert q1(INF, "e5m2", preset="onnx_saturate") == 0x7C
    assert q1(INF, "e5m2", preset="onnx_saturate", saturate=True) == 0x7B
    assert q1(INF, "e5m2", preset="onnx_saturate", saturate=True, inf="inf") == 0x7C
    assert q1(INF, "e5m2", preset="onnx_saturate", inf=None) == 0x7B
    assert q1(-INF, "e4m3fnuz", preset="onnx_saturate") == 0x80
    assert q1(-INF, "e4m3fnuz", preset="onnx_saturate", saturate=True) == 0xFF
    # other knobs never reset inf: naming nan or scale_op keeps the preset's inf
    assert q1(INF, "e5m2", preset="onnx_saturate", nan="0x7E|sign", scale_op="mul_reciprocal") == 0x7C


def test_nan_bytes_stay_the_presets_under_a_named_saturate():
    """cuda_satfinite writes NaN 0x7F without sign; made non-saturating it is CUDA __NV_NOSAT
    (preset cuda_nosat): -1000 and -inf become 0x7F too (e4m3fn); e5m2 -inf stays -inf and
    -1000 is in range (-1024 = -2**10: exponent 10+15 = 25, 0x80 | 25<<2 = 0xE4)."""
    x = np.array([-1000.0, -INF, NAN], np.float32)
    x[2] = np.array([NEG_NAN_BITS], np.uint32).view(np.float32)[0]
    for fmt, expected in (("e4m3fn", [0x7F, 0x7F, 0x7F]), ("e5m2", [0xE4, 0xFC, 0x7F])):
        got = quantize(x, fmt, preset="cuda_satfinite", saturate=False).tolist()
        assert got == expected == quantize(x, fmt, preset="cuda_nosat").tolist(), fmt


def test_contract_knobs_follow_the_same_rule():
    """A contract that names saturate=False in its fp8_knobs gets the non-saturating inf rule;
    one that names inf too gets that inf."""
    from oracle.contract import Contract

    plain = Contract(op="quantize_fp8", name="test.quantize_fp8", backend="test",
                     fp8_formats=("e4m3fn", "e5m2"), fp8_knobs=(("saturate", False),))
    assert (plain.knobs("e4m3fn").inf, plain.knobs("e5m2").inf) == ("nan", "inf")
    pinned = Contract(op="quantize_fp8", name="test.quantize_fp8", backend="test",
                      fp8_formats=("e4m3fn",), fp8_knobs=(("saturate", False), ("inf", "max")))
    assert pinned.knobs("e4m3fn").inf == "max"


# --- inf ---------------------------------------------------------------------------------------
INF_CASES = [
    # fmt, policy, +inf, -inf   (the NaN encoding is the canonical 0x7F|sign / 0x80)
    ("e4m3fn", "max", 0x7E, 0xFE),
    ("e4m3fn", "nan", 0x7F, 0xFF),
    ("e5m2", "max", 0x7B, 0xFB),
    ("e5m2", "nan", 0x7F, 0xFF),
    ("e5m2", "inf", 0x7C, 0xFC),
    ("e4m3fnuz", "max", 0x7F, 0xFF),
    ("e4m3fnuz", "nan", 0x80, 0x80),
    ("e5m2fnuz", "max", 0x7F, 0xFF),
    ("e5m2fnuz", "nan", 0x80, 0x80),
]


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("fmt,policy,pos,neg", INF_CASES)
def test_inf_policy(fmt, policy, pos, neg, saturate):
    """inf is independent of saturate: it decides ±inf only."""
    assert q1(INF, fmt, inf=policy, saturate=saturate) == pos
    assert q1(-INF, fmt, inf=policy, saturate=saturate) == neg


def test_inf_policy_does_not_touch_finite_overflow():
    # Non-saturating e4m3fn with inf="max": inf -> 448, yet 1e30 still -> NaN.
    x = np.array([INF, 1e30, -INF, -1e30], np.float32)
    assert quantize(x, "e4m3fn", saturate=False, inf="max").tolist() == [0x7E, 0x7F, 0xFE, 0xFF]
    # Saturating e5m2 with inf="inf": inf stays inf, 1e30 -> 57344.
    assert quantize(x, "e5m2", saturate=True, inf="inf").tolist() == [0x7C, 0x7B, 0xFC, 0xFB]
    # Saturating fnuz with inf="nan": inf -> 0x80, overflow -> ±max.
    assert quantize(x, "e4m3fnuz", saturate=True, inf="nan").tolist() == [0x80, 0x7F, 0x80, 0xFF]


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz", "e5m2fnuz"])
def test_inf_policy_inf_needs_an_infinity(fmt):
    with pytest.raises(ValueError, match=f"inf='inf'.*{fmt} has no infinity"):
        q1(INF, fmt, inf="inf")


# --- nan ---------------------------------------------------------------------------------------
NAN_CASES = [
    # fmt, spec, +NaN, -NaN
    ("e4m3fn", "0x7F|sign", 0x7F, 0xFF),
    ("e4m3fn", "0x7F", 0x7F, 0x7F),
    ("e4m3fn", "0xFF", 0xFF, 0xFF),
    ("e5m2", "0x7F|sign", 0x7F, 0xFF),
    ("e5m2", "0x7F", 0x7F, 0x7F),
    ("e5m2", "0x7E|sign", 0x7E, 0xFE),
    ("e5m2", "0x7D|sign", 0x7D, 0xFD),
    ("e5m2", "0x7e|SIGN", 0x7E, 0xFE),  # spelling is case-insensitive
    ("e4m3fnuz", "0x80", 0x80, 0x80),
    ("e5m2fnuz", "0x80", 0x80, 0x80),
]


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("fmt,spec,pos,neg", NAN_CASES)
def test_nan_encoding(fmt, spec, pos, neg, saturate):
    for bits in (POS_NAN_BITS, 0x7F800001, 0x7FFFFFFF, 0x7FA5A5A5):  # quiet, signalling, payloads
        assert q1(bits, fmt, nan=spec, saturate=saturate) == pos, hex(bits)
        assert q1(bits | 0x80000000, fmt, nan=spec, saturate=saturate) == neg, hex(bits)


def test_nan_default_is_canonical():
    assert q1(NEG_NAN_BITS, "e4m3fn") == 0xFF
    assert q1(NEG_NAN_BITS, "e5m2") == 0xFF
    assert q1(NEG_NAN_BITS, "e4m3fnuz") == 0x80
    assert q1(NEG_NAN_BITS, "e5m2fnuz") == 0x80


def test_nan_encoding_is_also_the_e4m3fn_overflow_byte():
    """Non-saturating e4m3fn writes its NaN for overflow and (inf="nan") for inf."""
    x = np.array([1e30, -1e30, INF, -INF], np.float32)
    kw = {"saturate": False, "inf": "nan"}
    assert quantize(x, "e4m3fn", nan="0x7F", **kw).tolist() == [0x7F] * 4
    assert quantize(x, "e4m3fn", nan="0x7F|sign", **kw).tolist() == [0x7F, 0xFF] * 2
    # e5m2's non-saturating overflow is inf, never the NaN byte.
    assert quantize(x, "e5m2", saturate=False, inf="inf", nan="0x7D").tolist() == [0x7C, 0xFC] * 2


# --- scale_op ----------------------------------------------------------------------------------
def test_scale_op_hand_picked():
    """x = 0x3E63FFFF (0.22265624, one ulp below 0.22265625 = 3 * 0.07421875), s = 3.

    0.07421875 = 1.1875 * 2**-4 is the e4m3fn tie between 1.125*2**-4 (0x19: exponent -4+7 = 3,
    3<<3 | 1) and 1.25*2**-4 (0x1A). x / 3 = 0.074218745... is 0.67 float32 ulps (ulp 2**-27)
    below the tie, so float32 division gives the float32 just below it -> 0x19. float32(1/3) =
    0.3333333433 is rounded up; x * that = 0.0742187472, 0.37 ulps below the tie, which float32
    multiplication rounds to the tie itself -> ties to even -> 0x1A.
    """
    x = np.array([0x3E63FFFF], np.uint32).view(np.float32)
    div = quantize(x, "e4m3fn", scale=3.0, scale_op="div")
    mul = quantize(x, "e4m3fn", scale=3.0, scale_op="mul_reciprocal")
    assert div.tolist() == [0x19] and mul.tolist() == [0x1A]
    s = np.float32(3.0)
    assert (x * (np.float32(1) / s)).view(np.uint32).tolist() == [0x3D980000]  # exactly the tie
    assert (x / s).view(np.uint32).tolist() == [0x3D97FFFF]


@pytest.fixture(scope="module")
def scale_op_witnesses():
    """For each format and a few scales, float32 x where fp8(x / s) != fp8(x * (1/s)): found by
    searching the float32 neighbours of (fp8 tie) * s, with numpy and ml_dtypes only."""
    found = {}
    for fmt in o.FORMAT_NAMES:
        ties = o.boundary_magnitudes(fmt).astype(np.float64)
        for s in (3.0, 7.0, 0.1, 1.7):
            s32 = np.float32(s)
            centre = (ties * np.float64(s32)).astype(np.float32).view(np.uint32).astype(np.int64)
            x = (centre[:, None] + np.arange(-3, 4)).reshape(-1).astype(np.uint32).view(np.float32)
            with np.errstate(all="ignore"):
                a = o.ml_saturating(x / s32, fmt)
                b = o.ml_saturating(x * (np.float32(1) / s32), fmt)
            hits = np.flatnonzero(a != b)
            if hits.size:
                found[(fmt, s)] = x[hits[:5]]
    return found


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_scale_op_witnesses(scale_op_witnesses, fmt):
    keys = [k for k in scale_op_witnesses if k[0] == fmt]
    assert keys, f"no x / s vs x * (1/s) witness found for {fmt}"
    for _, s in keys:
        x = scale_op_witnesses[(fmt, s)]
        s32 = np.float32(s)
        div = quantize(x, fmt, scale=s, scale_op="div", **o.sat_knobs(fmt))
        mul = quantize(x, fmt, scale=s, scale_op="mul_reciprocal", **o.sat_knobs(fmt))
        assert np.all(div != mul)
        with np.errstate(all="ignore"):
            o.assert_codes_equal(div, o.ml_saturating(x / s32, fmt), x, f"{fmt} div s={s}")
            o.assert_codes_equal(mul, o.ml_saturating(x * (np.float32(1) / s32), fmt), x,
                                 f"{fmt} mul_reciprocal s={s}")


def test_scale_op_default_is_div():
    x = np.array([0x3E63FFFF], np.uint32).view(np.float32)
    assert quantize(x, "e4m3fn", scale=3.0).tolist() == [0x19]


def test_scale_is_rounded_to_float32_first():
    """A Python float scale is used as float32: 0.1 -> 0.100000001490116. With x = 0x3B466666,
    x / float32(0.1) and x / 0.1 (float64) land on different sides of an e4m3fn tie."""
    x = np.array([0x3B466666], np.uint32).view(np.float32)
    expected = int(o.ml_saturating(x / np.float32(0.1), "e4m3fn")[0])
    assert q1(0x3B466666, "e4m3fn", scale=0.1) == expected
    assert q1(0x3B466666, "e4m3fn", scale=np.float32(0.1)) == expected
    assert q1(0x3B466666, "e4m3fn", scale=np.array([0.1], np.float32)) == expected
    assert q1(0x3B466666, "e4m3fn", scale=np.array(0.1, np.float32)) == expected


# --- intermediate ------------------------------------------------------------------------------
INTERMEDIATE_CASES = [
    # bits, direct, via float16, via bfloat16
    # 0x3F080001 = 0.53125 + 2**-24 = (1.0625 + 2**-23) * 2**-1. e4m3fn at 2**-1 steps by 1/8:
    # 1.0625 is the tie between 0x30 (1.0) and 0x31 (1.125); a hair above -> 0x31. float16 (10
    # mantissa bits) and bfloat16 (7) drop the 2**-23 -> exactly the tie -> even 0x30.
    (0x3F080001, 0x31, 0x30, 0x30),
    # 0x3F37F333 = 1.43723 * 2**-1: below the tie 1.4375 between 0x33 (1.375) and 0x34 (1.5)
    # -> 0x33. float16: 1.43723 * 1024 = 1471.73 -> 1472 = 1.4375 -> tie -> even 0x34. bfloat16:
    # 1.43723 * 128 = 183.97 -> 184 = 1.4375 -> tie -> 0x34.
    (0x3F37F333, 0x33, 0x34, 0x34),
    # 0x3F97E000 = 1.1865234375 = 1.1875 - 2**-10: below the tie 1.1875 between 0x39 (1.125)
    # and 0x3A (1.25) -> 0x39; exact in float16 (1.1865234375 * 1024 = 1215) -> 0x39; bfloat16:
    # 1.1865234375 * 128 = 151.875 -> 152 = 1.1875 -> tie -> even 0x3A.
    (0x3F97E000, 0x39, 0x39, 0x3A),
    # The negatives: sign bit only.
    (0xBF97E000, 0xB9, 0xB9, 0xBA),
    (0xBF080001, 0xB1, 0xB0, 0xB0),
]


@pytest.mark.parametrize("bits,direct,via16,viabf", INTERMEDIATE_CASES)
def test_intermediate_witnesses_e4m3fn(bits, direct, via16, viabf):
    assert q1(bits, "e4m3fn") == direct
    assert q1(bits, "e4m3fn", intermediate=None) == direct
    assert q1(bits, "e4m3fn", intermediate="float16") == via16
    assert q1(bits, "e4m3fn", intermediate="bfloat16") == viabf


def test_intermediate_rounds_the_quotient():
    """The scaled float32 quotient is what is rounded to the 16-bit type: x = 2 * 0x3F97E000 =
    0x4017E000 (exact), s = 2 -> quotient 0x3F97E000 -> the bfloat16 witness above."""
    assert q1(0x4017E000, "e4m3fn", scale=2.0) == 0x39
    assert q1(0x4017E000, "e4m3fn", scale=2.0, intermediate="bfloat16") == 0x3A


def test_intermediate_float16_overflow_becomes_inf():
    """1e5 overflows float16 (max 65504) to inf, so the inf policy applies, not the overflow
    policy: e4m3fn saturating with inf="nan" -> direct 0x7E (overflow saturates), via float16
    0x7F (NaN). bfloat16 has float32's range: 1e5 stays finite -> 0x7E."""
    assert q1(1e5, "e4m3fn", saturate=True, inf="nan") == 0x7E
    assert q1(1e5, "e4m3fn", saturate=True, inf="nan", intermediate="float16") == 0x7F
    assert q1(1e5, "e4m3fn", saturate=True, inf="nan", intermediate="bfloat16") == 0x7E


# --- per-head scale ----------------------------------------------------------------------------
def test_per_head_scale_hand_derived():
    """x = ones[T=2, H=3, D=2], scales [1, 2, 4] on head_axis -2 (the default): 1/1 = 1.0 ->
    0x38, 1/2 = 2**-1 -> (6<<3) = 0x30, 1/4 = 2**-2 -> (5<<3) = 0x28."""
    x = np.ones((2, 3, 2), np.float32)
    scale = np.array([1.0, 2.0, 4.0], np.float32)
    got = quantize(x, "e4m3fn", scale=scale)
    expected = np.broadcast_to(np.array([0x38, 0x30, 0x28], np.uint8)[None, :, None], (2, 3, 2))
    assert got.shape == (2, 3, 2)
    np.testing.assert_array_equal(got, expected)
    # The same heads laid out as [H, T, D] with head_axis=0 (or -3).
    xt = np.ones((3, 2, 2), np.float32)
    for axis in (0, -3):
        got = quantize(xt, "e4m3fn", scale=scale, head_axis=axis)
        np.testing.assert_array_equal(got, expected.transpose(1, 0, 2))
    # [T, D, H] with head_axis=-1.
    got = quantize(np.ones((2, 2, 3), np.float32), "e4m3fn", scale=scale, head_axis=-1)
    np.testing.assert_array_equal(got, expected.transpose(0, 2, 1))


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
@pytest.mark.parametrize("scale_op", ["div", "mul_reciprocal"])
def test_per_head_scale_vs_ml_dtypes(fmt, scale_op):
    x = o.random_float32(5 * 8 * 64, seed=7).reshape(5, 8, 64)
    x = np.where(np.isfinite(x), x, np.float32(1.5)) * np.float32(1e-30)  # keep most in range
    x = np.concatenate([x, np.random.default_rng(1).standard_normal((5, 8, 64)).astype(np.float32)])
    scale = np.array([0.0123457, 0.1, 3.0, 1 / 448, 7.5, 1e-3, 1.0, 2.0 ** -40], np.float32)
    s = scale[None, :, None]
    with np.errstate(all="ignore"):
        quotient = x / s if scale_op == "div" else x * (np.float32(1) / s)
    assert quotient.dtype == np.float32
    got = quantize(x, fmt, scale=scale, scale_op=scale_op, **o.sat_knobs(fmt))
    o.assert_codes_equal(got, o.ml_saturating(quotient, fmt), x, f"{fmt} per-head {scale_op}")
    got = quantize(x, fmt, scale=scale, scale_op=scale_op, preset="ml_dtypes")
    o.assert_codes_equal(got, o.ml_codes(quotient, fmt), x, f"{fmt} per-head {scale_op} nonsat")


def test_per_tensor_scale_shapes_agree():
    x = np.random.default_rng(3).standard_normal((4, 2, 8)).astype(np.float32)
    a = quantize(x, "e4m3fn", scale=0.37)
    for scale in (np.float32(0.37), np.array(0.37, np.float32), np.array([0.37], np.float32)):
        np.testing.assert_array_equal(quantize(x, "e4m3fn", scale=scale), a)
    # A per-head scale whose entries are all equal is the per-tensor scale.
    np.testing.assert_array_equal(quantize(x, "e4m3fn", scale=np.full(2, 0.37, np.float32)), a)


def test_scale_one_is_identity():
    x = o.random_float32(1 << 12, seed=11)
    for fmt in o.FORMAT_NAMES:
        np.testing.assert_array_equal(quantize(x, fmt, scale=1.0), quantize(x, fmt))
        np.testing.assert_array_equal(quantize(x, fmt, scale=np.ones(1, np.float32)),
                                      quantize(x, fmt))


# --- presets -----------------------------------------------------------------------------------
# (preset, fmt, x (float or float32 bits), expected code); the x for NaN are bit patterns.
PRESET_CASES = {
    "ocp_satfinite": [
        ("e4m3fn", 1000.0, 0x7E), ("e4m3fn", -INF, 0xFE), ("e4m3fn", NEG_NAN_BITS, 0xFF),
        ("e5m2", 1e6, 0x7B), ("e5m2", INF, 0x7B), ("e5m2", NEG_NAN_BITS, 0xFF),
        ("e5m2", POS_NAN_BITS, 0x7F),
        ("e4m3fnuz", 1000.0, 0x7F), ("e4m3fnuz", -1000.0, 0xFF), ("e4m3fnuz", POS_NAN_BITS, 0x80),
        ("e5m2fnuz", 1e6, 0x7F), ("e5m2fnuz", -INF, 0xFF), ("e5m2fnuz", NEG_NAN_BITS, 0x80),
    ],
    "ml_dtypes": [
        ("e4m3fn", 1000.0, 0x7F), ("e4m3fn", -1000.0, 0xFF), ("e4m3fn", INF, 0x7F),
        ("e4m3fn", 464.0, 0x7E),
        ("e5m2", 1e6, 0x7C), ("e5m2", -INF, 0xFC), ("e5m2", POS_NAN_BITS, 0x7E),
        ("e5m2", NEG_NAN_BITS, 0xFE),
        ("e4m3fnuz", 1000.0, 0x80), ("e4m3fnuz", -INF, 0x80), ("e4m3fnuz", -0.0, 0x00),
        ("e5m2fnuz", 1e6, 0x80), ("e5m2fnuz", NEG_NAN_BITS, 0x80),
    ],
    "torch_2_11": [
        ("e4m3fn", 1000.0, 0x7F), ("e4m3fn", INF, 0x7F), ("e4m3fn", NEG_NAN_BITS, 0xFF),
        ("e5m2", 1e6, 0x7C), ("e5m2", POS_NAN_BITS, 0x7F), ("e5m2", NEG_NAN_BITS, 0xFF),
        ("e4m3fnuz", 1000.0, 0x80), ("e5m2fnuz", -1e6, 0x80),
    ],
    "torch_2_11_cuda": [
        ("e4m3fn", 1000.0, 0x7F), ("e4m3fn", -1000.0, 0xFF), ("e4m3fn", -INF, 0xFF),
        ("e4m3fn", NEG_NAN_BITS, 0x7F),
        ("e5m2", 1e6, 0x7C), ("e5m2", -INF, 0xFC), ("e5m2", NEG_NAN_BITS, 0x7F),
    ],
    "torch_2_13": [
        ("e4m3fn", 1000.0, 0x7E), ("e4m3fn", -1000.0, 0xFE), ("e4m3fn", INF, 0x7E),
        ("e4m3fn", NEG_NAN_BITS, 0xFF),
        ("e5m2", 1e6, 0x7C), ("e5m2", -INF, 0xFC), ("e5m2", POS_NAN_BITS, 0x7F),
        ("e4m3fnuz", 1000.0, 0x80), ("e5m2fnuz", 1e6, 0x80),
    ],
    "cuda_satfinite": [
        ("e4m3fn", 1000.0, 0x7E), ("e4m3fn", -INF, 0xFE), ("e4m3fn", NEG_NAN_BITS, 0x7F),
        ("e5m2", 1e6, 0x7B), ("e5m2", -INF, 0xFB), ("e5m2", NEG_NAN_BITS, 0x7F),
    ],
    "cuda_nosat": [
        ("e4m3fn", 1000.0, 0x7F), ("e4m3fn", INF, 0x7F), ("e4m3fn", NEG_NAN_BITS, 0x7F),
        ("e5m2", 1e6, 0x7C), ("e5m2", -INF, 0xFC), ("e5m2", NEG_NAN_BITS, 0x7F),
    ],
    "triton_sm90": [
        ("e4m3fn", 1e9, 0x7E), ("e4m3fn", -INF, 0xFE), ("e4m3fn", NEG_NAN_BITS, 0x7F),
        ("e5m2", 1e9, 0x7B), ("e5m2", INF, 0x7B), ("e5m2", NEG_NAN_BITS, 0x7F),
    ],
    "onnx_saturate": [
        ("e4m3fn", 1000.0, 0x7E), ("e4m3fn", INF, 0x7E), ("e4m3fn", -INF, 0xFE),
        ("e5m2", 1e6, 0x7B), ("e5m2", INF, 0x7C), ("e5m2", -INF, 0xFC),
        ("e4m3fnuz", 1000.0, 0x7F), ("e4m3fnuz", INF, 0x80),
        ("e5m2fnuz", -1e6, 0xFF), ("e5m2fnuz", -INF, 0x80),
    ],
}
OCP_ONLY = {"cuda_satfinite", "cuda_nosat", "triton_sm90", "torch_2_11_cuda"}


def test_every_preset_has_cases():
    assert set(PRESET_CASES) == set(PRESETS), "add hand-derived cases for new presets here"


@pytest.mark.parametrize("preset", sorted(PRESET_CASES))
def test_preset_distinguishing_inputs(preset):
    for fmt, x, expected in PRESET_CASES[preset]:
        got = q1(x, fmt, preset=preset)
        assert got == expected, f"{preset} {fmt} {x!r}: got 0x{got:02X}, expected 0x{expected:02X}"


@pytest.mark.parametrize("preset", sorted(OCP_ONLY))
@pytest.mark.parametrize("fmt", ["e4m3fnuz", "e5m2fnuz"])
def test_ocp_only_presets_refuse_fnuz(preset, fmt):
    with pytest.raises(ValueError, match=f"preset '{preset}' does not cover format '{fmt}'"):
        q1(1.0, fmt, preset=preset)


def test_overflow_nan_encodes_only_the_nans_the_conversion_makes():
    # e4m3fn without saturation: -1000 and -inf become NaN in the conversion; -NaN is a NaN input
    made, given = "0x7F|sign", "0x7F"
    assert q1(-1000.0, "e4m3fn", saturate=False, nan=given, overflow_nan=made) == 0xFF
    assert q1(-INF, "e4m3fn", saturate=False, inf="nan", nan=given, overflow_nan=made) == 0xFF
    assert q1(NEG_NAN_BITS, "e4m3fn", saturate=False, nan=given, overflow_nan=made) == 0x7F
    # unset, it follows nan
    assert q1(-1000.0, "e4m3fn", saturate=False, nan="0x7F") == 0x7F
    with pytest.raises(ValueError, match="0x80"):
        q1(-1000.0, "e4m3fnuz", saturate=False, overflow_nan="0x7F")


def test_preset_then_knob_override():
    # ml_dtypes preset, but saturating: e4m3fn 1000 -> 448.
    assert q1(1000.0, "e4m3fn", preset="ml_dtypes", saturate=True, inf="max") == 0x7E
    # cuda_satfinite with the sign kept on NaN.
    assert q1(NEG_NAN_BITS, "e4m3fn", preset="cuda_satfinite", nan="0x7F|sign") == 0xFF
    # torch_2_13's e5m2 made saturating.
    assert q1(1e6, "e5m2", preset="torch_2_13", saturate=True) == 0x7B


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_presets_agree_away_from_specials(preset):
    """Every preset gives the same codes as ml_dtypes on finite inputs within ±max: the
    differences are overflow, inf and NaN only."""
    formats = PRESETS[preset].formats
    x = o.boundary_float32()
    for fmt in formats:
        keep = np.isfinite(x) & (np.abs(x) <= o.FMAX[fmt])
        o.assert_codes_equal(quantize(x[keep], fmt, preset=preset), o.ml_codes(x[keep], fmt),
                             x[keep], f"{preset} {fmt} in range")


# --- torch as a second independent oracle ------------------------------------------------------
def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed (pip install torch==2.13.0 --index-url "
                    "https://download.pytorch.org/whl/cpu); torch is an optional second oracle")
    return torch


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
@pytest.mark.parametrize("source", ["float16", "bfloat16", "float32"])
def test_torch_2_13_preset_equals_torch(fmt, source):
    torch = _torch()
    if not torch.__version__.startswith("2.13"):
        pytest.skip(f"preset torch_2_13 models torch 2.13; installed torch is {torch.__version__}")
    if source == "float16":
        x = o.all_float16()
        t = torch.from_numpy(x.copy())
    elif source == "bfloat16":
        x = o.all_bfloat16()
        t = torch.from_numpy(x.view(np.uint16).copy()).view(torch.bfloat16)
    else:
        x = np.concatenate([o.random_float32(1 << 20, seed=5), o.boundary_float32()])
        t = torch.from_numpy(x.copy())
    target = getattr(torch, f"float8_{fmt}")
    expected = t.to(target).view(torch.uint8).numpy()
    o.assert_codes_equal(quantize(x, fmt, preset="torch_2_13"), expected, x,
                         f"torch {torch.__version__} {source} -> {fmt}")


# --- rounding="ties_away" ----------------------------------------------------------------------
# The oracle: ml_dtypes rounds to nearest even; at an exact midpoint between two adjacent values
# of the format, ties_away takes the larger magnitude instead, and everywhere else agrees.

def _midpoint_inputs(fmt):
    """Inputs near every boundary of ``fmt`` (overflow left out: saturate's business), whether each
    lies exactly on a midpoint between two adjacent magnitudes (every midpoint is reached), and
    the magnitudes below and above it."""
    values = o.representable_magnitudes(fmt)
    x = o.near(o.boundary_magnitudes(fmt))
    x = x[np.isfinite(x) & (np.abs(x) <= values[-1])]
    magnitude = np.abs(x.astype(np.float64))
    at_tie = np.isin(magnitude, (values[1:] + values[:-1]) / 2)
    assert at_tie.sum() >= len(values) - 1
    at = np.searchsorted(values, magnitude)
    return x, at_tie, values[np.maximum(at - 1, 0)], values[np.minimum(at, len(values) - 1)]


def _ties_to(fmt, x, at_tie, chosen):
    """ml_dtypes' codes of ``x``, but of ``chosen`` at the ties (fnuz: no -0, a negative value
    rounding to zero is +0)."""
    expected = np.where(at_tie, o.ml_codes(chosen.astype(np.float32), fmt), o.ml_codes(x, fmt))
    return np.where(expected == 0x80, 0, expected) if o.FNUZ[fmt] else expected


def _assert_rounds(fmt, rounding, x, expected):
    listed, count = o.mismatches(quantize(x, fmt, rounding=rounding), expected, x)
    assert count == 0, listed


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_ties_away_takes_the_larger_magnitude_at_every_midpoint_and_agrees_elsewhere(fmt):
    x, at_tie, _, upper = _midpoint_inputs(fmt)
    _assert_rounds(fmt, "ties_away", x, _ties_to(fmt, x, at_tie, np.where(np.signbit(x), -upper, upper)))


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_ties_upward_takes_the_larger_signed_neighbour_at_every_midpoint_and_agrees_elsewhere(fmt):
    """ties_upward (floor(x + 0.5)): a positive tie as ties_away, a negative one toward zero."""
    x, at_tie, lower, upper = _midpoint_inputs(fmt)
    expected = _ties_to(fmt, x, at_tie, np.where(np.signbit(x), -lower, upper))
    if not o.FNUZ[fmt]:  # a negative tie above zero rounds to -0
        expected = np.where(at_tie & np.signbit(x) & (lower == 0), 0x80, expected)
    _assert_rounds(fmt, "ties_upward", x, expected)


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_ties_toward_zero_takes_the_smaller_neighbour_at_every_midpoint_and_agrees_elsewhere(fmt):
    """ties_toward_zero (round half down on the magnitude): every tie to the smaller magnitude."""
    x, at_tie, lower, _ = _midpoint_inputs(fmt)
    _assert_rounds(fmt, "ties_toward_zero", x, _ties_to(fmt, x, at_tie, np.copysign(lower, x)))


def test_ties_toward_zero_hand_vectors():
    # 17 lies halfway between 16 (0x58) and 18 (0x59): both signs go to 16; 19 (18 | 20) to 18.
    assert q1(17.0, "e4m3fn", rounding="ties_toward_zero") == 0x58
    assert q1(-17.0, "e4m3fn", rounding="ties_toward_zero") == 0xD8
    assert q1(19.0, "e4m3fn", rounding="ties_toward_zero") == 0x59
    assert q1(17.5, "e4m3fn", rounding="ties_toward_zero") == 0x59  # not a tie: nearest


def _toward_zero_16bit(x: np.ndarray, kind: str) -> np.ndarray:
    """An independent float32 -> 16-bit rounding toward zero: bfloat16 as the float32's top half
    (the low 16 bits cleared), float16 as numpy's nearest-even value stepped one ulp toward zero
    where it rounded away."""
    if kind == "bfloat16":
        return (x.view(np.uint32) & np.uint32(0xFFFF0000)).view(np.float32)
    with np.errstate(over="ignore"):
        nearest = x.astype(np.float16)
    away = np.abs(nearest.astype(np.float32)) > np.abs(x)
    return np.where(away, np.nextafter(nearest, np.float16(0)), nearest).astype(np.float32)


@pytest.mark.parametrize("kind", ["float16", "bfloat16"])
@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_an_intermediate_rounded_toward_zero_is_that_truncation_then_the_fp8_rounding(fmt, kind):
    values = o.representable_magnitudes(fmt)
    x = o.near(o.boundary_magnitudes(fmt))
    x = x[np.isfinite(x) & (np.abs(x) <= values[-1])]
    expected = o.ml_codes(_toward_zero_16bit(x, kind), fmt)
    if o.FNUZ[fmt]:
        expected = np.where(expected == 0x80, 0, expected)
    listed, count = o.mismatches(quantize(x, fmt, intermediate=f"{kind}_rz"), expected, x)
    assert count == 0, listed


def test_ties_upward_hand_vectors():
    # 17 lies halfway between 16 (0x58) and 18 (0x59): +17 goes up to 18, -17 toward zero to -16.
    assert q1(17.0, "e4m3fn", rounding="ties_upward") == 0x59
    assert q1(-17.0, "e4m3fn", rounding="ties_upward") == 0xD8
    assert q1(-(2.0 ** -10), "e4m3fn", rounding="ties_upward") == 0x80
    assert q1(17.5, "e4m3fn", rounding="ties_upward") == 0x59  # not a tie: nearest


def test_ties_away_hand_vectors():
    # e4m3fn: 17 lies halfway between 16 (0x58) and 18 (0x59); to even gives 16, away 18.
    # 0.5 * 2**-9 (half the smallest subnormal) rounds to 0 to even, to 2**-9 (0x01) away.
    assert q1(17.0, "e4m3fn") == 0x58 and q1(17.0, "e4m3fn", rounding="ties_away") == 0x59
    assert q1(-17.0, "e4m3fn", rounding="ties_away") == 0xD9
    assert q1(2.0 ** -10, "e4m3fn") == 0x00 and q1(2.0 ** -10, "e4m3fn", rounding="ties_away") == 0x01
    assert q1(17.5, "e4m3fn", rounding="ties_away") == 0x59  # not a tie: nearest
