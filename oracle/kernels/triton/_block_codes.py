"""The format conversions of the block-scaled Triton writers (MXFP8, NVFP4), as ``@triton.jit``
helpers: source widening, block maxima to E8M0 and e4m3 scales, and codes in e4m3fn, e5m2 and
e2m1. The convention: oracle/reference/block_scaled.py (and mx.py, nvfp4.py); the kernel that
uses them: :mod:`._block_kernels`.

Every conversion here is exact on Triton's CPU interpreter: integer arithmetic on float32 bit
patterns (int32) for the source widening (float16, bfloat16), the block maxima, floor(log2) for
the E8M0 exponent and round to nearest even into e4m3fn and e5m2; for e2m1, float32 operations
that are exact or round exactly as the format does (min, max, and one addition whose rounding is
the format's, :func:`e2m1_code`); and the float32 products and IEEE divisions (``tl.div_rn``)
the convention itself prescribes. Triton's own fp8 casts are not used: the CPU interpreter gets
them wrong (triton#8322), and a GPU's differ by architecture. So the interpreter and a GPU compute
the same bytes, and the interpreter's are exact. The one exception is ``HW_FP8`` (the host sets it
on NVIDIA sm_89+): the fp8 roundings go through ``cvt.rn.satfinite`` by inline PTX, whose codes
are those of :func:`fp8_code` (RNE, saturating, NaN sign restored from the source) in one
instruction instead of about thirty, and e2m1's sign goes in by one ``lop3``; the integer path is
what the interpreter checks exhaustively, and the GPU tests compare the two.

NaN signs come from the source bits, never from a float result: CUDA's float arithmetic returns
the canonical NaN (sign cleared) whatever NaN goes in, while numpy (the interpreter) keeps it.
"""

from __future__ import annotations

import triton
import triton.language as tl

FMT_E4M3FN, FMT_E5M2, FMT_NVFP4 = 1, 2, 3  # the FMT constexpr of block_write
SRC_F32, SRC_F16, SRC_BF16 = 0, 1, 2  # the SRC constexpr: how the source's integer bits widen

MAG = tl.constexpr(0x7FFFFFFF)  # float32 bits with the sign cleared (a jit function reads only constexpr globals)
INF = tl.constexpr(0x7F800000)  # float32 +inf; magnitudes above it are NaN


@triton.jit
def widen_bits(raw, SRC: tl.constexpr):
    """float32 bit patterns (int32) of source elements loaded as integers: ``SRC_F32`` int32
    bits as they are, ``SRC_BF16`` and ``SRC_F16`` int16 bits, widened exactly (NaN payload and
    sign kept; float16 subnormals normalized)."""
    if SRC == 0:
        bits = raw.to(tl.int32)
    elif SRC == 2:
        bits = (raw.to(tl.int32) & 0xFFFF) << 16  # bfloat16 is the top half of a float32
    else:
        h = raw.to(tl.int32) & 0xFFFF
        sign = (h >> 15) << 31
        e = (h >> 10) & 0x1F
        m = h & 0x3FF
        normal = ((e + 112) << 23) | (m << 13)  # rebias 15 -> 127
        special = INF | (m << 13)  # inf, NaN (payload kept)
        # subnormal: m * 2**-24, a normal float32; the int -> float conversion is exact (m < 2**10)
        sub = (m.to(tl.float32) * 5.9604644775390625e-08).to(tl.int32, bitcast=True)
        bits = tl.where(e == 0, sub, tl.where(e == 31, special, normal)) | sign
    return bits


