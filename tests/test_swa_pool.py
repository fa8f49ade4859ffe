"""SwaKVPool (oracle.kernels.swa_pool): hand-computed allocator scenarios, the translation cache
(keyed on data_ptr, invalidated on every mutation), strict translation, set_kv_buffer, the
plug-in; and the stateful conformance machine (conformance/test_swa_pool.py) catching every
mutant pool of oracle.mutants.swa_pool with a short, printed step sequence.

Expected mappings are written out by hand from the documented contract (lowest free page first,
page 0 reserved, page-granular clearing), never produced by the code under test.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import weakref
from pathlib import Path

import pytest
import torch
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

import conformance.test_swa_pool as machine
from oracle.kernels import swa_pool
from oracle.kernels.swa_pool import MUTATORS, SwaKVPool, translate_full_to_swa
from oracle.mutants.swa_pool import (POOL_MUTANTS, FreeClearsOnlyToken, KeyedOnStorageBase,
                                     TranslateWrapsNegative, forgets_invalidation)
from oracle.registry import Registry

REPO = Path(__file__).resolve().parents[1]


def t(*values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def mapping(pool: SwaKVPool) -> list:
    return pool.full_to_swa_index_mapping.tolist()


def state(pool: SwaKVPool):
    return (mapping(pool), pool.live_full_slots.tolist(), pool.available_full, pool.available_swa)


# ------------------------------------------------------------------ construction

def test_fresh_pool_layout():
    pool = SwaKVPool(size_full=8, size_swa=4, page_size=2)
    m = pool.full_to_swa_index_mapping
    assert m.dtype == torch.int64 and m.device.type == "cpu"
    assert m.tolist() == [0] * 10 + [-1]
    assert (pool.available_full, pool.available_swa) == (8, 4)
    assert pool.live_full_slots.tolist() == []
    assert repr(pool) == "SwaKVPool(size_full=8, size_swa=4, page_size=2, device='cpu')"


@pytest.mark.parametrize("args,exc,pattern", [
    ((0, 4, 1), ValueError, r"size_full=0"),
    ((4, 0, 1), ValueError, r"size_swa=0"),
    ((4, 4, 0), ValueError, r"page_size=0"),
    ((6, 8, 4), ValueError, r"size_full=6 is not a multiple of page_size=4"),
    ((8, 6, 4), ValueError, r"size_swa=6 is not a multiple of page_size=4"),
    ((4.0, 4, 1), TypeError, r"size_full"),
    ((4, 4, True), TypeError, r"page_size"),
])
def test_constructor_rejects(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        SwaKVPool(*args)


def test_kv_buffers_need_heads():
    with pytest.raises(ValueError, match="head_num and head_dim"):
        SwaKVPool(8, 8, 2, num_layers=1)
    pool = SwaKVPool(8, 4, 2, num_layers=2, head_num=3, head_dim=5, dtype=torch.float16)
    assert [tuple(b.shape) for b in pool.k_buffer + pool.v_buffer] == [(6, 3, 5)] * 4
    assert {b.dtype for b in pool.k_buffer + pool.v_buffer} == {torch.float16}


# ------------------------------------------------------------------ allocator, by hand

def test_page_size_4_scenario():
    # full pages 1..4 (slots 4..19), swa pages 1..3 (slots 4..15); table 20 entries + sentinel
    pool = SwaKVPool(size_full=16, size_swa=12, page_size=4)
    z = [0] * 4

    a = pool.alloc(4)
    assert a.tolist() == [4, 5, 6, 7] and a.dtype == torch.int64
    assert mapping(pool) == z + [4, 5, 6, 7] + z + z + z + [-1]

    pool.free_swa(a[2:3])  # one slot names the page: the whole page is cleared, full page kept
    assert mapping(pool) == z * 5 + [-1]
    assert pool.live_full_slots.tolist() == [4, 5, 6, 7]
    assert (pool.available_full, pool.available_swa) == (12, 12)

    b = pool.alloc_extend(-1, 6)  # no prefix: full pages 2, 3; swa pages 1, 2
    assert b.tolist() == [8, 9, 10, 11, 12, 13]
    assert mapping(pool) == z + z + [4, 5, 6, 7] + [8, 9, 0, 0] + z + [-1]

    c = pool.alloc_extend(13, 3)  # 14, 15 continue swa 10, 11; then full page 4 / swa page 3
    assert c.tolist() == [14, 15, 16]
    assert mapping(pool) == z + z + [4, 5, 6, 7] + [8, 9, 10, 11] + [12, 0, 0, 0] + [-1]
    assert (pool.available_full, pool.available_swa) == (0, 0)

    before = state(pool)
    assert pool.alloc_extend(16, 4) is None  # 3 fit on the page, the 4th needs a page: none left
    assert pool.alloc(4) is None
    assert state(pool) == before

    assert pool.alloc_extend(16, 3).tolist() == [17, 18, 19]  # the rest of the page
    assert mapping(pool) == z + z + [4, 5, 6, 7] + [8, 9, 10, 11] + [12, 13, 14, 15] + [-1]

    pool.free(a)  # its SWA page went with free_swa: only the full page is left to free
    assert (pool.available_full, pool.available_swa) == (4, 0)
    pool.free(t(12))  # one slot frees the whole page 3 and its SWA page 2: all four slots
    assert mapping(pool) == z + z + [4, 5, 6, 7] + z + [12, 13, 14, 15] + [-1]
    assert (pool.available_full, pool.available_swa) == (8, 4)
    assert pool.translate_loc_from_full_to_swa(t(8, 12, 13, 16, 19, -1)).tolist() == \
        [4, 0, 0, 12, 15, -1]


def test_page_size_1_and_int32_slots():
    pool = SwaKVPool(size_full=4, size_swa=3, page_size=1)
    assert pool.alloc(2).tolist() == [1, 2]
    assert pool.alloc(2) is None  # swa has one page left
    assert pool.alloc_extend(2, 1).tolist() == [3]
    pool.free_swa(t(1, dtype=torch.int32))
    assert mapping(pool) == [0, 0, 2, 3, 0, -1]
    assert pool.alloc_extend(-1, 1).tolist() == [4]  # swa slot 1 again: lowest free
    assert mapping(pool) == [0, 0, 2, 3, 1, -1]
    pool.free(t(2, 1, 2, dtype=torch.int32))  # duplicates fine; 1 has no SWA page left
    assert mapping(pool) == [0, 0, 0, 3, 1, -1]
    assert (pool.available_full, pool.available_swa) == (2, 1)


def _pool_with_state():
    """page_size 2: request A = full 2..5 (pages 1, 2), B = full 6 (page 3; 7 unmapped); A's
    first page has released its SWA page."""
    pool = SwaKVPool(size_full=10, size_swa=8, page_size=2)
    pool.alloc(4)
    pool.alloc_extend(-1, 1)
    pool.free_swa(t(2))
    assert mapping(pool) == [0, 0, 0, 0, 4, 5, 6, 0, 0, 0, 0, 0, -1]
    return pool


@pytest.mark.parametrize("call,exc,pattern", [
    (lambda p: p.alloc(1.0), TypeError, r"^n must be an int"),
    (lambda p: p.alloc(3), ValueError, r"^n=3 is not a multiple of page_size=2"),
    (lambda p: p.alloc(-2), ValueError, r"^n=-2"),
    (lambda p: p.alloc_extend("6", 1), TypeError, r"^last_loc must be an int"),
    (lambda p: p.alloc_extend(-2, 1), ValueError, r"^last_loc=-2: neither -1 nor a full slot"),
    (lambda p: p.alloc_extend(8, 1), ValueError, r"^last_loc=8: full page 4 is not allocated"),
    (lambda p: p.alloc_extend(3, 1), ValueError, r"^last_loc=3 translates to 0"),
    (lambda p: p.alloc_extend(4, 1), ValueError, r"^last_loc=4 is not the last written slot"),
    (lambda p: p.free([4]), TypeError, r"^full_slots must be a torch.Tensor"),
    (lambda p: p.free(t(4.0, dtype=torch.float32)), TypeError, r"^full_slots has dtype"),
    (lambda p: p.free(t(4).reshape(1, 1)), ValueError, r"^full_slots must be 1-D"),
    (lambda p: p.free(t(4, -1)), ValueError, r"^full_slots\[1\] = -1: not a full slot"),
    (lambda p: p.free(t(4, 6, 8)), ValueError, r"^full_slots\[2\] = 8: full page 4 is not alloc"),
    (lambda p: p.free_swa(t(4, 3)), ValueError, r"full page 1 \(slots 2\.\.3\) has no SWA page"),
    (lambda p: p.set_full_to_swa_mapping(t(12), t(2)), ValueError, r"^full\[0\] = 12"),
    (lambda p: p.set_full_to_swa_mapping(t(8), t(10)), ValueError, r"^swa\[0\] = 10"),
    (lambda p: p.set_full_to_swa_mapping(t(8, 9), t(2)), ValueError, r"^swa has shape"),
    (lambda p: p.set_full_to_swa_mapping(t(8, 8), t(2, 3)), ValueError, r"duplicate"),
    (lambda p: p.register_mapping(t(*[0] * 12, 0)), ValueError, r"sentinel"),
    (lambda p: p.register_mapping(t(0, -1)), ValueError, r"^mapping has shape"),
    (lambda p: p.register_mapping(t(*[0] * 11, 10, -1)), ValueError, r"^mapping\[11\] = 10"),
    (lambda p: p.translate_loc_from_full_to_swa(t(4, -2)), ValueError, r"^loc\[1\] = -2: only -1"),
    (lambda p: p.translate_loc_from_full_to_swa([4]), TypeError, r"^loc must be a torch.Tensor"),
])
def test_rejected_operations_change_nothing(call, exc, pattern):
    pool = _pool_with_state()
    before = state(pool)
    with pytest.raises(exc, match=pattern):
        call(pool)
    assert state(pool) == before


def test_double_free():
    pool = _pool_with_state()
    pool.free(t(6))
    with pytest.raises(ValueError, match=r"full page 3 is not allocated"):
        pool.free(t(6))


def test_clear_keeps_the_sentinel():
    pool = _pool_with_state()
    loc = t(-1, 4, -1)
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == [-1, 4, -1]
    pool.clear()
    assert mapping(pool) == [0] * 12 + [-1]
    assert (pool.available_full, pool.available_swa) == (10, 8)
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == [-1, 0, -1]
    assert pool.alloc(2).tolist() == [2, 3]  # everything free again: lowest pages


# ------------------------------------------------------------------ translation

def test_minus_one_translates_to_minus_one_and_other_negatives_raise():
    pool = SwaKVPool(8, 8, 2)
    pool.alloc(4)  # full 2..5 -> swa 2..5
    assert pool.translate_loc_from_full_to_swa(t(-1)).tolist() == [-1]
    assert pool.translate_loc_from_full_to_swa(t(5, -1, 2, dtype=torch.int32)).tolist() == [5, -1, 2]
    # mapping[-2] is the last table entry (slot 9, unmapped: 0); -2 must not wrap to it
    with pytest.raises(ValueError, match=r"^loc\[0\] = -2: only -1 .* wrap it to mapping\[-2\]"):
        pool.translate_loc_from_full_to_swa(t(-2))
    with pytest.raises(ValueError, match=r"^loc\[1, 0\] = -3"):
        pool.translate_loc_from_full_to_swa(t(2, 3, -3, 4).reshape(2, 2))
    with pytest.raises(ValueError, match=r"^loc\[0\] = 10: past the table .* mapping\[10\] is the sentinel"):
        pool.translate_loc_from_full_to_swa(t(10))


def test_translate_function_shapes_dtypes_strides():
    table = t(0, 7, 3, 0, 9, 2, -1, dtype=torch.int32)  # 6 entries and the sentinel
    out = translate_full_to_swa(table, t(5, -1, 1, 0, 4, 4).reshape(2, 3))
    assert out.dtype == torch.int32 and out.tolist() == [[2, -1, 7], [0, 9, 9]]
    strided = t(1, 99, 2, 99, -1, 99)[::2]
    assert translate_full_to_swa(table, strided).tolist() == [7, 3, -1]
    assert translate_full_to_swa(table, t()).tolist() == []
    with pytest.raises(ValueError, match="sentinel"):
        translate_full_to_swa(t(0, 1, 2), t(0))
    with pytest.raises(TypeError, match="loc has dtype torch.int16"):
        translate_full_to_swa(table, t(1, dtype=torch.int16))
    with pytest.raises(TypeError, match="mapping must be"):
        translate_full_to_swa(table.float(), t(1))
    inputs = (table.clone(), strided.clone())
    out = translate_full_to_swa(table, strided)
    assert torch.equal(table, inputs[0]) and torch.equal(strided, inputs[1])
    out.fill_(5)  # the result owns its memory
    assert torch.equal(table, inputs[0])


def test_default_translate_fn_on_cpu_is_the_torch_translation():
    assert swa_pool.default_translate_fn("cpu") is translate_full_to_swa
    assert SwaKVPool(4, 4, 1).translate_fn is translate_full_to_swa


# ------------------------------------------------------------------ the cache

def _pool_two_requests():
    """page_size 2: full 2..5 -> swa 2..5 (one request of two pages)."""
    pool = SwaKVPool(size_full=8, size_swa=8, page_size=2)
    assert pool.alloc(4).tolist() == [2, 3, 4, 5]
    return pool


def test_views_at_different_offsets_do_not_collide():
    pool = _pool_two_requests()
    buf = t(2, 3, 4, 5, 9, 9)
    lo, hi = buf[0:2], buf[2:4]
    # the premise: one storage base pointer, two data pointers
    assert lo.untyped_storage().data_ptr() == hi.untyped_storage().data_ptr()
    assert lo.data_ptr() != hi.data_ptr()
    pool.set_full_to_swa_mapping(t(2, 3, 4, 5), t(4, 5, 2, 3))  # make the two halves differ
    assert pool.translate_loc_from_full_to_swa(lo).tolist() == [4, 5]
    assert pool.translate_loc_from_full_to_swa(hi).tolist() == [2, 3]
    assert pool.cache_misses == 2 and pool.cache_hits == 0


def test_a_view_at_the_same_offset_is_a_hit():
    pool = _pool_two_requests()
    buf = t(2, 3, 4, 5)
    first = pool.translate_loc_from_full_to_swa(buf[0:2])
    second = pool.translate_loc_from_full_to_swa(buf[0:2])  # another Python object, same view
    assert second is first and first.tolist() == [2, 3]
    assert (pool.cache_hits, pool.cache_misses) == (1, 1)


def test_same_start_and_length_in_other_strides_or_shape_do_not_collide():
    pool = _pool_two_requests()
    buf = t(2, 3, 4, 5, -1, 0)
    contiguous, every_other, rows = buf[0:3], buf[0:6:2], buf[0:4].view(2, 2)
    assert contiguous.data_ptr() == every_other.data_ptr() == rows.data_ptr()
    assert pool.translate_loc_from_full_to_swa(contiguous).tolist() == [2, 3, 4]
    assert pool.translate_loc_from_full_to_swa(every_other).tolist() == [2, 4, -1]
    assert pool.translate_loc_from_full_to_swa(buf[0:4]).tolist() == [2, 3, 4, 5]
    assert pool.translate_loc_from_full_to_swa(rows).tolist() == [[2, 3], [4, 5]]
    assert pool.translate_loc_from_full_to_swa(buf[0:4].to(torch.int32)).dtype == torch.int64


def test_the_storage_base_mutant_does_collide():
    """The mutant is what the real key prevents: the second view gets the first's answer."""
    pool = KeyedOnStorageBase(8, 8, 2)
    pool.alloc(4)
    buf = t(2, 3, 4, 5)
    assert pool.translate_loc_from_full_to_swa(buf[0:2]).tolist() == [2, 3]
    assert pool.translate_loc_from_full_to_swa(buf[2:4]).tolist() == [2, 3]  # should be [4, 5]


