"""Hypotheses about how far along its rows a kernel reads and writes: rows copied past their end
(one element or byte, whole 16-byte vectors, heads in unmasked tiles), short of it (no tail loop),
or with the other source's row width.

Derived from the case's views alone, as the hypotheses of :mod:`.generic` are, which lists these
among its own.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..buffers import contiguous_strides
from .hypothesis import Hypothesis, alternatives_text, by_role


VECTOR_LENGTHS = (4, 8, 16, 32, 64)  # elements per step of a vector loop along a row


def vector_tails(width: int) -> list[tuple[int, int]]:
    """(vector, whole) for each vector length that leaves a tail of its own in a row of ``width``
    elements: ``whole`` elements in whole vectors, ``width - whole`` in the scalar tail."""
    out, seen = [], set()
    for vector in VECTOR_LENGTHS:
        whole = width - width % vector
        if 0 < whole < width and whole not in seen:
            seen.add(whole)
            out.append((vector, whole))
    return out


def width_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    """Two sources whose rows differ in width, each with the cache of its own width: each one's
    rows copied with the other's width (a kernel that takes one row width for both), from its own
    row starts, in its own row strides or in the other's."""
    sources = [v for v in by_role(views, "source") if len(v.shape) == 3]
    caches = [views[n] for n in written if n in views and len(views[n].shape) == 3]
    if len(sources) != 2 or len(caches) != 2 or sources[0].shape[-1] == sources[1].shape[-1]:
        return []
    pair = {s.name: next((c for c in caches if c.shape[1:] == s.shape[1:]), None) for s in sources}
    if None in pair.values() or pair[sources[0].name] is pair[sources[1].name]:
        return []
    out = []
    for src, other in (sources, sources[::-1]):
        cache, other_cache = pair[src.name], pair[other.name]
        flat = int(np.prod(other.shape[1:]))
        for (s_stride, c_stride), how in (((src.strides[0], cache.strides[0]), "its own row strides"),
                                          ((other.strides[0], other_cache.strides[0]), f"{other.name}'s row strides")):
            out.append(Hypothesis("cache_strides_swapped", f"{src.name}'s rows copied with {other.name}'s row width "
                                  f"({flat} elements where they hold {int(np.prod(src.shape[1:]))}), with {how}",
                                  views={src.name: ((src.shape[0], 1, flat), (s_stride, flat, 1), src.offset),
                                         cache.name: ((cache.shape[0], 1, flat), (c_stride, flat, 1), cache.offset)}))
    return out


VECTOR_BYTES = 16  # the widest plain vector store


