"""Hypotheses that hold for every op: how a kernel misreads the index, the sources and the caches.

They are derived from the case's views alone (their roles, shapes, strides and offsets), so every
op gets them without describing them: an index read as if contiguous or from its storage's start,
sources read as if packed, one cache addressed with the other's strides, caches assumed dense, the
index read past its end; and those of :mod:`.row_bounds` (how far along its rows a kernel reads
and writes), :mod:`.source_values` (NaN bits, narrowed or flushed sources), :mod:`.padding`
(another padding policy, slot 0 skipped) and :mod:`.stale_inputs` (a second call reading the
first call's inputs).
"""

from __future__ import annotations

import functools

import numpy as np

from ..buffers import ViewSpec, contiguous_strides
from .hypothesis import ANY_DUPLICATES, GRID_DIMENSION_MAX, Hypothesis, by_role
from .padding import padding_hypotheses, zero_row_hypotheses
from .row_bounds import (head_tile_hypotheses, overrun_hypotheses, row_tile_hypotheses, tail_hypotheses,
                         width_hypotheses, word_spill_hypotheses)
from .slot_arithmetic import float_slot_hypotheses, narrowed_slot_hypotheses
from .slot_tables import winner_table_hypotheses
from .stale_inputs import stale_hypotheses
from .source_values import (arithmetic_copy_hypotheses, flushed_source_hypotheses, nan_bits_hypotheses,
                            narrowed_source_hypotheses)


TILES = (2, 4, 8, 16, 32, 64, 128, 256)  # rows per program of a grid sized n // tile


def dropped_counts(n: int) -> list[tuple[int, str]]:
    """How many trailing entries of ``n`` a short loop leaves unwritten, and why in words: 1 (a
    bound one short), the entries past the last whole tile of each grid sized ``n // tile``, a
    whole last tile where ``n`` is a multiple of it (its extent taken as ``n % tile``, 0), and past
    65535 entries those a grid clamped to 65535 or a 16-bit count leaves, smallest first."""
    out = {1: f"a loop bound of {n - 1} instead of {n}"}
    if n > GRID_DIMENSION_MAX:
        out[n - GRID_DIMENSION_MAX] = (f"the entries past the first {GRID_DIMENSION_MAX}: a grid dimension "
                                       "clamped to the most the y or z one holds")
        if n % 65536:
            out[n - n % 65536] = f"the entries past {n} mod 65536: a token count kept in 16 bits"
    for tile in reversed(TILES):
        if 0 < n % tile < n:
            out[n % tile] = f"the entries past the last whole tile of {tile}: a grid of n // tile programs"
        elif n % tile == 0 and tile < n:
            out.setdefault(tile, f"the last tile of {tile}, whose extent was taken as n % {tile}, which is 0 "
                                 f"for {n} entries")
    return sorted(out.items())


