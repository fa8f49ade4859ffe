"""The C++ block-scaled kernels (cpu.quantize_block, cpu.reshape_and_cache_block) against the numpy
reference (oracle.reference.block_scaled), byte for byte, on every ISA path (AVX-512, AVX2, scalar).

Every output lives in a poisoned allocation (random bytes 1..255, never zero) with guard bands on
both sides; the whole allocation is compared with the poison plus what the reference writes, so
a stray write anywhere (guard bands, gaps between blocks, swizzled padding bytes, padding slots)
fails. Bad input must raise an error naming the argument and leave every byte as it was.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
import torch

from oracle.kernels import cpu
from oracle.reference import block_scaled as ref
from oracle.registry import Registry

REASON = cpu.available()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"CPU kernels unavailable: {REASON}")

FORMATS = ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DIMS = (128, 40, 72, 64)  # 40, 72: a partial last block in both formats
GUARD = 64
BLOCK_SIZE = 16
GLOBAL_SCALES = (1.0, 0.37, 2688.0 / 3.1, 1e-3, 3.3e4, 1e-30, 1e30, 1e-40)  # 1e-40: a subnormal


@pytest.fixture(params=["avx512", "avx2", "scalar"])
def isa(request):
    best = cpu.detected_isa()
    if cpu.ISAS.index(request.param) > cpu.ISAS.index(best):
        pytest.skip(f"this CPU has no {request.param} (it supports up to {best})")
    with cpu.forced_isa(request.param):
        yield request.param


def to_numpy(t: torch.Tensor) -> np.ndarray:
    t = t.contiguous()
    return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) if t.dtype == torch.bfloat16 else t.numpy()


def values(rng: np.random.Generator, shape: tuple, specials: bool = True) -> np.ndarray:
    """float32 normals, each run of 16 scaled by its own power of two (2^-24..2^24), with NaN of both
    signs, +-inf, +-0, huge and tiny values sprinkled in, an all-zero head row and a row of
    float32 subnormals."""
    x = rng.standard_normal(shape).astype(np.float32)
    runs = -(-shape[-1] // 16)
    x *= np.repeat(np.exp2(rng.integers(-24, 25, shape[:-1] + (runs,))).astype(np.float32), 16, -1)[..., :shape[-1]]
    if specials:
        pool = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38, -3e38, 1e-40, -1.4e-45, 6e-8, 65504.0,
                         1e-30, 448.0, 57344.0, 6.0], np.float32)
        flat = x.reshape(-1)
        at = rng.choice(flat.size, size=max(1, flat.size // 100), replace=False)
        flat[at] = rng.choice(pool, size=at.size)
        x[0, 0] = 0.0
        x[-1, -1] = (rng.integers(0, 1 << 32, shape[-1], dtype=np.uint32) & np.uint32(0x807FFFFF)).view(np.float32)
    return x


class Poisoned:
    """A uint8 view (shape, strides) into a poisoned allocation with guard bands around it."""

    def __init__(self, rng, shape, strides, span):
        self.storage = torch.from_numpy(rng.integers(1, 256, span + 2 * GUARD, dtype=np.uint8))
        self.before = self.storage.clone()
        self.shape, self.strides = tuple(shape), tuple(strides)
        self.view = self.storage.as_strided(self.shape, self.strides, GUARD)

    def expect(self, logical: np.ndarray) -> torch.Tensor:
        want = self.before.clone()
        want.as_strided(self.shape, self.strides, GUARD).copy_(torch.from_numpy(np.ascontiguousarray(logical)))
        return want

    def check(self, logical: np.ndarray, what: str) -> None:
        want = self.expect(logical)
        bad = (self.storage != want).nonzero().flatten()
        assert bad.numel() == 0, (f"{what}: {bad.numel()} bytes differ; first at byte {int(bad[0]) - GUARD} of the view "
                                  f"(got 0x{int(self.storage[bad[0]]):02X}, want 0x{int(want[bad[0]]):02X})")

    def unchanged(self) -> bool:
        return torch.equal(self.storage, self.before)


def dense(shape, rng, extra=0) -> Poisoned:
    """A contiguous-order [A, B, C] or [A, B, C, D] view whose outer stride has `extra` spare bytes."""
    strides = list(torch.empty(shape).stride())
    strides[0] += extra
    return Poisoned(rng, shape, strides, shape[0] * strides[0])


def paged(shape, layout, rng, extra=8) -> Poisoned:
    """[num_blocks, block_size, H, W], NHD or an HND-permuted view; `extra` spare bytes per block."""
    nb, bs, h, w = shape
    strides = (bs * h * w + extra, h * w, w, 1) if layout == "NHD" else (bs * h * w + extra, w, bs * w, 1)
    return Poisoned(rng, shape, strides, nb * strides[0])


def swizzled(num_blocks, rows, cols, rng, pad=16) -> Poisoned:
    page = ref.swizzled_page_bytes(rows, cols)
    return Poisoned(rng, (num_blocks, page), (page + pad, 1), num_blocks * (page + pad))


def gs_tensor(value: float) -> torch.Tensor:
    return torch.tensor([value], dtype=torch.float32)


# ---- quantize_block ----------------------------------------------------------------------------

@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_block_matches_reference(isa, fmt, dtype, dim):
    """Dense and strided sources (also a non-unit last stride), several global scales."""
    rng = np.random.default_rng(dim)
    n, heads = 21, 3
    x = torch.from_numpy(values(rng, (n, heads, dim))).to(dtype)
    wide = torch.zeros(n, heads + 1, 2 * dim, dtype=dtype)  # a source with gaps between rows and elements
    wide[:, 1:, ::2] = x
    for src, gs in zip((x, wide[:, 1:, ::2], wide[:, 1:, ::2].contiguous()), GLOBAL_SCALES[::2]):
        codes = dense((n, heads, ref.code_width(fmt, dim)), rng, extra=5)
        scales = dense((n, heads, ref.scale_count(fmt, dim)), rng, extra=3)
        want_codes, want_scales = ref.quantize_block(to_numpy(src), fmt, np.float32(gs))
        cpu.quantize_block(codes.view, scales.view, src, fmt, gs_tensor(gs))
        codes.check(want_codes, f"codes (gs={gs}, strides {src.stride()})")
        scales.check(want_scales, f"scales (gs={gs}, strides {src.stride()})")


@pytest.mark.parametrize("gs", GLOBAL_SCALES)
def test_nvfp4_global_scales_and_ties(isa, gs):
    """Every e2m1 tie and its float32 neighbours, divided by gs: a block amax of 6 / gs makes sf
    (about) 1, so q lands on or next to the ties (exactly at gs = 1)."""
    ties = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, 7.0, 0.5, 3.0], np.float32)
    near = np.concatenate([ties, np.nextafter(ties, np.float32(0)), np.nextafter(ties, np.float32(np.inf))])
    near = np.concatenate([near, -near])
    rows = np.pad(near, (0, -near.size % 15)).reshape(-1, 15)
    x = np.concatenate([np.full((rows.shape[0], 1), 6.0, np.float32), rows], axis=1).astype(np.float64) / gs
    with np.errstate(over="ignore"):  # 1 / 1e-40 overflows float32: blocks of infinities
        x = torch.from_numpy(np.ascontiguousarray(x.astype(np.float32).reshape(-1, 1, 16)))
    rng = np.random.default_rng(1)
    codes, scales = dense((x.shape[0], 1, 8), rng), dense((x.shape[0], 1, 1), rng)
    want_codes, want_scales = ref.quantize_block(x.numpy(), "nvfp4", np.float32(gs))
    cpu.quantize_block(codes.view, scales.view, x, "nvfp4", gs_tensor(gs))
    codes.check(want_codes, "codes")
    scales.check(want_scales, "scales")


@pytest.mark.parametrize("fmt", FORMATS[:2])
def test_mx_element_ties_at_unit_scale(isa, fmt):
    """Blocks whose amax puts E at 0 (2^emax..2^(emax+1)), holding every fp8 tie and code."""
    from oracle.reference.fp8 import code_values

    element = fmt.split("_")[1]
    finite = np.unique(np.abs(code_values(element)[np.isfinite(code_values(element))])).astype(np.float64)
    near = np.concatenate([finite, (finite[:-1] + finite[1:]) / 2]).astype(np.float32)
    near = np.concatenate([near, np.nextafter(near, np.float32(0)), -near])
    anchor = np.float32(2.0 ** (8 if element == "e4m3fn" else 15))
    rows = np.pad(near, (0, -near.size % 31), constant_values=1.0).reshape(-1, 31)
    x = np.concatenate([np.full((rows.shape[0], 1), anchor, np.float32), rows], axis=1).reshape(-1, 1, 32)
    rng = np.random.default_rng(2)
    codes, scales = dense(x.shape, rng), dense((x.shape[0], 1, 1), rng)
    want_codes, want_scales = ref.quantize_block(x, fmt)
    cpu.quantize_block(codes.view, scales.view, torch.from_numpy(x), fmt, None)
    codes.check(want_codes, "codes")
    scales.check(want_scales, "scales")


# ---- reshape_and_cache_block -------------------------------------------------------------------

INDEX_KINDS = ("int32", "int64", "int32-strided", "int64-strided")


def slot_tensor(slots: np.ndarray, kind: str) -> torch.Tensor:
    dtype = torch.int32 if kind.startswith("int32") else torch.int64
    if not kind.endswith("strided"):
        return torch.from_numpy(slots).to(dtype)
    full = torch.full((2 * len(slots) + 1,), 7, dtype=dtype)  # 7: a valid slot, never to be read
    full[1::2] = torch.from_numpy(slots).to(dtype)
    return full[1::2]


def paged_case(rng, fmt, dtype, dim, layout, scale_layout, index_kind, gs=(0.37, 2688.0)):
    heads = 9 if dim in (64, 128) else 3  # 9 x 16 = 144 swizzle rows: two row tiles
    n, num_blocks = 37, 6
    qkv = torch.from_numpy(values(rng, (n + 3, 3 * heads, dim))).to(dtype)  # fused, more tokens than slots
    key, value = qkv[:, heads:2 * heads], qkv[:, 2 * heads:]
    slots = rng.permutation(num_blocks * BLOCK_SIZE)[:n].astype(np.int64)
    pad_at = rng.choice(n, size=6, replace=False)
    small = -(1 << 31) if index_kind.startswith("int32") else -(1 << 40)
    slots[pad_at] = np.array([-1, -1, -2, -17, -1000, small])
    code_shape = (num_blocks, BLOCK_SIZE, heads, ref.code_width(fmt, dim))
    count = ref.scale_count(fmt, dim)
    caches = [paged(code_shape, layout, rng) for _ in range(2)]
    if scale_layout == "linear":
        caches += [paged((num_blocks, BLOCK_SIZE, heads, count), layout, rng, extra=3) for _ in range(2)]
    else:
        caches += [swizzled(num_blocks, BLOCK_SIZE * heads, count, rng) for _ in range(2)]
    return key, value, caches, slot_tensor(slots, index_kind), gs


def run_paged(key, value, caches, slot_mapping, fmt, gs, scale_layout):
    with np.errstate(all="ignore"):
        want = ref.reshape_and_cache_block(*(c.view.numpy() for c in caches), slot_mapping.numpy(), to_numpy(key),
                                           to_numpy(value), fmt=fmt, k_global_scale=np.float32(gs[0]),
                                           v_global_scale=np.float32(gs[1]), scale_layout=scale_layout)
    cpu.reshape_and_cache_block(key, value, *(c.view for c in caches), slot_mapping, fmt, gs_tensor(gs[0]),
                                gs_tensor(gs[1]))
    for c, w, name in zip(caches, want, ("key_cache", "value_cache", "key_scale_cache", "value_scale_cache")):
        c.check(w, name)


@pytest.mark.parametrize("scale_layout", ("linear", "swizzled"))
@pytest.mark.parametrize("layout", ("NHD", "HND"))
@pytest.mark.parametrize("dim", DIMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_matches_reference(isa, fmt, dtype, dim, layout, scale_layout):
    """Fused-qkv sources, padding slots of several negative values, every index kind and global
    scale in turn."""
    case = (FORMATS.index(fmt), DTYPES.index(dtype), DIMS.index(dim), layout == "HND", scale_layout == "swizzled")
    kind = INDEX_KINDS[sum(case) % 4]
    gs = (GLOBAL_SCALES[sum(case) % 8], GLOBAL_SCALES[(sum(case) + 3) % 8])
    rng = np.random.default_rng(list(case))
    key, value, caches, slot_mapping, gs = paged_case(rng, fmt, dtype, dim, layout, scale_layout, kind, gs)
    run_paged(key, value, caches, slot_mapping, fmt, gs, scale_layout)


@pytest.mark.parametrize("kind", INDEX_KINDS)
@pytest.mark.parametrize("fmt", FORMATS)
def test_paged_index_kinds(isa, fmt, kind):
    rng = np.random.default_rng(len(kind))
    key, value, caches, slot_mapping, gs = paged_case(rng, fmt, torch.bfloat16, 72, "HND", "swizzled", kind)
    run_paged(key, value, caches, slot_mapping, fmt, gs, "swizzled")


def test_only_padding_and_empty_mapping_write_nothing(isa):
    rng = np.random.default_rng(3)
    key, value, caches, _, gs = paged_case(rng, "nvfp4", torch.float16, 40, "NHD", "swizzled", "int64")
    for slots in (torch.full((5,), -1), torch.tensor([-3, -1], dtype=torch.int32), torch.empty(0, dtype=torch.int64)):
        cpu.reshape_and_cache_block(key, value, *(c.view for c in caches), slots, "nvfp4", gs_tensor(1.0),
                                    gs_tensor(1.0))
        assert all(c.unchanged() for c in caches)


def test_offsets_past_two_to_the_31_bytes():
    """Code and scale caches interleaved in one allocation of 2^31 + 16 KiB (never touched but
    where written): the last blocks lie past 2^31 bytes from the caches' first byte."""
    block_bytes, heads, dim = 8192, 2, 64
    num_blocks = (1 << 31) // block_bytes + 2
    storage = torch.empty(num_blocks * block_bytes, dtype=torch.uint8)
    codes = [storage.as_strided((num_blocks, BLOCK_SIZE, heads, dim), (block_bytes, heads * dim, dim, 1), o)
             for o in (0, 2048)]
    scales = [storage.as_strided((num_blocks, BLOCK_SIZE, heads, 2), (block_bytes, heads * 2, 2, 1), o)
              for o in (4096, 4160)]
    key = torch.randn(3, heads, dim) * 100
    value = -key
    slots = torch.tensor([num_blocks * BLOCK_SIZE - 1, (num_blocks - 1) * BLOCK_SIZE, 5])
    cpu.reshape_and_cache_block(key, value, *codes, *scales, slots, "mxfp8_e4m3fn", None, None)
    for src, c, s in ((key, codes[0], scales[0]), (value, codes[1], scales[1])):
        want_codes, want_scales = ref.quantize_block(src.numpy(), "mxfp8_e4m3fn")
        for i, slot in enumerate(slots.tolist()):
            block, off = divmod(slot, BLOCK_SIZE)
            assert np.array_equal(c[block, off].numpy(), want_codes[i])
            assert np.array_equal(s[block, off].numpy(), want_scales[i])


