"""The C++ CPU kernels (oracle.kernels.cpu): torch custom-op registration (opcheck), the fp8 paths
of every ISA bit for bit against the reference, validation messages, layouts the conformance
catalogue does not build, and the build cache (one build per machine, shared by processes).

The conformance suite judges these kernels case by case
(``ORACLE_PLUGINS=oracle.kernels.cpu:register pytest conformance --oracle-backend cpu``); this file
covers what it does not: the op registration itself, every conversion path, and the build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import torch

from oracle.kernels import cpu
from oracle.kernels.cpu import _build
from oracle.reference import fp8 as ref_fp8
from oracle.registry import Registry

REASON = cpu.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CPU kernels unavailable: {REASON}")
REPO = Path(__file__).resolve().parents[1]


def ops():
    return cpu.ops()


def supported_isas() -> list[str]:
    best = cpu.detected_isa()
    return list(cpu.ISAS[: cpu.ISAS.index(best) + 1])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A torch float tensor as the numpy array the reference takes (bfloat16 via ml_dtypes)."""
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


# ---- torch.library registration: opcheck -------------------------------------------------------

def _opcheck_cases():
    g = torch.Generator().manual_seed(0)

    def randn(*shape, dtype=torch.bfloat16):
        return torch.randn(shape, generator=g).to(dtype)

    yield "store_cache-int64", "store_cache", (
        randn(5, 2, 8), randn(5, 2, 8), torch.zeros(16, 2, 8, dtype=torch.bfloat16),
        torch.zeros(16, 2, 8, dtype=torch.bfloat16), torch.tensor([3, 1, 7, 9, 15]), "none")
    yield "store_cache-int32-reserved-grad", "store_cache", (
        randn(4, 16, dtype=torch.float32).requires_grad_(), randn(4, 8, dtype=torch.float32).requires_grad_(),
        torch.zeros(9, 16), torch.zeros(9, 8), torch.tensor([0, 2, 0, 8], dtype=torch.int32), "reserved:0")
    yield "set_mla_kv_buffer", "set_mla_kv_buffer", (
        torch.zeros(12, 40, dtype=torch.bfloat16), torch.tensor([4, 0, 11]), randn(3, 32), randn(3, 8), "none")
    yield "set_mla_kv_buffer-uint8", "set_mla_kv_buffer", (
        torch.zeros(12, 40, dtype=torch.uint8), torch.tensor([4, 0, 11], dtype=torch.int32),
        torch.randint(0, 255, (3, 20), dtype=torch.uint8, generator=g),
        torch.randint(0, 255, (3, 12), dtype=torch.uint8, generator=g), "none")
    yield "concat_and_cache_mla-auto", "concat_and_cache_mla", (
        randn(4, 32), randn(6, 8), torch.zeros(3, 4, 40, dtype=torch.bfloat16), torch.tensor([5, -1, 0, 11]),
        "auto", torch.ones(1), "negative")
    yield "concat_and_cache_mla-e4m3fn", "concat_and_cache_mla", (
        randn(4, 32, dtype=torch.float16), randn(4, 8, dtype=torch.float16), torch.zeros(3, 4, 40, dtype=torch.uint8),
        torch.tensor([5, -1, 0, 11], dtype=torch.int32), "e4m3fn", torch.tensor([0.0123]), "negative")
    key, value = randn(6, 2, 16), randn(6, 2, 8)
    yield "reshape_and_cache_flash-auto-NHD", "reshape_and_cache_flash", (
        key, value, torch.zeros(2, 4, 2, 16, dtype=torch.bfloat16), torch.zeros(2, 4, 2, 8, dtype=torch.bfloat16),
        torch.tensor([1, 6, -1, 7, 0]), "auto", None, None, "negative")
    hnd_k = torch.zeros(2, 2, 4, 16, dtype=torch.uint8).permute(0, 2, 1, 3)
    hnd_v = torch.zeros(2, 2, 4, 8, dtype=torch.uint8).permute(0, 2, 1, 3)
    yield "reshape_and_cache_flash-e5m2-HND-per-head", "reshape_and_cache_flash", (
        key.float(), value.float(), hnd_k, hnd_v, torch.tensor([1, 6, -1, 7, 0], dtype=torch.int32), "fp8_e5m2",
        torch.tensor([0.5, 0.03]), torch.tensor([0.25]), "negative")
    yield "quantize_fp8-e4m3fnuz", "quantize_fp8", (
        torch.zeros(3, 2, 16, dtype=torch.uint8), randn(3, 2, 16), torch.tensor([0.0123, 2.0]), "e4m3fnuz")


