"""quantize vs ml_dtypes, exact code equality, on every float16 and bfloat16 input and on 2**24
random float32 bit patterns plus every float32 within 4 ulps of every fp8 value and tie.

Modes: non-saturating (preset "ml_dtypes" = ml_dtypes' astype, its own NaN bytes) and saturating
(saturate=True, inf="max", nan=ml_dtypes' NaN byte = ml_dtypes after an explicit clamp to ±max).
Also: scaled quotients (div and mul_reciprocal) and the float16 / bfloat16 intermediates, against
numpy / ml_dtypes double rounding.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference.fp8 import quantize

# The reference lets numpy warn about inf / NaN arithmetic in x / scale; that is not under test.
pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FORMATS = o.FORMAT_NAMES
N_RANDOM = 1 << 24


@pytest.fixture(scope="module")
def inputs():
    """Built once per module: name -> array (float16, bfloat16 or float32)."""
    boundary = o.boundary_float32(ulps=4)
    return {
        "float16": o.all_float16(),
        "bfloat16": o.all_bfloat16(),
        "float32_random": o.random_float32(N_RANDOM),
        "float32_boundary": boundary,
    }


@pytest.fixture(scope="module")
def widened(inputs):
    """The inputs as float32 (exact widening by numpy / ml_dtypes), for the oracle."""
    return {name: x.astype(np.float32) for name, x in inputs.items()}


INPUT_SETS = ("float16", "bfloat16", "float32_random", "float32_boundary")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("input_set", INPUT_SETS)
def test_nonsaturating_equals_ml_dtypes(inputs, widened, fmt, input_set):
    x = inputs[input_set]
    expected = o.ml_codes(widened[input_set], fmt)
    o.assert_codes_equal(quantize(x, fmt, preset="ml_dtypes"), expected, x,
                         f"{fmt} ml_dtypes preset on {input_set}")


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("input_set", INPUT_SETS)
def test_saturating_equals_clamped_ml_dtypes(inputs, widened, fmt, input_set):
    x = inputs[input_set]
    expected = o.ml_saturating(widened[input_set], fmt)
    o.assert_codes_equal(quantize(x, fmt, **o.sat_knobs(fmt)), expected, x,
                         f"{fmt} saturating on {input_set}")


def test_input_sets_are_what_they_claim(inputs):
    assert inputs["float32_random"].size + inputs["float32_boundary"].size >= 1 << 24
    assert inputs["float16"].size == inputs["bfloat16"].size == 1 << 16
    assert np.unique(inputs["float16"].view(np.uint16)).size == 1 << 16
    assert np.unique(inputs["bfloat16"].view(np.uint16)).size == 1 << 16
    bits = set(inputs["float32_boundary"].view(np.uint32).tolist())
    # Hand-picked members: e4m3fn's tie above max 464 and its neighbours, e4m3fn's half min
    # subnormal 2**-10, e5m2's tie above max 61440, e4m3fnuz's 248, negative ties, ±inf, NaN.
    for b in (0x43E80000, 0x43E7FFFF, 0x43E80001, 0x43E80004, 0x43E7FFFC, 0x3A800000,
              0x3A800001, 0x3A7FFFFF, 0x47700000, 0x43780000, 0xC3E80000, 0xBA800000,
              0x37000000, 0x36800000, 0x7F800000, 0xFF800000, 0x7FC00000, 0x3F880000,
              0x3F980000, 0x3C700000):
        assert b in bits, hex(b)


def test_ocp_satfinite_is_the_saturating_mode_with_canonical_nan(inputs):
    """The default preset equals the saturating oracle except the e5m2 NaN byte
    (0x7F|sign there, ml_dtypes writes 0x7E|sign)."""
    x = inputs["float32_boundary"]
    for fmt in FORMATS:
        expected = o.ml_saturating(x, fmt)
        if fmt == "e5m2":
            nan = np.isnan(x)
            expected = np.where(nan, np.where(np.signbit(x), 0xFF, 0x7F), expected).astype(np.uint8)
        o.assert_codes_equal(quantize(x, fmt), expected, x, f"{fmt} ocp_satfinite (default)")
        o.assert_codes_equal(quantize(x, fmt, preset="ocp_satfinite"), expected, x,
                             f"{fmt} ocp_satfinite")


# Scaled quotients: the reference must equal ml_dtypes of the float32 quotient it documents.
SCALES = (0.0123457, 0.1, 3.0, 1.0 / 448.0, 7.5, 1e-3, 2.0 ** -20, 1e4)


@pytest.fixture(scope="module")
def scaled_inputs(inputs):
    return np.concatenate([inputs["float32_random"][: 1 << 20], inputs["float32_boundary"]])


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("scale_op", ["div", "mul_reciprocal"])
def test_scaled_equals_ml_dtypes_of_float32_quotient(scaled_inputs, fmt, scale_op):
    x = scaled_inputs
    for s in SCALES:
        s32 = np.float32(s)
        with np.errstate(all="ignore"):
            q = x / s32 if scale_op == "div" else x * (np.float32(1.0) / s32)
        for label, kw, oracle in (("ml_dtypes", {"preset": "ml_dtypes"}, o.ml_codes),
                                  ("saturating", o.sat_knobs(fmt), o.ml_saturating)):
            got = quantize(x, fmt, scale=s, scale_op=scale_op, **kw)
            o.assert_codes_equal(got, oracle(q, fmt), x, f"{fmt} {label} scale={s} {scale_op}")
            # A float32 0-d / (1,) array scale means the same as the Python number.
            got_arr = quantize(x, fmt, scale=np.array([s], np.float32), scale_op=scale_op, **kw)
            o.assert_codes_equal(got_arr, got, x, f"{fmt} {label} scale=array([{s}])")


def _double_rounded(x32: np.ndarray, intermediate: str) -> np.ndarray:
    """x rounded to float16 (numpy) or bfloat16 (ml_dtypes), widened back to float32."""
    narrow = np.float16 if intermediate == "float16" else ml_dtypes.bfloat16
    with np.errstate(all="ignore"):
        return x32.astype(narrow).astype(np.float32)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("intermediate", ["float16", "bfloat16"])
def test_intermediate_equals_double_rounding_oracle(inputs, fmt, intermediate):
    x = np.concatenate([inputs["float32_random"][: 1 << 22], inputs["float32_boundary"]])
    q = _double_rounded(x, intermediate)
    got = quantize(x, fmt, preset="ml_dtypes", intermediate=intermediate)
    o.assert_codes_equal(got, o.ml_codes(q, fmt), x, f"{fmt} ml_dtypes via {intermediate}")
    got = quantize(x, fmt, intermediate=intermediate, **o.sat_knobs(fmt))
    o.assert_codes_equal(got, o.ml_saturating(q, fmt), x, f"{fmt} saturating via {intermediate}")
    # With a scale, the float32 quotient is what gets rounded to the intermediate type.
    s = np.float32(0.0123457)
    with np.errstate(all="ignore"):
        q = _double_rounded(x / s, intermediate)
    got = quantize(x, fmt, scale=s, intermediate=intermediate, **o.sat_knobs(fmt))
    o.assert_codes_equal(got, o.ml_saturating(q, fmt), x,
                         f"{fmt} saturating scale={s} via {intermediate}")


@pytest.mark.parametrize("fmt", FORMATS)
def test_shapes_and_layouts(inputs, fmt):
    """Multi-dimensional, non-contiguous and read-only inputs give the same codes elementwise."""
    x = inputs["float32_random"][: 6 * 8 * 16].reshape(6, 8, 16)
    expected = o.ml_codes(x, fmt)
    o.assert_codes_equal(quantize(x, fmt, preset="ml_dtypes"), expected, x, "3-D")
    xt = x.transpose(2, 0, 1)
    assert not xt.flags.c_contiguous
    o.assert_codes_equal(quantize(xt, fmt, preset="ml_dtypes"), expected.transpose(2, 0, 1),
                         np.ascontiguousarray(xt), "transposed")
    strided = x[:, ::3, 1::2]
    o.assert_codes_equal(quantize(strided, fmt, preset="ml_dtypes"), expected[:, ::3, 1::2],
                         np.ascontiguousarray(strided), "strided")
    ro = x.copy()
    ro.flags.writeable = False
    o.assert_codes_equal(quantize(ro, fmt, preset="ml_dtypes"), expected, x, "read-only")
    empty = quantize(np.zeros((0, 4), np.float32), fmt)
    assert empty.shape == (0, 4) and empty.dtype == np.uint8


@pytest.mark.parametrize("fmt", FORMATS)
def test_zero_dim_input_keeps_its_shape(fmt):
    got = quantize(np.array(1.0, np.float32), fmt)
    assert got.dtype == np.uint8 and got.shape == ()
    assert int(got) == int(o.ml_codes(np.array([1.0], np.float32), fmt)[0])
