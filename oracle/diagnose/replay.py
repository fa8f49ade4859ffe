"""Replaying one hypothesis: the reference, run again on the inputs as the kernel read them and
written into the caches as the kernel addressed them, compared with the kernel's memory.

A hypothesis's ``views`` re-address views of the case's arena (another shape, other strides,
another offset into the same region); its ``inputs`` replace what the kernel read from a view.
The expectation is then written through the re-addressed cache views into a copy of the memory
as it was before the call, element by element where the reference wrote, view after view as a
kernel writes its rows (so views that overlap, as a misaddressing kernel's do, compose), and the
hypothesis holds only if every byte of every region, guard bands included, matches.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..buffers import Arena
from ..compare import differing_bytes, expected_regions, first_difference
from ..ops.base import Prepared
from ..reference.slots import OneOfRows, differing_elements, element_bytes
from .hypothesis import Hypothesis


class _Readdressed(Arena):
    """The case's arena with some views re-addressed: ``(shape, strides, offset)`` in the view's
    own region, ``(shape, strides, offset, region)`` in another (the same bytes either way), and
    ``(shape, strides, offset, region, dtype)`` read as elements of another dtype (region None:
    its own), as a kernel that copies rows as bytes addresses them."""

    def __init__(self, arena: Arena, views: dict):
        self.__dict__.update(arena.__dict__)
        self.views = dict(arena.views)
        for name, (shape, strides, offset, *rest) in views.items():
            own = arena.views[name]
            region = rest[0] if rest and rest[0] is not None else own.region
            self.views[name] = replace(own, shape=tuple(shape), strides=tuple(strides), offset=int(offset),
                                       region=region, dtype=rest[1] if len(rest) > 1 else own.dtype)


class _AsRead(Prepared):
    """The prepared inputs as the kernel read them under a hypothesis."""

    def __init__(self, prepared: Prepared, arena: Arena, inputs: dict):
        super().__init__(arena, prepared.args, prepared.caches, prepared.before)
        self.inputs = inputs

    def numpy(self, name: str):
        array = super().numpy(name)
        return self.inputs[name](array) if name in self.inputs else array


def _flipped(array: np.ndarray) -> np.ndarray:
    """Every bit of ``array`` inverted: a prior content no written element can equal twice."""
    return np.invert(np.ascontiguousarray(array).view(np.uint8)).view(array.dtype).reshape(array.shape)


def _plain(outcome) -> np.ndarray:
    return outcome.base if isinstance(outcome, OneOfRows) else np.asarray(outcome)


def holds(hypothesis: Hypothesis, spec, case, contract, prepared: Prepared, after: dict,
          changed: dict | None = None) -> bool:
    """Whether the kernel's memory ``after`` is, byte for byte, the reference's result under
    ``hypothesis``. A hypothesis that cannot be replayed on this case (a view that leaves its
    region, knobs the reference rejects) does not hold. ``changed`` (:func:`changed_bytes` of the
    case, computed once for all its hypotheses) only saves time."""
    if not hypothesis.views:  # the case's own views, which never overlap: compare them whole
        return _holds_in_place(hypothesis, spec, case, contract, prepared, after)
    arena = _Readdressed(prepared.arena, hypothesis.views)
    flip = {name: _flipped for name in prepared.caches if name not in hypothesis.inputs}
    try:
        expected = spec.expected(_AsRead(prepared, arena, hypothesis.inputs), case, contract,
                                 **hypothesis.override)
        # the same call over bit-inverted caches: an element the reference writes differs from
        # its prior content in one of the two runs, whatever it holds
        inverted = spec.expected(_AsRead(prepared, arena, {**hypothesis.inputs, **flip}), case,
                                 contract, **hypothesis.override)
        writes = {}  # view -> (what it writes, which of its elements it writes)
        for name, outcome in expected.items():
            prior = arena.numpy_view(prepared.before, name)
            want = _plain(outcome)
            written = differing_elements(want, prior) | differing_elements(_plain(inverted[name]), _flipped(prior))
            if isinstance(outcome, OneOfRows):  # slots the misread index repeats: the kernel may
                # write them element by element from any of their rows (the comparison judges)
                want = outcome.resolve(np.array(arena.numpy_view(after, name)), torn=True)
            writes[name] = want, written
        verdict = _writes_match(arena, writes, prepared.before, after, changed)
        if verdict is not None:
            return verdict
        # written twice: in element order, and in reverse, since rows that overlap in memory (a
        # misaddressing kernel's) land in whatever order its threads finish
        orders = [{name: data.copy() for name, data in prepared.before.items()} for _ in range(2)]
        for name, (want, written) in writes.items():
            where = np.nonzero(written)
            for regions, index in zip(orders, (where, tuple(a[::-1] for a in where))):
                arena.numpy_view(regions, name)[index] = want[index]
    except (TypeError, ValueError, IndexError):
        return False
    forward, backward = orders
    if first_difference(prepared.arena, forward, after) is None:
        return True
    # overlapping rows: each byte must come from one order or the other
    return not any(_both_differ(forward[r], backward[r], after[r]) for r in after)


def changed_bytes(before: dict, after: dict) -> dict:
    """Each dense region's offsets of the bytes a call changed (sparse regions are left out)."""
    return {r: np.flatnonzero(before[r] != after[r]) for r in after
            if isinstance(after[r], np.ndarray) and isinstance(before[r], np.ndarray)}