# ---- bad input: an error naming the argument, and not one byte changed ------------------------

def _bad_cases():
    def swap(i, new):
        return lambda a: a.__setitem__(i, new(a[i]))

    f64 = swap(0, lambda t: t.double())
    yield "key-float64", "nvfp4", f64, TypeError, r"key has dtype torch.float64; expected float32"
    yield "value-dtype", "nvfp4", swap(1, lambda t: t.half()), TypeError, \
        r"value has dtype torch.float16 but key has dtype torch.float32"
    yield "cache-dtype", "mxfp8_e5m2", swap(2, lambda t: t.view(torch.int8)), TypeError, \
        r"key_cache has dtype torch.int8; expected torch.uint8"
    yield "scale-cache-dtype", "nvfp4", swap(5, lambda t: t.view(torch.int8)), TypeError, r"value_scale_cache has dtype"
    yield "index-dtype", "nvfp4", swap(6, lambda t: t.to(torch.int16)), TypeError, \
        r"slot_mapping has dtype torch.int16; expected torch.int32 or torch.int64"
    yield "code-shape", "mxfp8_e4m3fn", swap(3, lambda t: t[..., :-1]), ValueError, r"value_cache has shape \(4, 16, 2, 39\)"
    yield "scale-shape", "mxfp8_e4m3fn", swap(4, lambda t: t[..., :-1]), ValueError, \
        r"key_scale_cache has shape \(4, 16, 2, 1\); a linear scale cache is \[num_blocks, block_size, H, nb\] = \(4, 16, 2, 2\)"
    yield "scale-rank", "nvfp4", swap(4, lambda t: t[:, 0]), ValueError, r"key_scale_cache must be 4-D .* or 2-D"
    yield "value-head-size", "nvfp4", swap(1, lambda t: t[..., :-2]), ValueError, \
        r"value has shape \(6, 2, 38\); expected \[T, 2, 40\]"
    yield "too-few-tokens", "nvfp4", swap(0, lambda t: t[:3]), ValueError, r"key has shape \(3, 2, 40\); expected \[>= 5"
    yield "slot-range", "nvfp4", swap(6, lambda t: torch.tensor([0, -1, 64, 3, 70])), ValueError, \
        r"slot_mapping\[2\] = 64 is out of range \[0, 64\) under padding='negative' .* \(1 more position is out of range\)"
    yield "fmt", "mxfp4", None, ValueError, r"fmt='mxfp4' is not one of 'mxfp8_e4m3fn', 'mxfp8_e5m2', 'nvfp4'"
    for value, text in ((0.0, "0"), (-1.0, "-1"), (float("inf"), "inf"), (float("nan"), "nan")):
        yield f"gs-{text}", "nvfp4", swap(8, lambda t, v=value: gs_tensor(v)), ValueError, \
            rf"k_global_scale must be finite and > 0, got {text}"
    yield "gs-none", "nvfp4", swap(9, lambda t: None), TypeError, r"v_global_scale must be a float32 tensor, got None"
    yield "gs-float64", "nvfp4", swap(9, lambda t: t.double()), TypeError, r"v_global_scale must be a float32 tensor"
    yield "gs-shape", "nvfp4", swap(8, lambda t: torch.ones(2)), ValueError, r"k_global_scale has shape \(2,\); expected \[1\]"


