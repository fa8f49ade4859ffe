"""A torch sliding-window (SWA) KV pool and allocator with a cached full->SWA translation.

Hybrid models keep a *full* pool (full-attention layers) and a smaller *SWA* pool (sliding-window
layers). Every token gets a slot in both; ``full_to_swa_index_mapping`` records, per full slot,
the SWA slot that holds the same token. :class:`SwaKVPool` is the allocator and the SWA pool in
one object, on CPU or CUDA tensors (``device`` is an argument). It follows the contract of the
numpy model :class:`oracle.reference.swa_model.SwaAllocatorModel` operation by operation (same pages,
same slots, same errors by type), and ``conformance/test_swa_pool.py`` drives the two side by
side. The caching design follows sglang #25824 (facts only: ``../shared/seeds``); see
``docs/swa-pool.md``.

The package, by concern (every public name is importable from ``oracle.kernels.swa_pool``):

- :mod:`.translate`: :func:`translate_full_to_swa`, the strict translation a cache miss runs
  (-1 stays -1), and :func:`default_translate_fn`, which one a pool on a device uses;
- :mod:`.allocator`: the page pools and the full->SWA table (the table's layout, allocation
  order, every operation that changes the mapping: :data:`MUTATORS`);
- :mod:`.pool`: :class:`SwaKVPool`, the allocator with the translation cache (its key, its
  invalidation) and the SWA KV buffers written through a registered ``store_cache`` kernel;
- here: the plug-in.

Registered through the plug-in API like any kernel: :func:`register` registers
:func:`translate_full_to_swa`, the function the pool translates with on a cache miss, as
``swa_pool.translate_full_to_swa`` (and ``swa_pool.translate_full_to_swa.cuda`` on CUDA
tensors).
"""

from __future__ import annotations

import torch

import oracle

from .allocator import MUTATORS, PageAllocator
from .pool import DEFAULT_STORE_CACHE, SwaKVPool, resolve_store_cache
from .translate import SENTINEL, default_translate_fn, translate_full_to_swa

__all__ = ["DEFAULT_STORE_CACHE", "MUTATORS", "PageAllocator", "SENTINEL", "SwaKVPool", "default_translate_fn",
           "register", "resolve_store_cache", "translate_full_to_swa"]


def _cuda_available() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device"


def register() -> None:
    """Plug-in: ``oracle.kernels: swa_pool = "oracle.kernels.swa_pool:register"``."""
    notes = ("the translation SwaKVPool runs on a cache miss: range checks on the host, then "
             "mapping[loc] with -1 masked to -1 explicitly (never read through mapping[-1])")
    common = dict(op="translate_full_to_swa", backend="torch", validates=True, padding="negative",
                  notes=notes)
    oracle.register(translate_full_to_swa, name="swa_pool.translate_full_to_swa", device="cpu",
                    **common)
    oracle.register(translate_full_to_swa, name="swa_pool.translate_full_to_swa.cuda", device="cuda",
                    available=_cuda_available, **common)
