"""Sliding-window (SWA) full->SWA index translation, and a pure model of the SWA allocator.

Hybrid models keep two KV pools: a *full* pool for full-attention layers and a smaller *SWA* pool
for sliding-window layers. sglang allocates every token in both and records, per full slot, which
SWA slot holds the same token in ``full_to_swa_index_mapping`` (``SWATokenToKVPoolAllocator`` in
``sglang/srt/mem_cache/allocator/swa.py``). Writers translate a full location to its SWA location
with ``SWAKVPool.translate_loc_from_full_to_swa`` (``mapping[loc]``); the DeepSeek-V4 pool has its
own copy of that translation.

The table has ``size_full + page_size`` entries (slot 0 is the reserved padding slot, so page 0 is
never handed out and unmapped slots translate to 0) followed by one ``-1`` *sentinel*, so that a
``last_loc`` of ``-1`` ("this request has no prefix") translates to ``-1``.

``translate_full_to_swa`` is deliberately stricter than the plain indexing it models: plain
indexing wraps ``-2`` to ``mapping[-2]`` (a real table entry) and lets index ``len - 1`` reach the
sentinel; here only ``-1`` may be negative, and the sentinel is reached only through ``-1``.
Triton consumers that load the table by pointer arithmetic do not even get the sentinel for
``-1`` (they read the word before the table), so a kernel that is stricter than this reference is
conformant on valid inputs only. Facts: ../shared/peer-semantics.md section 5; docs/semantics.md.

The allocator those tables come from is modelled in :mod:`.swa_model`. Everything here is pure
numpy: arrays in, new arrays out, inputs never mutated, every argument validated before anything
is computed.
"""

from __future__ import annotations

import numpy as np

from . import _validate as v

SENTINEL = -1


def _position(name: str, shape: tuple, flat_index: int) -> str:
    """'loc[3]' or 'loc[1, 2]' for the C-order flat index into an array of that shape."""
    if len(shape) == 0:
        return f"{name}[()]"
    idx = np.unravel_index(flat_index, shape)
    return f"{name}[{', '.join(str(int(i)) for i in idx)}]"


# --------------------------------------------------------------------------------------------
# the mapping and its translation


def make_swa_mapping(size_full: int, page_size: int) -> np.ndarray:
    """A fresh full->SWA table: int64 zeros of length ``size_full + page_size``, then one -1.

    Models ``SWATokenToKVPoolAllocator.__init__``. Zeros mean "unmapped" (slot 0 is the padding
    slot, so an unmapped full slot translates to the padding SWA slot); the trailing -1 is the
    sentinel reached by a loc of -1. ``size_full`` counts allocatable full slots and must be a
    positive multiple of the positive ``page_size``.
    """
    size_full = v.require_int("size_full", size_full, 1)
    page_size = v.require_int("page_size", page_size, 1)
    v.require_page_multiple("size_full", size_full, page_size)
    mapping = np.zeros(size_full + page_size + 1, dtype=np.int64)
    mapping[-1] = SENTINEL
    return mapping


def _require_mapping(mapping) -> None:
    v.require_array("mapping", mapping)
    v.require_dtype("mapping", mapping, v.INDEX_DTYPES)
    if mapping.ndim != 1:
        raise ValueError(f"mapping must be 1-D, got shape {mapping.shape}")
    if mapping.size == 0:
        raise ValueError("mapping is empty; it needs at least the trailing -1 sentinel")
    if mapping[-1] != SENTINEL:
        raise ValueError(
            f"mapping[-1] = {int(mapping[-1])} (mapping[{mapping.size - 1}]): the last entry must "
            "be the -1 sentinel that a loc of -1 translates through"
        )


def translate_full_to_swa(mapping: np.ndarray, loc: np.ndarray) -> np.ndarray:
    """``mapping[loc]``: the SWA slot of each full slot in ``loc``; -1 translates to -1.

    Models ``SWAKVPool.translate_loc_from_full_to_swa`` (sglang) and the DeepSeek-V4 pool's
    ``translate_loc_from_full_to_swa``, both plain advanced indexing, but stricter by contract:

    * ``-1`` reaches the trailing sentinel and returns -1 (a request with no prefix);
    * any other negative value raises ``ValueError`` (plain indexing would wrap it to a real
      entry, e.g. -2 to ``mapping[-2]``, the last full slot's SWA slot);
    * values ``>= len(mapping) - 1`` raise ``ValueError``: the table proper is entries
      ``[0, len(mapping) - 1)``, and the sentinel is reached only through -1.

    ``mapping``: 1-D int32 or int64 whose last element is -1. ``loc``: int32 or int64, any shape
    (2-D stays 2-D, as the DeepSeek-V4 tests require), any strides, may be empty. The result is a
    new array with ``loc``'s shape and ``mapping``'s dtype (sglang 0.5.23 returns int64, some
    versions and DeepSeek-V4 int32: pass the mapping dtype you want to compare against).
    Errors name the first offending position in C order.
    """
    _require_mapping(mapping)
    v.require_array("loc", loc)
    v.require_dtype("loc", loc, v.INDEX_DTYPES)
    table = mapping.size - 1  # entries [0, table) are the table proper, mapping[table] is -1
    flat = loc.reshape(-1).astype(np.int64)
    bad = np.flatnonzero(((flat < 0) & (flat != SENTINEL)) | (flat >= table))
    if bad.size:
        i = int(bad[0])
        value = int(flat[i])
        where = f"{_position('loc', loc.shape, i)} = {value}"
        if value < 0:
            raise ValueError(
                f"{where}: only -1 (the padding sentinel) may be negative; plain indexing would "
                f"wrap it to mapping[{value}]"
            )
        raise ValueError(
            f"{where}: past the table (entries 0..{table - 1}); mapping[{table}] is the "
            "sentinel, reached only through -1"
        )
    return mapping[flat].reshape(loc.shape)