@pytest.mark.parametrize("scale_layout", ("linear", "swizzled"))
@pytest.mark.parametrize("name,fmt,edit,exc,message", [pytest.param(*c, id=c[0]) for c in _bad_cases()])
def test_paged_bad_input_names_the_argument_and_writes_nothing(name, fmt, edit, exc, message, scale_layout):
    if scale_layout == "swizzled" and name in ("scale-shape", "scale-rank"):
        pytest.skip("linear scale cache shapes")
    rng = np.random.default_rng(4)
    real = "nvfp4" if fmt == "mxfp4" else fmt
    qkv = torch.randn(6, 6, 40)
    code = (4, BLOCK_SIZE, 2, ref.code_width(real, 40))
    count = ref.scale_count(real, 40)
    caches = [paged(code, "NHD", rng) for _ in range(2)]
    caches += ([paged((4, BLOCK_SIZE, 2, count), "NHD", rng) for _ in range(2)] if scale_layout == "linear"
               else [swizzled(4, BLOCK_SIZE * 2, count, rng) for _ in range(2)])
    args = [qkv[:, 2:4], qkv[:, 4:], *(c.view for c in caches), torch.tensor([0, -1, 63, 3, 17]), fmt,
            gs_tensor(0.5), gs_tensor(2.0)]
    if edit is not None:
        edit(args)
    with pytest.raises(exc, match=message):
        cpu.ops().reshape_and_cache_block(*args)
    assert all(c.unchanged() for c in caches)