@pytest.mark.parametrize("op,args", [pytest.param(op, args, id=name) for name, op, args in _opcheck_cases()])
def test_opcheck(op, args):
    """Schema (declared mutations), autograd registration, fake tensors and AOT dispatch."""
    result = torch.library.opcheck(getattr(ops(), op).default, args)
    assert result == {"test_schema": "SUCCESS", "test_autograd_registration": "SUCCESS",
                      "test_faketensor": "SUCCESS", "test_aot_dispatch_dynamic": "SUCCESS"}


def test_schemas_mark_every_written_cache_mutable():
    expect = {"store_cache": {"k_cache", "v_cache"}, "set_mla_kv_buffer": {"kv_buffer"},
              "concat_and_cache_mla": {"kv_cache"}, "reshape_and_cache_flash": {"key_cache", "value_cache"},
              "quantize_fp8": {"out"}}
    for op, written in expect.items():
        schema = getattr(ops(), op).default._schema
        mutable = {a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write}
        assert mutable == written, op
        assert len(schema.returns) == 0


def test_ops_run_on_meta_tensors():
    meta = torch.device("meta")
    k = torch.empty(5, 2, 8, device=meta)
    cache = torch.empty(16, 2, 8, device=meta)
    ops().store_cache(k, k, cache, cache.clone(), torch.empty(5, dtype=torch.int64, device=meta), "none")
    out = torch.empty(5, 2, 8, dtype=torch.uint8, device=meta)
    ops().quantize_fp8(out, k, torch.empty(1, device=meta), "e4m3fn")


def test_compiled_caller_writes_the_cache():
    """torch.compile traces the mutation through the fake kernel and keeps it."""
    def write(k, v, kc, vc, loc):
        torch.ops.kv_oracle_cpu.store_cache(k * 2, v, kc, vc, loc, "none")
        return kc.sum()

    generator = torch.Generator().manual_seed(7)
    k, v = torch.randn(3, 4, generator=generator), torch.randn(3, 4, generator=generator)
    kc, vc = torch.zeros(8, 4), torch.zeros(8, 4)
    loc = torch.tensor([5, 0, 2])
    total = torch.compile(write, backend="aot_eager", fullgraph=True)(k, v, kc, vc, loc)
    assert torch.equal(kc[loc], k * 2) and torch.equal(vc[loc], v)
    # the sum of the written cache, in whatever order the graph adds: not bit-exact, a sum of 12 values
    assert torch.allclose(total, (k * 2).sum(), rtol=0, atol=1e-5)


def test_registered_python_functions_have_the_baseline_signatures():
    import inspect

    from oracle.kernels import torch_block, torch_native

    registry = Registry()
    registry.load_plugin("cpu", cpu.register)
    assert not registry.errors
    assert {k.contract.op for k in registry.kernels.values()} == {
        "store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash", "quantize_fp8",
        "quantize_block", "reshape_and_cache_block"}
    for kernel in registry.kernels.values():
        baseline = getattr(torch_native, kernel.contract.op, None) or getattr(torch_block, kernel.contract.op)
        assert list(inspect.signature(kernel.fn).parameters) == list(inspect.signature(baseline).parameters)
        c = kernel.contract
        assert (c.backend, c.device, c.validates, c.fp8_preset) == ("cpu", "cpu", True, "ocp_satfinite")
        assert kernel.unavailable() is None
        assert {"avx512": "AVX-512", "avx2": "AVX2", "scalar": "scalar"}[cpu.cpu_isa()] + " on this machine" in c.notes
    paddings = {k.name: k.contract.padding for k in registry.kernels.values()}
    assert paddings["cpu.store_cache"] == "none" and paddings["cpu.store_cache.reserved0"] == "reserved:0"
    assert paddings["cpu.reshape_and_cache_flash"] == "negative" and paddings["cpu.concat_and_cache_mla"] == "negative"


# ---- fp8: every ISA path, bit for bit against the reference ------------------------------------

