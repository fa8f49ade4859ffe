"""The mutants: deliberately wrong kernels, each a small variant of a correct torch kernel with one
real bug, and the case class(es) that should catch it.

Every mutant validates its input as its base does (so it is judged on the same cases), then
commits exactly one bug. Wrong addresses are written through raw views of the underlying storage
(:mod:`oracle.mutants._raw`), so they land where a C kernel's ``ptr + offset`` would: in a guard
band, a lead area or a neighbour's row, never outside the allocation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import torch_native as tn
from ..kernels import _checks as checks
from . import _raw
from .bases import check_quantize, check_store, first_and_last, satfinite_codes, set_mla_skip_reserved0


@dataclass(frozen=True)
class Mutant:
    """One deliberately wrong kernel. ``base`` names the correct kernel it mutates (a torch
    kernel or a :mod:`oracle.mutants.bases` variant); the mutant declares exactly its contract.
    ``catches``: the case classes expected to kill it; ``cause``: the diagnosis its failures
    there must name (a key of :data:`oracle.diagnose.CAUSES`)."""

    name: str
    op: str
    base: str
    bug: str  # one line
    catches: tuple
    fn: Callable
    cause: str = ""  # the oracle.diagnose cause its failures must name

    @property
    def short(self) -> str:
        """The name without the ``mutant.`` prefix (test ids, tables)."""
        return self.name.removeprefix("mutant.")


def read_packed(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements read as if ``t`` were contiguous from its first element (strides
    ignored; the storage offset kept)."""
    strides, step = [], 1
    for n in reversed(t.shape):
        strides.append(step)
        step *= max(n, 1)
    return t.as_strided(t.shape, tuple(reversed(strides)), t.storage_offset())


# --- store_cache (base torch.store_cache, or a bases.py variant) ------------------------------

def store_cache_ignores_source_stride(k, v, k_cache, v_cache, loc):
    tn.store_cache(read_packed(k), read_packed(v), k_cache, v_cache, loc)


def store_cache_ignores_head_stride(k, v, k_cache, v_cache, loc):
    # each row from its own base, its heads then read as one run (the head stride ignored)
    k, v = (t.as_strided(t.shape, (t.stride(0),) + tuple(read_packed(t[0]).stride()), t.storage_offset())
            for t in (k, v))
    tn.store_cache(k, v, k_cache, v_cache, loc)


def store_cache_ignores_index_stride(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache, read_packed(loc))


def store_cache_ignores_index_offset(k, v, k_cache, v_cache, loc):
    # a kernel that takes the index's storage pointer, not its data pointer
    tn.store_cache(k, v, k_cache, v_cache, loc.as_strided(loc.shape, loc.stride(), 0))


def store_cache_int32_offsets(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc)
    for src, cache in ((k, k_cache), (v, v_cache)):
        offset = loc.to(torch.int64) * cache.stride(0) & 0xFFFFFFFF  # int32 slot * int32 stride
        offset = torch.where(offset >= 2**31, offset - 2**32, offset)  # wraps, as int32 does
        _raw.write_rows_at(cache, cache.storage_offset() + offset, src)


def store_cache_k_into_v(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, k, k_cache, v_cache, loc)


def store_cache_drops_last_row(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc)
    n = max(loc.shape[0] - 1, 0)  # loop bound off by one
    tn.store_cache(k[:n], v[:n], k_cache, v_cache, loc[:n])


LAUNCH_ROWS = 1024  # rows per launch of a writer that launches in chunks


def store_cache_index_not_advanced(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc)
    for start in range(0, loc.shape[0], LAUNCH_ROWS):  # the sources move on per launch, loc does not
        rows = min(LAUNCH_ROWS, loc.shape[0] - start)
        tn.store_cache(k[start:start + rows], v[start:start + rows], k_cache, v_cache, loc[:rows])


VECTOR_BYTES = 16


