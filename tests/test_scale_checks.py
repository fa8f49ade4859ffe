"""Our writers' check of fp8 scale values: every element of every scale finite and > 0, or the call
is rejected, names the argument, the element and the value, and writes nothing.

The GPU writers check on the device, beside the slots, without synchronizing (the mailbox of
``oracle.kernels._deferred``). The Triton kernels run here on the CPU interpreter in a subprocess
(their fp8 conversion is wrong there, but the check is integer arithmetic on the scale's bits and
a rejected call converts nothing); the CUDA and Triton kernels on a GPU run under
``torch.cuda.set_sync_debug_mode("error")``.
"""

from __future__ import annotations

import importlib.util
import math

import numpy as np
import pytest
import torch

import oracle.kernels
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import _deferred
from oracle.kernels import torch_native as tn
from oracle.kernels.torch_native import quantize_fp8 as torch_quantize_fp8
from oracle.kernels.torch_native import reshape_and_cache_flash as torch_paged
from oracle.ops._bad_scales import BAD_SCALES
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

from test_triton_kernels import run as run_interpreted

gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
has_triton = importlib.util.find_spec("triton") is not None
BAD = (math.nan, math.inf, 0.0, -1.0, -0.0)


def test_the_mailbox_names_the_scale_its_element_and_its_value():
    inf_bits = int(np.float32(np.inf).view(np.uint32))
    words = [_deferred.SCALE, _deferred.SCALE_ARGUMENTS.index("v_scale"), inf_bits, 5, 8, 0, 0, 0]
    assert _deferred.message(words).startswith("v_scale[5] = inf must be a finite float32 > 0")
    nan_bits = int(np.float32(np.nan).view(np.uint32))
    words = [_deferred.SCALE, _deferred.SCALE_ARGUMENTS.index("scale"), nan_bits, 0, 1, 0, 0, 0]
    assert _deferred.message(words).startswith("scale = nan must be")
    words = [_deferred.SCALE, _deferred.SCALE_ARGUMENTS.index("k_global_scale"), 0, 0, 0, 0, 0, 0]
    assert _deferred.message(words).startswith("k_global_scale = 0.0 must be")


@pytest.mark.parametrize("value", BAD)
@pytest.mark.parametrize("where", ["k_scale", "v_scale"])
def test_the_torch_baselines_reject_every_bad_scale_and_write_nothing(value, where):
    key = torch.randn(6, 4, 8)
    caches = [torch.full((2, 16, 4, 8), 77, dtype=torch.uint8) for _ in range(2)]
    scales = {"k_scale": torch.ones(4), "v_scale": torch.ones(4)}
    scales[where][3] = value
    with pytest.raises(ValueError, match=rf"^{where}\[3\] = {value!r} must be finite and > 0"):
        torch_paged(key, key, *caches, torch.arange(6), "fp8", scales["k_scale"], scales["v_scale"])
    assert all(bool(c.eq(77).all()) for c in caches)
    out = torch.full((6, 4, 8), 5, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"^scale = "):
        torch_quantize_fp8(out, key, torch.tensor([value]), "e4m3fn")
    assert bool(out.eq(5).all())