def _mutate(pool: SwaKVPool, method: str):
    """Perform ``method`` on the pool of :func:`_pool_two_requests` so that the translation
    of full slots 2..7 changes; returns their new translation, written out by hand."""
    if method == "alloc":
        pool.alloc(2)  # full page 3 -> swa page 3
        return [2, 3, 4, 5, 6, 7]
    if method == "alloc_extend":
        pool.alloc_extend(-1, 1)  # full 6 -> swa 6
        return [2, 3, 4, 5, 6, 0]
    if method == "free":
        pool.free(t(4))  # the whole page 2: both 4 and 5
        return [2, 3, 0, 0, 0, 0]
    if method == "free_swa":
        pool.free_swa(t(3))  # the whole page 1
        return [0, 0, 4, 5, 0, 0]
    if method == "clear":
        pool.clear()
        return [0] * 6
    if method == "set_full_to_swa_mapping":
        pool.set_full_to_swa_mapping(t(2, 3, 4, 5), t(4, 5, 2, 3))  # the two pages trade
        return [4, 5, 2, 3, 0, 0]
    if method == "register_mapping":
        pool.register_mapping(t(0, 0, 4, 5, 2, 3, 0, 0, 0, 0, -1, dtype=torch.int32))
        return [4, 5, 2, 3, 0, 0]
    raise AssertionError(method)


