"""Writes skipped where the cache already held the value: every element of the kernel's memory
that differs from the reference's still holds its bytes from before the call.

A kernel that compares what it would write with what the cache holds, and writes only where they
differ, saves bandwidth when a step writes its slots again. Compared as floats, -0 equals +0, so
a zero whose sign changed is never written; compared over part of a row, a row that changed only
elsewhere is kept whole. The difference itself tells this apart from a dropped write: the kept
elements are exactly those whose new value compares equal to the old one, or they lie in rows
that changed only past the compared part (the ``repeat="rewrite"`` case changes each source row's
last element, oracle.ops._repeat).
"""

from __future__ import annotations

import numpy as np

FLOATS = ("float32", "float16", "bfloat16")
SHOWN = 4


def _bits(array: np.ndarray) -> np.ndarray:
    return array.view(f"<u{array.dtype.itemsize}")


def _zeros(values: np.ndarray, dtype: str, fp8_codes: bool) -> np.ndarray:
    """Which elements are a zero of either sign: a float's, or an fp8 code's (0x00, 0x80)."""
    if dtype in FLOATS:
        return values.astype(np.float32) == 0
    if (dtype.startswith("float8") or (fp8_codes and dtype == "uint8")) and "fnuz" not in dtype:
        return (values & 0x7F) == 0
    return np.zeros(values.shape, bool)


def equal_values_skipped(arena, before: dict, expected: dict, after: dict, *, fp8_codes: bool,
                         rewrite: bool) -> str | None:
    """The cause's text where every element of the cache views that differs from the reference's
    kept its bytes from before the call, and each is a zero written with the other sign (or, on a
    ``rewrite`` case's second call, lies in a row the call changed only in places); else None."""
    kept_zeros = kept_other = 0
    views = []
    for name, view in arena.views.items():
        if view.role != "cache" or view.region not in expected:
            continue
        if not all(isinstance(s.get(view.region), np.ndarray) for s in (before, expected, after)):
            return None
        want, got, prior = (arena.numpy_view(s, name) for s in (expected, after, before))
        wrong = _bits(got) != _bits(want)
        if not wrong.any():
            continue
        if (_bits(got)[wrong] != _bits(prior)[wrong]).any():
            return None  # something was written there, not skipped
        zeros = _zeros(want, view.dtype, fp8_codes) & _zeros(prior, view.dtype, fp8_codes)
        rows = wrong.reshape(wrong.shape[0], -1).any(axis=1) if wrong.ndim > 1 else wrong
        kept_zeros += int((wrong & zeros).sum())
        kept_other += int((wrong & ~zeros).sum())
        views.append(f"{name} ({int(wrong.sum())} element(s) in {int(rows.sum())} slot(s))")
    if not views:
        return None
    where = ", ".join(views[:SHOWN])
    if not kept_other:
        return (f"{kept_zeros} zero(s) kept the sign they had before the call ({where}), and every "
                "other element was written: a write skipped where the cache already compared equal "
                "to the new value as a float (dst != src), which cannot tell -0 from +0; compare "
                "the bits")
    if rewrite:
        return (f"slots written again kept their earlier values in elements the call changed ({where}): "
                "a write skipped where part of the row (or an element compared as a float) already "
                "matched what the cache held; compare every element's bits")
    return None


__all__ = ["equal_values_skipped"]
