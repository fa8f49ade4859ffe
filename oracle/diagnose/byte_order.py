"""Bytes in another order within each word: every row of a written view that differs from the
reference's holds the reference's bytes with each aligned 2-, 4- or 8-byte word reversed.

A kernel that packs elements (fp8 codes, NVFP4 nibble pairs, scale bytes) into a wider register
and stores it with the other byte order, or moves 16-bit elements through a byte-swapping path,
writes every byte the reference writes, each in the wrong place within its word. No replay builds
that memory, so it is read off the difference: the words are the view's, counted from the start
of each row along its last (contiguous) axis.
"""

from __future__ import annotations

import numpy as np

WORDS = (2, 4, 8)  # bytes per word: a 16-bit element, a 32-bit register, a 64-bit one


def _row_bytes(values: np.ndarray) -> np.ndarray:
    """The elements' bytes, one row (all but the last axis) per line."""
    flat = np.ascontiguousarray(values).reshape(-1, values.shape[-1] if values.ndim else 1)
    return flat.view(np.uint8)


def _reversed_words(rows: np.ndarray, word: int) -> np.ndarray:
    return rows.reshape(rows.shape[0], -1, word)[:, :, ::-1].reshape(rows.shape)


def byte_order_reversed(arena, before: dict, expected: dict, after: dict) -> str | None:
    """The cause's text where, in every written view, each row that differs from the reference's
    is the reference's row with the bytes of each aligned word of one size reversed (the same size
    in every view); else None. ``before`` (the memory before the call) is not needed: the argument
    list is every memory read-off's."""
    for word in WORDS:
        found = []
        for name, view in arena.views.items():
            if view.role not in ("cache", "output") or view.region not in expected:
                continue
            if not all(isinstance(s.get(view.region), np.ndarray) for s in (expected, after)):
                return None
            want, got = (_row_bytes(arena.numpy_view(s, name)) for s in (expected, after))
            differs = (want != got).any(axis=1)
            if not differs.any():
                continue
            if want.shape[1] % word or not np.array_equal(got[differs], _reversed_words(want[differs], word)):
                found = None
                break
            found.append(f"{name} ({int(differs.sum())} row(s))")
        if found:
            return (f"each differing row holds the reference's bytes with every aligned {word}-byte word "
                    f"reversed ({', '.join(found)}): a {8 * word}-bit word stored in the other byte order "
                    "(packed big-endian, or assembled from its bytes the wrong way round)")
    return None


__all__ = ["byte_order_reversed"]
