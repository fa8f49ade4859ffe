"""Hypotheses about the values a kernel moves: float sources whose NaN bit patterns are not moved
bit for bit, that are added to zero (-0 lost too), narrowed to float16 or bfloat16 and back, or
whose subnormals are flushed to zero on the way through (float arithmetic where the kernel should
move bits).

Derived from the case's views alone, as the hypotheses of :mod:`.generic` are, which lists these
among its own.
"""

from __future__ import annotations

import numpy as np

from ..buffers import NUMPY_DTYPES
from .hypothesis import Hypothesis, by_role


# (bits dtype, exponent mask, quiet bit) of the float formats a copy moves
_FLOAT_BITS = {np.dtype(np.float32): (np.uint32, 0x7F800000, 0x00400000),
               np.dtype(np.float16): (np.uint16, 0x7C00, 0x0200),
               NUMPY_DTYPES["bfloat16"]: (np.uint16, 0x7F80, 0x0040)}


def nan_bits_hypotheses(case, views: dict) -> list[Hypothesis]:
    """A copy that does not move NaN bit patterns bit for bit (a round trip through float32, a
    float unit's canonical NaN): every NaN of the sources quieted (sign and payload kept), made the
    canonical positive quiet NaN, that NaN with the input's sign, every bit but the sign set (the
    NaN CUDA's conversions and float units write), or all bits set."""
    if case.p.get("fp8") or case.p.get("block"):
        return []
    sources = [v for v in by_role(views, "source") if v.dtype in ("float32", "float16", "bfloat16")]
    if not sources:
        return []
    how = {"quieted": "quieted (the quiet bit set, sign and payload kept)",
           "canonical": "written as the canonical quiet NaN, positive",
           "canonical_signed": "written as the canonical quiet NaN with the input's sign",
           "cuda": "written with every bit but the sign set (0x7FFF, 0x7FFFFFFF: CUDA's "
                   "__float2half_rn, __float2bfloat16_rn and float units' NaN)",
           "all_ones": "written with every bit set (torch's vectorized float32-to-bfloat16 NaN)"}
    return [Hypothesis("nan_bits_changed", f"NaN inputs {text}: not copied bit for bit (a round trip "
                       "through float32 or a float unit)",
                       inputs={v.name: (lambda a, mode=mode: _nan_bits(a, mode)) for v in sources})
            for mode, text in how.items()]


def _nan_bits(array: np.ndarray, mode: str) -> np.ndarray:
    kind, exponent, quiet = _FLOAT_BITS[array.dtype]
    bits = np.ascontiguousarray(array).view(kind)
    sign = 1 << (8 * bits.itemsize - 1)
    mantissa = (sign - 1) & ~exponent
    nan = ((bits & kind(exponent)) == kind(exponent)) & ((bits & kind(mantissa)) != 0)
    canonical = kind(exponent | quiet)
    out = {"quieted": bits | kind(quiet), "canonical": np.full_like(bits, canonical),
           "canonical_signed": (bits & kind(sign)) | canonical, "cuda": np.full_like(bits, sign - 1),
           "all_ones": np.full_like(bits, (sign << 1) - 1)}[mode]
    return np.where(nan, out, bits).astype(kind).view(array.dtype).reshape(array.shape)


def arithmetic_copy_hypotheses(case, views: dict) -> list[Hypothesis]:
    """A copy done with float arithmetic, ``0 + x`` (an ``index_add_`` into rows cleared first, a
    masked sum or blend): every -0 of the sources written as +0, and every NaN quieted, made the
    canonical quiet NaN, or given every bit set (a float16 or bfloat16 sum done in float32 and
    converted back). Cases of special values or raw bits, and random ones (which may draw -0)."""
    if case.p.get("fp8") or case.p.get("block"):
        return []
    sources = [v for v in by_role(views, "source") if v.dtype in ("float32", "float16", "bfloat16")]
    if not sources:
        return []
    how = {"quieted": "quieted", "canonical": "made the canonical quiet NaN", "all_ones": "given every bit set"}
    return [Hypothesis("copied_through_arithmetic", f"the rows copied by float arithmetic (0 + x: an index_add_ "
                       f"into cleared rows, a masked sum): -0 written as +0 and NaN inputs {text}",
                       inputs={v.name: (lambda a, mode=mode: _plus_zero(a, mode)) for v in sources})
            for mode, text in how.items()]


