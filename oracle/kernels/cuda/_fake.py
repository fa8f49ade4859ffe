"""Fake (meta) kernels of the kv_oracle_cuda ops, for FakeTensor tracing, torch.compile and
torch.library.opcheck. Every writer mutates its caches in place and returns nothing, so a fake
kernel checks what it can see without data (ranks, dtypes, shapes) and returns None.

Imported by :mod:`oracle.kernels.cuda` once the library is loaded, and by torch itself through the
library's ``m.set_python_module("oracle.kernels.cuda._fake")``. The functions are plain Python, so
the CPU-side tests call them directly.
"""

from __future__ import annotations

import torch

from .._jit import need as _need

NAMESPACE = "kv_oracle_cuda"
_registered = False
_INDEX = (torch.int32, torch.int64)


def store_cache(k, v, k_cache, v_cache, loc, max_vec=16, pdl=False, validate=1, verdict=None):
    _need(loc.dtype in _INDEX, f"loc has dtype {loc.dtype}; expected torch.int32 or torch.int64", TypeError)
    _need(loc.dim() == 1, f"loc must be 1-D, got shape {tuple(loc.shape)}")
    for name, src, cache_name, cache in (("k", k, "k_cache", k_cache), ("v", v, "v_cache", v_cache)):
        _need(src.dtype == cache.dtype, f"{name} has dtype {src.dtype} but {cache_name} has dtype {cache.dtype}",
              TypeError)
        _need(src.dim() == cache.dim() and src.shape[1:] == cache.shape[1:],
              f"{name} has shape {tuple(src.shape)}; its rows must match {cache_name} {tuple(cache.shape)}")


def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, path="auto", max_vec=16, pdl=False, validate=1,
                      verdict=None):
    _need(loc.dtype in _INDEX, f"loc has dtype {loc.dtype}; expected torch.int32 or torch.int64", TypeError)
    _need(loc.dim() == 1, f"loc must be 1-D, got shape {tuple(loc.shape)}")
    _need(kv_buffer.dim() in (2, 3), f"kv_buffer must be [S, W] or [S, 1, W], got {tuple(kv_buffer.shape)}")
    _need(cache_k_nope.dtype == kv_buffer.dtype == cache_k_rope.dtype,
          "cache_k_nope, cache_k_rope and kv_buffer must share a dtype", TypeError)
    _need(path in ("auto", "tma", "direct"), f"path={path!r} is not 'auto', 'tma' or 'direct'")


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            max_vec=16, pdl=False, validate=1, verdict=None):
    _need(key_cache.dim() == 4 and value_cache.dim() == 4, "caches must be 4-D [num_blocks, block_size, H, D]")
    _need(slot_mapping.dtype in _INDEX, f"slot_mapping has dtype {slot_mapping.dtype}; expected torch.int32 or "
          "torch.int64", TypeError)
    _need(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got {tuple(slot_mapping.shape)}")
    _need(key.dim() == 3 and value.dim() == 3, "key and value must be 3-D [T, H, D]")


def check_index(index, num_slots, negative_ok):
    _need(index.dtype in _INDEX, f"index has dtype {index.dtype}; expected torch.int32 or torch.int64", TypeError)
    _need(index.dim() == 1, f"index must be 1-D, got shape {tuple(index.shape)}")
    blocks = min(64, max(1, -(-index.shape[0] // 1024)))  # bind_common.cpp: kCheckChunk, kMaxCheckBlocks
    return index.new_empty(index.shape), index.new_empty((blocks,), dtype=torch.int64)


FAKES = {f.__name__: f for f in (store_cache, set_mla_kv_buffer, reshape_and_cache_flash, check_index)}


def register_fakes() -> None:
    """Register every fake kernel (once; the ops must already be defined). torch accepts them only
    from the module the library names in ``m.set_python_module``, so this stays here."""
    global _registered
    if _registered:
        return
    for name, fn in FAKES.items():
        torch.library.register_fake(f"{NAMESPACE}::{name}")(fn)
    _registered = True


if hasattr(torch.ops, NAMESPACE) and hasattr(getattr(torch.ops, NAMESPACE), "store_cache"):
    register_fakes()
