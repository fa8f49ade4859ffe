"""An MXFP8 oracle independent of :mod:`oracle.reference`: one block at a time in plain Python,
exponents read from float32 bit fields, elements cast by ml_dtypes after an explicit clamp.

Nothing here imports the reference; tests/test_mx.py compares the reference with it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

ML_TYPES = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FMAX = {name: float(ml_dtypes.finfo(t).max) for name, t in ML_TYPES.items()}  # 448, 57344
NAN_CODE = 0x7F  # the saturating OCP conversion's NaN byte (sign copied), both formats


def bits(value: float) -> int:
    return int(np.array([value], dtype=np.float32).view(np.uint32)[0])


def floor_log2(value: float) -> int:
    """floor(log2(v)) of a positive finite float32 from its bit fields."""
    b = bits(value)
    field = (b >> 23) & 0xFF
    if field == 0:  # subnormal: m * 2^-149, the highest set bit of m
        return (b & 0x7FFFFF).bit_length() - 1 - 149
    return field - 127


def ceil_log2(value: float) -> int:
    """ceil(log2(v)) of a positive finite float32: floor, plus one unless v is a power of two."""
    b = bits(value)
    field, mantissa = (b >> 23) & 0xFF, b & 0x7FFFFF
    power_of_two = mantissa == 0 if field else (mantissa & (mantissa - 1)) == 0
    return floor_log2(value) + (0 if power_of_two else 1)


def block_exponent(block: list, fmt: str, rule: str, zero_block: str = "min", offset: int = 0,
                   clamp_first: bool = False) -> int:
    emax = floor_log2(FMAX[fmt])
    finite = [abs(v) for v in block if math.isfinite(v)]
    amax = max(finite, default=0.0)
    if amax == 0:
        exponent = -127 if zero_block == "min" else 0
    elif rule == "floor":
        exponent = floor_log2(amax) - emax
    elif rule == "ceil_log2":  # the binade above amax's unless amax is a power of two
        exponent = ceil_log2(amax) - emax
    elif rule == "round":  # the nearest binade, in float64 logarithms
        exponent = int(round(math.log2(amax))) - emax
    elif rule == "floor_log2f":  # log2 within half a float32 step below the next integer rounds up to it
        low = floor_log2(amax)
        top = np.float32(low + 1)
        step = float(top) - float(np.nextafter(top, np.float32(-np.inf)))
        exponent = (low + 1 if float(top) - math.log2(amax) < step / 2 else low) - emax
    else:
        exponent = ceil_log2(float(np.float32(np.float32(amax) / np.float32(FMAX[fmt]))))
    if amax != 0:
        exponent += offset
        if clamp_first:  # floor(log2(amax)) clamped, emax subtracted after: may leave [-127, 127]
            return max(-127, min(127, exponent + emax)) - emax
    return max(-127, min(127, exponent))


def element_code(value: float, fmt: str, saturate: bool) -> int:
    if math.isnan(value):
        return NAN_CODE | (0x80 if math.copysign(1.0, value) < 0 else 0)
    if saturate:
        value = max(-FMAX[fmt], min(FMAX[fmt], value))
    with np.errstate(all="ignore"):
        return int(np.array([value], dtype=np.float32).astype(ML_TYPES[fmt]).view(np.uint8)[0])


def quantize_row(row: list, fmt: str, rule: str, *, block: int = 32, zero_block: str = "min",
                 nonfinite: str = "nan_scale", saturate: bool = True, min_scale_factor: str = "exact",
                 nan_sign: bool = True, exponent_offset: int = 0, ahead: list = (),
                 clamp_first: bool = False) -> tuple[list, list]:
    """(element codes, E8M0 scale codes) of one row (float32 values), block by block.
    ``nan_sign=False``: NaN elements lose their sign (the CUDA satfinite conversion). ``ahead``:
    values the last block's scale is computed over besides its own elements (a load past the
    row's end); its codes are its own elements' alone."""
    codes, scales = [], []
    for start in range(0, len(row), block):
        part = row[start:start + block]
        seen = part + list(ahead) if start + block >= len(row) else part
        exponent = block_exponent(seen, fmt, rule, zero_block, exponent_offset, clamp_first)
        nonfinite_block = not all(math.isfinite(v) for v in seen)
        inf_block = nonfinite == "inf_saturates" and any(math.isinf(v) for v in seen)
        if inf_block:
            exponent = 127
        nan_scale = nonfinite in ("nan_scale", "nan_block") and nonfinite_block
        scales.append(0xFF if nan_scale else (exponent + 127) % 256)  # an 8-bit store wraps
        multiplier = 2.0 ** -exponent  # float32(2**134) below: inf
        if min_scale_factor == "one" and exponent == -127:
            multiplier = 1.0
        for v in part:
            with np.errstate(over="ignore", invalid="ignore"):  # 2**134 is inf in float32; 0 * inf NaN
                quotient = float(np.float32(np.float32(v) * np.float32(multiplier)))
            if math.isnan(quotient) and math.isfinite(v):  # 0 * inf: a GPU float unit's NaN, positive
                quotient = math.nan
            if inf_block:  # the multiplier is 0: finite elements +-0, inf and NaN a positive NaN
                quotient = math.copysign(0.0, v) if math.isfinite(v) else math.nan
            if nonfinite == "nan_block" and nonfinite_block:
                quotient = math.nan
            if not nan_sign and math.isnan(quotient):
                quotient = math.nan
            codes.append(element_code(quotient, fmt, saturate))
    return codes, scales
