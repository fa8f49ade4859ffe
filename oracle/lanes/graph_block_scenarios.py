"""The block-scaled scenarios of the CUDA-graph replay lane (:mod:`oracle.lanes.graphs`):
``reshape_and_cache_block`` into MXFP8 and NVFP4 caches, captured once and replayed with new
sources, slots (with -1 padding) and per-tensor scales, against the reference.

Sources are K and V sliced from a fused qkv tensor with more rows than the index; the scale cache
is linear, or swizzled with 16 unused bytes after each page (which must stay poisoned). The
conversions are integer arithmetic in the Triton writers, so these scenarios also run on the CPU
interpreter (``--cpu-dry-run``).
"""

from __future__ import annotations

import numpy as np

from ..ops import _blockcases, _build
from ..reference import block_scaled
from .graph_scenarios import TRITON, Setup, _alloc, _put, _slots

PAGE_PAD = 16  # unused bytes after each swizzled page
NAMES = ("key_cache", "value_cache", "key_scale_cache", "value_scale_cache")


def block_setup(device, rng, *, fmt="mxfp8_e4m3fn", scale_layout="linear", heads=8, dim=128, n=48,
                dtype="bfloat16", values="special", call_kw=None, backend=None) -> Setup:
    ops = (backend or TRITON).ops()
    regions = []
    num_blocks, block_size = 10, 16
    row = heads * dim
    qkv = _alloc(regions, "qkv", (n + 8, 3 * row), dtype, device, rng)  # T > num_tokens
    key = qkv[:, row:2 * row].view(n + 8, heads, dim)
    value = qkv[:, 2 * row:].view(n + 8, heads, dim)
    width, count = block_scaled.code_width(fmt, dim), block_scaled.scale_count(fmt, dim)
    caches = [_alloc(regions, name, (num_blocks, block_size, heads, width), "uint8", device, rng)
              for name in NAMES[:2]]
    page = block_scaled.swizzled_page_bytes(block_size * heads, count)
    for name in NAMES[2:]:
        if scale_layout == "linear":
            caches.append(_alloc(regions, name, (num_blocks, block_size, heads, count), "uint8", device, rng))
        else:
            caches.append(_alloc(regions, name, (num_blocks, page), "uint8", device, rng,
                                 strides=(page + PAGE_PAD, 1)))
    slots = _alloc(regions, "slot_mapping", (n,), "int64", device, rng)
    scales = [_alloc(regions, name, (1,), "float32", device, rng) for name in ("k_global_scale", "v_global_scale")]

    def refresh(rng):
        k, v = (_blockcases.values(rng, values, fmt, (n + 8, heads, dim), dtype) for _ in range(2))
        _put(qkv, np.concatenate([_build.values(rng, (n + 8, row), dtype), k.reshape(n + 8, row),
                                  v.reshape(n + 8, row)], axis=1))
        for t, (scale, source) in enumerate(zip(scales, (k, v))):
            _put(scale, _blockcases.global_scale("calibrated", source[:n], t))
        _put(slots, _slots(rng, n, num_blocks * block_size, True))

    def expected(s):
        with np.errstate(all="ignore"):
            out = block_scaled.reshape_and_cache_block(
                *(s[name] for name in NAMES), s["slot_mapping"], s["key"], s["value"], fmt=fmt,
                k_global_scale=s["k_global_scale"], v_global_scale=s["v_global_scale"],
                scale_layout=scale_layout, padding="negative")
        return dict(zip(NAMES, out))

    views = dict(zip(NAMES, caches), key=key, value=value, slot_mapping=slots, k_global_scale=scales[0],
                 v_global_scale=scales[1])
    return Setup(lambda: ops.reshape_and_cache_block(key, value, *caches, slots, fmt, *scales, **(call_kw or {})),
                 refresh, expected, views, NAMES, regions)


BLOCK_SCENARIOS = {  # name -> (builder, parameters, needs the GPU's fp8 conversion)
    "reshape_and_cache_block/mxfp8_e4m3fn/linear/special": (block_setup, {}, False),
    "reshape_and_cache_block/mxfp8_e5m2/swizzled/bf16_random": (block_setup, {"fmt": "mxfp8_e5m2",
                                                                              "scale_layout": "swizzled",
                                                                              "values": "random"}, False),
    "reshape_and_cache_block/nvfp4/linear/nonfinite": (block_setup, {"fmt": "nvfp4", "values": "nonfinite",
                                                                     "dtype": "float32"}, False),
    "reshape_and_cache_block/nvfp4/swizzled/13x160/special": (block_setup, {"fmt": "nvfp4", "heads": 13,
                                                                            "dim": 160,
                                                                            "scale_layout": "swizzled"}, False),
}
