"""An index checked once for many writes (oracle.kernels.check_index), on a GPU: the Triton and
CUDA writers under sync debug mode "error" (the CUDA ones in both builds that read a verdict), the
one-launch checks of the CUDA library and of Triton, and the CUDA binding's refusals. Every write
is compared, whole cache, with an index_put_ of the same rows into the same poisoned cache; the
CPU and interpreter side is tests/test_checked_index.py.
"""

from __future__ import annotations

import pytest
import torch

import oracle.kernels
from oracle.kernels.checked_index import INDEX_ARGUMENTS, CheckedIndexWriter, check_index

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _gpu_writers(kinds=("store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash")):
    from oracle.registry import Registry
    import oracle.kernels.cuda as cuda_kernels
    import oracle.kernels.triton as triton_kernels
    registry = Registry()
    for plugin in (cuda_kernels.register, triton_kernels.register):
        registry.load_plugin(plugin.__module__, plugin)
    return [k for _, k in sorted(registry.kernels.items())
            if k.contract.op in kinds and k.contract.validates and k.unavailable() is None
            and isinstance(k.fn, CheckedIndexWriter)]


def _gpu_args(op: str, n: int, num_slots: int, gen: torch.Generator):
    dev = "cuda"
    slots = torch.randperm(num_slots, generator=gen)[:n].to(dev)
    if op == "store_cache":
        k = torch.randn(n, 4, 64, generator=gen).to(dev, torch.bfloat16)
        caches = [torch.full((num_slots, 4, 64), 3.0, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        return (k, k * 2, *caches, slots), caches, [k, k * 2]
    if op == "set_mla_kv_buffer":
        nope = torch.randn(n, 512, generator=gen).to(dev, torch.bfloat16)
        rope = torch.randn(n, 64, generator=gen).to(dev, torch.bfloat16)
        buf = torch.full((num_slots, 576), 3.0, dtype=torch.bfloat16, device=dev)
        return (buf, slots, nope, rope), [buf], [torch.cat([nope, rope], 1)]
    key = torch.randn(n, 4, 64, generator=gen).to(dev, torch.bfloat16)
    caches = [torch.full((num_slots // 16, 16, 4, 64), 3.0, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    one = torch.ones(1, device=dev)
    return (key, key * 2, *caches, slots, "auto", one, one), caches, [key, key * 2]


@pytest.fixture(params=[3, 0], ids=["verdict-build", "full-build"])
def cuda_verdict_build(request):
    """The CUDA writers reading a verdict in their verdict-only build (lean_verdict 3, the default)
    or in their full build (0); nothing to set where the CUDA kernels are unavailable."""
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        yield
        return
    tune = cuda_kernels.ops().tune
    default = tune("lean_verdict", request.param)
    try:
        yield
    finally:
        tune("lean_verdict", default)


@gpu
@pytest.mark.parametrize("n", [8, 3000, 20000])
def test_gpu_writers_reuse_one_check_for_many_writes_without_synchronizing(n, cuda_verdict_build):
    """Every CUDA and Triton writer that takes a CheckedIndex, at a fused-check, a mid and a long
    index: one check, then several writes (a step's layers) under sync debug mode "error", each
    into its own poisoned caches, each equal to index_put_; an illegal entry makes every write of
    the step write nothing, and the error names the entry and its value. The CUDA writers both in
    the build that reads the verdict alone and in the full one."""
    num_slots = 16 * ((2 * n + 64) // 16)
    for kernel in _gpu_writers():
        op = kernel.contract.op
        position = INDEX_ARGUMENTS[op][0]
        layers = []
        for layer in range(3):
            args, caches, rows = _gpu_args(op, n, num_slots, torch.Generator().manual_seed(layer))
            layers.append((args, caches, rows))
        slots = layers[0][0][position]
        checked = kernel.fn.prepare(layers[0][0])[position]
        kernel.fn(*layers[0][0])  # compile and warm up outside the debug mode
        torch.cuda.synchronize()
        for _, caches, _ in layers:
            for cache in caches:
                cache.fill_(3.0)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for args, _, _ in layers:
                kernel.fn(*(args[:position] + (checked,) + args[position + 1:]))
        finally:
            torch.cuda.set_sync_debug_mode("default")
        oracle.kernels.raise_deferred_errors()
        for args, caches, rows in layers:
            for cache, row in zip(caches, rows):
                want = torch.full_like(cache, 3.0).view(num_slots, -1)
                want[slots] = row.reshape(n, -1)
                assert torch.equal(cache.view(num_slots, -1).view(torch.uint8), want.view(torch.uint8)), kernel.name
        illegal = slots.clone()
        illegal[n // 3] = num_slots + 5
        bad = kernel.fn.prepare(layers[0][0][:position] + (illegal,) + layers[0][0][position + 1:])[position]
        for _, caches, _ in layers:
            for cache in caches:
                cache.fill_(3.0)
        messages = []
        for args, _, _ in layers:  # a later call of the step may raise what an earlier one left
            try:
                kernel.fn(*(args[:position] + (bad,) + args[position + 1:]))
            except oracle.kernels.DeferredSlotError as exc:
                messages.append(str(exc))
        try:  # what is still pending (two calls' reports may have been raised by one take already)
            oracle.kernels.raise_deferred_errors()
        except oracle.kernels.DeferredSlotError as exc:
            messages.append(str(exc))
        assert messages and all(f"[{n // 3}] = {num_slots + 5} is out of range [0, {num_slots})" in m for m in messages), messages
        for _, caches, _ in layers:
            assert all(bool(cache.eq(3.0).all()) for cache in caches), kernel.name


def _strided_indices():
    """(n, the entry made -1 or None, a strided int32 CUDA index of n distinct slots in [0, 4n)):
    a short index, a bad last entry, a bad entry past 64 chunks, and a legal long index."""
    for n, bad_at in ((5, 3), (3000, 2999), (200000, 70001), (200000, None)):
        strided = torch.empty(2 * n, dtype=torch.int32, device="cuda")[::2]
        strided.copy_(torch.randperm(4 * n)[:n].cuda())
        if bad_at is not None:
            strided[bad_at] = -1
        yield n, bad_at, strided


@gpu
def test_cuda_check_is_one_launch_with_one_folded_word():
    """Where the CUDA library is loaded, check_index copies and checks in one launch, and its
    verdict is one word: the first illegal entry over every chunk of 1024 entries or more (64 at
    most), folded on the device by the chunk's block that finishes last."""
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    for n, bad_at, strided in _strided_indices():
        checked = check_index(strided, 4 * n)
        assert tuple(checked.verdict.shape) == (1,) and checked.index.is_contiguous()
        assert torch.equal(checked.index, strided) and checked.index.dtype == torch.int32
        assert int(checked.verdict[0]) == (n if bad_at is None else bad_at)
        negative = check_index(strided, 4 * n, padding="negative")
        assert int(negative.verdict[0]) == n


@gpu
def test_cuda_fold_takes_the_least_chunk_and_resets_between_checks():
    """The fold is the minimum over the chunks, whichever block finishes last, and each check
    grid leaves the stream's arrivals count at 0 for the next: check_index and the per-call check
    grid alternate on one stream, each with illegal entries in several of its 64 chunks, and
    each names its own first illegal entry."""
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    n, num_slots = 64 * 1024 - 7, 70000
    gen = torch.Generator().manual_seed(11)
    args, _, rows = _gpu_args("set_mla_kv_buffer", n, num_slots, gen)
    buf, loc, nope, rope = args
    for round_, firsts in enumerate(([50000, 700, 64000], [63000, 2047], [5, 5000], [None])):
        index = loc.clone()
        for at in filter(None, firsts):
            index[at] = num_slots + at
        want = min((at for at in firsts if at is not None), default=n)
        assert int(check_index(index, num_slots).verdict[0]) == want, round_
        buf.fill_(3.0)
        if want == n:
            cuda_kernels.set_mla_kv_buffer(buf, index, nope, rope)
            oracle.kernels.raise_deferred_errors()
            expected = torch.full_like(buf, 3.0)
            expected[index] = rows[0]
            assert torch.equal(buf, expected)
            continue
        with pytest.raises(oracle.kernels.DeferredSlotError, match=rf"loc\[{want}\] = {num_slots + want} "):
            cuda_kernels.set_mla_kv_buffer(buf, index, nope, rope, validate="sync")
        assert bool(buf.eq(3.0).all())


@gpu
def test_triton_copy_and_check_compiled_matches_the_cuda_check():
    """The Triton kernel of check_index compiled for the GPU: the same copy as the CUDA library's
    one-launch check and the same first illegal entry (a word per chunk, where the CUDA verdict is
    their fold), or, without that library, a plain loop's."""
    import oracle.kernels.cuda as cuda_kernels
    from oracle.kernels.triton import _validate
    for n, bad_at, strided in _strided_indices():
        for negative in (False, True):
            copy, verdict = _validate.copy_and_check(strided, 4 * n, negative)
            assert torch.equal(copy, strided) and copy.is_contiguous() and copy.dtype == torch.int32
            assert int(verdict.min()) == (n if bad_at is None or negative else bad_at)
            if cuda_kernels.available() is None:
                want_copy, want_verdict = cuda_kernels.ops().check_index(strided, 4 * n, negative)
                assert int(verdict.min()) == int(want_verdict[0]) and torch.equal(copy, want_copy)


@gpu
def test_cuda_binding_refuses_a_verdict_that_is_not_int64_words_on_the_device():
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    args, caches, _ = _gpu_args("set_mla_kv_buffer", 8, 64, torch.Generator().manual_seed(3))
    buf, loc, nope, rope = args
    for verdict in (torch.zeros(1, dtype=torch.int32, device="cuda"), torch.zeros(65, dtype=torch.int64, device="cuda"),
                    torch.zeros(1, dtype=torch.int64)):
        with pytest.raises(ValueError, match=r"verdict must be the int64\[1\.\.64\] verdict of an index checked"):
            cuda_kernels.ops().set_mla_kv_buffer(buf, loc, nope, rope, verdict=verdict)
    torch.cuda.synchronize()
    assert bool(buf.eq(3.0).all())
