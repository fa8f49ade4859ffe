"""The Triton kernels behind :mod:`oracle.kernels.triton.ops` (imported only when triton is).

Three kernels cover the six ops:

- ``paged_write``: rows ``[N, H, D]`` (any strides) to ``cache[slot // bs, slot % bs, h, d]``
  (any strides), copied or quantized to fp8. ``store_cache`` is the case ``bs = 1``,
  ``reshape_and_cache_flash`` the paged case (NHD or HND: only the strides differ) and
  ``quantize_fp8`` the case without an index (row ``i`` goes to slot ``i``).
- ``mla_write``: two sources concatenated into one row (``nope | rope``), copied or quantized:
  ``set_mla_kv_buffer`` (``bs = 1``) and ``concat_and_cache_mla``.
- ``translate``: ``mapping[loc]`` over a strided ``loc`` of up to four dims, ``-1`` -> ``-1``.

Every offset is computed in int64: slots, row numbers and strides are widened before they are
multiplied, so a cache whose offsets pass 2**31 elements is addressed correctly. A program copies
a tile of ``BLOCK_N`` rows by ``BLOCK_R`` row elements (MLA: ``BLOCK_A`` + ``BLOCK_B``, one tile
per part); the host picks the tile and the warps (few, large tiles under the interpreter, where
every program is one Python call).

Slots outside ``[0, num_slots)`` are never written: the mask drops them (negative padding, and
anything an unvalidated call passes). ``HAS_PAD_SLOT`` also skips slot ``pad_slot`` (padding
``reserved:K``).

Validation happens on the device (``CHECK``), so a validating call never synchronizes the host:
before any store, the writer decides whether every slot of the call is legal (``< num_slots``, and
``>= 0`` unless ``NEGATIVE_OK``), and if one is not, no program stores anything and program 0
writes the first illegal entry into the host-mapped mailbox (:mod:`oracle.kernels._deferred`).
``CHECK == 1``: every program scans the whole index itself (small N: one launch, no communication
between programs). ``CHECK == 2``: :func:`check_slots` ran first and left each chunk's first
illegal entry in ``verdict``; the writer, launched with programmatic dependent launch after it,
reads those few words after ``griddepcontrol.wait``. The check grid lets the writer launch at
once, before its own wait (``_validate.CHECK_EARLY``; else after it), so the writer is scheduled
and asks the L2 for its sources while the kernels before the check still run, as an unchecked
writer does after the writer before it; like every writer, it loads nothing before its wait.
"""

from __future__ import annotations

import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

FP8_NONE, FP8_E4M3FN, FP8_E5M2 = 0, 1, 2


@triton.jit
def _slots(idx_ptr, idx_stride, rows, row_mask, num_slots, pad_slot,
           HAS_INDEX: tl.constexpr, HAS_PAD_SLOT: tl.constexpr):
    """(slot, keep) of ``rows``: the int64 slots and which of them to write."""
    rows64 = rows.to(tl.int64)
    if HAS_INDEX:
        slot = tl.load(idx_ptr + rows64 * idx_stride, mask=row_mask, other=-1).to(tl.int64)
    else:
        slot = rows64
    keep = row_mask & (slot >= 0) & (slot < num_slots)
    if HAS_PAD_SLOT:
        keep = keep & (slot != pad_slot)
    return slot, keep


@triton.jit
def _first_illegal(idx_ptr, idx_stride, start, end, sentinel, num_slots,
                   NEGATIVE_OK: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr,
                   copy_ptr, COPY: tl.constexpr):
    """The first entry in ``[start, end)`` of the index whose slot is illegal (``>= num_slots``,
    or ``< 0`` unless ``NEGATIVE_OK``), as int64; ``sentinel`` if none is. ``STEPS * BLOCK``
    must reach ``end - start`` (a loop with a constant trip count: the CPU interpreter cannot
    loop to a run-time bound). ``COPY``: also store each entry, as loaded, at ``copy_ptr[r]``."""
    first = sentinel + tl.zeros([], tl.int64)
    for step in range(STEPS):
        r = start + step * BLOCK + tl.arange(0, BLOCK).to(tl.int64)
        inside = r < end
        loaded = tl.load(idx_ptr + r * idx_stride, mask=inside, other=0)
        if COPY:
            tl.store(copy_ptr + r, loaded, mask=inside)
        slot = loaded.to(tl.int64)
        legal = slot < num_slots
        if not NEGATIVE_OK:
            legal = legal & (slot >= 0)
        bad = inside & (legal == 0)
        first = tl.minimum(first, tl.min(tl.where(bad, r, sentinel), axis=0))
    return first


