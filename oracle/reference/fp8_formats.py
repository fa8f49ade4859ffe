"""The fp8 formats and the knobs of a conversion: the vocabulary the reference's fp8 code and its
presets share.

:data:`FORMATS` describes each fp8 format (bits, bias, largest finite code, infinity, fnuz);
:class:`Fp8Knobs` says how an implementation converts where implementations differ, and
:class:`NaNEncoding` which byte it writes for NaN. :mod:`oracle.reference.fp8` converts with them
and :mod:`oracle.reference.presets` names the knobs of real implementations; both import this
module, which imports neither. Every name here is also importable from
:mod:`oracle.reference.fp8`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np

from . import _validate as v
from .rounding import BFLOAT16, FLOAT16, ROUNDINGS, BinaryFormat


@dataclass(frozen=True)
class Fp8Format:
    name: str
    binary: BinaryFormat
    inf_code: int | None  # magnitude code of infinity, None where the format has none
    fnuz: bool  # "finite, no negative zero": 0x80 is the one NaN, -0 becomes +0
    ml_dtype: type  # the ml_dtypes scalar type, used only to view codes as values

    @property
    def max_code(self) -> int:
        return self.binary.max_code


FORMATS = {
    "e4m3fn": Fp8Format("e4m3fn", BinaryFormat("e4m3fn", 4, 3, 7, 0x7E), None, False,
                        ml_dtypes.float8_e4m3fn),
    "e5m2": Fp8Format("e5m2", BinaryFormat("e5m2", 5, 2, 15, 0x7B), 0x7C, False,
                      ml_dtypes.float8_e5m2),
    "e4m3fnuz": Fp8Format("e4m3fnuz", BinaryFormat("e4m3fnuz", 4, 3, 8, 0x7F), None, True,
                          ml_dtypes.float8_e4m3fnuz),
    "e5m2fnuz": Fp8Format("e5m2fnuz", BinaryFormat("e5m2fnuz", 5, 2, 16, 0x7F), None, True,
                          ml_dtypes.float8_e5m2fnuz),
}

SCALE_OPS = ("div", "mul_reciprocal")
INTERMEDIATES = {None: None, "float16": FLOAT16, "bfloat16": BFLOAT16}
# (format, rounding) of each intermediate: the "_rz" ones are rounded toward zero (cvt.rz, or the
# float32 bits shifted right: a bfloat16 view that drops the low half)
INTERMEDIATE_ROUNDING = {"float16_rz": (FLOAT16, "toward_zero"), "bfloat16_rz": (BFLOAT16, "toward_zero")}
INTERMEDIATES.update({name: fmt for name, (fmt, _) in INTERMEDIATE_ROUNDING.items()})
INF_POLICIES = ("max", "nan", "inf")
SUBNORMALS = ("keep", "flush", "truncate")
NEGATIVE_ZEROS = ("keep", "positive", "signed")
OVERFLOW_TESTS = ("rounded", "unrounded")
CARRIES = ("kept", "dropped")
FNUZ_DATAPATHS = ("own", "ocp")
OCP_TWIN = {"e4m3fnuz": "e4m3fn", "e5m2fnuz": "e5m2"}  # the OCP format of the same bits, bias one lower


def get_format(fmt: str) -> Fp8Format:
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not an fp8 format; expected one of {sorted(FORMATS)}")
    return FORMATS[fmt]


@dataclass(frozen=True)
class NaNEncoding:
    """The byte an implementation writes for a NaN result: ``byte`` (0..0xFF), with the input's
    sign copied into bit 7 when ``signed``. Spelled like the docs: ``"0x7F|sign"``, ``"0x7F"``."""

    byte: int
    signed: bool

    @classmethod
    def parse(cls, spec: str, fmt: Fp8Format) -> "NaNEncoding":
        text = spec.strip().lower()
        signed = text.endswith("|sign")
        if signed:
            text = text[: -len("|sign")]
        try:
            byte = int(text, 16)
        except ValueError:
            byte = -1
        if not 0 <= byte <= 0xFF:
            raise ValueError(f"nan={spec!r} is not a NaN byte such as '0x7F|sign' or '0x7F'")
        if fmt.fnuz:
            if (byte, signed) != (0x80, False):
                raise ValueError(f"nan={spec!r}: {fmt.name} has a single NaN, 0x80")
        elif not _is_nan_code(fmt, byte & 0x7F) or (signed and byte & 0x80):
            raise ValueError(f"nan={spec!r}: 0x{byte:02X} is not a NaN code of {fmt.name}")
        return cls(byte, signed)

    def __str__(self) -> str:
        return f"0x{self.byte:02X}" + ("|sign" if self.signed else "")


def _is_nan_code(fmt: Fp8Format, magnitude: int) -> bool:
    exponent_all_ones = ((1 << fmt.binary.exponent_bits) - 1) << fmt.binary.mantissa_bits
    if fmt.inf_code is not None:  # IEEE-like: exponent all ones, mantissa non-zero
        return magnitude & exponent_all_ones == exponent_all_ones and magnitude != fmt.inf_code
    return magnitude == 0x7F  # e4m3fn: only S.1111.111


def canonical_nan(fmt: Fp8Format) -> str:
    return "0x80" if fmt.fnuz else "0x7F|sign"


@dataclass(frozen=True)
class Fp8Knobs:
    """How an implementation converts to fp8, where implementations legitimately differ.

    - ``saturate``: finite values that overflow (after rounding) become ±max; otherwise they become
      inf (formats with inf), NaN (e4m3fn) or 0x80 (fnuz).
    - ``inf``: what ±inf becomes: ``"max"`` (±max), ``"nan"`` (the NaN encoding) or ``"inf"``
      (formats with inf only). ``None``: the rule of the saturation mode, ``"max"`` when
      saturating, else the format's natural one (OCP non-saturating: ``"inf"`` for e5m2, ``"nan"``
      for e4m3fn and the fnuz formats). A preset's ``inf`` belongs to the preset's ``saturate``:
      :func:`resolve_knobs` drops it when the caller names ``saturate`` without naming ``inf``.
    - ``nan``: the NaN encoding, e.g. ``"0x7F|sign"`` (torch), ``"0x7E|sign"`` (ml_dtypes e5m2),
      ``"0x7F"`` (CUDA and Triton on sm_90: sign dropped). ``None``: the format's canonical one.
    - ``overflow_nan``: the NaN encoding of NaNs the conversion makes (from overflow without
      saturation, or inf with ``inf="nan"``). ``None``: the same as ``nan``. They differ where NaN
      inputs lose their sign before the conversion: NVIDIA float32 arithmetic returns the canonical
      NaN, so ``x / scale`` of -NaN is +NaN, while an overflowing -1000 still converts to -NaN.
    - ``scale_op``: ``"div"`` (x / scale in float32) or ``"mul_reciprocal"`` (x * (1/scale)).
    - ``intermediate``: ``None``, ``"float16"`` or ``"bfloat16"``: round the quotient to that type
      before the fp8 rounding (double rounding); ``"float16_rz"``, ``"bfloat16_rz"``: the same type
      rounded toward zero (``cvt.rz.f16.f32``, or a bfloat16 taken as the float32's top half).
    - ``quotient_ulps``: an int; move the float32 quotient that many float32 ulps in magnitude
      (negative: toward zero, never crossing it; positive: away from zero, up to inf) before any
      further rounding. Zeros, inf, NaN and elements whose scale is 1 (no division happens) are
      left alone. 0 (the default) is the correctly rounded quotient. ``-2`` and ``2`` bound what
      an approximate division within 2 ulps (Triton's ``div.full.f32``) can produce.
    - ``rounding``: ``"nearest_even"`` (the default), ``"ties_away"`` or ``"toward_zero"``: the fp8 rounding
      truncates the magnitude to the code at or below it (the 16-bit ``intermediate``, if any,
      still rounds to nearest even). Overflow is then decided on the truncated value, as always:
      a magnitude between max and the step past max (the value code ``max + 1`` would have:
      e4m3fn 480, e5m2 65536, e4m3fnuz 256, e5m2fnuz 65536) truncates to max in either saturation
      mode; from that step upwards it overflows and ``saturate`` decides (±max, or NaN / inf /
      0x80). IEEE 754's roundTowardZero sends every finite overflow to ±max, as
      ``saturate=True`` does.
    - ``subnormals``: ``"keep"`` (the default) or ``"flush"``: a result that is an fp8 subnormal
      after rounding (exponent field 0, mantissa non-zero) is written as zero of the input's sign
      (fnuz: +0, its only zero). A value that rounds up to the smallest normal is kept.
      ``"truncate"``: a value below the smallest normal is rounded toward zero (its mantissa
      shifted into the subnormal field without rounding, as a hand-written conversion's subnormal
      branch may do), so one just below the smallest normal stays the largest subnormal; normal
      values are rounded by ``rounding`` as before.
    - ``overflow_test``: ``"rounded"`` (the default: overflow is decided on the rounded value, so
      e4m3fn's 448 < |q| < 464 rounds to 448) or ``"unrounded"``: a magnitude past max overflows
      before any rounding (a hand-written conversion's ``if (|q| > max)`` branch first), which
      only ``saturate=False`` can tell apart.
    - ``carry``: ``"kept"`` (the default) or ``"dropped"``: a mantissa that rounds up past its
      field does not carry into the exponent (the rounded mantissa field, wrapped to 0, joined to
      the unrounded exponent, as a conversion that rounds the two fields apart does): the value
      just below ``2**(e+1)`` is written as ``2**e``, half of it; overflow is then decided on that
      code. Normal values only: a subnormal still rounds up to the smallest normal.
    - ``fnuz_datapath``: ``"own"`` (the default) or ``"ocp"``: an fnuz format's codes computed as
      the OCP twin's codes of ``2 * q`` (e4m3fnuz from e4m3fn, e5m2fnuz from e5m2: the same bits
      with the bias one higher) and the specials patched, as a conversion that reuses OCP hardware
      or code does. Equal everywhere but at the top: the OCP twin's largest code is the fnuz
      format's largest (0x7E: 224 where e4m3fnuz reaches 240; 0x7B: 28672 where e5m2fnuz reaches
      57344), and what rounds past it overflows. Other formats ignore it.
    - ``negative_zero``: ``"keep"`` (the default) or ``"positive"``: a result of -0 (0x80: -0.0 and
      negative values that round, or are flushed, to zero) is written as +0, 0x00. The fnuz
      formats always do this, unless ``"signed"``: a negative zero result keeps its sign bit even
      in fnuz, where 0x80 is the NaN (elsewhere "signed" is "keep").
    """

    saturate: bool = True
    inf: str | None = None
    nan: str | None = None
    overflow_nan: str | None = None
    scale_op: str = "div"
    intermediate: str | None = None
    quotient_ulps: int = 0
    rounding: str = "nearest_even"
    subnormals: str = "keep"
    negative_zero: str = "keep"
    overflow_test: str = "rounded"
    carry: str = "kept"
    fnuz_datapath: str = "own"

    def validated(self, fmt: Fp8Format) -> "Fp8Knobs":
        """The knobs with defaults filled in for ``fmt``, or a ValueError naming the bad knob."""
        if not isinstance(self.saturate, bool):
            raise TypeError(f"saturate must be a bool, got {self.saturate!r}")
        v.require_choice("scale_op", self.scale_op, SCALE_OPS)
        v.require_choice("intermediate", self.intermediate, tuple(INTERMEDIATES))
        v.require_choice("rounding", self.rounding, ROUNDINGS)
        v.require_choice("subnormals", self.subnormals, SUBNORMALS)
        v.require_choice("negative_zero", self.negative_zero, NEGATIVE_ZEROS)
        v.require_choice("overflow_test", self.overflow_test, OVERFLOW_TESTS)
        v.require_choice("carry", self.carry, CARRIES)
        v.require_choice("fnuz_datapath", self.fnuz_datapath, FNUZ_DATAPATHS)
        ulps = self.quotient_ulps
        if isinstance(ulps, (bool, np.bool_)) or not isinstance(ulps, (int, np.integer)):
            raise TypeError(f"quotient_ulps must be an int, got {ulps!r}")
        inf = self.inf
        if inf is None:
            inf = "max" if self.saturate else ("inf" if fmt.inf_code is not None else "nan")
        v.require_choice("inf", inf, INF_POLICIES)
        if inf == "inf" and fmt.inf_code is None:
            raise ValueError(f"inf='inf': {fmt.name} has no infinity")
        nan = str(NaNEncoding.parse(self.nan or canonical_nan(fmt), fmt))
        overflow_nan = str(NaNEncoding.parse(self.overflow_nan or nan, fmt))
        return replace(self, inf=inf, nan=nan, overflow_nan=overflow_nan,
                       quotient_ulps=int(self.quotient_ulps))
