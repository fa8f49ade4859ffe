"""Comparison of a kernel's memory with the reference's, and the words that explain a difference.

Plain writes are compared bit for bit over whole regions (guard bands included); fp8 caches as
codes, exactly, unless the contract declares a tolerance. A difference is reported at the first
differing byte: which view and element (slot, row, byte), expected and got in hex and as a value,
how many slots differ, or which guard band was written.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .buffers import NUMPY_DTYPES, Arena, SparseBytes, ViewSpec, numpy_view, read_bytes
from .reference.slots import OneOfRows, whole_rows


@dataclass
class Difference:
    text: str  # the whole explanation, several lines
    first: dict  # machine-readable first difference, for reports
    off_by: int = 0  # fp8 within-tolerance count, when that is all that differs


def expected_regions(arena: Arena, before: dict, after: dict, expected: dict) -> tuple[dict, list[str]]:
    """``before`` with the reference's results written into each cache view. For OneOfRows, a
    duplicated slot takes the kernel's row when that row is one of the allowed ones, so the byte
    comparison then only flags disallowed rows; the reasons for those come back as strings."""
    regions = {name: data.copy() for name, data in before.items()}
    problems = []
    for name, outcome in expected.items():
        view = arena.numpy_view(regions, name)
        if isinstance(outcome, OneOfRows):
            actual = arena.numpy_view(after, name)
            reason = outcome.check(np.array(actual))
            if reason:
                problems.append(f"{name}: {reason}")
            view[...] = outcome.resolve(np.array(actual)) if not reason else outcome.base
        else:
            view[...] = outcome
    return regions, problems


def mixed_slots(arena: Arena, after: dict, expected: dict, groups: tuple) -> list[str]:
    """Duplicated slots whose views in one of ``groups`` (views a slot writes together, such as a
    token's codes and their block scales) each hold a whole colliding row, but no single source
    position's in all of them: a row torn across views (codes from one token, scales from
    another). One reason per such slot."""
    problems = []
    for group in groups:
        chosen: dict = {}
        for name in group:
            outcome = expected.get(name)
            if not isinstance(outcome, OneOfRows):
                continue
            actual = np.array(arena.numpy_view(after, name))
            for c in outcome.collisions:
                chosen.setdefault(c.slot, []).append((name, whole_rows(np.asarray(actual[c.index]), c)))
        for slot, picks in chosen.items():
            if len(picks) > 1 and all(p for _, p in picks) and not set.intersection(*(p for _, p in picks)):
                held = "; ".join(f"{name} from position(s) {sorted(p)}" for name, p in picks)
                problems.append(f"torn row across views: duplicated slot {slot} holds {held}")
    return problems


def first_difference(arena: Arena, expected: dict, after: dict) -> Difference | None:
    for name, want in expected.items():
        where, count = differing_bytes(want, after[name])
        if count:
            return _describe(arena, name, int(where[0]), count, want, after[name])
    return None


def differing_bytes(want, got) -> tuple[np.ndarray, int]:
    """Region offsets of differing bytes (at least the first), and how many differ."""
    if not isinstance(want, SparseBytes):
        where = np.flatnonzero(want != got)
        return where, int(where.size)
    packed = np.flatnonzero(want.data != got.data)
    window = np.searchsorted(want.bases, packed, side="right") - 1
    inside = want.starts[window] + packed - want.bases[window]
    stray = np.array([offset for offset, _ in got.stray], np.int64)
    return np.sort(np.concatenate([inside, stray])), int(packed.size) + got.stray_count


def _describe(arena: Arena, region: str, byte: int, count: int, want, got) -> Difference:
    reg = arena.regions[region]
    payload_offset = byte - reg.guard
    lines = []
    first = {"region": region, "byte": payload_offset, "differing_bytes": count}
    in_guard = payload_offset < 0 or payload_offset >= reg.payload
    views = [v for v in arena.views.values() if v.region == region]
    owner = _owner(views, payload_offset)
    if in_guard:
        side = "before" if payload_offset < 0 else "after"
        distance = -payload_offset if payload_offset < 0 else payload_offset - reg.payload + 1
        lines.append(f"guard band written: {distance} byte(s) {side} the payload of region {region!r} "
                     f"({count} guard/payload bytes differ in all)")
        first["guard"] = side
    if owner is not None:
        spec, index, within = owner
        first.update(view=spec.name, index=list(index), byte_in_element=within)
        element = f"{spec.name}[{', '.join(map(str, index))}]"
        exp, act = _element(want, reg.guard, spec, index), _element(got, reg.guard, spec, index)
        lines.append(f"first difference at {element} byte {within}: expected {exp}, got {act}")
        first.update(expected=exp, got=act)
        if not 0 <= index[0] < spec.shape[0]:
            past = index[0] >= spec.shape[0]
            how = ("a row past the last, as from a loop or tile bound past the row count, or an int32 offset "
                   "that wrapped" if past else "a row before the first, as from a negative slot or an int32 "
                   "offset that wrapped")
            lines.append(f"row {index[0]} lies outside {spec.name} (shape {list(spec.shape)}): an "
                         f"address computed past the view: {how}")
        if not in_guard:
            rows = _rows_differing(arena, region, spec, want, got)
            lines.append(f"{rows[0]} of {rows[1]} {'slots' if spec.role == 'cache' else 'rows'} of "
                         f"{spec.name} differ")
            first["rows_differing"] = rows[0]
            if spec.role != "cache":
                lines.append(f"{spec.name} is an input ({spec.role}): the kernel modified it")
    else:
        lines.append(f"first difference at byte {payload_offset} of region {region!r}: expected "
                     f"0x{read_bytes(want, byte, 1)[0]:02x}, got 0x{read_bytes(got, byte, 1)[0]:02x} "
                     f"(outside every view; {count} bytes differ in all)")
    return Difference("\n".join(lines), first)


def _owner(views: list[ViewSpec], offset: int):
    """The view and element index a payload byte offset belongs to, extending a view's first axis
    past its ends so that "row -1 of k_cache" can be named."""
    best = None
    for spec in views:
        if not spec.shape or 0 in spec.shape:
            continue
        rel = offset - spec.offset
        rest = rel
        order = sorted(range(len(spec.shape)), key=lambda i: -abs(spec.strides[i]))
        itemsize = spec.itemsize
        coords = [0] * len(spec.shape)
        for axis in order:
            stride_bytes = spec.strides[axis] * itemsize
            if stride_bytes == 0:
                continue
            q = rest // stride_bytes
            if axis != 0:
                q = min(max(q, 0), spec.shape[axis] - 1)
            coords[axis] = int(q)
            rest -= q * stride_bytes
        if not 0 <= rest < itemsize:
            continue
        inside = all(0 <= c < n for c, n in zip(coords, spec.shape))
        score = (inside, spec.role == "cache")
        if best is None or score > best[0]:
            best = (score, (spec, tuple(coords), int(rest)))
    return None if best is None else best[1]


def _element(region_bytes, guard: int, spec: ViewSpec, index) -> str:
    dtype = NUMPY_DTYPES[spec.dtype]
    start = guard + spec.offset + sum(i * s for i, s in zip(index, spec.strides)) * dtype.itemsize
    size = region_bytes.size if isinstance(region_bytes, (np.ndarray, SparseBytes)) else 0
    if start < 0 or start + dtype.itemsize > size:
        return "(outside the allocation)"
    raw = np.ascontiguousarray(read_bytes(region_bytes, start, dtype.itemsize))
    value = raw.view(dtype)[0]
    hexes = "0x" + raw[::-1].tobytes().hex()
    if dtype.kind in "ui":
        return f"{hexes} ({int(value)})"
    return f"{hexes} ({float(value):.6g})"


def _rows_differing(arena: Arena, region: str, spec: ViewSpec, want: np.ndarray, got: np.ndarray):
    a = numpy_view(want, spec, arena.regions[region].guard)
    b = numpy_view(got, spec, arena.regions[region].guard)
    if a.ndim == 0:
        return int(not np.array_equal(a.view(np.uint8), b.view(np.uint8))), 1
    diff = np.ascontiguousarray(a).view(np.uint8).reshape(a.shape[0], -1) != \
        np.ascontiguousarray(b).view(np.uint8).reshape(b.shape[0], -1)
    return int(diff.any(axis=1).sum()), a.shape[0]
