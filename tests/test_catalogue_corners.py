"""Meta-tests: corner inputs of the catalogue and the kernels only they catch.

Every 16-bit source pattern under fp8 (a conversion table one entry short), a scale just past 1
(a unit-scale fast path with a tolerance), a prefill's run of slots across block boundaries in
HND (a slab copy), odd slots past 2**24 in an int32 index (a sort key built in the index's dtype),
unquantized calls on an fp8 cache and unknown kv_cache_dtype names (taken for a plain copy), a
block-scaled token whose whole row is signed zeros (taken for padding), an index with the first
call's length and ends (a memo keyed on them) and a per-head scale after a per-tensor one (a plan
keyed without the scale's kind). Each kernel fails its case and passes the ordinary one, and the
torch baseline passes both.
"""

from dataclasses import replace

import pytest
import torch

from oracle.cases import catalogue
from oracle.kernels import torch_block as tb
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel, default_registry
from oracle.runner import FAIL, PASS, run_case

BASELINES = {k.name: k for k in default_registry.discover().select(backend="torch")}


def like(baseline: str, fn) -> Kernel:
    return Kernel(replace(BASELINES[baseline].contract, name="corner." + fn.__name__), fn, "test")


def outcome(kernel: Kernel, case_id: str):
    op = kernel.contract.op
    return run_case(kernel, next(c for c in catalogue(op, "quick", kernel.contract) if c.id == case_id))


def caught_only_by(kernel: Kernel, case_id: str, ordinary: str) -> None:
    assert outcome(kernel, case_id).status == FAIL
    assert outcome(kernel, ordinary).status == PASS
    assert outcome(BASELINES["torch." + kernel.contract.op], case_id).status == PASS


def _table_without_the_last_pattern(fmt: str, dtype: torch.dtype) -> torch.Tensor:
    """Unit-scale codes of every 16-bit pattern, built over arange(-32768, 32767): 0x7FFF left 0."""
    patterns = torch.arange(-32768, 32767, dtype=torch.int32).to(torch.int16)
    table = torch.zeros(1 << 16, dtype=torch.uint8)
    codes = torch.empty((patterns.numel(), 1, 1), dtype=torch.uint8)
    tn.quantize_fp8(codes, patterns.view(dtype).reshape(-1, 1, 1), torch.ones(1), fmt)
    table[patterns.long() & 0xFFFF] = codes.reshape(-1)
    return table


def quantize_through_a_table(out, x, scale, fmt):
    if x.dtype in (torch.bfloat16, torch.float16) and scale.numel() == 1 and float(scale) == 1.0:
        table = _table_without_the_last_pattern(fmt, x.dtype)
        out.copy_(table[x.contiguous().view(torch.int16).long() & 0xFFFF])
        return
    tn.quantize_fp8(out, x, scale, fmt)


def test_every_16_bit_pattern_catches_a_conversion_table_one_entry_short():
    caught_only_by(like("torch.quantize_fp8", quantize_through_a_table), "bf16-e4m3fn-scale_1.0-every_bits-N128",
                   "e4m3fn-scale_1.0-special")


