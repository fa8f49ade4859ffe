"""Rows added to what the cache held: every element of the kernel's memory that differs from the
reference's is the sum of its value before the call and the value the call must write.

A scatter written as an accumulation (``index_put_(..., accumulate=True)``, ``index_add_``, an
atomic add where a store was meant) leaves ``old + new`` in every written element, rounded to the
cache's type. The difference itself says so: no replay of the reference builds it, since the old
values are the poison the cache held.
"""

from __future__ import annotations

import numpy as np

FLOATS = ("float32", "float16", "bfloat16")


def accumulated(arena, before: dict, expected: dict, after: dict) -> str | None:
    """The cause's text where every differing element of the cache views holds its value from
    before the call plus the reference's: rounded to the view's type for floats (NaN where the sum
    is NaN), modulo 256 for bytes; else None."""
    found, total = [], 0
    for name, view in arena.views.items():
        if view.role != "cache" or view.region not in expected:
            continue
        if not all(isinstance(s.get(view.region), np.ndarray) for s in (before, expected, after)):
            return None
        want, got, prior = (arena.numpy_view(s, name) for s in (expected, after, before))
        wrong = want.view(f"<u{want.dtype.itemsize}") != got.view(f"<u{got.dtype.itemsize}")
        if not wrong.any():
            continue
        if view.dtype == "uint8":  # bytes add modulo 256
            if not np.array_equal(got[wrong], ((prior[wrong].astype(np.uint16) + want[wrong]) & 0xFF).astype(np.uint8)):
                return None
        elif view.dtype in FLOATS:
            with np.errstate(all="ignore"):
                summed = (prior[wrong].astype(np.float32) + want[wrong].astype(np.float32)).astype(want.dtype)
            value, summed = got[wrong].astype(np.float32), summed.astype(np.float32)
            if not np.all((value == summed) | (np.isnan(value) & np.isnan(summed))):
                return None
        else:
            return None
        found.append(f"{name} ({int(wrong.sum())} element(s))")
        total += int(wrong.sum())
    if not found:
        return None
    return (f"every differing element holds its value from before the call plus the value the call must write "
            f"({', '.join(found)}): the rows added to what the cache held (index_put_ with accumulate=True, "
            "index_add_, an atomic add) instead of stored")


__all__ = ["accumulated"]