@triton.jit
def round_magnitude(mag, MANT: tl.constexpr, BIAS: tl.constexpr, MAX_CODE: tl.constexpr):
    """The magnitude code (int32) of float32 magnitudes ``mag`` (int32 bits, sign cleared) in a
    format of ``MANT`` mantissa bits and exponent bias ``BIAS``: round to nearest, ties to even,
    from the exact value (float32 subnormals included), overflow decided after rounding and
    saturated to ``MAX_CODE``; inf gives ``MAX_CODE`` too, NaN is the caller's to override.
    (oracle.reference.rounding.round_float32 in int32.)"""
    biased = mag >> 23
    significand = (mag & 0x7FFFFF) | tl.where(biased != 0, 0x800000, 0)
    exponent = tl.maximum(biased, 1) - 127  # float32 subnormals share the smallest normal's
    quantum = tl.maximum(exponent, 1 - BIAS)  # the target's subnormals share its smallest normal's
    # past 25 every shift rounds a 24-bit significand to zero; the clamp keeps shifts < 32 (defined)
    shift = tl.minimum(23 - MANT + (quantum - exponent), 25)
    kept = significand >> shift
    remainder = significand & ((1 << shift) - 1)
    half = 1 << (shift - 1)
    up = (remainder > half) | ((remainder == half) & ((kept & 1) == 1))
    # a carry out of the mantissa lands in the exponent field by plain addition
    code = ((quantum + BIAS - 1) << MANT) + kept + up.to(tl.int32)
    return tl.minimum(code, MAX_CODE)


@triton.jit
def fp8_code(bits, sign_bits, FMT: tl.constexpr):
    """Saturating RNE fp8 codes (int32, 0..255) of float32 ``bits``: ``FMT`` 1 e4m3fn (±448,
    0x7E/0xFE), 2 e5m2 (±57344, 0x7B/0xFB); finite overflow and inf -> ±max, NaN -> 0x7F with
    the sign bit of ``sign_bits`` (the source element's bits: see the module docstring)."""
    mag = bits & MAG
    if FMT == 1:
        code = round_magnitude(mag, 3, 7, 0x7E)
    else:
        code = round_magnitude(mag, 2, 15, 0x7B)
    code = tl.where(mag > INF, 0x7F, code)
    return code | ((sign_bits >> 24) & 0x80)  # arithmetic shift: bit 31 lands in bit 7


@triton.jit
def e2m1_code(bits, FINITE: tl.constexpr = 0, ASM: tl.constexpr = 0):
    """e2m1 codes (int32, 0..15) of float32 ``bits``: RNE on 0, 0.5, 1, 1.5, 2, 3, 4, 6,
    saturating to ±6 (code 7 | sign), inf -> ±6, NaN -> 7 (+6, whatever its sign), -0 -> 8.

    The float adder rounds: the magnitude, clamped to 6 as bits (so inf and NaN clamp too), is
    added to ``magic`` = 2**22 times the power of two of its binade (1 below 2), whose unit in
    the last place is then the e2m1 quantum there (0.5 below 2, 1 in [2, 4), 2 in [4, 6]); the
    sum, rounded to nearest even, counts quanta in its low bits. Consecutive e2m1 codes of a
    binade step one quantum and alternate parity with the count, so the addition's tie to even
    is the format's, and the code is that count plus the codes below the binade (0, 2 or 4),
    which ``magic`` carries in its last places (they are whole quanta, so the rounding is unchanged).
    ``FINITE``: the caller knows no element is NaN (inf is fine), and the NaN test is left out.
    ``ASM``: inline PTX allowed (an NVIDIA GPU, not the interpreter)."""
    # the sign bit lands in bit 3 (bits 0-2 hold exponent bits, which the code's replace); a
    # high multiply, so the shift runs beside the integer logic (on the multiply-add units)
    sign = tl.umulhi(bits.to(tl.uint32, bitcast=True), 16).to(tl.int32, bitcast=True)
    if FINITE:  # float min and max: |x| and the clamps in one instruction each
        m = tl.minimum(tl.abs(bits.to(tl.float32, bitcast=True)), 6.0)
        return _e2m1_code_of(m, tl.maximum(m, 1.0).to(tl.int32, bitcast=True) >> 23, sign, ASM)
    mag = bits & MAG  # integer min and max, under which NaN clamps to 6 as inf does
    m = tl.minimum(mag, 0x40C00000)  # 6.0
    code = _e2m1_code_of(m.to(tl.float32, bitcast=True), tl.maximum(m, 0x3F800000) >> 23, sign, ASM)
    return tl.where(mag > INF, 7, code)