def store_cache_vector_overrun(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc)
    for src, cache in ((k, k_cache), (v, v_cache)):
        row = src[0].numel() * src.element_size() if src.shape[0] else 0
        chunk = -(-row // VECTOR_BYTES) * VECTOR_BYTES  # whole 16-byte vectors, no tail loop
        size = src.element_size()
        dst = (cache.storage_offset() + loc.long() * cache.stride(0)) * size
        read = (src.storage_offset() + torch.arange(src.shape[0]) * src.stride(0)) * size
        _raw.copy_bytes(cache, dst, src, read, chunk)


def store_cache_writes_padding_rows(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc, padding="negative")  # base: skips slots < 0
    for src, cache in ((k, k_cache), (v, v_cache)):  # ptr + slot * stride, -1 included
        _raw.write_rows_at(cache, cache.storage_offset() + loc.long() * cache.stride(0), src)


def store_cache_writes_reserved_slot(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc, padding="reserved:0")  # base: skips slot 0
    k_cache.index_put_((loc.long(),), k)
    v_cache.index_put_((loc.long(),), v)


def store_cache_tears_duplicates(k, v, k_cache, v_cache, loc):
    check_store(k, v, k_cache, v_cache, loc)  # base: duplicates="any", one whole row each
    index = loc.long()
    first, last = first_and_last(index)
    torn = first != last
    for src, cache in ((k, k_cache), (v, v_cache)):
        cache.index_put_((index[last],), src[last])
        half = src.shape[-1] // 2  # the first half of each head from the first duplicate
        cache[index[first[torn]], ..., :half] = src[first[torn], ..., :half]


def store_cache_accepts_out_of_range(k, v, k_cache, v_cache, loc):
    index = loc.long().clamp(0, k_cache.shape[0] - 1)  # clamps instead of validating
    k_cache.index_put_((index,), k)
    v_cache.index_put_((index,), v)


# --- set_mla_kv_buffer (base torch.set_mla_kv_buffer) ------------------------------------------

def _check_mla(kv_buffer, loc, nope, rope) -> tuple:
    """torch.set_mla_kv_buffer's checks (run on a zero-length call); returns nope and rope as
    ``[N, width]`` (an ``[N, 1, width]`` source as its ``[:, 0]`` view) and nope + rope."""
    tn._check_index("loc", loc, kv_buffer.shape[0])
    tn.set_mla_kv_buffer(kv_buffer, loc[:0], nope[:0], rope[:0])
    nope, rope = checks.mla_sources(nope, rope, loc.shape[0])
    return nope, rope, nope.shape[1] + rope.shape[1]


def set_mla_row_stride_from_unit_axis(kv_buffer, loc, cache_k_nope, cache_k_rope):
    # rows addressed by stride(-2): stride(0) for [N, d], the unit axis's stride for [N, 1, d]
    nope, rope = (t.as_strided((t.shape[0], t.shape[-1]), (t.stride(-2), t.stride(-1)), t.storage_offset())
                  for t in (cache_k_nope, cache_k_rope))
    tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)


def set_mla_swaps_nope_rope(kv_buffer, loc, cache_k_nope, cache_k_rope):
    tn.set_mla_kv_buffer(kv_buffer, loc, cache_k_rope, cache_k_nope)


def set_mla_rope_at_row_end(kv_buffer, loc, cache_k_nope, cache_k_rope):
    cache_k_nope, cache_k_rope, _ = _check_mla(kv_buffer, loc, cache_k_nope, cache_k_rope)
    index = loc.long()
    width, rope = kv_buffer.shape[1], cache_k_rope.shape[1]
    kv_buffer[:, : cache_k_nope.shape[1]].index_put_((index,), cache_k_nope)
    kv_buffer[:, width - rope:].index_put_((index,), cache_k_rope)  # W - rope, not nope


def set_mla_clobbers_row_tail(kv_buffer, loc, cache_k_nope, cache_k_rope):
    cache_k_nope, cache_k_rope, written = _check_mla(kv_buffer, loc, cache_k_nope, cache_k_rope)
    tail = kv_buffer.new_zeros((loc.shape[0], kv_buffer.shape[1] - written))
    kv_buffer.index_put_((loc.long(),), torch.cat([cache_k_nope, cache_k_rope, tail], dim=1))


