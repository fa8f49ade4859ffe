"""Mutant SWA pools: small variants of :class:`oracle.kernels.swa_pool.SwaKVPool`, each with one
real bug of the translation cache or the allocator, for the stateful conformance test
(``conformance/test_swa_pool.py``) to catch. ``tests/test_swa_pool.py`` runs the state machine
against each and checks that it fails with a short, printed step sequence.

They are pools, not kernels: they are not registered through the plug-in API. :data:`POOL_MUTANTS`
lists them with a one-line description each; :func:`forgets_invalidation` builds the
forgotten-invalidation mutant for any one mutating method.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.swa_pool import MUTATORS, SwaKVPool, translate_full_to_swa


class KeyedOnStorageBase(SwaKVPool):
    """Caches the translation keyed on ``untyped_storage().data_ptr()``: two views at different
    offsets of one buffer (same length) collide, and the second gets the first's translation."""

    def _loc_key(self, loc):
        return (loc.untyped_storage().data_ptr(),) + super()._loc_key(loc)[1:]


class KeyedOnDataPtrAndNumel(SwaKVPool):
    """Caches keyed on ``(data_ptr(), numel())`` only (sglang #25824's key): views with the same
    start and length but other strides or shape (``buf[0:4]``, ``buf[0:8:2]``, ``buf[0:4].view(2, 2)``)
    collide."""

    def _loc_key(self, loc):
        return (loc.data_ptr(), loc.numel())


def forgets_invalidation(method: str) -> type:
    """A pool whose ``method`` (one of :data:`oracle.kernels.swa_pool.MUTATORS`) changes the
    mapping without invalidating the cache: a tensor translated before still gets the old
    translation after."""
    if method not in MUTATORS:
        raise ValueError(f"method={method!r} is not one of the mutating methods {', '.join(MUTATORS)}")

    def _mapping_changed(self, changed_by):
        if changed_by != method:
            SwaKVPool._mapping_changed(self, changed_by)

    name = "ForgetsInvalidateOn" + "".join(part.title() for part in method.split("_"))
    return type(name, (SwaKVPool,), {"_mapping_changed": _mapping_changed, "__module__": __name__,
                                     "__doc__": f"{method} does not invalidate the translation cache."})


ForgetsInvalidateOnFreeSwa = forgets_invalidation("free_swa")


def translate_wrapping_negatives(mapping: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """Plain ``mapping[loc]`` with only the upper bound checked: -1 reaches the sentinel, but -2
    wraps to ``mapping[-2]`` (the last full slot's SWA slot) instead of raising."""
    translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the mapping and dtype checks
    if bool((loc >= mapping.numel() - 1).any()):
        raise ValueError("loc reaches past the table")
    return mapping[loc.long()]


class TranslateWrapsNegative(SwaKVPool):
    """Translates by plain indexing: -2 wraps to ``mapping[-2]`` instead of raising."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.translate_fn = translate_wrapping_negatives


class FreeClearsOnlyToken(SwaKVPool):
    """``free`` clears the mapping of the named slots only, not of their whole pages: the rest of
    a freed page still maps into the freed SWA page."""

    def _clear_mapping(self, pages, full_slots):
        self.full_to_swa_index_mapping[full_slots.to(torch.int64)] = 0


@dataclass(frozen=True)
class PoolMutant:
    name: str
    bug: str  # one line
    cls: type


POOL_MUTANTS = (
    PoolMutant("swa_pool.keyed_on_storage_base", "caches keyed on the storage's base pointer, not "
               "data_ptr(): views at different offsets of one buffer collide", KeyedOnStorageBase),
    PoolMutant("swa_pool.forgets_invalidate_on_free_swa", "free_swa changes the mapping without "
               "invalidating the cache: an earlier translation is served stale",
               ForgetsInvalidateOnFreeSwa),
    PoolMutant("swa_pool.translate_wraps_negative", "translates by plain indexing: -2 wraps to "
               "mapping[-2] instead of raising", TranslateWrapsNegative),
    PoolMutant("swa_pool.free_clears_only_token", "free clears the mapping of the freed tokens only, "
               "not of their whole pages", FreeClearsOnlyToken),
    PoolMutant("swa_pool.keyed_on_data_ptr_and_numel", "caches keyed on (data_ptr, numel) only: same "
               "start and length, other strides or shape collide", KeyedOnDataPtrAndNumel),
)

__all__ = ["FreeClearsOnlyToken", "ForgetsInvalidateOnFreeSwa", "KeyedOnDataPtrAndNumel",
           "KeyedOnStorageBase", "POOL_MUTANTS", "PoolMutant", "TranslateWrapsNegative",
           "forgets_invalidation", "translate_wrapping_negatives"]
