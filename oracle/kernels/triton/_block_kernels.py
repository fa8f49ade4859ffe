"""The Triton kernel of the block-scaled KV writes (MXFP8, NVFP4): ``block_write``, made of the
conversions in :mod:`._block_codes` (re-exported here). The convention:
oracle/reference/block_scaled.py; the host wrappers: :mod:`.block_ops`.

Speed (what costs a GPU time here is instructions per element, not bytes): row numbers, tokens,
heads and slots are int32 unless the host says a value may pass 2**31 (``WIDE``), so their
divisions are 32-bit (shifts where heads and the block size are powers of two); offsets are formed
in int64. ``WHOLE`` (D a multiple of the block) masks loads and stores by row alone, so they stay
16-byte vectors. A tile with no NaN and no inf takes the plain path (maxima without filtering,
fp8 codes four to a pair of conversions, e2m1 without the NaN select): ``python
benchmarks/sass_count.py`` counts its instructions per element without a GPU.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._block_codes import (FMT_E4M3FN, FMT_E5M2, FMT_NVFP4, INF, MAG, SRC_BF16, SRC_F16, SRC_F32,  # noqa: F401
                           e2m1_code, e4m3_value, floor_log2, fp8_code, fp8_code_hw, fp8_codes_hw_finite,
                           mx_codes, mx_scale, nvfp4_codes, nvfp4_scale, round_magnitude, widen_bits)
from ._kernels import _call_is_legal, _pdl_prologue, _publish, prefetch_l2_at


@triton.jit
def _scales_are_legal(a, b, gs_code, gs2_code, mailbox_ptr, report, SYS_FENCE: tl.constexpr):
    """Whether both per-tensor scales, as int32 bits ``a`` and ``b``, are finite float32 > 0
    (positive and below +inf as int32); where one is not, ``report`` (one program) writes it into
    the mailbox."""
    ok_a = (a > 0) & (a < INF)
    ok_b = (b > 0) & (b < INF)
    if report & ((ok_a & ok_b) == 0):
        tl.store(mailbox_ptr + 1, tl.where(ok_a, gs2_code, gs_code).to(tl.int64))
        tl.store(mailbox_ptr + 2, tl.where(ok_a, b, a).to(tl.int64) & 0xFFFFFFFF)
        _publish(mailbox_ptr, 2, SYS_FENCE)
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
                HEADS_LOG2: tl.constexpr = -1, BS_LOG2: tl.constexpr = -1, SIDES: tl.constexpr = 1,
                PREFETCH: tl.constexpr = 0):
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
    launch (:func:`._kernels._pdl_prologue`: nothing is loaded before the wait, as a check grid
    may let this grid launch while the kernels before it still run). ``HEADS_LOG2``,
    ``BS_LOG2``: log2 of ``heads`` and ``block_size`` where they are powers of two (shifts instead
    of divisions), else -1.
    ``PREFETCH`` (under ``PDL``): before the wait, ask the L2 for every side's source blocks that
    the program reads after it, so that those loads find them there."""
    first_program = tl.program_id(0) == 0
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
    src_off = (token64 * src_s0 + head64 * src_s1)[:, None]
    if PREFETCH & PDL:
        _prefetch_blocks(src_ptr + src_off, blk, live & (blk < nb), src_s2, SRC, BLOCK)
        if SIDES == 2:
            _prefetch_blocks(src2_ptr + src_off, blk, live & (blk < nb), src_s2, SRC, BLOCK)
    _pdl_prologue(PDL)
    if HAS_INDEX:
        slot = tl.load(idx_ptr + token64 * idx_stride, mask=live, other=-1).to(tl.int64)
    else:
        slot = token64
    keep = live & (slot >= 0) & (slot < num_slots)  # and, below, every slot and scale of the call legal
    if CHECK_GS:  # loaded with the slots, judged with the slot check
        gs_bits = tl.load(gs_ptr).to(tl.int32, bitcast=True)
        gs2_bits = tl.load(gs2_ptr).to(tl.int32, bitcast=True)
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
            legal = tl.program_id(0) >= 0  # a scalar True
            if CHECK != 0:
                legal = _call_is_legal(idx_ptr, idx_stride, n_rows // heads, num_slots, verdict_ptr, verdict_count,
                                       mailbox_ptr, arg_code, pad_code, -1, first_program, CHECK, NEGATIVE_OK,
                                       CHECK_BLOCK, SYS_FENCE)
                keep = keep & legal
            if CHECK_GS:
                keep = keep & _scales_are_legal(gs_bits, gs2_bits, gs_code, gs2_code, mailbox_ptr,
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
def _prefetch_blocks(rows, blk, live, src_s2, SRC: tl.constexpr, BLOCK: tl.constexpr):
    """Ask the L2 for the source blocks ``blk`` of ``rows`` ``[T, 1]`` (pointers): one
    ``prefetch.global.L2`` per 32-byte sector of each block. A hint that changes no value any load
    returns, so it may run before the PDL wait; a block not ``live`` asks for its row's first."""
    ELEMENTS: tl.constexpr = 32 // (4 if SRC == 0 else 2)  # source elements per sector
    SECTORS: tl.constexpr = max(1, BLOCK // ELEMENTS)
    col = tl.where(live, blk * BLOCK, 0)[:, None] + (tl.arange(0, SECTORS) * ELEMENTS)[None, :]
    prefetch_l2_at(rows + col.to(tl.int64) * src_s2)


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
