"""Hypotheses about the arithmetic a kernel does on slot numbers: a slot carried through float32
(a float index tensor, an embedding lookup, a ``.float()`` for a division), which holds every
integer only up to 2**24, so an odd slot past it lands on an even neighbour; a paged block
index from a float division, ``floor(float(slot) / block_size)``, with the offset in the block
from the exact remainder; and a slot kept in 16 bits (a 32-bit sort key ``slot << 16 | position``
built in an int32 index's dtype, an int16 or uint16 table), which holds slots only below 2**15 or
2**16.

Derived from the case's index alone, as the hypotheses of :mod:`.generic` are, which lists these
among its own.
"""

from __future__ import annotations

import numpy as np

from ..reference.slots import FLOAT32_EXACT
from .hypothesis import ANY_DUPLICATES, Hypothesis, by_role


def through_float32(entries: np.ndarray) -> np.ndarray:
    """``entries`` (int) as a round trip through float32 leaves them (nearest, ties to even);
    negative ones (padding, tested before) as they are. A ValueError (nothing to replay) where
    every entry is exact."""
    wide = entries.astype(np.int64)
    out = np.where(wide >= 0, wide.astype(np.float32).astype(np.int64), wide)
    if np.array_equal(out, wide):
        raise ValueError(f"every entry is exact in float32 (none past {FLOAT32_EXACT})")
    return out.astype(entries.dtype)


def _block_by_float_division(entries: np.ndarray, block_size: int) -> np.ndarray:
    """The slot a paged write lands on with its block from ``floor(float32(slot) / block_size)``
    and its offset from ``slot % block_size``; negative entries as they are."""
    wide = entries.astype(np.int64)
    with np.errstate(invalid="ignore"):
        block = np.floor(wide.astype(np.float32) / np.float32(block_size)).astype(np.int64)
    out = np.where(wide >= 0, block * block_size + wide % block_size, wide)
    if np.array_equal(out, wide):
        raise ValueError(f"every block index is exact in float32 (no slot past {FLOAT32_EXACT})")
    return out.astype(entries.dtype)


def float_slot_hypotheses(views: dict, prepared, block_size: int | None) -> list[Hypothesis]:
    """For an index holding slots past 2**24: each slot through float32, and (``block_size``, a
    paged cache's) the block index from a float division."""
    out = []
    for index in by_role(views, "index"):
        entries = prepared.numpy(index.name)
        if entries.size == 0 or int(np.max(entries)) <= FLOAT32_EXACT:
            continue
        out.append(Hypothesis("slots_through_float", f"{index.name}'s slots carried through float32 (odd slots "
                              f"past 2^24 rounded to an even neighbour)", inputs={index.name: through_float32},
                              override=ANY_DUPLICATES))
        if block_size:
            out.append(Hypothesis("slots_through_float", f"the block index computed as floor(float(slot) / "
                                  f"{block_size}) in float32 (slots past 2^24 rounded first: a neighbouring "
                                  "block), the offset in the block from the exact remainder",
                                  inputs={index.name: lambda a, b=block_size: _block_by_float_division(a, b)},
                                  override=ANY_DUPLICATES))
    return out


SLOT_BITS = 16  # the narrow slot field of a packed 32-bit key (slot << 16 | position) or a 16-bit table


def narrowed(entries: np.ndarray, num_slots: int, signed: bool, wrap: bool) -> np.ndarray:
    """``entries``' slots kept in 16 bits: their low 16 bits, sign-extended where ``signed``; a
    negative result wrapped from the cache's end where ``wrap`` (torch indexing) else dropped, and
    one past the cache dropped (a bounds check); negative entries (padding) as they are. A
    ValueError (nothing to replay) where no slot changes."""
    wide = entries.astype(np.int64)
    low = wide & ((1 << SLOT_BITS) - 1)
    if signed:
        low = np.where(low >= 1 << (SLOT_BITS - 1), low - (1 << SLOT_BITS), low)
    landed = np.where((low < 0) & wrap, low + num_slots, low)
    landed = np.where((landed < 0) | (landed >= num_slots), -1, landed)
    out = np.where(wide >= 0, landed, wide)
    if np.array_equal(out, wide):
        raise ValueError(f"every slot fits {SLOT_BITS} bits")
    return out.astype(entries.dtype)


def narrowed_slot_hypotheses(views: dict, prepared, num_slots: int | None) -> list[Hypothesis]:
    """For an index holding slots past 2**15: each slot kept in 16 bits, sign-extended (a negative
    one wrapped from the cache's end, as torch indexing does, or dropped) or not."""
    out = []
    if not num_slots:
        return out
    for index in by_role(views, "index"):
        entries = prepared.numpy(index.name)
        if entries.size == 0 or int(np.max(entries)) < 1 << (SLOT_BITS - 1):
            continue
        for signed, wrap, how in ((True, True, "sign-extended, a negative one wrapped from the cache's end as "
                                   "torch indexing wraps it"),
                                  (True, False, "sign-extended, a negative one dropped"),
                                  (False, False, "unsigned")):
            out.append(Hypothesis("slots_narrowed", f"{index.name}'s slots kept in {SLOT_BITS} bits ({how}): a "
                                  f"packed 32-bit key slot << {SLOT_BITS} | position built in the index's int32, or "
                                  f"an int16/uint16 slot table, so slots past 2^{SLOT_BITS - 1 if signed else SLOT_BITS} "
                                  "land on others", inputs={index.name: lambda a, s=signed, w=wrap: narrowed(a, num_slots, s, w)},
                                  override=ANY_DUPLICATES))
    return out
