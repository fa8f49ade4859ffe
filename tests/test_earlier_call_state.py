"""Meta-tests of the ``after`` cases (oracle.ops._repeat.calls_before): a kernel that keeps what it
made for one call (a lookup table, a compiled variant) keyed without the fp8 format or the source
dtype is right on its first call in a process and wrong on a later call of another variant. Each
kernel here keeps that state in a closure, so every test starts it fresh: the ordinary cases pass,
the ``after`` case fails, and the failure is named ``earlier_call_state``; a kernel wrong on one
variant alone keeps its own cause, and the torch baseline passes every ``after`` case."""

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.ops._repeat import calls_before
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

FP8 = dict(fp8_formats=("e4m3fn", "e5m2"), fp8_preset=tn._torch_fp8_preset(), scales=("tensor", "head"))


def kernel(op: str, fn, **fields) -> Kernel:
    return Kernel(Contract(op=op, name="after." + fn.__name__, backend="test", **fields), fn, "test")


def case(op: str, case_id: str):
    return next(c for c in catalogue(op, "quick") if c.cls == "repeat" and c.id == case_id)


def first_format_kept():
    """quantize_fp8 whose fp8 format is fixed at its first call (a table built once)."""
    kept = []

    def quantize_fp8(out, x, scale, fmt):
        kept[:] = kept or [fmt]
        tn.quantize_fp8(out, x, scale, kept[0])
    return quantize_fp8


def first_dtype_kept():
    """quantize_fp8 that reads x as the element type of its first call (a variant compiled once)."""
    kept = []

    def quantize_fp8(out, x, scale, fmt):
        kept[:] = kept or [x.dtype]
        if x.element_size() == torch.empty((), dtype=kept[0]).element_size():
            x = x.view(kept[0])
        tn.quantize_fp8(out, x, scale, fmt)
    return quantize_fp8


def unit_scale_table_per_format():
    """quantize_fp8 whose unit-scale path reads 16-bit sources through a code table built for the
    dtype of its first such call and keyed by the format alone."""
    tables = {}

    def quantize_fp8(out, x, scale, fmt):
        if x.element_size() == 2 and scale.numel() == 1 and float(scale) == 1.0:
            x = x.view(tables.setdefault(fmt, x.dtype))
        tn.quantize_fp8(out, x, scale, fmt)
    return quantize_fp8


def test_every_op_with_formats_or_dtypes_gets_after_cases():
    for op, spec in SPECS.items():
        after = {c.p["after"] for c in catalogue(op, "quick") if "after" in c.p}
        if spec.fp8:
            assert {"fp8=e5m2", "fp8=e4m3fn"} <= after, op
        if len(spec.block_formats) > 1:
            assert {f"block={f}" for f in spec.block_formats} <= after, op
        if len(spec.dtypes) > 1 and spec.sources:
            assert f"dtype={spec.dtypes[1]}" in after, op
        if spec.sources and "fused" in spec.source_layouts:
            assert "src=contig" in after, op
        if len(spec.layouts) > 1:
            assert f"layout={spec.layouts[0]}" in after, op
            if "1.0" in spec.fp8_scales:
                assert any(c.p.get("after") == f"dtype={spec.dtypes[1]}" and c.p.get("scale") == "1.0"
                           for c in catalogue(op, "quick")), op


@pytest.mark.parametrize("case_id", ["e5m2-after_fp8_e4m3fn", "e4m3fn-after_fp8_e5m2"])
def test_a_format_kept_from_the_first_call_fails_the_second_and_is_named(case_id):
    plain = case_id.split("-")[0]
    ordinary = calls_before(case("quantize_fp8", case_id))[0]  # the case without its earlier call
    assert ordinary.id == plain
    assert run_case(kernel("quantize_fp8", first_format_kept(), **FP8), ordinary).status == PASS
    outcome = run_case(kernel("quantize_fp8", first_format_kept(), **FP8), case("quantize_fp8", case_id))
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "earlier_call_state", outcome.message
    assert f"it wrote {plain} codes" in outcome.cause["text"]
    assert "the second of the case's three calls" in outcome.message


def test_a_dtype_kept_from_the_first_call_is_named_though_no_replay_matches():
    outcome = run_case(kernel("quantize_fp8", first_dtype_kept(), **FP8), case("quantize_fp8", "bf16-after_dtype_float16"))
    assert outcome.status == FAIL
    assert outcome.cause["id"] == "earlier_call_state", outcome.message
    assert "float16 fails right after a call in bfloat16 that passed" in outcome.cause["text"]


def test_a_kernel_wrong_on_one_format_alone_keeps_its_own_cause():
    def quantize_fp8(out, x, scale, fmt):  # e4m3fnuz codes where e4m3fn is asked, whatever came before
        tn.quantize_fp8(out, x, scale, "e4m3fnuz" if fmt == "e4m3fn" else fmt)
    fields = FP8
    outcome = run_case(kernel("quantize_fp8", quantize_fp8, **fields), case("quantize_fp8", "e5m2-after_fp8_e4m3fn"))
    assert outcome.status == FAIL
    assert outcome.cause["id"] != "earlier_call_state", outcome.message
    outcome = run_case(kernel("quantize_fp8", quantize_fp8, **fields), case("quantize_fp8", "e4m3fn-after_fp8_e5m2"))
    assert outcome.status == FAIL and "the first of the case's three calls" in outcome.message


@pytest.mark.parametrize("op", ["quantize_fp8", "reshape_and_cache_flash", "store_cache", "reshape_and_cache_block"])
def test_the_torch_baseline_passes_every_after_case(op):
    from oracle.registry import default_registry
    baseline = next(k for k in default_registry.discover().select(backend="torch") if k.name == f"torch.{op}")
    for c in catalogue(op, "quick", baseline.contract):
        if "after" in c.p:
            assert run_case(baseline, c).status == PASS, c.id


