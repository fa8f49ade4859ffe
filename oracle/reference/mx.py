"""MXFP8 (OCP Microscaling Formats v1.0): fp8 elements in blocks of 32 sharing one E8M0 scale.

A row's last axis (a head's elements) is cut into blocks of :data:`BLOCK` consecutive elements;
the last block of a row may be shorter when the row is not a multiple of the block (blocks never
straddle rows). Each block stores one **E8M0 scale** ``X = 2**E`` (code ``E + 127``; 0xFF is NaN;
``E`` in ``[-127, 127]``) and each element the fp8 code of ``x / X``. Decoding is
``fp8_value(code) * X``.

Where implementations legitimately differ, :class:`MxKnobs` says how:

- ``exponent``: how ``E`` follows from the block's largest magnitude ``amax``:
  ``"floor"``: ``floor(log2(amax)) - emax_elem`` (the OCP spec's rule; emax_elem = 8 for e4m3fn,
  15 for e5m2), so elements up to twice the element format's largest binade may saturate;
  ``"ceil"``: the E8M0 of the float32 quotient ``amax / max_elem`` rounded up to a power of two
  (``cvt.rp.satfinite.ue8m0x2.f32``; TransformerEngine's and torchao's "RCEIL"), so no element
  exceeds the element format's maximum; ``"round"``: ``round(log2(amax)) - emax_elem``, the
  nearest binade (``torch.round(torch.log2(amax))``: a hand-written rule no spec gives, whose
  blocks with a mantissa of sqrt(2) or more get the next exponent up); ``"floor_log2f"``: the floor
  of ``log2(amax)`` rounded to float32 first, minus emax_elem (Microsoft's microxcaling emulation,
  ``torch.floor(torch.log2(amax))``; a CUDA ``floorf(log2f(amax))``): the floor rule, except that an
  amax whose log2 lies within half a float32 step below an integer takes the exponent above (the
  float just below ``2**k`` does so for ``k >= 3`` and ``k <= -2``), and its elements saturate;
  ``"ceil_log2"``: ``ceil(log2(amax)) - emax_elem`` (the binade above amax's unless amax is a power
  of two, a hand-written rule that takes RCEIL's rounding up but not its division by the element
  maximum: one binade lower than RCEIL wherever the mantissa of amax exceeds that of ``max_elem``).
- ``zero_block``: the scale of a block whose elements are all zero: ``"min"`` (E = -127, code 0:
  what both rules give for ``amax = 0`` once ``E`` is clamped) or ``"one"`` (E = 0, code 127).
- ``nonfinite``: a block holding NaN or ±inf: ``"nan_scale"`` (the scale is NaN, 0xFF: the spec
  makes every element of such a block NaN) or ``"finite_amax"`` (the scale comes from the block's
  finite elements; the NaN and inf elements are converted on their own, by the element rules).
  Either way the element codes are those of ``x / X`` with ``X`` from the finite elements.
  ``"nan_block"``: the scale is 0xFF and every element of the block is the element format's NaN
  (torchao's ``to_mx``: a NaN or inf amax, whose reciprocal scale makes every quotient NaN).
  ``"inf_saturates"`` (TransformerEngine, TensorRT-LLM): NaN is skipped by amax and inf is not,
  so a block holding ±inf gets the saturated scale 0xFE (E = 127) and the multiplier 0: its
  finite elements are written as ±0, its inf and NaN elements as NaN (the positive NaN of an
  invalid product); a block with NaN but no inf is scaled by its finite elements.
- ``min_scale_factor``: the element multiplier of a nonzero block whose E is -127 (scale byte 0):
  ``"exact"`` (``2**127``) or ``"one"`` (TransformerEngine's ``exp2f_rcp``, which returns 1 for
  byte 0, so such a block's elements are written unscaled).
- ``saturate`` and ``element_preset``: the element conversion, as :func:`oracle.reference.fp8.quantize`
  does it (default: saturating, round to nearest even, the preset ``ocp_satfinite``'s NaN byte).

Fault knobs (never a real writer's choice; the diagnosis replays them to name a bug):
``exponent_offset``, added to ``E`` of every nonzero block before the clamp (the shared exponent
off by one: -1 or +1; or by the difference of the element formats' ``emax``, 7: e5m2's 15 taken
for e4m3fn's 8, or e4m3fn's for e5m2's). ``tail_amax``: ``"own"`` (the last, partial block of a
row scaled by its own elements) or ``"read_ahead"`` (its amax, and whether it holds NaN or inf,
taken over a whole block's width of ``x`` in C order from the block's start: the elements past
the row's end, the next head's or the next token's, up to the end of ``x``; an unmasked vector
load whose mask covers only the tensor's end). Its codes are its own elements' either way.
``exponent_clamp``: ``"after_emax"`` (E clamped to ``[-127, 127]``) or ``"before_emax"``
(``floor(log2(amax))`` clamped first and ``emax`` subtracted after: a block whose amax lies below
``2**(emax - 127)`` gets E below -127, its scale byte ``E + 127`` wrapped to 8 bits and its
multiplier ``2**-E`` past float32's range, infinite, so its elements saturate and its zeros
become NaN).

``x / X`` is computed in float32 (exact for a power of two unless the quotient is a float32
subnormal, where it rounds once, as every kernel's float32 arithmetic does).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import _validate as v
from .fp8 import code_values, get_format
from .fp8 import dequantize as fp8_dequantize
from .fp8 import quantize as fp8_quantize

BLOCK = 32
E8M0_BIAS, E8M0_NAN = 127, 0xFF
E_MIN, E_MAX = -127, 127
ELEMENT_FORMATS = ("e4m3fn", "e5m2")
EXPONENT_RULES = ("floor", "ceil", "round", "floor_log2f", "ceil_log2")
ZERO_BLOCKS = ("min", "one")
NONFINITE_BLOCKS = ("nan_scale", "finite_amax", "nan_block", "inf_saturates")
MIN_SCALE_FACTORS = ("exact", "one")
EXPONENT_OFFSETS = (-7, -1, 0, 1, 7)
TAIL_AMAX = ("own", "read_ahead")
EXPONENT_CLAMPS = ("after_emax", "before_emax")


@dataclass(frozen=True)
class MxKnobs:
    """How an implementation computes MX scales and elements (see the module docstring)."""

    exponent: str = "floor"
    zero_block: str = "min"
    nonfinite: str = "nan_scale"
    saturate: bool = True
    element_preset: str = "ocp_satfinite"
    min_scale_factor: str = "exact"
    exponent_offset: int = 0  # fault knob: -1 or +1, or -7 or +7 (the other element format's emax)
    tail_amax: str = "own"  # fault knob: "read_ahead"
    exponent_clamp: str = "after_emax"  # fault knob: "before_emax"

    def validated(self) -> "MxKnobs":
        v.require_choice("exponent", self.exponent, EXPONENT_RULES)
        v.require_choice("zero_block", self.zero_block, ZERO_BLOCKS)
        v.require_choice("nonfinite", self.nonfinite, NONFINITE_BLOCKS)
        v.require_choice("min_scale_factor", self.min_scale_factor, MIN_SCALE_FACTORS)
        v.require_choice("exponent_offset", self.exponent_offset, EXPONENT_OFFSETS)
        v.require_choice("tail_amax", self.tail_amax, TAIL_AMAX)
        v.require_choice("exponent_clamp", self.exponent_clamp, EXPONENT_CLAMPS)
        if not isinstance(self.saturate, bool):
            raise TypeError(f"saturate must be a bool, got {self.saturate!r}")
        return self


# What real implementations do (docs/semantics.md, "Block-scaled formats").
MX_PRESETS = {
    "ocp_mx_v1": MxKnobs(),  # the spec: floor, NaN scale for a non-finite block, saturating elements
    "torchao_floor": MxKnobs(nonfinite="nan_block"),  # torchao's to_mx, FLOOR mode
    "rceil": MxKnobs(exponent="ceil"),  # torchao's RCEIL mode; the others' rule on finite blocks
    # TransformerEngine's quantize_mxfp8 (float_to_e8m0, exp2f_rcp, cvt.rn.satfinite.e4m3x2)
    "te_mxfp8": MxKnobs(exponent="ceil", nonfinite="inf_saturates", min_scale_factor="one",
                        element_preset="cuda_satfinite"),
}


def mx_knobs(preset: str | None = None, **overrides) -> MxKnobs:
    """The knobs of ``preset`` (default ``ocp_mx_v1``) with the caller's overrides."""
    name = preset or "ocp_mx_v1"
    if name not in MX_PRESETS:
        raise ValueError(f"preset={preset!r} is not an MX preset; expected one of {sorted(MX_PRESETS)}")
    unknown = set(overrides) - set(MxKnobs.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown MX knob(s): {sorted(unknown)}; knobs are {sorted(MxKnobs.__dataclass_fields__)}")
    return replace(MX_PRESETS[name], **overrides).validated()


def _blocks(x32: np.ndarray, block: int) -> tuple[np.ndarray, int]:
    """``x32`` as ``[..., blocks, block]`` (the last block zero-padded) and the row length."""
    width = x32.shape[-1]
    count = -(-width // block)
    padded = np.zeros(x32.shape[:-1] + (count * block,), dtype=np.float32)
    padded[..., :width] = x32
    return padded.reshape(x32.shape[:-1] + (count, block)), width


def _read_ahead(x32: np.ndarray, blocks: np.ndarray, width: int, block: int) -> np.ndarray:
    """``blocks`` with each row's partial last block filled past the row's end from ``x32`` in C
    order (the next row's first elements), up to ``x32``'s end (zeros beyond it)."""
    tail = width % block
    if not tail:
        return blocks
    flat = np.concatenate([x32.reshape(-1), np.zeros(block - tail, np.float32)])
    rows = np.arange(int(np.prod(x32.shape[:-1])), dtype=np.int64)
    ahead = flat[(rows + 1)[:, None] * width + np.arange(block - tail)]
    seen = blocks.copy()
    seen[..., -1, tail:] = ahead.reshape(x32.shape[:-1] + (block - tail,))
    return seen


def _floor_log2(values: np.ndarray) -> np.ndarray:
    """floor(log2(v)) of positive finite float32 values, exactly (frexp: v = m * 2**e, m in [0.5, 1))."""
    return np.frexp(values.astype(np.float64))[1].astype(np.int64) - 1


def shared_exponents(amax: np.ndarray, fmt: str, knobs: MxKnobs) -> np.ndarray:
    """E of each block (int64, clamped to [-127, 127]) from its finite ``amax`` (float32, >= 0)."""
    largest = code_values(fmt)[get_format(fmt).max_code]  # e4m3fn 448, e5m2 57344
    emax = int(_floor_log2(np.array([largest], dtype=np.float32))[0])
    positive = amax > 0
    safe = np.where(positive, amax, np.float32(1))
    if knobs.exponent == "floor":
        exponent = _floor_log2(safe) - emax
    elif knobs.exponent == "floor_log2f":  # log2 correctly rounded to float32, then the floor
        exponent = np.floor(np.log2(safe.astype(np.float64)).astype(np.float32)).astype(np.int64) - emax
    elif knobs.exponent == "ceil_log2":  # the binade above, unless amax is a power of two
        exponent = _floor_log2(safe) + (np.frexp(safe.astype(np.float64))[0] != 0.5) - emax
    elif knobs.exponent == "round":  # log2 of the mantissa in [1, 2) is >= 0.5 from sqrt(2) on
        mantissa = np.frexp(safe.astype(np.float64))[0] * 2
        exponent = _floor_log2(safe) + (mantissa >= np.sqrt(2.0)) - emax
    else:  # ceil: the E8M0 of fl32(amax / max_elem), rounded up
        quotient = (safe / np.float32(largest)).astype(np.float32)
        mantissa, power = np.frexp(quotient.astype(np.float64))
        exponent = np.where(mantissa == 0.5, power - 1, power).astype(np.int64)
        # a subnormal amax whose quotient underflows to 0: every E works, the clamp keeps -127
        exponent = np.where(quotient == 0, E_MIN, exponent)
    zero = E_MIN if knobs.zero_block == "min" else 0
    exponent = np.where(positive, exponent + knobs.exponent_offset, zero)
    if knobs.exponent_clamp == "before_emax":  # the clamp on log2(amax), emax subtracted after it
        return np.where(positive, np.clip(exponent + emax, E_MIN, E_MAX) - emax, np.clip(exponent, E_MIN, E_MAX))
    return np.clip(exponent, E_MIN, E_MAX)


def quantize_mxfp8(x, fmt: str = "e4m3fn", *, block: int = BLOCK, preset: str | None = None,
                   scales=None, nan_block_codes=None, **knobs) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of ``x`` (float32, float16 or bfloat16, any shape, blocks along the last
    axis): ``codes`` uint8 of ``x``'s shape (fp8 ``fmt``), ``scales`` uint8 E8M0 codes of shape
    ``x.shape[:-1] + (ceil(D / block),)``. Knobs: :class:`MxKnobs` (``preset``: see
    :data:`MX_PRESETS`). The input is never modified.

    ``scales`` (for the diagnosis; never a writer's choice): E8M0 codes of that shape to use
    where they differ from the computed ones, the elements then scaled by them (a NaN code
    leaves the elements as computed): whether a kernel's elements follow the scales it wrote.
    ``nan_block_codes`` (with ``scales``): element codes of ``x``'s shape kept as they are in the
    blocks whose scale is NaN, whose elements decode as NaN whatever their codes."""
    v.require_float_input("x", x)
    v.require_choice("fmt", fmt, ELEMENT_FORMATS)
    block = v.require_int("block", block, 1)
    resolved = mx_knobs(preset, **knobs)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (the blocks run along the last one)")
    x32 = x.astype(np.float32)
    if x32.shape[-1] == 0:
        return np.zeros(x32.shape, dtype=np.uint8), np.zeros(x32.shape[:-1] + (0,), dtype=np.uint8)
    blocks, width = _blocks(x32, block)
    finite = np.isfinite(blocks)
    # what each block's scale is computed from: its elements, or more under tail_amax
    seen = _read_ahead(x32, blocks, width, block) if resolved.tail_amax == "read_ahead" else blocks
    finite_seen = np.isfinite(seen)
    with np.errstate(invalid="ignore"):
        amax = np.max(np.where(finite_seen, np.abs(seen), np.float32(0)), axis=-1)
    exponent = shared_exponents(amax, fmt, resolved)
    has_inf = np.any(np.isinf(seen), axis=-1) if resolved.nonfinite == "inf_saturates" else False
    exponent = np.where(has_inf, E_MAX, exponent)
    given = scales
    scales = ((exponent + E8M0_BIAS) & 0xFF).astype(np.uint8)  # wraps only under exponent_clamp's fault
    all_finite = np.all(finite_seen, axis=-1)
    if resolved.nonfinite in ("nan_scale", "nan_block"):
        scales = np.where(all_finite, scales, np.uint8(E8M0_NAN)).astype(np.uint8)
    if given is not None:
        given = np.asarray(given, np.uint8)
        v.require_shape("scales", given, scales.shape, "one E8M0 code per block")
        other = (given != scales) & (given != E8M0_NAN)
        exponent = np.where(other, given.astype(np.int64) - E8M0_BIAS, exponent)
        has_inf = has_inf & ~other
        scales = given.copy()
    with np.errstate(over="ignore"):  # past 2**127 only under exponent_clamp's fault: inf
        factor = np.ldexp(np.float32(1), -exponent).astype(np.float32)  # 2**-E, exact in float32
    if resolved.min_scale_factor == "one":
        factor = np.where(exponent == E_MIN, np.float32(1), factor).astype(np.float32)
    factor = np.where(has_inf, np.float32(0), factor).astype(np.float32)[..., None]
    with np.errstate(over="ignore", invalid="ignore"):
        quotient = (blocks * factor).astype(np.float32)
    if resolved.exponent_clamp == "before_emax":  # 0 times its infinite multipliers: a GPU float unit's NaN, positive
        quotient = np.where(np.isnan(quotient) & finite, np.float32(np.nan), quotient)
    if resolved.nonfinite == "nan_block":
        quotient = np.where(all_finite[..., None], quotient, np.float32(np.nan))
    elif resolved.nonfinite == "inf_saturates":  # inf * 0 and NaN * 0: the invalid product's NaN
        quotient = np.where(np.asarray(has_inf)[..., None] & ~finite, np.float32(np.nan), quotient)
    codes = fp8_quantize(quotient, fmt, preset=resolved.element_preset, saturate=resolved.saturate)
    codes = codes.reshape(x32.shape[:-1] + (blocks.shape[-2] * block,))[..., :width]
    if nan_block_codes is not None:
        nan = np.repeat(scales == E8M0_NAN, block, axis=-1)[..., :width]
        codes = np.where(nan, np.asarray(nan_block_codes, np.uint8), codes)
    return np.ascontiguousarray(codes), scales


def e8m0_values(scales) -> np.ndarray:
    """The float32 value of E8M0 codes (uint8): ``2**(code - 127)``, NaN for 0xFF."""
    v.require_array("scales", scales)
    v.require_dtype("scales", scales, (np.uint8,))
    exponent = scales.astype(np.int64) - E8M0_BIAS
    values = np.ldexp(np.float32(1), exponent).astype(np.float32)
    return np.where(scales == E8M0_NAN, np.float32(np.nan), values).astype(np.float32)


def dequantize_mxfp8(codes, scales, fmt: str = "e4m3fn", *, block: int = BLOCK) -> np.ndarray:
    """float32 values of MXFP8 ``codes`` (uint8, blocks along the last axis) with their E8M0
    ``scales`` (uint8, one per block): ``fp8_value(code) * 2**E``; NaN in a block whose scale is
    NaN."""
    v.require_array("codes", codes)
    v.require_dtype("codes", codes, (np.uint8,))
    v.require_choice("fmt", fmt, ELEMENT_FORMATS)
    block = v.require_int("block", block, 1)
    if codes.ndim == 0:
        raise ValueError("codes must have at least one axis")
    want = codes.shape[:-1] + (-(-codes.shape[-1] // block),)
    v.require_shape("scales", scales, want, " (one E8M0 code per block of the last axis)")
    values = fp8_dequantize(codes, fmt)
    per_element = np.repeat(e8m0_values(scales), block, axis=-1)[..., :codes.shape[-1]]
    with np.errstate(over="ignore", invalid="ignore"):
        return (values * per_element).astype(np.float32)