@triton.jit
def _publish(mailbox_ptr, kind, SYS_FENCE: tl.constexpr):
    """Set the mailbox's word 0 to ``kind`` (:mod:`oracle.kernels._deferred`: 1 a slot, 2 a scale)
    after the words that describe the error, which the caller has stored."""
    if SYS_FENCE:  # the host may read word 0 without synchronizing: the words before it land first
        tl.inline_asm_elementwise("fence.sc.sys;\n\tmov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)
    tl.store(mailbox_ptr, kind + tl.zeros([], tl.int64))


@triton.jit
def _call_is_legal(idx_ptr, idx_stride, n, num_slots, verdict_ptr, verdict_count, mailbox_ptr, arg_code,
                   pad_code, pad_slot, is_first_program, CHECK: tl.constexpr, NEGATIVE_OK: tl.constexpr,
                   CHECK_BLOCK: tl.constexpr, SYS_FENCE: tl.constexpr):
    """Whether every slot of the call is legal (see the module docstring for ``CHECK``; under
    ``CHECK == 1``, ``CHECK_BLOCK >= n``); where one is not, ``is_first_program`` records the first illegal entry in the mailbox."""
    if CHECK == 1:
        first = _first_illegal(idx_ptr, idx_stride, 0, n, n, num_slots, NEGATIVE_OK, CHECK_BLOCK, 1, idx_ptr, False)
    else:
        part = tl.arange(0, CHECK_BLOCK)
        first = tl.min(tl.load(verdict_ptr + part, mask=part < verdict_count, other=n).to(tl.int64), axis=0)
    if (first < n) & is_first_program:
        value = tl.load(idx_ptr + first * idx_stride).to(tl.int64)
        tl.store(mailbox_ptr + 1, first)
        tl.store(mailbox_ptr + 2, value)
        tl.store(mailbox_ptr + 3, num_slots + tl.zeros([], tl.int64))
        tl.store(mailbox_ptr + 4, arg_code + tl.zeros([], tl.int64))
        tl.store(mailbox_ptr + 5, pad_code + tl.zeros([], tl.int64))
        tl.store(mailbox_ptr + 6, pad_slot + tl.zeros([], tl.int64))
        _publish(mailbox_ptr, 1, SYS_FENCE)
    return first >= n


INF_BITS = tl.constexpr(0x7F800000)  # +inf as int32: a float32 > 0 and finite has bits in (0, INF_BITS)


@triton.jit
def _scales_are_legal(a_ptr, a_stride, a_count, a_code, b_ptr, b_stride, b_count, b_code, mailbox_ptr, report,
                      BLOCK: tl.constexpr, SYS_FENCE: tl.constexpr):
    """Whether every element of the call's two scales (``a_count`` float32 at ``a_stride``, and
    ``b``'s; one scale passes itself twice) is finite and > 0. Where one is not, ``report`` (one
    program) writes the first bad element of the scale with the lower argument code into the
    mailbox (:mod:`oracle.kernels._deferred`: ``[1]`` the code, ``[2]`` the float32 bits, ``[3]``
    the element, ``[4]`` the scale's length), so every launch of a call reports the same one.
    ``BLOCK`` >= both counts."""
    h = tl.arange(0, BLOCK)
    a = tl.load(a_ptr + h * a_stride, mask=h < a_count, other=1.0).to(tl.int32, bitcast=True)
    b = tl.load(b_ptr + h * b_stride, mask=h < b_count, other=1.0).to(tl.int32, bitcast=True)
    # as int32, a negative float (-0 too) is < 0, +0 is 0, and NaN or +inf is >= INF_BITS
    first_a = tl.min(tl.where((a <= 0) | (a >= INF_BITS), h, BLOCK), axis=0)
    first_b = tl.min(tl.where((b <= 0) | (b >= INF_BITS), h, BLOCK), axis=0)
    legal = (first_a == BLOCK) & (first_b == BLOCK)
    if report & (legal == 0):
        on_a = (first_a < BLOCK) & ((first_b == BLOCK) | (a_code <= b_code))
        where = tl.where(on_a, first_a, first_b)
        bits = tl.where(on_a, tl.sum(tl.where(h == first_a, a, 0), axis=0), tl.sum(tl.where(h == first_b, b, 0), axis=0))
        tl.store(mailbox_ptr + 1, tl.where(on_a, a_code, b_code).to(tl.int64))
        tl.store(mailbox_ptr + 2, bits.to(tl.int64) & 0xFFFFFFFF)
        tl.store(mailbox_ptr + 3, where.to(tl.int64))
        tl.store(mailbox_ptr + 4, tl.where(on_a, a_count, b_count).to(tl.int64))
        _publish(mailbox_ptr, 2, SYS_FENCE)
    return legal


@triton.jit
def check_slots(idx_ptr, idx_stride, n, num_slots, chunk, verdict_ptr,
                NEGATIVE_OK: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr, PDL: tl.constexpr,
                TRIGGER: tl.constexpr):
    """``verdict[p]`` = the first illegal entry among entries ``[p * chunk, (p + 1) * chunk)``,
    or ``n``. ``TRIGGER`` (sm_90+): let the writer that follows, launched with programmatic
    dependent launch, be scheduled: 2 at once, before this grid's own wait, 1 after it (the writer
    loads nothing before its wait, and waits for this grid to complete before it reads the
    verdict). ``PDL``: this grid was itself launched with PDL, so it waits for the previous one,
    and first asks the L2 for the first ``BLOCK`` entries of its chunk (:func:`_prefetch_l2`)."""
    if TRIGGER == 2:
        gdc_launch_dependents()
    if PDL:
        r = tl.program_id(0).to(tl.int64) * chunk + tl.arange(0, BLOCK)
        _prefetch_l2(idx_ptr, idx_stride, r, r < tl.minimum(tl.program_id(0).to(tl.int64) * chunk + chunk, n),
                     0, 1, 1, 1)
        gdc_wait()
    if TRIGGER == 1:
        gdc_launch_dependents()
    start = tl.program_id(0).to(tl.int64) * chunk
    end = tl.minimum(start + chunk, n)
    tl.store(verdict_ptr + tl.program_id(0), _first_illegal(idx_ptr, idx_stride, start, end, n, num_slots,
                                                            NEGATIVE_OK, BLOCK, STEPS, idx_ptr, False))


@triton.jit
def copy_and_check(idx_ptr, idx_stride, n, num_slots, chunk, copy_ptr, verdict_ptr,
                   NEGATIVE_OK: tl.constexpr, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """oracle.kernels.check_index in one plain launch: ``copy[i] = index[i]`` (contiguous) and
    ``verdict[p]`` as :func:`check_slots` leaves it, for entries ``[p * chunk, (p + 1) * chunk)``."""
    start = tl.program_id(0).to(tl.int64) * chunk
    end = tl.minimum(start + chunk, n)
    tl.store(verdict_ptr + tl.program_id(0), _first_illegal(idx_ptr, idx_stride, start, end, n, num_slots,
                                                            NEGATIVE_OK, BLOCK, STEPS, copy_ptr, True))


@triton.jit
def _pdl_prologue(PDL: tl.constexpr):
    """Under programmatic dependent launch (``launch_pdl=True``, sm_90+) this grid may be launched
    while the previous kernel on the stream still runs: wait for it to complete (its writes, and
    its reads of the cache we are about to write) before touching memory, then let the next
    kernel launch early in turn. What overlaps is the launch, the scheduling of programs and the L2
    prefetches a kernel issues before calling this (:func:`_prefetch_l2`, hints), never a load or
    store."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()


@triton.jit
def _prefetch_l2(ptr, row_stride, rows, row_mask, col0, width, COUNT: tl.constexpr, SECTOR: tl.constexpr):
    """Ask the L2 for columns ``[col0, col0 + COUNT * SECTOR)`` (unit column stride, ``SECTOR``
    elements = 32 bytes) of ``rows``: one ``prefetch.global.L2`` per sector. A hint that changes
    no value any load returns, so it may run before the PDL wait (the L2 is the device's point of
    coherence). Rows past ``n`` and columns past ``width`` ask for row 0, column 0 instead."""
    cols = col0 + tl.arange(0, COUNT) * SECTOR
    cols = tl.where(cols < width, cols, 0)
    rows = tl.where(row_mask, rows, 0).to(tl.int64)
    prefetch_l2_at(ptr + rows[:, None] * row_stride + cols[None, :])


@triton.jit
def prefetch_l2_at(ptrs):
    """One ``prefetch.global.L2`` at each of ``ptrs`` (any shape): a hint that the line holding it
    will be read, which changes no value any load returns."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _fp8_codes(x, scale, FP8: tl.constexpr):
    """uint8 codes of ``x / scale``: the quotient in float32 with IEEE round-to-nearest division
    (``div_rn``; plain ``/`` is the approximate ``div.full.f32`` on NVIDIA), then Triton's fp8
    conversion (on sm_90: round to nearest even, saturating, NaN -> 0x7F)."""
    q = tl.div_rn(x.to(tl.float32), scale)
    if FP8 == 1:
        codes = q.to(tl.float8e4nv).to(tl.uint8, bitcast=True)
    else:
        codes = q.to(tl.float8e5).to(tl.uint8, bitcast=True)
    return codes


@triton.jit
def paged_write(src_ptr, src_s0, src_s1, src_s2,
                dst_ptr, dst_block_stride, dst_token_stride, dst_s1, dst_s2,
                idx_ptr, idx_stride, scale_ptr, scale_stride, scale_count,
                n, heads, dim, block_size, num_slots, pad_slot,
                src2_ptr, dst2_ptr, scale2_ptr, scale2_stride, scale2_count, scale_code, scale2_code,
                verdict_ptr, verdict_count, mailbox_ptr, arg_code, pad_code,
                HAS_INDEX: tl.constexpr, HAS_PAD_SLOT: tl.constexpr, FP8: tl.constexpr,
                FLAT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, PDL: tl.constexpr,
                PF_R: tl.constexpr = 0, PF_SECTOR: tl.constexpr = 1, CHECK: tl.constexpr = 0,
                NEGATIVE_OK: tl.constexpr = 0, CHECK_BLOCK: tl.constexpr = 64, SYS_FENCE: tl.constexpr = 0,
                SCALE_CHECK: tl.constexpr = 0):
    """Grid axis 2 is the side: programs ``(i, j, 1)`` write ``src2`` into ``dst2`` with
    ``scale2`` (V next to K in one launch; the host passes both sides' shared strides). A launch
    of one side (grid axis 2 of 1) gets the other side's scale as ``scale2`` all the same, for
    ``SCALE_CHECK``.

    ``FLAT``: the heads of a row are packed in both source and cache (head stride = dim x
    element stride) and one scale serves the row, so row element ``e`` sits at ``e`` x element
    stride: no per-element division, and unit strides vectorize.

    ``PDL`` (launched with programmatic dependent launch): see :func:`_pdl_prologue`. ``PF_R``
    (FLAT rows with unit element stride only): first ask the L2 for the tile's source rows, ``PF_R``
    sectors each (:func:`_prefetch_l2`), before the PDL wait. ``CHECK``: see the module docstring.
    ``SCALE_CHECK`` (a power of two >= both scale counts; 0: none): no program stores anything
    unless every element of both scales is finite and > 0 (:func:`_scales_are_legal`)."""
    first_program = (tl.program_id(0) == 0) & (tl.program_id(1) == 0) & (tl.program_id(2) == 0)
    checked_a, checked_b = scale_ptr, scale2_ptr
    if tl.program_id(2) == 1:
        src_ptr = src2_ptr
        dst_ptr = dst2_ptr
        scale_ptr = scale2_ptr  # quantized with scale_stride: the sides of one launch share it
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    if PF_R != 0:
        _prefetch_l2(src_ptr, src_s0, rows, row_mask, tl.program_id(1) * BLOCK_R, heads * dim, PF_R, PF_SECTOR)
        if HAS_INDEX:
            _prefetch_l2(idx_ptr, idx_stride, rows, row_mask, 0, 1, 1, 1)
    _pdl_prologue(PDL)
    slot, keep = _slots(idx_ptr, idx_stride, rows, row_mask, num_slots, pad_slot,
                        HAS_INDEX, HAS_PAD_SLOT)
    # a row has fewer than 2**31 elements: 32-bit element numbers, widened before any stride product
    e = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    e_mask = e < heads * dim
    if FLAT:
        src_col = e.to(tl.int64) * src_s2
        dst_col = e.to(tl.int64) * dst_s2
    else:
        # row element e of the [heads, dim] row: head e // dim, element e % dim
        h = (e // dim).to(tl.int64)
        d = (e % dim).to(tl.int64)
        src_col = h * src_s1 + d * src_s2
        dst_col = h * dst_s1 + d * dst_s2
    src_off = rows.to(tl.int64)[:, None] * src_s0 + src_col[None, :]
    block = slot // block_size
    token = slot % block_size
    dst_off = (block * dst_block_stride + token * dst_token_stride)[:, None] + dst_col[None, :]
    # the source load does not wait for the slot load: a row below n is readable whatever its slot
    x = tl.load(src_ptr + src_off, mask=row_mask[:, None] & e_mask[None, :])
    legal = first_program | True
    if CHECK != 0:
        legal = _call_is_legal(idx_ptr, idx_stride, n, num_slots, verdict_ptr, verdict_count, mailbox_ptr,
                               arg_code, pad_code, pad_slot, first_program, CHECK, NEGATIVE_OK, CHECK_BLOCK,
                               SYS_FENCE)
        keep = keep & legal
    if SCALE_CHECK != 0:  # reported only where every slot is legal: one report a call
        keep = keep & _scales_are_legal(checked_a, scale_stride, scale_count, scale_code, checked_b,
                                        scale2_stride, scale2_count, scale2_code, mailbox_ptr,
                                        first_program & legal, SCALE_CHECK, SYS_FENCE)
    mask = keep[:, None] & e_mask[None, :]
    if FP8 != 0:
        if FLAT:
            x = _fp8_codes(x, tl.load(scale_ptr), FP8)
        else:
            scale = tl.load(scale_ptr + h * scale_stride, mask=e_mask, other=1.0)
            x = _fp8_codes(x, scale[None, :], FP8)
    tl.store(dst_ptr + dst_off, x, mask=mask)


@triton.jit
def mla_write(a_ptr, a_s0, a_s1, b_ptr, b_s0, b_s1,
              dst_ptr, dst_block_stride, dst_token_stride, dst_s1,
              idx_ptr, idx_stride, scale_ptr,
              n, width_a, width_b, block_size, num_slots, pad_slot,
              verdict_ptr, verdict_count, mailbox_ptr, arg_code, pad_code, scale_code,
              HAS_PAD_SLOT: tl.constexpr, FP8: tl.constexpr,
              BLOCK_N: tl.constexpr, BLOCK_A: tl.constexpr, BLOCK_B: tl.constexpr, PDL: tl.constexpr,
              PF_A: tl.constexpr = 0, PF_B: tl.constexpr = 0, PF_SECTOR: tl.constexpr = 1,
              CHECK: tl.constexpr = 0, NEGATIVE_OK: tl.constexpr = 0, CHECK_BLOCK: tl.constexpr = 64,
              SYS_FENCE: tl.constexpr = 0, SCALE_CHECK: tl.constexpr = 0):
    """Columns ``[j * BLOCK_A, (j + 1) * BLOCK_A)`` of part a and ``[j * BLOCK_B, ...)`` of part
    b for program ``(i, j)``: each part in its own power-of-two tile, so no lane is spent on the
    padding of one tile over the whole ``a | b`` row, and both copies vectorize. ``PDL``: see
    :func:`_pdl_prologue`. ``PF_A``, ``PF_B`` (unit column strides only): first ask the L2 for the
    tile's source rows, that many sectors of each part (:func:`_prefetch_l2`), before the PDL wait.
    ``CHECK``: see the module docstring; ``SCALE_CHECK`` (1: the fp8 scale checked, 0: not): as
    :func:`paged_write`'s."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < n
    if PF_A != 0:
        _prefetch_l2(a_ptr, a_s0, rows, row_mask, tl.program_id(1) * BLOCK_A, width_a, PF_A, PF_SECTOR)
    if PF_B != 0:
        _prefetch_l2(b_ptr, b_s0, rows, row_mask, tl.program_id(1) * BLOCK_B, width_b, PF_B, PF_SECTOR)
    if PF_A != 0 or PF_B != 0:
        _prefetch_l2(idx_ptr, idx_stride, rows, row_mask, 0, 1, 1, 1)
    _pdl_prologue(PDL)
    slot, keep = _slots(idx_ptr, idx_stride, rows, row_mask, num_slots, pad_slot,
                        True, HAS_PAD_SLOT)
    rows64 = rows.to(tl.int64)[:, None]
    dst_row = ((slot // block_size) * dst_block_stride + (slot % block_size) * dst_token_stride)[:, None]
    j = tl.program_id(1).to(tl.int64)
    # the source loads do not wait for the slot load (masked by the row, not by its slot): one
    # memory round trip per row instead of two, which is most of a decode step's time
    ca = j * BLOCK_A + tl.arange(0, BLOCK_A)
    xa = tl.load(a_ptr + rows64 * a_s0 + (ca * a_s1)[None, :], mask=row_mask[:, None] & (ca < width_a)[None, :])
    cb = j * BLOCK_B + tl.arange(0, BLOCK_B)
    xb = tl.load(b_ptr + rows64 * b_s0 + (cb * b_s1)[None, :], mask=row_mask[:, None] & (cb < width_b)[None, :])
    first_program = (tl.program_id(0) == 0) & (tl.program_id(1) == 0)
    legal = first_program | True
    if CHECK != 0:
        legal = _call_is_legal(idx_ptr, idx_stride, n, num_slots, verdict_ptr, verdict_count, mailbox_ptr,
                               arg_code, pad_code, pad_slot, first_program, CHECK, NEGATIVE_OK, CHECK_BLOCK,
                               SYS_FENCE)
        keep = keep & legal
    if SCALE_CHECK != 0:  # reported only where every slot is legal: one report a call
        keep = keep & _scales_are_legal(scale_ptr, 0, 1, scale_code, scale_ptr, 0, 1, scale_code, mailbox_ptr,
                                        first_program & legal, SCALE_CHECK, SYS_FENCE)
    mask_a = keep[:, None] & (ca < width_a)[None, :]
    mask_b = keep[:, None] & (cb < width_b)[None, :]
    if FP8 != 0:
        scale = tl.load(scale_ptr)
        xa = _fp8_codes(xa, scale, FP8)
        xb = _fp8_codes(xb, scale, FP8)
    tl.store(dst_ptr + dst_row + (ca * dst_s1)[None, :], xa, mask=mask_a)
    tl.store(dst_ptr + dst_row + ((width_a + cb) * dst_s1)[None, :], xb, mask=mask_b)


@triton.jit
def translate(mapping_ptr, mapping_stride, table,
              loc_ptr, loc_s0, loc_s1, loc_s2, loc_s3, size1, size2, size3,
              out_ptr, numel, BLOCK: tl.constexpr):
    """``out[i] = mapping[loc[i]]`` (``out`` contiguous, ``loc`` up to 4-D and strided), with
    ``-1`` translated to ``-1`` explicitly: nothing is read outside ``mapping[0:table]``, and a
    value outside ``[0, table)`` that the host did not reject (a CUDA-graph replay) gives -1."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < numel
    i3 = i % size3
    rest = i // size3
    i2 = rest % size2
    rest = rest // size2
    i1 = rest % size1
    i0 = rest // size1
    loc = tl.load(loc_ptr + i0 * loc_s0 + i1 * loc_s1 + i2 * loc_s2 + i3 * loc_s3,
                  mask=live, other=-1).to(tl.int64)
    inside = live & (loc >= 0) & (loc < table)
    value = tl.load(mapping_ptr + loc * mapping_stride, mask=inside, other=0)
    # -1 (padding) translates to -1 here, not through mapping[-1]: nothing before the table or
    # past it is read
    value = tl.where(inside, value, -1)
    tl.store(out_ptr + i, value, mask=live)