def test_swizzled_page_too_small_and_odd_head_size():
    rng = np.random.default_rng(5)
    caches = [paged((4, BLOCK_SIZE, 2, 20), "NHD", rng) for _ in range(2)]
    page = ref.swizzled_page_bytes(32, 3)
    small = [Poisoned(rng, (4, page - 1), (page, 1), 4 * page) for _ in range(2)]
    key = torch.randn(5, 2, 40)
    with pytest.raises(ValueError, match=rf"key_scale_cache has shape \(4, {page - 1}\); a swizzled scale cache is "
                                         rf"\[num_blocks = 4, page_bytes >= {page}\]"):
        cpu.reshape_and_cache_block(key, key, *(c.view for c in caches + small), torch.arange(5), "nvfp4",
                                    gs_tensor(1.0), gs_tensor(1.0))
    odd = [paged((4, BLOCK_SIZE, 2, 20), "NHD", rng) for _ in range(2)]
    lin = [paged((4, BLOCK_SIZE, 2, 3), "NHD", rng) for _ in range(2)]
    with pytest.raises(ValueError, match=r"key has D = 41; nvfp4 packs two elements per byte, so D must be even"):
        cpu.reshape_and_cache_block(torch.randn(5, 2, 41), torch.randn(5, 2, 41), *(c.view for c in odd + lin),
                                    torch.arange(5), "nvfp4", gs_tensor(1.0), gs_tensor(1.0))
    assert all(c.unchanged() for c in caches + small + odd + lin)