def set_mla_no_rope_writes_reserved(kv_buffer, loc, cache_k_nope, cache_k_rope):
    if cache_k_rope.shape[-1]:
        set_mla_skip_reserved0(kv_buffer, loc, cache_k_nope, cache_k_rope)
    else:  # a kernel of its own for rows without rope, which skips no reserved slot
        tn.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)


def set_mla_ignores_buffer_offset(kv_buffer, loc, cache_k_nope, cache_k_rope):
    _check_mla(kv_buffer, loc, cache_k_nope, cache_k_rope)
    # a kernel that takes the buffer's storage pointer (untyped_storage().data_ptr()), not its data pointer
    tn.set_mla_kv_buffer(kv_buffer.as_strided(kv_buffer.shape, kv_buffer.stride(), 0), loc, cache_k_nope, cache_k_rope)


# --- concat_and_cache_mla (base torch.concat_and_cache_mla) ------------------------------------

def concat_mla_ignores_scale(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    if isinstance(scale, torch.Tensor) and scale.dtype == torch.float32:
        scale = torch.ones_like(scale)  # as if the scale were never passed down
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


def concat_mla_swaps_parts(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    tn.concat_and_cache_mla(k_pe, kv_c, kv_cache, slot_mapping, kv_cache_dtype, scale)


# --- reshape_and_cache_flash (base torch.reshape_and_cache_flash) ------------------------------

def _div_codes(rows, scale, fmt):
    return tn._to_fp8_codes(rows, scale, fmt)


def paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale, *,
                codes=_div_codes, views=None, write=True, block_of=None):
    """torch.reshape_and_cache_flash with its checks (run first on a zero-length call), the fp8
    conversion ``codes(rows, scale, fmt)``, the cache views ``views(key_cache, value_cache)`` and
    the block of each slot ``block_of(slots, block_size)`` swappable (a block past the cache drops
    its row)."""
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping[:0],
                               kv_cache_dtype, k_scale, v_scale)
    num_blocks, block_size = key_cache.shape[:2]
    num_tokens = slot_mapping.shape[0]
    for name, src in (("key", key), ("value", value)):
        if src.shape[0] < num_tokens:
            raise ValueError(f"{name} has {src.shape[0]} rows, fewer than {num_tokens} slots")
    if num_tokens and int(slot_mapping.max()) >= num_blocks * block_size:
        raise ValueError(f"slot_mapping holds slot {int(slot_mapping.max())}, out of range")
    if not write:
        return
    fmt = checks.KV_CACHE_DTYPES[kv_cache_dtype]
    if views is not None:
        key_cache, value_cache = views(key_cache, value_cache)
    blocks = slot_mapping.long() // block_size if block_of is None else block_of(slot_mapping.long(), block_size)
    keep = (slot_mapping >= 0) & (blocks < num_blocks)
    slots = slot_mapping[keep].long()
    index = (blocks[keep], slots % block_size)
    for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        rows = src[:num_tokens][keep]
        cache.index_put_(index, rows if fmt is None else codes(rows, scale, fmt))


def paged_v_uses_k_strides(*args):
    def views(key_cache, value_cache):
        return key_cache, value_cache.as_strided(value_cache.shape, key_cache.stride(),
                                                 value_cache.storage_offset())
    paged_write(*args, views=views)


def paged_assumes_nhd(*args):
    def views(key_cache, value_cache):
        return tuple(read_packed(c) for c in (key_cache, value_cache))
    paged_write(*args, views=views)


def paged_inverted_scale(*args):
    def codes(rows, scale, fmt):
        return (rows.float() * scale.reshape(1, -1, 1)).to(tn.FP8_DTYPES[fmt]).view(torch.uint8)
    paged_write(*args, codes=codes)


def paged_noop(*args):
    paged_write(*args, write=False)


