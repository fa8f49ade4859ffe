"""fp8 quantization and dequantization, bit-exact, with knobs where real kernels differ.

``quantize`` computes ``x / scale`` (or ``x * (1/scale)``) in float32, optionally moves that
quotient a few float32 ulps (to model approximate division), optionally rounds it to float16 or
bfloat16 first (double rounding, as some paths do), then rounds once to the
fp8 format: to nearest, ties to even, overflow decided after rounding. The knobs choose what
overflow, infinities and NaN become; everything else agrees across every implementation we know
(see docs/semantics.md and ../shared/peer-semantics.md). Six more knobs (``rounding``,
``subnormals``, ``negative_zero``, ``overflow_test``, ``carry``, ``fnuz_datapath``) model conversion bugs, not real
implementations: no preset sets them; the diagnosis replays them to name what a failing kernel
does.

Speed: an fp8 code depends only on the top 16 bits of the float32 input and on whether any of the
low 16 bits is set (the round bit and everything kept lie in the top 16 bits for 2- and 3-bit
mantissas). So the integer rounding of :mod:`oracle.reference.rounding` is run once over those
2**17 classes to build a table, and quantizing is one gather per element.

The formats and knobs themselves (:data:`FORMATS`, :class:`Fp8Knobs`, :class:`NaNEncoding`) are
defined in :mod:`oracle.reference.fp8_formats`, which the presets share, and importable from here.
"""

from __future__ import annotations

import functools
from dataclasses import replace

import numpy as np

from . import _validate as v
# the formats and knobs live in fp8_formats (the presets use them too); importable from here as before
from .fp8_formats import (FORMATS, INF_POLICIES, INTERMEDIATE_ROUNDING, INTERMEDIATES,  # noqa: F401
                          NEGATIVE_ZEROS, OCP_TWIN, SCALE_OPS, SUBNORMALS, Fp8Format, Fp8Knobs, NaNEncoding,
                          _is_nan_code, canonical_nan, get_format)
from .presets import get_preset
from .rounding import move_float32_ulps, round_float32, round_to_16bit


def quantize(x, fmt: str, *, scale=1.0, preset: str | None = None, head_axis: int = -2,
             **knobs) -> np.ndarray:
    """Quantize ``x`` (float32, float16 or bfloat16) to fp8 codes (uint8, same shape).

    ``scale`` is a positive finite number or a float32 array of shape ``()``, ``(1,)`` (per tensor)
    or ``(H,)`` (per head: broadcast over ``x``'s ``head_axis``). The stored code is
    ``fp8(x / scale)`` (the "descale" convention every peer uses). Knobs come from ``preset``
    (see :mod:`oracle.reference.presets`; default ``ocp_satfinite``) and may be overridden one by
    one: ``saturate``, ``inf``, ``nan``, ``overflow_nan``, ``scale_op``, ``intermediate``,
    ``quotient_ulps``, ``rounding``, ``subnormals``, ``negative_zero``, ``overflow_test``,
    ``carry``, ``fnuz_datapath`` (see :class:`Fp8Knobs`).
    A named knob always wins over the preset; naming ``saturate`` alone also chooses that mode's
    ``inf`` rule (see :func:`resolve_knobs`), so ``saturate=False`` is the OCP non-saturating
    conversion, ±inf included. The input is never modified.
    """
    form = get_format(fmt)
    resolved = resolve_knobs(form, preset, knobs)
    v.require_float_input("x", x)
    quotient = _scaled_float32(x, scale, resolved.scale_op, head_axis, resolved.quotient_ulps)
    if resolved.intermediate is not None:
        rounding = INTERMEDIATE_ROUNDING.get(resolved.intermediate, (None, "nearest_even"))[1]
        quotient = round_to_16bit(quotient, INTERMEDIATES[resolved.intermediate], rounding)
    return _code_table(form.name, resolved)[_table_key(quotient)]