@pytest.mark.parametrize("method", MUTATORS)
def test_every_mutation_invalidates(method):
    pool = _pool_two_requests()
    loc = t(2, 3, 4, 5, 6, 7)
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == [2, 3, 4, 5, 0, 0]
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == [2, 3, 4, 5, 0, 0]  # a hit
    assert pool.cache_hits == 1
    expected = _mutate(pool, method)
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == expected
    assert pool.cache_misses == 2


@pytest.mark.parametrize("method", MUTATORS)
def test_a_mutant_forgetting_one_path_serves_stale_translations(method):
    """The contrast: the same sequence on the mutant that forgets ``method`` is stale."""
    pool = forgets_invalidation(method)(8, 8, 2)
    assert pool.alloc(4).tolist() == [2, 3, 4, 5]
    loc = t(2, 3, 4, 5, 6, 7)
    before = pool.translate_loc_from_full_to_swa(loc).tolist()
    expected = _mutate(pool, method)
    assert expected != before
    assert pool.translate_loc_from_full_to_swa(loc).tolist() == before


def test_a_reused_buffer_needs_the_forward_step_invalidation():
    """The pool cannot see an index buffer rewritten in place: the caller invalidates once per
    forward step (as sglang's graph runners do in run_once); until then the entry stands."""
    pool = _pool_two_requests()
    buffer = t(2, 3, 0)
    assert pool.translate_loc_from_full_to_swa(buffer).tolist() == [2, 3, 0]
    buffer.copy_(t(4, 5, -1))  # the next forward step's locs, same tensor
    assert pool.translate_loc_from_full_to_swa(buffer).tolist() == [2, 3, 0]  # documented hazard
    pool.invalidate_loc_cache()
    assert pool.translate_loc_from_full_to_swa(buffer).tolist() == [4, 5, -1]


