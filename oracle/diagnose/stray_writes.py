"""Writes outside the call's own bytes: every byte of the kernel's memory that differs from the
reference's is one the reference leaves as it was (another slot's entry, a page's unmapped bytes,
the gap between rows, a guard band), and every byte the reference writes is right.

No replay builds such memory (what lands there is the kernel's own: zeros from clearing a page or
block before writing it, a tile's or vector's spill, a scratch value), so the difference itself
names the class, and the words say where and what was written.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

SHOWN = 4  # values and regions listed


def _runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) of each run of True in a 1-D mask."""
    edges = np.flatnonzero(np.diff(np.concatenate(([0], mask.view(np.int8), [0]))))
    return list(zip(edges[::2].tolist(), edges[1::2].tolist()))


def _where(arena, region: str, runs: list) -> str:
    """Where the runs of stray bytes lie: in which views' extents, in which guard band."""
    reg = arena.regions[region]
    places = Counter()
    for start, end in runs:
        if end <= reg.guard:
            places["its guard band before"] += 1
        elif start >= reg.guard + reg.payload:
            places["its guard band after"] += 1
        else:
            names = [v.name for v in arena.views.values() if v.region == region
                     and _overlaps(v.extent(), (start - reg.guard, end - reg.guard))]
            places[f"inside {' and '.join(names)}'s extent" if names else "between its views"] += 1
    return ", ".join(f"{n} run(s) {what}" for what, n in places.most_common(SHOWN))


def _overlaps(a: tuple, b: tuple) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def stray_writes(arena, before: dict, expected: dict, after: dict) -> str | None:
    """The cause's text where the kernel's memory differs from the reference's only in bytes the
    reference leaves as they were; else None (a byte the reference writes differs, nothing differs,
    or a region is sparse and not at hand whole)."""
    texts, values = [], Counter()
    for region, want in expected.items():
        got, prior = after.get(region), before.get(region)
        if not all(isinstance(a, np.ndarray) for a in (want, got, prior)):
            return None
        differs = got != want
        if not differs.any():
            continue
        if (differs & (want != prior)).any():
            return None  # the call's own bytes are wrong too: another cause
        runs = _runs(differs)
        texts.append(f"{region}: {int(differs.sum())} byte(s) in {len(runs)} run(s) "
                     f"(longest {max(e - s for s, e in runs)}), {_where(arena, region, runs)}")
        values.update(got[differs].tolist())
    if not texts:
        return None
    total = sum(values.values())
    if set(values) == {0}:
        what = "all set to 0x00 (cleared, as a page or block zeroed before it is written)"
    else:
        what = "written as " + ", ".join(f"0x{v:02x} ({n} of {total})" for v, n in values.most_common(SHOWN))
    return ("bytes the call must leave as they were are changed, and every byte it must write is right: "
            f"{what}; " + "; ".join(texts[:SHOWN]) + (f"; ... ({len(texts) - SHOWN} more regions)"
                                                      if len(texts) > SHOWN else ""))
