"""Launch plans of the Triton writers (oracle.kernels.triton._plans): a call replayed from the
plan of an earlier call with the same signature writes exactly what the reference writes, checks
its slots on the device as the first call did, and never reuses a plan across signatures.

Each scenario runs in a subprocess (the interpreter is chosen when the kernels are defined): on
Triton's CPU interpreter always, and compiled on a GPU where there is one. Caches are poisoned and
compared whole against plain torch indexing of the same inputs.
"""

from __future__ import annotations

import importlib.util
import textwrap

import pytest

from test_triton_kernels import run

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                reason="triton is not importable (pip install triton==3.6.0)")

HAS_GPU = importlib.util.find_spec("triton") is not None and __import__("torch").cuda.is_available()
WHERE = [pytest.param(True, id="interpreter"),
         pytest.param(False, id="gpu", marks=pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA GPU"))]

SETUP = """
from oracle.kernels import _deferred
from oracle.kernels.triton import _plans
dev = "cpu" if ops.interpreting() else "cuda"
POISON = -77.0

def bits(t):
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()])

def same(a, b):
    return bool(torch.equal(bits(a), bits(b)))

def slots(n, num, seed):
    return torch.randperm(num, generator=torch.Generator().manual_seed(seed))[:n].to(dev)

def rows(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(torch.bfloat16).to(dev)

def raised(fn):
    try:
        fn()
        if dev == "cuda":
            _deferred.raise_deferred_errors()
    except ValueError as exc:
        return str(exc)
    return None
"""


def scenario(script: str, interpret: bool = True) -> dict:
    """Run ``script`` after SETUP in a subprocess (see test_triton_kernels.run)."""
    return run(SETUP + textwrap.dedent(script), interpret=interpret)


@pytest.mark.parametrize("interpret", WHERE)
def test_replayed_calls_write_what_the_reference_writes(interpret):
    """Three calls per writer with one signature (new rows, new slots, new caches each time): the
    first plans, the others replay, and every cache matches the reference whole."""
    out = scenario("""
    results = {}
    for seed in range(3):
        before = dict(_plans.stats)
        # store_cache: [N, H, D] rows into [S, H, D] caches
        k, v = rows(5, 2, 8, seed=seed), rows(5, 2, 8, seed=seed + 10)
        kc, vc = (torch.full((40, 2, 8), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
        loc = slots(5, 40, seed)
        wk, wv = kc.clone(), vc.clone()
        wk[loc], wv[loc] = k, v
        ops.store_cache(k, v, kc, vc, loc)
        results[f"store_cache {seed}"] = same(kc, wk) and same(vc, wv)
        # set_mla_kv_buffer: nope + rope into wider rows (the tail stays poisoned)
        nope, rope = rows(4, 32, seed=seed), rows(4, 8, seed=seed + 20)
        buf = torch.full((30, 48), POISON, dtype=torch.bfloat16, device=dev)
        loc = slots(4, 30, seed + 1)
        want = buf.clone()
        want[loc, :40] = torch.cat([nope, rope], 1)
        ops.set_mla_kv_buffer(buf, loc, nope, rope)
        results[f"mla {seed}"] = same(buf, want)
        # reshape_and_cache_flash (auto): paged caches, negative padding skipped
        key, value = rows(6, 2, 16, seed=seed), rows(6, 2, 16, seed=seed + 30)
        kc, vc = (torch.full((4, 8, 2, 16), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
        sm = slots(6, 32, seed + 2)
        sm[seed] = -1
        wk, wv = kc.clone(), vc.clone()
        keep = sm >= 0
        wk.view(32, 2, 16)[sm[keep]] = key[keep]
        wv.view(32, 2, 16)[sm[keep]] = value[keep]
        scale = torch.ones(1, device=dev)
        ops.reshape_and_cache_flash(key, value, kc, vc, sm, "auto", scale, scale)
        results[f"paged {seed}"] = same(kc, wk) and same(vc, wv)
        # concat_and_cache_mla (auto): [blocks, block_size, width]
        kv_c, k_pe = rows(3, 24, seed=seed), rows(3, 8, seed=seed + 40)
        cache = torch.full((3, 4, 32), POISON, dtype=torch.bfloat16, device=dev)
        sm = slots(3, 12, seed + 3)
        want = cache.clone()
        want.view(12, 32)[sm] = torch.cat([kv_c, k_pe], 1)
        ops.concat_and_cache_mla(kv_c, k_pe, cache, sm, "auto", scale)
        results[f"concat {seed}"] = same(cache, want)
        results[f"stats {seed}"] = {k: _plans.stats[k] - before[k] for k in before}
    emit(results)
    """, interpret=interpret)
    for seed in range(3):
        for name in ("store_cache", "mla", "paged", "concat"):
            assert out[f"{name} {seed}"], (name, seed)
    assert out["stats 0"] == {"built": 4, "replayed": 0, "unplannable": 0}
    assert out["stats 1"] == out["stats 2"] == {"built": 0, "replayed": 4, "unplannable": 0}


@pytest.mark.parametrize("interpret", WHERE)
def test_a_replayed_call_with_an_illegal_slot_writes_nothing_and_raises(interpret):
    """Slot values are data, not signature: the replayed call still checks them on the device, for
    a short index (checked in the writer) and a long one (the check grid), and an unchecked
    (validate=False) plan never raises."""
    out = scenario("""
    results = {}
    for n in (5, 300):
        def call(bad, validate=True, seed=0):
            k, v = rows(n, 1, 8, seed=seed), rows(n, 1, 8, seed=seed + 1)
            kc, vc = (torch.full((512, 1, 8), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
            loc = slots(n, 512, seed)
            if bad:
                loc[n // 2] = 512
            untouched = kc.clone(), vc.clone()
            message = raised(lambda: ops.store_cache(k, v, kc, vc, loc, validate=validate))
            return message, same(kc, untouched[0]) and same(vc, untouched[1])
        call(False)  # plans the signature
        replays = _plans.stats["replayed"]
        results[f"{n} bad"] = call(True, seed=1)
        results[f"{n} replayed"] = _plans.stats["replayed"] > replays
        results[f"{n} good after"] = call(False, seed=2)
        if dev == "cuda":  # deferred: the next (replayed) validating call raises the earlier error
            k, v = rows(n, 1, 8, seed=3), rows(n, 1, 8, seed=4)
            kc, vc = (torch.full((512, 1, 8), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
            loc = slots(n, 512, 3)
            loc[1] = -3
            ops.store_cache(k, v, kc, vc, loc)
            torch.cuda.synchronize()
            loc[1] = 0
            results[f"{n} next call"] = raised(lambda: ops.store_cache(k, v, kc, vc, loc))
    emit(results)
    """, interpret=interpret)
    for n in (5, 300):
        message, untouched = out[f"{n} bad"]
        assert message is not None and f"loc[{n // 2}] = 512 is out of range [0, 512)" in message, message
        assert untouched
        assert out[f"{n} replayed"]
        assert out[f"{n} good after"] == [None, False]  # no stale error; the rows were written
        if not interpret:
            assert "loc[1] = -3 is out of range" in out[f"{n} next call"]


@pytest.mark.parametrize("interpret", WHERE)
def test_plans_never_cross_signatures(interpret):
    """A pointer off 16-byte alignment, aliased arguments, another dtype, another padding policy
    or a changed tuning default each plan anew (Triton may compile another binary for them), and
    each call writes right."""
    out = scenario("""
    results = {}
    def store(k, v, kc, vc, loc, **kw):
        wk, wv = kc.clone(), vc.clone()
        wk[loc], wv[loc] = k, v
        if kc.data_ptr() == vc.data_ptr():
            wk[loc] = v
            wv = wk
        ops.store_cache(k, v, kc, vc, loc, **kw)
        return same(kc, wk) and same(vc, wv)
    def fresh(dtype=torch.bfloat16):
        return (torch.full((16, 8), POISON, dtype=dtype, device=dev) for _ in range(2))
    loc = slots(3, 16, 0)
    built = _plans.stats["built"]
    kc, vc = fresh()
    results["plain"] = store(rows(3, 8, seed=1), rows(3, 8, seed=2), kc, vc, loc)
    wide = rows(3, 9, seed=3)
    kc, vc = fresh()
    results["unaligned"] = store(wide[:, 1:], rows(3, 8, seed=4), kc, vc, loc)
    kc, _ = fresh()
    results["aliased caches"] = store(rows(3, 8, seed=5), rows(3, 8, seed=6), kc, kc, loc)
    kc, vc = fresh(torch.float32)
    results["float32"] = store(torch.randn(3, 8).to(dev), torch.randn(3, 8).to(dev), kc, vc, loc)
    kc, vc = fresh()
    results["reserved padding"] = store(rows(3, 8, seed=7), rows(3, 8, seed=8), kc, vc, loc, padding="reserved:15")
    from oracle.kernels.triton import tiles
    tiles.PREFETCH = "always"
    kc, vc = fresh()
    results["prefetch changed"] = store(rows(3, 8, seed=9), rows(3, 8, seed=10), kc, vc, loc)
    results["built"] = _plans.stats["built"] - built
    emit(results)
    """, interpret=interpret)
    assert all(out[name] for name in ("plain", "unaligned", "aliased caches", "float32", "reserved padding",
                                      "prefetch changed")), out
    assert out["built"] == 6


def test_a_plan_refuses_a_tensor_the_wrapper_made():
    """A record that launched through a tensor that is neither an argument nor a kept buffer
    cannot be replayed for another call: planning it raises Unplannable."""
    out = scenario("""
    x = torch.zeros(4)
    made = torch.zeros(4)
    event = ("launch", ops.kernels().translate, (1,), (x, made), {}, None)
    try:
        _plans.Plan([event], [x], [x.data_ptr()], -1)
        emit({"refused": None})
    except _plans.Unplannable as exc:
        emit({"refused": str(exc)})
    """)
    assert out["refused"] and "made" in out["refused"]


def test_a_gpu_replay_calls_the_launcher_with_each_calls_own_addresses():
    """The compiled path, with a stand-in for Triton's C launcher: a replay passes the grid, the
    launcher's leading arguments, every kernel argument in order (this call's tensors and the
    buffers the plan keeps, the mailbox included, as their addresses), then the constexprs."""
    out = scenario("""
    calls = []
    launcher = lambda *a: calls.append(a)  # noqa: E731
    head, tail = ("stream", "function", 0, 1, None, None, "packed", None, None, None), (64, 4)
    src, cache = torch.zeros(3, 8), torch.zeros(16, 8)
    kept = torch.zeros(4)  # stands for a verdict buffer
    box = _deferred.mailbox(torch.device("cpu"))
    _plans.keep_constants(lambda: (kept,))
    event = ("launch", None, (2, 3), (src, 7, cache, box, kept, src), {}, (launcher, head, tail))
    plan = _plans.Plan([("take", -1), event], [src, cache], [src.data_ptr(), cache.data_ptr()], -1)
    other_src, other_cache = torch.ones(3, 8), torch.ones(16, 8)
    plan.replay([other_src, other_cache], [other_src.data_ptr(), other_cache.data_ptr()])
    plan.replay([src, cache], [src.data_ptr(), cache.data_ptr()])
    got = calls[0]
    emit({"grid": list(got[:3]), "head": list(got[3:13]) == list(head), "tail": list(got[-2:]),
          "src": got[13] == other_src.data_ptr() == got[18], "scalar": got[14],
          "cache": got[15] == other_cache.data_ptr(), "box": got[16] == box.data_ptr(), "kept": got[17] == kept.data_ptr(),
          "second": calls[1][13] == src.data_ptr() and calls[1][15] == cache.data_ptr(),
          "length": len(got)})
    """)
    assert out["grid"] == [2, 3, 1] and out["head"] and out["tail"] == [64, 4]
    assert out["src"] and out["scalar"] == 7 and out["cache"] and out["second"]
    assert out["box"] and out["kept"]
    assert out["length"] == 3 + 10 + 6 + 2


def test_a_plan_keeps_no_tensor_of_the_call_it_was_made_from():
    """A plan lives as long as the process may call that signature again, so it must not hold
    the first call's tensors (a cache of gigabytes the caller has dropped would stay allocated)."""
    out = scenario("""
    import gc, weakref
    k, v = rows(3, 8, seed=1), rows(3, 8, seed=2)
    kc, vc = (torch.full((16, 8), POISON, dtype=torch.bfloat16, device=dev) for _ in range(2))
    loc = slots(3, 16, 0)
    refs = [weakref.ref(t) for t in (k, v, kc, vc, loc)]
    built = _plans.stats["built"]
    ops.store_cache(k, v, kc, vc, loc)
    del k, v, kc, vc, loc
    gc.collect()
    emit({"built": _plans.stats["built"] - built, "alive": sum(r() is not None for r in refs)})
    """)
    assert out["built"] == 1 and out["alive"] == 0
