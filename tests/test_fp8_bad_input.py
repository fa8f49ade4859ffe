"""Bad arguments to quantize / dequantize: the right exception, naming the argument and the
value; and inputs are never mutated."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

from oracle.reference.fp8 import dequantize, quantize

X = np.array([[1.0, -2.5, 448.0], [np.nan, np.inf, 1e-3]], np.float32)


def m(text: str) -> str:
    return re.escape(text)


# --- x ---------------------------------------------------------------------------------------
def test_float64_refused_with_reason():
    with pytest.raises(TypeError, match=m("x has dtype float64") + ".*float32.*double-rounds"):
        quantize(X.astype(np.float64), "e4m3fn")


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.int8, np.bool_, np.complex64,
                                   np.float8_e4m3fn if hasattr(np, "float8_e4m3fn")
                                   else ml_dtypes.float8_e4m3fn])
def test_non_float_x_refused(dtype):
    x = np.ones((2, 3), dtype=dtype)
    with pytest.raises(TypeError, match=m(f"x has dtype {np.dtype(dtype)}")):
        quantize(x, "e4m3fn")


@pytest.mark.parametrize("x", [[1.0, 2.0], 1.0, np.float32(1.0), (1.0,)])
def test_non_array_x_refused(x):
    with pytest.raises(TypeError, match=m(f"x must be a numpy array, got {type(x).__name__}")):
        quantize(x, "e4m3fn")


# --- fmt / preset / knobs ----------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["e4m3", "float8_e4m3fn", "E4M3FN", "", "e5m2fn"])
def test_unknown_format(fmt):
    with pytest.raises(ValueError, match=m(f"fmt={fmt!r} is not an fp8 format")):
        quantize(X, fmt)
    with pytest.raises(ValueError, match=m(f"fmt={fmt!r} is not an fp8 format")):
        dequantize(np.zeros(2, np.uint8), fmt)


@pytest.mark.parametrize("preset", ["torch", "ocp", "ml-dtypes", "cuda"])
def test_unknown_preset(preset):
    with pytest.raises(ValueError, match=m(f"preset={preset!r} is not a known fp8 preset")):
        quantize(X, "e4m3fn", preset=preset)


def test_preset_not_covering_the_format():
    with pytest.raises(ValueError, match=m("preset 'cuda_satfinite' does not cover format "
                                           "'e4m3fnuz'")):
        quantize(X, "e4m3fnuz", preset="cuda_satfinite")


@pytest.mark.parametrize("knob", ["saturation", "round", "nan_byte", "scale_mode", "clamp"])
def test_unknown_knob(knob):
    with pytest.raises(TypeError, match=m(f"unknown fp8 knob(s): [{knob!r}]")):
        quantize(X, "e4m3fn", **{knob: True})


@pytest.mark.parametrize("value", [1, 0, "yes", None, np.bool_(True)])
def test_saturate_must_be_bool(value):
    with pytest.raises(TypeError, match=m(f"saturate must be a bool, got {value!r}")):
        quantize(X, "e4m3fn", saturate=value)


@pytest.mark.parametrize("value", ["clamp", "saturate", "Max", ""])
def test_bad_inf_policy(value):
    with pytest.raises(ValueError, match=m(f"inf={value!r} is not one of")):
        quantize(X, "e4m3fn", inf=value)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e4m3fnuz", "e5m2fnuz"])
def test_inf_inf_without_infinity(fmt):
    with pytest.raises(ValueError, match=m(f"inf='inf': {fmt} has no infinity")):
        quantize(X, fmt, inf="inf")


@pytest.mark.parametrize("value", ["mul", "divide", "reciprocal", None])
def test_bad_scale_op(value):
    with pytest.raises(ValueError, match=m(f"scale_op={value!r} is not one of")):
        quantize(X, "e4m3fn", scale=2.0, scale_op=value)


@pytest.mark.parametrize("value", ["fp16", "half", "float32", "bf16"])
def test_bad_intermediate(value):
    with pytest.raises(ValueError, match=m(f"intermediate={value!r} is not one of")):
        quantize(X, "e4m3fn", intermediate=value)


# --- nan ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt,spec,byte", [
    ("e4m3fn", "0x7E", "0x7E"),       # 0x7E is 448 in e4m3fn
    ("e4m3fn", "0x00", "0x00"),
    ("e4m3fn", "0xFE|sign", "0xFE"),  # a sign bit and |sign
    ("e5m2", "0x7C", "0x7C"),         # inf, not NaN
    ("e5m2", "0x7B|sign", "0x7B"),    # max
])
def test_bad_nan_byte(fmt, spec, byte):
    with pytest.raises(ValueError, match=m(f"nan={spec!r}: {byte} is not a NaN code of {fmt}")):
        quantize(X, fmt, nan=spec)


@pytest.mark.parametrize("fmt", ["e4m3fnuz", "e5m2fnuz"])
@pytest.mark.parametrize("spec", ["0x7F", "0x7F|sign", "0xFF", "0x80|sign"])
def test_bad_nan_byte_fnuz(fmt, spec):
    with pytest.raises(ValueError, match=m(f"nan={spec!r}: {fmt} has a single NaN, 0x80")):
        quantize(X, fmt, nan=spec)


def test_nan_byte_out_of_range():
    with pytest.raises(ValueError, match=m("nan='0x17F'")):
        quantize(X, "e4m3fn", nan="0x17F")


@pytest.mark.parametrize("spec", ["nan", "0x7F|signed", "0xZZ", "|sign", "0x7F|sign|sign"])
def test_unparsable_nan_spec(spec):
    with pytest.raises(ValueError, match=m(f"nan={spec!r}")):
        quantize(X, "e4m3fn", nan=spec)


def test_negative_nan_byte_message_names_the_given_value():
    with pytest.raises(ValueError, match=m("nan='-0x1'")):
        quantize(X, "e4m3fn", nan="-0x1")


# --- scale -------------------------------------------------------------------------------------
@pytest.mark.parametrize("scale", [0, 0.0, -1, -1.0, float("nan"), float("inf"), -float("inf"),
                                   np.float32(0), np.float32("nan")])
def test_bad_scalar_scale(scale):
    with pytest.raises(ValueError, match=m(f"scale must be finite and > 0, got {scale!r}")):
        quantize(X, "e4m3fn", scale=scale)
    with pytest.raises(ValueError, match=m(f"scale must be finite and > 0, got {scale!r}")):
        dequantize(np.zeros(3, np.uint8), "e4m3fn", scale=scale)


@pytest.mark.parametrize("values", [[0.0], [-1.0], [np.nan], [np.inf], [1.0, 0.0, 2.0],
                                    [1.0, np.nan, 1.0]])
def test_bad_scale_array_values(values):
    scale = np.array(values, np.float32)
    with pytest.raises(ValueError, match=m(f"scale must be finite and > 0, got {scale!r}")):
        quantize(np.ones((2, len(values), 4), np.float32), "e4m3fn", scale=scale)


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.int32])
def test_scale_array_must_be_float32(dtype):
    with pytest.raises(TypeError, match=m(f"scale has dtype {np.dtype(dtype)}; expected one of: "
                                          "float32")):
        quantize(X, "e4m3fn", scale=np.array([2.0], dtype))
    with pytest.raises(TypeError, match=m(f"scale has dtype {np.dtype(dtype)}")):
        dequantize(np.zeros(3, np.uint8), "e4m3fn", scale=np.array([2.0], dtype))


@pytest.mark.parametrize("scale", ["2.0", [2.0], True, np.bool_(True), None, 2 + 0j])
def test_scale_of_wrong_type(scale):
    with pytest.raises(TypeError, match=m(f"scale must be a number or a float32 array, "
                                          f"got {scale!r}")):
        quantize(X, "e4m3fn", scale=scale)


def test_scale_empty_or_2d():
    with pytest.raises(ValueError, match=m("scale must be finite and > 0, got array([]")):
        quantize(X, "e4m3fn", scale=np.array([], np.float32))
    with pytest.raises(ValueError, match=m("scale must have shape (), (1,) or (H,), got (2, 1)")):
        quantize(X, "e4m3fn", scale=np.ones((2, 1), np.float32))


def test_per_head_scale_wrong_length():
    x = np.ones((4, 2, 8), np.float32)  # [T, H=2, D]
    with pytest.raises(ValueError, match=m("per-head scale has shape (3,) but x has shape "
                                           "(4, 2, 8) (head axis -2)")):
        quantize(x, "e4m3fn", scale=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=m("per-head scale has shape (8,) but x has shape "
                                           "(4, 2, 8) (head axis 0)")):
        quantize(x, "e4m3fn", scale=np.ones(8, np.float32), head_axis=0)
    with pytest.raises(ValueError, match=m("per-head scale has shape (3,)")):
        dequantize(np.ones((4, 2, 8), np.uint8), "e4m3fn", scale=np.ones(3, np.float32))
    with pytest.raises(ValueError, match=m("per-head scale has shape (2,) but x has shape ()")):
        quantize(np.array(1.0, np.float32), "e4m3fn", scale=np.ones(2, np.float32))


@pytest.mark.parametrize("shape,head_axis", [((3, 2, 4), 3), ((8,), -2), ((3, 2, 4), -4)])
def test_out_of_range_head_axis(shape, head_axis):
    x = np.ones(shape, np.float32)
    n = shape[head_axis % len(shape)]
    with pytest.raises((ValueError, np.exceptions.AxisError), match="axis"):
        quantize(x, "e4m3fn", scale=np.ones(n, np.float32), head_axis=head_axis)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")
@pytest.mark.parametrize("scale", [1e-50, 1e40])
def test_scale_that_is_not_a_positive_finite_float32(scale):
    with pytest.raises(ValueError, match=m(f"scale must be finite and > 0, got {scale!r}")):
        quantize(np.ones(2, np.float32), "e4m3fn", scale=scale)


# --- dequantize codes ----------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint16, np.float32, np.int64])
def test_dequantize_needs_uint8(dtype):
    with pytest.raises(TypeError, match=m(f"codes has dtype {np.dtype(dtype)}; expected one of: "
                                          "uint8")):
        dequantize(np.zeros(4, dtype), "e4m3fn")


def test_dequantize_refuses_fp8_typed_codes():
    codes = np.zeros(4, np.uint8).view(ml_dtypes.float8_e4m3fn)
    with pytest.raises(TypeError, match=m("codes has dtype float8_e4m3fn")):
        dequantize(codes, "e4m3fn")


@pytest.mark.parametrize("codes", [[1, 2], 5, bytes([1, 2])])
def test_dequantize_needs_an_array(codes):
    with pytest.raises(TypeError, match=m("codes must be a numpy array")):
        dequantize(codes, "e4m3fn")


# --- no mutation -------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("kw", [{}, {"scale": 0.37}, {"scale_op": "mul_reciprocal", "scale": 3.0},
                                {"intermediate": "bfloat16", "scale": 0.1},
                                {"preset": "ml_dtypes"}])
def test_inputs_not_mutated(dtype, kw):
    x = np.random.default_rng(0).standard_normal((3, 4, 5)).astype(dtype) * dtype(100)
    x[0, 0, :3] = [np.nan, np.inf, -np.inf]
    before = x.copy()
    scale = np.array([0.5, 2.0, 7.0, 0.1], np.float32)
    scale_before = scale.copy()
    quantize(x, "e4m3fn", **kw)
    codes = quantize(x, "e5m2", scale=scale)
    codes_before = codes.copy()
    dequantize(codes, "e5m2", scale=scale)
    np.testing.assert_array_equal(x.view(np.uint8), before.view(np.uint8))
    np.testing.assert_array_equal(scale, scale_before)
    np.testing.assert_array_equal(codes, codes_before)


def test_read_only_inputs_accepted():
    x = X.copy()
    x.flags.writeable = False
    scale = np.array([1.0, 2.0, 3.0], np.float32)
    scale.flags.writeable = False
    codes = quantize(x, "e4m3fn", scale=scale, head_axis=-1)
    codes.flags.writeable = False
    dequantize(codes, "e4m3fn", scale=scale, head_axis=-1)


def test_rejected_call_returns_nothing_partial():
    """Every check runs before computing: the bad knob is reported even with a bad x too."""
    with pytest.raises((TypeError, ValueError)):
        quantize(X.astype(np.float64), "e4m3fn", saturate="no")