def test_a_failed_translation_caches_nothing():
    pool = _pool_two_requests()
    good = t(2, 3)
    assert pool.translate_loc_from_full_to_swa(good).tolist() == [2, 3]
    with pytest.raises(ValueError):
        pool.translate_loc_from_full_to_swa(t(-2, 3))
    assert pool.translate_loc_from_full_to_swa(good).tolist() == [2, 3]
    assert pool.cache_hits == 1  # the entry for `good` survived the failed call


def test_the_cache_keeps_its_tensor_alive_until_invalidated():
    """While an entry exists its tensor stays allocated, so no new tensor can be created at its
    address and be served the entry."""
    pool = _pool_two_requests()
    loc = t(2, 3)
    ref = weakref.ref(loc)
    pool.translate_loc_from_full_to_swa(loc)
    del loc
    gc.collect()
    assert ref() is not None
    pool.invalidate_loc_cache()
    gc.collect()
    assert ref() is None


# ------------------------------------------------------------------ set_kv_buffer

def _kv_pool(**kwargs):
    pool = SwaKVPool(size_full=8, size_swa=4, page_size=2, num_layers=2, head_num=1, head_dim=2,
                     **kwargs)
    pool.alloc(2)  # full 2, 3 -> swa 2, 3
    pool.free_swa(t(2))
    pool.alloc(2)  # full 4, 5 -> swa 2, 3 (the released page, lowest free)
    pool.alloc(2)  # full 6, 7 -> swa 4, 5
    return pool