def _float32_classes() -> np.ndarray:
    """Every top-16-bit pattern with low halves 0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF: every class of
    the reference's table key (so every code, tie, subnormal, overflow, inf and NaN of every
    format), plus 2^18 random bit patterns."""
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    lows = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    rng = np.random.default_rng(5)
    bits = np.concatenate([(high[:, None] | lows[None, :]).reshape(-1),
                           rng.integers(0, 1 << 32, size=1 << 18, dtype=np.uint32)])
    return bits.view(np.float32)


def _all_16bit(dtype) -> torch.Tensor:
    return torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16).view(dtype)


SOURCES = {
    "float32": lambda: torch.from_numpy(_float32_classes()),
    "float16": lambda: _all_16bit(torch.float16),
    "bfloat16": lambda: _all_16bit(torch.bfloat16),
}


@pytest.fixture(params=["scalar", "avx2", "avx512"])
def isa(request):
    if request.param not in supported_isas():
        pytest.skip(f"this CPU has no {request.param} (it supports {', '.join(supported_isas())})")
    with cpu.forced_isa(request.param):
        assert cpu.isa() == request.param
        yield request.param


def _reference(x: torch.Tensor, fmt: str, scale: torch.Tensor) -> np.ndarray:
    with np.errstate(all="ignore"):
        return ref_fp8.quantize(to_numpy(x), fmt, scale=scale.numpy(), preset="ocp_satfinite", head_axis=-2)


def _first_mismatch(x: torch.Tensor, got: np.ndarray, want: np.ndarray) -> str:
    bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
    if not bad.size:
        return ""
    i = int(bad[0])
    value = x.reshape(-1)[i]
    bits = value.view(torch.int32 if x.dtype == torch.float32 else torch.int16).item() & 0xFFFFFFFF
    return (f"{bad.size} codes differ; first at {i}: x={value.item()!r} (bits 0x{bits:X}) "
            f"got 0x{got.reshape(-1)[i]:02X}, reference 0x{want.reshape(-1)[i]:02X}")


