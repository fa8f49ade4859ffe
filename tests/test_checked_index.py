"""An index checked once for many writes (oracle.kernels.check_index, CheckedIndex).

The verdict is tested against a plain loop over the entries (hypothesis draws the indices); the
writers that take a CheckedIndex run on Triton's CPU interpreter (in a subprocess) and, on a GPU,
the Triton and CUDA writers under sync debug mode "error". Every write is compared, whole cache,
with an index_put_ of the same rows into the same poisoned cache.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle.kernels
from oracle.kernels.checked_index import INDEX_ARGUMENTS, CheckedIndex, CheckedIndexWriter, check_index, resolve

from test_triton_kernels import run as run_interpreted

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
has_triton = importlib.util.find_spec("triton") is not None


def first_illegal_by_loop(values: list, num_slots: int, negative_ok: bool) -> int:
    """The reference's legality, one entry at a time: the first entry outside [0, num_slots) that
    is not a negative entry under padding="negative", else len(values)."""
    for i, v in enumerate(values):
        if v >= num_slots or (v < 0 and not negative_ok):
            return i
    return len(values)


# ================================================================ the check

@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.integers(-3, 40), max_size=70), num_slots=st.integers(0, 40),
       padding=st.sampled_from(["none", "negative", "reserved:0", "reserved:7"]),
       dtype=st.sampled_from([torch.int32, torch.int64]), step=st.sampled_from([1, 2]))
def test_verdict_is_the_first_illegal_entry(values, num_slots, padding, dtype, step):
    spread = torch.full((max(1, len(values) * step),), 12345, dtype=dtype)
    spread[::step][:len(values)] = torch.tensor(values, dtype=dtype)
    index = spread[::step][:len(values)]  # a strided view when step is 2
    checked = check_index(index, num_slots, padding=padding)
    assert checked.verdict.dtype == torch.int64 and tuple(checked.verdict.shape) == (1,)
    assert int(checked.verdict) == first_illegal_by_loop(values, num_slots, padding == "negative")
    assert checked.index.is_contiguous() and checked.index.dtype == dtype
    assert checked.index.tolist() == values and len(checked) == len(values)
    assert checked.num_slots == num_slots and checked.padding == padding


def test_the_copy_is_private():
    index = torch.tensor([3, 1, 2])
    checked = check_index(index, 4)
    index[0] = 99  # the caller's tensor changes after the check
    assert checked.index.tolist() == [3, 1, 2] and int(checked.verdict) == 3
    assert checked.index.data_ptr() != index.data_ptr()


@pytest.mark.parametrize("index, num_slots, padding, error, words", [
    ([1, 2], 4, "none", TypeError, "index must be a torch.Tensor, got list"),
    (torch.tensor([1.0]), 4, "none", TypeError, "index has dtype torch.float32"),
    (torch.zeros(2, 2, dtype=torch.int64), 4, "none", ValueError, "index must be 1-D, got shape (2, 2)"),
    (torch.zeros(2, dtype=torch.int64), -1, "none", ValueError, "num_slots=-1 must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), True, "none", ValueError, "num_slots=True must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), 4.0, "none", ValueError, "num_slots=4.0 must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), 4, "skip", ValueError, "padding='skip' is not a padding policy"),
])
def test_bad_arguments_are_named(index, num_slots, padding, error, words):
    with pytest.raises(error) as info:
        check_index(index, num_slots, padding=padding)
    assert words in str(info.value)


def test_resolve_refuses_another_cache_or_policy_and_passes_tensors_through():
    index = torch.tensor([0, 5])
    assert resolve("loc", index, 8, "none") == (index, None)
    checked = check_index(index, 8, padding="negative")
    tensor, verdict = resolve("slot_mapping", checked, 8, "negative")
    assert tensor is checked.index and verdict is checked.verdict
    with pytest.raises(ValueError, match=r"slot_mapping was checked against num_slots=8, but the cache has 16 slots"):
        resolve("slot_mapping", checked, 16, "negative")
    with pytest.raises(ValueError, match=r"loc was checked under padding='negative', but this writer's padding "
                                         r"is 'none'"):
        resolve("loc", checked, 8, "none")
    assert "num_slots=8" in repr(checked) and "padding='negative'" in repr(checked)


def test_the_public_names():
    assert oracle.kernels.CheckedIndex is CheckedIndex
    assert isinstance(oracle.kernels.check_index(torch.tensor([1]), 2), CheckedIndex)


def _op_args(op: str, n: int, num_slots: int):
    """Arguments of ``op`` in the baseline's positional convention (CPU tensors), slots legal."""
    loc = torch.randperm(num_slots)[:n]
    rows = torch.randn(n, 2, 8)
    if op == "store_cache":
        return (rows, rows, torch.zeros(num_slots, 2, 8), torch.zeros(num_slots, 2, 8), loc)
    if op == "set_mla_kv_buffer":
        return (torch.zeros(num_slots, 12), loc, torch.randn(n, 8), torch.randn(n, 4))
    if op == "concat_and_cache_mla":
        return (torch.randn(n, 8), torch.randn(n, 4), torch.zeros(num_slots // 4, 4, 12), loc, "auto",
                torch.ones(1))
    if op == "reshape_and_cache_flash":
        caches = [torch.zeros(num_slots // 4, 4, 2, 8) for _ in range(2)]
        return (rows, rows, *caches, loc, "auto", torch.ones(1), torch.ones(1))
    caches = [torch.zeros(num_slots // 4, 4, 2, 32, dtype=torch.uint8) for _ in range(4)]
    return (torch.randn(n, 2, 32), torch.randn(n, 2, 32), *caches, loc, "mxfp8_e4m3fn")


@pytest.mark.parametrize("op", sorted(INDEX_ARGUMENTS))
def test_prepare_checks_against_the_cache_the_op_writes(op):
    calls = []
    writer = CheckedIndexWriter(lambda *a, **k: calls.append((a, k)), op, "none")
    args = _op_args(op, 5, 16)
    position, _, _ = INDEX_ARGUMENTS[op]
    prepared = writer.prepare(args)
    checked = prepared[position]
    assert isinstance(checked, CheckedIndex) and checked.num_slots == 16
    assert torch.equal(checked.index, args[position]) and int(checked.verdict) == 5
    assert all(a is b for i, (a, b) in enumerate(zip(args, prepared)) if i != position)
    assert writer.prepare(prepared) == prepared  # already checked: left as it is
    writer(*args, validate="sync")
    assert isinstance(calls[0][0][position], CheckedIndex) and calls[0][1] == {"validate": "sync"}
    float_index = args[:position] + (torch.zeros(5),) + args[position + 1:]
    assert writer.prepare(float_index)[position] is float_index[position]  # the writer refuses it itself


def test_prepare_refuses_an_op_without_an_index():
    with pytest.raises(ValueError, match=r"op='quantize_fp8' has no index argument"):
        CheckedIndexWriter(print, "quantize_fp8", "none")


# ================================================================ the Triton writers, interpreted

@pytest.mark.skipif(not has_triton, reason="triton is not importable")
def test_triton_writers_take_a_checked_index():
    """Every Triton writer that takes an index, on the interpreter: a checked index writes what a
    plain one does (whole poisoned caches against index_put_); an illegal entry writes nothing and
    names the argument, entry and value; the caller's index changed after the check changes
    nothing; another cache size or policy is refused before anything is written; calls replay
    from their launch plans."""
    out = run_interpreted("""
    from oracle.kernels import check_index, DeferredSlotError
    from oracle.kernels.triton import block_ops, _plans
    torch.manual_seed(0)
    S, n = 128, 300   # 300 > the fused-check limit: a plain index would take the check grid
    results = {}

    def poisoned(*shape, dtype=torch.float32):
        return torch.full(shape, 77, dtype=dtype)

    def mla(index, buf):
        ops.set_mla_kv_buffer(buf, index, nope, rope)

    nope, rope = torch.randn(n, 8), torch.randn(n, 4)
    S4 = 4 * S
    loc = torch.randperm(S4)[:n]
    checked = check_index(loc, S4)
    want = poisoned(S4, 16); want[loc, :12] = torch.cat([nope, rope], 1)
    got = poisoned(S4, 16); mla(checked, got)
    results["mla"] = torch.equal(got, want)
    loc_after = loc.clone(); checked_after = check_index(loc_after, S4); loc_after[:] = 0
    got = poisoned(S4, 16); mla(checked_after, got)
    results["private"] = torch.equal(got, want)
    bad = loc.clone(); bad[123] = S4 + 9
    got = poisoned(S4, 16)
    try:
        mla(check_index(bad, S4), got); results["bad"] = None
    except DeferredSlotError as exc:
        results["bad"] = str(exc)
    results["bad_unchanged"] = bool(got.eq(77).all())
    short = loc[:40].clone(); short[17] = -3  # a short index: every program scans the copy itself
    got = poisoned(S4, 16)
    try:
        ops.set_mla_kv_buffer(got, check_index(short, S4), nope[:40], rope[:40]); results["short"] = None
    except DeferredSlotError as exc:
        results["short"] = str(exc)
    results["short_unchanged"] = bool(got.eq(77).all())
    got = poisoned(S4, 16)
    ops.set_mla_kv_buffer(got, check_index(loc[:40], S4), nope[:40], rope[:40])
    want = poisoned(S4, 16); want[loc[:40], :12] = torch.cat([nope[:40], rope[:40]], 1)
    results["short_legal"] = torch.equal(got, want)
    refused = []
    for other in (check_index(loc, S4 + 16), check_index(loc, S4, padding="negative")):
        got = poisoned(S4, 16)
        try:
            mla(other, got)
        except ValueError as exc:
            refused.append([str(exc), bool(got.eq(77).all())])
    results["refused"] = refused

    rows = torch.randn(n, 2, 8)
    kc, vc = poisoned(S4, 2, 8), poisoned(S4, 2, 8)
    ops.store_cache(rows, rows * 2, kc, vc, check_index(loc, S4))
    wk, wv = poisoned(S4, 2, 8), poisoned(S4, 2, 8); wk[loc] = rows; wv[loc] = rows * 2
    results["store"] = torch.equal(kc, wk) and torch.equal(vc, wv)

    sm = loc.clone(); sm[::7] = -1  # padding entries, skipped
    kc, vc = poisoned(S, 4, 2, 8), poisoned(S, 4, 2, 8)
    ops.reshape_and_cache_flash(rows, rows * 2, kc, vc, check_index(sm, S4, padding="negative"), "auto",
                                torch.ones(1), torch.ones(1))
    wk, wv = poisoned(S4, 2, 8), poisoned(S4, 2, 8)
    keep = sm >= 0
    wk[sm[keep]] = rows[keep]; wv[sm[keep]] = rows[keep] * 2
    results["paged"] = torch.equal(kc.view(S4, 2, 8), wk) and torch.equal(vc.view(S4, 2, 8), wv)

    kv = poisoned(S, 4, 12)
    ops.concat_and_cache_mla(nope, rope, kv, check_index(sm, S4, padding="negative"), "auto", torch.ones(1))
    want = poisoned(S4, 12); want[sm[keep]] = torch.cat([nope, rope], 1)[keep]
    results["concat"] = torch.equal(kv.view(S4, 12), want)

    x = torch.randn(n, 2, 32)
    caches = [torch.full((S, 4, 2, w), 0xA5, dtype=torch.uint8) for w in (32, 32, 1, 1)]
    plain = [c.clone() for c in caches]
    block_ops.reshape_and_cache_block(x, x, *caches, check_index(sm, S4, padding="negative"), "mxfp8_e4m3fn")
    block_ops.reshape_and_cache_block(x, x, *plain, sm, "mxfp8_e4m3fn")
    results["block"] = all(torch.equal(a, b) for a, b in zip(caches, plain))
    results["block_wrote"] = not torch.equal(caches[0], torch.full_like(caches[0], 0xA5))

    before = dict(_plans.stats)
    for seed in range(3):  # new CheckedIndex objects, one signature: replayed
        other = torch.randperm(S4)[:n]
        got = poisoned(S4, 16); mla(check_index(other, S4), got)
        want = poisoned(S4, 16); want[other, :12] = torch.cat([nope, rope], 1)
        results.setdefault("replays", []).append(torch.equal(got, want))
    results["replayed"] = _plans.stats["replayed"] - before["replayed"]
    emit(results)
    """)
    for key in ("mla", "private", "store", "paged", "concat", "block", "block_wrote", "bad_unchanged", "short_unchanged",
                "short_legal"):
        assert out[key] is True, key
    assert out["bad"].startswith("loc[123] = 521 is out of range [0, 512) under padding='none'"), out["bad"]
    assert out["short"].startswith("loc[17] = -3 is out of range [0, 512) under padding='none'"), out["short"]
    assert out["refused"][0] == ["loc was checked against num_slots=528, but the cache has 512 slots; check it "
                                 "against the cache it writes", True]
    assert out["refused"][1] == ["loc was checked under padding='negative', but this writer's padding is 'none'",
                                 True]
    assert out["replays"] == [True, True, True] and out["replayed"] >= 2


# ================================================================ on a GPU

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


@gpu
def test_cuda_check_is_one_launch_with_a_word_per_chunk():
    """Where the CUDA library is loaded, check_index copies and checks in one launch: a verdict word
    per chunk of 1024 entries or more (64 at most), whose minimum is the first illegal entry."""
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    for n, bad_at in ((5, 3), (3000, 2999), (200000, 70001), (200000, None)):
        values = torch.randperm(4 * n)[:n].cuda()
        strided = torch.empty(2 * n, dtype=torch.int32, device="cuda")[::2]
        strided.copy_(values)
        if bad_at is not None:
            strided[bad_at] = -1
        checked = check_index(strided, 4 * n)
        want_words = min(64, max(1, -(-n // 1024)))
        assert tuple(checked.verdict.shape) == (want_words,) and checked.index.is_contiguous()
        assert torch.equal(checked.index, strided) and checked.index.dtype == torch.int32
        assert int(checked.verdict.min()) == (n if bad_at is None else bad_at)
        negative = check_index(strided, 4 * n, padding="negative")
        assert int(negative.verdict.min()) == n


def test_triton_copy_and_check_matches_a_plain_loop_per_chunk():
    """The Triton kernel of check_index (on GPUs without the CUDA library), on the interpreter:
    a contiguous copy of the caller's entries as they are (int32 or int64, strided or not), and a
    verdict word per chunk of 1024 entries or more (64 at most), each the first illegal entry of
    its chunk by a plain loop, at chunk edges and past 64 chunks."""
    cases = [(0, None), (1, 0), (5, 3), (1023, 1022), (1025, 1024), (3000, 2047), (3000, None),
             (70000, 69999), (70000, 1093)]
    out = run_interpreted("""
    from oracle.kernels.triton import _validate
    rows = []
    for n, bad_at, dtype, step, negative in CASES:
        g = torch.Generator().manual_seed(n)
        values = torch.randperm(4 * n + 1, generator=g)[:n] - (n // 3 if negative else 0)
        spread = torch.full((max(1, n * step),), 12345, dtype=getattr(torch, dtype))
        index = spread[::step][:n]
        index.copy_(values)
        if bad_at is not None:
            index[bad_at] = 4 * n + 7
        copy, verdict = _validate.copy_and_check(index, 4 * n + 1, negative)
        rows.append({"copy_ok": copy.is_contiguous() and copy.dtype == index.dtype and torch.equal(copy, index),
                     "private": n == 0 or copy.data_ptr() != index.data_ptr(),
                     "words": verdict.tolist(), "values": index.tolist()})
    emit(rows)
    """.replace("CASES", repr([(n, bad, dtype, step, negative) for n, bad in cases
                                for dtype, step, negative in (("int32", 2, True), ("int64", 1, False))])))
    specs = [(n, bad, dtype, step, negative) for n, bad in cases
             for dtype, step, negative in (("int32", 2, True), ("int64", 1, False))]
    for (n, _, _, _, negative), row in zip(specs, out):
        assert row["copy_ok"] and row["private"], n
        chunks = min(64, max(1, -(-n // 1024)))
        chunk = -(-n // chunks) if n else 0
        want = []
        for p in range(chunks):
            part = row["values"][p * chunk:(p + 1) * chunk]
            first = first_illegal_by_loop(part, 4 * n + 1, negative)
            want.append(p * chunk + first if first < len(part) else n)  # n: none in this chunk
        assert row["words"] == want, (n, negative)
        assert min(row["words"]) == first_illegal_by_loop(row["values"], 4 * n + 1, negative)


@gpu
def test_triton_copy_and_check_compiled_matches_the_cuda_check():
    """The Triton kernel of check_index compiled for the GPU: the same copy and verdict words as
    the CUDA library's one-launch check (or, without that library, as a plain loop's minimum)."""
    import oracle.kernels.cuda as cuda_kernels
    from oracle.kernels.triton import _validate
    for n, bad_at in ((5, 3), (3000, 2999), (200000, 70001), (200000, None)):
        values = torch.randperm(4 * n)[:n].cuda()
        strided = torch.empty(2 * n, dtype=torch.int32, device="cuda")[::2]
        strided.copy_(values)
        if bad_at is not None:
            strided[bad_at] = -1
        for negative in (False, True):
            copy, verdict = _validate.copy_and_check(strided, 4 * n, negative)
            assert torch.equal(copy, strided) and copy.is_contiguous() and copy.dtype == torch.int32
            assert int(verdict.min()) == (n if bad_at is None or negative else bad_at)
            if cuda_kernels.available() is None:
                want_copy, want_verdict = cuda_kernels.ops().check_index(strided, 4 * n, negative)
                assert torch.equal(verdict, want_verdict) and torch.equal(copy, want_copy)


def test_check_index_launches_nothing_of_its_own_for_a_cpu_index():
    """On the CPU the check is torch ops: no library is loaded or compiled for it."""
    from oracle.kernels.checked_index import _fused_check
    assert _fused_check(torch.arange(4)) is None


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


# ================================================================ the suite judges the checked path

def _honours_the_verdict(k, v, k_cache, v_cache, loc):
    """A store_cache that takes a CheckedIndex and does what the writers do: nothing written and an
    error naming the entry when the verdict says an entry is illegal."""
    first = int(loc.verdict.min())
    if first < len(loc):
        raise ValueError(f"loc[{first}] = {int(loc.index[first])} is out of range [0, {loc.num_slots})")
    k_cache[loc.index] = k
    v_cache[loc.index] = v


def _ignores_the_verdict(k, v, k_cache, v_cache, loc):
    """Writes the legal rows of a checked index and never looks at the verdict."""
    keep = (loc.index >= 0) & (loc.index < k_cache.shape[0])
    k_cache[loc.index[keep]] = k[keep]
    v_cache[loc.index[keep]] = v[keep]


def _writes_then_checks(k, v, k_cache, v_cache, loc):
    """Stores the legal rows first, then reads the verdict and raises: memory changed before the error."""
    _ignores_the_verdict(k, v, k_cache, v_cache, loc)
    if int(loc.verdict.min()) < len(loc):
        raise ValueError("loc holds an illegal entry")


def _checked_kernel(fn):
    from oracle.contract import Contract
    from oracle.registry import Kernel

    contract = Contract(op="store_cache", name=fn.__name__, backend="test", validates=True,
                        dtypes=("float32", "bfloat16"))
    return Kernel(contract, CheckedIndexWriter(fn, "store_cache", "none"), "test")


@pytest.mark.parametrize("fn, verdict", [(_honours_the_verdict, "pass"), (_ignores_the_verdict, "fail"),
                                         (_writes_then_checks, "fail")])
def test_the_suite_runs_bad_input_through_a_checked_index_and_catches_what_ignores_it(fn, verdict):
    """Meta-test: a ``<name>.checked_index`` registration gets its bad-input cases through
    check_index, so a writer that ignores the verdict, or stores before it reads it, fails them; the
    in-contract cases pass for all three."""
    from oracle.ops.base import Case
    from oracle.runner import run_case

    kernel = _checked_kernel(fn)
    bad = run_case(kernel, Case.make("store_cache", "bad_input", bad="out_of_range", dtype="float32",
                                     index="int64", n=33))
    assert bad.status == verdict, bad.message
    if verdict == "fail":
        assert "accepted bad input" in bad.message or "memory changed first" in bad.message
    legal = run_case(kernel, Case.make("store_cache", "dtypes", dtype="bfloat16", index="int32", n=40))
    assert legal.status == "pass", legal.message