def rows(*values):
    return torch.tensor(values, dtype=torch.float32).reshape(-1, 1, 1).repeat(1, 1, 2)


def test_set_kv_buffer_writes_at_the_translated_slots():
    pool = _kv_pool()
    pool.set_kv_buffer(1, t(7, 4, 2), rows(1, 2, 3), rows(-1, -2, -3))
    # 7 -> swa 5, 4 -> swa 2, 2 -> 0 (its SWA page was released: the padding slot, as sglang)
    assert pool.k_buffer[1][:, 0, 0].tolist() == [3, 0, 2, 0, 0, 1]
    assert pool.v_buffer[1][:, 0, 1].tolist() == [-3, 0, -2, 0, 0, -1]
    assert not pool.k_buffer[0].any() and not pool.v_buffer[0].any()

    class Layer:
        layer_id = 0
    pool.set_kv_buffer(Layer(), t(6), rows(9), rows(8))
    assert pool.k_buffer[0][4, 0].tolist() == [9, 9]
    assert pool.k_buffer[0][:, 0, 0].tolist() == [0, 0, 0, 0, 9, 0]


def test_set_kv_buffer_rejects_what_the_store_kernel_would_not_skip():
    pool = _kv_pool()
    with pytest.raises(ValueError, match=r"loc\[1\] = -1 translates to -1.*'none'"):
        pool.set_kv_buffer(0, t(7, -1), rows(1, 2), rows(1, 2))
    with pytest.raises(ValueError, match="not a layer"):
        pool.set_kv_buffer(2, t(7), rows(1), rows(1))
    with pytest.raises(ValueError, match="1-D"):
        pool.set_kv_buffer(0, t(7, 6).reshape(1, 2), rows(1, 2), rows(1, 2))
    assert not pool.k_buffer[0].any()
    with pytest.raises(ValueError, match="no KV buffers"):
        SwaKVPool(4, 4, 1).set_kv_buffer(0, t(1), rows(1), rows(1))


