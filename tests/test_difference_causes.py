"""Meta-tests: causes read off the difference itself, where no replay builds the kernel's memory.

A kernel that clears memory outside its entries (``stray_writes``), a block-scaled writer that
leaves each head's partial last block to no path (``partial_block_mishandled``), and one whose
element multiplier overflows for the blocks of the smallest scales (``block_multiplier_range``)
are each caught and named; the torch baselines pass the same cases. Writes that land in a copy of
a cache view that is not contiguous name the views left as they were.
"""

from dataclasses import replace

import numpy as np
import pytest
import torch

from oracle.cases import catalogue
from oracle.kernels import torch_block as tb
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel, default_registry
from oracle.runner import FAIL, PASS, run_case

BASELINES = {k.name: k for k in default_registry.discover().select(backend="torch")}


def outcome_of(fn, op: str, case_id: str, baseline: str | None = None):
    contract = BASELINES[baseline or f"torch.{op}"].contract
    kernel = Kernel(replace(contract, name="read_off." + fn.__name__), fn, "test")
    case = next(c for c in catalogue(op, "quick", contract) if c.id == case_id)
    return run_case(kernel, case)


def blocks_cleared_first(key, value, key_cache, value_cache, slot_mapping, *rest):
    """Each block a slot lands in is zeroed before the write (a kernel that takes a block it
    starts writing for a fresh one)."""
    slots = slot_mapping.long()
    blocks = torch.unique(slots[slots >= 0] // key_cache.shape[1])
    key_cache[blocks] = 0
    value_cache[blocks] = 0
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest)


def test_memory_cleared_outside_the_entries_is_named_stray_writes():
    outcome = outcome_of(blocks_cleared_first, "reshape_and_cache_flash", "bf16-int64")
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "stray_writes", outcome.message
    assert "all set to 0x00" in outcome.cause["text"] and "key_cache" in outcome.cause["text"]


def an_unwritten_row_zeroed(k, v, k_cache, v_cache, loc):
    """Writes every row right, then clears the first row no entry writes (a scratch store into
    memory the call does not own)."""
    tn.store_cache(k, v, k_cache, v_cache, loc)
    written = set(loc.reshape(-1).tolist())
    k_cache[next(s for s in range(k_cache.shape[0]) if s not in written)] = 0


def test_a_row_no_entry_writes_cleared_is_named_and_the_baseline_passes():
    outcome = outcome_of(an_unwritten_row_zeroed, "store_cache", "bf16-int64")
    assert outcome.status == FAIL and outcome.cause["id"] == "stray_writes", outcome.message
    assert "in 1 run(s)" in outcome.cause["text"]
    assert run_case(BASELINES["torch.store_cache"],
                    next(c for c in catalogue("store_cache", "quick") if c.id == "bf16-int64")).status == PASS


def whole_blocks_only(codes, scales, x, fmt, global_scale):
    """MX and NVFP4 over whole blocks only: each head's partial last block (codes and scale) is
    never written."""
    block = 32 if fmt.startswith("mx") else 16
    whole = x.shape[-1] - x.shape[-1] % block
    per = whole if fmt.startswith("mx") else whole // 2
    kept_codes, kept_scales = codes[..., per:].clone(), scales[..., -1:].clone()
    tb.quantize_block(codes, scales, x, fmt, global_scale)
    if whole < x.shape[-1]:
        codes[..., per:] = kept_codes
        scales[..., -1:] = kept_scales


@pytest.mark.parametrize("case_id", ["mxfp8_e4m3fn-4x40-special", "nvfp4-4x40-special", "bf16-4x40-N7"])
def test_a_partial_last_block_left_unwritten_is_named(case_id):
    outcome = outcome_of(whole_blocks_only, "quantize_block", case_id)
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "partial_block_mishandled", outcome.message
    assert "elements 32-39" in outcome.cause["text"]


def half_multiplier(codes, scales, x, fmt, global_scale):
    """MX through a float16 multiplier 2^-E: past 2^15 it is inf, so a nonzero element becomes
    inf (saturated to the largest code) and a zero NaN; the scale bytes are right."""
    tb.quantize_block(codes, scales, x, fmt, global_scale)
    if not fmt.startswith("mx"):
        return
    overflow = (127 - scales.long() >= 16).repeat_interleave(32, dim=-1)[..., : x.shape[-1]]
    largest = 0x7E if fmt == "mxfp8_e4m3fn" else 0x7B
    sign = torch.signbit(x.float()).to(torch.uint8) << 7
    blown = torch.where(x.float() == 0, torch.full_like(codes, 0x7F), sign | largest)
    codes.copy_(torch.where(overflow, blown, codes))


@pytest.mark.parametrize("case_id", ["fp16-mxfp8_e4m3fn-special", "fp16-mxfp8_e5m2-special"])
def test_elements_wrong_exactly_past_a_multiplier_are_named_with_the_type_whose_range_ends_there(case_id):
    outcome = outcome_of(half_multiplier, "quantize_block", case_id)
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "block_multiplier_range", outcome.message
    assert "2^16 or more" in outcome.cause["text"] and "float16's largest power of two" in outcome.cause["text"]
    assert run_case(BASELINES["torch.quantize_block"],
                    next(c for c in catalogue("quantize_block", "quick") if c.id == case_id)).status == PASS


def heads_counted_in_half_words(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """An "auto" copy whose bytes per head are D * 2 (a half's size): float32 heads get their
    first D / 2 elements only."""
    if key.dtype != torch.float32 or kv_cache_dtype != "auto":
        return tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                          k_scale, v_scale)
    half = key.shape[-1] // 2
    tn.reshape_and_cache_flash(key[..., :half], value[..., :half], key_cache[..., :half], value_cache[..., :half],
                               slot_mapping, kv_cache_dtype, k_scale, v_scale)


def test_each_head_copied_short_by_a_unit_is_named_with_the_unit():
    outcome = outcome_of(heads_counted_in_half_words, "reshape_and_cache_flash", "fp32-int64")
    assert outcome.status == FAIL and outcome.cause["id"] == "row_tail_dropped", outcome.message
    assert "first 64 of its 128 elements" in outcome.cause["text"] and "2-byte ones" in outcome.cause["text"]


def written_through_a_reshape(key, value, key_cache, value_cache, slot_mapping, *rest):
    """Each cache flattened to its slots with reshape, then indexed: reshape returns a copy of a
    view that is not contiguous (an HND, padded or aliased cache), and the writes land there."""
    staged = [torch.empty_like(c).copy_(c) for c in (key_cache, value_cache)]
    tn.reshape_and_cache_flash(key, value, *staged, slot_mapping, *rest)  # the rows as they should be
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    for cache, want in zip((key_cache, value_cache), staged):
        flat = cache.reshape(-1, *cache.shape[2:])
        flat[slots] = want.reshape(-1, *want.shape[2:])[slots]


@pytest.mark.parametrize("case_id, cause, words", [
    ("padded_cache", "nothing_written", "key_cache and value_cache are views that are not contiguous"),
    ("unequal_cache", "cache_layout_ignored", "value_cache left exactly as it was: the writes went into a copy"),
])
def test_writes_that_land_in_a_copy_of_a_view_are_named_with_the_view(case_id, cause, words):
    outcome = outcome_of(written_through_a_reshape, "reshape_and_cache_flash", case_id)
    assert outcome.status == FAIL and outcome.cause["id"] == cause, outcome.message
    assert words in outcome.cause["text"], outcome.cause["text"]
    assert outcome_of(written_through_a_reshape, "reshape_and_cache_flash", "bf16-int64").status == PASS
