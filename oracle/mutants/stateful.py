"""Mutants that keep state between calls: right on a tensor's first call, wrong once its values are
rewritten in place (as an engine rewrites its index, mapping and scales every step). Each keys its
memo on the tensor's address and size, as real host-side caches do. Built like
:data:`oracle.mutants.kernels.MUTANTS`, each under exactly its base's contract; only the ``repeat``
class, which calls a kernel twice on the same tensors, reaches them on purpose.
"""

from __future__ import annotations

import torch

from ..kernels import torch_native as tn
from .kernels import Mutant


def _key(t: torch.Tensor) -> tuple:
    return t.data_ptr(), t.numel(), t.dtype


_MAPPINGS: dict = {}


def translate_memoizes_mapping(mapping, loc):
    """The table copied once per address (a host or device copy kept for the pool's lifetime)."""
    table = _MAPPINGS.get(_key(mapping))
    if table is None:
        table = _MAPPINGS[_key(mapping)] = mapping.clone()
    return tn.translate_full_to_swa(table, loc)


_SCALES: dict = {}


def paged_reads_scales_once(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """k_scale and v_scale read once per address (``scale.item()`` at the first call, kept)."""
    if isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor):
        k_scale = _SCALES.setdefault(("k",) + _key(k_scale), k_scale.clone())
        v_scale = _SCALES.setdefault(("v",) + _key(v_scale), v_scale.clone())
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


_CHECKED: set = set()


def store_cache_checks_index_once(k, v, k_cache, v_cache, loc):
    """loc checked on its first call only (a "validated" flag kept per address); later calls write
    whatever it holds, an out-of-range slot clamped into the cache."""
    if _key(loc) not in _CHECKED:
        tn.store_cache(k, v, k_cache, v_cache, loc)
        _CHECKED.add(_key(loc))
        return
    index = loc.long().clamp(0, k_cache.shape[0] - 1)
    k_cache.index_put_((index,), k[: loc.shape[0]])
    v_cache.index_put_((index,), v[: loc.shape[0]])


T = "torch."
STATEFUL_MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, catches, fn, cause)
                         for name, op, base, bug, catches, fn, cause in [
    ("translate_full_to_swa.memoizes_mapping", "translate_full_to_swa", T + "translate_full_to_swa",
     "copies the mapping once per address and translates later calls through that stale copy",
     ("repeat",), translate_memoizes_mapping, "stale_state"),
    ("reshape_and_cache_flash.reads_scales_once", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "reads k_scale and v_scale once per address and keeps dividing by those values",
     ("repeat",), paged_reads_scales_once, "stale_state"),
    ("store_cache.checks_index_once", "store_cache", T + "store_cache",
     "checks loc on its first call only; later calls clamp an out-of-range slot into the cache",
     ("repeat",), store_cache_checks_index_once, "validation_missing"),
])

__all__ = ["STATEFUL_MUTANTS"]