def unit_scale_within_a_tolerance(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    if kv_cache_dtype != "auto" and abs(float(scale) - 1.0) < 1e-3:
        scale = torch.ones_like(scale)
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


def test_a_scale_just_past_one_catches_a_unit_scale_test_with_a_tolerance():
    kernel = like("torch.concat_and_cache_mla", unit_scale_within_a_tolerance)
    caught_only_by(kernel, "fp16-e4m3fn-scale_1.0009765625-random", "e4m3fn-scale_1.0-random")
    assert outcome(kernel, "fp16-e4m3fn-scale_1.0009765625-random").cause["id"] == "scale_missing"


def slab_copy_of_a_run(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """Each run of consecutive slots copied as one slab of token rows, as if blocks were dense NHD."""
    slots = slot_mapping.long()
    if kv_cache_dtype != "auto" or len(slots) < 2 or bool((slots < 0).any()):
        return tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                          k_scale, v_scale)
    starts = [0] + [i + 1 for i in torch.nonzero(slots.diff() != 1).reshape(-1).tolist()] + [len(slots)]
    for cache, rows in ((key_cache, key), (value_cache, value)):
        flat = cache.as_strided((cache.shape[0] * cache.shape[1],) + cache.shape[2:],
                                (cache.stride(1),) + cache.stride()[2:], cache.storage_offset())
        for begin, end in zip(starts, starts[1:]):
            first = int(slots[begin])
            flat[first:first + end - begin] = rows[begin:end]


@pytest.mark.parametrize("case_id", ["HND-run_slots-N133", "padded_cache-run_slots-N133"])
def test_a_run_across_block_boundaries_catches_a_slab_copy(case_id):
    caught_only_by(like("torch.reshape_and_cache_flash", slab_copy_of_a_run), case_id, "run_slots-N133")


def sorted_by_an_int32_key(k, v, k_cache, v_cache, loc):
    """Rows sorted by ``slot << 16 | position`` for locality, the key built in the index's dtype."""
    position = torch.arange(len(loc), dtype=loc.dtype)
    key = (loc << 16) | position
    order = torch.argsort(key)
    tn.store_cache(k[order], v[order], k_cache, v_cache, ((key[order] >> 16)).to(loc.dtype))


def test_odd_slots_past_two_to_the_24_in_an_int32_index_catch_a_key_built_in_int32():
    caught_only_by(like("torch.store_cache", sorted_by_an_int32_key), "u8-int32-1x1-past_float_slots-N7",
                   "int32-N133")


def copies_unless_named(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """Any name but the fp8 ones a plain copy, whatever the cache holds."""
    if kv_cache_dtype not in ("e4m3fn", "e5m2", "fp8", "fp8_e4m3", "fp8_e5m2"):
        rows = torch.cat([kv_c, k_pe], dim=-1).to(kv_cache.dtype)
        live = slot_mapping >= 0
        flat = kv_cache.reshape(-1, kv_cache.shape[-1])
        flat[slot_mapping[live].long()] = rows[live]
        return
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


@pytest.mark.parametrize("case_id", ["bad_auto_cache_dtype", "bad_kv_cache_dtype"])
def test_an_unquantized_call_on_an_fp8_cache_and_an_unknown_name_are_bad_input(case_id):
    kernel = like("torch.concat_and_cache_mla", copies_unless_named)
    result = outcome(kernel, case_id)
    assert result.status == FAIL and result.cause["id"] == "validation_missing", result.message
    assert outcome(BASELINES["torch.concat_and_cache_mla"], case_id).status == PASS


def zero_rows_taken_for_padding(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                                slot_mapping, fmt, k_global_scale, v_global_scale):
    """A token whose key row is all zeros skipped, as a padding row the batch was filled with."""
    empty = (key.reshape(len(key), -1) == 0).all(dim=1)
    slots = torch.where(empty[: len(slot_mapping)], torch.full_like(slot_mapping, -1), slot_mapping)
    tb.reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                               slots, fmt, k_global_scale, v_global_scale)


def test_a_token_row_of_signed_zeros_catches_a_writer_that_takes_it_for_padding():
    kernel = like("torch.reshape_and_cache_block", zero_rows_taken_for_padding)
    caught_only_by(kernel, "mxfp8_e4m3fn-zero_blocks", "mxfp8_e4m3fn-special")


def sizes_its_offsets_from_the_largest_slot(key, value, key_cache, value_cache, slot_mapping, *rest):
    """32- or 64-bit offsets chosen from the largest live slot: max() of an empty selection raises."""
    wide = int(slot_mapping[slot_mapping >= 0].max()) * key_cache.stride(1) >= 1 << 31  # noqa: F841
    return tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest)


@pytest.mark.parametrize("case_id", ["int32-N0", "int32-pad_negative-N1"])
def test_a_call_with_nothing_to_write_that_raises_is_named(case_id):
    result = outcome(like("torch.reshape_and_cache_flash", sizes_its_offsets_from_the_largest_slot), case_id)
    assert result.status == FAIL and result.cause["id"] == "empty_call_raised", result.message
    assert ("empty call" if case_id.endswith("N0") else "all padding") in result.cause["text"]


