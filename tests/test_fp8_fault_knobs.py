"""The fp8 fault knobs (``rounding``, ``subnormals``, ``negative_zero``) and the fp8 hypotheses the
op specs propose (the mutants that commit these faults are judged with the others, in
tests/test_mutants.py and tests/test_diagnosis.py).

The knobs are checked against oracles built from ml_dtypes alone (``fp8_oracle``): its casts,
the values of its 256 codes, and numpy bit manipulation; over every float16 and bfloat16 pattern,
random float32 patterns, every float32 near a code or a step, scaled quotients, and hand-derived
vectors. Format facts (OCP FP8 and the fnuz variants):
  e4m3fn   max 448 = 0x7E (next step 480),  smallest normal 2**-6 = 0x08,  min subnormal 2**-9
  e5m2     max 57344 = 0x7B (step 65536),   smallest normal 2**-14 = 0x04, min subnormal 2**-16
  e4m3fnuz max 240 = 0x7F (step 256),       smallest normal 2**-7 = 0x08,  min subnormal 2**-10
  e5m2fnuz max 57344 = 0x7F (step 65536),   smallest normal 2**-15 = 0x04, min subnormal 2**-17
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp8_oracle as o
from oracle.buffers import Arena
from oracle.cases import Case, catalogue
from oracle.contract import Contract
from oracle.diagnose import CAUSES
from oracle.mutants import base_contracts
from oracle.ops import _fp8cases, _fp8hypotheses, get_spec
from oracle.reference.fp8 import Fp8Knobs, quantize
from oracle.reference.presets import PRESETS
from oracle.reference.rounding import FLOAT16, round_float32

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FORMATS = o.FORMAT_NAMES
ML_PRESET = "ml_dtypes"  # non-saturating, ml_dtypes' own NaN bytes: the oracle's behaviour
STEP_PAST_MAX = {"e4m3fn": 480.0, "e5m2": 65536.0, "e4m3fnuz": 256.0, "e5m2fnuz": 65536.0}


# --- oracles: ml_dtypes and numpy only ---------------------------------------------------------

def _finite_codes(fmt: str) -> tuple[np.ndarray, np.ndarray]:
    """(magnitudes ascending, their codes) of the finite non-negative codes 0x00..0x7F."""
    codes = np.arange(0x80, dtype=np.uint8)
    values = o.ml_values(codes, fmt)
    finite = np.isfinite(values)
    return values[finite], codes[finite]


def nearest(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """ml_dtypes' round-to-nearest codes, clamped first when saturating."""
    return o.ml_saturating(x, fmt) if saturate else o.ml_codes(x, fmt)


