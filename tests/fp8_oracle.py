"""An fp8 oracle independent of :mod:`oracle.reference`: ml_dtypes casts, explicit clamps, and
input generators for the fp8 tests.

Nothing here imports the reference; the tests compare the reference's codes with these.

- ``ml_codes``: ml_dtypes' ``astype`` of float32 values, as uint8 codes (the non-saturating
  behaviour: overflow and inf to NaN for e4m3fn, inf for e5m2, 0x80 for fnuz).
- ``ml_saturating``: ml_dtypes after an explicit clamp to ±max (NaN kept): the saturating
  behaviour with ml_dtypes' own NaN bytes.
- ``sat_from_nonsat``: the same, derived from ``ml_codes`` without a second cast: a clamp only
  changes inputs with |x| > max (finite or inf), and those become ml_dtypes(±max).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FORMAT_NAMES = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
ML_TYPES = {
    "e4m3fn": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "e4m3fnuz": ml_dtypes.float8_e4m3fnuz,
    "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
}
FNUZ = {"e4m3fn": False, "e5m2": False, "e4m3fnuz": True, "e5m2fnuz": True}
# The largest finite value of each format, as float32 (ml_dtypes' finfo, not the reference).
FMAX = {name: np.float32(ml_dtypes.finfo(t).max) for name, t in ML_TYPES.items()}
FMAX_BITS = {name: int(np.array(m, np.float32).view(np.uint32)) for name, m in FMAX.items()}
F32_INF_BITS = 0x7F800000


def ml_codes(x: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' fp8 codes of float32 ``x`` (uint8, same shape)."""
    assert x.dtype == np.float32, x.dtype
    with np.errstate(all="ignore"):
        return x.astype(ML_TYPES[fmt]).view(np.uint8)


def ml_values(codes: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes' float32 value of each uint8 code."""
    return codes.view(ML_TYPES[fmt]).astype(np.float32)


def clamp(x: np.ndarray, fmt: str) -> np.ndarray:
    """x clamped to [-max, max] in float32; NaN stays NaN (with its sign)."""
    m = FMAX[fmt]
    with np.errstate(invalid="ignore"):
        big = np.abs(x) > m  # False for NaN
    return np.where(big, np.copysign(m, x), x).astype(np.float32)


def ml_saturating(x: np.ndarray, fmt: str) -> np.ndarray:
    """ml_dtypes after an explicit clamp to ±max: the saturating oracle."""
    return ml_codes(clamp(x, fmt), fmt)


def ml_max_codes(fmt: str) -> tuple[int, int]:
    """ml_dtypes' codes of +max and -max."""
    c = ml_codes(np.array([FMAX[fmt], -FMAX[fmt]], np.float32), fmt)
    return int(c[0]), int(c[1])


def ml_nan_bytes(fmt: str) -> tuple[int, int]:
    """ml_dtypes' codes of +NaN and -NaN."""
    nan = np.float32(np.nan)
    c = ml_codes(np.array([nan, -nan], np.float32), fmt)
    return int(c[0]), int(c[1])


def ml_nan_spec(fmt: str) -> str:
    """ml_dtypes' NaN byte spelled as the reference's ``nan`` knob, e.g. '0x7E|sign'."""
    pos, neg = ml_nan_bytes(fmt)
    if pos == neg:
        return f"0x{pos:02X}"
    assert neg == pos | 0x80, (fmt, pos, neg)
    return f"0x{pos:02X}|sign"


def sat_knobs(fmt: str) -> dict:
    """Knobs that make the reference saturate like ``ml_saturating``."""
    return {"saturate": True, "inf": "max", "nan": ml_nan_spec(fmt)}


def sat_from_nonsat(bits: np.ndarray, nonsat: np.ndarray, fmt: str) -> np.ndarray:
    """``ml_saturating`` of the float32 values with bit patterns ``bits``, given their
    non-saturating ml_dtypes codes ``nonsat``: only |x| > max (finite or inf) changes."""
    pos, neg = ml_max_codes(fmt)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    over = (magnitude > np.uint32(FMAX_BITS[fmt])) & (magnitude <= np.uint32(F32_INF_BITS))
    return np.where(over, np.where(bits >> np.uint32(31) != 0, np.uint8(neg), np.uint8(pos)), nonsat)


# ---------------------------------------------------------------------------------------------
# Inputs


def all_float16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)


