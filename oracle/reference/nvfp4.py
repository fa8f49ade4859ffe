"""NVFP4: e2m1 elements in blocks of 16 sharing one e4m3fn scale, under one float32 per-tensor scale.

A row's last axis (a head's elements) is cut into blocks of :data:`BLOCK` consecutive elements;
the last block may be shorter (blocks never straddle rows). Each block stores one **e4m3fn scale
byte** and each element a 4-bit **e2m1 code** (magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6; bit 3 the
sign), two codes per byte. ``global_scale`` (``gs``) is the per-tensor float32 "encode" scale of
vLLM and TensorRT-LLM (``gs = 448 * 6 / amax(tensor)`` in their callers): decoding is
``e2m1(code) * e4m3(scale) / gs``.

The default arithmetic (preset ``nvfp4_ref``) is vLLM's ``ref_nvfp4_quant`` and TensorRT-LLM's
``cvt_warp_fp16_to_fp4`` with IEEE reciprocals, all in float32 rounded to nearest even::

    amax = max |x| over the block               (NaN ignored, inf counts)
    sf   = fl(gs * fl(amax * fl(1/6)))
    scale byte = e4m3fn(sf), saturating         (sf >= 448 or inf: 0x7E); sfq = its value
    out  = 0 if sfq == 0 else fl(1 / fl(sfq * fl(1/gs)))
    code = e2m1(fl(x * out)), round to nearest even, saturating to +-6 (inf too)

Where implementations differ, :class:`Nvfp4Knobs` says how:

- ``global_scale_at``: where ``gs`` is applied. ``"block_scale"`` (above: folded into the block
  scale and its reciprocal) or ``"input"`` (``x' = fl(x * gs)`` first; then ``sf = fl(amax' *
  fl(1/6))`` and ``code = e2m1(fl(x' * fl(1/sfq)))``), which rounds differently.
- ``nibble_order``: ``"low_first"`` (element ``2j`` in the low nibble of byte ``j``, what PTX's
  ``cvt.rn.satfinite.e2m1x2.f32 d, a, b`` gives with ``a`` the odd element) or ``"high_first"``.
- ``nan_element``: the code of a NaN element (e2m1 has no NaN): ``"max"`` (7, +6: the
  satfinite conversion) or ``"zero"`` (0); ``"signed_max"`` (a fault: 7 with the NaN's sign
  bit, so a negative NaN is 15, -6: an encoder that maps NaN to the largest magnitude and then
  ORs in the sign as for any value).
- ``nonfinite``: ``"ignore_nan"`` (amax over the non-NaN elements, as CUDA's ``fmaxf`` does),
  ``"nan_scale"`` (a block holding NaN gets the e4m3fn NaN scale byte 0x7F) or
  ``"all_nan_scale"`` (only a block whose elements are all NaN gets 0x7F: vLLM's and
  TensorRT-LLM's ``__hmax2`` amax, NaN only where both operands are).
- ``zero_guard``: what decides that the element multiplier is 0: ``"stored"`` (the stored scale
  ``sfq`` is 0) or ``"unrounded"`` (TensorRT-LLM: ``sf`` is 0; a block whose ``sf`` is positive
  but rounds to the scale byte 0 gets ``1 / 0 = inf``, so its nonzero elements are written as
  ±6 and its zeros as NaN).
- ``element_rounding``: how the e2m1 codes round: ``"nearest_even"`` (the satfinite conversion),
  ``"ties_away"`` (a tie to the larger magnitude: converters that compare with ``>=`` at every
  midpoint), ``"ties_toward_zero"`` (a tie to the smaller: ``>`` at every midpoint) or
  ``"toward_zero"`` (truncation); and the faults ``"tie_flipped_at_T"`` (T one of
  the midpoints 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5: that tie rounded the other way than to even,
  every other tie to even, as a threshold table with one comparison of the wrong kind does).

Fault knobs (never a real writer's choice; the diagnosis replays them to name a bug):
``element_scale="unrounded"`` (elements scaled by the block scale before its e4m3fn rounding),
``global_scale_uses`` (how many times ``gs`` is applied: 1, or the bugs 0, 2 and -1, its
reciprocal applied: the decode scale's convention, ``amax / (448 * 6)``, taken for the encode
scale's), ``element_product`` (the multiply ``x * out``: ``"float32"``, or the bug
``"source_dtype"``, in a 16-bit source's own arithmetic, ``out`` and the product each rounded to
that type, as ``__hmul2`` computes, before the e2m1 conversion), ``global_scale_dtype`` (``gs``
as given, ``"float32"``, or the bug ``"source_dtype"``: rounded to a 16-bit source's type before
any use, as a kernel templated on the source type that converts it to ``scalar_t`` does) and
``scale_conversion`` (the block scale's e4m3fn conversion: ``"satfinite"``, or the bugs
``"toward_zero"``, truncated, ``"nonsaturating"``, ``sf`` past 448 made the NaN byte 0x7F,
whose NaN then reaches every element of the block, and ``"flush_subnormals"``, an ``sf`` that
rounds to an e4m3fn subnormal stored as 0, so the block's elements are written as 0).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from . import _validate as v
from .fp8 import code_values
from .fp8 import quantize as fp8_quantize

BLOCK = 16
E2M1_MAGNITUDES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=np.float32)
E2M1_MAX = 6.0
SCALE_MAX = 448.0  # e4m3fn
SCALE_NAN = 0x7F
SIXTH = np.float32(1) / np.float32(6)  # fl32(1/6) = 0.1666666716...
GLOBAL_SCALE_AT = ("block_scale", "input")
NIBBLE_ORDERS = ("low_first", "high_first")
NAN_ELEMENTS = ("max", "zero", "signed_max")
NONFINITE_BLOCKS = ("ignore_nan", "nan_scale", "all_nan_scale")
ZERO_GUARDS = ("stored", "unrounded")
ELEMENT_SCALES = ("stored", "unrounded")
SCALE_CONVERSIONS = ("satfinite", "toward_zero", "nonsaturating", "flush_subnormals")
ELEMENT_ROUNDINGS = ("nearest_even", "ties_away", "toward_zero", "ties_toward_zero")
NEGATIVE_ZEROS = ("keep", "positive")
MIDPOINTS = (0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0)  # between adjacent e2m1 magnitudes: the ties
# A fault: one midpoint rounded the other way than to even, every other tie to even (a converter
# comparing with ">" at one threshold where ">=" belongs, or the reverse); TIE_FLIPS[i] flips MIDPOINTS[i]
TIE_FLIPS = tuple(f"tie_flipped_at_{t:g}" for t in MIDPOINTS)
GLOBAL_SCALE_USES = (0, 1, 2, -1)
ELEMENT_PRODUCTS = ("float32", "source_dtype")
GLOBAL_SCALE_DTYPES = ("float32", "source_dtype")


@dataclass(frozen=True)
class Nvfp4Knobs:
    """How an implementation computes NVFP4 scales and codes (see the module docstring)."""

    global_scale_at: str = "block_scale"
    nibble_order: str = "low_first"
    nan_element: str = "max"
    nonfinite: str = "ignore_nan"
    zero_guard: str = "stored"
    element_rounding: str = "nearest_even"
    element_scale: str = "stored"  # fault knob: "unrounded"
    global_scale_uses: int = 1  # fault knob: 0, 2 or -1 (its reciprocal)
    element_product: str = "float32"  # fault knob: "source_dtype"
    global_scale_dtype: str = "float32"  # fault knob: "source_dtype"
    scale_conversion: str = "satfinite"  # fault knob: "toward_zero" or "nonsaturating"
    negative_zero: str = "keep"  # fault knob: "positive" (a magnitude code of 0 written without its sign)

    def validated(self) -> "Nvfp4Knobs":
        v.require_choice("global_scale_at", self.global_scale_at, GLOBAL_SCALE_AT)
        v.require_choice("nibble_order", self.nibble_order, NIBBLE_ORDERS)
        v.require_choice("nan_element", self.nan_element, NAN_ELEMENTS)
        v.require_choice("nonfinite", self.nonfinite, NONFINITE_BLOCKS)
        v.require_choice("zero_guard", self.zero_guard, ZERO_GUARDS)
        v.require_choice("element_rounding", self.element_rounding, ELEMENT_ROUNDINGS + TIE_FLIPS)
        v.require_choice("element_scale", self.element_scale, ELEMENT_SCALES)
        v.require_choice("global_scale_uses", self.global_scale_uses, GLOBAL_SCALE_USES)
        v.require_choice("element_product", self.element_product, ELEMENT_PRODUCTS)
        v.require_choice("global_scale_dtype", self.global_scale_dtype, GLOBAL_SCALE_DTYPES)
        v.require_choice("scale_conversion", self.scale_conversion, SCALE_CONVERSIONS)
        v.require_choice("negative_zero", self.negative_zero, NEGATIVE_ZEROS)
        return self


# What real implementations do (docs/semantics.md, "Block-scaled formats").
NVFP4_PRESETS = {
    "nvfp4_ref": Nvfp4Knobs(),  # vLLM's ref_nvfp4_quant, TensorRT-LLM's and FlashInfer's fp4 quantize
    "nvfp4_prescaled": Nvfp4Knobs(global_scale_at="input"),  # x * gs first, then a plain block scale
    # vLLM's cvt_warp_fp16_to_fp4 (scaled_fp4_quant, the NVFP4 KV store), IEEE reciprocals assumed
    "nvfp4_vllm": Nvfp4Knobs(nonfinite="all_nan_scale"),
    # TensorRT-LLM's cvt_warp_fp16_to_fp4: the multiplier guarded by the unrounded scale
    "nvfp4_trtllm": Nvfp4Knobs(nonfinite="all_nan_scale", zero_guard="unrounded"),
}


def nvfp4_knobs(preset: str | None = None, **overrides) -> Nvfp4Knobs:
    """The knobs of ``preset`` (default ``nvfp4_ref``) with the caller's overrides."""
    name = preset or "nvfp4_ref"
    if name not in NVFP4_PRESETS:
        raise ValueError(f"preset={preset!r} is not an NVFP4 preset; expected one of {sorted(NVFP4_PRESETS)}")
    unknown = set(overrides) - set(Nvfp4Knobs.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown NVFP4 knob(s): {sorted(unknown)}; knobs are "
                        f"{sorted(Nvfp4Knobs.__dataclass_fields__)}")
    return replace(NVFP4_PRESETS[name], **overrides).validated()