def resolve_knobs(form: Fp8Format, preset: str | None, overrides: dict) -> Fp8Knobs:
    """The validated knobs of ``preset`` (default ``ocp_satfinite``) for ``form`` with the
    caller's ``overrides`` (knob name -> value) applied.

    Precedence: a knob the caller names wins; the preset supplies only the knobs the caller does
    not name. ``saturate`` and ``inf`` are one decision, what out-of-range values become, so the
    preset's ``inf`` applies only when the caller names neither of them: naming ``saturate``
    without ``inf`` gives that mode's own inf rule (``inf=None``: ±max when saturating, else inf
    for e5m2 and NaN for e4m3fn and fnuz). Naming ``inf`` (a policy) wins in every case; naming
    ``inf=None`` asks for the rule of whichever ``saturate`` applies. The NaN bytes (``nan``,
    ``overflow_nan``) stay the preset's: they are how an implementation encodes NaN, in either
    mode.
    """
    unknown = set(overrides) - set(Fp8Knobs.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown fp8 knob(s): {sorted(unknown)}; knobs are "
                        f"{sorted(Fp8Knobs.__dataclass_fields__)}")
    base = get_preset(preset or "ocp_satfinite").knobs(form.name)
    if "saturate" in overrides and "inf" not in overrides:
        # the preset chose its inf for its own saturation mode, not for the one named here
        base = replace(base, inf=None)
    return replace(base, **overrides).validated(form)


def dequantize(codes, fmt: str, *, scale=1.0, head_axis: int = -2) -> np.ndarray:
    """Decode fp8 codes (uint8) to float32 and multiply by ``scale`` (the stored code holds
    ``x / scale``). NaN codes give NaN, inf codes inf; the input is never modified."""
    form = get_format(fmt)
    v.require_array("codes", codes)
    v.require_dtype("codes", codes, (np.uint8,))
    values = _decode_table(form.name)[codes]
    scale = _scale_array(scale, values, head_axis)
    if scale is None:
        return values
    return (values * scale).astype(np.float32)


def code_values(fmt: str) -> np.ndarray:
    """The float32 value of each of the 256 codes of ``fmt`` (by the format's definition)."""
    return _decode_table(get_format(fmt).name).copy()


def _scaled_float32(x: np.ndarray, scale, scale_op: str, head_axis: int,
                    quotient_ulps: int = 0) -> np.ndarray:
    widened = x.astype(np.float32)  # exact from float16 and bfloat16
    scale = _scale_array(scale, widened, head_axis)
    if scale is None:
        return widened
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN inputs are in the domain
        if scale_op == "div":
            quotient = widened / scale
        else:
            quotient = widened * (np.float32(1.0) / scale)
    if quotient_ulps:
        # x / 1 is exact even when approximate (rcp(1) == 1): a per-head scale of 1 moves nothing
        quotient = np.where(scale != 1, move_float32_ulps(quotient, quotient_ulps), quotient)
    return quotient