def test_set_kv_buffer_through_a_named_or_given_kernel():
    calls = []

    def recording_store(k, v, k_cache, v_cache, loc):
        calls.append(loc.tolist())
        k_cache[loc] = k
        v_cache[loc] = v

    pool = _kv_pool(store_cache=recording_store)
    pool.set_kv_buffer(None, t(6, 5), rows(4, 5), rows(6, 7))
    assert calls == [[4, 3]]
    assert pool.k_buffer[0][:, 0, 0].tolist() == [0, 0, 0, 5, 4, 0]
    with pytest.raises(ValueError, match=r"store_cache='no.such': no store_cache kernel .*torch.store_cache"):
        _kv_pool(store_cache="no.such").set_kv_buffer(0, t(6), rows(1), rows(1))


# ------------------------------------------------------------------ the plug-in

def test_register_declares_an_honest_contract():
    registry = Registry()
    registry.load_plugin("swa_pool", swa_pool.register)
    assert registry.errors == []
    cpu = registry.kernels["swa_pool.translate_full_to_swa"]
    cuda = registry.kernels["swa_pool.translate_full_to_swa.cuda"]
    for kernel in (cpu, cuda):
        c = kernel.contract
        assert (c.op, c.backend, c.padding, c.validates) == ("translate_full_to_swa", "torch",
                                                             "negative", True)
        assert kernel.fn is translate_full_to_swa
    assert cpu.contract.device == "cpu" and cpu.unavailable() is None
    assert cuda.contract.device == "cuda"
    assert (cuda.unavailable() is None) == torch.cuda.is_available()


# ------------------------------------------------------------------ the state machine vs mutants

# bounded for tests: short sequences (quick to shrink), enough examples to find each mutant
MUTANT_SETTINGS = settings(machine.profile_settings("quick"), max_examples=300, stateful_step_count=8)
MAX_STEPS = 8

# a rule that the shrunk sequence of each mutant must contain (the bug's trigger)
TRIGGER = {
    "swa_pool.keyed_on_storage_base": "state.translate_two_views(",
    "swa_pool.forgets_invalidate_on_free_swa": "state.free_swa(",
    "swa_pool.translate_wraps_negative": "state.translate_bad_loc(bad=-",
    "swa_pool.free_clears_only_token": "state.free(",
    "swa_pool.keyed_on_data_ptr_and_numel": "state.translate_two_views(",
}
RULE_OF = {"alloc": "state.alloc(", "alloc_extend": ("state.alloc_new_request(", "state.extend("),
           "free": "state.free(", "free_swa": "state.free_swa(", "clear": "state.clear()",
           "set_full_to_swa_mapping": "state.remap_swap_pages(",
           "register_mapping": "state.register_swapped_mapping("}


