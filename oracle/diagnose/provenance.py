"""Where the reference's rows went: for a failing write, which differing cache rows hold a row
the reference writes at another slot (whole, or in the columns that differ), which were left as
they were, and which hold neither.

A kernel that pairs a row with the wrong slot (an index pointer not advanced per chunk, a slot
divided wrongly into block and offset, a row read from the wrong source position) leaves rows
that are right in themselves but in the wrong place. Matching each differing row's bytes against
every row the reference writes finds where each went; where the index numbers the rows, the
moves are said in index entries and a rule among them is looked for (a constant shift, the index
restarted every C entries, neighbours swapped). Found from the memory, not replayed: a move is
a row's exact bytes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..compare import first_difference
from ..reference.slots import differing_elements, element_bits

SHOWN = 4  # moves listed as examples
MATCH_BYTES = 8  # the fewest bytes a match is made on (fewer match by chance too often)


@dataclass
class Moves:
    """One cache view's differing rows: ``moved`` (slot the row belongs at, slot it is at),
    ``untouched`` (slots that should have been written and were not), ``unexplained`` (differing
    slots holding neither a row of another slot nor their old contents); ``columns``: the element
    columns the moves were matched on, None for whole rows."""

    view: str
    moved: list = field(default_factory=list)
    untouched: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    unexplained: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    columns: np.ndarray | None = None
    shifted: list = field(default_factory=list)  # (column the reference writes, column it is at), same rows
    block: int | None = None  # tokens per block of a paged view
    rows: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # the differing slots
    written: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))  # the slots the reference writes

    @property
    def explained(self) -> bool:
        """Whether every differing row is a moved row or an untouched one, and one is moved; or
        every differing element is one of its own row's moved along it."""
        return bool(self.moved or self.shifted) and self.unexplained.size == 0


def _as_rows(array: np.ndarray) -> np.ndarray:
    """[slot, elements] with paged caches' block and token axes merged into slots."""
    if array.ndim == 4:
        array = array.reshape((array.shape[0] * array.shape[1],) + array.shape[2:])
    return element_bits(np.asarray(array)).reshape(array.shape[0] if array.ndim else 1, -1)


def _keys(rows: np.ndarray, slots: np.ndarray) -> dict:
    """Row bytes -> slot, for rows whose bytes no other of ``slots`` shares."""
    keys: dict = {}
    for slot in slots:
        key = rows[slot].tobytes()
        keys[key] = None if key in keys else int(slot)
    return {k: s for k, s in keys.items() if s is not None}


def find_moves(view: str, want: np.ndarray, got: np.ndarray, before: np.ndarray) -> Moves | None:
    """The moves of one written view (want, got and before: its expected, actual and prior
    contents); None where it holds what the reference writes."""
    block = want.shape[1] if want.ndim == 4 else None
    want, got, before = _as_rows(want), _as_rows(got), _as_rows(before)
    differs = differing_elements(want, got)
    rows = np.flatnonzero(differs.any(axis=1))
    if rows.size == 0 or want.shape[1] * want.itemsize < MATCH_BYTES:
        return None
    written = np.flatnonzero(differing_elements(want, before).any(axis=1))
    columns = np.flatnonzero(differs[rows].any(axis=0))
    shifted = _shifted_columns(want[rows], got[rows], columns)
    if shifted:
        return Moves(view, shifted=shifted, rows=rows, written=written)
    kept = ~differing_elements(got[rows], before[rows]).any(axis=1)
    out = Moves(view, untouched=rows[kept], rows=rows, block=block, written=written)
    rest = rows[~kept]
    keys = _keys(want, written)
    found = [keys.get(got[r].tobytes()) for r in rest]
    if any(s is None for s in found):  # not whole rows: match on the columns that differ
        if columns.size < want.shape[1]:
            keys = _keys(np.ascontiguousarray(want[:, columns]), written)
            found = [keys.get(np.ascontiguousarray(got[r, columns]).tobytes()) for r in rest]
            out.columns = columns
    out.moved = [(s, int(r)) for s, r in zip(found, rest) if s is not None and s != r]
    out.unexplained = np.array([r for s, r in zip(found, rest) if s is None or s == r], np.int64)
    return out


def _shifted_columns(want: np.ndarray, got: np.ndarray, columns: np.ndarray) -> list:
    """(column the reference writes, column it is at) for every differing column of the
    differing rows (``want`` and ``got``: those rows) where each holds, in every one of them,
    what the reference writes at one other column of the same row; else []."""
    if columns.size == want.shape[1] or want.shape[0] * want.itemsize < MATCH_BYTES:  # values match by chance
        return []
    keys = _keys(np.ascontiguousarray(want.T), np.arange(want.shape[1]))
    found = [keys.get(np.ascontiguousarray(got[:, c]).tobytes()) for c in columns]
    if any(s is None or s == c for s, c in zip(found, columns)):
        return []
    return [(int(s), int(c)) for s, c in zip(found, columns)]