def index_hypotheses(arena) -> list[Hypothesis]:
    out = []
    views = arena.views
    for index in by_role(views, "index"):
        if index.strides != contiguous_strides(index.shape):
            out.append(Hypothesis("index_stride_ignored", f"{index.name} read as if contiguous "
                                  f"(its stride {index.strides[-1]} ignored)",
                                  views={index.name: (index.shape, contiguous_strides(index.shape), index.offset)},
                                  override=ANY_DUPLICATES))
        if len(index.shape) == 1 and index.strides[0] != 1:  # the stride counted in another element size
            for size in (4, 8):
                stride = index.strides[0] * size // index.itemsize
                if size != index.itemsize and stride * index.itemsize == index.strides[0] * size:
                    out.append(Hypothesis("index_stride_ignored", f"{index.name}'s stride {index.strides[0]} counted "
                                          f"in {size}-byte elements, its entries being {index.itemsize}-byte ones "
                                          f"(entry i read at element i * {stride})",
                                          views={index.name: (index.shape, (stride,), index.offset)},
                                          override=ANY_DUPLICATES))
        last_only = tuple(s * index.strides[-1] for s in contiguous_strides(index.shape))
        if len(index.shape) > 1 and index.strides[-1] != 1 and last_only != index.strides:
            out.append(Hypothesis("index_stride_ignored", f"{index.name} read through its last stride alone (flat "
                                  f"entry i at i * {index.strides[-1]}: its other strides ignored)",
                                  views={index.name: (index.shape, last_only, index.offset)}, override=ANY_DUPLICATES))
        start = -arena.regions[index.region].guard  # the storage starts at the leading guard band
        if index.offset != start:
            out.append(Hypothesis("index_offset_ignored", f"{index.name} read from its storage's "
                                  f"start (its storage offset of {(index.offset - start) // index.itemsize} "
                                  "elements ignored)",
                                  views={index.name: (index.shape, index.strides, start)},
                                  override=ANY_DUPLICATES))
            # the offset counted twice: a pointer from data_ptr(), which holds it, moved by it again
            out.append(Hypothesis("index_offset_ignored", f"{index.name}'s storage offset of "
                                  f"{(index.offset - start) // index.itemsize} elements applied twice (its data "
                                  "pointer, which holds the offset already, moved by it again)",
                                  views={index.name: (index.shape, index.strides, 2 * index.offset - start)},
                                  override=ANY_DUPLICATES))
        if index.itemsize == 8 and len(index.shape) == 1 and index.strides == contiguous_strides(index.shape):
            out.append(Hypothesis("index_dtype_misread", f"{index.name}'s int64 entries read as int32 (each "
                                  "entry's low and high words taken as two entries: slot, then 0 or -1)",
                                  inputs={index.name: _as_int32_words}, override=ANY_DUPLICATES))
        if index.itemsize == 8:
            out.append(Hypothesis("index_dtype_misread", f"{index.name}'s int64 entries truncated to int32 (their "
                                  "low word) before the padding test: a negative entry whose low word is a slot "
                                  "is written there", inputs={index.name: _truncated_to_int32}, override=ANY_DUPLICATES))
        if index.shape and index.shape[0] > 1 and len(index.shape) == 1:
            n = index.shape[0]
            for k, why in dropped_counts(n):
                what = f"the last {'entry' if k == 1 else f'{k} entries'} of {index.name} not written ({why})"
                out.append(Hypothesis("rows_dropped", what, views={index.name: ((n - k,), index.strides, index.offset)}))
    return out


def _truncated_to_int32(entries: np.ndarray) -> np.ndarray:
    """int64 ``entries`` as a cast to int32 leaves them (the low word, wrapped), as int64; a
    ValueError (no hypothesis to replay) where every entry fits int32 and nothing changes."""
    low = entries.astype(np.int32).astype(entries.dtype)
    if np.array_equal(low, entries):
        raise ValueError("every entry fits int32")
    return low


def _as_int32_words(entries: np.ndarray) -> np.ndarray:
    """The first ``len(entries)`` int32 words of int64 ``entries`` (little-endian), as int64."""
    return np.ascontiguousarray(entries).view(np.int32)[:entries.shape[0]].astype(entries.dtype)


def source_hypotheses(views: dict) -> list[Hypothesis]:
    strided = [v for v in by_role(views, "source") if v.strides != contiguous_strides(v.shape)]
    if not strided:
        return []
    names = ", ".join(v.name for v in strided)
    out = [Hypothesis("source_stride_ignored", f"the row stride of {names} ignored (rows read as if packed)",
                      views={v.name: (v.shape, contiguous_strides(v.shape), v.offset) for v in strided})]
    if len(strided) > 1:
        out += [Hypothesis("source_stride_ignored", f"the row stride of {v.name} ignored (its rows read "
                           "as if packed)", views={v.name: (v.shape, contiguous_strides(v.shape), v.offset)})
                for v in strided]
    inner = [v for v in strided if len(v.shape) > 2 and v.strides[1:] != contiguous_strides(v.shape[1:])]
    if inner:  # each row's base from its own stride, its elements then read as one run
        out.append(Hypothesis("source_stride_ignored", f"the inner strides of {', '.join(v.name for v in inner)} "
                              "ignored (each row read as one run of elements from its start: its heads taken as "
                              "adjacent, its row stride kept)",
                              views={v.name: (v.shape, (v.strides[0],) + contiguous_strides(v.shape[1:]), v.offset)
                                     for v in inner}))
    return out


