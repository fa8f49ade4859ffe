"""The torch baseline backend: every op in plain torch (index_put_, torch's own fp8 casts).

It is what a serving engine falls back to when no fused kernel applies, and the baseline every
benchmark compares against. Registered through the public plug-in API (entry point
``oracle.kernels: torch``), with an honest contract.
"""

from __future__ import annotations

import torch

import oracle

INDEX_DTYPES = (torch.int32, torch.int64)


def _check_index(name: str, index: torch.Tensor, num_slots: int) -> None:
    """torch.index_put_ bounds-checks while it writes; checking first keeps a rejected call from
    leaving a partial write behind."""
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} has dtype {index.dtype}; expected torch.int32 or torch.int64")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")
    if index.numel():
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= num_slots:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds slot {bad}, out of range [0, {num_slots})")


def _check_rows(name: str, src: torch.Tensor, cache_name: str, cache: torch.Tensor, n: int) -> None:
    if src.dtype != cache.dtype:
        raise TypeError(f"{name} has dtype {src.dtype} but {cache_name} has dtype {cache.dtype}")
    if tuple(src.shape) != (n,) + tuple(cache.shape[1:]):
        raise ValueError(f"{name} has shape {tuple(src.shape)}; expected {(n,) + tuple(cache.shape[1:])}")


def store_cache(k, v, k_cache, v_cache, loc):
    """``k_cache[loc] = k; v_cache[loc] = v`` (sglang's naive fallback)."""
    _check_index("loc", loc, k_cache.shape[0])
    _check_rows("k", k, "k_cache", k_cache, loc.shape[0])
    _check_rows("v", v, "v_cache", v_cache, loc.shape[0])
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"v_cache has {v_cache.shape[0]} slots but k_cache has {k_cache.shape[0]}")
    index = loc.long()
    k_cache.index_put_((index,), k)
    v_cache.index_put_((index,), v)


def register() -> None:
    common = dict(backend="torch", device="cpu", validates=True,
                  notes="plain torch; -1 would wrap to the last row, so padding is out of contract")
    oracle.register(store_cache, op="store_cache", name="torch.store_cache",
                    dtypes=("float32", "float16", "bfloat16", "uint8"), **common)