@pytest.mark.parametrize("edit,exc,message", [
    (lambda a: a.__setitem__(2, a[2].double()), TypeError, r"x has dtype torch.float64"),
    (lambda a: a.__setitem__(0, a[0].view(torch.int8)), TypeError, r"codes has dtype torch.int8; expected torch.uint8"),
    (lambda a: a.__setitem__(1, a[1][..., :-1]), ValueError, r"scales has shape \(3, 2, 2\); expected \(3, 2, 3\)"),
    (lambda a: a.__setitem__(3, "e4m3fn"), ValueError, r"fmt='e4m3fn' is not one of"),
    (lambda a: a.__setitem__(4, gs_tensor(-2.0)), ValueError, r"global_scale must be finite and > 0, got -2"),
    (lambda a: a.__setitem__(2, torch.randn(3, 2, 39)), ValueError, r"x has D = 39; nvfp4 packs"),
], ids=["x-dtype", "codes-dtype", "scales-shape", "fmt", "gs", "odd-D"])
def test_quantize_block_bad_input(edit, exc, message):
    rng = np.random.default_rng(6)
    codes, scales = dense((3, 2, 20), rng), dense((3, 2, 3), rng)
    args = [codes.view, scales.view, torch.randn(3, 2, 40), "nvfp4", gs_tensor(1.0)]
    edit(args)
    with pytest.raises(exc, match=message):
        cpu.ops().quantize_block(*args)
    assert codes.unchanged() and scales.unchanged()