@triton.jit
def _e2m1_code_of(m, e, sign, ASM: tl.constexpr):
    """The e2m1 code of float32 magnitude ``m`` in [0, 6] whose binade's biased exponent is ``e``
    (127 below 2, 128 or 129), with the sign in bit 3 of ``sign`` (bits 4 and up clear): 2**22
    times the binade, plus the codes below it (0, 2 or 4) in its last places, is ``e * (2**23 +
    2)`` plus a constant (one multiply-add); added to m, the sum's low three bits are the
    magnitude's code, and one three-input logic operation puts the sign beside them (``ASM``:
    written as that ``lop3``, which the compiler does not find by itself)."""
    magic = e * 0x800002 + ((22 << 23) - 254)  # at e = 127: 0x3F800000 + 254 + that = 2**22's bits
    total = (m + magic.to(tl.float32, bitcast=True)).to(tl.int32, bitcast=True)
    if ASM:
        return tl.inline_asm_elementwise("lop3.b32 $0, $1, $2, 7, 0xE4;", "=r,r,r", [total, sign],
                                         dtype=tl.int32, is_pure=True, pack=1)  # (total & 7) | (sign & ~7)
    return (total & 7) | (sign & ~7)


@triton.jit
def fp8_code_hw(q, sign_bits, FMT: tl.constexpr):
    """``fp8_code`` by the GPU's own conversion (sm_89 and later: ``cvt.rn.satfinite``): RNE,
    finite overflow and inf to ±max, NaN to 0x7F, whose sign then comes from ``sign_bits`` (every
    other code already carries the sign of ``q``, which is that of the source). Bit for bit
    :func:`fp8_code`; one instruction instead of its integer rounding."""
    if FMT == 1:
        code = tl.inline_asm_elementwise(
            "{ .reg .b16 h; cvt.rn.satfinite.e4m3x2.f32 h, 0f00000000, $1; cvt.u32.u16 $0, h; }",
            "=r,r", [q], dtype=tl.int32, is_pure=True, pack=1)
    else:
        code = tl.inline_asm_elementwise(
            "{ .reg .b16 h; cvt.rn.satfinite.e5m2x2.f32 h, 0f00000000, $1; cvt.u32.u16 $0, h; }",
            "=r,r", [q], dtype=tl.int32, is_pure=True, pack=1)
    return code | ((sign_bits >> 24) & 0x80)


