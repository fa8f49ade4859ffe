"""A validating writer's slot check reused while torch sees its index unchanged
(oracle.kernels.check_reuse).

Each scenario runs the Triton writers in a subprocess, on Triton's CPU interpreter always and
compiled on a GPU where there is one (as tests/test_triton_plans.py does); the CUDA writers run on
a GPU only. Caches are poisoned and compared whole with plain torch indexing of the same rows; the
reuse counters say whether a call checked its index or read a kept verdict.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from oracle.kernels import check_reuse

from test_triton_plans import SETUP, WHERE
from test_triton_kernels import run

needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="triton is not importable (pip install triton==3.6.0)")
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

REUSE = SETUP + """
from oracle.kernels import check_reuse
from oracle.kernels.triton import block_ops
N = 300  # past REUSE_FROM: the index is long enough for its check to be kept
def counted(fn):
    before = dict(check_reuse.stats)
    fn()
    return {k: check_reuse.stats[k] - before[k] for k in before}
def mla(buf, loc, seed, **kw):
    nope, rope = rows(N, 6, seed=seed), rows(N, 2, seed=seed + 1)
    want = buf.clone()
    keep = (loc >= 0) & (loc < buf.shape[0])
    want[loc[keep]] = torch.cat([nope, rope], 1)[keep]
    ops.set_mla_kv_buffer(buf, loc, nope, rope, **kw)
    return want
