"""Sparse regions (the large-cache case class): snapshots keep only what views can reach, yet any
byte changed anywhere in the region is still found and named."""

import gc

import numpy as np
import pytest
import torch

from oracle import buffers
from oracle.buffers import TILE_BYTES, Arena, SparseBytes, same_bytes
from oracle.compare import expected_regions, first_difference
from oracle.contract import Contract
from oracle.kernels.torch_native import store_cache as good_store_cache
from oracle.ops import _build
from oracle.ops.base import Case
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

STRIDE = 3 * TILE_BYTES + 40  # rows far apart, and not in step with the poison's period


def small_sparse_arena():
    arena = Arena("cpu", seed=11)
    arena.region("cache", 5 * STRIDE, guard=256, sparse=True)
    arena.view("cache_view", "cache", (5, 4, 8), (STRIDE, 8, 1), 100, "uint8", role="cache")
    return arena


def test_snapshot_keeps_guards_and_rows_only():
    arena = small_sparse_arena()
    snap = arena.snapshot()["cache"]
    assert isinstance(snap, SparseBytes)
    assert snap.data.size == 2 * 256 + 5 * 32  # two guard bands and five 32-byte rows
    full = arena.regions["cache"].tensor.numpy()
    twin = arena.numpy_view(arena.snapshot(), "cache_view")
    for row in range(5):
        start = 256 + 100 + row * STRIDE
        assert np.array_equal(twin[row].reshape(-1), full[start: start + 32])
    offsets = [0, 255, 256 + 99, 256 + 100 + STRIDE - 1, full.size - 1]
    for at in offsets:  # bytes outside the windows read back from the tile
        assert snap.read(at, 1)[0] == full[at]


def test_poison_is_never_constant_over_a_row_stride():
    full = small_sparse_arena().regions["cache"].tensor.numpy()
    assert not np.array_equal(full[356: 356 + 32], full[356 + STRIDE: 356 + STRIDE + 32])


def test_write_outside_every_view_is_found_and_named():
    arena = small_sparse_arena()
    before = arena.snapshot()
    view = arena.torch_view(arena.views["cache_view"])
    raw = arena.regions["cache"].tensor
    raw[256 + 100 + STRIDE // 2] ^= 0xFF  # between rows 0 and 1: no view covers it
    after = arena.snapshot()
    assert after["cache"].stray_count == 1 and not same_bytes(before["cache"], after["cache"])
    regions, _ = expected_regions(arena, before, after, {"cache_view": arena.numpy_view(before, "cache_view")})
    difference = first_difference(arena, regions, after)
    assert difference is not None
    assert difference.first["byte"] == 100 + STRIDE // 2
    del view


def test_write_inside_a_row_is_named_by_element():
    arena = small_sparse_arena()
    before = arena.snapshot()
    arena.torch_view(arena.views["cache_view"])[3, 2, 5] ^= 0x5A
    after = arena.snapshot()
    regions, _ = expected_regions(arena, before, after, {"cache_view": arena.numpy_view(before, "cache_view")})
    difference = first_difference(arena, regions, after)
    assert "cache_view[3, 2, 5]" in difference.text
    assert "1 of 5 slots" in difference.text


def int32_offsets_store_cache(k, v, k_cache, v_cache, loc):
    """store_cache as a C kernel with ``int offset = slot * stride`` would write it."""
    for src, cache in ((k, k_cache), (v, v_cache)):
        storage = torch.empty(0, dtype=torch.uint8).set_(cache.untyped_storage())
        row = src[0].numel()
        for i, slot in enumerate(loc.tolist()):
            offset = np.array(slot * cache.stride(0), dtype=np.int64).astype(np.int32)  # wraps
            start = cache.storage_offset() + int(offset)
            storage[start: start + row] = src[i].reshape(-1).view(torch.uint8)


LARGE = Case.make("store_cache", "large", dtype="uint8", n=7, large=True)


def kernel(fn):
    return Kernel(Contract(op="store_cache", name=fn.__name__, backend="test", dtypes=("uint8",)), fn, "test")


@pytest.mark.parametrize("fn", [good_store_cache, int32_offsets_store_cache], ids=lambda f: f.__name__)
def test_large_case_passes_64_bit_offsets_and_names_int32_wraparound(fn):
    outcome = run_case(kernel(fn), LARGE)
    if fn is good_store_cache:
        assert outcome.status == PASS, outcome.message
        return
    assert outcome.status == FAIL
    # slot 62 wraps to 2**27 bytes below k_cache: two rows of 2**26 before it, in the lead
    assert "k_cache[-2, 0, 0]" in outcome.message, outcome.message
    assert outcome.first["byte"] == _build.LARGE_LEAD - 2 * _build.LARGE_STRIDE
    # named by the probe that moves the rows past 2**31 elements below it, which then pass
    assert outcome.cause["id"] == "int32_offsets", outcome.message


def test_large_failure_bundle_replays_to_the_same_difference(tmp_path):
    from oracle.bundle import replay, write_bundle

    bad = kernel(int32_offsets_store_cache)
    outcome = run_case(bad, LARGE)
    path = write_bundle(tmp_path, bad, LARGE, outcome)
    assert path.stat().st_size < 10 << 20  # windows only, not the 4 GB region
    passed, report = replay(path, bad)
    assert not passed and "k_cache[-2, 0, 0]" in report
    passed, report = replay(path, kernel(good_store_cache))
    assert passed, report


def test_a_pool_mapped_for_huge_pages_is_ordinary_host_memory_for_as_long_as_it_lives():
    pool = buffers.fill_tiled(buffers.HUGE_PAGES_FROM + 4096, np.arange(64, dtype=np.uint8), "cpu")
    view = pool[buffers.HUGE_PAGES_FROM:]  # the mapping must outlive the tensor it was made for
    del pool
    gc.collect()
    assert view.numel() == 4096 and view.dtype == torch.uint8 and view.device.type == "cpu"
    assert torch.equal(view[:64], torch.arange(64, dtype=torch.uint8))
    view.fill_(0xA5)
    assert int(view.sum()) == 0xA5 * 4096
