"""``store_cache(k, v, k_cache, v_cache, loc)``: sglang's flat K/V scatter.

k, v ``[N, H, D]`` with any row stride (often slices of one fused qkv tensor); caches ``[S, H, D]``;
loc int32 or int64 ``[N]``. Rows are copied bitwise (fp8 pools are passed as uint8). V's head
size may differ from K's (shape ``(H, Dk, Dv)``: MLA-style heads of 192 and 128, which sglang's
writer takes as separate K and V row widths); each cache has its own source's width.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import reference
from ..buffers import NUMPY_DTYPES, Arena
from ..contract import Contract
from . import _build
from .base import Case, OpSpec, Prepared


class StoreCache(OpSpec):
    name = "store_cache"
    signature = "store_cache(k, v, k_cache, v_cache, loc)"
    dtypes = ("bfloat16", "float16", "float32", "uint8")
    default_shape = (8, 128)  # (heads, head_dim)
    # (heads, head_dim) or (heads, k_head_dim, v_head_dim)
    shapes = ((1, 64), (8, 128), (32, 128), (8, 256), (1, 46), (1, 96), (1, 97), (8, 192, 128), (1, 64, 97))
    large_n_shape = (2, 64)
    after_shapes = (((1, 64, 97), (1, 64)),)  # a plan keyed on K's row bytes alone keeps V's too
    sources = ("k", "v")
    source_layouts = ("fused", "interleaved")  # interleaved: heads apart, as qkv.view(N, H, 3, D)[:, :, j]
    aliasing = ("aliased", "halves", "offset", "unequal")
    large_case = {"dtype": "uint8", "n": 7}  # 8 x 128 byte rows (an fp8 pool) past 2**31 elements
    float_slots_shape = (1, 1)
    odd_run_shape = (1, 97)  # 194-byte rows in bf16

    def shape_strategy(self):
        from hypothesis import strategies as st

        return st.tuples(st.integers(1, 8), st.integers(1, 130))

    @staticmethod
    def dims(p: dict) -> tuple[int, int, int]:
        """(heads, K's head size, V's head size) of a case."""
        heads, dim = p["shape"][:2]
        return heads, dim, p["shape"][2] if len(p["shape"]) > 2 else dim

    def row_bytes(self, case: Case) -> int:
        """Bytes of a row, the gcd of K's and V's, so a declared multiple divides both."""
        p = self.p_with_defaults(case)
        heads, k_dim, v_dim = self.dims(p)
        return math.gcd(heads * k_dim, heads * v_dim) * NUMPY_DTYPES[p["dtype"]].itemsize

    def needs(self, case: Case) -> dict:
        out = super().needs(case)
        heads, k_dim, v_dim = self.dims(self.p_with_defaults(case))
        if k_dim != v_dim:
            out["distinct_kv_widths"] = out["cache_strides"] = True
        return out

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        heads, dim, v_dim = self.dims(p)
        n, dtype = p["n"], p["dtype"]
        num_slots = _build.LARGE_UNITS if p.get("large") else _build.slot_count(p)
        k, v = _build.rows(arena, ("k", "v"), (_build.values(rng, (n, heads, dim), dtype, p["values"]),
                                               _build.values(rng, (n, heads, v_dim), dtype, p["values"])), p["src"], rng)
        shapes = ((num_slots, heads, dim), (num_slots, heads, v_dim))
        if p.get("large"):
            k_cache, v_cache = _build.large_caches(arena, ("k_cache", "v_cache"), shapes)
            entries = _build.large_slots(rng, n)
        else:
            k_cache, v_cache = _build.caches(arena, ("k_cache", "v_cache"), shapes, dtype, p["cache"])
            entries = _build.destinations(rng, p, num_slots, contract)
        bad = p.get("bad")
        if bad == "out_of_range" and n:
            entries[_build.illegal_at(n)] = num_slots
        loc = _build.index_of(arena, "loc", entries, p, num_slots, rng)
        if bad == "dtype_mismatch":
            k = k.to(torch.float16 if k.dtype != torch.float16 else torch.float32)
        elif bad == "shape_mismatch":
            v = v[:, :, : v_dim - 1]
        elif bad == "index_dtype":
            loc = loc.to(torch.int16)
        elif bad == "loc_length":
            loc = loc[: max(n - 1, 0)]
        return Prepared(arena, (k, v, k_cache, v_cache, loc), ("k_cache", "v_cache"))

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        policies = {"padding": contract.padding, "duplicates": contract.duplicates} | override
        loc = prepared.numpy("loc")
        return {cache: reference.store_cache(prepared.numpy(cache), loc, prepared.numpy(src)[:len(loc)],
                                             **policies)
                for cache, src in (("k_cache", "k"), ("v_cache", "v"))}

    def bad_inputs(self) -> tuple:
        return ("dtype_mismatch", "shape_mismatch", "out_of_range", "index_dtype", "loc_length")
