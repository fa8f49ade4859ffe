"""Validation that never synchronizes: the mailbox, the contract field ``errors="deferred"``, the
runner's judgement of such kernels, and our GPU writers' device-side slot check.

The engine tests use small torch kernels that defer their errors the way a GPU writer does (the
call returns, the error is raised by ``raise_deferred`` after the synchronization). The Triton
checks run on the CPU interpreter in a subprocess; the GPU tests run the validating writers under
``torch.cuda.set_sync_debug_mode("error")``, which raises on any synchronization.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

import oracle.kernels
from oracle.contract import Contract
from oracle.kernels import _deferred
from oracle.kernels.torch_native import store_cache as good_store_cache
from oracle.ops.base import Case
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

from test_triton_kernels import run as run_interpreted

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
has_triton = importlib.util.find_spec("triton") is not None


# ================================================================ the mailbox

def test_message_names_argument_entry_value_and_policy():
    words = [1, 3, 16, 16, 0, 0, 0, 0]
    assert _deferred.message(words).startswith("loc[3] = 16 is out of range [0, 16) under padding='none'")
    words = [1, 7, -2, 40, 1, 2, 5, 0]
    assert _deferred.message(words).startswith("slot_mapping[7] = -2 is out of range [0, 40) under "
                                               "padding='reserved:5'")


def test_take_raises_once_and_clears():
    box = _deferred.mailbox(torch.device("cpu"))
    box[:7] = torch.tensor([1, 4, 99, 10, 1, 1, 0])
    with pytest.raises(oracle.kernels.DeferredSlotError, match=r"slot_mapping\[4\] = 99 .*'negative'"):
        _deferred.take(-1)
    assert int(box.abs().sum()) == 0
    _deferred.take(-1)  # nothing pending: no error
    assert issubclass(oracle.kernels.DeferredSlotError, ValueError)


# ================================================================ the contract and the runner

_pending: list = []


def _raise_pending() -> None:
    if _pending:
        raise _pending.pop()


def defers(k, v, k_cache, v_cache, loc):
    """A correct writer that reports a bad slot after the call, as a GPU writer checking on the
    device does: writes nothing, raises nothing, leaves the error pending."""
    if loc.numel() and (int(loc.min()) < 0 or int(loc.max()) >= k_cache.shape[0]):
        _pending.append(ValueError(f"loc holds {int(loc.max())}, out of range [0, {k_cache.shape[0]})"))
        return
    good_store_cache(k, v, k_cache, v_cache, loc)


def never_reports(k, v, k_cache, v_cache, loc):
    """Defers, but never raises anything: an accepted bad input."""
    if loc.numel() and (int(loc.min()) < 0 or int(loc.max()) >= k_cache.shape[0]):
        return
    good_store_cache(k, v, k_cache, v_cache, loc)


def false_alarm(k, v, k_cache, v_cache, loc):
    """Writes right, then reports an error for a legal call."""
    good_store_cache(k, v, k_cache, v_cache, loc)
    _pending.append(ValueError("loc holds slot 0, out of range (wrongly)"))


def writes_then_defers(k, v, k_cache, v_cache, loc):
    """Writes the legal rows, then reports the bad one: a partial write."""
    keep = (loc >= 0) & (loc < k_cache.shape[0])
    k_cache[loc[keep]] = k[keep]
    if not bool(keep.all()):
        _pending.append(ValueError("loc out of range"))


def deferred_kernel(fn, **fields):
    contract = Contract(op="store_cache", name=fn.__name__, backend="test", validates=True, errors="deferred",
                        raise_deferred=_raise_pending, **fields)
    return Kernel(contract, fn, "test")


def test_contract_needs_a_callable_to_raise_deferred_errors():
    with pytest.raises(ValueError, match="errors='deferred' needs raise_deferred"):
        Contract(op="store_cache", name="x", backend="t", errors="deferred")
    with pytest.raises(ValueError, match="errors='later' is not one of raise, deferred"):
        Contract(op="store_cache", name="x", backend="t", errors="later")
    c = Contract(op="store_cache", name="x", backend="t", errors="deferred", raise_deferred=_raise_pending)
    assert "errors deferred to the next synchronization" in c.describe()
    assert "raise_deferred" not in c.as_dict() and c.as_dict()["errors"] == "deferred"


@pytest.mark.parametrize("bad", ["out_of_range", "index_dtype"])
def test_deferred_rejection_passes_and_unchanged_memory_is_still_checked(bad):
    _pending.clear()
    case = Case.make("store_cache", "bad_input", bad=bad)
    outcome = run_case(deferred_kernel(defers), case)
    assert outcome.status == PASS and "deferred to the synchronization" in outcome.message
    assert run_case(deferred_kernel(defers), Case.make("store_cache", "dtypes", dtype="bfloat16", index="int64",
                                                       n=33)).status == PASS


def test_a_deferred_kernel_that_never_reports_fails():
    _pending.clear()
    outcome = run_case(deferred_kernel(never_reports), Case.make("store_cache", "bad_input", bad="out_of_range"))
    assert outcome.status == FAIL and "without an error (deferred to the synchronization)" in outcome.message


def test_a_deferred_kernel_that_writes_before_reporting_fails():
    _pending.clear()
    outcome = run_case(deferred_kernel(writes_then_defers), Case.make("store_cache", "bad_input", bad="out_of_range"))
    assert outcome.status == FAIL and "memory changed first in" in outcome.message


def test_a_false_alarm_fails_a_legal_case():
    _pending.clear()
    outcome = run_case(deferred_kernel(false_alarm), Case.make("store_cache", "dtypes", dtype="bfloat16",
                                                               index="int64", n=33))
    assert outcome.status == FAIL and "wrongly" in outcome.message


def test_an_error_left_by_an_earlier_case_is_not_blamed_on_the_next():
    _pending[:] = [ValueError("stale")]
    outcome = run_case(deferred_kernel(defers), Case.make("store_cache", "dtypes", dtype="bfloat16",
                                                          index="int64", n=33))
    assert outcome.status == PASS and not _pending


# ================================================================ the Triton writers' device check

@pytest.mark.skipif(not has_triton, reason="triton is not importable")
def test_triton_device_check_rejects_per_policy_and_writes_nothing():
    """Both check paths (every program scanning a short index; a check grid and its verdict for a
    long one), every padding policy: an illegal slot anywhere leaves both caches exactly as they
    were and names the argument, the entry and its value; legal padding is skipped."""
    out = run_interpreted("""
    from oracle.kernels import _deferred
    H, D, S = 2, 4, 5000
    results = []
    for n in (8, 700):
        k = torch.randn(n, H, D)
        base = torch.randperm(S - 1)[:n] + 1
        for padding, bad, legal in (("none", -1, None), ("none", S, None), ("negative", S + 3, -5),
                                    ("reserved:0", -1, 0)):
            for where in (0, n // 2, n - 1):
                loc = base.clone()
                loc[where] = bad
                kc = torch.full((S, H, D), 7.0); vc = torch.full((S, H, D), 9.0)
                try:
                    ops.store_cache(k, k, kc, vc, loc, padding=padding)
                    message = None
                except _deferred.DeferredSlotError as exc:
                    message = str(exc)
                results.append({"n": n, "padding": padding, "bad": bad, "where": where, "message": message,
                                "unchanged": bool(kc.eq(7).all() and vc.eq(9).all())})
            if legal is not None:  # legal padding entries are skipped, the rest written
                loc = base.clone(); loc[1] = legal
                kc = torch.full((S, H, D), 7.0)
                ops.store_cache(k, k, kc, kc.clone(), loc, padding=padding)
                written = [i for i in range(n) if i != 1 and torch.equal(kc[loc[i]], k[i])]
                results.append({"n": n, "padding": padding, "legal_ok": len(written) == n - 1
                                and bool(kc[0].eq(7).all())})
    # validate=False: no check, out-of-range rows dropped, the rest written
    loc = torch.arange(8) + 1; loc[3] = S + 10
    kc = torch.full((S, H, D), 7.0); k = torch.randn(8, H, D)
    ops.store_cache(k, k, kc, kc.clone(), loc, validate=False)
    unchecked = sum(torch.equal(kc[loc[i]], k[i]) for i in range(8) if i != 3)
    emit({"results": results, "unchecked": int(unchecked)})
    """)
    for r in out["results"]:
        if "legal_ok" in r:
            assert r["legal_ok"], r
            continue
        assert r["message"] is not None and r["unchanged"], r
        name = "loc"
        assert r["message"].startswith(f"{name}[{r['where']}] = {r['bad']} is out of range [0, 5000) under "
                                       f"padding='{r['padding']}'"), r
    assert out["unchecked"] == 7


# ================================================================ on a GPU

def _writers():
    """(name, call(n, bad) -> (caches, raised)) for every validating GPU writer available here."""
    from oracle.registry import Registry
    registry = Registry()
    import oracle.kernels.cuda as cuda_kernels
    import oracle.kernels.triton as triton_kernels
    for plugin in (cuda_kernels.register, triton_kernels.register):
        registry.load_plugin(plugin.__module__, plugin)
    return [k for name, k in sorted(registry.kernels.items())
            if k.contract.validates and k.contract.errors == "deferred" and k.unavailable() is None
            and k.contract.op in ("store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash")]


def _call_args(op: str, n: int, num_slots: int, gen: torch.Generator):
    dev = "cuda"
    slots = (torch.randperm(num_slots - 1, generator=gen)[:n] + 1).to(dev)
    if op == "store_cache":
        k = torch.randn(n, 4, 64, generator=gen).to(dev, torch.bfloat16)
        caches = [torch.full((num_slots, 4, 64), 3.0, dtype=torch.bfloat16, device=dev) for _ in range(2)]
        return (k, k, *caches, slots), caches, slots
    if op == "set_mla_kv_buffer":
        nope = torch.randn(n, 512, generator=gen).to(dev, torch.bfloat16)
        rope = torch.randn(n, 64, generator=gen).to(dev, torch.bfloat16)
        buf = torch.full((num_slots, 576), 3.0, dtype=torch.bfloat16, device=dev)
        return (buf, slots, nope, rope), [buf], slots
    key = torch.randn(n, 4, 64, generator=gen).to(dev, torch.bfloat16)
    caches = [torch.full((num_slots // 16, 16, 4, 64), 3.0, dtype=torch.bfloat16, device=dev) for _ in range(2)]
    one = torch.ones(1, device=dev)
    return (key, key, *caches, slots, "auto", one, one), caches, slots


@gpu
@pytest.mark.parametrize("n", [8, 5000, 9000])
def test_gpu_writers_validate_without_synchronizing(n):
    """Every validating GPU writer, every check path (the writer's own scan of a short index; a
    check grid first; for the CUDA MLA writer at 5000 rows, the check inside its own grid, and at
    9000, past one pass, the check grid), under sync debug mode "error": a legal call
    and an illegal one return without synchronizing; the illegal one writes nothing; its error is
    raised by raise_deferred_errors (named: argument, entry, value), and the context stays usable."""
    num_slots = 16 * ((2 * n + 64) // 16)
    for kernel in _writers():
        gen = torch.Generator().manual_seed(n)
        args, caches, slots = _call_args(kernel.contract.op, n, num_slots, gen)
        kernel.fn(*args)  # compile and warm up outside the debug mode
        torch.cuda.synchronize()
        before = [c.clone() for c in caches]
        bad = list(args)
        index_pos = 4 if kernel.contract.op != "set_mla_kv_buffer" else 1
        illegal = slots.clone()
        illegal[n // 2] = num_slots + 5
        bad[index_pos] = illegal
        torch.cuda.set_sync_debug_mode("error")
        try:
            kernel.fn(*bad)  # nothing synchronizes, nothing is raised yet
        finally:
            torch.cuda.set_sync_debug_mode("default")
        with pytest.raises(oracle.kernels.DeferredSlotError,
                           match=rf"\[{n // 2}\] = {num_slots + 5} is out of range \[0, {num_slots}\)"):
            oracle.kernels.raise_deferred_errors()
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(caches, before)), kernel.name
        for cache in caches:
            cache.fill_(3.0)
        torch.cuda.set_sync_debug_mode("error")
        try:
            kernel.fn(*args)  # legal: written, no synchronization
        finally:
            torch.cuda.set_sync_debug_mode("default")
        oracle.kernels.raise_deferred_errors()  # nothing pending
        assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in zip(caches, before)), kernel.name


@gpu
def test_a_pending_error_is_raised_by_the_next_validating_call_and_sync_mode_raises_at_once():
    kernels = _writers()
    assert kernels
    for kernel in kernels:
        args, caches, slots = _call_args(kernel.contract.op, 8, 64, torch.Generator().manual_seed(1))
        index_pos = 4 if kernel.contract.op != "set_mla_kv_buffer" else 1
        bad = list(args)
        bad[index_pos] = torch.full_like(slots, -7 if kernel.contract.padding != "negative" else 99)
        kernel.fn(*bad)
        torch.cuda.synchronize()  # the GPU has written the mailbox; the host has not looked yet
        with pytest.raises(oracle.kernels.DeferredSlotError):
            kernel.fn(*args)
        if kernel.name.startswith("triton.") or kernel.name.startswith("cuda."):
            fn = kernel.fn.func if hasattr(kernel.fn, "func") else kernel.fn
            with pytest.raises(oracle.kernels.DeferredSlotError):
                fn(*bad, validate="sync")
        oracle.kernels.raise_deferred_errors()


@gpu
def test_a_captured_write_replays_without_the_check_and_drops_what_lies_outside():
    """Under CUDA-graph capture the check is left out (a replayed decode step costs what it did
    before the check existed): a replay with a slot past the cache writes the other rows, drops
    that one (nothing outside the buffer changes) and leaves no error pending."""
    for kernel in _writers():
        if kernel.contract.op != "set_mla_kv_buffer":
            continue
        n = 8
        args, caches, slots = _call_args("set_mla_kv_buffer", n, 64, torch.Generator().manual_seed(2))
        buf, loc, nope, rope = args
        kernel.fn(*args)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            kernel.fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        with torch.cuda.graph(graph):
            kernel.fn(*args)
        buf.fill_(3.0)
        loc[3] = 64
        graph.replay()
        oracle.kernels.raise_deferred_errors()  # nothing pending: the replay did not check
        kept = torch.tensor([i for i in range(n) if i != 3])
        assert torch.equal(buf[loc[kept].long(), :512], nope[kept]), kernel.name
        untouched = torch.ones(64, dtype=torch.bool)
        untouched[loc[kept].long()] = False
        assert bool(buf[untouched].eq(3.0).all()), kernel.name
