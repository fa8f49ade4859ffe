"""MLA latent-cache writes: one row per token holding the compressed KV (``nope``, ``kv_c``)
followed by the rotary part (``rope``, ``k_pe``).

``set_mla_kv_buffer`` is sglang's flat byte-copy writer; ``concat_and_cache_mla`` is vLLM's paged
writer with optional fp8 quantization.
"""

from __future__ import annotations

import numpy as np

from . import _validate as v
from .paged import cache_format, require_cache_dtype, row_encoder
from .slots import (SlotPlan, dcp_local_rows, parse_policies, plan_slots, require_dcp,
                    write_rows)


def _rows_2d(name: str, array: np.ndarray) -> np.ndarray:
    """``[N, w]`` from ``[N, w]`` or ``[N, 1, w]`` (sglang's single-head form)."""
    if array.ndim == 2 or (array.ndim == 3 and array.shape[1] == 1):
        return array.reshape(array.shape[0], array.shape[-1])
    raise ValueError(f"{name} must have shape [N, width] or [N, 1, width], got {array.shape}")


def set_mla_kv_buffer(kv_buffer, loc, nope, rope, *, padding="none", duplicates="forbid",
                      dcp_world=1, dcp_rank=0, dcp_modulo="truncate"):
    """The buffer after writing, for every non-skipped ``i``, ``nope[i]`` at elements ``[0, n)``
    and ``rope[i]`` at ``[n, n + r)`` of row ``loc[i]`` (``loc[i] div dcp_world`` under DCP).

    ``kv_buffer`` ``[S, W]`` or ``[S, 1, W]``; ``nope`` ``[N, n]`` or ``[N, 1, n]``; ``rope``
    ``[N, r]`` or ``[N, 1, r]``; one dtype for all three (uint8 byte layouts, e.g. 528 + 128 bytes
    of an fp8 row, included); offsets count elements of that dtype. ``W >= n + r``; elements past
    ``n + r`` are left as they were. ``padding`` (default "none") and ``duplicates`` as in
    :mod:`oracle.reference.slots`. Returns a new array, or a
    :class:`~oracle.reference.slots.OneOfRows` when a slot is actually written twice under
    ``duplicates="any"``. Inputs are never modified.

    Decode-context parallelism (``dcp_world > 1``): ``loc`` holds widened locs and ``kv_buffer``
    is rank ``dcp_rank``'s shard; see :func:`_dcp_plan` for the rules. ``dcp_world=1`` is the
    plain write.
    """
    parse_policies(padding, duplicates)
    require_dcp(dcp_world, dcp_rank, dcp_modulo)
    for name, array in (("kv_buffer", kv_buffer), ("loc", loc), ("nope", nope), ("rope", rope)):
        v.require_array(name, array)
    v.require_index("loc", loc)
    if not (kv_buffer.ndim == 2 or (kv_buffer.ndim == 3 and kv_buffer.shape[1] == 1)):
        raise ValueError(f"kv_buffer must have shape [S, W] or [S, 1, W], got {kv_buffer.shape}")
    nope_rows, rope_rows = _rows_2d("nope", nope), _rows_2d("rope", rope)
    for name, rows in (("nope", nope_rows), ("rope", rope_rows)):
        if rows.shape[0] != len(loc):
            raise ValueError(f"{name} has {rows.shape[0]} rows but loc has {len(loc)} entries")
        v.require_same_dtype(name, rows, "kv_buffer", kv_buffer)
    width = nope_rows.shape[1] + rope_rows.shape[1]
    if kv_buffer.shape[-1] < width:
        raise ValueError(f"kv_buffer rows have {kv_buffer.shape[-1]} elements, fewer than nope "
                         f"({nope_rows.shape[1]}) + rope ({rope_rows.shape[1]}) = {width}")
    if dcp_world == 1:
        plan = plan_slots("loc", loc, kv_buffer.shape[0], padding=padding, duplicates=duplicates)
    else:
        plan = _dcp_plan(loc, kv_buffer.shape[0], padding, duplicates, dcp_world, dcp_rank,
                         dcp_modulo)

    rows = np.concatenate([nope_rows[plan.positions], rope_rows[plan.positions]], axis=1)
    rows = rows.reshape((-1,) + kv_buffer.shape[1:-1] + (width,))  # [m, 1, n + r] for 3-D buffers
    region = (slice(None),) * (kv_buffer.ndim - 2) + (slice(0, width),)
    return write_rows(kv_buffer.copy(), plan, rows, row_region=region)