def entries_of(index: np.ndarray | None, written: np.ndarray) -> dict | None:
    """Slot -> index entry, where the index's valid entries name the view's written slots each
    once (its entries number the rows); else None."""
    if index is None:
        return None
    flat = np.asarray(index).reshape(-1).astype(np.int64)
    slots, counts = np.unique(flat[flat >= 0], return_counts=True)
    if (counts > 1).any() or not np.isin(written, slots).all():
        return None
    return {int(s): int(i) for i, s in enumerate(flat) if s >= 0}


def _ranges(values) -> str:
    values = sorted(int(v) for v in values)
    out, start = [], values[0]
    for a, b in zip(values, values[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return ", ".join(out[:SHOWN]) + (f", ... ({len(out) - SHOWN} more runs)" if len(out) > SHOWN else "")


def entry_rule(pairs: list) -> str | None:
    """A rule among (entry whose row moved, entry whose slot it is at) pairs, in words; None."""
    (shift, count), = Counter(j - i for i, j in pairs).most_common(1)
    shifted = f"the row of entry i at the slot of entry i {'+' if shift > 0 else '-'} {abs(shift)}"
    if count == len(pairs):
        return shifted
    if all(j == i ^ 1 for i, j in pairs):
        return "neighbouring entries' rows swapped in pairs (entry i's row at the slot of entry i ^ 1)"
    if all(j < i for i, j in pairs):
        period = min(i - j for i, j in pairs)
        if all(j == i % period for i, j in pairs):
            return (f"the row of entry i at the slot of entry i mod {period} (the index read from its start "
                    f"again every {period} entries, as a pointer not advanced per chunk)")
    if 2 * count > len(pairs):  # the rest wrapped round, or moved by another rule
        return f"{shifted} ({count} of the {len(pairs)} moved rows)"
    return None


def describe(moves: Moves, entries: dict | None) -> list[str]:
    """The lines about one view's moves: what moved, how (a rule, or examples), then examples."""
    if moves.shifted:
        return _describe_shifted(moves)
    if not moves.moved:
        return []
    name = moves.view
    what = "rows" if moves.columns is None else f"element(s) {_ranges(moves.columns)} of rows"
    lines = [f"{name}: {len(moves.moved)} slot(s) hold the {what} the reference writes at another slot"]
    pairs = None
    if entries is not None:
        pairs = [(entries[a], entries[b]) for a, b in moves.moved if a in entries and b in entries]
        pairs = pairs if len(pairs) == len(moves.moved) else None
    if pairs:
        pairs, moved = zip(*sorted(zip(pairs, moves.moved)))
        rule = entry_rule(pairs)
        moved_entries = _ranges(i for i, _ in pairs)
        lines.append(f"{name}: " + (f"{rule}, for entries {moved_entries}" if rule
                                    else f"the rows of entries {moved_entries} moved"))
        shown = [f"entry {i} (slot {a}) -> slot {b} (entry {j})"
                 for (a, b), (i, j) in list(zip(moved, pairs))[:SHOWN]]
    else:
        lines.append(f"{name}: {_slot_shifts(moves)}")
        shown = [f"slot {a} -> {b}" for a, b in moves.moved[:SHOWN]]
    lines.append(f"{name}: e.g. " + ", ".join(shown) + (", ..." if len(moves.moved) > SHOWN else ""))
    if moves.unexplained.size:
        lines.append(f"{name}: {moves.unexplained.size} other differing slot(s) hold no row of the reference's")
    return lines


def _slot_shifts(moves: Moves) -> str:
    """How far the moved rows went, in slots: one shift, or the commonest, and what they share
    (whole blocks; a shift that grows with the slot number)."""
    shifts = np.array([b - a for a, b in moves.moved])
    common = Counter(shifts.tolist()).most_common(4)
    if len(common) == 1:
        text = f"every moved row is {common[0][0]:+d} slot(s) from its own"
    else:
        text = "the moved rows are " + ", ".join(f"{shift:+d} slot(s) from their own in {n}" for shift, n in common)
        text += f" (of {shifts.size})" if sum(n for _, n in common) < shifts.size else ""
    if moves.block and moves.block > 1 and not (shifts % moves.block).any():
        text += (f"; every shift is whole blocks of {moves.block}: each row at its own token of another block "
                 "(the block index wrong, the token within the block right)")
    starts = np.array([a for a, _ in moves.moved], np.float64)
    if len(common) >= 3 and np.corrcoef(starts, np.abs(shifts))[0, 1] >= 0.7:
        text += ("; the shift grows with the slot number (an error that grows with it, as a division by an "
                 "inexact reciprocal)")
    return text


def _describe_shifted(moves: Moves) -> list[str]:
    sources, targets = zip(*moves.shifted)
    (shift, count), = Counter(b - a for a, b in moves.shifted).most_common(1)
    how = (f"each {abs(shift)} element(s) {'right' if shift > 0 else 'left'} of where the reference writes it"
           if count == len(moves.shifted) else f"{count} of them {shift:+d} element(s) from their own")
    return [f"{moves.view}: element(s) {_ranges(targets)} of the {moves.rows.size} differing slot(s) hold what the "
            f"reference writes at element(s) {_ranges(sources)} of the same row",
            f"{moves.view}: {how}"]


def _index(arena, before: dict) -> np.ndarray | None:
    """The case's one index view's entries, or None where it has none or several."""
    names = [name for name, view in arena.views.items() if view.role == "index"]
    if len(names) != 1:
        return None
    try:
        return np.asarray(arena.numpy_view(before, names[0]))
    except ValueError:
        return None


def of_case(arena, before: dict, expected: dict, after: dict, written) -> list[tuple[Moves, dict | None]]:
    """Each written view's moves with its slot -> entry map (None where the index does not
    number its rows); views that match or cannot be read densely are left out."""
    index = _index(arena, before)
    out = []
    for name in written:
        if name not in arena.views:
            continue
        try:
            want, got, prior = (np.asarray(arena.numpy_view(s, name)) for s in (expected, after, before))
        except ValueError:  # a sparse view that does not pack evenly
            continue
        moves = find_moves(name, want, got, prior)
        if moves is not None:
            out.append((moves, entries_of(index, moves.written)))
    return out


def _slot(array: np.ndarray, slot: int):
    """Index of slot ``slot`` of a view, paged block and token axes merged."""
    return divmod(slot, array.shape[1]) if array.ndim == 4 else (slot,)


def misplaced(arena, expected: dict, after: dict, found: list) -> tuple[str, str] | None:
    """(cause, text) where every difference of the case is rows of the reference's at other
    slots (``rows_misrouted``) or elements of the reference's moved along their own rows
    (``part_misplaced``); else None. ``found``: :func:`of_case`'s."""
    if any(m.moved for m, _ in found):
        text = _misrouted(arena, expected, after, found)
        return ("rows_misrouted", text) if text else None
    text = _shifted_along_rows(arena, expected, after, found)
    return ("part_misplaced", text) if text else None


def _misrouted(arena, expected: dict, after: dict, found: list) -> str | None:
    """The cause's text where every difference of the case is rows of the reference's at other
    slots, or rows left as they were, with at least one moved: the expected memory with those
    rows as the kernel left them equals the kernel's, guard bands and every other view included."""
    if not all(m.explained or (not m.moved and m.unexplained.size == 0) for m, _ in found):
        return None
    if not _accounts_for(arena, expected, after, found):
        return None
    moves, entries = next((m, e) for m, e in found if m.moved)
    headline, how = (line.split(": ", 1)[1] for line in describe(moves, entries)[:2])
    untouched = moves.untouched.size
    return (f"rows the reference writes at one slot written at another: {how} ({moves.view}: {headline}"
            + (f"; {untouched} slot(s) to be written left as they were" if untouched else "") + ")")


def _accounts_for(arena, expected: dict, after: dict, found: list) -> bool:
    """Whether the expected memory with every differing slot of ``found`` as the kernel left it
    equals the kernel's, guard bands and every other view included (the moves themselves were
    matched byte for byte)."""
    if not all(isinstance(data, np.ndarray) for data in expected.values()):
        return False  # a sparse region: its rows are not all at hand
    regions = {name: data.copy() for name, data in expected.items()}
    for moves, _ in found:
        mine, theirs = arena.numpy_view(regions, moves.view), arena.numpy_view(after, moves.view)
        for slot in moves.rows:
            at = _slot(mine, int(slot))
            mine[at] = theirs[at]
    return first_difference(arena, regions, after) is None


def _shifted_along_rows(arena, expected: dict, after: dict, found: list) -> str | None:
    """The cause's text where every difference of the case is elements the reference writes,
    each at another place along its own row (a part of the row written at the wrong offset)."""
    if not found or not all(m.shifted for m, _ in found) or not _accounts_for(arena, expected, after, found):
        return None
    return "; ".join(", ".join(line.split(": ", 1)[1] for line in describe(m, None)) for m, _ in found)
