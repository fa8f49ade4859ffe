"""Flat row scatter: the contract of sglang's ``store_cache`` family.

Rows are copied as they are (any dtype, bitwise: fp8 pools are passed as uint8 byte rows), so this
is also the byte-level model of every "copy row i to slot loc[i]" kernel.
"""

from __future__ import annotations

from . import _validate as v
from .slots import parse_policies, plan_slots, write_rows


def store_cache(cache, loc, src, *, padding="none", duplicates="forbid"):
    """The cache after ``cache[loc[i]] = src[i]`` for every non-skipped ``i``.

    ``cache`` ``[S, *row]``, ``src`` ``[N, *row]`` of the same dtype, ``loc`` ``[N]`` int32 or
    int64. ``padding`` and ``duplicates`` are the policies of :mod:`oracle.reference.slots`
    (defaults: every slot in range, no duplicates). Returns a new array, or a
    :class:`~oracle.reference.slots.OneOfRows` when ``duplicates="any"`` and some slot is
    actually written twice. Inputs are never modified; bad arguments raise before anything is
    written.
    """
    parse_policies(padding, duplicates)
    for name, array in (("cache", cache), ("loc", loc), ("src", src)):
        v.require_array(name, array)
    v.require_index("loc", loc)
    if cache.ndim < 1:
        raise ValueError(f"cache must have a slot axis, got shape {cache.shape}")
    if cache.dtype.hasobject:
        raise TypeError(f"cache has dtype {cache.dtype}; rows are compared and copied as bytes")
    v.require_same_dtype("src", src, "cache", cache)
    v.require_shape("src", src, (len(loc),) + cache.shape[1:], "one cache row per loc entry")
    plan = plan_slots("loc", loc, cache.shape[0], padding=padding, duplicates=duplicates)
    return write_rows(cache.copy(), plan, src[plan.positions])