def overrun_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    """Rows copied past or short of their end: one element or one byte past (an inclusive loop
    bound over elements or over bytes), in whole 16-byte vectors with no tail loop, each row's
    bytes rounded up to a multiple of 16 (read past the source row and written past the cache row)
    or rounded down (the row's tail never written). Flat [S, H, D] caches with packed rows only; each source and its cache by their own
    row width (K's and V's may differ)."""
    caches = [views[n] for n in written if n in views]
    rows = caches + by_role(views, "source")
    if not caches or any(len(v.shape) != 3 for v in rows):
        return []
    if any(v.strides[1:] != contiguous_strides(v.shape[1:]) for v in rows):
        return []
    itemsize = caches[0].itemsize
    if any(v.itemsize != itemsize for v in rows):
        return []
    width = {v.name: int(np.prod(v.shape[1:])) for v in rows}
    vector = VECTOR_BYTES // itemsize if VECTOR_BYTES % itemsize == 0 else 0

    def rows_of(new_width) -> dict:
        return {v.name: ((v.shape[0], 1, new_width(width[v.name])), (v.strides[0], new_width(width[v.name]), 1), v.offset)
                for v in rows}

    widths = sorted(set(width.values()))
    shown = " and ".join(str(w) for w in widths)
    out = [Hypothesis("row_overrun", f"each row copied one element past its end (rows of {shown} elements: an "
                      "inclusive loop bound, j <= width)", views=rows_of(lambda w: w + 1))]
    if itemsize > 1:  # a byte loop's inclusive bound: one byte past the row, over all of it or
        # over the tail a 16-byte vector body leaves (a loop that runs only where there is one)
        byte_loops = [(set(width), "copied as bytes")]
        tailed = {name for name, w in width.items() if w * itemsize % VECTOR_BYTES}
        if tailed and tailed != set(width):
            byte_loops.append((tailed, f"whose length is not a multiple of {VECTOR_BYTES} bytes, the tail "
                                       "after the whole vectors copied as bytes"))
        for past, how in byte_loops:
            out.append(Hypothesis("row_overrun", f"each row {how} one byte past its end (rows of "
                                  f"{' and '.join(str(b) for b in sorted({width[n] * itemsize for n in past}))} bytes, an inclusive "
                                  "bound, j <= row_bytes: the byte after the row read from the source and written "
                                  "into the cache)", views=_bytes_past(rows, width, itemsize, past)))
    if not vector or all(w % vector == 0 for w in widths):
        return out
    out.append(Hypothesis("row_overrun", f"each row copied as whole {VECTOR_BYTES}-byte vectors, past its end (rows of "
                          f"{' and '.join(str(w * itemsize) for w in widths)} bytes)",
                          views=rows_of(lambda w: -(-w // vector) * vector)))
    if all(w >= vector for w in widths):
        out.append(Hypothesis("row_tail_dropped", f"each row copied as whole {VECTOR_BYTES}-byte vectors only, the "
                              f"rest (no tail loop) left as it was (rows of {' and '.join(str(w * itemsize) for w in widths)} bytes)",
                              views=rows_of(lambda w: w // vector * vector)))
    return out


HEAD_TILES = (2, 4, 8)  # heads per program of a kernel that tiles the head axis


def head_tile_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    """Heads handled in tiles of T with no mask on the head index: where T does not divide H,
    each row's heads padded to a multiple of T, the extra heads read past each source row and
    written past each cache row (into the next token's heads, or the next block's). Sources
    [N, H, D] and caches whose last two axes are [H, D]."""
    caches = [views[n] for n in written if n in views]
    sources = [v for v in by_role(views, "source") if len(v.shape) == 3]
    if not caches or not sources or any(len(v.shape) not in (3, 4) for v in caches):
        return []
    heads = sources[0].shape[1]
    if any(v.shape[-2] != heads for v in sources + caches):
        return []
    out = []
    for tile in HEAD_TILES:
        padded = -(-heads // tile) * tile
        if padded == heads:
            continue
        out.append(Hypothesis("row_overrun", f"heads handled {tile} at a time with no mask on the head index: "
                              f"{padded} heads where there are {heads}, the extra ones read past each source row "
                              "and written past each cache row",
                              views={v.name: (v.shape[:-2] + (padded, v.shape[-1]), v.strides, v.offset)
                                     for v in sources + caches}))
    return out


ROW_TILES = (2, 4, 8, 16)  # (token, head) rows a program of a quantizing kernel handles


def _converted_rows(views: dict, written: tuple) -> tuple:
    """(the source, its outputs) of a kernel without an index that converts one source [N, H, D]
    row by row into outputs [N, H, W] (quantize_fp8, quantize_block); (None, []) for any other."""
    sources = by_role(views, "source")
    outputs = [views[n] for n in written if n in views]
    if (len(sources) != 1 or len(sources[0].shape) != 3 or not outputs or any(v.role == "index" for v in views.values())
            or any(len(v.shape) != 3 or v.shape[:2] != sources[0].shape[:2] for v in outputs)):
        return None, []
    return sources[0], outputs


def row_tile_hypotheses(views: dict, written: tuple, regions: dict) -> list[Hypothesis]:
    """A kernel without an index that handles the (token, head) rows of its source [N, H, D] in
    tiles of T, its loads masked and its stores not: where T does not divide N * H, the last
    tile's rows past the end are written too, as zero rows convert (codes 0 and a zero block's
    scale), into whatever follows each packed output [N, H, W] in its allocation."""
    source, outputs = _converted_rows(views, written)
    if source is None or any(v.strides != contiguous_strides(v.shape) for v in outputs):
        return []
    rows = source.shape[0] * source.shape[1]
    tiles: dict = {}  # rows written past the end -> the tile sizes that write that many
    for tile in ROW_TILES:
        if rows % tile:
            tiles.setdefault(-rows % tile, []).append(tile)
    out = []
    for extra, sizes in tiles.items():
        grown = {v.name: ((rows + extra, v.shape[-1]), (v.shape[-1], 1), v.offset) for v in outputs}
        if any(v.offset + (rows + extra) * v.shape[-1] * v.itemsize > regions[v.region].payload
               + regions[v.region].guard for v in outputs):
            continue

        def zero_rows(array, extra=extra):
            flat = array.reshape(-1, array.shape[-1])
            return np.concatenate([flat, np.zeros((extra, flat.shape[1]), array.dtype)])

        out.append(Hypothesis("row_overrun", f"(token, head) rows handled {alternatives_text(sizes)} at a time, "
                              f"loads masked and stores not: the last tile's {extra} rows past the end written as "
                              "zero rows convert", views=grown, inputs={source.name: zero_rows}))
    return out


WORD_BYTES = (2, 4, 8, 16)


def word_spill_hypotheses(views: dict, written: tuple, regions: dict) -> list[Hypothesis]:
    """A kernel without an index that converts its source [N, H, D] element for element into a
    packed byte output [N, H, D] and stores each (token, head) row as whole words of B bytes: where
    B does not divide D, the last word's padding (zeros) lands past the row's end, in the next
    row's first bytes (which that row's own store may write before or after) or past the output."""
    source, outputs = _converted_rows(views, written)
    if source is None or len(outputs) != 1:
        return []
    out_view, width = outputs[0], source.shape[-1]
    if out_view.shape != source.shape or out_view.itemsize != 1 or out_view.strides[-1] != 1:
        return []
    region = regions[out_view.region]
    out, seen = [], set()
    for word in WORD_BYTES:
        pad = -width % word
        wide = replace(out_view, shape=out_view.shape[:-1] + (width + pad,))
        if not pad or pad in seen or wide.extent()[1] > region.payload + region.guard:
            continue
        seen.add(pad)

        def padded(array, pad=pad):
            return np.concatenate([array, np.zeros(array.shape[:-1] + (pad,), array.dtype)], axis=-1)

        out.append(Hypothesis("row_overrun", f"each (token, head) row stored as whole {word}-byte words: the last "
                              f"word's {pad} padding bytes (zeros) written past the row's end, into what follows it "
                              "(the next row's first bytes, or past the output)",
                              views={out_view.name: (wide.shape, wide.strides, wide.offset)},
                              inputs={source.name: padded}))
    return out


def _bytes_past(rows: list, width: dict, itemsize: int, past: set) -> dict:
    """Packed rows re-addressed as bytes, one byte longer for the views named in ``past``."""
    out = {}
    for v in rows:
        length = width[v.name] * itemsize + (v.name in past)
        out[v.name] = ((v.shape[0], 1, length), (v.strides[0] * itemsize, length, 1), v.offset, None, "uint8")
    return out


def tail_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    """A vector loop of V elements along the last axis (a head's D) with no tail loop: the last
    ``D % V`` elements of every row never written, for each V that leaves a tail of its own
    (sources and caches of one last-axis width only)."""
    rows = [views[n] for n in written if n in views] + by_role(views, "source")
    if not written or not rows or len({v.shape[-1] for v in rows if v.shape}) != 1 or not rows[0].shape:
        return []
    width = rows[0].shape[-1]
    return [Hypothesis("row_tail_dropped", f"the last {width - whole} of every {width} elements along "
                       f"the last axis not written (a {vector}-element vector loop with no tail)",
                       views={v.name: (v.shape[:-1] + (whole,), v.strides, v.offset) for v in rows})
            for vector, whole in vector_tails(width)]


def prefix_hypotheses(arena, written: tuple, before: dict, after: dict) -> list[Hypothesis]:
    """Each row written only up to some byte K, the rest left as it was, with K read off the
    kernel's result (one past the last byte it changed in any row of a cache; a copy loop that
    stops short, its chunk offsets or its length counted in the wrong unit). Flat caches of
    packed rows, each source with the cache of its row width."""
    views = arena.views
    caches = [views[n] for n in written if n in views]
    rows = caches + by_role(views, "source")
    if not caches or any(len(v.shape) != 3 or v.strides[1:] != contiguous_strides(v.shape[1:]) for v in rows):
        return []
    reach = {}  # row bytes -> how far into its rows a cache of that width was written
    for v in caches:
        try:
            old, new = (np.ascontiguousarray(arena.numpy_view(s, v.name)).view(np.uint8).reshape(v.shape[0], -1)
                        for s in (before, after))
        except ValueError:  # a sparse cache
            return []
        changed = np.flatnonzero((old != new).any(axis=0))
        if changed.size:
            reach[old.shape[1]] = max(reach.get(old.shape[1], 0), int(changed[-1]) + 1)
    itemsize = caches[0].itemsize
    widths = {v.name: int(np.prod(v.shape[1:])) * itemsize for v in rows}
    if not reach or all(k == width for width, k in reach.items()) or any(w not in reach for w in widths.values()):
        return []
    shown = ", ".join(f"{k} of {width}" for width, k in sorted(reach.items()))
    return [Hypothesis("row_tail_dropped", f"each row written only up to byte {shown}, the rest left as it was (a "
                       "copy loop that stops short: its chunk offsets or its length counted in the wrong unit)",
                       views={v.name: ((v.shape[0], 1, reach[widths[v.name]]), (v.strides[0] * itemsize,
                                       reach[widths[v.name]], 1), v.offset, None, "uint8") for v in rows})]


def head_prefix_hypotheses(arena, written: tuple, before: dict, after: dict) -> list[Hypothesis]:
    """Each head (a row of the last axis) written only up to element K, the rest left as it was,
    with K read off the kernel's result (one past the last element it changed along that axis in
    any cache): a copy of each head whose length is counted in another unit (D elements of 2 bytes
    for a head of 4-byte elements). Sources and caches of one last-axis width; none where K is what
    a vector loop without a tail leaves (:func:`tail_hypotheses` has it)."""
    views = arena.views
    caches = [views[n] for n in written if n in views]
    rows = caches + by_role(views, "source")
    if not caches or any(not v.shape for v in rows) or len({v.shape[-1] for v in rows}) != 1:
        return []
    width = rows[0].shape[-1]
    reach = 0
    for v in caches:
        try:
            old, new = (np.ascontiguousarray(arena.numpy_view(s, v.name)) for s in (before, after))
        except ValueError:  # a sparse cache
            return []
        if old.size == 0:
            continue
        as_bytes = [a.reshape(-1, width).view(np.uint8).reshape(-1, width, a.itemsize) for a in (old, new)]
        changed = np.flatnonzero((as_bytes[0] != as_bytes[1]).any(axis=(0, 2)))
        if changed.size:
            reach = max(reach, int(changed[-1]) + 1)
    if not 0 < reach < width or reach in {whole for _, whole in vector_tails(width)}:
        return []
    itemsize = caches[0].itemsize
    unit = next((f": {width} elements counted as {e}-byte ones, {reach * itemsize} bytes of {width * itemsize}"
                 for e in (1, 2, 4, 8) if e != itemsize and reach * itemsize == width * e), "")
    return [Hypothesis("row_tail_dropped", f"each head's first {reach} of its {width} elements written, the rest "
                       f"left as it was (a copy whose length is counted in another unit{unit})",
                       views={v.name: (v.shape[:-1] + (reach,), v.strides, v.offset) for v in rows})]
