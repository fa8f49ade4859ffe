"""Meta-tests: the catalogue builds the inputs that expose what careless or clever kernels do with
slot numbers, padding, row layouts and per-head scales, and the diagnosis names it.

Each kernel below is a torch kernel with one realistic slip, caught on the case built for it
(odd slots past 2**24, a decode step of one padding entry, padding before real entries, rows that
share words of memory, K and V as halves of one tensor, a fused row stride of no multiple of 16
bytes, a rope-less row in a wider buffer, a column-major 2-D index, 32 per-head scales over N = H
tokens, heads apart under a per-head scale, a power-of-two scale, a head of signed zeros, rope
wider than nope, a paged MLA block a whole entry wider than its pages); the torch baselines pass
the same cases. The block-scaled additions (a partial last block all NaN, a swizzled scale cache
after another head size) are checked as built.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from oracle.cases import catalogue
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel, default_registry
from oracle.runner import FAIL, PASS, run_case

BASELINES = {k.name: k for k in default_registry.discover().select(backend="torch")}


def like(baseline: str, fn, **fields) -> Kernel:
    """``fn`` under the contract of torch baseline ``baseline`` (with ``fields`` changed)."""
    contract = BASELINES[baseline].contract
    return Kernel(replace(contract, name="reach." + fn.__name__, **fields), fn, "test")


def case(op: str, case_id: str, contract=None):
    return next(c for c in catalogue(op, "quick", contract) if c.id == case_id)


def fails_as(kernel: Kernel, op: str, case_id: str, cause: str | None):
    outcome = run_case(kernel, case(op, case_id, kernel.contract))
    assert outcome.status == FAIL, outcome.message
    if cause is not None:
        assert (outcome.cause or {}).get("id") == cause, outcome.message
    return outcome


def passes(kernel: Kernel, op: str, case_id: str) -> None:
    outcome = run_case(kernel, case(op, case_id, kernel.contract))
    assert outcome.status == PASS, outcome.message


# --- slot numbers past 2**24 ----------------------------------------------------------------------

def float_slot_store_cache(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache, loc.float().long().to(loc.dtype))


def float_division_paged(key, value, key_cache, value_cache, slot_mapping, *rest):
    block_size = key_cache.shape[1]
    block = torch.floor(slot_mapping.float() / block_size).long()
    landed = torch.where(slot_mapping >= 0, block * block_size + slot_mapping % block_size, slot_mapping)
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, landed.to(slot_mapping.dtype), *rest)


def float_gather_swa(mapping, loc):
    index = loc.long() % mapping.numel()  # -1: the sentinel, last
    return torch.nn.functional.embedding(index, mapping.float().unsqueeze(1)).squeeze(-1).to(mapping.dtype)


@pytest.mark.parametrize("op, fn, case_id", [
    ("store_cache", float_slot_store_cache, "u8-1x1-past_float_slots-N7"),
    ("reshape_and_cache_flash", float_division_paged, "1x1-past_float_slots-N7"),
    ("translate_full_to_swa", float_gather_swa, "1024x16-past_float_slots-N7"),
], ids=lambda x: getattr(x, "__name__", None))
def test_slots_through_float32_are_caught_past_2_to_the_24_and_named(op, fn, case_id):
    outcome = fails_as(like(f"torch.{op}", fn), op, case_id, "slots_through_float")
    assert "float32" in outcome.message
    passes(BASELINES[f"torch.{op}"], op, case_id)


def test_the_past_float_cases_write_odd_slots_past_2_to_the_24_that_stay_in_the_cache_rounded():
    from oracle.buffers import Arena
    from oracle.ops import SPECS

    for op in ("store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash"):
        c = next(c for c in catalogue(op, "quick") if c.p.get("slots") == "past_float")
        contract = BASELINES[f"torch.{op}"].contract
        arena = Arena("cpu", c.seed)
        prepared = SPECS[op].build(c, arena, np.random.default_rng(c.seed), contract)
        prepared.before = arena.snapshot()
        index = next(v for v in prepared.arena.views.values() if v.role == "index")
        entries = prepared.numpy(index.name).astype(np.int64)
        high = entries[entries > 1 << 24]
        assert high.size >= 4 and (high % 2 == 1).all(), (op, entries)
        num_slots = int(np.prod(prepared.arena.views[prepared.caches[0]].shape[:2 if SPECS[op].paged else 1]))
        assert (high.astype(np.float32).astype(np.int64) < num_slots).all(), op


# --- padding: one entry alone, and padding before real entries -----------------------------------

def reserved0_store_cache(k, v, k_cache, v_cache, loc):
    keep = loc != 0
    tn.store_cache(k[keep], v[keep], k_cache, v_cache, loc[keep])


def decode_fast_path_store_cache(k, v, k_cache, v_cache, loc):
    if loc.numel() == 1:  # one token: straight copy, the padding test forgotten
        k_cache[loc.long()] = k
        v_cache[loc.long()] = v
        return
    reserved0_store_cache(k, v, k_cache, v_cache, loc)


def padding_at_tail_store_cache(k, v, k_cache, v_cache, loc):
    first = int(torch.nonzero(loc == 0)[0]) if bool((loc == 0).any()) else loc.numel()
    tn.store_cache(k[:first], v[:first], k_cache, v_cache, loc[:first])


def test_a_decode_step_of_one_padding_entry_catches_a_fast_path_without_the_padding_test():
    good = like("torch.store_cache", reserved0_store_cache, padding="reserved:0")
    bad = like("torch.store_cache", decode_fast_path_store_cache, padding="reserved:0")
    passes(good, "store_cache", "int32-pad_reserved0-N1")
    outcome = fails_as(bad, "store_cache", "int32-pad_reserved0-N1", None)
    assert "k_cache[0" in outcome.message


def test_real_entries_after_the_first_padding_entry_dropped_are_named_so_not_as_padding_written():
    bad = like("torch.store_cache", padding_at_tail_store_cache, padding="reserved:0")
    outcome = fails_as(bad, "store_cache", "int32-pad_reserved0", "rows_dropped")
    assert "first padding entry" in outcome.message


# --- rows side by side, cache halves, fused row strides --------------------------------------------

def word_rmw_store_cache(k, v, k_cache, v_cache, loc):
    """Each row stored as whole 8-byte words, read before any row was written (concurrent programs
    that write back the bytes of a neighbour's row they share a word with, stale)."""
    for src, cache in ((k, k_cache), (v, v_cache)):
        storage = torch.empty(0, dtype=torch.uint8).set_(cache.untyped_storage())
        stale = storage.clone()
        item, row = cache.element_size(), src[0].numel() * cache.element_size()
        for i, slot in enumerate(loc.tolist()):
            start = (cache.storage_offset() + slot * cache.stride(0)) * item
            first, last = start // 8 * 8, -(-(start + row) // 8) * 8
            word = stale[first:last].clone()
            word[start - first: start - first + row] = src[i].reshape(-1).view(torch.uint8)
            storage[first:last] = word


def halves_assumed_interleaved_store_cache(k, v, k_cache, v_cache, loc):
    """K and V caches in one storage with equal strides taken for a [S, 2, row] pool: V written
    right after K's row."""
    if k_cache.untyped_storage().data_ptr() == v_cache.untyped_storage().data_ptr() \
            and k_cache.stride() == v_cache.stride() and k_cache.shape == v_cache.shape:
        row = k[0].numel()
        v_cache = k_cache.as_strided(v_cache.shape, v_cache.stride(), k_cache.storage_offset() + row)
    tn.store_cache(k, v, k_cache, v_cache, loc)


def aligned_load_store_cache(k, v, k_cache, v_cache, loc):
    """A 16-byte vector path chosen on the base pointers and the row width alone: each row loaded
    from its address rounded down to 16 bytes."""
    rows = []
    for src in (k, v):
        item, width = src.element_size(), src[0].numel()
        if src.data_ptr() % 16 or (width * item) % 16:
            rows.append(src)
            continue
        storage = torch.empty(0, dtype=torch.uint8).set_(src.untyped_storage())
        out = torch.empty_like(src, memory_format=torch.contiguous_format)
        for i in range(src.shape[0]):
            at = (src.storage_offset() + i * src.stride(0)) * item // 16 * 16
            out[i] = storage[at: at + width * item].view(src.dtype).reshape(src.shape[1:])
        rows.append(out)
    tn.store_cache(rows[0], rows[1], k_cache, v_cache, loc)


def test_rows_that_share_words_of_memory_are_written_side_by_side():
    passes(BASELINES["torch.store_cache"], "store_cache", "1x97-run_slots-N133")
    fails_as(like("torch.store_cache", word_rmw_store_cache), "store_cache", "1x97-run_slots-N133", None)


def test_k_and_v_as_halves_of_one_tensor_catch_an_interleaved_pool_assumed_and_the_large_case_is_not_called_int32():
    bad = like("torch.store_cache", halves_assumed_interleaved_store_cache)
    passes(BASELINES["torch.store_cache"], "store_cache", "halves_cache")
    fails_as(bad, "store_cache", "halves_cache", None)
    large = fails_as(bad, "store_cache", "u8-large-N7", "cache_layout_ignored")
    assert "int32" not in (large.cause or {}).get("text", "")


def test_a_fused_row_stride_of_no_multiple_of_16_bytes_catches_a_vector_path_chosen_on_the_bases():
    passes(BASELINES["torch.store_cache"], "store_cache", "gapped_src")
    fails_as(like("torch.store_cache", aligned_load_store_cache), "store_cache", "gapped_src", None)


# --- a rope-less row in a wider buffer, a column-major 2-D index ----------------------------------

def packed_norope_set_mla(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """Rope width 0 sent to a kernel that views the buffer as a packed [S, nope]."""
    if cache_k_rope.shape[-1] == 0:
        nope = cache_k_nope.shape[-1]
        packed = kv_buffer.as_strided((kv_buffer.shape[0], nope), (nope, 1), kv_buffer.storage_offset())
        packed[loc.long()] = cache_k_nope.reshape(loc.shape[0], nope)
        return
    tn.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope)


def linear_fill_swa(mapping, loc):
    """The result allocated like loc (keeping its column-major strides), then filled in row-major
    order as if it were contiguous."""
    out = torch.empty_like(loc, dtype=mapping.dtype)
    out.as_strided((out.numel(),), (1,)).copy_(mapping[loc.long().reshape(-1)])
    return out


def test_a_rope_less_row_in_a_wider_buffer_catches_a_packed_nope_view():
    passes(BASELINES["torch.set_mla_kv_buffer"], "set_mla_kv_buffer", "bf16-512x0x640-N7")
    outcome = fails_as(like("torch.set_mla_kv_buffer", packed_norope_set_mla), "set_mla_kv_buffer",
                       "bf16-512x0x640-N7", "dense_cache_assumed")
    assert "packed [S, 512]" in outcome.message


def test_a_column_major_2d_index_catches_a_result_filled_in_memory_order():
    ids = [c.id for c in catalogue("translate_full_to_swa", "quick") if c.p.get("index_layout") == "transposed"]
    assert ids
    passes(BASELINES["torch.translate_full_to_swa"], "translate_full_to_swa", ids[0])
    outcome = fails_as(like("torch.translate_full_to_swa", linear_fill_swa), "translate_full_to_swa", ids[0],
                       "result_strides_ignored")
    assert "filled in its memory order" in outcome.message


# --- per-head scales: 32 heads over N = H tokens, heads apart, a power of two ----------------------

def scale_table_of_16_quantize(out, x, scale, fmt):
    if scale.numel() > 1:
        scale = scale[torch.arange(scale.numel()) & 15]
    tn.quantize_fp8(out, x, scale, fmt)


def per_token_first_quantize(out, x, scale, fmt):
    """Scale kinds told apart by length, per token checked first: a per-head scale applied per
    token where N == H."""
    if scale.numel() > 1 and scale.numel() == x.shape[0]:
        codes = tn._fp8_codes(x, scale.reshape(-1, 1, 1), fmt)
        out.copy_(codes)
        return
    tn.quantize_fp8(out, x, scale, fmt)


def head_major_rows_quantize(out, x, scale, fmt):
    """Rows flattened head-major ([H, N], as an HND write walks them) with their scales built
    token-major: ``scale.repeat(N)`` where ``repeat_interleave`` was meant, so token n of head h
    is divided by ``scale[(h * N + n) % H]``."""
    n, heads, _ = x.shape
    if scale.numel() == 1:
        tn.quantize_fp8(out, x, scale, fmt)
        return
    rows = (torch.arange(heads)[None, :] * n + torch.arange(n)[:, None]) % scale.numel()
    out.copy_(tn._fp8_codes(x, scale.reshape(-1)[rows][..., None], fmt))


def chunk_local_head_quantize(out, x, scale, fmt):
    """x split into flat chunks of 2048 elements (one per thread block), each element's head taken
    from its offset inside its chunk: right only where 2048 is a multiple of H * D."""
    n, heads, dim = x.shape
    if scale.numel() == 1:
        tn.quantize_fp8(out, x, scale, fmt)
        return
    local = torch.arange(n * heads * dim).reshape(n, heads, dim) % 2048
    out.copy_(tn._fp8_codes(x, scale.reshape(-1)[(local // dim) % heads], fmt))


def head_from_offset_quantize(out, x, scale, fmt):
    """The head of each element computed from its offset in the row, ``(h * stride_h + d) // D % H``:
    right only where a row's heads are adjacent."""
    n, heads, dim = x.shape
    if scale.numel() > 1:
        h = torch.arange(heads).reshape(-1, 1)
        d = torch.arange(dim).reshape(1, -1)
        head = (h * x.stride(1) + d) // dim % heads
        out.copy_(tn._fp8_codes(x, scale[head].unsqueeze(0), fmt))
        return
    tn.quantize_fp8(out, x, scale, fmt)


def exponent_shift_quantize(out, x, scale, fmt):
    """x / 2**k for a power-of-two scale done on the float32 exponent field (bits - k << 23): NaN,
    inf and subnormals come out wrong."""
    s = float(scale.reshape(-1)[0])
    k = int(np.log2(s)) if scale.numel() == 1 else 0
    if k >= 1 and 2.0 ** k == s:
        bits = x.float().contiguous().view(torch.int32) - (k << 23)
        out.copy_(tn._quotient_codes(bits.view(torch.float32), x, fmt))
        return
    tn.quantize_fp8(out, x, scale, fmt)


def unit_scale_fast_path_on_head_0(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                   v_scale):
    """A unit-scale fast path decided on scale[0] alone: where head 0's scale is 1, no head is
    divided by its scale."""
    if kv_cache_dtype != "auto" and float(k_scale.reshape(-1)[0]) == 1.0:
        k_scale, v_scale = torch.ones_like(k_scale), torch.ones_like(v_scale)
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_a_per_head_scale_whose_head_0_is_one_catches_a_fast_path_that_looks_at_head_0_alone():
    passes(BASELINES["torch.reshape_and_cache_flash"], "reshape_and_cache_flash", "e4m3fn-scale_head_unit_first-random")
    outcome = fails_as(like("torch.reshape_and_cache_flash", unit_scale_fast_path_on_head_0), "reshape_and_cache_flash",
                       "e4m3fn-scale_head_unit_first-random", "scale_collapsed")
    assert "scale[0] alone" in outcome.message


def quantize_case(pick) -> str:
    return next(c.id for c in catalogue("quantize_fp8", "quick") if pick(c.p))


@pytest.mark.parametrize("fn, pick, cause", [
    (scale_table_of_16_quantize, lambda p: p.get("scale") == "head" and p.get("shape") == (32, 128), "scale_misindexed"),
    (per_token_first_quantize, lambda p: p.get("scale") == "head" and p.get("n") == 32, "scale_misindexed"),
    (head_from_offset_quantize, lambda p: p.get("scale") == "head" and p.get("src") == "interleaved", None),
    (head_major_rows_quantize, lambda p: p.get("scale") == "head" and p.get("n") == 32, "scale_misindexed"),
    (chunk_local_head_quantize, lambda p: p.get("scale") == "head" and p.get("shape") == (13, 46), "scale_misindexed"),
    (exponent_shift_quantize, lambda p: p.get("scale") == "4.0", None),
], ids=lambda x: getattr(x, "__name__", ""))
def test_per_head_and_power_of_two_scales_reach_kernels_that_shortcut_them(fn, pick, cause):
    case_id = quantize_case(pick)
    passes(BASELINES["torch.quantize_fp8"], "quantize_fp8", case_id)
    outcome = fails_as(like("torch.quantize_fp8", fn), "quantize_fp8", case_id, cause)
    if fn is scale_table_of_16_quantize:
        assert "scale[h % 16]" in outcome.message, outcome.message
    if fn is per_token_first_quantize:
        assert "along the token axis" in outcome.message, outcome.message
    if fn is chunk_local_head_quantize:
        assert "2048-element chunk" in outcome.message, outcome.message
    if fn is head_major_rows_quantize:
        assert "head-major rows" in outcome.message, outcome.message


# --- a head of zeros alone, rope wider than nope, a block size from the strides --------------------

def zero_head_fast_path_quantize(out, x, scale, fmt):
    """A head whose amax is 0 written as code 0x00 without converting it: -0 loses its sign."""
    tn.quantize_fp8(out, x, scale, fmt)
    zero = x.float().abs().amax(dim=-1) == 0
    out[zero] = 0


def rope_loop_by_nope_set_mla(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """Rope elements copied by the nope part's threads, one each, no stride loop: those past
    min(nope, 512) never written."""
    nope, rope = cache_k_nope.shape[-1], cache_k_rope.shape[-1]
    reach = min(rope, nope, 512)
    kept = torch.cat([cache_k_nope.reshape(loc.shape[0], -1), cache_k_rope.reshape(loc.shape[0], -1)[:, :reach]], 1)
    kv_buffer[loc.long(), : nope + reach] = kept


def block_size_from_strides_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """Blocks of ``kv_cache.stride(0) // kv_cache.size(2)`` tokens: right for packed pages only."""
    block_size = kv_cache.stride(0) // kv_cache.size(2)
    if block_size == kv_cache.shape[1]:
        return tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    flat = kv_cache.as_strided((kv_cache.shape[0] * block_size, kv_cache.shape[2]),
                               (kv_cache.stride(1), 1), kv_cache.storage_offset())
    slots = slot_mapping.long()
    keep = slots >= 0
    blocks, offsets = slots[keep] // kv_cache.shape[1], slots[keep] % kv_cache.shape[1]
    flat[blocks * block_size + offsets] = torch.cat([kv_c[keep], k_pe[keep]], 1).to(kv_cache.dtype)


def test_a_head_of_signed_zeros_alone_catches_a_zero_amax_fast_path():
    case_id = quantize_case(lambda p: p.get("values") == "special" and p.get("fp8") == "e4m3fn")
    passes(BASELINES["torch.quantize_fp8"], "quantize_fp8", case_id)
    outcome = fails_as(like("torch.quantize_fp8", zero_head_fast_path_quantize), "quantize_fp8", case_id,
                       "negative_zero_mishandled")
    assert "amax of 0" in outcome.message


def test_rope_wider_than_nope_catches_a_rope_loop_sized_by_nope():
    passes(BASELINES["torch.set_mla_kv_buffer"], "set_mla_kv_buffer", "bf16-32x64-N7")
    fails_as(like("torch.set_mla_kv_buffer", rope_loop_by_nope_set_mla), "set_mla_kv_buffer", "bf16-32x64-N7", None)


def test_a_paged_mla_cache_with_a_whole_entry_more_per_block_catches_a_block_size_from_the_strides():
    passes(BASELINES["torch.concat_and_cache_mla"], "concat_and_cache_mla", "aliased_cache")
    fails_as(like("torch.concat_and_cache_mla", block_size_from_strides_mla), "concat_and_cache_mla",
             "aliased_cache", None)


@pytest.mark.parametrize("shape", [(3, 8, 128), (2, 576), (0, 8, 128), (0, 576)])
def test_the_fp8_special_values_hold_one_head_of_signed_zeros_and_build_empty(shape):
    from oracle.ops import _fp8cases

    x = _fp8cases.values(np.random.default_rng(0), "special", "e4m3fn", shape, "float32", np.ones(1, np.float32))
    assert x.shape == shape
    if x.size:
        head = x[(0,) * (x.ndim - 1)]
        assert (head == 0).all() and np.signbit(head).any() and not np.signbit(head).all()


@pytest.mark.parametrize("fmt, block", [("nvfp4", 16), ("mxfp8_e4m3fn", 32)])
def test_the_nonfinite_block_values_hold_a_partial_last_block_all_nan_in_the_straddling_shape(fmt, block):
    from oracle.ops import _blockcases

    assert any(c.p.get("values") == "nonfinite" and c.p.get("shape") == (4, 40)
               for c in catalogue("reshape_and_cache_block", "quick"))
    x = _blockcases.values(np.random.default_rng(0), "nonfinite", fmt, (3, 4, 40), "float32").reshape(-1, 40)
    tail = x[1, 40 // block * block:]
    assert tail.size == 40 % block and np.isnan(tail).all()
    assert not np.isnan(x[1, : 40 // block * block]).all()


def test_the_swizzled_scale_cache_gets_a_head_size_after_another_with_the_same_heads():
    from oracle.ops._repeat import calls_before

    after = [c for c in catalogue("reshape_and_cache_block", "quick") if str(c.p.get("after", "")).startswith("shape=")]
    assert [c.id for c in after] == ["8x96-swizzled_scales-after_shape_8x128"]
    own, other = calls_before(after[0])
    assert own.p["shape"][0] == other.p["shape"][0] and own.p["shape"][1] != other.p["shape"][1]
    assert own.p["scale_layout"] == other.p["scale_layout"] == "swizzled"
