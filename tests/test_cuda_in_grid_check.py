"""The validating CUDA MLA writer's check inside its own grid (SlotCheck mode 3, mla_checked.cu).

An index of 257 to ``mla_checked_rows`` entries is checked by the writer's own grid, which meets at
a barrier over the grid before its first store; the barrier's words live per stream and carry from
one call to the next. These tests run the writer against torch's ``index_put_`` on whole poisoned
caches, with the knob ``mla_check_in_grid`` on (that path) and off (the check grid), and check
what must hold across calls: legal and illegal calls in any order, both index dtypes, with and
without PDL, on two streams at once, and past the one-pass size where the check grid takes over.
GPU only (Hopper)."""

from __future__ import annotations

import pytest
import torch

import oracle.kernels
import oracle.kernels.cuda as cuda_kernels

GPU_REASON = cuda_kernels.available()
gpu = pytest.mark.skipif(GPU_REASON is not None, reason=f"CUDA kernels unavailable: {GPU_REASON}")
POISON = 3.0


def _call(n: int, seed: int, index_dtype=torch.int64):
    gen = torch.Generator().manual_seed(seed)
    nope = (torch.randn(n, 512, generator=gen) * 4).to(torch.bfloat16).cuda()
    rope = (torch.randn(n, 64, generator=gen) * 4).to(torch.bfloat16).cuda()
    num_slots = 2 * n + 7
    loc = torch.randperm(num_slots, generator=gen)[:n].to(index_dtype).cuda()
    return nope, rope, loc, num_slots


def _expected(nope, rope, loc, num_slots):
    want = torch.full((num_slots, 576), POISON, dtype=torch.bfloat16, device="cuda")
    want[loc.long()] = torch.cat([nope, rope], 1)
    return want


def _same(a, b):
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.fixture
def in_grid():
    """Sets mla_check_in_grid for a test and restores the default after it."""
    tune = cuda_kernels.ops().tune
    default = tune("mla_check_in_grid", 1)
    tune("mla_check_in_grid", default)
    yield lambda on: tune("mla_check_in_grid", 1 if on else 0)
    tune("mla_check_in_grid", default)


@gpu
def test_one_pass_size_covers_a_few_thousand_rows():
    rows = cuda_kernels.ops().mla_checked_rows(1152)
    assert 4096 <= rows < 65536, rows


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("pdl", [True, False])
def test_legal_and_illegal_calls_in_any_order(in_grid, index_dtype, pdl):
    """Legal, illegal (too large, then negative), legal, illegal...: each legal call writes exactly
    what index_put_ writes over a poisoned cache, each illegal one writes nothing and its error
    names the entry and value; with the in-grid check and with the check grid alike."""
    for on in (True, False):
        in_grid(on)
        for n in (257, 1000, 4096):
            nope, rope, loc, num_slots = _call(n, n, index_dtype)
            want = _expected(nope, rope, loc, num_slots)
            for round_ in range(3):
                got = torch.full_like(want, POISON)
                cuda_kernels.set_mla_kv_buffer(got, loc, nope, rope, pdl=pdl)
                oracle.kernels.raise_deferred_errors()
                assert _same(got, want), (on, n, round_)
                entry = (n * (round_ + 1)) // 4
                value = num_slots + round_ if round_ != 1 else -1
                bad = loc.clone()
                bad[entry] = value
                untouched = torch.full_like(want, POISON)
                cuda_kernels.set_mla_kv_buffer(untouched, bad, nope, rope, pdl=pdl)
                with pytest.raises(oracle.kernels.DeferredSlotError, match=rf"\[{entry}\] = {value} is out of range"):
                    oracle.kernels.raise_deferred_errors()
                assert bool((untouched == POISON).all()), (on, n, round_)


@gpu
def test_every_illegal_entry_position_is_caught(in_grid):
    """The illegal entry in the first, last, or any block's share of the index, several at once:
    the first of them is named and nothing is written."""
    in_grid(True)
    n = 3000
    nope, rope, loc, num_slots = _call(n, 11)
    for entries in ([0], [n - 1], [511], [512], [1234, 77], [2999, 2998, 5]):
        bad = loc.clone()
        bad[entries] = num_slots
        got = torch.full((num_slots, 576), POISON, dtype=torch.bfloat16, device="cuda")
        cuda_kernels.set_mla_kv_buffer(got, bad, nope, rope)
        with pytest.raises(oracle.kernels.DeferredSlotError, match=rf"\[{min(entries)}\] = {num_slots} is out of"):
            oracle.kernels.raise_deferred_errors()
        assert bool((got == POISON).all()), entries


@gpu
def test_two_streams_at_once(in_grid):
    """Calls on two new streams run concurrently, each with its own barrier words, which the first
    call on each stream sets up without synchronizing."""
    in_grid(True)
    calls = [_call(2048, seed) for seed in (21, 22)]
    streams = [torch.cuda.Stream() for _ in calls]
    outs = [torch.full((c[3], 576), POISON, dtype=torch.bfloat16, device="cuda") for c in calls]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(20):
            for (nope, rope, loc, _), out, stream in zip(calls, outs, streams):
                with torch.cuda.stream(stream):
                    cuda_kernels.set_mla_kv_buffer(out, loc, nope, rope)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
    oracle.kernels.raise_deferred_errors()
    for call, out in zip(calls, outs):
        assert _same(out, _expected(*call))


@gpu
def test_past_one_pass_the_check_grid_takes_over(in_grid):
    """Around the one-pass size (either path, whichever the size picks) every write is exact."""
    in_grid(True)
    rows = cuda_kernels.ops().mla_checked_rows(1152)
    for n in (rows - 1, rows, rows + 1, 2 * rows + 5):
        nope, rope, loc, num_slots = _call(n, n)
        got = torch.full((num_slots, 576), POISON, dtype=torch.bfloat16, device="cuda")
        cuda_kernels.set_mla_kv_buffer(got, loc, nope, rope)
        oracle.kernels.raise_deferred_errors()
        assert _same(got, _expected(nope, rope, loc, num_slots)), n