def all_bfloat16() -> np.ndarray:
    return np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(ml_dtypes.bfloat16)


def random_float32(n: int, seed: int = 20261122) -> np.ndarray:
    """``n`` float32 values with uniformly random bit patterns (NaNs, infs and subnormals
    included), from a fixed seed."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 32, size=n, dtype=np.uint32).view(np.float32)


def representable_magnitudes(fmt: str) -> np.ndarray:
    """Every finite non-negative value of ``fmt``, ascending, float64 (from ml_dtypes)."""
    values = np.arange(256, dtype=np.uint8).view(ML_TYPES[fmt]).astype(np.float64)
    return np.unique(values[np.isfinite(values) & (values >= 0)])


def boundary_magnitudes(fmt: str) -> np.ndarray:
    """float32 magnitudes where the fp8 rounding of ``fmt`` changes or ties: every representable
    value, every midpoint between adjacent ones (the ties, half-min-subnormal included), and
    the tie above max (max + half an ulp). All are exact in float32."""
    values = representable_magnitudes(fmt)
    midpoints = (values[1:] + values[:-1]) / 2
    top_ulp = values[-1] - values[-2]
    tie_above_max = values[-1] + top_ulp / 2
    above = values[-1] + top_ulp  # the next value the format would have
    out = np.concatenate([values, midpoints, [tie_above_max, above]])
    assert np.all(out.astype(np.float32).astype(np.float64) == out), fmt
    return out.astype(np.float32)


def near(magnitudes: np.ndarray, ulps: int = 4) -> np.ndarray:
    """Every float32 within ``ulps`` ulps of each (non-negative) magnitude, both signs."""
    bits = magnitudes.astype(np.float32).view(np.uint32).astype(np.int64)
    around = (bits[:, None] + np.arange(-ulps, ulps + 1)[None, :]).reshape(-1)
    around = np.unique(around[(around >= 0) & (around <= F32_INF_BITS)]).astype(np.uint32)
    return np.concatenate([around, around | np.uint32(0x80000000)]).view(np.float32)


def boundary_float32(ulps: int = 4) -> np.ndarray:
    """Every float32 within ``ulps`` of every fp8 value, tie and tie-above-max of all four
    formats, plus ±0, ±inf and a few NaNs (quiet, signalling, negative, payloads)."""
    parts = [near(boundary_magnitudes(fmt), ulps) for fmt in FORMAT_NAMES]
    specials = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00000,
                         0x7F800001, 0xFF800001, 0x7FFFFFFF, 0xFFFFFFFF, 0x7FA5A5A5, 0x00000001,
                         0x80000001, 0x7F7FFFFF, 0xFF7FFFFF], dtype=np.uint32).view(np.float32)
    return np.unique(np.concatenate(parts + [specials]).view(np.uint32)).view(np.float32)


# ---------------------------------------------------------------------------------------------
# Reporting


def mismatches(actual: np.ndarray, expected: np.ndarray, inputs: np.ndarray, limit: int = 8):
    """Up to ``limit`` (input bits, actual, expected) hex triples where the codes differ, and
    the total count."""
    actual = np.asarray(actual).reshape(-1)
    expected = np.asarray(expected).reshape(-1)
    bad = np.flatnonzero(actual != expected)
    width = inputs.dtype.itemsize
    view = inputs.reshape(-1).view({2: np.uint16, 4: np.uint32}[width])
    rows = [(f"0x{int(view[i]):0{2 * width}X}", f"0x{int(actual[i]):02X}",
             f"0x{int(expected[i]):02X}") for i in bad[:limit]]
    return rows, int(bad.size)


def assert_codes_equal(actual: np.ndarray, expected: np.ndarray, inputs: np.ndarray, label: str):
    assert actual.dtype == np.uint8, actual.dtype
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    if not np.array_equal(actual, expected):
        rows, count = mismatches(actual, expected, inputs)
        raise AssertionError(f"{label}: {count} of {actual.size} codes differ; "
                             f"(input bits, reference, oracle): {rows}")
