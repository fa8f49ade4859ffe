"""Fake (meta) kernels of the kv_oracle_cpu ops, for FakeTensor tracing, torch.compile and meta
tensors. Every op writes its caches in place and returns nothing, so a fake kernel only checks what
it can see without data (ranks and dtypes) and returns None.

Imported by ``oracle.kernels.cpu`` once the library is loaded, and by torch itself through the
library's ``m.set_python_module("oracle.kernels.cpu._fake")``.
"""

from __future__ import annotations

import torch

from .._jit import need as _need

_NS = "kv_oracle_cpu"
_registered = False


def store_cache(k, v, k_cache, v_cache, loc, padding="none"):
    _need(loc.dim() == 1, f"loc must be 1-D, got shape {tuple(loc.shape)}")
    _need(k.dtype == k_cache.dtype and v.dtype == v_cache.dtype, "sources and caches must share a dtype")


def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, padding="none"):
    _need(loc.dim() == 1, f"loc must be 1-D, got shape {tuple(loc.shape)}")
    _need(cache_k_nope.dtype == kv_buffer.dtype == cache_k_rope.dtype, "sources and kv_buffer must share a dtype")


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, padding="negative"):
    _need(kv_cache.dim() == 3, f"kv_cache must be 3-D, got {tuple(kv_cache.shape)}")
    _need(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got {tuple(slot_mapping.shape)}")


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                            padding="negative"):
    _need(key_cache.dim() == 4 and value_cache.dim() == 4, "caches must be 4-D [num_blocks, block_size, H, D]")
    _need(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got {tuple(slot_mapping.shape)}")


def quantize_fp8(out, x, scale, fmt):
    _need(out.dtype == torch.uint8, f"out has dtype {out.dtype}; expected torch.uint8")
    _need(tuple(out.shape) == tuple(x.shape), f"out has shape {tuple(out.shape)} and x {tuple(x.shape)}")


def quantize_block(codes, scales, x, fmt, global_scale):
    _need(codes.dtype == torch.uint8 and scales.dtype == torch.uint8, "codes and scales must be torch.uint8")
    _need(x.dim() == 3, f"x must be 3-D [N, H, D], got {tuple(x.shape)}")


def reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                            fmt, k_global_scale, v_global_scale):
    _need(key_cache.dim() == 4 and value_cache.dim() == 4, "caches must be 4-D [num_blocks, block_size, H, Dc]")
    _need(key_scale_cache.dim() in (2, 4) and value_scale_cache.dim() in (2, 4),
          "scale caches must be 4-D (linear) or 2-D (swizzled)")
    _need(slot_mapping.dim() == 1, f"slot_mapping must be 1-D, got {tuple(slot_mapping.shape)}")


FAKES = {f.__name__: f for f in (store_cache, set_mla_kv_buffer, concat_and_cache_mla,
                                  reshape_and_cache_flash, quantize_fp8, quantize_block, reshape_and_cache_block)}


def register_fakes() -> None:
    """Register every fake kernel (once; the ops must already be defined). torch accepts them only
    from the module the library names in ``m.set_python_module``, so this stays here."""
    global _registered
    if _registered:
        return
    for name, fn in FAKES.items():
        torch.library.register_fake(f"{_NS}::{name}")(fn)
    _registered = True


if hasattr(torch.ops, _NS) and hasattr(getattr(torch.ops, _NS), "store_cache"):
    register_fakes()
