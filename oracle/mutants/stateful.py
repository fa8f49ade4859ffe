"""Mutants that keep state between calls: right on a tensor's first call, wrong once its values are
rewritten in place (as an engine rewrites its index, mapping and scales every step). Each keys its
memo on the tensor object, dropped when the tensor dies (so it never meets another case's tensor at
a reused address, which would make the mutant fail by chance). Built like
:data:`oracle.mutants.kernels.MUTANTS`, each under exactly its base's contract; only the ``repeat``
class, which calls a kernel twice on the same tensors, reaches them on purpose.
"""

from __future__ import annotations

import weakref

import torch

from ..kernels import torch_native as tn
from .kernels import Mutant


def _memo(store: dict, tensor: torch.Tensor, make):
    """``store``'s value for ``tensor`` (made by ``make()`` on its first call), dropped when the
    tensor dies. Keyed by ``id`` (weak dictionaries compare tensors with ``==``, elementwise)."""
    key = id(tensor)
    if key not in store:
        store[key] = make()
        weakref.finalize(tensor, store.pop, key, None)
    return store[key]


_MAPPINGS: dict = {}


def translate_memoizes_mapping(mapping, loc):
    """The table copied once per mapping tensor (a copy kept for the pool's lifetime)."""
    return tn.translate_full_to_swa(_memo(_MAPPINGS, mapping, mapping.clone), loc)


_SCALES: dict = {}


def paged_reads_scales_once(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """k_scale and v_scale read once per tensor (``scale.item()`` at the first call, kept)."""
    if isinstance(k_scale, torch.Tensor) and isinstance(v_scale, torch.Tensor):
        k_scale = _memo(_SCALES, k_scale, k_scale.clone)
        v_scale = _memo(_SCALES, v_scale, v_scale.clone)
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale)


_CHECKED: dict = {}


def store_cache_checks_index_once(k, v, k_cache, v_cache, loc):
    """loc checked on its first call only (a "validated" flag kept per tensor); later calls write
    whatever it holds, an out-of-range slot clamped into the cache."""
    if id(loc) not in _CHECKED:
        tn.store_cache(k, v, k_cache, v_cache, loc)
        _memo(_CHECKED, loc, lambda: True)
        return
    index = loc.long().clamp(0, k_cache.shape[0] - 1)
    k_cache.index_put_((index,), k[: loc.shape[0]])
    v_cache.index_put_((index,), v[: loc.shape[0]])


T = "torch."
STATEFUL_MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, catches, fn, cause)
                         for name, op, base, bug, catches, fn, cause in [
    ("translate_full_to_swa.memoizes_mapping", "translate_full_to_swa", T + "translate_full_to_swa",
     "copies the mapping once per tensor and translates later calls through that stale copy",
     ("repeat",), translate_memoizes_mapping, "stale_state"),
    ("reshape_and_cache_flash.reads_scales_once", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "reads k_scale and v_scale once per tensor and keeps dividing by those values",
     ("repeat",), paged_reads_scales_once, "stale_state"),
    ("store_cache.checks_index_once", "store_cache", T + "store_cache",
     "checks loc on its first call only; later calls clamp an out-of-range slot into the cache",
     ("repeat",), store_cache_checks_index_once, "validation_missing"),
])

__all__ = ["STATEFUL_MUTANTS"]