def mla_and_store_twice(loc, results):
    # two calls each of the MLA and store writers with loc (new rows, new caches): each call's
    # reuse counts, and whether it matches torch indexing whole; returns the last MLA buffer
    for call in range(2):
        buf = torch.full((600, 8), POISON, dtype=torch.bfloat16, device=dev)
        results[f"mla stats {call}"] = counted(lambda: results.__setitem__("want", mla(buf, loc, call)))
        results[f"mla {call}"] = same(buf, results.pop("want"))
        k, v = rows(N, 2, 8, seed=call), rows(N, 2, 8, seed=call + 5)
        kc, vc = (torch.full((600, 2, 8), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
        wk, wv = kc.clone(), vc.clone()
        wk[loc], wv[loc] = k, v
        results[f"store stats {call}"] = counted(lambda: ops.store_cache(k, v, kc, vc, loc))
        results[f"store {call}"] = same(kc, wk) and same(vc, wv)
    return buf
"""


def scenario(script: str, interpret: bool) -> dict:
    import textwrap
    return run(REUSE + textwrap.dedent(script), interpret=interpret)


@needs_triton
@pytest.mark.parametrize("interpret", WHERE)
def test_an_unchanged_index_is_checked_once_and_every_write_is_right(interpret):
    """Two calls of each writer with one index (new rows, new caches): the first checks it, the
    second reads the kept verdict; both writes match torch indexing, whole cache."""
    out = scenario("""
    results = {}
    mla_and_store_twice(slots(N, 600, 0), results)
    sm = slots(N, 640, 1)
    sm[::7] = -1  # padding: skipped
    for call in range(2):
        key, value = rows(N, 2, 16, seed=call), rows(N, 2, 16, seed=call + 9)
        kc, vc = (torch.full((40, 16, 2, 16), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
        wk, wv = kc.clone(), vc.clone()
        keep = sm >= 0
        wk.view(640, 2, 16)[sm[keep]] = key[keep]
        wv.view(640, 2, 16)[sm[keep]] = value[keep]
        scale = torch.ones(1, device=dev)
        results[f"paged stats {call}"] = counted(
            lambda: ops.reshape_and_cache_flash(key, value, kc, vc, sm, "auto", scale, scale))
        results[f"paged {call}"] = same(kc, wk) and same(vc, wv)
    emit(results)
    """, interpret)
    for name in ("mla", "store", "paged"):
        assert out[f"{name} 0"] and out[f"{name} 1"], name
        assert out[f"{name} stats 1"] == {"checked": 0, "reused": 1}, name
    # store_cache's index is the MLA writer's, against the same slots under the same padding
    assert out["mla stats 0"] == {"checked": 1, "reused": 0}
    assert out["store stats 0"] == {"checked": 0, "reused": 1}
    assert out["paged stats 0"] == {"checked": 1, "reused": 0}


@needs_triton
@pytest.mark.parametrize("interpret", WHERE)
def test_a_change_torch_sees_checks_the_index_again(interpret):
    """An in-place torch op on the index (even one that leaves its values as they were), a new view
    of it, other slots or another padding policy each check again; an illegal entry written by
    torch is then caught: the call raises, naming it, and writes nothing."""
    out = scenario("""
    results = {}
    loc = slots(N, 600, 0)
    buf = torch.full((600, 8), POISON, dtype=torch.bfloat16, device=dev)
    mla(buf, loc, 0)
    results["same values, new version"] = counted(lambda: (loc.add_(0), mla(buf, loc, 1)))
    results["a new view"] = counted(lambda: mla(buf, loc[:], 2))
    small = torch.full((500, 8), POISON, dtype=torch.bfloat16, device=dev)
    results["other slots"] = counted(lambda: raised(lambda: mla(small, loc, 3)))
    results["other padding"] = counted(lambda: mla(buf, loc, 4, padding="negative"))
    loc[7] = 600
    untouched = buf.clone()
    message = []
    results["illegal"] = counted(lambda: message.append(raised(lambda: mla(buf, loc, 5))))
    results["message"] = message[0]
    results["untouched"] = same(buf, untouched)
    emit(results)
    """, interpret)
    for name in ("same values, new version", "a new view", "other slots", "other padding", "illegal"):
        assert out[name] == {"checked": 1, "reused": 0}, name
    assert "loc[7] = 600 is out of range [0, 600)" in out["message"]
    assert out["untouched"]


@needs_triton
@pytest.mark.parametrize("interpret", WHERE)
def test_what_is_never_reused(interpret):
    """No reuse for a short index (every program scans it), for validate=False, or with reuse
    turned off; an index nothing else holds any more is let go at the next check, and no more than
    CAPACITY indices are kept."""
    out = scenario("""
    import gc
    results = {}
    buf = torch.full((600, 8), POISON, dtype=torch.bfloat16, device=dev)
    short = slots(check_reuse.REUSE_FROM - 1, 600, 0)
    nope, rope = rows(short.shape[0], 6, seed=0), rows(short.shape[0], 2, seed=1)
    results["short"] = counted(lambda: [ops.set_mla_kv_buffer(buf, short, nope, rope) for _ in range(2)])
    loc = slots(N, 600, 1)
    results["unchecked"] = counted(lambda: [mla(buf, loc, 2, validate=False) for _ in range(2)])
    check_reuse.set_enabled(False)
    results["off"] = counted(lambda: [mla(buf, loc, 3) for _ in range(2)])
    check_reuse.set_enabled(True)
    mla(buf, loc, 4)
    kept = check_reuse.kept()
    del loc
    gc.collect()
    other = slots(N, 600, 2)
    mla(buf, other, 5)
    results["freed"] = [kept, check_reuse.kept()]
    many = [slots(N, 600, seed) for seed in range(check_reuse.CAPACITY + 6)]
    for index in many:
        mla(buf, index, 6)
    results["bounded"] = check_reuse.kept()
    emit(results)
    """, interpret)
    for name in ("short", "unchecked", "off"):
        assert out[name] == {"checked": 0, "reused": 0}, name
    assert out["freed"] == [1, 1]  # the freed index let go, the other one kept
    assert out["bounded"] == check_reuse.CAPACITY


@needs_triton
@pytest.mark.parametrize("interpret", WHERE)
def test_a_change_behind_torchs_back_is_the_documented_limit(interpret):
    """An entry made illegal through ``.data`` (its own version counter: torch cannot see the
    change, as with a raw kernel's write) after a legal check: with reuse, the stale verdict is read,
    the illegal row is skipped, nothing lands outside the cache and the other rows are written (the
    module's stated limit); with reuse off, the call raises and writes nothing."""
    out = scenario("""
    results = {}
    loc = slots(N, 600, 0)
    buf = torch.full((600, 8), POISON, dtype=torch.bfloat16, device=dev)
    mla(buf, loc, 0)
    loc.data[11] = 600
    before = buf.clone()
    wants = []
    message = []
    results["stale"] = counted(lambda: message.append(raised(lambda: wants.append(mla(buf, loc, 1)))))
    results["stale message"] = message[0]
    results["stale write"] = same(buf, wants[0]) and not same(buf, before)
    check_reuse.set_enabled(False)
    before = buf.clone()
    results["off message"] = raised(lambda: mla(buf, loc, 2))
    results["off untouched"] = same(buf, before)
    emit(results)
    """, interpret)
    assert out["stale"] == {"checked": 0, "reused": 1}
    assert out["stale message"] is None and out["stale write"]
    assert "loc[11] = 600 is out of range" in out["off message"] and out["off untouched"]


@needs_triton
@pytest.mark.parametrize("interpret", WHERE)
def test_an_inference_tensor_is_checked_on_every_call(interpret):
    """Under torch.inference_mode(), as an engine's forward runs, the index is an inference tensor
    with no version counter: every validating call checks it (nothing kept), so an entry made
    illegal in place between two calls is rejected with nothing written; every write of each
    writer matches torch indexing, whole cache."""
    out = scenario("""
    results = {}
    with torch.inference_mode():
        loc = slots(N, 600, 0)
        buf = mla_and_store_twice(loc, results)
        loc[11] = 600  # in place, under inference mode: no version counter moves
        before = buf.clone()
        results["bad"] = raised(lambda: mla(buf, loc, 3))
        results["bad untouched"] = same(buf, before)
    results["kept"] = check_reuse.kept()
    emit(results)
    """, interpret)
    for call in range(2):
        assert out[f"mla {call}"] and out[f"store {call}"], call
        assert out[f"mla stats {call}"] == out[f"store stats {call}"] == {"checked": 0, "reused": 0}, call
    assert "loc[11] = 600 is out of range" in out["bad"] and out["bad untouched"]
    assert out["kept"] == 0


def test_the_environment_turns_reuse_off(monkeypatch):
    for value, enabled in (("", True), ("1", True), ("0", False), ("off", False), ("False", False), ("no", False)):
        monkeypatch.setenv(check_reuse.ENV, value)
        assert check_reuse.enabled_by_default() is enabled, value


@gpu
def test_cuda_writers_reuse_without_synchronizing_and_per_stream():
    """The CUDA writers under sync debug mode "error": a second call with one index reads the kept
    verdict, a call on another stream checks again, and every write matches torch indexing whole."""
    import oracle.kernels.cuda as cuda_kernels
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    n, num_slots = 20000, 40000
    gen = torch.Generator().manual_seed(0)
    loc = torch.randperm(num_slots, generator=gen)[:n].cuda()
    k = torch.randn(n, 4, 64, generator=gen).to("cuda", torch.bfloat16)
    nope = torch.randn(n, 512, generator=gen).to("cuda", torch.bfloat16)
    rope = torch.randn(n, 64, generator=gen).to("cuda", torch.bfloat16)
    counts = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    for stream in (torch.cuda.current_stream(), torch.cuda.current_stream(), side):
        with torch.cuda.stream(stream):
            kc, vc = (torch.full((num_slots, 4, 64), 3.0, dtype=torch.bfloat16, device="cuda") for _ in range(2))
            buf = torch.full((num_slots, 576), 3.0, dtype=torch.bfloat16, device="cuda")
            before = dict(check_reuse.stats)
            torch.cuda.set_sync_debug_mode("error")
            try:
                cuda_kernels.store_cache(k, k * 2, kc, vc, loc)
                cuda_kernels.set_mla_kv_buffer(buf, loc, nope, rope)
            finally:
                torch.cuda.set_sync_debug_mode(0)
            counts.append({key: check_reuse.stats[key] - before[key] for key in before})
            want_k, want_v = (torch.full_like(kc, 3.0) for _ in range(2))
            want_k[loc], want_v[loc] = k, k * 2
            want = torch.full_like(buf, 3.0)
            want[loc] = torch.cat([nope, rope], 1)
            assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and torch.equal(buf, want)
        torch.cuda.synchronize()
    assert counts == [{"checked": 1, "reused": 1}, {"checked": 0, "reused": 2}, {"checked": 1, "reused": 1}]


@gpu
def test_cuda_writers_check_an_inference_tensor_on_every_call():
    """The CUDA writers under torch.inference_mode() and sync debug mode "error": an inference
    tensor's index is checked on every call (nothing kept, nothing synchronized), and an entry
    made illegal in place between two calls is rejected with nothing written."""
    import oracle.kernels.cuda as cuda_kernels
    from oracle.kernels import raise_deferred_errors
    if cuda_kernels.available() is not None:
        pytest.skip(cuda_kernels.available())
    n, num_slots = 20000, 40000
    gen = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        loc = torch.randperm(num_slots, generator=gen)[:n].cuda()
        nope = torch.randn(n, 512, generator=gen).to("cuda", torch.bfloat16)
        rope = torch.randn(n, 64, generator=gen).to("cuda", torch.bfloat16)
        buf = torch.full((num_slots, 576), 3.0, dtype=torch.bfloat16, device="cuda")
        before = dict(check_reuse.stats)
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(2):
                cuda_kernels.set_mla_kv_buffer(buf, loc, nope, rope)
        finally:
            torch.cuda.set_sync_debug_mode(0)
        assert {key: check_reuse.stats[key] - before[key] for key in before} == {"checked": 0, "reused": 0}
        want = torch.full_like(buf, 3.0)
        want[loc] = torch.cat([nope, rope], 1)
        assert torch.equal(buf, want)
        loc[7] = num_slots
        cuda_kernels.set_mla_kv_buffer(buf, loc, nope * 2, rope)
        with pytest.raises(ValueError, match=rf"loc\[7\] = {num_slots} is out of range"):
            raise_deferred_errors()
        assert torch.equal(buf, want)


def test_a_writer_is_given_a_checked_index_of_the_callers_own_tensor():
    """What a reusing writer is called with: on the first call and on the next, one CheckedIndex of
    the caller's tensor itself (not a copy), checked against the cache's slots under the writer's
    padding; the writer's other arguments as they came."""
    calls = []

    @check_reuse.reusing("set_mla_kv_buffer")
    def writer(kv_buffer, loc, nope, rope, *, padding="none", validate=True):
        calls.append((kv_buffer, loc, nope, rope, padding))

    check_reuse.forget()
    loc = torch.randperm(1000, generator=torch.Generator().manual_seed(0))[:400]
    buf, nope, rope = torch.zeros(1000, 4), torch.zeros(400, 3), torch.zeros(400, 1)
    writer(buf, loc, nope, rope, padding="negative")
    writer(buf, loc, nope, rope, padding="negative")
    first, again = calls[0][1], calls[1][1]
    assert again is first and first.index is loc and len(first) == 400
    assert (first.num_slots, first.padding) == (1000, "negative")
    assert int(first.verdict.min()) == 400  # every entry legal
    assert [c[0] is buf and c[2] is nope and c[3] is rope and c[4] == "negative" for c in calls] == [True, True]
    writer(buf, loc, nope, rope, validate=False)
    assert calls[2][1] is loc
    check_reuse.forget()