def toward_zero(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """Truncation by search: the largest finite code magnitude at or below |x|, with x's sign (an
    exact value, so ml_dtypes' cast of it is exact); from the step past max on, the overflow
    (saturating: ±max; else ml_dtypes' own overflow code); inf and NaN as the nearest cast."""
    magnitudes, _ = _finite_codes(fmt)
    step = magnitudes[-1] + (magnitudes[-1] - magnitudes[-2])  # max + its ulp
    assert step == STEP_PAST_MAX[fmt]
    a = np.abs(x)
    with np.errstate(invalid="ignore"):
        below = magnitudes[np.maximum(np.searchsorted(magnitudes, a, side="right") - 1, 0)]
        out = o.ml_codes(np.copysign(below, x).astype(np.float32), fmt)
        special = ~np.isfinite(x) | (a >= step)
    return np.where(special, nearest(x, fmt, saturate), out)


def flushed(codes: np.ndarray, x: np.ndarray, fmt: str) -> np.ndarray:
    """``codes`` with every subnormal result (0 < |value| < smallest normal) made zero: with x's
    sign bit, except in fnuz (one zero, 0x00)."""
    values = o.ml_values(codes, fmt)
    tiny = ml_dtypes.finfo(o.ML_TYPES[fmt]).smallest_normal
    with np.errstate(invalid="ignore"):
        subnormal = np.isfinite(values) & (values != 0) & (np.abs(values) < tiny)
    zero = np.zeros_like(codes) if o.FNUZ[fmt] else np.where(np.signbit(x), 0x80, 0).astype(np.uint8)
    return np.where(subnormal, zero, codes)


def positive_zero(codes: np.ndarray, fmt: str) -> np.ndarray:
    """``codes`` with -0 (0x80, outside fnuz where 0x80 is the NaN) written as 0x00."""
    return codes if o.FNUZ[fmt] else np.where(codes == 0x80, 0, codes).astype(np.uint8)


def overflow_code(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """What an overflowing x becomes: ±max saturating, else ml_dtypes' code of ±inf."""
    return nearest(np.copysign(np.float32(np.inf), x).astype(np.float32), fmt, saturate)


def carry_dropped(codes: np.ndarray, x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """``codes`` where a normal |x| rounds to nearest even up to the next power of two (its
    truncation in its own binade, one ulp up, reaching 2^(e+1): the mantissa field's carry)
    replaced by 2^e with x's sign, or the overflow where 2^e is past max."""
    mbits = 3 if fmt.startswith("e4m3") else 2
    a = np.abs(x.astype(np.float64))
    normal = np.isfinite(a) & (a >= ml_dtypes.finfo(o.ML_TYPES[fmt]).smallest_normal)
    e = np.frexp(np.where(normal, a, 1.0))[1] - 1  # a in [2^e, 2^(e+1))
    ulp = np.ldexp(1.0, e - mbits)
    kept = np.floor(a / ulp)
    rest = a - kept * ulp
    up = (rest > ulp / 2) | ((rest == ulp / 2) & (kept % 2 == 1))
    carried = normal & up & ((kept + 1) * ulp == np.ldexp(1.0, e + 1))
    low = np.copysign(np.ldexp(1.0, e), x).astype(np.float32)
    dropped = np.where(np.abs(low) > o.FMAX[fmt], overflow_code(x, fmt, saturate), o.ml_codes(low, fmt))
    return np.where(carried, dropped, codes).astype(np.uint8)


def oracle(x: np.ndarray, fmt: str, saturate: bool, rounding="nearest_even", subnormals="keep",
           negative_zero="keep", overflow_test="rounded", carry="kept") -> np.ndarray:
    codes = toward_zero(x, fmt, saturate) if rounding == "toward_zero" else nearest(x, fmt, saturate)
    if carry == "dropped":
        codes = carry_dropped(codes, x, fmt, saturate)
    if overflow_test == "unrounded":  # past max before rounding: the overflow, whatever it rounds to
        with np.errstate(invalid="ignore"):
            past = np.isfinite(x) & (np.abs(x) > o.FMAX[fmt])
        codes = np.where(past, overflow_code(x, fmt, saturate), codes)
    if subnormals == "truncate":  # below the smallest normal, the value truncated; above, as rounded
        with np.errstate(invalid="ignore"):
            below = np.abs(x) < ml_dtypes.finfo(o.ML_TYPES[fmt]).smallest_normal
        codes = np.where(below, toward_zero(x, fmt, saturate), codes)
    if subnormals == "flush":
        codes = flushed(codes, x, fmt)
    if negative_zero == "signed" and o.FNUZ[fmt]:  # a zero result keeps x's sign bit: 0x80
        return np.where((codes == 0) & np.signbit(x), 0x80, codes).astype(np.uint8)
    return positive_zero(codes, fmt) if negative_zero == "positive" else codes


def reference(x, fmt, saturate: bool, **knobs) -> np.ndarray:
    """The reference with ml_dtypes' NaN bytes, saturating (inf to ±max) or not."""
    if saturate:
        return quantize(x, fmt, preset=ML_PRESET, saturate=True, inf="max", **knobs)
    return quantize(x, fmt, preset=ML_PRESET, **knobs)


def near_codes_and_steps(fmt: str) -> np.ndarray:
    """Every float32 within 2 ulps of every code magnitude, of each midpoint between neighbours
    and of the step past max, both signs."""
    magnitudes, _ = _finite_codes(fmt)
    points = np.concatenate([magnitudes, (magnitudes[:-1] + magnitudes[1:]) / 2,
                             [STEP_PAST_MAX[fmt]]]).astype(np.float32)
    around = [points]
    up = down = points
    for _ in range(2):
        up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(0))
        around += [up, down]
    out = np.concatenate(around)
    return np.concatenate([out, -out])


def _bad(expected: np.ndarray, got: np.ndarray, x: np.ndarray) -> str:
    wrong = np.flatnonzero(expected != got)
    if not wrong.size:
        return ""
    i = wrong[0]
    return (f"{wrong.size} differ; first x={float(x.reshape(-1)[i])!r} "
            f"(0x{x.reshape(-1).view(np.uint32)[i]:08X}): oracle 0x{expected.reshape(-1)[i]:02X}, "
            f"reference 0x{got.reshape(-1)[i]:02X}")


INPUT_SETS = {
    "float16": lambda fmt: o.all_float16().astype(np.float32),
    "bfloat16": lambda fmt: o.all_bfloat16().astype(np.float32),
    "random_f32": lambda fmt: o.random_float32(1 << 18),
    "near_codes": near_codes_and_steps,
}
KNOB_SETTINGS = [
    {"rounding": "toward_zero"},
    {"subnormals": "flush"},
    {"negative_zero": "positive"},
    {"rounding": "toward_zero", "subnormals": "flush"},
    {"rounding": "toward_zero", "subnormals": "flush", "negative_zero": "positive"},
    {"subnormals": "flush", "negative_zero": "positive"},
    {"negative_zero": "signed"},
    {"subnormals": "flush", "negative_zero": "signed"},
    {"subnormals": "truncate"},
    {"subnormals": "truncate", "negative_zero": "positive"},
    {"carry": "dropped"},
    {"overflow_test": "unrounded"},
    {"carry": "dropped", "overflow_test": "unrounded"},
]


@pytest.mark.parametrize("inputs", sorted(INPUT_SETS))
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_fault_knobs_match_oracle(fmt, saturate, inputs):
    x = INPUT_SETS[inputs](fmt)
    for knobs in KNOB_SETTINGS:
        got = reference(x, fmt, saturate, **knobs)
        problem = _bad(oracle(x, fmt, saturate, **knobs), got, x)
        assert not problem, f"{fmt} saturate={saturate} {knobs}: {problem}"


def test_oracle_sets_are_not_trivial():
    """The inputs above reach what the knobs change: truncated codes, flushed subnormals of both
    signs, -0, and the band between max and the step past max."""
    for fmt in FORMATS:
        x = np.concatenate([INPUT_SETS[k](fmt) for k in INPUT_SETS])
        plain = reference(x, fmt, False)
        assert (reference(x, fmt, False, rounding="toward_zero") != plain).sum() > 1000
        assert (reference(x, fmt, False, subnormals="flush") != plain).sum() > 100
        assert (reference(x, fmt, False, subnormals="truncate") != plain).sum() > 100
        if not o.FNUZ[fmt]:
            assert (reference(x, fmt, False, negative_zero="positive") != plain).sum() > 100
        band = np.isfinite(x) & (np.abs(x) > o.FMAX[fmt]) & (np.abs(x) < STEP_PAST_MAX[fmt])
        assert band.sum() > 4
        assert (reference(x, fmt, False, carry="dropped") != plain).sum() > 100
        assert (reference(x, fmt, False, overflow_test="unrounded") != plain).sum() > 4


OCP_TWINS = {"e4m3fnuz": ml_dtypes.float8_e4m3fn, "e5m2fnuz": ml_dtypes.float8_e5m2}


def fnuz_through_ocp(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    """fnuz codes as ml_dtypes' codes of the OCP twin for 2x (the same bits, bias one lower),
    saturating by clamping first (exact), then the OCP specials patched: NaN and inf to 0x80,
    -0 to 0."""
    twin = OCP_TWINS[fmt]
    doubled = x.astype(np.float32) * np.float32(2)  # exact but past float32's range (inf, clamped)
    if saturate:
        top = np.float32(ml_dtypes.finfo(twin).max)
        doubled = np.where(np.isnan(doubled), doubled, np.clip(doubled, -top, top))
    codes = doubled.astype(twin).view(np.uint8)
    values = codes.view(twin).astype(np.float32)
    out = np.where(np.isfinite(values), codes, 0x80).astype(np.uint8)
    return np.where(out == 0x80, np.where(np.isfinite(values), 0, 0x80), out).astype(np.uint8)


@pytest.mark.parametrize("inputs", sorted(INPUT_SETS))
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", sorted(OCP_TWINS))
def test_fnuz_through_the_ocp_datapath_matches_ml_dtypes_on_doubled_values(fmt, saturate, inputs):
    x = INPUT_SETS[inputs](fmt)
    got = quantize(x, fmt, saturate=saturate, fnuz_datapath="ocp")
    assert not _bad(fnuz_through_ocp(x, fmt, saturate), got, x), (fmt, saturate)
    differ = quantize(x, fmt, saturate=saturate) != got  # past the twin's max / 2 alone
    assert differ.any() and (np.abs(x[differ]) > float(ml_dtypes.finfo(OCP_TWINS[fmt]).max) / 2).all()
    twin = {"e4m3fnuz": "e4m3fn", "e5m2fnuz": "e5m2"}[fmt]  # an OCP format ignores the knob
    assert (quantize(x, twin, saturate=saturate, fnuz_datapath="ocp") == quantize(x, twin, saturate=saturate)).all()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_op", ["div", "mul_reciprocal"])
def test_fault_knobs_apply_to_the_scaled_quotient(fmt, scale_op):
    """The knobs act on the float32 quotient (numpy's x / s or x * (1/s)), whatever the scale."""
    rng = np.random.default_rng(7)
    x = np.concatenate([rng.normal(0, 2, 1 << 15), rng.normal(0, 1e-3, 1 << 15),
                        rng.normal(0, 1e4, 1 << 12)]).astype(np.float32)
    s = np.float32(0.0123)
    q = x / s if scale_op == "div" else x * (np.float32(1) / s)
    for knobs in KNOB_SETTINGS:
        got = quantize(x, fmt, scale=s, preset=ML_PRESET, scale_op=scale_op, **knobs)
        assert not _bad(oracle(q, fmt, False, **knobs), got, x), (fmt, scale_op, knobs)


@pytest.mark.parametrize("fmt", FORMATS)
def test_toward_zero_after_a_nearest_even_intermediate(fmt):
    """The 16-bit intermediate keeps rounding to nearest even (numpy's float16 cast); only the
    fp8 rounding truncates."""
    x = np.concatenate([o.all_float16().astype(np.float32) * np.float32(1.0009765625),
                        o.random_float32(1 << 16)]).astype(np.float32)
    with np.errstate(over="ignore"):
        via16 = x.astype(np.float16).astype(np.float32)
    got = quantize(x, fmt, preset=ML_PRESET, intermediate="float16", rounding="toward_zero")
    assert not _bad(oracle(via16, fmt, False, rounding="toward_zero"), got, x)


# Hand-derived: (fmt, x, knobs, code). Codes are sign<<7 | exponent<<m | mantissa.
HAND = [
    # e4m3fn toward zero: 1.0625 is the tie 0x38|0x39 (nearest: even 0x38); 1.12 < 1.125 = 0x39
    ("e4m3fn", 1.0625, {"rounding": "toward_zero"}, 0x38),
    ("e4m3fn", 1.12, {"rounding": "toward_zero"}, 0x38),
    ("e4m3fn", 1.125, {"rounding": "toward_zero"}, 0x39),
    ("e4m3fn", 1.1874, {"rounding": "toward_zero"}, 0x39),  # just below the 0x39|0x3A tie, 1.1875
    ("e4m3fn", -1.1874, {"rounding": "toward_zero"}, 0xB9),
    ("e4m3fn", 1.999, {"rounding": "toward_zero"}, 0x3F),  # 1.875; nearest carries to 2.0 (0x40)
    ("e4m3fn", 0.0156, {"rounding": "toward_zero"}, 0x07),  # below 2**-6: the top subnormal 7*2**-9
    ("e4m3fn", 2.0 ** -10, {"rounding": "toward_zero"}, 0x00),  # half the min subnormal
    ("e4m3fn", -(2.0 ** -9) * 1.99, {"rounding": "toward_zero"}, 0x81),  # nearest: 0x82
    ("e4m3fn", -(2.0 ** -10), {"rounding": "toward_zero"}, 0x80),  # -0 keeps its sign
    # above max: [448, 480) truncates to max in both modes; 480 and up overflow
    ("e4m3fn", 470.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7E),
    ("e4m3fn", 479.9, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7E),
    ("e4m3fn", -479.9, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0xFE),
    ("e4m3fn", 480.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7F),
    ("e4m3fn", -480.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0xFF),
    ("e4m3fn", 480.0, {"rounding": "toward_zero"}, 0x7E),
    ("e4m3fn", float("inf"), {"rounding": "toward_zero"}, 0x7E),
    ("e4m3fn", float("-inf"), {"rounding": "toward_zero", "saturate": False, "inf": None}, 0xFF),
    ("e5m2", 61440.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7B),  # nearest: inf
    ("e5m2", 65535.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7B),
    ("e5m2", 65536.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7C),
    ("e5m2", -1e30, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0xFC),
    ("e5m2", 65536.0, {"rounding": "toward_zero"}, 0x7B),
    ("e5m2", 1.24, {"rounding": "toward_zero"}, 0x3C),  # 1.0; nearest 0x3D (1.25)
    ("e4m3fnuz", 255.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7F),
    ("e4m3fnuz", 256.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x80),
    ("e4m3fnuz", -(2.0 ** -11), {"rounding": "toward_zero"}, 0x00),  # fnuz: no -0
    ("e5m2fnuz", 65535.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x7F),
    ("e5m2fnuz", 65536.0, {"rounding": "toward_zero", "saturate": False, "inf": None}, 0x80),
    # NaN is NaN under every fault knob (0x7F|sign by default)
    ("e4m3fn", float("nan"), {"rounding": "toward_zero", "subnormals": "flush",
                              "negative_zero": "positive"}, 0x7F),
    # subnormals flushed, after rounding: 0.0146 < 0.0146484375 (the 0x07|0x08 tie) -> 0x07 -> 0;
    # 0.01466 rounds up to the smallest normal 0x08 and is kept
    ("e4m3fn", 2.0 ** -9, {"subnormals": "flush"}, 0x00),
    ("e4m3fn", -(2.0 ** -9), {"subnormals": "flush"}, 0x80),
    ("e4m3fn", 0.0146, {"subnormals": "flush"}, 0x00),
    ("e4m3fn", 0.01466, {"subnormals": "flush"}, 0x08),
    ("e4m3fn", -0.015625, {"subnormals": "flush"}, 0x88),
    ("e4m3fn", -(2.0 ** -9), {"subnormals": "flush", "negative_zero": "positive"}, 0x00),
    ("e5m2", -3 * 2.0 ** -16, {"subnormals": "flush"}, 0x80),
    ("e5m2", 2.0 ** -14, {"subnormals": "flush"}, 0x04),
    ("e4m3fnuz", -(2.0 ** -10), {"subnormals": "flush"}, 0x00),
    ("e5m2fnuz", 3 * 2.0 ** -17, {"subnormals": "flush"}, 0x00),
    # subnormals truncated, normals rounded: 1.75 quanta -> 1 (nearest: 2); just below the smallest
    # normal -> the top subnormal (nearest: the smallest normal); 0.75 quanta -> 0 of x's sign
    ("e4m3fn", 1.75 * 2.0 ** -9, {"subnormals": "truncate"}, 0x01),
    ("e4m3fn", -1.75 * 2.0 ** -9, {"subnormals": "truncate"}, 0x81),
    ("e4m3fn", 0.0156, {"subnormals": "truncate"}, 0x07),
    ("e4m3fn", 0.75 * 2.0 ** -9, {"subnormals": "truncate"}, 0x00),
    ("e4m3fn", -0.75 * 2.0 ** -9, {"subnormals": "truncate"}, 0x80),
    ("e4m3fn", 2.0 ** -6 * 1.2, {"subnormals": "truncate"}, 0x0A),  # a normal: nearest (1.25), not 1.125
    ("e4m3fn", 1.2, {"subnormals": "truncate"}, 0x3A),
    ("e5m2", 3.5 * 2.0 ** -16, {"subnormals": "truncate"}, 0x03),  # nearest: 0x04, the smallest normal
    ("e4m3fnuz", -0.75 * 2.0 ** -10, {"subnormals": "truncate"}, 0x00),  # fnuz: no -0
    # -0 written as +0: -0.0, and negatives that round to zero; other negatives keep the sign
    ("e4m3fn", -0.0, {"negative_zero": "positive"}, 0x00),
    ("e4m3fn", -(2.0 ** -11), {"negative_zero": "positive"}, 0x00),
    ("e4m3fn", -(2.0 ** -9), {"negative_zero": "positive"}, 0x81),
    ("e4m3fn", -1.0, {"negative_zero": "positive"}, 0xB8),
    ("e5m2", -0.0, {"negative_zero": "positive"}, 0x00),
    ("e5m2", float("-nan"), {"negative_zero": "positive"}, 0xFF),
    ("e4m3fnuz", -0.0, {"negative_zero": "positive"}, 0x00),
    # the sign bit kept on a zero result: in fnuz that is 0x80, its NaN; elsewhere "keep"
    ("e4m3fnuz", -0.0, {"negative_zero": "signed"}, 0x80),
    ("e4m3fnuz", -(2.0 ** -12), {"negative_zero": "signed"}, 0x80),
    ("e4m3fnuz", -(2.0 ** -9), {"negative_zero": "signed"}, 0x82),
    ("e5m2fnuz", -0.0, {"negative_zero": "signed"}, 0x80),
    ("e4m3fn", -0.0, {"negative_zero": "signed"}, 0x80),
    ("e4m3fn", -(2.0 ** -11), {"negative_zero": "signed"}, 0x80),
    # the rounding's carry lost: 126.24 rounds up to 128 (0x70), written as 64 (0x68); 120 is kept;
    # a subnormal that rounds up to the smallest normal is kept; e5m2's 62000 (nearest: inf) -> 32768
    ("e4m3fn", 126.24, {"carry": "dropped"}, 0x68),
    ("e4m3fn", -126.24, {"carry": "dropped"}, 0xE8),
    ("e4m3fn", 120.0, {"carry": "dropped"}, 0x6F),
    ("e4m3fn", 0.0155, {"carry": "dropped"}, 0x08),
    ("e5m2", 62000.0, {"carry": "dropped", "saturate": False, "inf": None}, 0x78),
    # overflow tested before rounding: 450 (nearest: 448) overflows; saturating, it is 448 anyway
    ("e4m3fn", 450.0, {"overflow_test": "unrounded", "saturate": False, "inf": None}, 0x7F),
    ("e4m3fn", 450.0, {"overflow_test": "unrounded"}, 0x7E),
    ("e5m2", -60000.0, {"overflow_test": "unrounded", "saturate": False, "inf": None}, 0xFC),
    ("e4m3fn", 448.0, {"overflow_test": "unrounded", "saturate": False, "inf": None}, 0x7E),
]


@pytest.mark.parametrize("fmt,x,knobs,code", HAND)
def test_hand_derived(fmt, x, knobs, code):
    got = int(quantize(np.array([x], np.float32), fmt, **knobs)[0])
    assert got == code, f"{fmt} {x!r} {knobs}: 0x{got:02X}, expected 0x{code:02X}"
    if "-nan" not in repr(x) and "nan" not in repr(x):  # the oracle agrees where it applies
        sat = knobs.get("saturate", True)
        rest = {k: v for k, v in knobs.items() if k not in ("saturate", "inf")}
        assert int(oracle(np.array([x], np.float32), fmt, sat, **rest)[0]) == code


def test_defaults_and_presets():
    knobs = Fp8Knobs()
    assert (knobs.rounding, knobs.subnormals, knobs.negative_zero) == ("nearest_even", "keep", "keep")
    for preset in PRESETS.values():
        for fmt in preset.formats:
            k = preset.knobs(fmt)
            assert (k.rounding, k.subnormals, k.negative_zero) == ("nearest_even", "keep", "keep"), preset.name


@pytest.mark.parametrize("knob,value", [("rounding", "up"), ("rounding", None), ("rounding", "RZ"),
                                        ("subnormals", "ftz"), ("subnormals", True),
                                        ("negative_zero", "drop"), ("negative_zero", None)])
def test_bad_knob_values(knob, value):
    with pytest.raises(ValueError, match=knob):
        quantize(np.ones(3, np.float32), "e4m3fn", **{knob: value})


def test_round_float32_refuses_other_modes():
    with pytest.raises(ValueError, match="rounding"):
        round_float32(np.ones(1, np.uint32), FLOAT16, "up")


# --- hypotheses --------------------------------------------------------------------------------

class _ReadInstead:
    """A Prepared whose ``numpy(name)`` is the array the kernel read instead, for the names a
    hypothesis replaces (what the diagnosis engine does)."""

    def __init__(self, prepared, inputs: dict):
        self.prepared, self.inputs = prepared, inputs

    def numpy(self, name):
        array = self.prepared.numpy(name)
        return self.inputs[name](array) if name in self.inputs else array


@pytest.fixture(scope="module")
def contracts():
    return base_contracts()


def _fp8_cases(op: str) -> list:
    return [c for c in catalogue(op, "quick") if c.cls == "fp8" and c.p.get("fp8")]


@pytest.mark.parametrize("op", ["reshape_and_cache_flash", "quantize_fp8", "concat_and_cache_mla"])
def test_every_hypothesis_replays_and_the_baseline_matches_none(op, contracts):
    """Each hypothesis's overrides are understood by the spec (no TypeError or ValueError), and
    none reproduces the correct result (each changes something on these cases)."""
    contract = contracts["torch." + op]
    spec = get_spec(op)
    for case in _fp8_cases(op):
        if case.p["values"] != "special" or case.p.get("dtype") == "float16":
            continue  # the float16 specials aim at the source's own range, not at every rounding
        arena = Arena(contract.device, case.seed)
        prepared = spec.build(case, arena, np.random.default_rng(case.seed), contract)
        prepared.before = arena.snapshot()
        exact = spec.expected(prepared, case, contract)
        for h in spec.alternatives(case, contract):
            alt = spec.expected(_ReadInstead(prepared, h.inputs), case, contract, **h.override)
            same = all(np.array_equal(alt[k], exact[k]) for k in exact)
            assert not same or h.cause == "padding_policy", f"{case.id}: {h.text} changes nothing"


def _contract(preset="ocp_satfinite", formats=tuple(o.FORMAT_NAMES), **fields) -> Contract:
    return Contract(op="quantize_fp8", name="t.q", backend="t", fp8_formats=formats,
                    fp8_preset=preset, **fields)


OCP = ("e4m3fn", "e5m2")


def _by_cause(hypotheses) -> dict:
    out = {}
    for h in hypotheses:
        out.setdefault(h.cause, []).append(h)
    return out


def _nan_bytes(found: dict) -> list:
    return [h.override["nan"] for h in found["nan_mishandled"] if "nan" in h.override]


def test_fp8_hypotheses_per_cause():
    p = {"fp8": "e4m3fn", "scale": "0.0123"}
    found = _by_cause(_fp8hypotheses.alternatives(p, _contract()))
    assert set(found) == {"scale_missing", "scale_inverted", "fp8_conversion", "round_toward_zero", "ties_away",
                          "ties_upward", "ties_toward_zero", "subnormals_mishandled", "subnormals_flushed",
                          "subnormals_truncated", "negative_zero_mishandled",
                          "nan_mishandled", "wrong_fp8_format"}
    assert set(found) <= set(CAUSES)
    assert [h.override for h in found["wrong_fp8_format"]] == [
        {"format": "e5m2"}, {"format": "e4m3fnuz"}, {"format": "e5m2fnuz"}]
    # e4m3fn's NaN is S.1111.111 only: declared 0x7F|sign, so 0x7F (sign dropped) and 0xFF
    assert _nan_bytes(found) == ["0x7F", "0xFF"]
    # NaN quotients written as numbers: clamped through fmaxf/fminf (-max or +max), nan_to_num's 0,
    # or the largest finite value with the NaN's sign
    assert [h.override["scale"] for h in found["nan_mishandled"] if "scale" in h.override] == [
        "clamp=448.0;nan=-448.0", "clamp=448.0;nan=448.0", "nan=0.0", "nan_signed=448.0"]
    conversions = [h.override for h in found["fp8_conversion"]]
    assert {"scale_op": "mul_reciprocal"} in conversions
    assert {"intermediate": "float16"} in conversions and {"saturate": False, "inf": None} in conversions
    assert {"preset": "ml_dtypes"} in conversions and {"preset": "ocp_satfinite"} not in conversions


def test_fp8_hypotheses_depend_on_format_scale_and_preset():
    e5m2 = _by_cause(_fp8hypotheses.alternatives({"fp8": "e5m2", "scale": "1.0"}, _contract()))
    assert "scale_missing" not in e5m2 and "scale_inverted" not in e5m2
    assert {"scale_op": "mul_reciprocal"} not in [h.override for h in e5m2["fp8_conversion"]]
    nans = _nan_bytes(e5m2)  # NaN magnitudes 0x7D..0x7F
    assert nans[0] == "0x7F" and "0x7F|sign" not in nans and len(nans) == len(set(nans)) == 8
    assert {"0x7E|sign", "0x7D", "0xFE"} <= set(nans)
    assert {"scale": "clamp=448.0"} in [h.override for h in e5m2["fp8_conversion"]]  # e4m3fn's range
    fnuz = _by_cause(_fp8hypotheses.alternatives({"fp8": "e4m3fnuz", "scale": "head"}, _contract()))
    # one NaN and no -0: only a zero written with its sign bit (0x80, the NaN), and NaN as a number
    assert [h.override for h in fnuz["negative_zero_mishandled"]] == [{"negative_zero": "signed"}]
    assert _nan_bytes(fnuz) == [] and len(fnuz["nan_mishandled"]) == 4
    # an OCP-only preset describes no fnuz format: the only other format is e5m2
    ocp = _by_cause(_fp8hypotheses.alternatives({"fp8": "e4m3fn"}, _contract("cuda_satfinite", OCP)))
    assert [h.override for h in ocp["wrong_fp8_format"]] == [{"format": "e5m2"}]
    assert _nan_bytes(ocp) == ["0x7F|sign", "0xFF"]
    assert _fp8hypotheses.alternatives({"dtype": "float16"}, _contract()) == []


def test_scale_hypotheses():
    p = {"fp8": "e4m3fn", "scale": "head"}
    hs = _fp8hypotheses.scale_hypotheses(p, ("k_scale", "v_scale"), 8)
    # broadcast as scale[j % H], then read as scale[h % T] for tiles of 2 and 4 heads (of 8)
    assert [h.cause for h in hs] == ["scale_collapsed"] + ["scale_misindexed"] * 3 + [
        "scale_missing", "scale_missing", "scale_swapped", "scale_swapped"]
    k, v = (_fp8cases.scale_values("head", 8, t) for t in (0, 1))
    collapsed = hs[0].inputs["k_scale"](k)
    assert collapsed.dtype == np.float32 and np.all(collapsed == k[0]) and not np.all(k == k[0])
    assert hs[1].override == {"scale": "repeated"}
    for tile, h in zip((2, 4), hs[2:4]):
        assert f"scale[h % {tile}]" in h.text and list(h.inputs) == ["k_scale", "v_scale"]
        assert np.array_equal(h.inputs["v_scale"](v), v[[i % tile for i in range(8)]])
    hs = hs[:2] + hs[4:]
    assert np.array_equal(hs[2].inputs["k_scale"](k), np.ones_like(k)) and list(hs[3].inputs) == ["v_scale"]
    assert np.array_equal(hs[4].inputs["k_scale"](k), v)  # V's scale used for K
    assert np.array_equal(hs[5].inputs["v_scale"](v), k)  # K's scale used for V
    with pytest.raises(ValueError):
        hs[5].inputs["v_scale"](np.ones(1, np.float32))
    assert [h.cause for h in _fp8hypotheses.scale_hypotheses(p, ("scale",), 8)] == ["scale_collapsed"] + ["scale_misindexed"] * 3
    assert _fp8hypotheses.scale_hypotheses(p, ("scale",), 1) == []
    assert _fp8hypotheses.scale_hypotheses({"fp8": "e4m3fn", "scale": "1.0"}, ("k_scale", "v_scale"), 8) == []
    tensor = _fp8hypotheses.scale_hypotheses({"fp8": "e4m3fn", "scale": "0.0123"}, ("k_scale", "v_scale"), 8)
    assert [h.cause for h in tensor] == ["scale_missing", "scale_missing", "scale_swapped", "scale_swapped"]


def test_spec_hypotheses(contracts):
    paged = get_spec("reshape_and_cache_flash")
    padded = Case.make("reshape_and_cache_flash", "padding", padding="reserved:0")
    # padding policies are generic hypotheses (oracle.diagnose.generic), not the spec's
    assert paged.alternatives(padded, contracts["torch.reshape_and_cache_flash"]) == []
    mla = get_spec("concat_and_cache_mla")
    contract = contracts["torch.concat_and_cache_mla"]
    scaled = Case.make("concat_and_cache_mla", "fp8", fp8="e4m3fn", scale="0.0123", values="random")
    unscaled = [h.override for h in mla.alternatives(scaled, contract) if h.cause == "part_unscaled"]
    assert unscaled == [{"unscaled": "k_pe"}, {"unscaled": "kv_c"}]
    plain = Case.make("concat_and_cache_mla", "fp8", fp8="e4m3fn", scale="1.0", values="random")
    causes = {h.cause for h in mla.alternatives(plain, contract)}
    assert "part_unscaled" not in causes and "parts_swapped" in causes
    dups = Case.make("concat_and_cache_mla", "duplicates", dups=True)
    assert {h.cause for h in mla.alternatives(dups, contract)} <= {"padding_policy"}


def test_resolve_format_override():
    contract = _contract(formats=OCP, fp8_knobs=(("nan", "0x7F"),))
    assert _fp8cases.resolve(contract, "e4m3fn", {}) == (
        "e4m3fn", None, {"preset": "ocp_satfinite", "nan": "0x7F"}, {})
    # 0x7F is no NaN of e4m3fnuz: the contract's knobs are dropped, the preset kept
    assert _fp8cases.resolve(contract, "e4m3fn", {"format": "e4m3fnuz", "padding": "none"}) == (
        "e4m3fnuz", None, {"preset": "ocp_satfinite"}, {"padding": "none"})
    assert _fp8cases.resolve(contract, "e4m3fn", {"format": "e5m2"})[2] == {
        "preset": "ocp_satfinite", "nan": "0x7F"}
    with pytest.raises(ValueError, match="format"):
        _fp8cases.resolve(contract, None, {"format": "e5m2"})