def _writes_match(arena: Arena, writes: dict, before: dict, after: dict, changed: dict | None) -> bool | None:
    """The replay's verdict from the written elements alone, where no two of them share a byte:
    ``after`` must hold the written values where the reference writes and equal ``before``
    everywhere else (every changed byte is written). That costs the written and the changed
    bytes, not the regions; and where the views cannot overlap at all (their strides and extents
    say so), a few elements that differ end it. None where the writes overlap or a region is
    sparse: only replaying both write orders over whole regions can judge those."""
    if any(not isinstance(after[arena.views[n].region], np.ndarray)
           or not isinstance(before[arena.views[n].region], np.ndarray) for n in writes):
        return None
    if _disjoint([arena.views[n] for n in writes]):
        for name, (want, written) in writes.items():  # most hypotheses differ in their first rows
            head = _first_rows(written, _HEAD_ROWS)
            if differing_elements(want[head], arena.numpy_view(after, name)[head]).any():
                return False
    starts, mismatch = {}, False
    for name, (want, written) in writes.items():
        spec, where = arena.views[name], np.nonzero(written)
        mismatch = mismatch or bool(differing_elements(want[where], arena.numpy_view(after, name)[where]).any())
        start = np.full(where[0].shape, arena.regions[spec.region].guard + spec.offset, np.int64)
        for axis, stride in zip(where, spec.strides):
            start += axis.astype(np.int64) * (stride * spec.itemsize)
        starts.setdefault(spec.region, []).append((start, spec.itemsize))
    changed = changed if changed is not None else changed_bytes(before, after)
    uncovered = False
    for region, got in after.items():
        if region not in changed:
            return None
        covered = _cover(starts.get(region, []), got.size)
        if covered is None:
            return None
        mark, unit = covered
        uncovered = uncovered or not mark[changed[region] // unit].all()
    return not (mismatch or uncovered)


_HEAD_ROWS = 4  # rows (first-axis elements) checked first where no write can land on another


def _first_rows(written: np.ndarray, count: int) -> tuple:
    """The indices of the written elements in the first ``count`` rows that hold any."""
    if written.ndim < 2 or written.size == 0:  # a row is one element, or nothing is written
        return tuple(axis[:count] for axis in np.nonzero(written))
    rows = np.flatnonzero(written.reshape(written.shape[0], -1).any(axis=1))[:count]
    inner = np.nonzero(written[rows])
    return (rows[inner[0]],) + inner[1:]


def _disjoint(views: list) -> bool:
    """Whether no two elements of ``views`` share a byte, from their layout alone: each view's
    strides, sorted, step past everything the smaller ones span, and the views' extents in one
    region never meet."""
    for spec in views:
        span = 1  # elements the smaller axes span
        for n, stride in sorted(((n, abs(s)) for n, s in zip(spec.shape, spec.strides) if n > 1), key=lambda a: a[1]):
            if stride < span:
                return False
            span = stride * (n - 1) + span
    extents = sorted((spec.region, *spec.extent()) for spec in views)
    return all(a[0] != b[0] or a[2] <= b[1] for a, b in zip(extents, extents[1:]))


def _cover(starts: list, size: int) -> tuple[np.ndarray, int] | None:
    """The bytes the elements at ``starts`` (byte offsets, item size) cover, as a mask over
    units of one item size where every element is aligned to one (else over bytes), and that
    unit; None where two elements share a byte."""
    if not starts:
        return np.zeros(1, bool), size + 1
    unit = starts[0][1]
    if any(step != unit or (at % unit).any() for at, step in starts):
        unit, starts = 1, [((at[:, None] + np.arange(step)).reshape(-1), 1) for at, step in starts]
    at = np.concatenate([a for a, _ in starts]) // unit
    mark = np.zeros(size // unit + 1, bool)
    mark[at] = True
    return (mark, unit) if np.count_nonzero(mark) == at.size else None


def _holds_in_place(hypothesis: Hypothesis, spec, case, contract, prepared: Prepared, after: dict) -> bool:
    """:func:`holds` for a hypothesis that re-addresses nothing: each written view compared first
    (most hypotheses fail there, cheaply), then every region whole."""
    arena = prepared.arena
    try:
        expected = spec.expected(_AsRead(prepared, arena, hypothesis.inputs), case, contract,
                                 **hypothesis.override)
        if contract.duplicates != "any":  # slots the misread input repeats: the kernel may write
            # them element by element from any of their rows, as the re-addressed replay allows
            expected = {name: outcome.resolve(np.array(arena.numpy_view(after, name)), torn=True)
                        if isinstance(outcome, OneOfRows) else outcome for name, outcome in expected.items()}
        for name, outcome in expected.items():
            if not isinstance(outcome, OneOfRows) and not np.array_equal(
                    element_bytes(np.asarray(outcome)), element_bytes(arena.numpy_view(after, name))):
                return False
        regions, problems = expected_regions(arena, prepared.before, after, expected)
    except (TypeError, ValueError, IndexError):
        return False
    return not problems and first_difference(arena, regions, after) is None


def _both_differ(forward, backward, after) -> bool:
    """Whether some byte of a region differs from ``after`` in both write orders."""
    if isinstance(after, np.ndarray):
        return bool(np.any((forward != after) & (backward != after)))
    return np.intersect1d(differing_bytes(forward, after)[0], differing_bytes(backward, after)[0]).size > 0


def within_approx_division(spec, case, contract, prepared: Prepared, regions: dict, after: dict) -> int | None:
    """How many bytes differ from ``regions`` (the exact expectation), when every byte of every
    region equals the exact, the -2 ulps or the +2 ulps expectation (the quotient moved toward or
    away from zero); else None. fp8 rounding is monotone and its steps span far more than 4 ulps,
    so those two bound every code a quotient within 2 ulps gives."""
    bounds = []
    for ulps in (-2, 2):
        try:
            alt = spec.expected(prepared, case, contract, quotient_ulps=ulps)
        except (TypeError, ValueError):  # the case does not quantize
            return None
        alt_regions, problems = expected_regions(prepared.arena, prepared.before, after, alt)
        if problems:
            return None
        bounds.append(alt_regions)
    off = 0
    for name, want in regions.items():
        exact, count = differing_bytes(want, after[name])
        low, high = (differing_bytes(b[name], after[name])[0] for b in bounds)
        if np.intersect1d(np.intersect1d(exact, low), high).size:
            return None
        off += count
    return off
