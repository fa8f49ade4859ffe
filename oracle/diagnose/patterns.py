"""The pattern of a difference, for failures no hypothesis explains: which slots, heads and
elements differ, which rows were written that should stay untouched, which were left untouched
that should have been written, and which guard bands were hit."""

from __future__ import annotations

import numpy as np

from ..reference.slots import differing_elements

SHOWN = 6  # slots listed before "... (N more)"


def _ranges(indices) -> str:
    """``[0, 1, 2, 5, 7, 8]`` as ``0-2, 5, 7-8``."""
    indices = [int(i) for i in indices]
    out, start = [], None
    for k, i in enumerate(indices):
        if start is None:
            start = i
        if k + 1 == len(indices) or indices[k + 1] != i + 1:
            out.append(f"{start}" if start == i else f"{start}-{i}")
            start = None
    return ", ".join(out)


def _listed(indices) -> str:
    indices = list(indices)
    shown = ", ".join(str(int(i)) for i in indices[:SHOWN])
    return shown + (f", ... ({len(indices) - SHOWN} more)" if len(indices) > SHOWN else "")


def _rows(array: np.ndarray) -> np.ndarray:
    """The view as [slot, heads..., elements]: paged caches' block and token axes merged."""
    if array.ndim == 4:
        return array.reshape((array.shape[0] * array.shape[1],) + array.shape[2:])
    return array if array.ndim > 1 else array.reshape(-1, 1)


def describe_view(name: str, want: np.ndarray, got: np.ndarray, before: np.ndarray) -> list[str]:
    """Lines about one written view (the expected, actual and prior contents of its elements)."""
    want, got, before = _rows(want), _rows(got), _rows(before)
    differs = differing_elements(want, got)
    if not differs.any():
        return []
    slot_differs = differs.reshape(differs.shape[0], -1).any(axis=1)
    should_change = differing_elements(want, before)
    did_change = differing_elements(got, before)
    expected_rows = should_change.reshape(len(slot_differs), -1).any(axis=1)
    changed_rows = did_change.reshape(len(slot_differs), -1).any(axis=1)
    lines = [f"{name}: {int((slot_differs & expected_rows).sum())} of {int(expected_rows.sum())} "
             f"written slots differ"]
    stray = np.flatnonzero(changed_rows & ~expected_rows)
    if stray.size:
        lines.append(f"{name}: {stray.size} slot(s) written that should stay untouched: {_listed(stray)}")
    missed = np.flatnonzero(expected_rows & ~changed_rows)
    if missed.size:
        lines.append(f"{name}: {missed.size} slot(s) left untouched that should have been written: "
                     f"{_listed(missed)}")
    rows = differs[slot_differs]
    if differs.ndim == 3:  # [slot, head, element]
        heads = rows.any(axis=2)
        bad = np.flatnonzero(heads.any(axis=0))
        every = np.flatnonzero(heads.all(axis=0))
        if 0 < bad.size < heads.shape[1]:
            good = np.setdiff1d(np.arange(heads.shape[1]), bad)
            lines.append(f"{name}: heads {_ranges(bad)} of {heads.shape[1]} differ"
                         f"{' in every differing slot' if every.size == bad.size else ''}; "
                         f"head(s) {_ranges(good)} match")
    elements = rows.reshape(rows.shape[0], -1, rows.shape[-1]).any(axis=(0, 1))
    bad = np.flatnonzero(elements)
    if 0 < bad.size < elements.size:
        lines.append(f"{name}: element(s) {_ranges(bad)} of each row ({elements.size}) differ; the rest match")
    return lines + _values(name, want, got, before, differs)


def _values(name: str, want: np.ndarray, got: np.ndarray, before: np.ndarray, differs: np.ndarray) -> list[str]:
    """The commonest (expected, got) pairs of the differing elements, as raw hex: "0x7f -> 0xfe
    (40)" says NaN written as -max, "0x80 -> 0x00" -0 as +0, a NaN payload changed, a code one off."""
    width = want.dtype.itemsize
    if width not in (1, 2, 4, 8):
        return []
    as_int = f"<u{width}"
    w = np.ascontiguousarray(want).view(as_int)[differs]
    g = np.ascontiguousarray(got).view(as_int)[differs]
    untouched = g == np.ascontiguousarray(before).view(as_int)[differs]
    if width <= 4:  # one 64-bit key per pair: a plain sort, in the (expected, got) order np.unique's axis gives
        shift = np.uint64(8 * width)
        keys, counts = np.unique((w.astype(np.uint64) << shift) | g.astype(np.uint64), return_counts=True)
        pairs = np.stack([keys >> shift, keys & np.uint64((1 << 8 * width) - 1)])
    else:
        pairs, counts = np.unique(np.stack([w, g]), axis=1, return_counts=True)
    order = np.argsort(-counts, kind="stable")[:SHOWN // 2 + 1]
    shown = ", ".join(f"0x{int(pairs[0, i]):0{2 * width}x} -> 0x{int(pairs[1, i]):0{2 * width}x} ({int(counts[i])})"
                      for i in order)
    more = f", ... ({counts.size - order.size} more pairs)" if counts.size > order.size else ""
    left = f"; {int(untouched.sum())} of them left as they were" if untouched.any() else ""
    return [f"{name}: differing elements, expected -> got (count): {shown}{more}{left}"]


def describe(arena, before: dict, expected: dict, after: dict, written: tuple) -> list[str]:
    """The pattern lines of a failing case: each written view, then guard bands."""
    lines = []
    for name in written:
        if name not in arena.views:
            continue
        try:
            want, got = arena.numpy_view(expected, name), arena.numpy_view(after, name)
            prior = arena.numpy_view(before, name)
        except ValueError:  # a sparse view that does not pack evenly
            continue
        lines += describe_view(name, np.asarray(want), np.asarray(got), np.asarray(prior))
    for region, reg in arena.regions.items():
        if reg.sparse or not isinstance(after[region], np.ndarray):
            continue
        g = reg.guard
        for side, part in (("before", slice(0, g)), ("after", slice(g + reg.payload, None))):
            hit = np.flatnonzero(after[region][part] != before[region][part])
            if hit.size:
                lines.append(f"guard band {side} {region!r}: {hit.size} byte(s) written")
    return lines