def _plus_zero(array: np.ndarray, nan: str) -> np.ndarray:
    kind, _, _ = _FLOAT_BITS[array.dtype]
    bits = np.ascontiguousarray(array).view(kind)
    negative_zero = kind(1 << (8 * bits.itemsize - 1))
    with_nans = np.ascontiguousarray(_nan_bits(array, nan)).view(kind)
    out = np.where(bits == negative_zero, kind(0), with_nans)
    return out.astype(kind).view(array.dtype).reshape(array.shape)


# How a conversion to a narrower float writes NaN, where numpy's (sign and the payload's top bits
# kept) is not the kernel's: x86's vcvtps2ph (the quiet bit set too), torch's scalar float16
# conversion and CUDA's cvt (the canonical quiet NaN, with or without the sign), torch's
# vectorized bfloat16 one (every bit set)
NARROWED_NANS = {"quieted": "quieted (sign and payload kept, the quiet bit set)",
                 "canonical_signed": "the canonical quiet NaN with its sign",
                 "canonical": "the canonical quiet NaN, positive", "all_ones": "every bit set"}


def narrowed_source_hypotheses(case, views: dict) -> list[Hypothesis]:
    """The float sources converted to float16 or bfloat16 and back before use (a float16 path
    taken for bfloat16 data, a bfloat16 one for float32): what a round trip through that type
    keeps, its overflow to inf included; for a case of special values (NaN among them), also with
    the NaNs written as each conversion of :data:`NARROWED_NANS` writes them."""
    out = []
    nan_modes = (None,) if case.p.get("values", "random") == "random" else (None, *NARROWED_NANS)
    for through in ("float16", "bfloat16"):
        sources = [v for v in by_role(views, "source") if v.dtype in ("float32", "float16", "bfloat16")
                   and v.dtype != through]
        if not sources:
            continue
        names = " and ".join(f"{v.name} ({v.dtype})" for v in sources)
        for nan in nan_modes:
            how = "" if nan is None else f", NaN written as {NARROWED_NANS[nan]}"
            out.append(Hypothesis("source_narrowed", f"{names} converted to {through} and back before use{how}",
                                  inputs={v.name: (lambda a, t=through, m=nan: _round_trip(a, t, m))
                                          for v in sources}))
    return out


def flushed_source_hypotheses(case, views: dict) -> list[Hypothesis]:
    """The float sources' subnormals flushed to zero of their sign (float arithmetic under
    flush-to-zero on a path that should move bits: ``x * 1.0f`` built with fast math, a
    denormals-are-zero load), for cases of special values or raw bits, which hold subnormals."""
    if case.p.get("values", "random") == "random":
        return []
    sources = [v for v in by_role(views, "source") if v.dtype in ("float32", "float16", "bfloat16")]
    if not sources:
        return []
    names = " and ".join(f"{v.name} ({v.dtype})" for v in sources)
    return [Hypothesis("source_narrowed", f"{names}: subnormal values flushed to zero of their sign (float "
                       "arithmetic under flush-to-zero, or a denormals-are-zero load, on the way through)",
                       inputs={v.name: _flushed for v in sources})]


def _flushed(array: np.ndarray) -> np.ndarray:
    kind, exponent, _ = _FLOAT_BITS[array.dtype]
    bits = np.ascontiguousarray(array).view(kind)
    sign = kind(1 << (8 * bits.itemsize - 1))
    subnormal = ((bits & kind(exponent)) == 0) & ((bits & ~sign) != 0)
    return np.where(subnormal, bits & sign, bits).astype(kind).view(array.dtype).reshape(array.shape)


def _round_trip(array: np.ndarray, through: str, nan: str | None = None) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        narrow = array.astype(NUMPY_DTYPES[through])
        if nan == "quieted":
            narrow = _quieted_nans(array, narrow)
        elif nan is not None:
            narrow = _nan_bits(narrow, nan)
        return narrow.astype(array.dtype)


def _quieted_nans(array: np.ndarray, narrow: np.ndarray) -> np.ndarray:
    """``narrow`` with each NaN of ``array`` as a float unit narrows it: the sign, the quiet bit and
    the payload's top bits (numpy instead sets the lowest bit where those are all 0)."""
    kind, exponent, quiet = _FLOAT_BITS[narrow.dtype]
    mantissa_bits = quiet.bit_length()  # the quiet bit is the mantissa's top one
    wide = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    made = (((wide >> 16) & 0x8000) | exponent | quiet | ((wide >> (23 - mantissa_bits)) & ((1 << mantissa_bits) - 1)))
    bits = np.where(np.isnan(array), made.astype(kind), np.ascontiguousarray(narrow).view(kind))
    return bits.view(narrow.dtype).reshape(narrow.shape)