def offset_hypotheses(arena, written: tuple) -> list[Hypothesis]:
    """A source's or a cache's storage offset ignored (its base pointer taken from the storage,
    as ``untyped_storage().data_ptr()`` gives it): each such tensor addressed from its storage's
    start, alone, and every cache at once."""
    out, caches = [], {}
    for view in arena.views.values():
        if view.role not in ("source", "cache") or (view.role == "cache" and view.name not in written):
            continue
        start = -arena.regions[view.region].guard  # the storage starts at the leading guard band
        if view.offset == start or not view.shape or 0 in view.shape:
            continue
        moved = {view.name: (view.shape, view.strides, start)}
        if view.role == "cache":
            caches.update(moved)
        out.append(Hypothesis("storage_offset_ignored", f"{view.name} addressed from its storage's start "
                              f"(its storage offset of {(view.offset - start) // view.itemsize} elements ignored)",
                              views=moved))
    if len(caches) > 1:
        out.append(Hypothesis("storage_offset_ignored", f"{' and '.join(caches)} addressed from their "
                              "storages' starts (their storage offsets ignored)", views=caches))
    return out + _scaled_offset_hypotheses(arena, written)


def _scaled_offset_hypotheses(arena, written: tuple) -> list[Hypothesis]:
    """Every cache's storage offset counted in another element size (the offset in elements times
    a source's element size, 2 or 4 bytes, where the cache's elements are 1 byte: a byte offset
    computed with the wrong type's size); the rows so moved past the allocation are not replayed."""
    sizes = {v.itemsize for v in by_role(arena.views, "source")}
    caches = [v for v in arena.views.values() if v.role == "cache" and v.name in written and v.shape and 0 not in v.shape]
    out = []
    for size in sorted(sizes):
        moved = {}
        for v in caches:
            start = -arena.regions[v.region].guard
            if size == v.itemsize or v.offset == start:
                continue
            moved[v.name] = (v.shape, v.strides, start + (v.offset - start) * size // v.itemsize)
        if moved:
            out.append(Hypothesis("storage_offset_ignored", f"{' and '.join(moved)}'s storage offsets counted in "
                                  f"{size}-byte elements (a source's element size) where theirs are "
                                  f"{caches[0].itemsize}-byte ones", views=moved))
    return out


def adjacency_hypotheses(views: dict) -> list[Hypothesis]:
    """A source read right after the one before it in their shared row (a fused-row fast path that
    assumes the layout instead of reading the source's own pointer), where something lies between."""
    out = []
    sources = sorted(by_role(views, "source"), key=lambda v: (v.region, v.offset))
    for a, b in zip(sources, sources[1:]):
        right_after = a.offset + int(np.prod(a.shape[1:])) * a.itemsize
        if a.region == b.region and a.shape and a.shape[0] == b.shape[0] and b.offset != right_after:
            out.append(Hypothesis("sources_assumed_adjacent", f"{b.name} read right after {a.name} in their fused "
                                  f"row (at byte {right_after - a.offset} of {a.name}'s row, not its own "
                                  f"{b.offset - a.offset})", views={b.name: (b.shape, b.strides, right_after)}))
    return out


def swapped_source_hypotheses(views: dict) -> list[Hypothesis]:
    """One source written where another belongs (K into the V cache)."""
    sources = by_role(views, "source")
    out = [Hypothesis("sources_swapped", f"{a.name} written in place of {b.name}",
                      views={b.name: (a.shape, a.strides, a.offset, a.region)})
           for a in sources for b in sources
           if a is not b and a.shape == b.shape and a.dtype == b.dtype]
    for a in sources:  # one source's row stride (one pitch computed for both) used for another's rows
        for b in sources:
            if a is not b and len(a.shape) == len(b.shape) > 1 and a.strides[0] != b.strides[0]:
                out.append(Hypothesis("source_stride_ignored", f"{b.name}'s rows read {a.strides[0]} elements "
                                      f"apart, {a.name}'s row stride (its own is {b.strides[0]}): one pitch "
                                      "computed for both", views={b.name: (b.shape, (a.strides[0],) + b.strides[1:],
                                                                           b.offset)}))
    return out


def cache_hypotheses(views: dict, written: tuple, paged_spec: bool = False) -> list[Hypothesis]:
    caches = [views[name] for name in written if name in views]
    out = []
    for a in caches:
        for b in caches:
            if a is not b and a.shape == b.shape and a.strides != b.strides:
                out.append(Hypothesis("cache_strides_swapped", f"{b.name} addressed with {a.name}'s "
                                      f"strides {list(a.strides)} (its own are {list(b.strides)})",
                                      views={b.name: (b.shape, a.strides, b.offset)}))
    paged = _paged_caches(views, written, paged_spec)
    block_size = paged[0].shape[1] if paged else 0
    if block_size & (block_size - 1):  # not a power of two: a shift and mask of the one below or above
        for wrong in (1 << (block_size.bit_length() - 1), 1 << block_size.bit_length()):
            out.append(_block_size_hypothesis(views, paged, wrong, "block_size_power_of_two",
                                              f"the block size taken as {wrong} (a shift and mask of a power of "
                                              f"two) where the cache's blocks hold {block_size}"))
            out += _shift_mask_mismatch(views, paged, block_size, wrong)
    if paged and paged[0].shape[1] != COMMON_BLOCK_SIZE:
        out.append(_block_size_hypothesis(views, paged, COMMON_BLOCK_SIZE, "block_size_hardcoded",
                                          f"the block size taken as {COMMON_BLOCK_SIZE} (a constant, or its "
                                          f"shift and mask) where the cache's blocks hold {paged[0].shape[1]}"))
    if paged and paged[0].shape[2] != paged[0].shape[1]:
        out.append(_block_size_hypothesis(views, paged, paged[0].shape[2], "block_size_wrong_dim",
                                          f"the block size taken from the heads dimension ({paged[0].shape[2]}) "
                                          f"instead of dimension 1 ({paged[0].shape[1]})"))
    undense = [c for c in caches if c.strides != contiguous_strides(c.shape)]
    if undense:
        out.append(Hypothesis("dense_cache_assumed", "the caches assumed dense in their logical "
                              f"[{', '.join(map(str, caches[0].shape[1:]))}] rows (strides ignored)",
                              views={c.name: (c.shape, contiguous_strides(c.shape), c.offset) for c in undense}))
    for b in caches:  # an output of its source's shape addressed with the source's (not dense) strides
        for a in by_role(views, "source"):
            if a.shape == b.shape and a.strides not in (b.strides, contiguous_strides(a.shape)):
                out.append(Hypothesis("cache_strides_swapped", f"{b.name} addressed with the source {a.name}'s "
                                      f"strides {list(a.strides)} (its own are {list(b.strides)}): one offset "
                                      "computed for both", views={b.name: (b.shape, a.strides, b.offset)}))
    return out


def _paged_caches(views: dict, written: tuple, paged_spec: bool) -> list[ViewSpec]:
    """The written caches that are paged: [blocks, block_size, heads, dim], or any cache of a
    paged op ([blocks, block_size, W] for MLA)."""
    caches = [views[name] for name in written if name in views]
    return [c for c in caches if len(c.shape) == 4 or (paged_spec and len(c.shape) >= 3)]


def _block_size(views: dict, written: tuple, paged_spec: bool) -> int | None:
    """The tokens per block of a paged op's caches (None for flat caches)."""
    paged = _paged_caches(views, written, paged_spec)
    return paged[0].shape[1] if paged else None


COMMON_BLOCK_SIZE = 16  # the block size kernels hard-code most


def _block_size_hypothesis(views: dict, paged: list, wrong: int, cause: str, text: str) -> Hypothesis:
    """Paged caches addressed with blocks of ``wrong`` tokens: slot s as token s % wrong of block
    s // wrong, in the caches' own strides."""
    block_size = paged[0].shape[1]
    blocks, inputs, dropped = -(-paged[0].shape[0] * block_size // wrong), {}, ""
    if wrong < block_size:
        # the misread block index runs past the cache's last block; what a kernel writes out
        # there is not modelled: the hypothesis takes those slots as dropped (a kernel that
        # bounds-checks its block index), and a kernel that writes them fails the guards
        blocks = paged[0].shape[0]
        inputs = {ix.name: (lambda a, limit=blocks * wrong: np.where(a >= limit, -1, a))
                  for ix in by_role(views, "index")}
        dropped = f"; slots past block {blocks - 1} so addressed were dropped"
    return Hypothesis(cause, text + dropped,
                      views={c.name: ((blocks, wrong) + c.shape[2:], c.strides, c.offset) for c in paged},
                      inputs=inputs)


def _shift_mask_mismatch(views: dict, paged: list, block_size: int, wrong: int) -> list[Hypothesis]:
    """A paged address split two ways: the block by ``slot // block_size`` and the token by ``slot &
    (wrong - 1)``, or the block by ``slot >> log2(wrong)`` and the token by ``slot % block_size``
    (one half of a shift-and-mask pair updated for a block size that is not a power of two). Each
    is replayed as the slot it lands on, ``block * block_size + token``; a slot past the cache is
    taken as dropped (a kernel that bounds-checks it)."""
    num_slots = paged[0].shape[0] * block_size
    shift = wrong.bit_length() - 1

    def landing(a, mask: bool):
        slots = a.astype(np.int64)
        block, token = (slots // block_size, slots & (wrong - 1)) if mask else (slots >> shift, slots % block_size)
        landed = block * block_size + token
        return np.where((a < 0) | (landed >= num_slots), np.minimum(a, -1), landed).astype(a.dtype)

    out = []
    for mask, text in ((True, f"the block as slot // {block_size} but the token as slot & {wrong - 1}"),
                       (False, f"the block as slot >> {shift} (blocks of {wrong}) but the token as slot % {block_size}")):
        out.append(Hypothesis("block_size_power_of_two", f"a shift and a mask that disagree: {text}, where the "
                              f"cache's blocks hold {block_size}",
                              inputs={ix.name: functools.partial(landing, mask=mask) for ix in by_role(views, "index")},
                              override={"duplicates": "any"}))
    return out


def index_past_end_hypotheses(views: dict, prepared) -> list[Hypothesis]:
    """The index read up to the sources' row count, where the sources have more rows."""
    out = []
    sources = by_role(views, "source")
    for index in by_role(views, "index"):
        rows = max((s.shape[0] for s in sources if s.shape), default=0)
        if index.shape and rows > index.shape[0]:
            out.append(Hypothesis("rows_past_index", f"{index.name} read past its end, to the sources' "
                                  f"{rows} rows (a grid sized from the sources, not from {index.name})",
                                  views={index.name: ((rows,) + index.shape[1:], index.strides, index.offset)},
                                  override=ANY_DUPLICATES))
    return out


def run_hypotheses(prepared) -> list[Hypothesis]:
    """An index whose ends are a run's (``last - first == n - 1``) but whose entries are not in
    order, taken as the run itself: a fast path that checks only the ends, then copies one slab."""
    out = []
    for index in by_role(prepared.arena.views, "index"):
        entries = prepared.numpy(index.name).astype(np.int64)
        if entries.ndim != 1 or entries.size < 3 or int(entries[-1]) - int(entries[0]) != entries.size - 1:
            continue
        run = entries[0] + np.arange(entries.size)
        if not np.array_equal(run, entries):
            out.append(Hypothesis("index_assumed_consecutive", f"{index.name} taken as the run {entries[0]}.."
                                  f"{entries[-1]} its ends span (one slab copied; the order inside not read)",
                                  inputs={index.name: lambda a, run=run: run.astype(a.dtype)}))
    return out


def hypotheses(spec, case, contract, prepared) -> list[Hypothesis]:
    """Every generic hypothesis for this case, most specific first."""
    views = prepared.arena.views
    block_size = _block_size(views, prepared.caches, getattr(spec, "paged", False))
    return (stale_hypotheses(prepared) + run_hypotheses(prepared)
            + padding_hypotheses(case, views, prepared, contract) + zero_row_hypotheses(views, prepared)
            + index_hypotheses(prepared.arena)
            + source_hypotheses(views) + offset_hypotheses(prepared.arena, prepared.caches)
            + adjacency_hypotheses(views) + nan_bits_hypotheses(case, views) + arithmetic_copy_hypotheses(case, views)
            + narrowed_source_hypotheses(case, views) + flushed_source_hypotheses(case, views)
            + swapped_source_hypotheses(views)
            + cache_hypotheses(views, prepared.caches, getattr(spec, "paged", False))
            + width_hypotheses(views, prepared.caches)
            + overrun_hypotheses(views, prepared.caches) + head_tile_hypotheses(views, prepared.caches)
            + row_tile_hypotheses(views, prepared.caches, prepared.arena.regions)
            + word_spill_hypotheses(views, prepared.caches, prepared.arena.regions)
            + tail_hypotheses(views, prepared.caches)
            + index_past_end_hypotheses(views, prepared)
            + winner_table_hypotheses(views, prepared, contract)
            + float_slot_hypotheses(views, prepared, block_size)
            + narrowed_slot_hypotheses(views, prepared, _slot_count(views, prepared.caches, block_size)))


def _slot_count(views: dict, written: tuple, block_size: int | None) -> int | None:
    """The slots of the first cache written: its rows, or its blocks x ``block_size`` when paged."""
    if not written or not views[written[0]].shape:
        return None
    rows = views[written[0]].shape[0]
    return rows * block_size if block_size else rows