# ---- registration: opcheck, contracts ----------------------------------------------------------

def _opcheck_cases():
    x = torch.randn(4, 2, 40).bfloat16()
    yield "quantize_block-nvfp4", "quantize_block", (torch.zeros(4, 2, 20, dtype=torch.uint8),
                                                     torch.zeros(4, 2, 3, dtype=torch.uint8), x, "nvfp4",
                                                     torch.tensor([0.5]))
    yield "quantize_block-mx", "quantize_block", (torch.zeros(4, 2, 40, dtype=torch.uint8),
                                                  torch.zeros(4, 2, 2, dtype=torch.uint8), x.float(), "mxfp8_e5m2", None)
    page = ref.swizzled_page_bytes(8, 3)
    hnd = torch.zeros(3, 2, 4, 20, dtype=torch.uint8).permute(0, 2, 1, 3)
    yield "reshape_and_cache_block-nvfp4-HND-swizzled", "reshape_and_cache_block", (
        x, x, hnd, hnd.clone(), torch.zeros(3, page, dtype=torch.uint8), torch.zeros(3, page, dtype=torch.uint8),
        torch.tensor([1, -1, 11, 4], dtype=torch.int32), "nvfp4", torch.tensor([0.5]), torch.tensor([3.0]))


@pytest.mark.parametrize("op,args", [pytest.param(op, args, id=name) for name, op, args in _opcheck_cases()])
def test_opcheck(op, args):
    result = torch.library.opcheck(getattr(cpu.ops(), op).default, args)
    assert set(result.values()) == {"SUCCESS"}, result


def test_registered_contracts():
    registry = Registry()
    registry.load_plugin("cpu", cpu.register)
    assert not registry.errors, registry.errors
    for name in ("cpu.quantize_block", "cpu.reshape_and_cache_block"):
        c = registry.kernels[name].contract
        assert (c.device, c.validates, c.block_formats, c.scale_layouts) == (
            "cpu", True, FORMATS, ("linear", "swizzled"))
        assert c.dtypes == ("float32", "float16", "bfloat16") and c.notes
    assert registry.kernels["cpu.reshape_and_cache_block"].contract.padding == "negative"
    assert registry.kernels["cpu.reshape_and_cache_block"].contract.layouts == ("NHD", "HND")
