"""An NVFP4 oracle independent of :mod:`oracle.reference`: one block at a time in plain Python.

- e4m3fn scale bytes: ml_dtypes ``float8_e4m3fn`` after an explicit clamp to ±448 (saturating);
- e2m1 element codes: a hand-written table of the 8 magnitudes with explicit round-half-to-even
  rules (NOT ml_dtypes, so the tests can check ml_dtypes' float4 and this table against each
  other and the reference against both);
- float32 arithmetic: ``np.float32`` scalars, one rounding per operation, in the order the
  convention (docs/semantics.md, "Block-scaled formats") gives;
- packing two codes per byte by hand.

Nothing here imports the reference; tests/test_nvfp4.py compares the reference with it.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np

E2M1_MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)  # codes 0..7; code | 8 is negative
E4M3_MAX = 448.0
F32 = np.float32
ONE_SIXTH = F32(1) / F32(6)  # fl32(1/6) = 0.1666666716337204

KNOB_CHOICES = {
    "global_scale_at": ("block_scale", "input"),
    "nibble_order": ("low_first", "high_first"),
    "nan_element": ("max", "zero"),
    "nonfinite": ("ignore_nan", "nan_scale", "all_nan_scale"),
    "zero_guard": ("stored", "unrounded"),
    "element_rounding": ("nearest_even", "ties_away", "toward_zero", "ties_toward_zero"),
}
FAULT_KNOB_CHOICES = {  # bugs the reference can model: scale the elements by the unrounded sf,
    "element_scale": ("stored", "unrounded"),  # or apply gs 0 or 2 times instead of once, or 1 / gs
    "global_scale_uses": (1, 0, 2, -1),
}
DEFAULTS = {"global_scale_at": "block_scale", "nibble_order": "low_first", "nan_element": "max",
            "nonfinite": "ignore_nan", "zero_guard": "stored", "element_rounding": "nearest_even",
            "element_scale": "stored",
            "global_scale_uses": 1, "scale_conversion": "satfinite", "product_dtype": None}


def f32(value) -> np.float32:
    return np.float32(value)


def f32_from_bits(bits: int) -> float:
    return float(np.array([bits], dtype=np.uint32).view(np.float32)[0])


def e2m1_code(q: float, nan: str = "max", rounding: str = "nearest_even") -> int:
    """The e2m1 code of a float32 value: round to nearest, ties to the even code (the code whose
    mantissa bit is 0; "ties_away": to the larger magnitude; "ties_toward_zero": to the smaller),
    or toward zero ("toward_zero"),
    saturating to ±6 (inf too); NaN -> 7 ("max") or 0 ("zero"). The sign of a value that rounds
    to zero is kept (-0.25 -> code 8)."""
    if math.isnan(q):
        return 7 if nan == "max" else 0
    sign = 8 if math.copysign(1.0, q) < 0 else 0
    a = abs(q)
    code = 7  # a >= 6 (inf included) saturates
    for i in range(7):
        lo, hi = E2M1_MAGNITUDES[i], E2M1_MAGNITUDES[i + 1]
        if rounding == "toward_zero":
            if a < hi:
                code = i
                break
            continue
        mid = (lo + hi) / 2  # exact: every midpoint is a short binary fraction
        if a < mid:
            code = i
            break
        if a == mid:
            # to even: the odd codes' upper neighbours; "ties_toward_zero": never up
            up = rounding == "ties_away" or (rounding != "ties_toward_zero" and i % 2 == 1)
            if rounding == f"tie_flipped_at_{mid:g}":
                up = not up
            code = i + 1 if up else i
            break
    return sign | code


def e2m1_value(code: int) -> float:
    magnitude = E2M1_MAGNITUDES[code & 7]
    return -magnitude if code & 8 else magnitude


def e4m3_code(sf: np.float32, conversion: str = "satfinite") -> int:
    """The e4m3fn code of a float32 value >= 0. "satfinite": round to nearest even, saturating
    (inf -> 0x7E): an explicit clamp to 448, then ml_dtypes' cast. "nonsaturating": ml_dtypes'
    cast alone (NaN, 0x7F, from 464 up). "toward_zero": the largest e4m3fn value not above sf,
    found among all 127 of them (448 for anything larger). "flush_subnormals": "satfinite", then
    a subnormal code (0x01 to 0x07) made 0."""
    if conversion == "flush_subnormals":
        code = e4m3_code(sf, "satfinite")
        return 0 if code < 0x08 else code
    if conversion == "toward_zero":
        values = [e4m3_value(code) for code in range(0x7F)]
        return max((code for code, value in enumerate(values) if float(value) <= float(sf)), default=0)
    if conversion == "satfinite":
        sf = f32(min(float(sf), E4M3_MAX))
    return int(np.array([sf], dtype=np.float32).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)[0])


def e4m3_value(code: int) -> np.float32:
    return f32(np.array([code], dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)[0])


def quantize_block(block: list, gs: float, knobs: dict) -> tuple[list, int]:
    """(e2m1 codes, e4m3fn scale byte) of one block of float32 values."""
    with np.errstate(all="ignore"):
        uses = knobs["global_scale_uses"]
        encode = {0: F32(1), 1: f32(gs), 2: f32(f32(gs) * f32(gs)), -1: f32(F32(1) / f32(gs))}[uses]
        if knobs["global_scale_at"] == "input":
            values = [f32(f32(v) * encode) for v in block]
            encode = F32(1)
        else:
            values = [f32(v) for v in block]
        amax = max((abs(float(v)) for v in values if not math.isnan(v)), default=0.0)
        sf = f32(encode * f32(f32(amax) * ONE_SIXTH))
        scale = e4m3_code(sf, knobs["scale_conversion"])
        sfq = e4m3_value(scale) if knobs["element_scale"] == "stored" else sf
        guard = sf if knobs["zero_guard"] == "unrounded" else sfq  # the value tested against 0
        if float(guard) == 0:
            out = F32(0)
        else:  # input: encode is 1, so this is fl(1 / sfq)
            out = f32(F32(1) / f32(sfq * f32(F32(1) / encode)))
        narrow = knobs["product_dtype"]  # None: the float32 product; else both factors and the product in it
        products = [f32(v * out) if narrow is None else f32(narrow.type(v) * narrow.type(out)) for v in values]
        codes = [e2m1_code(float(q), knobs["nan_element"], knobs["element_rounding"]) for q in products]
    if knobs["nonfinite"] == "nan_scale" and any(math.isnan(v) for v in block):
        scale = 0x7F
    if knobs["nonfinite"] == "all_nan_scale" and all(math.isnan(v) for v in block):
        scale = 0x7F
    return codes, scale


def pack(codes: list, nibble_order: str = "low_first") -> list:
    """Two codes per byte: low_first puts the even element in the low nibble."""
    out = []
    for j in range(0, len(codes), 2):
        a, b = codes[j], codes[j + 1]
        out.append(a | (b << 4) if nibble_order == "low_first" else (a << 4) | b)
    return out


def quantize_row(row: list, gs: float, *, block: int = 16, **knobs) -> tuple[list, list]:
    """(packed bytes, scale bytes) of one row of float32 values (even length)."""
    resolved = {**DEFAULTS, **knobs}
    codes, scales = [], []
    for start in range(0, len(row), block):
        c, s = quantize_block(row[start:start + block], gs, resolved)
        codes += c
        scales.append(s)
    return pack(codes, resolved["nibble_order"]), scales


def dequantize_value(code: int, scale: int, gs: float) -> float:
    """e2m1(code) * e4m3(scale) / gs in float32 (the product is exact; the division rounds once);
    NaN for a NaN scale byte."""
    sfq = e4m3_value(scale)
    with np.errstate(all="ignore"):
        return float(f32(f32(F32(e2m1_value(code)) * sfq) / f32(gs)))