@triton.jit
def fp8_codes_hw_finite(q, FMT: tl.constexpr):
    """uint8 fp8 codes of float32 ``q`` with no NaN (inf is fine) by the GPU's conversion
    (sm_89+), four elements per ``cvt.rn.satfinite`` pair: the codes of :func:`fp8_code` (a NaN's
    sign, which the hardware drops, is the one thing this cannot carry)."""
    if FMT == 1:
        return tl.inline_asm_elementwise(
            "{ .reg .b16 lo, hi; cvt.rn.satfinite.e4m3x2.f32 lo, $2, $1; cvt.rn.satfinite.e4m3x2.f32 hi, $4, $3; "
            "mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [q], dtype=tl.uint8, is_pure=True, pack=4)
    return tl.inline_asm_elementwise(
        "{ .reg .b16 lo, hi; cvt.rn.satfinite.e5m2x2.f32 lo, $2, $1; cvt.rn.satfinite.e5m2x2.f32 hi, $4, $3; "
        "mov.b32 $0, {lo, hi}; }", "=r,r,r,r,r", [q], dtype=tl.uint8, is_pure=True, pack=4)


@triton.jit
def e4m3_value(code):
    """float32 value of non-negative e4m3fn codes (int32, 0..0x7E): exact."""
    e = code >> 3
    m = code & 7
    normal = (((e + 120) << 23) | (m << 20)).to(tl.float32, bitcast=True)  # rebias 7 -> 127
    sub = m.to(tl.float32) * 0.001953125  # m * 2**-9, exact
    return tl.where(e == 0, sub, normal)


@triton.jit
def floor_log2(mag):
    """floor(log2(v)) (int32) of positive finite float32 magnitudes (int32 bits): the exponent
    field, or for a subnormal (v = m * 2**-149) that of float32(m), exact since m < 2**23."""
    biased = mag >> 23
    sub = ((mag.to(tl.float32).to(tl.int32, bitcast=True) >> 23) - 127) - 149
    return tl.where(biased != 0, biased - 127, sub)


@triton.jit
def mx_scale(amax, FMT: tl.constexpr):
    """(E, scale byte) of blocks whose largest finite magnitude is ``amax`` (float32 bits):
    E = floor(log2(amax)) - emax_elem, clamped to [-127, 127], -127 for amax == 0; the byte is
    E + 127 (the caller makes it 0xFF, NaN, where the block holds a NaN or an inf)."""
    if FMT == 1:
        e = floor_log2(tl.maximum(amax, 1)) - 8
    else:
        e = floor_log2(tl.maximum(amax, 1)) - 15
    e = tl.where(amax > 0, tl.minimum(tl.maximum(e, -127), 127), -127)
    return e, e + 127


@triton.jit
def nvfp4_scale(amax, gs, HW_FP8: tl.constexpr = 0):
    """(scale byte, out) of blocks whose largest non-NaN magnitude is ``amax`` (float32 bits; inf
    counts) with the float32 global scale ``gs`` (> 0, finite): sf = fl32(gs * fl32(amax *
    fl32(1/6))), the byte its saturating RNE e4m3fn code (sf >= 448 and inf -> 0x7E), sfq that
    code's value, out = sfq == 0 ? 0 : fl32(1 / fl32(sfq * fl32(1 / gs)))."""
    sixth = tl.full([], 0x3E2AAAAB, tl.int32).to(tl.float32, bitcast=True)  # fl32(1/6), exactly
    sf = gs * (amax.to(tl.float32, bitcast=True) * sixth)
    if HW_FP8:  # sf is never NaN (NaNs move no maximum) nor negative: the code is the magnitude's
        byte = fp8_code_hw(sf.to(tl.int32, bitcast=True), 0, 1)
    else:
        byte = round_magnitude(sf.to(tl.int32, bitcast=True) & MAG, 3, 7, 0x7E)
    sfq = e4m3_value(byte)
    denominator = sfq * tl.div_rn(1.0 + tl.zeros_like(gs), gs)
    # the division by a zero scale is never taken (numpy would warn): its lanes divide by 1
    out = tl.div_rn(1.0 + tl.zeros_like(sfq), tl.where(sfq == 0, 1.0, denominator))
    return byte, tl.where(sfq == 0, 0.0, out)


@triton.jit
def nvfp4_codes(bits, bits2, amax, gs, HW_FP8: tl.constexpr, FINITE: tl.constexpr):
    """(scale bytes ``[T]``, e2m1 codes of ``bits`` and of ``bits2``) of blocks made of two pieces
    (float32 bits ``[T, P]`` each) whose largest non-NaN magnitudes are ``amax``; ``FINITE``:
    every element is finite, so no quotient is NaN (a zero scale's quotients are 0; an
    overflowing one is inf, which saturates)."""
    byte, out = nvfp4_scale(amax, gs, HW_FP8)
    q = bits.to(tl.float32, bitcast=True) * out[:, None]
    q2 = bits2.to(tl.float32, bitcast=True) * out[:, None]
    return (byte, e2m1_code(q.to(tl.int32, bitcast=True), FINITE, HW_FP8),
            e2m1_code(q2.to(tl.int32, bitcast=True), FINITE, HW_FP8))


@triton.jit
def mx_codes(bits, amax, FMT: tl.constexpr, HW_FP8: tl.constexpr, FINITE: tl.constexpr):
    """(scale bytes ``[T]`` before the NaN marking, uint8 fp8 codes ``[T, BLOCK]``) of the blocks
    ``bits`` (float32 bits) whose largest finite magnitudes are ``amax``; ``FINITE``: no element
    is NaN or inf."""
    e, byte = mx_scale(amax, FMT)
    factor = ((127 - e) << 23).to(tl.float32, bitcast=True)  # 2**-E: normal, E in [-127, 119]
    # fl32(x * 2**-E), as the reference: exact but for float32-subnormal quotients, which are fp8
    # zeros however they round
    q = bits.to(tl.float32, bitcast=True) * factor[:, None]
    if HW_FP8:
        if FINITE:
            code = fp8_codes_hw_finite(q, FMT)
        else:
            code = fp8_code_hw(q.to(tl.int32, bitcast=True), bits, FMT).to(tl.uint8)
    else:
        code = fp8_code(q.to(tl.int32, bitcast=True), bits, FMT).to(tl.uint8)
    return byte, code
