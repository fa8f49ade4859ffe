"""Block-scaled KV writes: one name per format, its knobs, and the paged write with its scale cache.

Formats (:data:`FORMATS`): ``"mxfp8_e4m3fn"`` and ``"mxfp8_e5m2"`` (:mod:`.mx`: blocks of 32,
E8M0 scales) and ``"nvfp4"`` (:mod:`.nvfp4`: blocks of 16, e4m3fn scales, a per-tensor float32
scale, two e2m1 codes per byte). Blocks run along each head's D elements and never straddle
heads; the last block of a head is shorter when D is not a multiple of the block.

The paged write, :func:`reshape_and_cache_block`, is vLLM's ``reshape_and_cache_flash`` with a
block-scaled cache: the element codes go to ``[num_blocks, block_size, H, Dc]`` caches (``Dc`` =
D, or D / 2 for NVFP4) and the scale bytes to a scale cache in one of :data:`SCALE_LAYOUTS`:

- ``"linear"``: ``[num_blocks, block_size, H, ceil(D / block)]``;
- ``"swizzled"``: ``[num_blocks, page_bytes]``, one page per cache block holding the matrix of
  ``R = block_size * H`` rows (row ``token * H + head``) by ``C = ceil(D / block)`` columns in
  cuBLAS's 128x4 tiled layout of block-scaling factors (the layout Blackwell's block-scaled MMA
  reads, as TensorRT-LLM and FlashInfer store NVFP4 scale factors): ``page_bytes = roundup(R,
  128) * roundup(C, 4)``, entry ``(r, c)`` at :func:`swizzled_offsets`. Bytes of a page that no
  entry maps to are never written.
"""

from __future__ import annotations

from dataclasses import fields

import numpy as np

from . import _validate as v
from . import mx, nvfp4
from .slots import last_writers, parse_policies, plan_slots, with_collisions, write_rows

FORMATS = {  # name -> (family, element format, block)
    "mxfp8_e4m3fn": ("mx", "e4m3fn", mx.BLOCK),
    "mxfp8_e5m2": ("mx", "e5m2", mx.BLOCK),
    "nvfp4": ("nvfp4", "e2m1", nvfp4.BLOCK),
}
SCALE_LAYOUTS = ("linear", "swizzled")
PRESETS = {**{name: "mx" for name in mx.MX_PRESETS}, **{name: "nvfp4" for name in nvfp4.NVFP4_PRESETS}}
_FAMILY_KNOBS = {"mx": {f.name for f in fields(mx.MxKnobs)},
                 "nvfp4": {f.name for f in fields(nvfp4.Nvfp4Knobs)}}


def require_format(fmt) -> tuple:
    """(family, element format, block) of block format ``fmt``."""
    v.require_choice("fmt", fmt, tuple(FORMATS))
    return FORMATS[fmt]


def knobs_for(fmt: str, preset: str | None = None, **knobs):
    """The knobs (:class:`mx.MxKnobs` or :class:`nvfp4.Nvfp4Knobs`) a writer of ``fmt`` uses when
    it declares ``preset`` and ``knobs`` for every block format it writes: a preset of the other
    family, and knobs only the other family has, leave this format's defaults alone; a knob
    neither family has is a TypeError."""
    family = require_format(fmt)[0]
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"preset={preset!r} is not a block-scaling preset; expected one of {sorted(PRESETS)}")
    unknown = set(knobs) - _FAMILY_KNOBS["mx"] - _FAMILY_KNOBS["nvfp4"]
    if unknown:
        raise TypeError(f"unknown block-scaling knob(s): {sorted(unknown)}")
    own = {k: value for k, value in knobs.items() if k in _FAMILY_KNOBS[family]}
    own_preset = preset if preset is not None and PRESETS[preset] == family else None
    if family == "mx":
        return mx.mx_knobs(own_preset, **own)
    return nvfp4.nvfp4_knobs(own_preset, **own)


def code_width(fmt: str, head_size: int) -> int:
    """Bytes of element codes per head of ``head_size`` elements."""
    family = require_format(fmt)[0]
    return head_size // 2 if family == "nvfp4" else head_size


