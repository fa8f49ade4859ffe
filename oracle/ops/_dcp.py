"""Widened locs for a kernel that declares a DCP shard (``dcp_world > 1``, set_mla_kv_buffer).

Under decode-context parallelism the caller passes every rank the same widened locs; rank ``r`` of
``W`` keeps those with ``loc mod W == r`` and writes row ``loc div W`` of its shard. A case's
entries are drawn as local rows of the shard; :func:`widen` turns them into the locs that rank
must keep, and mixes in locs it must leave alone.
"""

from __future__ import annotations

import numpy as np

from ..buffers import NUMPY_DTYPES
from ..contract import Contract
from ..reference.slots import Padding, dcp_local_rows

LARGE_NEGATIVE = -(2**31 - 1)  # the most negative loc whose magnitude fits int32


def loc_of(row: int, contract: Contract) -> int:
    """The widened loc this rank keeps as local ``row`` (``row`` itself at width 1)."""
    return row * contract.dcp_world + contract.dcp_rank


def widen(rng: np.random.Generator, entries: np.ndarray, contract: Contract, index_dtype: str, *,
          padding: str | None = None, negatives: bool = False, keep=()) -> np.ndarray:
    """``entries`` (int64 local rows; padding entries under the case's ``padding`` policy) as
    widened locs for the contract's rank: a new array; ``entries`` itself when ``dcp_world == 1``
    (and no random numbers drawn, so width-1 cases build exactly as before).

    Padding entries stay as they are: the policy applies to the widened loc. Every other entry
    becomes ``loc_of(row)``; about half of those not in ``keep`` (positions whose rows must be
    written) become the same row of another rank instead, so a kernel that ignores the rank
    writes rows that must stay untouched. Under ``"reserved:K"`` one kept entry is moved to local
    row ``K``, so a kernel comparing ``K`` with the local row instead of the widened loc skips a
    row it must write (at rank 0 with ``K = 0`` that loc is ``K`` itself, which is skipped).

    ``negatives`` (the ``dcp`` case class) also mixes in negative locs this rank must skip
    (:func:`legal_negatives`): -1, -2, -W, the nearest negative loc that floor modulo gives this
    rank (truncate gives it to none), :data:`LARGE_NEGATIVE` and the index dtype's minimum.
    """
    world = contract.dcp_world
    if world == 1:
        return entries
    policy = Padding.parse(padding) if padding else Padding("none")
    rows = entries.astype(np.int64)
    real = ~policy.skipped(rows, np.iinfo(np.int64).max)
    out = rows.copy()
    out[real] = loc_of(rows[real], contract)
    free = rng.permutation(np.setdiff1d(np.flatnonzero(real), np.asarray(keep, dtype=np.int64)))
    if policy.kind == "reserved" and len(free):
        # no kept entry names row K (K is the padding value), so moving one there adds no duplicate
        out[free[-1]] = loc_of(policy.reserved, contract)
        free = free[:-1]
    others = free[: len(free) // 2]
    shift = rng.integers(1, world, size=len(others))  # to another rank, same row
    out[others] = rows[others] * world + (contract.dcp_rank + shift) % world
    if negatives:
        spots = free[len(free) // 2: len(free) // 2 + max(len(free) // 8, 1)]
        pool = legal_negatives(contract, index_dtype)
        if len(pool) and len(spots):
            out[spots] = np.resize(rng.permutation(pool), len(spots))  # each one before repeats
    return out


def legal_negatives(contract: Contract, index_dtype: str) -> np.ndarray:
    """The negative locs :func:`widen` mixes in that the contract's rank leaves unselected (all of
    them when the contract's padding is ``"negative"``, which skips them first)."""
    world, rank = contract.dcp_world, contract.dcp_rank
    low = int(np.iinfo(NUMPY_DTYPES[index_dtype]).min)
    candidates = np.array(sorted({-1, -2, -world, rank - world, LARGE_NEGATIVE, low}), dtype=np.int64)
    if contract.padding == "negative":
        return candidates
    selected, _ = dcp_local_rows(candidates, world, rank, contract.dcp_modulo)
    return candidates[~selected]