def paged_fixed_point_block(*args):
    def block_of(slots, block_size):  # slot * ceil(2**16 / block_size) >> 16: exact for powers of two
        return (slots * -(-(1 << 16) // block_size)) >> 16
    paged_write(*args, block_of=block_of)


# --- quantize_fp8 (base torch.quantize_fp8, or the satfinite variant) --------------------------

def _quantize(out, x, scale, fmt, quotient=None, after=None):
    check_quantize(out, x, scale, fmt)
    s = scale.reshape(1, -1, 1)
    q = x.float() / s if quotient is None else quotient(x.float(), s)
    codes = q.to(tn.FP8_DTYPES[fmt]).view(torch.uint8)
    if after is not None:
        codes = after(codes, q, fmt)
    out.copy_(codes)
    return q


def quantize_multiplies_reciprocal(out, x, scale, fmt):
    _quantize(out, x, scale, fmt, quotient=lambda x, s: x * torch.reciprocal(s))


def quantize_double_rounds_f16(out, x, scale, fmt):
    _quantize(out, x, scale, fmt, quotient=lambda x, s: (x / s).half().float())


def quantize_drops_nan_sign(out, x, scale, fmt):
    def unsigned_nan(codes, q, fmt):
        return codes if fmt.endswith("fnuz") else torch.where(q.isnan(), torch.full_like(codes, 0x7F), codes)
    _quantize(out, x, scale, fmt, after=unsigned_nan)


def quantize_mutates_source(out, x, scale, fmt):
    q = _quantize(out, x, scale, fmt)
    x.copy_(q)  # the quotient kept in x's buffer, to save a scratch tensor


def quantize_not_saturating(out, x, scale, fmt):
    check_quantize(out, x, scale, fmt)  # base: the satfinite variant (declares ocp_satfinite)
    out.copy_(satfinite_codes(x, scale, fmt, saturate=False))


# --- translate_full_to_swa (base torch.translate_full_to_swa) ----------------------------------

def translate_wraps_negative(mapping, loc):
    tn.translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the table checks
    if loc.dtype not in tn.INDEX_DTYPES:
        raise TypeError(f"loc has dtype {loc.dtype}; expected torch.int32 or torch.int64")
    if (loc >= mapping.numel() - 1).any():  # only the upper bound is checked
        raise ValueError("loc reaches past the table")
    return mapping[loc.long()]  # -2 wraps to mapping[-2]


def translate_ignores_index_stride(mapping, loc):
    return tn.translate_full_to_swa(mapping, read_packed(loc))


# --- the catalogue -----------------------------------------------------------------------------

CAUSES = {  # mutant -> the cause its failures must name
    "store_cache.ignores_source_stride": "source_stride_ignored",
    "store_cache.ignores_index_stride": "index_stride_ignored",
    "store_cache.ignores_head_stride": "source_stride_ignored",
    "store_cache.ignores_index_offset": "index_offset_ignored",
    "store_cache.int32_offsets": "int32_offsets",
    "store_cache.k_into_v": "sources_swapped",
    "store_cache.drops_last_row": "rows_dropped",
    "store_cache.vector_overrun": "row_overrun",
    "store_cache.index_not_advanced": "rows_misrouted",
    "store_cache.writes_padding_rows": "padding_policy",
    "store_cache.writes_reserved_slot": "padding_policy",
    "store_cache.tears_duplicates": "torn_rows",
    "store_cache.accepts_out_of_range": "validation_missing",
    "set_mla_kv_buffer.swaps_nope_rope": "parts_swapped",
    "set_mla_kv_buffer.row_stride_from_unit_axis": "source_stride_ignored",
    "set_mla_kv_buffer.rope_at_row_end": "part_misplaced",
    "set_mla_kv_buffer.clobbers_row_tail": "row_tail_written",
    "set_mla_kv_buffer.ignores_buffer_offset": "storage_offset_ignored",
    "set_mla_kv_buffer.no_rope_writes_reserved": "padding_policy",
    "concat_and_cache_mla.ignores_scale": "scale_missing",
    "concat_and_cache_mla.swaps_parts": "parts_swapped",
    "reshape_and_cache_flash.v_uses_k_strides": "cache_strides_swapped",
    "reshape_and_cache_flash.assumes_nhd": "dense_cache_assumed",
    "reshape_and_cache_flash.inverted_scale": "scale_inverted",
    "reshape_and_cache_flash.noop": "nothing_written",
    "reshape_and_cache_flash.fixed_point_block": "rows_misrouted",
    "quantize_fp8.multiplies_reciprocal": "fp8_conversion",
    "quantize_fp8.double_rounds_f16": "fp8_conversion",
    "quantize_fp8.drops_nan_sign": "nan_mishandled",
    "quantize_fp8.mutates_source": "input_modified",
    "quantize_fp8.not_saturating": "fp8_conversion",
    "translate_full_to_swa.wraps_negative": "validation_missing",
    "translate_full_to_swa.ignores_index_stride": "index_stride_ignored",
}

T = "torch."
MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, catches, fn, CAUSES[name])
                for name, op, base, bug, catches, fn in [
    ("store_cache.ignores_source_stride", "store_cache", T + "store_cache",
     "reads K and V rows as if contiguous, ignoring the source row stride (fused qkv)",
     ("strides",), store_cache_ignores_source_stride),
    ("store_cache.ignores_head_stride", "store_cache", T + "store_cache",
     "reads each K and V row from its own row stride but its heads as one run (the head stride ignored)",
     ("strides",), store_cache_ignores_head_stride),
    ("store_cache.ignores_index_stride", "store_cache", T + "store_cache",
     "reads loc contiguously, ignoring the index tensor's stride",
     ("strides",), store_cache_ignores_index_stride),
    ("store_cache.ignores_index_offset", "store_cache", T + "store_cache",
     "reads loc from its storage's start, ignoring the index tensor's storage offset",
     ("strides",), store_cache_ignores_index_offset),
    ("store_cache.int32_offsets", "store_cache", T + "store_cache",
     "computes slot * stride(0) in int32, wrapping past 2^31 elements",
     ("large",), store_cache_int32_offsets),
    ("store_cache.k_into_v", "store_cache", T + "store_cache",
     "writes K into the V cache",
     ("dtypes",), store_cache_k_into_v),
    ("store_cache.drops_last_row", "store_cache", T + "store_cache",
     "drops the last row (loop bound n - 1)",
     ("dtypes",), store_cache_drops_last_row),
    ("store_cache.vector_overrun", "store_cache", T + "store_cache",
     "copies whole 16-byte vectors, writing past the row end when a row is not a multiple of 16 bytes",
     ("sizes",), store_cache_vector_overrun),
    ("store_cache.index_not_advanced", "store_cache", T + "store_cache",
     f"launches in chunks of {LAUNCH_ROWS} rows, moving the sources on per launch but not the index",
     ("sizes",), store_cache_index_not_advanced),
    ("store_cache.writes_padding_rows", "store_cache", "mutant-base.store_cache.pad_negative",
     "writes -1 slots one row before the cache (ptr + slot * stride) instead of skipping them",
     ("padding",), store_cache_writes_padding_rows),
    ("store_cache.writes_reserved_slot", "store_cache", "mutant-base.store_cache.pad_reserved0",
     "writes the reserved padding slot 0 that the contract says is skipped",
     ("padding",), store_cache_writes_reserved_slot),
    ("store_cache.tears_duplicates", "store_cache", "mutant-base.store_cache.dups_any",
     "tears duplicated slots: half of each head from one duplicate, the rest from another",
     ("duplicates",), store_cache_tears_duplicates),
    ("store_cache.accepts_out_of_range", "store_cache", T + "store_cache",
     "declares validates=True but clamps out-of-range slots instead of raising",
     ("bad_input",), store_cache_accepts_out_of_range),
    ("set_mla_kv_buffer.ignores_buffer_offset", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "addresses kv_buffer from its storage's start, ignoring its storage offset",
     ("dtypes",), set_mla_ignores_buffer_offset),
    ("set_mla_kv_buffer.no_rope_writes_reserved", "set_mla_kv_buffer", "mutant-base.set_mla_kv_buffer.pad_reserved0",
     "takes a kernel of its own for rows without rope (rope width 0), which writes the reserved slot 0",
     ("padding",), set_mla_no_rope_writes_reserved),
    ("set_mla_kv_buffer.row_stride_from_unit_axis", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "takes a source's row stride from stride(-2), which for an [N, 1, d] source is the unit axis's",
     ("strides",), set_mla_row_stride_from_unit_axis),
    ("set_mla_kv_buffer.swaps_nope_rope", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "swaps nope and rope (rope at offset 0, nope after it)",
     ("dtypes",), set_mla_swaps_nope_rope),
    ("set_mla_kv_buffer.rope_at_row_end", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "writes rope at the wrong offset, W - rope (the row's end) instead of nope",
     ("sizes",), set_mla_rope_at_row_end),
    ("set_mla_kv_buffer.clobbers_row_tail", "set_mla_kv_buffer", T + "set_mla_kv_buffer",
     "writes the whole W-wide row, zeroing the elements past nope + rope",
     ("sizes",), set_mla_clobbers_row_tail),
    ("concat_and_cache_mla.ignores_scale", "concat_and_cache_mla", T + "concat_and_cache_mla",
     "stores fp8 codes of x instead of x / scale (no fp8 scale)",
     ("fp8",), concat_mla_ignores_scale),
    ("concat_and_cache_mla.swaps_parts", "concat_and_cache_mla", T + "concat_and_cache_mla",
     "swaps kv_c and k_pe (k_pe at offset 0, kv_c after it)",
     ("dtypes",), concat_mla_swaps_parts),
    ("reshape_and_cache_flash.v_uses_k_strides", "reshape_and_cache_flash",
     T + "reshape_and_cache_flash",
     "addresses the V cache with K's cache strides",
     ("aliasing",), paged_v_uses_k_strides),
    ("reshape_and_cache_flash.assumes_nhd", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "assumes dense NHD caches, ignoring the cache strides (HND views, padded blocks)",
     ("aliasing",), paged_assumes_nhd),
    ("reshape_and_cache_flash.inverted_scale", "reshape_and_cache_flash",
     T + "reshape_and_cache_flash",
     "multiplies by the fp8 scale where the contract divides",
     ("fp8",), paged_inverted_scale),
    ("reshape_and_cache_flash.noop", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "validates, then leaves the caches untouched (a no-op)",
     ("dtypes",), paged_noop),
    ("reshape_and_cache_flash.fixed_point_block", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "divides the slot by the block size with a 16.16 fixed-point reciprocal rounded up (exact for powers "
     "of two; past slot 2**16 / (block_size * error) a slot's last token goes to a later block)",
     ("sizes",), paged_fixed_point_block),
    ("quantize_fp8.multiplies_reciprocal", "quantize_fp8", T + "quantize_fp8",
     "multiplies by 1 / scale where the contract divides by scale",
     ("fp8",), quantize_multiplies_reciprocal),
    ("quantize_fp8.double_rounds_f16", "quantize_fp8", T + "quantize_fp8",
     "rounds the quotient to float16 before fp8 (double rounding)",
     ("fp8",), quantize_double_rounds_f16),
    ("quantize_fp8.drops_nan_sign", "quantize_fp8", T + "quantize_fp8",
     "writes NaN as 0x7F without its sign where the contract keeps the sign (0x7F|sign)",
     ("fp8",), quantize_drops_nan_sign),
    ("quantize_fp8.mutates_source", "quantize_fp8", T + "quantize_fp8",
     "stores the scaled quotient back into x (modifies its source in place)",
     ("dtypes",), quantize_mutates_source),
    ("quantize_fp8.not_saturating", "quantize_fp8", "mutant-base.quantize_fp8.satfinite",
     "lets e5m2 overflow become inf where the contract declares saturation (ocp_satfinite)",
     ("fp8",), quantize_not_saturating),
    ("translate_full_to_swa.wraps_negative", "translate_full_to_swa", T + "translate_full_to_swa",
     "translates -2 by wrapping (mapping[-2]) instead of raising",
     ("bad_input",), translate_wraps_negative),
    ("translate_full_to_swa.ignores_index_stride", "translate_full_to_swa",
     T + "translate_full_to_swa",
     "reads loc contiguously, ignoring the index tensor's stride",
     ("strides",), translate_ignores_index_stride),
])