@pytest.mark.skipif(not has_triton, reason="triton is not importable")
def test_triton_scale_check_rejects_every_bad_value_everywhere_and_writes_nothing():
    """reshape_and_cache_flash (one launch for K and V; two launches over aliased caches, each
    checking both scales), per-tensor and per-head, a short index (every program scans it) and a
    long one (a check grid); concat_and_cache_mla; quantize_fp8; calls that launch nothing; and
    validate=False, which writes."""
    out = run_interpreted("""
    import math
    BAD = (math.nan, math.inf, 0.0, -1.0, -0.0)
    H, D = 4, 8
    results = []
    def attempt(fn, caches):
        before = [c.clone() for c in caches]
        try:
            fn()
            message = None
        except ValueError as exc:
            message = str(exc)
        return message, all(torch.equal(a, b) for a, b in zip(caches, before))
    for n in (8, 700):
        key = torch.randn(n, H, D)
        slots = torch.randperm(64 * 16)[:n]
        for aliased in (False, True):
            for per_head in (False, True):
                for where in ("k_scale", "v_scale"):
                    for value in BAD:
                        kc = torch.full((64, 16, H, D), 77, dtype=torch.uint8)
                        vc = kc if aliased else torch.full_like(kc, 88)
                        scales = {"k_scale": torch.ones(H if per_head else 1),
                                  "v_scale": torch.ones(H if per_head else 1) * 2}
                        scales[where][-1] = value
                        message, unchanged = attempt(lambda: ops.reshape_and_cache_flash(
                            key, key, kc, vc, slots, "fp8", scales["k_scale"], scales["v_scale"],
                            allow_interpreter_fp8=True), [kc, vc])
                        label = f"{where}[{H - 1}]" if per_head else where
                        results.append({"case": [n, aliased, per_head, where, repr(value)], "message": message,
                                        "expected": f"{label} = {value!r} must be a finite float32 > 0",
                                        "unchanged": unchanged})
    kv_c, k_pe = torch.randn(8, 16), torch.randn(8, 8)
    for value in BAD:
        cache = torch.full((4, 16, 24), 9, dtype=torch.uint8)
        message, unchanged = attempt(lambda: ops.concat_and_cache_mla(
            kv_c, k_pe, cache, torch.arange(8) * 3, "fp8", torch.tensor([value]), allow_interpreter_fp8=True), [cache])
        results.append({"case": ["concat", repr(value)], "message": message, "unchanged": unchanged,
                        "expected": f"scale = {value!r} must be a finite float32 > 0"})
        out = torch.full((8, H, D), 5, dtype=torch.uint8)
        scale = torch.ones(H); scale[2] = value
        message, unchanged = attempt(lambda: ops.quantize_fp8(out, torch.randn(8, H, D), scale, "e4m3fn",
                                                              allow_interpreter_fp8=True), [out])
        results.append({"case": ["quantize", repr(value)], "message": message, "unchanged": unchanged,
                        "expected": f"scale[2] = {value!r} must be a finite float32 > 0"})
    empty = []
    for call in (lambda s: ops.reshape_and_cache_flash(torch.zeros(0, H, D), torch.zeros(0, H, D),
                                                       torch.zeros(4, 16, H, D, dtype=torch.uint8),
                                                       torch.zeros(4, 16, H, D, dtype=torch.uint8),
                                                       torch.zeros(0, dtype=torch.int64), "fp8", torch.ones(1), s,
                                                       allow_interpreter_fp8=True),
                 lambda s: ops.concat_and_cache_mla(torch.zeros(0, 16), torch.zeros(0, 8),
                                                    torch.zeros(4, 16, 24, dtype=torch.uint8),
                                                    torch.zeros(0, dtype=torch.int64), "fp8", s,
                                                    allow_interpreter_fp8=True),
                 lambda s: ops.quantize_fp8(torch.zeros(0, H, D, dtype=torch.uint8), torch.zeros(0, H, D), s,
                                            "e4m3fn", allow_interpreter_fp8=True)):
        empty.append(attempt(lambda: call(torch.tensor([math.nan])), [])[0])
    kc = torch.full((64, 16, H, D), 77, dtype=torch.uint8)
    ops.reshape_and_cache_flash(torch.randn(8, H, D), torch.randn(8, H, D), kc, kc.clone(), torch.arange(8),
                                "fp8", torch.tensor([math.nan]), torch.ones(1), allow_interpreter_fp8=True,
                                validate=False)
    emit({"results": results, "empty": empty, "unchecked_wrote": bool(kc.ne(77).any())})
    """)
    for r in out["results"]:
        assert r["message"] is not None and r["message"].startswith(r["expected"]), r
        assert r["unchanged"], r
    assert all(m is not None and "= nan must be finite and > 0" in m for m in out["empty"]), out["empty"]
    assert out["unchecked_wrote"]


def _paged_writers():
    """Every validating GPU reshape_and_cache_flash that declares fp8 (the registered variants,
    .checked_index included)."""
    from oracle.registry import Registry
    import oracle.kernels.cuda as cuda_kernels
    import oracle.kernels.triton as triton_kernels
    registry = Registry()
    for plugin in (cuda_kernels.register, triton_kernels.register):
        registry.load_plugin(plugin.__module__, plugin)
    return [k for _, k in sorted(registry.kernels.items())
            if k.contract.op == "reshape_and_cache_flash" and k.contract.validates and k.contract.fp8_formats
            and k.unavailable() is None]


