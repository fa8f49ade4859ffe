"""``reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
k_scale, v_scale)``: vLLM's paged K/V write.

key, value ``[T, H, D]`` with any row stride (often slices of one fused qkv tensor); caches
``[num_blocks, block_size, H, D]``: "NHD" a plain allocation of that shape, "HND" a permuted view
of a ``[num_blocks, H, block_size, D]`` allocation (the kernel must read the strides). Slot ``s``
is token ``s % block_size`` of block ``s // block_size``; slot_mapping int32 or int64.
``kv_cache_dtype`` "auto" copies (cache dtype = source dtype); an fp8 format name stores
``fp8(x / scale)`` codes in uint8 caches. k_scale, v_scale: float32 tensors of shape [1] or [H]
(also checked unchanged); under "auto" they are 1.0 and ignored, as vLLM does.

Case variants beyond the catalogue's: blocks of 16 tokens, and of 32 and 64 in two shape variants
(a kernel that hard-codes 16, or its shift and mask, writes the wrong place there); cache "padded"
gives each cache a block stride larger than a block (K by one token row, V by two), so K's and V's
strides differ and a kernel that assumes dense blocks, or reuses K's strides for V, writes the
wrong place; cache "unequal" pads V's blocks only, beside a dense K cache. No
``large_case``: e4m3fn caches whose blocks lie past 2**31 elements (_build.large_caches).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import reference
from ..buffers import NUMPY_DTYPES, Arena
from ..contract import Contract
from ..diagnose.hypothesis import Hypothesis
from . import _build, _fp8cases, _fp8hypotheses
from ._bad_scales import BAD_SCALES, spoil
from .base import Case, OpSpec, Prepared

BLOCK_SIZE = 16
# extra token rows per block of K and of V: "padded" pads both; "unequal" leaves K dense beside a
# padded V, so a kernel that takes a dense fast path on K's strides alone writes V wrong
PADDED_TOKENS = {"padded": (1, 2), "unequal": (0, 2)}


class ReshapeAndCacheFlash(OpSpec):
    name = "reshape_and_cache_flash"
    paged = True
    signature = ("reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, "
                 "kv_cache_dtype, k_scale, v_scale)")
    dtypes = ("bfloat16", "float16", "float32")
    fp8 = True
    fp8_optional = True
    fp8_scales = _fp8cases.SCALES
    fp8_mixed_scales = True
    fp8_tail_shape = (13, 46)
    default_shape = (8, 128)  # (heads, head_size)
    # (heads, head_size[, block_size]): blocks of 16 tokens unless a third entry says otherwise
    shapes = ((1, 64), (8, 128), (32, 128), (8, 256), (1, 46), (13, 46), (8, 96), (1, 97), (8, 128, 32),
              (2, 64, 64), (4, 64, 5))  # blocks of 5: a block size that is not a power of two
    large_n_shape = (2, 64)
    wide_cache_shape = (1, 16, 5)  # blocks of 5 over WIDE_SLOTS slots of 16 elements
    sources = ("key", "value")
    scale_arguments = ("k_scale", "v_scale")
    source_layouts = ("fused", "interleaved")  # interleaved: heads apart, as qkv.view(N, H, 3, D)[:, :, j]
    aliasing = ("aliased", "halves", "offset", "padded", "unequal")
    layouts = ("NHD", "HND")
    large_case = {"fp8": "e4m3fn", "n": 7}
    float_slots_shape = (1, 1)
    odd_run_shape = (1, 97)  # 194-byte token rows in bf16, side by side in a block (NHD)

    def p_with_defaults(self, case: Case) -> dict:
        p = super().p_with_defaults(case)
        if p.get("bad") in ("scale_dtype", "cache_dtype", *BAD_SCALES) and "fp8" not in case.p:
            p["fp8"] = "e4m3fn"
        if p.get("fp8"):
            p.setdefault("scale", "1.0")
        return _fp8cases.with_defaults(p, case.p)

    def needs(self, case: Case) -> dict:
        out = super().needs(case)
        if self.p_with_defaults(case)["cache"] in ("padded", "unequal"):
            out["aliased_caches"] = True  # views into larger allocations
        return out

    def row_bytes(self, case: Case) -> int:
        """The byte width of the unit a kernel copies: a token's [H, D] row (NHD) or one head's
        D elements (HND), the gcd over source and cache (so a declared multiple divides both)."""
        p = self.p_with_defaults(case)
        heads, dim = p["shape"][:2]
        unit = dim if p["layout"] == "HND" else heads * dim
        source = NUMPY_DTYPES[p["dtype"]].itemsize
        return math.gcd(unit * source, unit * (1 if p.get("fp8") else source))

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        heads, dim = p["shape"][:2]
        block_size = p["shape"][2] if len(p["shape"]) > 2 else BLOCK_SIZE
        n, dtype, fmt, bad = p["n"], p["dtype"], p.get("fp8"), p.get("bad")
        num_blocks = _build.LARGE_UNITS if p.get("large") else -(-_build.slot_count(p) // block_size)
        if p.get("wide"):
            num_blocks = -(-_build.WIDE_SLOTS // block_size)
        num_slots = num_blocks * block_size
        choice = p.get("scale", "1.0")
        scales = [_fp8cases.scale_values(choice, heads, t) for t in (0, 1)]
        if fmt:
            arrays = tuple(_fp8cases.values(rng, p["values"], fmt, (n, heads, dim), dtype, s)
                           for s in scales)
        else:
            arrays = tuple(_build.values(rng, (n, heads, dim), dtype, p["values"]) for _ in range(2))
        if bad in BAD_SCALES:
            scales = spoil(bad, scales)
        k_scale = arena.tensor("k_scale", scales[0], role="scale")
        v_scale = arena.tensor("v_scale", scales[1], role="scale")
        key, value = _build.rows(arena, ("key", "value"), arrays, p["src"], rng)
        cache_dtype = _fp8cases.cache_dtype(contract, fmt) if fmt and bad != "cache_dtype" else dtype
        if bad == "auto_cache_dtype":  # an fp8 cache (codes) written under "auto"
            cache_dtype = "uint8"
        if p.get("large"):
            key_cache, value_cache = _build.large_caches(arena, ("key_cache", "value_cache"),
                                                         ((num_blocks, block_size, heads, dim),) * 2,
                                                         cache_dtype)
            entries = _build.large_slots(rng, n, block_size)
        else:
            key_cache, value_cache = _caches(arena, (num_blocks, block_size, heads, dim), cache_dtype,
                                             p["cache"], p["layout"])
            entries = _build.destinations(rng, p, num_slots, contract)
        if bad == "out_of_range" and n:
            entries[_build.illegal_at(n)] = num_slots
        slot_mapping = _build.index_of(arena, "slot_mapping", entries, p, num_slots, rng)
        kv_cache_dtype = _fp8cases.kv_cache_dtype(contract, p)
        if bad == "dtype_mismatch":
            key = key.to(torch.float16 if key.dtype != torch.float16 else torch.float32)
        elif bad == "shape_mismatch":
            value = value[:, :, : dim - 1]
        elif bad == "index_dtype":
            slot_mapping = slot_mapping.to(torch.int16)
        elif bad == "scale_dtype":
            k_scale = k_scale.to(torch.float64)
        elif bad == "kv_cache_dtype":
            kv_cache_dtype = "fp9"
        elif bad == "layout":  # every other element of a wider cache: last dim not contiguous
            shape = (num_blocks, block_size, heads, dim)
            itemsize = NUMPY_DTYPES[cache_dtype].itemsize
            arena.region("key_cache_strided", 2 * math.prod(shape) * itemsize, _build.GUARD_MIN)
            strides = (block_size * heads * dim * 2, heads * dim * 2, dim * 2, 2)
            key_cache = arena.view("key_cache", "key_cache_strided", shape, strides, 0, cache_dtype,
                                   role="cache")
        return Prepared(arena, (key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                k_scale, v_scale), ("key_cache", "value_cache"))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        fmt = self.p_with_defaults(case).get("fp8")
        fmt, mode, fp8_args, rest = _fp8cases.resolve(contract, fmt, override)
        policies = {"padding": contract.padding, "duplicates": contract.duplicates} | rest
        key, k_scale = _fp8cases.scaled_source(fmt, mode, prepared.numpy("key"), prepared.numpy("k_scale"))
        value, v_scale = _fp8cases.scaled_source(fmt, mode, prepared.numpy("value"), prepared.numpy("v_scale"))
        # The caches' numpy twins have the kernel's logical [blocks, block_size, H, D] shape in
        # either layout (HND through its strides), so the reference addresses them as NHD.
        with np.errstate(all="ignore"):  # special values overflow and divide NaN on purpose
            k, v = reference.reshape_and_cache_flash(
                prepared.numpy("key_cache"), prepared.numpy("value_cache"),
                prepared.numpy("slot_mapping"), key, value, kv_cache_dtype=fmt or "auto",
                k_scale=k_scale, v_scale=v_scale, layout="NHD", **policies, **fp8_args)
        return {"key_cache": k, "value_cache": v}

    def alternatives(self, case: Case, contract: Contract) -> list[Hypothesis]:
        """The fp8 hypotheses (:func:`_fp8hypotheses.alternatives`) and the scale ones (k_scale and
        v_scale collapsed to head 0, each used for the other)."""
        p = self.p_with_defaults(case)
        out = _fp8hypotheses.alternatives(p, contract, row_width=p["shape"][1])
        return (out + _fp8hypotheses.scale_hypotheses(p, self.scale_arguments, p["shape"][0])
                + _fp8hypotheses.zero_head_hypotheses(p, ("key", "value")))

    def bad_inputs(self) -> tuple:
        return ("dtype_mismatch", "shape_mismatch", "out_of_range", "layout", "scale_dtype",
                "index_dtype", "kv_cache_dtype", "cache_dtype", "auto_cache_dtype", *BAD_SCALES)


def _caches(arena: Arena, shape: tuple, dtype: str, variant: str, layout: str):
    """key_cache and value_cache of logical shape ``shape`` (NHD), allocated in ``layout`` order
    ("HND": ``[blocks, H, block_size, D]``, handed over as a permuted view) as ``variant``:
    plain, offset, aliased, halves (see _build.caches), padded (a block stride past the block) or unequal
    (K dense, V padded)."""
    num_blocks, block_size, heads, dim = shape
    alloc = shape if layout == "NHD" else (num_blocks, heads, block_size, dim)
    names = ("key_cache", "value_cache")
    if variant in PADDED_TOKENS:
        itemsize = NUMPY_DTYPES[dtype].itemsize
        views = []
        for name, extra in zip(names, PADDED_TOKENS[variant]):
            stride0 = (block_size + extra) * heads * dim
            arena.region(name + "_storage", num_blocks * stride0 * itemsize,
                         max(_build.GUARD_MIN, stride0 * itemsize))
            strides = (stride0, math.prod(alloc[2:]), alloc[3], 1)
            views.append(arena.view(name, name + "_storage", alloc, strides, 0, dtype, role="cache"))
    else:
        views = list(_build.caches(arena, names, (alloc, alloc), dtype, variant))
    if layout == "HND":
        for i, name in enumerate(names):
            spec = arena.views[name]
            s0, s1, s2, s3 = spec.strides
            views[i] = arena.view(name, spec.region, shape, (s0, s2, s1, s3), spec.offset, dtype,
                                  role="cache")
    return tuple(views)