def shrunk_steps(pool_cls) -> tuple[list, str]:
    """Run the machine against ``pool_cls``; it must fail. Returns the printed steps (rules and
    initializers, no invariant checks) and the error message."""
    with pytest.raises(AssertionError) as info:
        run_state_machine_as_test(machine.machine_for(pool_cls), settings=MUTANT_SETTINGS)
    notes = getattr(info.value, "__notes__", [])
    assert f"state = SwaPoolMachine_{pool_cls.__name__}()" in notes, notes
    steps = [line for line in notes if "state." in line
             and line not in ("state.invariants_hold()", "state.teardown()")]
    return steps, str(info.value)


def test_the_machine_passes_the_real_pool_under_the_mutant_settings():
    run_state_machine_as_test(machine.machine_for(SwaKVPool), settings=MUTANT_SETTINGS)


@pytest.mark.parametrize("mutant", POOL_MUTANTS, ids=lambda m: m.name)
def test_the_machine_catches_each_mutant(mutant):
    steps, message = shrunk_steps(mutant.cls)
    assert steps[0].startswith("state.init_pool(config=")
    assert len(steps) <= MAX_STEPS, steps
    assert any(step.startswith(TRIGGER[mutant.name]) or f"= {TRIGGER[mutant.name]}" in step
               for step in steps), steps
    assert "the pool gave" in message or "the pool has" in message, message


@pytest.mark.parametrize("method", MUTATORS)
def test_the_machine_catches_a_forgotten_invalidation_on_every_path(method):
    steps, message = shrunk_steps(forgets_invalidation(method))
    assert len(steps) <= MAX_STEPS, steps
    triggers = RULE_OF[method] if isinstance(RULE_OF[method], tuple) else (RULE_OF[method],)
    assert any(trigger in step for step in steps for trigger in triggers), steps
    assert "a stale or colliding cache entry" in message, message


def test_mutant_descriptions_are_one_line():
    assert len({m.name for m in POOL_MUTANTS}) == len(POOL_MUTANTS) == 5
    for mutant in POOL_MUTANTS:
        assert mutant.bug and "\n" not in mutant.bug and issubclass(mutant.cls, SwaKVPool)
    with pytest.raises(ValueError, match="not one of the mutating methods"):
        forgets_invalidation("translate_loc_from_full_to_swa")


def test_free_mutant_breaks_the_freed_slots_invariant():
    pool = FreeClearsOnlyToken(8, 8, 2)
    pool.alloc(2)
    pool.free(t(2))
    assert pool.live_full_slots.tolist() == []
    assert mapping(pool)[3] == 3  # slot 3 of the freed page still maps into the freed SWA page


def test_wraps_mutant_translates_minus_two():
    pool = TranslateWrapsNegative(8, 8, 2)
    pool.alloc(8)  # full 2..9 -> swa 2..9: mapping[-2] is slot 9's entry
    assert pool.translate_loc_from_full_to_swa(t(-2, -1)).tolist() == [9, -1]


def test_the_failure_report_prints_the_shrunk_sequence(tmp_path):
    """End to end: a pytest run of the machine against a mutant prints the step sequence."""
    test_file = tmp_path / "test_machine_vs_mutant.py"
    test_file.write_text(textwrap.dedent("""
        from hypothesis.stateful import run_state_machine_as_test
        import conformance.test_swa_pool as machine
        from oracle.mutants.swa_pool import TranslateWrapsNegative

        def test_mutant():
            run_state_machine_as_test(machine.machine_for(TranslateWrapsNegative),
                                      settings=machine.profile_settings("quick"))
    """))
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    out = subprocess.run([sys.executable, "-m", "pytest", str(test_file), "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    assert out.returncode == 1, out.stdout + out.stderr
    text = out.stdout
    assert "state = SwaPoolMachine_TranslateWrapsNegative()" in text, text
    assert "state.init_pool(config=" in text and "state.translate_bad_loc(bad=-" in text, text
    assert "only -1 (the padding sentinel) may be negative" in text, text


def test_machine_rule_names_are_readable():
    """The names a failure report prints."""
    rules = {name for name in dir(machine.SwaPoolMachine) if not name.startswith("_")}
    assert {"alloc", "alloc_new_request", "extend", "free", "free_swa", "clear", "remap_swap_pages",
            "register_swapped_mapping", "translate_fresh", "translate_two_views", "translate_request",
            "translate_again", "forward_step", "translate_bad_loc", "write_kv",
            "invariants_hold"} <= rules
    assert repr(machine.Request(t(4, 5))) == "Request([4, 5])"