def e2m1_values(codes) -> np.ndarray:
    """The float32 value of e2m1 codes (integers 0..15; bit 3 the sign)."""
    codes = np.asarray(codes).astype(np.int64)
    if codes.size and (codes.min() < 0 or codes.max() > 15):
        raise ValueError(f"codes must lie in [0, 15], got values in [{codes.min()}, {codes.max()}]")
    magnitude = E2M1_MAGNITUDES[codes & 7]
    return np.where(codes & 8, -magnitude, magnitude).astype(np.float32)


# Round-to-nearest-even boundaries between adjacent magnitudes: a tie goes to the even code
# (0, 1.0, 2.0, 4.0 have even codes 0, 2, 4, 6).
_UPPER = np.array(MIDPOINTS, dtype=np.float32)
_TIE_GOES_UP = np.array([False, True, False, True, False, True, False])


def e2m1_codes(q, *, nan_element: str = "max", rounding: str = "nearest_even",
               negative_zero: str = "keep") -> np.ndarray:
    """e2m1 codes (uint8 0..15) of float32 ``q``: rounded by ``rounding`` (``"nearest_even"``;
    ``"ties_away"``, a tie to the larger magnitude; ``"ties_toward_zero"``, a tie to the smaller,
    as thresholds compared with ``>`` at every midpoint; ``"toward_zero"``, the largest magnitude
    not above; a fault of :data:`TIE_FLIPS`, one tie the other way), saturating to +-6 (infinities
    too); -0 and negative values that round to 0 are code 8 (``negative_zero="positive"``, a
    fault: code 0, the sign applied only to a nonzero magnitude); NaN is code 7
    (``nan_element="max"``) or 0 (``"zero"``), or 7 with its sign bit (``"signed_max"``, a fault)."""
    v.require_choice("nan_element", nan_element, NAN_ELEMENTS)
    v.require_choice("negative_zero", negative_zero, NEGATIVE_ZEROS)
    v.require_choice("rounding", rounding, ELEMENT_ROUNDINGS + TIE_FLIPS)
    q = np.asarray(q, dtype=np.float32)
    magnitude = np.abs(q)
    index = np.searchsorted(_UPPER, magnitude, side="left")  # boundaries strictly below magnitude
    clipped = np.minimum(index, len(_UPPER) - 1)
    at_tie = _UPPER[clipped] == magnitude
    up = True if rounding == "ties_away" else False if rounding == "ties_toward_zero" else _TIE_GOES_UP[clipped]
    if rounding in TIE_FLIPS:
        up = up ^ (clipped == TIE_FLIPS.index(rounding))
    code = np.where(at_tie & up, index + 1, index)
    if rounding == "toward_zero":
        with np.errstate(invalid="ignore"):
            code = np.searchsorted(E2M1_MAGNITUDES, magnitude, side="right") - 1
    code = np.minimum(code, 7)
    signed = np.signbit(q) & ((code > 0) if negative_zero == "positive" else True)
    code = np.where(signed, code | 8, code)
    nan = np.isnan(q)
    nan_code = {"max": 7, "zero": 0}.get(nan_element)
    code = np.where(nan, np.where(np.signbit(q), 15, 7) if nan_code is None else nan_code, code)
    return code.astype(np.uint8)