def test_a_unit_scale_table_kept_per_format_alone_is_caught_under_scale_one_only():
    fields = dict(FP8, dtypes=("float32", "float16", "bfloat16"))
    unit = case("quantize_fp8", "bf16-e4m3fn-scale_1.0-after_dtype_float16")
    outcome = run_case(kernel("quantize_fp8", unit_scale_table_per_format(), **fields), unit)
    assert outcome.status == FAIL and outcome.cause["id"] == "earlier_call_state", outcome.message
    plain = case("quantize_fp8", "bf16-after_dtype_float16")  # scale 0.0123: the table is never taken
    assert run_case(kernel("quantize_fp8", unit_scale_table_per_format(), **fields), plain).status == PASS
    assert run_case(kernel("quantize_fp8", tn.quantize_fp8, **fields), unit).status == PASS


def first_mx_format_compiled():
    """quantize_block whose MX kernel is compiled for the first MX format it meets and kept under
    a key without the format (e4m3fn and e5m2 share every width)."""
    from oracle.kernels import torch_block as tb
    compiled = []

    def quantize_block(codes, scales, x, fmt, global_scale):
        if fmt.startswith("mxfp8"):
            compiled[:] = compiled or [fmt]
            fmt = compiled[0]
        tb.quantize_block(codes, scales, x, fmt, global_scale)
    return quantize_block


def test_an_mx_format_compiled_once_is_named_in_ordinary_and_after_cases():
    from oracle.kernels import torch_block as tb
    fields = dict(block_formats=tuple(tb.FORMATS))
    wrong = Kernel(Contract(op="quantize_block", name="x", backend="test", **fields), first_mx_format_compiled(), "test")
    e5m2 = [c for c in catalogue("quantize_block", "quick") if c.cls == "block_scaled" and c.p.get("block") == "mxfp8_e5m2"]
    assert run_case(wrong, next(c for c in catalogue("quantize_block", "quick") if c.p.get("block") == "mxfp8_e4m3fn"
                                and c.cls == "block_scaled")).status == PASS  # compiles e4m3fn
    outcomes = [run_case(wrong, c) for c in e5m2]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause["id"] == "wrong_fp8_format" for o in failed), [o.message for o in failed]
    assert all(o.cause["text"].startswith("mxfp8_e4m3fn codes written where mxfp8_e5m2 is asked") for o in failed)
    def fresh():
        return Kernel(Contract(op="quantize_block", name="x", backend="test", **fields), first_mx_format_compiled(), "test")

    assert run_case(fresh(), case("quantize_block", "mxfp8_e5m2-after_block_nvfp4")).status == PASS  # nothing shared
    outcome = run_case(fresh(), case("quantize_block", "mxfp8_e4m3fn-after_block_mxfp8_e5m2"))
    assert outcome.status == FAIL and outcome.cause["id"] == "earlier_call_state", outcome.message
    assert "it wrote mxfp8_e4m3fn codes where mxfp8_e5m2 is asked" in outcome.cause["text"]


def first_strides_kept():
    """store_cache whose launch plan (K's and V's row strides) is kept per shape from its first
    call: a later call with the same shapes and other strides reads its rows with the old ones."""
    plans = {}

    def store_cache(k, v, k_cache, v_cache, loc):
        strides = plans.setdefault((tuple(k.shape), tuple(v.shape)), (k.stride(), v.stride()))
        k, v = (t.as_strided(t.shape, s, t.storage_offset()) for t, s in zip((k, v), strides))
        tn.store_cache(k, v, k_cache, v_cache, loc)
    return store_cache


def test_strides_kept_from_the_first_call_are_named():
    fields = dict(dtypes=("float32", "float16", "bfloat16", "uint8"))
    outcome = run_case(kernel("store_cache", first_strides_kept(), **fields), case("store_cache", "fused_src-after_src_contig"))
    assert outcome.status == FAIL and outcome.cause["id"] == "earlier_call_state", outcome.message
    assert "keyed without the source layout" in outcome.cause["text"]
    ordinary = calls_before(case("store_cache", "fused_src-after_src_contig"))[0]
    assert run_case(kernel("store_cache", first_strides_kept(), **fields), ordinary).status == PASS


def v_width_kept_per_k_width():
    """store_cache compiled per (dtype, K's row width) with V's row width a template argument of
    the first call: a later call with K as wide and V narrower copies V's old width."""
    compiled = {}

    def store_cache(k, v, k_cache, v_cache, loc):
        width = compiled.setdefault((k.dtype, k.shape[-1]), v.shape[-1])
        if width != v.shape[-1] and v.is_contiguous() and v_cache.is_contiguous():
            v = v.as_strided(v.shape[:-1] + (width,), v.stride(), v.storage_offset())
            v_cache = v_cache.as_strided(v_cache.shape[:-1] + (width,), v_cache.stride(), v_cache.storage_offset())
        tn.store_cache(k, v, k_cache, v_cache, loc)
    return store_cache


def test_a_v_width_kept_from_the_first_call_is_named():
    fields = dict(dtypes=("float32", "float16", "bfloat16", "uint8"))
    outcome = run_case(kernel("store_cache", v_width_kept_per_k_width(), **fields), case("store_cache", "1x64x97-after_shape_1x64"))
    assert outcome.status == FAIL and outcome.cause["id"] == "earlier_call_state", outcome.message
    assert "1x64 fails right after a call in 1x64x97" in outcome.cause["text"]
