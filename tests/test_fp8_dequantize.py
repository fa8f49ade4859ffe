"""dequantize on all 256 codes of every format vs ml_dtypes, bitwise (NaN positions equal), with
and without a scale; a few codes decoded by hand; round trips."""

from __future__ import annotations

import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference.fp8 import dequantize, quantize

ALL_CODES = np.arange(256, dtype=np.uint8)


def assert_bitwise(actual: np.ndarray, expected: np.ndarray, label: str):
    assert actual.dtype == np.float32, actual.dtype
    assert actual.shape == expected.shape
    nan_a, nan_e = np.isnan(actual), np.isnan(expected)
    assert np.array_equal(nan_a, nan_e), f"{label}: NaN positions differ at " \
        f"{np.flatnonzero(nan_a != nan_e).tolist()}"
    a = actual[~nan_a].view(np.uint32)
    e = expected[~nan_e].view(np.uint32)
    bad = np.flatnonzero(a != e)
    assert bad.size == 0, f"{label}: {bad.size} values differ, e.g. " + ", ".join(
        f"0x{x:08X} != 0x{y:08X}" for x, y in zip(a[bad[:5]], e[bad[:5]]))


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_all_codes_vs_ml_dtypes(fmt):
    expected = ALL_CODES.view(o.ML_TYPES[fmt]).astype(np.float32)
    assert_bitwise(dequantize(ALL_CODES, fmt), expected, fmt)
    assert_bitwise(dequantize(ALL_CODES, fmt, scale=1.0), expected, fmt)


SCALES = (2.0, 0.0123457, 3.0, 1 / 448, 1e-3, 7.5, 2.0 ** -30, 1e30)


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
@pytest.mark.parametrize("scale", SCALES)
def test_all_codes_with_scale(fmt, scale):
    """dequantized = fp8 value * float32(scale), one float32 multiplication."""
    values = ALL_CODES.view(o.ML_TYPES[fmt]).astype(np.float32)
    with np.errstate(all="ignore"):
        expected = values * np.float32(scale)
    assert expected.dtype == np.float32
    assert_bitwise(dequantize(ALL_CODES, fmt, scale=scale), expected, f"{fmt} scale={scale}")
    assert_bitwise(dequantize(ALL_CODES, fmt, scale=np.array([scale], np.float32)), expected,
                   f"{fmt} scale=array")


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_per_head_scale(fmt):
    codes = np.broadcast_to(ALL_CODES.reshape(2, 1, 128), (2, 3, 128)).copy()  # [T, H, D]
    scale = np.array([0.5, 3.0, 1e-3], np.float32)
    values = codes.view(o.ML_TYPES[fmt]).astype(np.float32)
    with np.errstate(all="ignore"):
        expected = values * scale[None, :, None]
    assert_bitwise(dequantize(codes, fmt, scale=scale), expected, f"{fmt} per-head")
    assert_bitwise(dequantize(codes.transpose(1, 0, 2).copy(), fmt, scale=scale, head_axis=0),
                   expected.transpose(1, 0, 2), f"{fmt} per-head axis 0")


# Hand-decoded: value = 2**(e - bias) * (1 + m / 2**mbits), subnormals 2**(1 - bias) * m / 2**mbits.
HAND = [
    ("e4m3fn", 0x00, 0.0), ("e4m3fn", 0x80, -0.0), ("e4m3fn", 0x01, 2.0 ** -9),
    ("e4m3fn", 0x07, 7 * 2.0 ** -9), ("e4m3fn", 0x08, 2.0 ** -6), ("e4m3fn", 0x38, 1.0),
    ("e4m3fn", 0x3A, 1.25), ("e4m3fn", 0x7E, 448.0), ("e4m3fn", 0xFE, -448.0),
    ("e4m3fn", 0x78, 256.0), ("e4m3fn", 0x7F, np.nan), ("e4m3fn", 0xFF, np.nan),
    ("e5m2", 0x01, 2.0 ** -16), ("e5m2", 0x03, 3 * 2.0 ** -16), ("e5m2", 0x04, 2.0 ** -14),
    ("e5m2", 0x3C, 1.0), ("e5m2", 0x7B, 57344.0), ("e5m2", 0x7C, np.inf),
    ("e5m2", 0xFC, -np.inf), ("e5m2", 0x7D, np.nan), ("e5m2", 0x7E, np.nan),
    ("e5m2", 0xFF, np.nan), ("e5m2", 0x80, -0.0),
    ("e4m3fnuz", 0x00, 0.0), ("e4m3fnuz", 0x80, np.nan), ("e4m3fnuz", 0x01, 2.0 ** -10),
    ("e4m3fnuz", 0x40, 1.0), ("e4m3fnuz", 0x7F, 240.0), ("e4m3fnuz", 0xFF, -240.0),
    ("e4m3fnuz", 0x08, 2.0 ** -7),
    ("e5m2fnuz", 0x80, np.nan), ("e5m2fnuz", 0x01, 2.0 ** -17), ("e5m2fnuz", 0x40, 1.0),
    ("e5m2fnuz", 0x7F, 57344.0), ("e5m2fnuz", 0xFF, -57344.0), ("e5m2fnuz", 0x04, 2.0 ** -15),
]


@pytest.mark.parametrize("fmt,code,value", HAND)
def test_hand_decoded(fmt, code, value):
    got = dequantize(np.array([code], np.uint8), fmt)
    assert got.dtype == np.float32 and got.shape == (1,)
    if np.isnan(value):
        assert np.isnan(got[0])
    else:
        assert got[0] == value and np.signbit(got[0]) == np.signbit(value)


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_round_trip(fmt):
    """quantize(dequantize(c)) == c for every non-NaN code (±inf codes of e5m2 need inf="inf")."""
    values = dequantize(ALL_CODES, fmt)
    keep = ~np.isnan(values)
    kw = {"inf": "inf"} if fmt == "e5m2" else {}
    np.testing.assert_array_equal(quantize(values[keep], fmt, **kw), ALL_CODES[keep])
    # With a power-of-two scale the round trip is exact too.
    values = dequantize(ALL_CODES, fmt, scale=0.25)
    np.testing.assert_array_equal(quantize(values[keep], fmt, scale=0.25, **kw), ALL_CODES[keep])


def test_shape_and_input_untouched():
    codes = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    before = codes.copy()
    out = dequantize(codes, "e4m3fn", scale=np.array([1.0, 2.0, 4.0], np.float32))
    assert out.shape == (2, 3, 4) and out.dtype == np.float32
    np.testing.assert_array_equal(codes, before)
    # Strided / read-only codes.
    ro = codes.copy()
    ro.flags.writeable = False
    np.testing.assert_array_equal(dequantize(ro[:, ::2, 1::2], "e5m2"),
                                  dequantize(codes[:, ::2, 1::2].copy(), "e5m2"))


def test_dequantize_returns_a_fresh_array():
    """The result must not be the reference's cached decode table (writing into it would
    corrupt every later call)."""
    a = dequantize(ALL_CODES, "e4m3fn")
    a[:] = 0
    b = dequantize(ALL_CODES, "e4m3fn")
    assert b[0x38] == 1.0
