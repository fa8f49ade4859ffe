"""Hypotheses about how a kernel resolves which entry writes a slot: a duplicate-resolution table
indexed by the slot modulo its size, which lets distinct slots that collide there overwrite each
other's claim, so all but one of them go unwritten.

Derived from the case's index and contract alone, as the hypotheses of :mod:`.generic` are, which
lists these among its own.
"""

from __future__ import annotations

import numpy as np

from ..reference.slots import Padding
from .hypothesis import Hypothesis, by_role

TABLE_SIZES = tuple(1 << bits for bits in range(8, 17))  # 256 .. 65536 entries


def winner_table_hypotheses(views: dict, prepared, contract) -> list[Hypothesis]:
    """For a kernel that takes duplicated slots (``duplicates="any"``): each entry claims
    ``table[slot % size]`` (the highest position wins, as an ``atomicMax`` of positions does) and
    only the winner writes, so an entry whose distinct slot collides with a later entry's goes
    unwritten. Each table size that makes distinct slots collide in the case's index is one
    hypothesis; its losers are replayed as skipped entries."""
    if contract.duplicates != "any":
        return []
    out = []
    for index in by_role(views, "index"):
        entries = prepared.numpy(index.name).astype(np.int64)
        if entries.ndim != 1 or entries.size < 2:
            continue
        real = ~Padding.parse(contract.padding).skipped(entries, np.iinfo(np.int64).max) & (entries >= 0)
        positions = np.flatnonzero(real)
        seen = set()
        for size in TABLE_SIZES:
            keys = entries[positions] % size
            winner = np.full(size, -1, np.int64)
            np.maximum.at(winner, keys, positions)
            losers = positions[(winner[keys] != positions) & (entries[winner[keys]] != entries[positions])]
            if not losers.size or losers.tobytes() in seen:
                continue
            seen.add(losers.tobytes())
            skip = np.zeros(entries.shape, bool)
            skip[losers] = True
            skip |= ~real  # the contract's own padding stays skipped under the override
            out.append(Hypothesis("slot_table_collision", f"duplicates resolved through a table of {size} "
                                  f"entries indexed by slot % {size}: {losers.size} entries whose slots collide "
                                  "there with a later entry's distinct slot are not written",
                                  inputs={index.name: lambda a, skip=skip: np.where(skip, -1, a).astype(a.dtype)},
                                  override={"padding": "negative"}))
    return out
