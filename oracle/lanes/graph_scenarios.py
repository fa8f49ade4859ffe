"""The scenarios of the CUDA-graph replay lane (:mod:`oracle.lanes.graphs`): static buffers for one
op call each, and the backends whose ops they call.

A scenario builder (``store_cache_setup``, ``flash_setup``, ...) allocates every buffer once, on the
device, in poisoned allocations with guard bands (:class:`Region`), and returns a :class:`Setup`:
the call that gets captured, how to copy new inputs into the captured buffers, and what the
reference (``oracle.reference``) says the written views must hold. :data:`SCENARIOS` lists them by
name (each op, copy and fp8 paths, NHD and HND caches, fused sources, strided indices, -1 padding,
per-head scales, int32 and int64 indices). Each builder takes ``backend`` (a :class:`Backend`,
default the Triton kernels): whose ops the call runs, and the fp8 preset the reference converts
with.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import torch

from .. import reference
from ..buffers import NUMPY_DTYPES, TORCH_DTYPES, to_torch
from ..ops import _build, _fp8cases

GUARD = 4096  # bytes of poison on each side of every allocation


@dataclass(frozen=True)
class Backend:
    """A backend whose ops the lane calls: ``module`` holds them as functions of the torch
    baseline's positional signature (imported when first asked for), ``preset`` is the fp8 preset
    its contract declares, ``variants`` the keywords each ``--variant`` calls the ops with (as the
    backend's ``<op>`` and ``<op>.unchecked`` registrations do, or ``plain``: validated, launched
    without programmatic dependent launch, ``pdl=False``), ``interpreter``
    whether it can run on Triton's CPU interpreter (``--cpu-dry-run``), ``available`` the
    module's function that says why its kernels cannot run here (None: no check past the GPU's)."""

    name: str
    module: str
    preset: str
    variants: dict
    interpreter: bool = False
    available: str | None = None

    def ops(self):
        return importlib.import_module(self.module)


TRITON = Backend("triton", "oracle.kernels.triton.ops", "triton_sm90",
                 {"default": {}, "unchecked": {"validate": False}, "plain": {"pdl": False}}, interpreter=True)
CUDA = Backend("cuda", "oracle.kernels.cuda", "cuda_satfinite",
               {"default": {}, "unchecked": {"validate": False}, "plain": {"pdl": False}}, available="available")
BACKENDS = {b.name: b for b in (TRITON, CUDA)}


class Region:
    """A poisoned byte allocation with guard bands; views are carved out of its payload."""

    def __init__(self, name: str, nbytes: int, device, rng: np.random.Generator):
        self.name = name
        self.nbytes = nbytes
        poison = rng.integers(1, 256, nbytes + 2 * GUARD, dtype=np.uint8)
        self.base = torch.from_numpy(poison).to(device)
        self.guards = (poison[:GUARD].copy(), poison[GUARD + nbytes:].copy())

    def view(self, shape, strides, dtype: str, offset: int = 0) -> torch.Tensor:
        itemsize = NUMPY_DTYPES[dtype].itemsize
        payload = self.base[GUARD: GUARD + self.nbytes - self.nbytes % itemsize]
        typed = payload.view(TORCH_DTYPES[dtype])
        return typed.as_strided(tuple(shape), tuple(strides), typed.storage_offset() + offset)

    def guard_problem(self) -> str | None:
        host = self.base.cpu().numpy()
        for side, want, got in (("before", self.guards[0], host[:GUARD]),
                                ("after", self.guards[1], host[GUARD + self.nbytes:])):
            differ = np.flatnonzero(want != got)
            if differ.size:
                return f"guard band {side} {self.name} written ({differ.size} bytes, first at {int(differ[0])})"
        return None


def contiguous(shape) -> tuple:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(int(n), 1)
    return tuple(reversed(strides))


@dataclass
class Setup:
    """One scenario's static buffers: ``call`` is what gets captured; ``refresh(rng)`` copies new
    values into the input buffers; ``expected(snapshot)`` gives the reference's contents of the
    ``written`` views (and ``"returned"``) from a host snapshot of ``views``."""

    call: Callable[[], object]
    refresh: Callable[[np.random.Generator], None]
    expected: Callable[[dict], dict]
    views: dict
    written: tuple
    regions: list = field(default_factory=list)
    returns: bool = False


def _put(tensor: torch.Tensor, values: np.ndarray) -> None:
    """Copy host values into a (possibly strided) device buffer, in place."""
    tensor.copy_(to_torch(np.ascontiguousarray(values)).to(tensor.device))


def _slots(rng, n, num_slots, padding: bool) -> np.ndarray:
    out = rng.permutation(np.arange(1, num_slots))[:n].astype(np.int64)
    if padding:
        out[rng.choice(n, size=max(1, n // 8), replace=False)] = -1
    return out


def _alloc(regions, name, shape, dtype, device, rng, strides=None, lead=0) -> torch.Tensor:
    itemsize = NUMPY_DTYPES[dtype].itemsize
    strides = strides or contiguous(shape)
    extent = lead + 1 + sum((int(n) - 1) * s for n, s in zip(shape, strides))
    region = Region(name, extent * itemsize, device, rng)
    regions.append(region)
    return region.view(shape, strides, dtype, lead)


# --- scenarios ------------------------------------------------------------------------------

def store_cache_setup(device, rng, *, dtype="bfloat16", heads=8, dim=128, n=48, index="int64",
                      index_layout="contig", call_kw=None, backend=None) -> Setup:
    ops = (backend or TRITON).ops()
    regions = []
    slots = 256
    row = heads * dim
    qkv = _alloc(regions, "qkv", (n, 3 * row), dtype, device, rng)  # fused: k, v are strided slices
    k = qkv[:, row:2 * row].view(n, heads, dim)
    v = qkv[:, 2 * row:].view(n, heads, dim)
    k_cache = _alloc(regions, "k_cache", (slots, heads, dim), dtype, device, rng)
    v_cache = _alloc(regions, "v_cache", (slots, heads, dim), dtype, device, rng)
    if index_layout == "strided":
        loc = _alloc(regions, "loc", (n,), index, device, rng, strides=(2,))
    else:
        loc = _alloc(regions, "loc", (n,), index, device, rng)

    def refresh(rng):
        _put(qkv, _build.values(rng, (n, 3 * row), dtype))
        _put(loc, _slots(rng, n, slots, False).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {name: reference.store_cache(s[name], s["loc"], s[src], padding="none")
                for name, src in (("k_cache", "k"), ("v_cache", "v"))}

    return Setup(lambda: ops.store_cache(k, v, k_cache, v_cache, loc, **(call_kw or {})), refresh, expected,
                 {"k": k, "v": v, "k_cache": k_cache, "v_cache": v_cache, "loc": loc},
                 ("k_cache", "v_cache"), regions)


def set_mla_setup(device, rng, *, dtype="bfloat16", nope=512, rope=64, width=None, n=40,
                  index="int32", call_kw=None, backend=None) -> Setup:
    ops = (backend or TRITON).ops()
    regions = []
    slots = 200
    width = width or nope + rope
    latent = _alloc(regions, "latent", (n, 64 + nope + rope), dtype, device, rng)
    nope_t, rope_t = latent[:, 64:64 + nope], latent[:, 64 + nope:]
    buf = _alloc(regions, "kv_buffer", (slots, width), dtype, device, rng)
    loc = _alloc(regions, "loc", (n,), index, device, rng)

    def refresh(rng):
        _put(latent, _build.values(rng, (n, 64 + nope + rope), dtype))
        _put(loc, _slots(rng, n, slots, False).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {"kv_buffer": reference.set_mla_kv_buffer(s["kv_buffer"], s["loc"], s["nope"], s["rope"],
                                                         padding="none")}

    return Setup(lambda: ops.set_mla_kv_buffer(buf, loc, nope_t, rope_t, **(call_kw or {})), refresh, expected,
                 {"kv_buffer": buf, "loc": loc, "nope": nope_t, "rope": rope_t}, ("kv_buffer",),
                 regions)


def _fp8_sources(rng, values, fmt, shape, dtype, scale, head_axis=-2):
    if fmt is None:
        return _build.values(rng, shape, dtype)
    return _fp8cases.values(rng, values, fmt, shape, dtype, scale, head_axis)


def concat_mla_setup(device, rng, *, fmt=None, dtype="bfloat16", rank=512, rope=64, block_size=16,
                     n=40, values="special", index="int64", call_kw=None, backend=None) -> Setup:
    backend = backend or TRITON
    ops = backend.ops()
    regions = []
    num_blocks = 12
    kv_c = _alloc(regions, "kv_c", (n, rank), dtype if not fmt else "float32", device, rng,
                  strides=(rank + rope + 32, 1))  # a row stride past the row
    k_pe = _alloc(regions, "k_pe", (n, rope), dtype if not fmt else "float32", device, rng)
    cache = _alloc(regions, "kv_cache", (num_blocks, block_size, rank + rope),
                   "uint8" if fmt else dtype, device, rng)
    slots = _alloc(regions, "slot_mapping", (n,), index, device, rng)
    scale = _alloc(regions, "scale", (1,), "float32", device, rng)
    src_dtype = "float32" if fmt else dtype

    def refresh(rng):
        s = np.array([0.0123 * (1 + rng.integers(0, 5))], np.float32) if fmt else np.ones(1, np.float32)
        _put(scale, s)
        _put(kv_c, _fp8_sources(rng, values, fmt, (n, rank), src_dtype, s))
        _put(k_pe, _fp8_sources(rng, values, fmt, (n, rope), src_dtype, s))
        _put(slots, _slots(rng, n, num_blocks * block_size, True).astype(NUMPY_DTYPES[index]))

    def expected(s):
        fp8 = {"kv_cache_dtype": fmt, "scale": s["scale"], "preset": backend.preset} if fmt else {}
        with np.errstate(all="ignore"):
            return {"kv_cache": reference.concat_and_cache_mla(s["kv_cache"], s["slot_mapping"], s["kv_c"],
                                                               s["k_pe"], padding="negative", **fp8)}

    return Setup(lambda: ops.concat_and_cache_mla(kv_c, k_pe, cache, slots, fmt or "auto", scale,
                                                   **(call_kw or {})),
                 refresh, expected,
                 {"kv_c": kv_c, "k_pe": k_pe, "kv_cache": cache, "slot_mapping": slots, "scale": scale},
                 ("kv_cache",), regions)


def flash_setup(device, rng, *, fmt=None, dtype="bfloat16", layout="NHD", scale_kind="tensor",
                heads=8, dim=128, n=48, values="special", index="int64", call_kw=None, backend=None) -> Setup:
    backend = backend or TRITON
    ops = backend.ops()
    regions = []
    num_blocks, block_size = 10, 16
    src_dtype = "float32" if fmt and values != "random" else dtype
    row = heads * dim
    qkv = _alloc(regions, "qkv", (n + 8, 3 * row), src_dtype, device, rng)  # T > num_tokens
    key = qkv[:, row:2 * row].view(n + 8, heads, dim)
    value = qkv[:, 2 * row:].view(n + 8, heads, dim)
    cache_dtype = "uint8" if fmt else src_dtype
    caches = []
    for name, extra in (("key_cache", 1), ("value_cache", 2)):  # padded blocks, K and V differ
        if layout == "NHD":
            block = (block_size + extra) * row
            caches.append(_alloc(regions, name, (num_blocks, block_size, heads, dim), cache_dtype, device,
                                 rng, strides=(block, row, dim, 1)))
        else:  # HND: a [blocks, H, block_size, D] allocation seen as [blocks, block_size, H, D]
            block = heads * (block_size + extra) * dim
            caches.append(_alloc(regions, name, (num_blocks, block_size, heads, dim), cache_dtype, device,
                                 rng, strides=(block, dim, (block_size + extra) * dim, 1)))
    key_cache, value_cache = caches
    slots = _alloc(regions, "slot_mapping", (n,), index, device, rng)
    scale_shape = (heads,) if scale_kind == "head" else (1,)
    k_scale = _alloc(regions, "k_scale", scale_shape, "float32", device, rng)
    v_scale = _alloc(regions, "v_scale", scale_shape, "float32", device, rng)

    def refresh(rng):
        factor = float(1 + rng.integers(0, 5))
        if fmt:
            scales = [_fp8cases.scale_values("head" if scale_kind == "head" else "0.0123", heads, t) * factor
                      for t in (0, 1)]
        else:
            scales = [np.ones(1, np.float32)] * 2
        scales = [s.astype(np.float32) for s in scales]
        _put(k_scale, scales[0])
        _put(v_scale, scales[1])
        k = _fp8_sources(rng, values, fmt, (n + 8, heads, dim), src_dtype, scales[0])
        v = _fp8_sources(rng, values, fmt, (n + 8, heads, dim), src_dtype, scales[1])
        _put(qkv, np.concatenate([_build.values(rng, (n + 8, row), src_dtype), k.reshape(n + 8, row),
                                  v.reshape(n + 8, row)], axis=1))
        _put(slots, _slots(rng, n, num_blocks * block_size, True).astype(NUMPY_DTYPES[index]))

    def expected(s):
        fp8 = {"preset": backend.preset} if fmt else {}
        with np.errstate(all="ignore"):
            k, v = reference.reshape_and_cache_flash(
                s["key_cache"], s["value_cache"], s["slot_mapping"], s["key"], s["value"],
                kv_cache_dtype=fmt or "auto", k_scale=s["k_scale"], v_scale=s["v_scale"], layout="NHD",
                padding="negative", **fp8)
        return {"key_cache": k, "value_cache": v}

    return Setup(lambda: ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, fmt or "auto",
                                                     k_scale, v_scale, **(call_kw or {})),
                 refresh, expected,
                 {"key": key, "value": value, "key_cache": key_cache, "value_cache": value_cache,
                  "slot_mapping": slots, "k_scale": k_scale, "v_scale": v_scale},
                 ("key_cache", "value_cache"), regions)


def quantize_setup(device, rng, *, fmt="e4m3fn", scale_kind="head", heads=8, dim=128, n=64,
                   values="special", dtype="float32", call_kw=None, backend=None) -> Setup:
    backend = backend or TRITON
    ops = backend.ops()
    regions = []
    x = _alloc(regions, "x", (n, heads, dim), dtype, device, rng,
               strides=(heads * dim + 64, dim, 1))  # rows sliced from a wider tensor
    out = _alloc(regions, "out", (n, heads, dim), "uint8", device, rng)
    scale = _alloc(regions, "scale", (heads,) if scale_kind == "head" else (1,), "float32", device, rng)

    def refresh(rng):
        factor = float(1 + rng.integers(0, 5))
        s = (_fp8cases.scale_values("head" if scale_kind == "head" else "0.0123", heads) * factor)
        s = s.astype(np.float32)
        _put(scale, s)
        _put(x, _fp8_sources(rng, values, fmt, (n, heads, dim), dtype, s))

    def expected(s):
        with np.errstate(all="ignore"):
            return {"out": reference.quantize(s["x"], fmt, scale=s["scale"], head_axis=-2,
                                              preset=backend.preset)}

    return Setup(lambda: ops.quantize_fp8(out, x, scale, fmt, **(call_kw or {})), refresh, expected,
                 {"x": x, "out": out, "scale": scale}, ("out",), regions)


def translate_setup(device, rng, *, dtype="int64", index="int64", shape=(64,), size_full=1024,
                    page_size=16, call_kw=None, backend=None) -> Setup:
    ops = (backend or TRITON).ops()
    regions = []
    length = size_full + page_size + 1
    mapping = _alloc(regions, "mapping", (length,), dtype, device, rng, lead=5)  # at an offset
    loc = _alloc(regions, "loc", shape, index, device, rng)
    table = length - 1

    def refresh(rng):
        m = np.zeros(length, np.int64)
        m[page_size:table] = rng.integers(0, size_full + page_size, size=table - page_size)
        m[-1] = -1
        _put(mapping, m.astype(NUMPY_DTYPES[dtype]))
        entries = rng.integers(0, table, size=int(np.prod(shape)))
        entries[rng.choice(entries.size, size=max(1, entries.size // 8), replace=False)] = -1
        _put(loc, entries.reshape(shape).astype(NUMPY_DTYPES[index]))

    def expected(s):
        return {"returned": reference.translate_full_to_swa(s["mapping"], s["loc"])}

    return Setup(lambda: ops.translate_full_to_swa(mapping, loc, **(call_kw or {})), refresh, expected,
                 {"mapping": mapping, "loc": loc}, (), regions, returns=True)


SCENARIOS = {
    "store_cache/bf16/fused/int64": (store_cache_setup, {}, False),
    "store_cache/u8/strided_index/int32": (store_cache_setup, {"dtype": "uint8", "index": "int32",
                                                               "index_layout": "strided"}, False),
    "store_cache/fp32/odd_row/int64": (store_cache_setup, {"dtype": "float32", "heads": 1, "dim": 97}, False),
    "set_mla_kv_buffer/bf16/512+64/int32": (set_mla_setup, {}, False),
    "set_mla_kv_buffer/u8/528+128/W700/int64": (set_mla_setup, {"dtype": "uint8", "nope": 528, "rope": 128,
                                                                "width": 700, "index": "int64"}, False),
    "concat_and_cache_mla/auto/bf16/int64": (concat_mla_setup, {}, False),
    "concat_and_cache_mla/e4m3fn/special": (concat_mla_setup, {"fmt": "e4m3fn"}, True),
    "concat_and_cache_mla/e5m2/special/int32": (concat_mla_setup, {"fmt": "e5m2", "index": "int32",
                                                                   "rank": 97, "rope": 31,
                                                                   "block_size": 5}, True),
    "reshape_and_cache_flash/auto/bf16/NHD": (flash_setup, {}, False),
    "reshape_and_cache_flash/auto/fp16/HND/int32": (flash_setup, {"dtype": "float16", "layout": "HND",
                                                                  "index": "int32"}, False),
    "reshape_and_cache_flash/e4m3fn/HND/head/special": (flash_setup, {"fmt": "e4m3fn", "layout": "HND",
                                                                      "scale_kind": "head"}, True),
    "reshape_and_cache_flash/e5m2/NHD/tensor/special": (flash_setup, {"fmt": "e5m2"}, True),
    "reshape_and_cache_flash/e4m3fn/NHD/tensor/bf16_random": (flash_setup, {"fmt": "e4m3fn",
                                                                            "values": "random"}, True),
    "quantize_fp8/e4m3fn/head/special": (quantize_setup, {}, True),
    "quantize_fp8/e5m2/tensor/double_rounding": (quantize_setup, {"fmt": "e5m2", "scale_kind": "tensor",
                                                                  "values": "double_rounding"}, True),
    "quantize_fp8/e4m3fn/tensor/bf16_random": (quantize_setup, {"scale_kind": "tensor", "values": "random",
                                                                "dtype": "bfloat16"}, True),
    "translate_full_to_swa/int64/1d": (translate_setup, {}, False),
    "translate_full_to_swa/int32/2d/int32": (translate_setup, {"dtype": "int32", "index": "int32",
                                                               "shape": (16, 3)}, False),
}