def padded_blocks(x32: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``x32`` as ``[..., blocks, block]`` (the last block padded with NaN, which no amax sees)
    and the mask of real elements."""
    width = x32.shape[-1]
    count = -(-width // block)
    padded = np.full(x32.shape[:-1] + (count * block,), np.nan, dtype=np.float32)
    padded[..., :width] = x32
    real = np.zeros(count * block, bool)
    real[:width] = True
    shape = x32.shape[:-1] + (count, block)
    return padded.reshape(shape), np.broadcast_to(real.reshape(count, block), shape)


def _require_global_scale(global_scale) -> np.float32:
    value = np.asarray(global_scale, dtype=np.float64)
    if value.size != 1:
        raise ValueError(f"global_scale must be one number, got shape {value.shape}")
    value = float(value.reshape(()))
    if not np.isfinite(value) or value <= 0 or not np.isfinite(np.float32(value)) or np.float32(value) == 0:
        raise ValueError(f"global_scale must be a finite float32 > 0, got {value!r}")
    return np.float32(value)


def quantize_nvfp4(x, global_scale=1.0, *, block: int = BLOCK, preset: str | None = None,
                   scales=None, **knobs) -> tuple[np.ndarray, np.ndarray]:
    """(packed, scales) of ``x`` (float32, float16 or bfloat16, any shape, blocks along the last
    axis, whose length D must be even): ``packed`` uint8 ``x.shape[:-1] + (D // 2,)``,
    ``scales`` uint8 e4m3fn codes ``x.shape[:-1] + (ceil(D / block),)``. ``global_scale``: a
    finite float32 > 0. Knobs: :class:`Nvfp4Knobs` (``preset``: see :data:`NVFP4_PRESETS`).

    ``scales`` (for the diagnosis; never a writer's choice): e4m3fn scale codes of that shape to
    use where they differ from the computed ones, the elements then scaled by their value:
    whether a kernel's elements follow the scales it wrote."""
    v.require_float_input("x", x)
    block = v.require_int("block", block, 1)
    gs = _require_global_scale(global_scale)
    k = nvfp4_knobs(preset, **knobs)
    if x.ndim == 0:
        raise ValueError("x must have at least one axis (the blocks run along the last one)")
    width = x.shape[-1]
    if width % 2:
        raise ValueError(f"x has {width} elements per row; NVFP4 packs two per byte, so it must be even")
    x32 = x.astype(np.float32)
    if width == 0:
        return (np.zeros(x32.shape[:-1] + (0,), np.uint8), np.zeros(x32.shape[:-1] + (0,), np.uint8))
    blocks, real = padded_blocks(x32, block)
    if scales is not None:
        scales = np.asarray(scales, np.uint8)
        v.require_shape("scales", scales, blocks.shape[:-1], "one e4m3fn code per block")
    codes, scales = _quantize_blocks(blocks, real, gs, k, x.dtype, scales)
    codes = codes.reshape(x32.shape[:-1] + (blocks.shape[-2] * block,))[..., :width]
    return pack(codes, k.nibble_order), scales


def _quantize_blocks(blocks: np.ndarray, real: np.ndarray, gs: np.float32, k: Nvfp4Knobs, source_dtype,
                     given: np.ndarray | None = None):
    """(element codes ``[..., blocks, block]``, scale codes ``[..., blocks]``) of float32 blocks
    (``source_dtype``: the elements' own type, for the knobs set to ``"source_dtype"``; ``given``:
    scale codes that replace the computed ones where they differ)."""
    f32 = np.float32
    with np.errstate(over="ignore", invalid="ignore", divide="ignore", under="ignore"):
        if k.global_scale_dtype == "source_dtype" and np.dtype(source_dtype).itemsize == 2:
            gs = f32(np.asarray(gs, f32).astype(source_dtype))
        encode = {0: f32(1), 1: f32(gs), 2: f32(f32(gs) * gs), -1: f32(f32(1) / gs)}[k.global_scale_uses]
        if k.global_scale_at == "input":
            blocks = (blocks * encode).astype(f32)
            encode = f32(1)
        magnitude = np.where(real, np.abs(blocks), f32(np.nan))
        amax = np.fmax.reduce(magnitude, axis=-1)  # fmax ignores NaN, as CUDA's fmaxf does
        amax = np.where(np.isnan(amax), f32(0), amax).astype(f32)
        sf = (encode * (amax * SIXTH).astype(f32)).astype(f32)
        conversion = {"satfinite": {}, "toward_zero": {"rounding": "toward_zero"},
                      "nonsaturating": {"saturate": False, "inf": "nan", "overflow_nan": "0x7F"},
                      "flush_subnormals": {"subnormals": "flush"}}
        scale_codes = fp8_quantize(sf, "e4m3fn", preset="ocp_satfinite", **conversion[k.scale_conversion])
        sfq = code_values("e4m3fn")[scale_codes] if k.element_scale == "stored" else sf
        if k.nonfinite != "ignore_nan":  # the elements keep the finite scale, as MX's nan_scale
            nan = np.isnan(blocks) & real
            flagged = np.any(nan, axis=-1) if k.nonfinite == "nan_scale" else np.all(nan | ~real, axis=-1)
            scale_codes = np.where(flagged, np.uint8(SCALE_NAN), scale_codes).astype(np.uint8)
        if given is not None:
            other = given != scale_codes
            scale_codes = given
            sfq = np.where(other, code_values("e4m3fn")[given], sfq).astype(f32)
            sf = np.where(other, sfq, sf).astype(f32)
        decode = (f32(1) / encode).astype(f32)
        zero = (sf if k.zero_guard == "unrounded" else sfq) == 0
        out = np.where(zero, f32(0), (f32(1) / (sfq * decode).astype(f32))).astype(f32)
        if k.element_product == "source_dtype" and np.dtype(source_dtype).itemsize == 2:
            narrow = np.dtype(source_dtype)
            q = (blocks.astype(narrow) * out[..., None].astype(narrow)).astype(narrow).astype(f32)
        else:
            q = (blocks * out[..., None]).astype(f32)
    return (e2m1_codes(q, nan_element=k.nan_element, rounding=k.element_rounding, negative_zero=k.negative_zero),
            scale_codes.astype(np.uint8))


def pack(codes: np.ndarray, nibble_order: str = "low_first") -> np.ndarray:
    """Two e2m1 codes per byte along the last axis (even length): element ``2j`` in the low
    nibble of byte ``j`` (``"low_first"``) or in the high one (``"high_first"``)."""
    v.require_choice("nibble_order", nibble_order, NIBBLE_ORDERS)
    even, odd = codes[..., 0::2].astype(np.uint8), codes[..., 1::2].astype(np.uint8)
    low, high = (even, odd) if nibble_order == "low_first" else (odd, even)
    return (low | (high << 4)).astype(np.uint8)


def unpack(packed: np.ndarray, nibble_order: str = "low_first") -> np.ndarray:
    """The e2m1 codes of packed bytes, ``2 * packed.shape[-1]`` along the last axis."""
    v.require_choice("nibble_order", nibble_order, NIBBLE_ORDERS)
    low, high = packed & 0x0F, packed >> 4
    even, odd = (low, high) if nibble_order == "low_first" else (high, low)
    out = np.empty(packed.shape[:-1] + (2 * packed.shape[-1],), np.uint8)
    out[..., 0::2], out[..., 1::2] = even, odd
    return out


def dequantize_nvfp4(packed, scales, global_scale=1.0, *, block: int = BLOCK,
                     nibble_order: str = "low_first") -> np.ndarray:
    """float32 values ``e2m1(code) * e4m3fn(scale) / global_scale`` of packed NVFP4 codes
    (uint8, two per byte along the last axis) with their scale bytes (one per block); NaN in a
    block whose scale byte is NaN."""
    v.require_array("packed", packed)
    v.require_dtype("packed", packed, (np.uint8,))
    block = v.require_int("block", block, 1)
    gs = _require_global_scale(global_scale)
    if packed.ndim == 0:
        raise ValueError("packed must have at least one axis")
    codes = unpack(packed, nibble_order)
    want = codes.shape[:-1] + (-(-codes.shape[-1] // block),)
    v.require_shape("scales", scales, want, " (one e4m3fn code per block of the last axis)")
    v.require_dtype("scales", scales, (np.uint8,))
    per_element = np.repeat(code_values("e4m3fn")[scales], block, axis=-1)[..., :codes.shape[-1]]
    with np.errstate(over="ignore", invalid="ignore"):
        return (e2m1_values(codes) * per_element / np.float32(gs)).astype(np.float32)
