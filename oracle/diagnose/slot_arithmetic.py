"""Hypotheses about the arithmetic a kernel does on slot numbers: a slot carried through float32
(a float index tensor, an embedding lookup, a ``.float()`` for a division), which holds every
integer only up to 2**24, so an odd slot past it lands on an even neighbour; and a paged block
index from a float division, ``floor(float(slot) / block_size)``, with the offset in the block
from the exact remainder.

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