def _scale_array(scale, x: np.ndarray, head_axis: int):
    """The scale as float32, shaped to broadcast against ``x``; None when it is exactly 1."""
    if isinstance(scale, np.ndarray):
        v.require_dtype("scale", scale, (np.float32,), " (scales are float32 tensors)")
        if scale.ndim > 1:
            raise ValueError(f"scale must have shape (), (1,) or (H,), got {scale.shape}")
        if scale.size == 0 or not np.all(np.isfinite(scale)) or not np.all(scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {scale!r}")
        if scale.ndim == 1 and scale.size > 1:
            axis = head_axis % x.ndim if -x.ndim <= head_axis < x.ndim else None
            if x.ndim and axis is None:
                raise ValueError(f"head_axis={head_axis} is out of range for x with shape {x.shape}")
            if axis is None or x.shape[axis] != scale.size:
                raise ValueError(f"per-head scale has shape {scale.shape} but x has shape "
                                 f"{x.shape} (head axis {head_axis})")
            return scale.reshape((scale.size,) + (1,) * (x.ndim - 1 - axis))
        scale = scale.reshape(())[()]
    elif isinstance(scale, (bool, np.bool_)) or not isinstance(scale, (int, float, np.floating)):
        raise TypeError(f"scale must be a number or a float32 array, got {scale!r}")
    narrowed = np.float32(scale)  # kernels hold the scale as float32: judge it there
    if not (np.isfinite(narrowed) and narrowed > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale!r} (as float32: {narrowed!r})")
    return None if narrowed == 1 else narrowed


def _table_key(values: np.ndarray) -> np.ndarray:
    """(top 16 bits << 1) | (any of the low 16 bits set), as one shift, one mask and one or."""
    bits = np.ascontiguousarray(values).view(np.uint32)
    key = bits >> np.uint32(15)
    key |= (bits & np.uint32(0x7FFF)) != 0
    return key.reshape(np.shape(values))  # ascontiguousarray makes 0-d inputs 1-d


@functools.lru_cache(maxsize=64)
def _code_table(fmt_name: str, knobs: Fp8Knobs) -> np.ndarray:
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    representatives = np.stack([high, high | np.uint32(1)], axis=1).reshape(-1)
    table = encode(representatives, FORMATS[fmt_name], knobs)
    table.flags.writeable = False
    return table


def encode(bits: np.ndarray, form: Fp8Format, knobs: Fp8Knobs) -> np.ndarray:
    """fp8 codes of float32 bit patterns under validated ``knobs``, by integer arithmetic alone."""
    sign, code, is_nan, is_inf, overflow = round_float32(bits, form.binary, knobs.rounding)
    sign_bit = (sign << np.uint32(7)).astype(np.int64)
    nan_code, made_nan = (_nan_codes(spec, form, sign_bit, code.shape) for spec in (knobs.nan, knobs.overflow_nan))

    if knobs.carry == "dropped":  # the rounded mantissa field under the truncated exponent field
        truncated = round_float32(bits, form.binary, "toward_zero")[1]
        field = (1 << form.binary.mantissa_bits) - 1
        # normal values only: a subnormal branch shifts into place and rounds to the smallest normal
        carried = ~is_nan & ~is_inf & (truncated > field) & ((code & ~field) != (truncated & ~field))
        code = np.where(carried, (truncated & ~field) | (code & field), code)
        overflow = np.where(carried, code > form.max_code, overflow)
    if knobs.overflow_test == "unrounded":  # max has no low bits set, so a table class compares exactly
        magnitude = np.abs(bits.astype(np.uint32).view(np.float32))
        overflow = ~is_nan & ~is_inf & (magnitude > code_values(form.name)[form.max_code])
    if knobs.subnormals == "flush":  # after rounding: what rounds up to the smallest normal stays
        code = np.where(code < (1 << form.binary.mantissa_bits), 0, code)
    elif knobs.subnormals == "truncate":  # below the smallest normal, and only there, toward zero
        truncated = round_float32(bits, form.binary, "toward_zero")[1]
        code = np.where(truncated < (1 << form.binary.mantissa_bits), truncated, code)
    top = form.max_code
    if knobs.fnuz_datapath == "ocp" and form.fnuz:  # the OCP twin's range, in the same bits
        top = FORMATS[OCP_TWIN[form.name]].max_code
        overflow = overflow | (~is_nan & ~is_inf & (code > top))
    # Codes are only meaningful where no mask is set; the masks below overwrite the rest.
    unsigned_zero = (form.fnuz and knobs.negative_zero != "signed") or knobs.negative_zero == "positive"
    out = np.where(code == 0, 0, code | sign_bit) if unsigned_zero else code | sign_bit
    if knobs.saturate:
        out = np.where(overflow, sign_bit | top, out)
    elif form.fnuz:
        out = np.where(overflow, 0x80, out)
    elif form.inf_code is not None:
        out = np.where(overflow, sign_bit | form.inf_code, out)
    else:
        out = np.where(overflow, made_nan, out)
    inf_result = {"max": sign_bit | top, "nan": made_nan,
                  "inf": sign_bit | (form.inf_code or 0)}[knobs.inf]
    out = np.where(is_inf, inf_result, out)
    out = np.where(is_nan, nan_code, out)
    return out.astype(np.uint8)


def _nan_codes(spec: str, form: Fp8Format, sign_bit: np.ndarray, shape) -> np.ndarray:
    nan = NaNEncoding.parse(spec, form)
    codes = np.full(shape, nan.byte, dtype=np.int64)
    return codes | sign_bit if nan.signed else codes


@functools.lru_cache(maxsize=8)
def _decode_table(fmt_name: str) -> np.ndarray:
    form = FORMATS[fmt_name]
    mbits, bias = form.binary.mantissa_bits, form.binary.bias
    codes = np.arange(256)
    magnitude = codes & 0x7F
    exponent = magnitude >> mbits
    mantissa = magnitude & ((1 << mbits) - 1)
    value = np.where(exponent == 0,
                     np.ldexp(mantissa.astype(np.float64), 1 - bias - mbits),
                     np.ldexp((mantissa + (1 << mbits)).astype(np.float64), exponent - bias - mbits))
    value = np.where(codes & 0x80, -value, value)
    if form.fnuz:
        value[0x80] = np.nan
    else:
        is_nan = np.array([_is_nan_code(form, m) for m in magnitude])
        value[is_nan] = np.nan
        if form.inf_code is not None:
            value[magnitude == form.inf_code] = np.copysign(np.inf, value[magnitude == form.inf_code])
    table = value.astype(np.float32)
    table.flags.writeable = False
    return table
