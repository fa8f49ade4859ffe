"""The validating CUDA MLA writer's check inside its own grid (SlotCheck mode 3, mla_checked.cu).

An index of 257 to ``mla_checked_rows`` entries is checked by the writer's own grid, which meets at
a barrier over the grid before its first store; the barrier's words live per stream and carry from
one call to the next. These tests run the writer against torch's ``index_put_`` on whole poisoned
caches, with the knob ``mla_check_in_grid`` on (that path) and off (the check grid), and check
what must hold across calls: legal and illegal calls in any order, both index dtypes, with and
without PDL, with every block scanning the whole index itself (what a block does once it has
waited at the barrier past ``mla_check_deadline_us``), on two streams at once, two grids that
cannot both be resident on streams of two priorities, and past the one-pass size where the check
grid takes over. GPU only (Hopper)."""

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


@pytest.fixture
def deadline():
    """Sets mla_check_deadline_us for a test and restores the default after it."""
    tune = cuda_kernels.ops().tune
    default = tune("mla_check_deadline_us", 50)
    tune("mla_check_deadline_us", default)
    yield lambda us: tune("mla_check_deadline_us", us)
    tune("mla_check_deadline_us", default)


@gpu
def test_one_pass_size_covers_a_few_thousand_rows():
    rows = cuda_kernels.ops().mla_checked_rows(1152)
    assert 4096 <= rows < 65536, rows


@gpu
@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32])
@pytest.mark.parametrize("pdl", [True, False])
def test_legal_and_illegal_calls_in_any_order(in_grid, deadline, index_dtype, pdl):
    """Legal, illegal (too large, then negative), legal, illegal...: each legal call writes exactly
    what index_put_ writes over a poisoned cache, each illegal one writes nothing and its error
    names the entry and value; with the in-grid check, with its blocks past their deadline at
    once (each scans the whole index itself), and with the check grid alike."""
    for on, late in ((True, False), (True, True), (False, False)):
        in_grid(on)
        deadline(0 if late else 50)
        for n in (257, 1000, 4096):
            nope, rope, loc, num_slots = _call(n, n, index_dtype)
            want = _expected(nope, rope, loc, num_slots)
            for round_ in range(3):
                got = torch.full_like(want, POISON)
                cuda_kernels.set_mla_kv_buffer(got, loc, nope, rope, pdl=pdl)
                oracle.kernels.raise_deferred_errors()
                assert _same(got, want), (on, late, n, round_)
                entry = (n * (round_ + 1)) // 4
                value = num_slots + round_ if round_ != 1 else -1
                bad = loc.clone()
                bad[entry] = value
                untouched = torch.full_like(want, POISON)
                cuda_kernels.set_mla_kv_buffer(untouched, bad, nope, rope, pdl=pdl)
                with pytest.raises(oracle.kernels.DeferredSlotError, match=rf"\[{entry}\] = {value} is out of range"):
                    oracle.kernels.raise_deferred_errors()
                assert bool((untouched == POISON).all()), (on, late, n, round_)


@gpu
@pytest.mark.parametrize("late", [False, True])
def test_every_illegal_entry_position_is_caught(in_grid, deadline, late):
    """The illegal entry in the first, last, or any block's share of the index, several at once:
    the first of them is named and nothing is written (also where every block scans the whole
    index itself, past its deadline)."""
    in_grid(True)
    deadline(0 if late else 50)
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


BARRIER_GRIDS_ON_TWO_PRIORITIES = """
import sys, time, torch
import oracle.kernels, oracle.kernels.cuda as cuda_kernels
ops = cuda_kernels.ops()
ops.tune("mla_check_deadline_us", int(sys.argv[1]))
n = ops.mla_checked_rows(1152)  # each grid as large as one pass allows: most of the device
gen = torch.Generator().manual_seed(5)
calls = []
for _ in range(2):
    nope = torch.randn(n, 512, generator=gen).to(torch.bfloat16).cuda()
    rope = torch.randn(n, 64, generator=gen).to(torch.bfloat16).cuda()
    loc = torch.randperm(2 * n, generator=gen)[:n].cuda()
    calls.append((torch.zeros(2 * n, 576, dtype=torch.bfloat16, device="cuda"), loc, nope, rope))
low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
torch.cuda.synchronize()
start = time.perf_counter()
for round_ in range(int(sys.argv[2])):
    for call, stream in zip(calls, (low, high) if round_ % 2 else (high, low)):
        with torch.cuda.stream(stream):
            cuda_kernels.set_mla_kv_buffer(*call)
torch.cuda.synchronize()
seconds = time.perf_counter() - start
oracle.kernels.raise_deferred_errors()
for buf, loc, nope, rope in calls:
    assert torch.equal(buf[loc], torch.cat([nope, rope], 1))
print("done", n, seconds)
"""


@gpu
def test_two_barrier_grids_on_two_priorities_finish():
    """Two streams of two priorities each write calls as long as one pass holds, so each grid needs
    most of the device at once and the high-priority grid's blocks may take room the other's still
    need: every call finishes (a hang fails after 120 s; a block past its deadline scans the index
    itself and leaves) and writes what it should."""
    import subprocess
    import sys

    try:
        done = subprocess.run([sys.executable, "-c", BARRIER_GRIDS_ON_TWO_PRIORITIES, "50", "200"],
                              capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("two barrier grids on two streams did not finish in 120 s (a deadlock)")
    assert done.returncode == 0 and done.stdout.startswith("done"), done.stderr[-2000:]
