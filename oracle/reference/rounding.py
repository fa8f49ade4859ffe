"""Round float32 bit patterns to a narrower binary float format, by integer arithmetic.

One routine serves every narrow format the reference needs (the four fp8 formats, and float16 and
bfloat16 as double-rounding intermediates): round to nearest, ties to even (or, on request, toward
zero), from the exact float32 value, with overflow decided *after* rounding. Special values (NaN,
inf, overflow) are reported as masks; what they become is the caller's policy, because that is
exactly where real kernels differ.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class BinaryFormat:
    """A sign-exponent-mantissa float format.

    ``max_code`` is the largest finite magnitude code (sign bit clear); codes above it are the
    format's specials (inf/NaN), which :func:`round_float32` never produces.
    """

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    max_code: int

    @property
    def min_exponent(self) -> int:
        """Unbiased exponent of the smallest normal number."""
        return 1 - self.bias


ROUNDINGS = ("nearest_even", "ties_away", "toward_zero", "ties_upward", "ties_toward_zero")


def round_float32(bits: np.ndarray, fmt: BinaryFormat, rounding: str = "nearest_even"):
    """Round float32 values (given as uint32 bit patterns) to ``fmt``.

    ``rounding``: ``"nearest_even"`` (to nearest, ties to even), ``"ties_away"`` (to nearest,
    ties to the larger magnitude), ``"toward_zero"`` (the magnitude truncated to the code at or
    below it) or ``"ties_upward"`` (to nearest, ties toward +inf: ``floor(x + 0.5)`` on the signed
    value, so a positive tie goes away from zero and a negative one toward it) or
    ``"ties_toward_zero"`` (to nearest, ties to the smaller magnitude: round half down, as an
    integer rounding ``(v + half - 1) >> shift`` does).

    Returns ``(sign, code, is_nan, is_inf, overflow)``: ``sign`` is 0/1 (uint32), ``code`` the
    rounded magnitude code (int64; meaningless where a mask is set), ``overflow`` marks finite
    inputs whose rounded magnitude exceeds ``fmt.max_code``. Toward zero, that is a magnitude at
    or above the step past max (the value ``max_code + 1`` would have if it were a number), since
    everything below it truncates to max or less.
    """
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding={rounding!r} is not one of {ROUNDINGS}")
    bits = np.asarray(bits, dtype=np.uint32)
    sign = bits >> np.uint32(31)
    magnitude = bits & np.uint32(0x7FFFFFFF)
    is_nan = magnitude > np.uint32(0x7F800000)
    is_inf = magnitude == np.uint32(0x7F800000)

    biased = (magnitude >> np.uint32(23)).astype(np.int64)
    significand = (magnitude & np.uint32(0x7FFFFF)).astype(np.int64)
    significand |= (biased != 0).astype(np.int64) << 23
    # float32 subnormals share the exponent of the smallest normal, without the implicit bit.
    exponent = np.maximum(biased, 1) - 127
    # The target's quantum at this magnitude is 2**(quantum_exponent - mantissa_bits).
    quantum_exponent = np.maximum(exponent, fmt.min_exponent)
    # Shifts past 25 all round a 24-bit significand to zero; clipping keeps numpy shifts defined.
    shift = np.minimum(23 - fmt.mantissa_bits + (quantum_exponent - exponent), 25)

    kept = significand >> shift
    remainder = significand & ((np.int64(1) << shift) - 1)
    half = np.int64(1) << (shift - 1)
    if rounding == "nearest_even":
        kept += (remainder > half) | ((remainder == half) & ((kept & 1) == 1))
    elif rounding == "ties_away":
        kept += remainder >= half
    elif rounding == "ties_toward_zero":
        kept += remainder > half
    elif rounding == "ties_upward":
        kept += (remainder > half) | ((remainder == half) & (sign == 0))
    # A carry out of the mantissa lands in the exponent field by plain addition.
    code = ((quantum_exponent + fmt.bias - 1) << fmt.mantissa_bits) + kept

    finite = ~(is_nan | is_inf)
    overflow = finite & (code > fmt.max_code)
    return sign, code, is_nan, is_inf, overflow


FLOAT16 = BinaryFormat("float16", 5, 10, 15, 0x7BFF)
BFLOAT16 = BinaryFormat("bfloat16", 8, 7, 127, 0x7F7F)


def round_to_16bit(values: np.ndarray, fmt: BinaryFormat, rounding: str = "nearest_even") -> np.ndarray:
    """Round float32 values to float16 or bfloat16 (IEEE semantics: overflow to inf, NaN kept,
    sign kept; ``rounding`` as :func:`round_float32`'s, toward zero overflowing only past the step
    above max) and widen them back to float32, exactly."""
    sign, code, is_nan, is_inf, overflow = round_float32(values.view(np.uint32), fmt, rounding)
    infinity = ((1 << fmt.exponent_bits) - 1) << fmt.mantissa_bits
    quiet_nan = infinity | (1 << (fmt.mantissa_bits - 1))
    code = np.where(is_inf | overflow, infinity, code)
    code = np.where(is_nan, quiet_nan, code)
    narrow = (code | (sign.astype(np.int64) << 15)).astype(np.uint16)
    if fmt is FLOAT16:
        return narrow.view(np.float16).astype(np.float32)
    return (narrow.astype(np.uint32) << np.uint32(16)).view(np.float32)


FLOAT32_INF_BITS = 0x7F800000


def move_float32_ulps(values: np.ndarray, ulps: int) -> np.ndarray:
    """float32 ``values`` moved ``ulps`` float32 steps in magnitude, sign kept: away from zero for
    ``ulps > 0``, toward zero for ``ulps < 0`` (a new array, same shape).

    A move toward zero stops at zero of the same sign (it never crosses zero, as an approximate
    ``x * rcp(s)`` never does); a move away from zero stops at infinity, exactly as repeated
    ``np.nextafter`` towards ±inf does. Zeros, infinities and NaN are returned unchanged: the
    approximate quotient of those is exact.
    """
    values = np.asarray(values, dtype=np.float32)
    bits = np.ascontiguousarray(values).view(np.uint32).reshape(values.shape)
    sign = bits & np.uint32(0x80000000)
    magnitude = (bits & np.uint32(0x7FFFFFFF)).astype(np.int64)
    movable = (magnitude != 0) & (magnitude < FLOAT32_INF_BITS)
    # Past ±FLOAT32_INF_BITS every move has stopped at zero or inf; clamping keeps int64 exact.
    step = max(-FLOAT32_INF_BITS, min(int(ulps), FLOAT32_INF_BITS))
    moved = np.clip(magnitude + step, 0, FLOAT32_INF_BITS)
    magnitude = np.where(movable, moved, magnitude)
    return (magnitude.astype(np.uint32) | sign).view(np.float32)
