"""Slot addressing shared by every cache writer: padding and duplicates policies, slot validation,
the row scatter, and the set of allowed results when slots collide.

A writer maps source position ``i`` to slot ``index[i]`` and copies one row there. Every writer
goes through :func:`plan_slots` (which positions write which slot, or an error naming the
offending position) and :func:`write_rows` (the scatter into a new output array), so all of them
agree on what a padding slot, an out-of-range slot and a duplicated slot mean.

Padding policies (``padding=``):

- ``"none"``: every slot must lie in ``[0, num_slots)``.
- ``"negative"``: slots ``< 0`` are skipped (vLLM, aiter); ``>= num_slots`` is an error.
- ``"reserved:K"``: slot ``K`` is skipped (sglang's CUDA-graph padding slot 0); any other slot
  outside ``[0, num_slots)``, negatives included, is an error, and so is ``K`` itself when it
  lies outside that range (sglang checks the bound before the skip).

Duplicates policies (``duplicates=``):

- ``"forbid"``: two written positions naming one slot is an error.
- ``"any"``: allowed; no peer orders concurrent writes, so the slot must end up holding exactly
  one of its colliding rows, whole. The writer then returns a :class:`OneOfRows`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from . import _validate as v

DUPLICATES = ("forbid", "any")
FLOAT32_EXACT = 1 << 24  # float32 holds every integer up to here, and no odd one past it
_RESERVED = re.compile(r"reserved:([0-9]+)")
_SHOWN_POSITIONS = 8  # longer lists in messages are cut, with a count of the rest


@dataclass(frozen=True)
class Padding:
    """A parsed ``padding=`` policy; ``reserved`` is the skipped slot of ``"reserved:K"``."""

    kind: str  # "none", "negative" or "reserved"
    reserved: int | None = None

    @classmethod
    def parse(cls, spec) -> "Padding":
        if spec in ("none", "negative"):
            return cls(spec)
        match = _RESERVED.fullmatch(spec) if isinstance(spec, str) else None
        if match is None:
            raise ValueError(f"padding={spec!r} is not a padding policy; expected 'none', "
                             "'negative' or 'reserved:K' with K >= 0 (e.g. 'reserved:0')")
        return cls("reserved", int(match.group(1)))

    def __str__(self) -> str:
        return self.kind if self.reserved is None else f"reserved:{self.reserved}"

    def skipped(self, slots: np.ndarray, num_slots: int) -> np.ndarray:
        if self.kind == "negative":
            return slots < 0
        if self.kind == "reserved" and self.reserved < num_slots:
            return slots == self.reserved
        return np.zeros(slots.shape, dtype=bool)

    def note(self) -> str:
        return {"none": "", "negative": " (negative slots are skipped)",
                "reserved": f" (only slot {self.reserved} is skipped)"}[self.kind]


def parse_policies(padding, duplicates) -> Padding:
    v.require_choice("duplicates", duplicates, DUPLICATES)
    return Padding.parse(padding)


@dataclass(frozen=True)
class SlotPlan:
    """Which source positions write which slot.

    ``positions``: the written source positions, ascending (int64); ``slots``: the slot each one
    writes; ``collisions``: for every slot written more than once, ``(slot, members)`` where
    ``members`` are indices into ``positions`` (ascending).
    """

    positions: np.ndarray
    slots: np.ndarray
    collisions: tuple


def plan_slots(name: str, index, num_slots: int, *, padding="none",
               duplicates="forbid") -> SlotPlan:
    """Validate ``index`` (1-D int32/int64, named ``name`` in errors) against ``num_slots`` slots
    under the two policies, and say which positions write where. Raises before anything is
    written: ``TypeError`` for a wrong index dtype, ``ValueError`` naming the first offending
    position for an out-of-range slot, and the slot and its positions for a forbidden duplicate.
    """
    policy = parse_policies(padding, duplicates)
    v.require_index(name, index)
    slots = index.astype(np.int64)
    skipped = policy.skipped(slots, num_slots)
    out_of_range = ~skipped & ((slots < 0) | (slots >= num_slots))
    if out_of_range.any():
        bad = np.flatnonzero(out_of_range)
        more = f"; {len(bad) - 1} more position(s) are out of range too" if len(bad) > 1 else ""
        raise ValueError(f"{name}[{bad[0]}] = {slots[bad[0]]} is out of range [0, {num_slots}) "
                         f"under padding={str(policy)!r}{policy.note()}{more}")

    positions = np.flatnonzero(~skipped)
    written = slots[positions]
    collisions = _collisions(written)
    if collisions and duplicates == "forbid":
        slot, members = collisions[0]
        more = f"; {len(collisions) - 1} more slot(s) are duplicated" if len(collisions) > 1 else ""
        raise ValueError(f"{name} writes slot {slot} more than once, at positions "
                         f"{_list(positions[members])}{more}; duplicates='forbid' (pass "
                         "duplicates='any' to accept any one of the colliding rows)")
    return SlotPlan(positions, written, collisions)


DCP_MODULI = ("truncate", "floor")


def require_dcp(world, rank, modulo) -> None:
    """Check decode-context-parallel arguments: ``dcp_world`` an integer >= 1, ``dcp_rank`` an
    integer in ``[0, dcp_world)``, ``dcp_modulo`` one of :data:`DCP_MODULI`."""
    for name, value in (("dcp_world", world), ("dcp_rank", rank)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{name}={value!r} must be an integer")
    if world < 1:
        raise ValueError(f"dcp_world={world!r} must be >= 1")
    if not 0 <= rank < world:
        raise ValueError(f"dcp_rank={rank!r} must lie in [0, dcp_world={world})")
    v.require_choice("dcp_modulo", modulo, DCP_MODULI)


def dcp_local_rows(index: np.ndarray, world: int, rank: int, modulo: str):
    """Decode-context parallelism: which widened locs rank ``rank`` of ``world`` keeps, and the
    local row each one names.

    Returns ``(selected, rows)``, shaped like ``index``: ``selected[i]`` is
    ``index[i] mod world == rank`` and ``rows[i]`` is ``index[i] div world`` (int64), both under
    ``modulo``. "truncate" (C, Triton): the quotient rounds toward zero and the remainder takes
    the loc's sign, so only rank 0 keeps negative locs (the multiples of ``world``). "floor"
    (Python, torch): the quotient rounds down and the remainder lies in ``[0, world)``, so ``-1``
    is kept by rank ``world - 1`` as row ``-1``. The two agree on every loc >= 0. Exact for every
    int64 loc, the dtype's minimum included. Range checks are the caller's.
    """
    require_dcp(world, rank, modulo)
    locs = np.asarray(index).astype(np.int64)
    if modulo == "floor":
        remainder, rows = np.mod(locs, world), np.floor_divide(locs, world)
    else:
        remainder = np.fmod(locs, world)  # C's %: the sign of the loc
        # locs - remainder is a multiple of world between locs and 0: exact, and it cannot overflow
        rows = (locs - remainder) // world
    return remainder == rank, rows


def _collisions(slots: np.ndarray) -> tuple:
    if len(slots) == 0:
        return ()
    order = np.argsort(slots, kind="stable")  # stable: members stay in position order
    ordered = slots[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    counts = np.diff(np.r_[starts, len(slots)])
    return tuple((int(ordered[s]), order[s:s + c]) for s, c in zip(starts, counts) if c > 1)


def _list(values) -> str:
    shown = ", ".join(str(int(x)) for x in values[:_SHOWN_POSITIONS])
    rest = len(values) - _SHOWN_POSITIONS
    return shown + (f", ... ({rest} more)" if rest > 0 else "")


def last_writers(plan: SlotPlan) -> np.ndarray:
    """The positions (into ``plan.slots``) that write each slot last. numpy leaves the winner of
    a repeated index unspecified, so a write through these writes each slot once: its last."""
    _, last_from_end = np.unique(plan.slots[::-1], return_index=True)
    return len(plan.slots) - 1 - last_from_end


def write_rows(out: np.ndarray, plan: SlotPlan, rows: np.ndarray, *, slot_axes=(0,),
               row_region=()):
    """Write ``rows[j]`` to slot ``plan.slots[j]`` of ``out`` (in place) and return the outcome.

    ``slot_axes``: the axes of ``out`` that address a slot, most significant first; a slot is
    unravelled over their sizes (``(0,)`` flat, ``(0, 1)`` paged NHD, ``(0, 2)`` paged HND).
    ``row_region``: slices for the remaining axes, in order (missing ones mean the whole axis),
    selecting the part of a slot's row that is written. ``rows`` has shape
    ``(len(plan.positions),) + region shape``, with the region's axes in ``out``'s order.

    Returns ``out`` when no slot is written twice, else a :class:`OneOfRows` whose ``base`` is
    ``out`` holding, at each duplicated slot, the row of its last position.
    """
    slot_axes = tuple(slot_axes)
    region = _region_index(out.ndim, slot_axes, row_region)
    dest = np.moveaxis(out[region], slot_axes, range(len(slot_axes)))  # a view: writes land in out
    slot_shape = tuple(out.shape[a] for a in slot_axes)
    if rows.shape != (len(plan.slots),) + dest.shape[len(slot_axes):]:
        raise ValueError(f"internal: {len(plan.slots)} rows of shape "
                         f"{dest.shape[len(slot_axes):]} expected, got {rows.shape}")
    last = last_writers(plan)
    dest[np.unravel_index(plan.slots[last], slot_shape)] = rows[last]
    return with_collisions(out, plan, rows, lambda slot: _region_index(
        out.ndim, slot_axes, row_region, np.unravel_index(slot, slot_shape)))


def with_collisions(out: np.ndarray, plan: SlotPlan, rows: np.ndarray, row_index):
    """``out`` (each slot holding its last writer's row) when no slot is written twice, else a
    :class:`OneOfRows` over it: ``row_index(slot)`` is the index of that slot's row in ``out``,
    ``rows[j]`` the row position ``plan.positions[j]`` writes."""
    if not plan.collisions:
        return out
    return OneOfRows(out, tuple(Collision(slot, row_index(slot), tuple(int(p) for p in plan.positions[members]),
                                          rows[members].copy()) for slot, members in plan.collisions))


def _region_index(ndim: int, slot_axes, row_region, coords=None) -> tuple:
    """An index into the full output: slot axes get ``coords`` (whole axis if None), the other
    axes take ``row_region`` in order."""
    region = iter(row_region)
    index = []
    for axis in range(ndim):
        if axis in slot_axes:
            index.append(slice(None) if coords is None else int(coords[slot_axes.index(axis)]))
        else:
            index.append(next(region, slice(None)))
    return tuple(index)


@dataclass(frozen=True)
class Collision:
    """One slot written by several source positions: ``index`` selects its row region in the
    full output array; ``rows[k]`` is the row position ``positions[k]`` would leave there."""

    slot: int
    index: tuple
    positions: tuple
    rows: np.ndarray


class OneOfRows:
    """The set of allowed results of a write with duplicated slots.

    An ``actual`` output is allowed when it equals ``base`` bitwise everywhere except the row
    regions of the duplicated slots, and each of those holds, bitwise and whole, the row of one of
    its colliding positions. ``base`` itself is allowed (each duplicated slot holds its last
    position's row, what a sequential loop leaves).
    """

    def __init__(self, base: np.ndarray, collisions: tuple):
        self.base = base
        self.collisions = collisions

    def __repr__(self) -> str:
        slots = ", ".join(f"{c.slot}: positions {_list(c.positions)}" for c in self.collisions)
        return (f"OneOfRows(shape={self.base.shape}, dtype={self.base.dtype}, "
                f"duplicated {{{slots}}})")

    def __contains__(self, actual) -> bool:
        return self.check(actual) is None

    def resolve(self, actual: np.ndarray, torn: bool = False) -> np.ndarray:
        """The allowed outcome closest to ``actual``: ``base`` with each duplicated slot holding
        ``actual``'s row where that row is one of its colliding rows (else the last one's), so a
        byte comparison with ``actual`` then flags only what is not allowed. ``torn``: also
        where each element comes from one of the colliding rows (concurrent element writes,
        as a kernel that repeats slots nobody asked it to write would leave)."""
        resolved = self.base.copy()
        if _same_kind(self.base, actual):
            return resolved
        for c in self.collisions:
            why = _judge_row(np.asarray(actual[c.index]), c)
            if why is None or (torn and why.startswith("torn row")):
                resolved[c.index] = actual[c.index]
        return resolved

    def check(self, actual) -> str | None:
        """None when ``actual`` is allowed, else the reason: which slot, which positions collide,
        and how the row fails (torn between rows, or matching none), or where the rest differs."""
        reason = _same_kind(self.base, actual)
        if reason:
            return reason
        patched = actual.copy()
        for c in self.collisions:
            why = _judge_row(np.asarray(actual[c.index]), c)
            if why:
                return f"slot {c.slot} (written by positions {_list(c.positions)}): {why}"
            patched[c.index] = self.base[c.index]
        why = _first_difference(self.base, patched)
        return f"outside the duplicated slots: {why}" if why else None


def check_outcome(expected, actual) -> str | None:
    """None when ``actual`` is an allowed result, else why not. ``expected`` is an array
    (bitwise equality; the reason names the first differing index and how many differ) or a
    :class:`OneOfRows`."""
    if isinstance(expected, OneOfRows):
        return expected.check(actual)
    reason = _same_kind(expected, actual)
    return reason or _first_difference(expected, actual)


def _same_kind(expected: np.ndarray, actual) -> str | None:
    if not isinstance(actual, np.ndarray):
        return f"result is a {type(actual).__name__}, not a numpy array"
    if actual.shape != expected.shape:
        return f"result has shape {actual.shape}; expected {expected.shape}"
    if actual.dtype != expected.dtype:
        return f"result has dtype {actual.dtype}; expected {expected.dtype}"
    return None


def element_bytes(array: np.ndarray) -> np.ndarray:
    """The bytes of each element, shape ``array.shape + (itemsize,)``: compares NaN payloads and
    -0 exactly, for any dtype."""
    flat = np.ascontiguousarray(array).reshape(-1)
    return flat.view(np.uint8).reshape(array.shape + (array.dtype.itemsize,))


_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def element_bits(array: np.ndarray) -> np.ndarray:
    """Each element as an unsigned integer of its width (its bytes for other widths): compares
    NaN payloads and -0 exactly, element by element, without a reduction over bytes."""
    bits = _BITS.get(array.dtype.itemsize)
    if bits is None:
        return element_bytes(array)
    return np.ascontiguousarray(array).view(bits).reshape(array.shape)


def differing_elements(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Which elements of ``a`` and ``b`` (one shape, one item size) differ in some byte."""
    differs = element_bits(a) != element_bits(b)
    return differs if differs.shape == a.shape else differs.any(axis=-1)


def _first_difference(expected: np.ndarray, actual: np.ndarray) -> str | None:
    differs = differing_elements(expected, actual)
    if not differs.any():
        return None
    where = tuple(int(i) for i in np.argwhere(differs)[0])
    return (f"element {where} has bytes {element_bytes(actual[where]).tobytes().hex(' ')}, "
            f"expected {element_bytes(expected[where]).tobytes().hex(' ')}; "
            f"{int(differs.sum())} of {differs.size} elements differ")


def row_matches(actual_row: np.ndarray, c: Collision) -> np.ndarray:
    """bool ``[candidate, element]``: whether each element of ``actual_row`` equals, bitwise,
    that element of each colliding position's row."""
    itemsize = actual_row.dtype.itemsize
    got = element_bytes(actual_row).reshape(-1, itemsize)
    candidates = element_bytes(c.rows).reshape(len(c.positions), -1, itemsize)
    return (candidates == got).all(axis=-1)


def whole_rows(actual_row: np.ndarray, c: Collision) -> set:
    """The colliding positions whose whole row ``actual_row`` holds."""
    return {c.positions[k] for k in np.flatnonzero(row_matches(actual_row, c).all(axis=1))}


def _judge_row(actual_row: np.ndarray, c: Collision) -> str | None:
    itemsize = actual_row.dtype.itemsize
    matches = row_matches(actual_row, c)
    if matches.all(axis=1).any():
        return None
    covered = matches.any(axis=0)
    if not covered.all():
        first = int(np.argmin(covered))
        closest = int(np.argmax(matches.sum(axis=1)))
        return (f"matches none of the {len(c.positions)} colliding rows (element {first}, bytes "
                f"{first * itemsize}..{(first + 1) * itemsize - 1}, equals none of them; the "
                f"closest, position {c.positions[closest]}, differs in "
                f"{int((~matches[closest]).sum())} of {matches.shape[1]} elements)")
    pieces = [f"{start * itemsize}..{end * itemsize - 1} from position {c.positions[k]}"
              for start, end, k in _segments(matches)]
    rest = f" and {len(pieces) - _SHOWN_POSITIONS} more pieces" if len(pieces) > _SHOWN_POSITIONS else ""
    return "torn row: bytes " + ", ".join(pieces[:_SHOWN_POSITIONS]) + rest


def _segments(matches: np.ndarray):
    """Cover the elements with as few single-candidate runs as a greedy scan finds: at each start,
    the candidate whose run reaches furthest."""
    count = matches.shape[1]
    start = 0
    while start < count:
        best_end, best = start, 0
        for k in np.flatnonzero(matches[:, start]):
            misses = np.flatnonzero(~matches[k, start:])
            end = start + int(misses[0]) if len(misses) else count
            if end > best_end:
                best_end, best = end, int(k)
        yield start, best_end, best
        start = best_end
