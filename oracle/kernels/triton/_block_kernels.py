"""Triton kernels of the block-scaled KV writes (MXFP8, NVFP4): ``block_write`` and the integer
conversion helpers it is made of. The convention: oracle/reference/block_scaled.py (and mx.py,
nvfp4.py); the host wrappers: :mod:`.block_ops`.

Every format conversion here is integer arithmetic on float32 bit patterns (int32): the source
widening (float16, bfloat16), the block maxima, floor(log2) for the E8M0 exponent, and round to
nearest even into e4m3fn, e5m2 and e2m1. Triton's own fp8 casts are not used: the CPU interpreter
gets them wrong (triton#8322), and a GPU's differ by architecture. So the interpreter and a GPU
compute the same bytes, and the interpreter's are exact. The one exception is ``HW_FP8`` (the
host sets it on NVIDIA sm_89+): the fp8 roundings go through ``cvt.rn.satfinite`` by inline PTX,
whose codes are those of :func:`fp8_code` (RNE, saturating, NaN sign restored from the source)
in one instruction instead of about thirty; the integer path is what the interpreter checks
exhaustively and the GPU tests compare the two. The only float operations are the float32
products and IEEE divisions (``tl.div_rn``) that the convention itself prescribes.

Speed (what costs a GPU time here is instructions per element, not bytes): row numbers, tokens,
heads and slots are int32 unless the host says a value may pass 2**31 (``WIDE``), so their
divisions are 32-bit; offsets are formed in int64. ``WHOLE`` (D a multiple of the block) masks
loads and stores by row alone, so they stay 16-byte vectors.

NaN signs come from the source bits, never from a float result: CUDA's float arithmetic returns
the canonical NaN (sign cleared) whatever NaN goes in, while numpy (the interpreter) keeps it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._kernels import _call_is_legal, _pdl_prologue

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


@triton.jit
def _scales_are_legal(gs_ptr, gs2_ptr, gs_code, gs2_code, mailbox_ptr, report, SYS_FENCE: tl.constexpr):
    """Whether both per-tensor scales are finite float32 > 0 (by their bits: positive and below
    +inf as int32); where one is not, ``report`` (one program) writes it into the mailbox."""
    a = tl.load(gs_ptr).to(tl.int32, bitcast=True)
    b = tl.load(gs2_ptr).to(tl.int32, bitcast=True)
    ok_a = (a > 0) & (a < INF)
    ok_b = (b > 0) & (b < INF)
    if report & ((ok_a & ok_b) == 0):
        tl.store(mailbox_ptr + 1, tl.where(ok_a, gs2_code, gs_code).to(tl.int64))
        tl.store(mailbox_ptr + 2, tl.where(ok_a, b, a).to(tl.int64) & 0xFFFFFFFF)
        if SYS_FENCE:  # the host may read word 0 without synchronizing: the words before it land first
            tl.inline_asm_elementwise("fence.sc.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                      is_pure=False, pack=1)
        tl.store(mailbox_ptr, 2 + tl.zeros([], tl.int64))
    return ok_a & ok_b


@triton.jit
def _inside(d, live, blk, nb, dim, WHOLE: tl.constexpr):
    """Which elements ``d`` of the tile's rows exist (``WHOLE``, D a multiple of the block: by
    row alone, so loads and stores stay vectors)."""
    if WHOLE:
        return tl.broadcast_to((live & (blk < nb))[:, None], d.shape)
    return live[:, None] & (d < dim)


@triton.jit
def _store_nibbles(ptrs, code, keep, pair, dim, keep_blocks, PIECE: tl.constexpr, WHOLE: tl.constexpr):
    """Store e2m1 codes ``[T, PIECE]`` two to a byte (element 2k in the low nibble, 2k + 1 in the
    high one) at ``ptrs`` ``[T, PIECE // 2]``, the bytes ``pair`` of their rows."""
    low, high = tl.split(tl.reshape(code, [code.shape[0], PIECE // 2, 2]))
    if WHOLE:
        mask = keep_blocks[:, None]
    else:
        mask = keep[:, None] & (2 * pair < dim)
    tl.store(ptrs, (high * 16 + low).to(tl.uint8), mask=mask)  # the nibbles do not overlap: one multiply-add


@triton.jit
def block_write(src_ptr, src_s0, src_s1, src_s2,
                dst_ptr, dst_block_stride, dst_token_stride, dst_head_stride,
                sc_ptr, sc_block_stride, sc_token_stride, sc_head_stride,
                src2_ptr, dst2_ptr, sc2_ptr, idx_ptr, idx_stride, gs_ptr, gs2_ptr,
                n_rows, heads, dim, nb, block_size, num_slots, cp4,
                verdict_ptr, verdict_count, mailbox_ptr, arg_code, pad_code, gs_code, gs2_code,
                SRC: tl.constexpr, FMT: tl.constexpr, BLOCK: tl.constexpr, NBP: tl.constexpr,
                ROWS: tl.constexpr, HAS_INDEX: tl.constexpr, SWIZZLED: tl.constexpr,
                CHECK: tl.constexpr = 0, NEGATIVE_OK: tl.constexpr = 1, CHECK_BLOCK: tl.constexpr = 16,
                SYS_FENCE: tl.constexpr = 0, CHECK_GS: tl.constexpr = 0, WIDE: tl.constexpr = 1,
                HW_FP8: tl.constexpr = 0, WHOLE: tl.constexpr = 0, PDL: tl.constexpr = 0,
                HEADS_LOG2: tl.constexpr = -1, BS_LOG2: tl.constexpr = -1, SIDES: tl.constexpr = 1):
    """Quantize ``ROWS`` head rows (row = token * heads + head, ``n_rows`` = tokens * heads) of
    the source ``[tokens, heads, dim]`` (any strides, integer bits: see :func:`widen_bits`) per
    block of ``BLOCK`` elements (``nb`` blocks a row, ``NBP`` = nb rounded up to a power of two)
    and store the codes and the scale bytes (uint8). ``SIDES`` = 2: the program then does the
    same for ``src2`` into ``dst2`` and ``sc2`` with the global scale at ``gs2_ptr`` (V after K,
    sharing the rows' slots and cache addresses: the two sides share every stride).

    Token ``i`` goes to entry ``(slot // block_size, slot % block_size)`` of the caches, ``slot``
    = ``idx[i * idx_stride]`` (``HAS_INDEX``; else ``slot = i``); slots < 0 or >= ``num_slots``
    write nothing. The codes cache is addressed by its block, token and head strides (element
    stride 1); the scale cache likewise (``SWIZZLED`` = 0) or as one page of ``sc_block_stride``
    bytes per cache block in cuBLAS's 128x4 tiling (``cp4`` = padded columns / 4). ``FMT``: 1, 2
    MXFP8 e4m3fn, e5m2 (codes one per element); 3 NVFP4 (two per byte, even element in the low
    nibble; the global scale at ``gs_ptr``).

    The tile is ``[ROWS * NBP, BLOCK]``: tile row ``t`` is block ``t % NBP`` of head row
    ``t // NBP``, so each block's maximum is one ``tl.max`` along axis 1. A tile with no NaN and
    no inf takes the plain maxima and conversions without NaN handling; one with either, the
    special-value path (the same bytes: only the work differs).

    Validation on the device, before any store (``oracle.kernels._deferred``): ``CHECK`` as the
    other writers' (:func:`._kernels._call_is_legal`: every slot of the call legal, or nothing is
    stored and program 0 leaves the first illegal entry in the mailbox); ``CHECK_GS``: both
    per-tensor scales (``gs_ptr`` and ``gs2_ptr``) finite and > 0, or nothing is stored and
    program 0 leaves the bad one in the mailbox. ``PDL``: launched with programmatic dependent
    launch (:func:`._kernels._pdl_prologue`); after a check grid (``CHECK == 2``, which lets this
    grid launch only once the kernels before it have completed) the slots, the first side's
    sources and scale are loaded and its codes computed before the wait: only the checks' verdicts
    and the stores wait. ``HEADS_LOG2``, ``BS_LOG2``: log2 of ``heads`` and ``block_size`` where
    they are powers of two (shifts instead of divisions), else -1."""
    first_program = tl.program_id(0) == 0
    if CHECK != 2:
        _pdl_prologue(PDL)
    t = tl.arange(0, ROWS * NBP)
    if WIDE:
        row = tl.program_id(0).to(tl.int64) * ROWS + t // NBP
    else:  # the host saw every row number and slot below 2**31: int32 divisions (far cheaper)
        row = tl.program_id(0) * ROWS + t // NBP
    blk = t % NBP
    live = row < n_rows
    if HEADS_LOG2 >= 0:
        token = row >> HEADS_LOG2
    else:
        token = row // heads
    head = row - token * heads
    token64, head64 = token.to(tl.int64), head.to(tl.int64)  # every offset below is 64-bit
    if HAS_INDEX:
        slot = tl.load(idx_ptr + token64 * idx_stride, mask=live, other=-1).to(tl.int64)
    else:
        slot = token64
    keep = live & (slot >= 0) & (slot < num_slots)  # and, below, every slot and scale of the call legal
    if WIDE:
        s = slot
    else:  # a slot that is not kept is never stored: 0 stands in for it
        s = tl.where(keep, slot, 0).to(tl.int32)
    if BS_LOG2 >= 0:
        cache_block = s >> BS_LOG2
    else:
        cache_block = s // block_size
    cache_token = (s - cache_block * block_size).to(tl.int32)  # int32: the swizzled row below
    cache_block, cache_token64 = cache_block.to(tl.int64), cache_token.to(tl.int64)
    src_off = (token64 * src_s0 + head64 * src_s1)[:, None]
    dst_off = (cache_block * dst_block_stride + cache_token64 * dst_token_stride + head64 * dst_head_stride)[:, None]
    if SWIZZLED:
        r = cache_token * heads + head  # the page's scale matrix: row r, column blk
        within = ((r // 128) * cp4 + blk // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + blk % 4
        sc_off = cache_block * sc_block_stride + within
    else:
        sc_off = cache_block * sc_block_stride + cache_token64 * sc_token_stride + head64 * sc_head_stride + blk
    # NVFP4 loads each block as two halves, each its own tensor, so that one thread holds a whole
    # block (its maximum, scale and packing stay in the thread); MXFP8 as one piece
    PIECE: tl.constexpr = BLOCK // 2 if FMT == 3 else BLOCK
    d = blk[:, None] * BLOCK + tl.arange(0, PIECE)[None, :]  # the block's first piece; the second is d + PIECE
    for side in tl.static_range(SIDES):
        if side == 0:
            src, dst, sc, gs = src_ptr + src_off, dst_ptr + dst_off, sc_ptr + sc_off, gs_ptr
        else:
            src, dst, sc, gs = src2_ptr + src_off, dst2_ptr + dst_off, sc2_ptr + sc_off, gs2_ptr
        byte, code, code2 = _quantize_tile(src, gs, d, live, blk, nb, dim, src_s2, SRC, FMT, PIECE, WHOLE, HW_FP8)
        if side == 0:
            if CHECK == 2:  # everything above read only what the check grid made final
                _pdl_prologue(PDL)
            legal = tl.program_id(0) >= 0  # a scalar True
            if CHECK != 0:
                legal = _call_is_legal(idx_ptr, idx_stride, n_rows // heads, num_slots, verdict_ptr, verdict_count,
                                       mailbox_ptr, arg_code, pad_code, -1, first_program, CHECK, NEGATIVE_OK,
                                       CHECK_BLOCK, SYS_FENCE)
                keep = keep & legal
            if CHECK_GS:
                keep = keep & _scales_are_legal(gs_ptr, gs2_ptr, gs_code, gs2_code, mailbox_ptr,
                                                first_program & legal, SYS_FENCE)
            keep_blocks = keep & (blk < nb)  # the blocks whose scale byte is stored
        if FMT == 3:
            pair = blk[:, None] * (BLOCK // 2) + tl.arange(0, PIECE // 2)[None, :]  # the first piece's bytes
            _store_nibbles(dst + pair, code, keep, pair, dim, keep_blocks, PIECE, WHOLE)
            _store_nibbles(dst + pair + PIECE // 2, code2, keep, pair + PIECE // 2, dim, keep_blocks, PIECE, WHOLE)
        else:
            if WHOLE:
                keep_elements = keep_blocks[:, None]
            else:
                keep_elements = keep[:, None] & (d < dim)
            tl.store(dst + d, code, mask=keep_elements)
        tl.store(sc, byte.to(tl.uint8), mask=keep_blocks)


@triton.jit
def _quantize_tile(src, gs_ptr, d, live, blk, nb, dim, src_s2, SRC: tl.constexpr, FMT: tl.constexpr,
                   PIECE: tl.constexpr, WHOLE: tl.constexpr, HW_FP8: tl.constexpr):
    """(scale bytes ``[T]``, codes, codes of the second pieces (NVFP4; else the codes again)) of
    the tile whose rows start at ``src`` ``[T, 1]`` (pointers), its blocks' first pieces at
    columns ``d`` (the second, NVFP4's, at ``d + PIECE``)."""
    raw = tl.load(src + d * src_s2, mask=_inside(d, live, blk, nb, dim, WHOLE), other=0)
    bits = widen_bits(raw, SRC)  # masked lanes are +0: they move no maximum
    mag = bits & MAG
    top = tl.max(mag, axis=1)  # each block's largest magnitude, NaN and inf included (their bits are larger)
    if FMT == 3:
        raw2 = tl.load(src + (d + PIECE) * src_s2, mask=_inside(d + PIECE, live, blk, nb, dim, WHOLE), other=0)
        bits2 = widen_bits(raw2, SRC)
        mag2 = bits2 & MAG
        top = tl.maximum(top, tl.max(mag2, axis=1))
        gs = tl.load(gs_ptr)
        # a NaN or an inf in the tile: the maxima skip NaN (inf counts), and an inf element times a
        # zero quotient (a scale saturated by a tiny global scale) is a NaN element
        if tl.max(top, axis=0) >= INF:
            amax = tl.maximum(tl.max(tl.where(mag <= INF, mag, 0), axis=1), tl.max(tl.where(mag2 <= INF, mag2, 0), axis=1))
            byte, code, code2 = nvfp4_codes(bits, bits2, amax, gs, HW_FP8, 0)
        else:
            byte, code, code2 = nvfp4_codes(bits, bits2, top, gs, HW_FP8, 1)
    else:
        if tl.max(top, axis=0) >= INF:  # a NaN or an inf in the tile: maxima over the finite elements
            byte, code = mx_codes(bits, tl.max(tl.where(mag < INF, mag, 0), axis=1), FMT, HW_FP8, 0)
            byte = tl.where(top >= INF, 255, byte)
        else:
            byte, code = mx_codes(bits, top, FMT, HW_FP8, 1)
        code2 = code
    return byte, code, code2