def _dcp_plan(loc, num_rows: int, padding, duplicates, world: int, rank: int,
              modulo: str) -> SlotPlan:
    """Which positions write which local rows of rank ``rank``'s shard of ``num_rows`` rows, in
    this order: (1) the padding policy applies to the widened loc (``"reserved:K"`` skips loc
    ``K``, ``"negative"`` every negative loc); (2) of the rest, a loc is kept iff
    ``loc mod world == rank`` under ``modulo`` (:func:`~oracle.reference.slots.dcp_local_rows`),
    and every other loc is skipped whatever its value (it belongs to another rank); (3) a kept loc
    writes row ``loc div world``, which must lie in ``[0, num_rows)``: otherwise ``ValueError``
    naming the position, the loc and the rule (the oracle does not model out-of-bounds writes);
    (4) the duplicates policy applies to the rows.
    """
    policy = parse_policies(padding, duplicates)
    locs = loc.astype(np.int64)
    selected, rows = dcp_local_rows(locs, world, rank, modulo)
    # The shard's locs span num_rows * world: a reserved K past them is not skipped, as at width 1.
    selected &= ~policy.skipped(locs, num_rows * world)
    bad = np.flatnonzero(selected & ((rows < 0) | (rows >= num_rows)))
    if len(bad):
        i = bad[0]
        more = f"; {len(bad) - 1} more position(s) are out of range too" if len(bad) > 1 else ""
        raise ValueError(f"loc[{i}] = {locs[i]} is kept by dcp_rank={rank} ({locs[i]} mod {world} "
                         f"= {rank} under dcp_modulo={modulo!r}) but names row {locs[i]} div "
                         f"{world} = {rows[i]}, out of range [0, {num_rows}) under "
                         f"padding={str(policy)!r}{policy.note()}{more}")
    # Skipped positions become -1, which plan_slots' "negative" policy skips: it then checks the
    # duplicates on the rows, exactly as at width 1.
    local = np.where(selected, rows, -1)
    return plan_slots("loc", local, num_rows, padding="negative", duplicates=duplicates)


def concat_and_cache_mla(kv_cache, slot_mapping, kv_c, k_pe, *, kv_cache_dtype="auto", scale=1.0,
                         padding="negative", duplicates="forbid", preset=None, **fp8_knobs):
    """The cache after writing ``concat(kv_c[i], k_pe[i])`` to slot ``slot_mapping[i]``.

    ``kv_cache`` ``[num_blocks, block_size, rank + rope]`` (the last dim must be exactly
    ``rank + rope``, as vLLM checks); ``kv_c`` ``[T, rank]``, ``k_pe`` ``[T, rope]``, one dtype;
    only the first ``len(slot_mapping)`` tokens are written (``T`` may be larger, as in
    :func:`~oracle.reference.paged.reshape_and_cache_flash`). Slot ``s`` is token
    ``s % block_size`` of block ``s // block_size``.

    ``kv_cache_dtype`` as in ``reshape_and_cache_flash``; with fp8 both parts are quantized with
    the one per-tensor ``scale`` (a number or a float32 array of size 1; per-head scales are
    rejected: the latent row has no heads). ``padding`` (default "negative") and ``duplicates``
    as in :mod:`oracle.reference.slots`. Returns a new array or a
    :class:`~oracle.reference.slots.OneOfRows`. Inputs are never modified.
    """
    parse_policies(padding, duplicates)
    fmt = cache_format(kv_cache_dtype)
    arrays = (("kv_cache", kv_cache), ("slot_mapping", slot_mapping), ("kv_c", kv_c),
              ("k_pe", k_pe))
    for name, array in arrays:
        v.require_array(name, array)
    v.require_index("slot_mapping", slot_mapping)
    for name, array, rank in (("kv_cache", kv_cache, 3), ("kv_c", kv_c, 2), ("k_pe", k_pe, 2)):
        if array.ndim != rank:
            raise ValueError(f"{name} must be {rank}-D, got shape {array.shape}")
    num_tokens = len(slot_mapping)
    for name, array in (("kv_c", kv_c), ("k_pe", k_pe)):
        if array.shape[0] < num_tokens:
            raise ValueError(f"{name} has {array.shape[0]} tokens but slot_mapping has "
                             f"{num_tokens} entries")
    width = kv_c.shape[1] + k_pe.shape[1]
    if kv_cache.shape[2] != width:
        raise ValueError(f"kv_cache has entries of {kv_cache.shape[2]} elements; expected kv_c "
                         f"({kv_c.shape[1]}) + k_pe ({k_pe.shape[1]}) = {width}")
    v.require_same_dtype("k_pe", k_pe, "kv_c", kv_c)
    require_cache_dtype(fmt, "kv_cache", kv_cache, "kv_c", kv_c)
    if isinstance(scale, np.ndarray) and scale.size > 1:
        raise ValueError(f"scale has shape {scale.shape}; concat_and_cache_mla takes one "
                         "per-tensor scale (shape (), (1,) or a number)")
    encode = row_encoder(fmt, {"scale": scale}, preset, fp8_knobs, (width,))["scale"]
    num_blocks, block_size = kv_cache.shape[:2]
    plan = plan_slots("slot_mapping", slot_mapping, num_blocks * block_size, padding=padding,
                      duplicates=duplicates)

    rows = np.concatenate([kv_c[plan.positions], k_pe[plan.positions]], axis=1)
    return write_rows(kv_cache.copy(), plan, encode(rows), slot_axes=(0, 1))