@gpu
@pytest.mark.parametrize("n", [8, 5000])
@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
def test_gpu_paged_writers_reject_bad_scales_without_synchronizing(n, per_head):
    """A short index (scanned by the writer itself) and a long one (a check grid, or a
    CheckedIndex's verdict read by the CUDA writer's verdict-only build); the dense path (one scale
    a row) and the per-head one: under sync debug mode "error" nothing synchronizes, nothing is
    written, and the error names the scale, its element and its value."""
    kernels = _paged_writers()
    assert kernels
    dev, heads = "cuda", 8
    gen = torch.Generator().manual_seed(n)
    key = torch.randn(n, heads, 128, generator=gen).to(dev, torch.bfloat16)
    slots = (torch.randperm(2 * n + 64, generator=gen)[:n]).to(dev)
    caches = [torch.full(((2 * n + 64) // 16 + 1, 16, heads, 128), 77, dtype=torch.uint8, device=dev)
              for _ in range(2)]
    width = heads if per_head else 1
    for kernel in kernels:
        good = torch.ones(width, device=dev)
        kernel.fn(key, key, *caches, slots, "fp8", good, good)  # compile and warm up
        torch.cuda.synchronize()
        for where in ("k_scale", "v_scale"):
            for value in BAD:
                for cache in caches:
                    cache.fill_(77)
                scales = {"k_scale": good.clone(), "v_scale": good.clone()}
                scales[where][-1] = value
                torch.cuda.set_sync_debug_mode("error")
                try:
                    kernel.fn(key, key, *caches, slots, "fp8", scales["k_scale"], scales["v_scale"])
                finally:
                    torch.cuda.set_sync_debug_mode("default")
                label = f"{where}\\[{width - 1}\\]" if per_head else where
                with pytest.raises(oracle.kernels.DeferredSlotError, match=rf"^{label} = {value!r} must be"):
                    oracle.kernels.raise_deferred_errors()
                assert all(bool(c.eq(77).all()) for c in caches), (kernel.name, where, value)


# --- what the suite says about a kernel whose scale check is partial ----------------------------

def _partial_check(name: str, passes):
    """A paged fp8 writer that validates its scales with ``passes`` (a partial test, as real
    kernels write it) and otherwise writes as the torch baseline does."""
    def writer(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        for scale in (k_scale, v_scale):
            if not passes(scale):
                raise ValueError(f"bad scale {scale}")
        block_size = key_cache.shape[1]
        keep = slot_mapping >= 0
        slots = slot_mapping[keep].long()
        for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            rows = src[: slot_mapping.shape[0]][keep]
            cache[slots // block_size, slots % block_size] = tn._to_fp8_codes(rows, scale, "e4m3fn")
    writer.__name__ = name
    return writer


PARTIAL_CHECKS = {  # the check, and the bad inputs it lets through
    "le_zero": (lambda s: not bool((s <= 0).any()), {"scale_nan", "scale_inf"}),
    "isfinite": (lambda s: bool(torch.isfinite(s).all()), {"scale_zero", "scale_negative"}),
    "head_zero_only": (lambda s: bool(torch.isfinite(s[0]) and s[0] > 0), {"scale_nan"}),
}


@pytest.mark.parametrize("check", sorted(PARTIAL_CHECKS))
def test_a_partial_scale_check_is_caught_and_the_verdict_says_what_it_let_through(check):
    """Each partial test of the scale lets some of the four values through; the catalogue's bad
    scale cases catch exactly those, and the verdict names the value, where it sits and the check
    that lets it through."""
    passes, through = PARTIAL_CHECKS[check]
    contract = Contract(op="reshape_and_cache_flash", name=f"partial.{check}", backend="test", validates=True,
                        padding="negative", fp8_formats=("e4m3fn",), fp8_preset=tn._torch_fp8_preset())
    kernel = Kernel(contract, _partial_check(check, passes), "test")
    bad_cases = [c for c in catalogue("reshape_and_cache_flash", "quick") if c.p.get("bad") in BAD_SCALES]
    failed = set()
    for case in bad_cases:
        outcome = run_case(kernel, case)
        if outcome.status == FAIL:
            failed.add(case.p["bad"])
            assert outcome.cause["id"] == "validation_missing", outcome.message
            where = "the last head of " if case.p.get("scale") == "head" else ""
            argument = "k_scale" if case.p["bad"] in ("scale_nan", "scale_zero") else "v_scale"
            assert f"in {where}{argument}; a test of" in outcome.message, outcome.message
        else:
            assert outcome.status == PASS, outcome.message
    assert failed == through