@pytest.mark.parametrize("fmt", cpu.FP8_FORMATS)
@pytest.mark.parametrize("dtype", list(SOURCES))
def test_fp8_every_isa_matches_reference_at_scale_one(isa, fmt, dtype):
    """Scale 1: the conversion itself, on every rounding class (ties to even at every exponent,
    subnormal ties, +-max, the tie above max, overflow, +-inf, NaN of both signs, -0)."""
    flat = SOURCES[dtype]()
    width = 48  # rows of 48: full vectors and tails on every path
    x = flat[: flat.numel() // width * width].reshape(-1, 1, width)
    out = torch.empty(x.shape, dtype=torch.uint8)
    ops().quantize_fp8(out, x, torch.ones(1), fmt)
    want = _reference(x, fmt, torch.ones(1))
    assert not _first_mismatch(x, out.numpy(), want), _first_mismatch(x, out.numpy(), want)


@pytest.mark.parametrize("fmt", cpu.FP8_FORMATS)
@pytest.mark.parametrize("scale", [[0.0123], [3.0], [0.05], [0.125], [2.0 ** -100], [1e30], [3e37],
                                   [0.0123, 0.5, 7.0, 1e-3, 0.1]],
                         ids=["0.0123", "3", "0.05", "pow2", "tiny", "huge", "past-2^125", "head"])
def test_fp8_every_isa_divides_in_float32(isa, fmt, scale):
    """x / scale in IEEE float32, whichever way a path gets there (powers of two: the exact
    reciprocal; calibrated-looking scales: the checked reciprocal; 0.05, 0.1, 1e-3 and scales past
    2^125: division): random, scaled class inputs, and sources whose quotient lands exactly on
    ties, for per-tensor and per-head scales."""
    heads = len(scale)
    s = torch.tensor(scale, dtype=torch.float32)
    classes = torch.from_numpy(_float32_classes()[: 6 << 14])
    rng = torch.Generator().manual_seed(9)
    parts = [classes, torch.randn(1 << 16, generator=rng) * 4]
    # quotients exactly on the fp8 ties: x = tie * scale where that product is exact in float32
    codes = torch.from_numpy(ref_fp8.code_values(fmt)).float()
    finite = codes[torch.isfinite(codes)].unique()
    ties = (finite[:-1] + finite[1:]) / 2
    parts.append(torch.cat([ties, finite]) * s[0])
    flat = torch.cat(parts)
    width = 40
    x = flat[: flat.numel() // (width * heads) * width * heads].reshape(-1, heads, width)
    out = torch.empty(x.shape, dtype=torch.uint8)
    ops().quantize_fp8(out, x, s, fmt)
    want = _reference(x, fmt, s)
    assert not _first_mismatch(x, out.numpy(), want), _first_mismatch(x, out.numpy(), want)


@pytest.mark.parametrize("fmt", cpu.FP8_FORMATS)
def test_fp8_quotients_within_ulps_of_every_step(isa, fmt):
    """Sources whose quotient x / s lies on, or a few float32 ulps either side of, every tie
    between codes (and every code): where x * (1/s) and x / s round differently, only the
    division is right. Per-head scales, none a power of two."""
    scale = torch.tensor([0.0123, 3.0, 0.7, 1.0e-3, 37.5, 0.05], dtype=torch.float32)
    codes = ref_fp8.code_values(fmt).astype(np.float64)
    finite = np.unique(np.abs(codes[np.isfinite(codes)]))
    targets = np.concatenate([finite, (finite[:-1] + finite[1:]) / 2, [finite[-1] * 1.0625]]).astype(np.float32)
    rows = []
    for s in scale.numpy():
        up = down = (targets.astype(np.float64) * s).astype(np.float32)
        near = [up]
        for _ in range(6):  # float32 neighbours, so that x / s walks across each step
            up, down = np.nextafter(up, np.float32(np.inf)), np.nextafter(down, np.float32(-np.inf))
            near += [up, down]
        row = np.concatenate(near + [-v for v in near])
        rows.append(np.pad(row, (0, -len(row) % 16)))
    # [N, H, 16]: head h (scale h) holds rows[h], sixteen per vector
    x = torch.from_numpy(np.stack(rows).reshape(len(scale), -1, 16).transpose(1, 0, 2).copy())
    out = torch.empty(x.shape, dtype=torch.uint8)
    ops().quantize_fp8(out, x, scale, fmt)
    want = _reference(x, fmt, scale)
    assert not _first_mismatch(x, out.numpy(), want), _first_mismatch(x, out.numpy(), want)


@pytest.mark.parametrize("width", [1, 7, 8, 15, 16, 17, 31, 33, 64, 100])
def test_fp8_tails_and_strided_rows(isa, width):
    """Row widths around every vector length, dense and with strided sources and outputs."""
    g = torch.Generator().manual_seed(width)
    x = (torch.randn(9, 3, width, generator=g) * 50).to(torch.bfloat16)
    scale = torch.tensor([0.0123, 0.7, 3.0])
    want = _reference(x, "e4m3fn", scale)
    out = torch.zeros(9, 3, width, dtype=torch.uint8)
    ops().quantize_fp8(out, x, scale, "e4m3fn")
    assert np.array_equal(out.numpy(), want)
    wide = torch.zeros(9, 3, 2 * width, dtype=torch.bfloat16)
    strided_x = wide[:, :, ::2]
    strided_x.copy_(x)
    strided_out = torch.zeros(9, 3, 2 * width, dtype=torch.uint8)[:, :, 1::2]
    ops().quantize_fp8(strided_out, strided_x, scale, "e4m3fn")
    assert np.array_equal(strided_out.contiguous().numpy(), want)


def test_fp8_streamed_writes_match_reference(isa):
    """Past 4 MiB of codes each run is converted into an L1 buffer and streamed out with
    non-temporal stores: quantize_fp8, the paged writer (NHD, and HND with per-head scales) and the
    MLA writer, against the reference."""
    g = torch.Generator().manual_seed(3)
    n, heads, dim = 4200, 8, 128
    x = (torch.randn(n, heads, dim, generator=g) * 30).bfloat16()
    scale = torch.tensor([0.0123])
    out = torch.zeros(n, heads, dim, dtype=torch.uint8)
    ops().quantize_fp8(out, x, scale, "e4m3fn")
    assert np.array_equal(out.numpy(), _reference(x, "e4m3fn", scale))

    head_scale = torch.linspace(0.01, 0.2, heads)
    slots = torch.randperm(2 * n, generator=g)[:n]
    for layout in ("NHD", "HND"):
        alloc = (2 * n // 16, 16, heads, dim) if layout == "NHD" else (2 * n // 16, heads, 16, dim)
        caches = [torch.zeros(alloc, dtype=torch.uint8) for _ in range(2)]
        views = caches if layout == "NHD" else [c.permute(0, 2, 1, 3) for c in caches]
        ops().reshape_and_cache_flash(x, x, views[0], views[1], slots, "e5m2", head_scale, scale, "negative")
        for view, sc in zip(views, (head_scale, scale)):
            got = view.reshape(-1, heads, dim)  # the logical [slot, H, D] rows, either layout
            assert np.array_equal(got[slots].numpy(), _reference(x, "e5m2", sc)), layout

    kv_c = (torch.randn(9000, 512, generator=g) * 30).half()
    k_pe = (torch.randn(9000, 64, generator=g) * 30).half()
    cache = torch.zeros(9000 // 16 + 1, 16, 576, dtype=torch.uint8)
    slots = torch.randperm(cache.shape[0] * 16, generator=g)[:9000]
    ops().concat_and_cache_mla(kv_c, k_pe, cache, slots, "e4m3fnuz", scale, "negative")
    rows = torch.cat([kv_c, k_pe], dim=1)
    want = ref_fp8.quantize(rows.numpy(), "e4m3fnuz", scale=scale.numpy(), preset="ocp_satfinite")
    assert np.array_equal(cache.reshape(-1, 576)[slots].numpy(), want)


def test_isa_control():
    assert cpu.detected_isa() == cpu.cpu_isa()  # C++ detection agrees with /proc/cpuinfo
    with pytest.raises(ValueError, match="isa=sse9 is not one of"):
        cpu.set_isa("sse9")
    previous = cpu.set_isa("scalar")
    try:
        assert cpu.isa() == "scalar"
        assert cpu.set_isa("auto") == "scalar"
        assert cpu.isa() == cpu.detected_isa()
    finally:
        cpu.set_isa(previous)
    if cpu.detected_isa() != "avx512":
        with pytest.raises(ValueError, match="not supported by this CPU"):
            cpu.set_isa("avx512")


def test_isa_environment_variable_caps_the_path():
    code = "import oracle.kernels.cpu as c; assert c.available() is None; print(c.isa())"
    env = dict(os.environ, KV_ORACLE_CPU_ISA="scalar")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "scalar"


# ---- validation: clear errors, nothing written ------------------------------------------------

def _store_inputs(n=5, slots=16):
    k = torch.randn(n, 2, 8)
    return k, k + 1, torch.full((slots, 2, 8), 7.0), torch.full((slots, 2, 8), 9.0)


@pytest.mark.parametrize("loc,padding,message", [
    ([1, 2, 16, 3, 17], "none", r"loc\[2\] = 16 is out of range \[0, 16\) under padding='none' \(1 more position"),
    ([1, -1, 2, 3, 4], "none", r"loc\[1\] = -1 is out of range \[0, 16\) under padding='none'$"),
    ([1, -1, 2, 3, 4], "reserved:0", r"loc\[1\] = -1 is out of range .* padding='reserved:0'"),
    ([1, 2, 3, 4, 5], "skip", r"padding='skip' is not a padding policy"),
])
def test_bad_slots_are_rejected_before_any_write(loc, padding, message):
    k, v, kc, vc = _store_inputs()
    before = (kc.clone(), vc.clone())
    with pytest.raises(ValueError, match=message):
        ops().store_cache(k, v, kc, vc, torch.tensor(loc), padding)
    assert torch.equal(kc, before[0]) and torch.equal(vc, before[1])


def test_validation_names_argument_and_value():
    k, v, kc, vc = _store_inputs()
    loc = torch.arange(5)
    with pytest.raises(TypeError, match=r"k has dtype torch.float16 but k_cache has dtype torch.float32"):
        cpu.store_cache(k.half(), v, kc, vc, loc)
    with pytest.raises(ValueError, match=r"v has shape \(5, 2, 7\); expected \(5, 2, 8\)"):
        cpu.store_cache(k, v[..., :7], kc, vc, loc)
    with pytest.raises(ValueError, match="several of its elements share memory"):
        cpu.store_cache(k, v, kc, torch.zeros(1, 2, 8).expand(16, 2, 8), loc)
    key = torch.randn(4, 2, 8)
    cache = torch.zeros(2, 4, 2, 8, dtype=torch.uint8)
    slots = torch.arange(4)
    with pytest.raises(ValueError, match=r"k_scale must be finite and > 0, got 0 at head 1"):
        cpu.reshape_and_cache_flash(key, key, cache, cache.clone(), slots, "e4m3fn", torch.tensor([1.0, 0.0]),
                                    torch.ones(1))
    with pytest.raises(TypeError, match="k_scale must be a float32 tensor, got float"):
        cpu.reshape_and_cache_flash(key, key, cache, cache.clone(), slots, "fp8", 1.0, 1.0)
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp9' is not one of"):
        cpu.reshape_and_cache_flash(key, key, cache, cache.clone(), slots, "fp9", torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match=r"slot_mapping\[3\] = 8 is out of range \[0, 8\) under padding='negative'"):
        cpu.reshape_and_cache_flash(key, key, cache, cache.clone(), torch.tensor([0, -1, 2, 8]), "fp8",
                                    torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match=r"fmt='e4m3' is not one of"):
        cpu.quantize_fp8(torch.zeros(1, 1, 4, dtype=torch.uint8), torch.zeros(1, 1, 4), torch.ones(1), "e4m3")
    with pytest.raises(ValueError, match=r"kv_buffer rows have 39 elements, fewer than nope \(32\) \+ rope \(8\) = 40"):
        cpu.set_mla_kv_buffer(torch.zeros(8, 39), torch.arange(2), torch.zeros(2, 32), torch.zeros(2, 8))


def test_auto_ignores_scales_and_float_scale_arguments():
    key = torch.randn(3, 2, 8, dtype=torch.float16)
    cache = torch.zeros(2, 4, 2, 8, dtype=torch.float16)
    cpu.reshape_and_cache_flash(key, key, cache, cache.clone(), torch.tensor([0, 5, 7]), "auto", 1.0, 1.0)
    assert torch.equal(cache.reshape(8, 2, 8)[[0, 5, 7]], key)


# ---- layouts the catalogue does not build ------------------------------------------------------

def test_store_cache_honours_every_source_and_cache_stride():
    """Head-sliced and transposed sources, a cache whose rows are not contiguous inside."""
    g = torch.Generator().manual_seed(1)
    base = torch.randn(6, 4, 16, generator=g)
    k = base[:, ::2, :]  # head-sliced: rows are not one run
    v = base[:, :, ::8]  # innermost stride 8
    kc = torch.zeros(10, 16, 2).transpose(1, 2)  # innermost stride 2
    vc = torch.zeros(10, 4, 2)
    loc = torch.tensor([9, 0, 4, 3, 7, 1], dtype=torch.int32)
    cpu.store_cache(k, v, kc, vc, loc)
    want_k, want_v = torch.zeros(10, 2, 16), torch.zeros(10, 4, 2)
    want_k[loc.long()], want_v[loc.long()] = k, v
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)


def test_set_mla_kv_buffer_accepts_the_three_d_forms():
    buffer = torch.zeros(8, 1, 12, dtype=torch.bfloat16)
    nope = torch.randn(3, 1, 8).bfloat16()
    rope = torch.randn(3, 4).bfloat16()
    cpu.set_mla_kv_buffer(buffer, torch.tensor([6, 1, 2]), nope, rope)
    assert torch.equal(buffer[[6, 1, 2], 0], torch.cat([nope[:, 0], rope], dim=1))
    assert not buffer[[0, 3, 4, 5, 7]].any()


def test_reserved_policy_skips_the_reserved_slot_only():
    k, v, kc, vc = _store_inputs(n=4)
    before = kc.clone()
    ops().store_cache(k, v, kc, vc, torch.tensor([3, 0, 5, 0]), "reserved:0")
    assert torch.equal(kc[0], before[0])
    assert torch.equal(kc[[3, 5]], k[[0, 2]])


def test_offsets_past_two_to_the_31_elements():
    """A uint8 cache of 2^31 + 2^14 bytes, written at its last rows (64-bit offsets); the pages
    never touched are never allocated."""
    row = 1 << 10
    slots = ((1 << 31) >> 10) + 16
    cache = torch.empty(slots, row, dtype=torch.uint8)
    src = torch.randint(0, 255, (3, row), dtype=torch.uint8)
    loc = torch.tensor([slots - 1, slots - 3, 5], dtype=torch.int32)
    cpu.store_cache(src, src, cache, cache, loc)
    assert torch.equal(cache[slots - 1], src[0]) and torch.equal(cache[slots - 3], src[1])
    assert torch.equal(cache[5], src[2])
    paged = cache.view(-1, 16, row // 2, 2)  # [blocks, 16, H, D] past 2^31 elements
    key = torch.randn(1, row // 2, 2)
    cpu.reshape_and_cache_flash(key, key, paged, paged, torch.tensor([slots - 2]), "e5m2", torch.ones(1),
                                torch.ones(1))
    want = torch.from_numpy(ref_fp8.quantize(key.numpy(), "e5m2"))
    assert torch.equal(cache[slots - 2], want.reshape(-1))


@pytest.mark.parametrize("width", [256, 500, 4099])
def test_large_batch_streams_in_parallel_and_matches_index_put(isa, width):
    """Past 4 MiB written the rows go out with non-temporal stores (AVX-512 or AVX2), split over
    threads; row bytes that are not a multiple of the vector (1000, 8198) and unaligned rows
    (a cache at a storage offset of one element) exercise the heads and tails."""
    n = 40_000_000 // (4 * width)
    k = torch.randn(n, width).bfloat16()
    v = torch.randn(n, width).bfloat16()
    storage = torch.zeros(2 * n * width + 1, dtype=torch.bfloat16)
    kc = storage[1:].view(2 * n, width)
    vc = torch.zeros(2 * n, width, dtype=torch.bfloat16)
    loc = torch.randperm(2 * n)[:n]
    cpu.store_cache(k, v, kc, vc, loc)
    want_k, want_v = torch.zeros_like(kc), torch.zeros_like(vc)
    want_k[loc], want_v[loc] = k, v
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v) and storage[0] == 0


# ---- the build cache ---------------------------------------------------------------------------

def _python(code: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout, cwd=REPO)


def test_build_directory_is_per_torch_version_and_source_hash(monkeypatch, tmp_path):
    monkeypatch.delenv(_build.BUILD_DIR_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    directory = _build.build_dir()
    assert directory.parent == tmp_path / "kv-oracle"
    assert directory.name == f"cpu-{torch.__version__.replace('+', '_')}-{_build.source_hash()}"
    monkeypatch.setenv("CXX", "clang++")  # another compiler, another library
    assert _build.build_dir() != directory


def test_a_second_process_loads_the_cached_library_without_building():
    library = Path(_build.status()["loaded"])
    stamp = library.stat().st_mtime_ns
    out = _python("""
        import oracle.kernels.cpu as c
        from oracle.kernels.cpu import _build
        assert c.available() is None
        print(_build.status())
    """)
    assert out.returncode == 0, out.stderr
    status = eval(out.stdout.strip())
    assert status["built"] is False and status["loaded"] == str(library)
    assert library.stat().st_mtime_ns == stamp


def test_build_failure_is_a_reason_not_a_crash(tmp_path):
    out = _python("""
        from oracle.registry import Registry
        import oracle.kernels.cpu as c
        registry = Registry()
        registry.load_plugin("cpu", c.register)
        assert not registry.errors, registry.errors
        reasons = {k.unavailable() for k in registry.kernels.values()}
        assert len(reasons) == 1, reasons
        print(reasons.pop())
    """, env={_build.BUILD_DIR_ENV: str(tmp_path / "b1"), "CXX": "/bin/false"})
    assert out.returncode == 0, out.stderr
    assert "building the C++ kernels in" in out.stdout and "failed" in out.stdout
    out = _python("import oracle.kernels.cpu as c; print(c.available())",
                  env={_build.BUILD_DIR_ENV: str(tmp_path / "b2"), "CXX": "no-such-compiler-kvo"})
    assert out.returncode == 0, out.stderr
    assert "no C++ compiler: 'no-such-compiler-kvo' is not on PATH" in out.stdout


def test_concurrent_processes_build_once(tmp_path):
    """Two processes start on an empty build directory at once: one builds (here a stand-in that
    copies the real library after a pause, so the test needs no compiler time), the other waits on
    the lock and loads the same library; neither builds twice. A stale torch 'lock' file from a
    killed build does not make them wait forever."""
    real = Path(_build.status()["loaded"])
    directory = tmp_path / "build"
    directory.mkdir()
    (directory / "lock").write_text("")  # what a killed torch build leaves behind
    code = f"""
        import os, shutil, time
        from pathlib import Path
        from oracle.kernels.cpu import _build
        def fake_build(directory):
            stale = directory / "lock"
            if stale.exists():
                stale.unlink()
            with open(directory / "builds.log", "a") as log:
                log.write(f"{{os.getpid()}}\\n")
            time.sleep(1.5)
            shutil.copy({str(real)!r}, _build.library_path(directory))
        _build._build = fake_build
        import oracle.kernels.cpu as c
        print(c.available(), _build.status()["built"])
    """
    env = {_build.BUILD_DIR_ENV: str(directory)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env={**os.environ, **env},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert sorted(o[0].split()[1] for o in outs) == ["False", "True"]
    assert all(o[0].split()[0] == "None" for o in outs)
    assert len((directory / "builds.log").read_text().split()) == 1
    assert (directory / _build.READY).is_file()


@pytest.mark.skipif(not os.environ.get("KV_ORACLE_BUILD_TESTS"),
                    reason="compiles the kernels from scratch (about a minute); set KV_ORACLE_BUILD_TESTS=1")
def test_concurrent_processes_compile_once_for_real(tmp_path):
    directory = tmp_path / "build"
    code = """
        import oracle.kernels.cpu as c
        from oracle.kernels.cpu import _build
        assert c.available() is None, c.available()
        print(_build.status()["built"], c.isa())
    """
    env = {**os.environ, _build.BUILD_DIR_ENV: str(directory)}
    procs = [subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=REPO) for _ in range(2)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert sorted(o[0].split()[0] for o in outs) == ["False", "True"]
    assert len(list(directory.glob("*.so"))) == 1
    shutil.rmtree(directory)


# ---- oracle bench --------------------------------------------------------------------------------

def test_bench_counts_bytes_read_and_written():
    from oracle.bench import make_workload

    w = make_workload("store_cache", "bf16", 4)
    row = 8 * 128 * 2
    assert (w.bytes_read, w.bytes_written) == (2 * 4 * row + 4 * 8, 2 * 4 * row)
    w = make_workload("reshape_and_cache_flash", "e4m3fn", 4)
    assert (w.bytes_read, w.bytes_written) == (2 * 4 * 1024 * 2 + 4 * 8 + 8, 2 * 4 * 1024)
    w = make_workload("concat_and_cache_mla", "e4m3fn", 4)
    assert (w.bytes_read, w.bytes_written) == (4 * 576 * 2 + 4 * 8 + 4, 4 * 576)
    slots = w.args[3]
    assert slots.min() >= 1 and len(set(slots.tolist())) == 4  # distinct, slot 0 left free


def test_bench_script_times_kernels_against_the_baseline(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ, ORACLE_PLUGINS="")
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "bench_kernels.py"), "--op",
                          "store_cache,quantize_fp8", "--sizes", "1,64", "--repeats", "3", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "store_cache [bf16]" in run.stdout and "x baseline" in run.stdout
    result = __import__("json").loads(out.read_text())
    rows = {(r["kernel"], r["n"]): r for r in result["rows"]}
    assert {("torch.store_cache", 1), ("cpu.store_cache", 64), ("cpu.quantize_fp8", 64)} <= set(rows)
    assert all(r["check"] in ("ok", "baseline") for r in result["rows"])
    assert rows[("torch.store_cache", 64)]["x_baseline"] == 1.0
    assert result["copy"]["cpu"]["gbps"] > 0 and result["machine"]["torch"] == torch.__version__
    assert all(len(r["samples_us"]) == 3 for r in result["rows"])
    # the same-size copy_ is timed in each cell: its ratio is positive and says the same time
    # over the kernel's median wherever it is defined
    assert all(r["pct_same_copy"] > 0 for r in result["rows"])
    assert "% of same-size copy" in run.stdout


def test_same_size_copy_timer_moves_the_given_bytes():
    from oracle.bench import same_size_copy_timer

    timer = same_size_copy_timer(2 * 1000 + 1, "cpu")  # read + written: 1000 bytes copied
    dst, src = timer.args
    assert dst.numel() == src.numel() == 1000
    dst.fill_(255)  # src holds 0..254: a copy that did not happen cannot pass
    timer.sample()
    assert torch.equal(dst, src)


def test_bench_rejects_bad_options():
    from oracle.bench import cli

    assert cli(["--op", "nope"]) == 2
    assert cli(["--op", "store_cache:e4m3fn"]) == 2
    assert cli(["--sizes", "0"]) == 2