def scale_count(fmt: str, head_size: int) -> int:
    """Scale bytes per head: one per block, the last one partial."""
    return -(-head_size // require_format(fmt)[2])


def quantize_block(x, fmt: str, global_scale=1.0, *, preset: str | None = None, scales=None,
                   nan_block_codes=None, **knobs) -> tuple[np.ndarray, np.ndarray]:
    """(codes, scales) of ``x`` (float32, float16 or bfloat16, blocks along the last axis) in
    block format ``fmt``: codes uint8 ``x.shape[:-1] + (code_width,)``, scales uint8
    ``x.shape[:-1] + (scale_count,)``. ``global_scale`` is NVFP4's per-tensor scale (MX ignores
    it). ``preset`` and ``knobs`` as :func:`knobs_for` resolves them. ``scales``: scale codes to
    use where they differ from the computed ones, and (MX) ``nan_block_codes``: the element codes
    of NaN-scaled blocks, for the diagnosis (:func:`mx.quantize_mxfp8`)."""
    family, element, block = require_format(fmt)
    resolved = knobs_for(fmt, preset, **knobs)
    as_dict = {f.name: getattr(resolved, f.name) for f in fields(resolved)}
    if family == "mx":
        return mx.quantize_mxfp8(x, element, block=block, scales=scales, nan_block_codes=nan_block_codes,
                                 **as_dict)
    return nvfp4.quantize_nvfp4(x, global_scale, block=block, scales=scales, **as_dict)


def swizzled_page_bytes(rows: int, cols: int) -> int:
    """Bytes of one page of the 128x4 tiled layout holding a ``rows`` x ``cols`` scale matrix."""
    return (-(-rows // 128) * 128) * (-(-cols // 4) * 4)


SWIZZLE_FAULTS = ("col_tiles_floor", "tiles_column_major", "rows_not_interleaved")
ROWS_HEAD_MAJOR = "rows_head_major"  # a fault of the paged write's row order, not of the tile layout
PADDING_COLUMNS = "padding_columns_zeroed"  # a fault of the paged write: each row's 4 columns stored whole


def swizzled_offsets(rows: int, cols: int, fault: str | None = None) -> np.ndarray:
    """int64 ``[rows, cols]``: the byte of entry ``(r, c)`` within its page,
    ``((r // 128) * (Cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4``
    with ``Cp = roundup(cols, 4)``: 128-row x 4-column tiles of 512 bytes in row-major tile
    order, each storing its rows 32 apart interleaved (cuBLAS, "1D block scaling factors
    layout").

    ``fault`` (never a real layout; the diagnosis replays them to name a bug, see
    :data:`SWIZZLE_FAULTS`): ``"col_tiles_floor"``, the column tiles counted as ``cols // 4``
    (rounded down); ``"tiles_column_major"``, the tiles in column-major order; and
    ``"rows_not_interleaved"``, a tile's rows stored in order, ``(r % 128) * 4 + c % 4``."""
    r = np.arange(rows, dtype=np.int64)[:, None]
    c = np.arange(cols, dtype=np.int64)[None, :]
    if fault is not None:
        v.require_choice("fault", fault, SWIZZLE_FAULTS)
    col_tiles = cols // 4 if fault == "col_tiles_floor" else -(-cols // 4)
    if fault == "tiles_column_major":
        tile = (c // 4) * -(-rows // 128) + r // 128
    else:
        tile = (r // 128) * col_tiles + c // 4
    inside = (r % 128) * 4 if fault == "rows_not_interleaved" else (r % 32) * 16 + ((r % 128) // 32) * 4
    return tile * 512 + inside + c % 4


def reshape_and_cache_block(key_cache, value_cache, key_scale_cache, value_scale_cache,
                            slot_mapping, key, value, *, fmt: str, k_global_scale=1.0,
                            v_global_scale=1.0, scale_layout: str = "linear",
                            padding="negative", duplicates="forbid", preset=None, swizzle_fault=None,
                            given_scales=None, **knobs):
    """The four caches after writing token ``i`` of ``key``/``value`` to slot
    ``slot_mapping[i]`` in block format ``fmt``.

    ``key``, ``value``: ``[T, H, D]``, one float dtype; only the first ``len(slot_mapping)``
    tokens are written. ``key_cache``, ``value_cache``: uint8 ``[num_blocks, block_size, H,
    code_width(fmt, D)]`` (logical NHD order; an HND cache is passed as its NHD-ordered view).
    Scale caches: uint8, ``[num_blocks, block_size, H, scale_count(fmt, D)]`` (``"linear"``) or
    ``[num_blocks, page_bytes]`` with ``page_bytes >= swizzled_page_bytes(block_size * H,
    scale_count)`` (``"swizzled"``). Slot ``s`` is token ``s % block_size`` of block ``s //
    block_size``; ``padding`` and ``duplicates`` as in :mod:`oracle.reference.slots` (a padded
    slot writes neither codes nor scales). Returns ``(key_cache, value_cache, key_scale_cache,
    value_scale_cache)``, new arrays (or :class:`~oracle.reference.slots.OneOfRows` where a slot
    is written twice under ``duplicates="any"``; in a swizzled scale cache the slot's "row" is its
    scattered scale bytes). Inputs are never modified. ``swizzle_fault``: a fault of the
    swizzled layout (:func:`swizzled_offsets`), ``"rows_head_major"`` (the page's row of
    token t, head h taken as ``h * block_size + t`` where it is ``t * H + h``) or
    ``"padding_columns_zeroed"`` (each written row's group of 4 columns stored whole, its padding
    columns ``[C, roundup(C, 4))`` as zeros), for the diagnosis. ``given_scales``: for K and
    for V, (scale codes ``[T, H, scale_count]``, element codes ``[T, H, code_width]`` or None),
    what a kernel wrote, read back per token: its scales used where they differ from the
    computed ones, and its codes kept in NaN-scaled MX blocks (:func:`quantize_block`), for the
    diagnosis.
    """
    parse_policies(padding, duplicates)
    require_format(fmt)
    v.require_choice("scale_layout", scale_layout, SCALE_LAYOUTS)
    if swizzle_fault is not None:
        v.require_choice("swizzle_fault", swizzle_fault, SWIZZLE_FAULTS + (ROWS_HEAD_MAJOR, PADDING_COLUMNS))
    arrays = (("key_cache", key_cache), ("value_cache", value_cache),
              ("key_scale_cache", key_scale_cache), ("value_scale_cache", value_scale_cache),
              ("slot_mapping", slot_mapping), ("key", key), ("value", value))
    for name, array in arrays:
        v.require_array(name, array)
    v.require_index("slot_mapping", slot_mapping)
    for name, array in (("key", key), ("value", value)):
        if array.ndim != 3:
            raise ValueError(f"{name} must be 3-D [T, H, D], got shape {array.shape}")
        v.require_float_input(name, array)
    v.require_same_dtype("value", value, "key", key)
    v.require_shape("value", value, (value.shape[0],) + key.shape[1:], "heads and head size from key")
    heads, head_size = key.shape[1:]
    if require_format(fmt)[0] == "nvfp4" and head_size % 2:
        raise ValueError(f"key has head size {head_size}; nvfp4 packs two codes per byte, so it must be even")
    for name, array in (("key_cache", key_cache), ("value_cache", value_cache)):
        if array.ndim != 4:
            raise ValueError(f"{name} must be 4-D [num_blocks, block_size, H, Dc], got shape {array.shape}")
    num_blocks, block_size = key_cache.shape[:2]
    codes_shape = (num_blocks, block_size, heads, code_width(fmt, head_size))
    for name, array in (("key_cache", key_cache), ("value_cache", value_cache)):
        v.require_shape(name, array, codes_shape, f"{fmt} codes of key {key.shape}")
        v.require_dtype(name, array, (np.uint8,), f" ({fmt} stores codes as bytes)")
    count = scale_count(fmt, head_size)
    rows = block_size * heads
    for name, array in (("key_scale_cache", key_scale_cache), ("value_scale_cache", value_scale_cache)):
        v.require_dtype(name, array, (np.uint8,), " (scale bytes)")
        if scale_layout == "linear":
            v.require_shape(name, array, (num_blocks, block_size, heads, count), "linear scale cache")
        elif array.ndim != 2 or array.shape[0] != num_blocks or array.shape[1] < swizzled_page_bytes(rows, count):
            raise ValueError(f"{name} has shape {array.shape}; a swizzled scale cache is [num_blocks="
                             f"{num_blocks}, page_bytes >= {swizzled_page_bytes(rows, count)}]")
    for name, array in (("key", key), ("value", value)):
        if array.shape[0] < len(slot_mapping):
            raise ValueError(f"{name} has {array.shape[0]} tokens but slot_mapping has "
                             f"{len(slot_mapping)} entries")
    knobs_for(fmt, preset, **knobs)
    for name, scale in (("k_global_scale", k_global_scale), ("v_global_scale", v_global_scale)):
        try:
            quantize_block(np.zeros((0, 2), np.float32), fmt, scale, preset=preset, **knobs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None
    plan = plan_slots("slot_mapping", slot_mapping, num_blocks * block_size, padding=padding,
                      duplicates=duplicates)
    out = []
    scales_out = []
    givens = given_scales if given_scales is not None else (None, None)
    for cache, scale_cache, source, gs, given in ((key_cache, key_scale_cache, key, k_global_scale, givens[0]),
                                                  (value_cache, value_scale_cache, value, v_global_scale, givens[1])):
        given, given_codes = (None, None) if given is None else (a if a is None else np.asarray(a)[plan.positions]
                                                                for a in given)
        if knobs.get("tail_amax", "own") == "own" or given is not None:  # given scales: no amax is read
            codes, scales = quantize_block(source[plan.positions], fmt, gs, preset=preset, scales=given,
                                           nan_block_codes=given_codes, **knobs)
        else:  # a row's last block reads the next source row, written or not: quantize them all
            codes, scales = (a[plan.positions] for a in quantize_block(source, fmt, gs, preset=preset, **knobs))
        out.append(write_rows(cache.copy(), plan, codes, slot_axes=(0, 1)))
        if scale_layout == "linear":
            scales_out.append(write_rows(scale_cache.copy(), plan, scales, slot_axes=(0, 1)))
            continue
        if swizzle_fault == ROWS_HEAD_MAJOR:  # the row of (token, head) taken as head * block_size + token
            offsets = swizzled_offsets(rows, count).reshape(heads, block_size, count).transpose(1, 0, 2)
        elif swizzle_fault == PADDING_COLUMNS:  # the padding columns of each written row as zeros
            padded = -(-count // 4) * 4
            offsets = swizzled_offsets(rows, padded).reshape(block_size, heads, padded)
            scales = np.concatenate([scales, np.zeros(scales.shape[:-1] + (padded - count,), np.uint8)], axis=-1)
        else:
            offsets = swizzled_offsets(rows, count, swizzle_fault).reshape(block_size, heads, count)
        scales_out.append(_write_swizzled(scale_cache.copy(), plan, scales, offsets, block_size,
                                          in_order=swizzle_fault is not None))
    return out[0], out[1], scales_out[0], scales_out[1]


def _write_swizzled(out: np.ndarray, plan, scales: np.ndarray, offsets: np.ndarray, block_size: int,
                    in_order: bool = False):
    """Slot ``plan.slots[j]``'s scales ``scales[j]`` (``[H, nb]``) into its page's swizzled
    bytes ``offsets[token]``, as write_rows does for rows: each slot written once, by its last
    position; where a slot is written twice, a OneOfRows whose row is that slot's scale bytes.
    ``in_order``: the slots written one by one in the order of their positions, so where a
    faulty layout maps two slots' scales to one byte, the later position's wins."""
    last = last_writers(plan)
    if in_order:
        last = np.sort(last)
        for j in last:
            page, token = divmod(int(plan.slots[j]), block_size)
            out[page, offsets[token]] = scales[j]
        return with_collisions(out, plan, scales,
                               lambda slot: (int(slot) // block_size, offsets[int(slot) % block_size]))
    pages, tokens = np.divmod(plan.slots[last], block_size)
    out[pages[:, None, None], offsets[tokens]] = scales[last]
    return with_collisions(out, plan, scales,
                           lambda slot: (int(slot) // block_size, offsets[int(slot) % block_size]))