def compacts_the_live_entries(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """The padding dropped from the index, the first m source rows kept: right only for tail padding."""
    live = slot_mapping >= 0
    count = int(live.sum())
    tn.concat_and_cache_mla(kv_c[:count], k_pe[:count], kv_cache, slot_mapping[live], kv_cache_dtype, scale)


def test_live_entries_compacted_with_the_first_source_rows_are_named():
    result = outcome(like("torch.concat_and_cache_mla", compacts_the_live_entries), "int32-pad_negative")
    assert result.status == FAIL and result.cause["id"] == "rows_misrouted", result.message
    assert "compacted to the front" in result.cause["text"]


def accumulates_into_the_rows(kv_buffer, loc, nope, rope):
    """The scatter written as an accumulation: old + new where a store was meant."""
    kv_buffer[:, : nope.shape[1] + rope.shape[1]].index_put_(
        (loc.long(),), torch.cat([nope, rope], dim=-1).to(kv_buffer.dtype), accumulate=True)


@pytest.mark.parametrize("case_id", ["int32-N133", "u8-int32"])
def test_rows_added_to_what_the_cache_held_are_named(case_id):
    result = outcome(like("torch.set_mla_kv_buffer", accumulates_into_the_rows), case_id)
    assert result.status == FAIL and result.cause["id"] == "accumulated_into_cache", result.message


def one_pitch_for_k_and_v(k, v, k_cache, v_cache, loc):
    """V's rows read at K's row stride, as one pitch computed for both sources."""
    tn.store_cache(k, v.as_strided(v.shape, (k.stride(0),) + v.stride()[1:], v.storage_offset()), k_cache, v_cache, loc)


def test_a_source_read_at_the_other_sources_row_stride_is_named():
    result = outcome(like("torch.store_cache", one_pitch_for_k_and_v), "bf16-1x64x97-N7")
    assert result.status == FAIL and result.cause["id"] == "source_stride_ignored", result.message
    assert "k's row stride" in result.cause["text"]


def tail_heads_by_head_0(out, x, scale, fmt):
    """Heads quantized four at a time under their own scales, the H % 4 left over by scale[0]."""
    if scale.numel() > 1:
        scale = scale.clone()
        scale[scale.numel() - scale.numel() % 4:] = scale[0]
    tn.quantize_fp8(out, x, scale, fmt)


def test_the_heads_past_the_last_whole_group_scaled_by_head_0_are_named():
    result = outcome(like("torch.quantize_fp8", tail_heads_by_head_0), "e4m3fn-13x46-scale_head-random")
    assert result.status == FAIL and result.cause["id"] == "scale_misindexed", result.message
    assert "the last 1 head(s) (past the last whole group of 2 or 4)" in result.cause["text"]


# --- state kept between calls: an index fingerprint, a plan keyed without the scale's kind --------

def fingerprinted_store_cache():
    """store_cache that memoizes each index's slots under (length, first entry, last entry), as
    if every index with those were the same one: right on the first call of each fingerprint."""
    memo = {}

    def fingerprinted(k, v, k_cache, v_cache, loc):
        key = (loc.shape[0], int(loc[0]), int(loc[-1])) if loc.shape[0] else None
        slots = memo.setdefault(key, loc.clone())
        tn.store_cache(k, v, k_cache, v_cache, slots)
    return fingerprinted


def test_an_index_memoized_by_its_length_and_ends_is_caught_by_the_interior_repeat_and_named():
    kernel = like("torch.store_cache", fingerprinted_store_cache())
    result = outcome(kernel, "repeat_interior")
    assert result.status == FAIL and result.cause["id"] == "stale_state", result.message
    assert "first call's length and first and last entries" in result.cause["text"]
    assert outcome(BASELINES["torch.store_cache"], "repeat_interior").status == PASS


def plan_keyed_without_the_scale_kind():
    """reshape_and_cache_flash with a launch plan per (dtypes, shape) that records whether the
    scales are per head, so a per-head call after a per-tensor one uses head 0's scale."""
    plans = {}

    def planned(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        plan = plans.setdefault((kv_cache_dtype, key.dtype, tuple(key.shape[1:])), k_scale.numel() > 1)
        if not plan:
            k_scale, v_scale = k_scale.reshape(-1)[:1], v_scale.reshape(-1)[:1]
        tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                   v_scale)
    return planned


def test_a_plan_keyed_without_the_scale_kind_is_caught_by_the_after_case():
    kernel = like("torch.reshape_and_cache_flash", plan_keyed_without_the_scale_kind())
    result = outcome(kernel, "e4m3fn-scale_0.0123-after_scale_head")
    # the second call's own diagnosis is kept (the variant may be wrong alone), and the verdict
    # says which call it was and what passed before it
    assert result.status == FAIL and result.cause["id"] == "scale_collapsed", result.message
    assert result.message.startswith("the second of the case's three calls (e4m3fn-scale_head) failed, right "
                                     "after a call of e4m3fn-scale_0.0123 that passed"), result.message
    fresh = like("torch.reshape_and_cache_flash", plan_keyed_without_the_scale_kind())
    assert outcome(fresh, "e4m3fn-scale_head-after_scale_0.0123").status == PASS  # its plan made per head
    assert outcome(BASELINES["torch.reshape_and_cache_flash"], "e4m3fn-scale_0.0123-after_scale_head").status == PASS
