"""A pure model of the SWA allocator that the full->SWA tables of :mod:`.swa` come from
(sglang's ``SWATokenToKVPoolAllocator``): pages allocated and freed in both pools, the table kept
in step, and the invariants a real pool must keep. Pure numpy; the SWA pool kernels
(``oracle.kernels.swa_pool``) are checked against it operation by operation."""

from __future__ import annotations

import numpy as np

from . import _validate as v
from .swa import SENTINEL, make_swa_mapping, translate_full_to_swa


class SwaAllocatorModel:
    """A pure, page-granular model of sglang's ``SWATokenToKVPoolAllocator`` state.

    Two pools of pages, *full* (``size_full`` slots) and *SWA* (``size_swa`` slots), each with
    page 0 reserved (slot 0 is the padding slot): full slots live in
    ``[page_size, size_full + page_size)`` and SWA slots in ``[page_size, size_swa + page_size)``.
    Page ``p`` holds slots ``[p * page_size, (p + 1) * page_size)``. The full->SWA table is
    :func:`make_swa_mapping`'s, and a full page's tokens sit at the same offsets of one SWA page.

    Free-list order: every allocation takes the lowest-numbered free pages, in ascending order,
    in both pools. (sglang hands pages out in its own free-list order, which depends on the
    history of frees; the model fixes one order so that two models driven identically agree.
    Compare a real pool with the model through translations and invariants, not raw slot numbers.)

    Every operation validates all its arguments before changing anything, so a rejected
    operation (``ValueError`` / ``TypeError`` naming the argument) leaves the state as it was.
    ``alloc`` / ``alloc_extend`` return ``None``, also without changing anything, when either
    pool lacks the pages, as sglang does.
    """

    def __init__(self, size_full: int, size_swa: int, page_size: int):
        page_size = v.require_int("page_size", page_size, 1)
        size_full = v.require_int("size_full", size_full, 1)
        size_swa = v.require_int("size_swa", size_swa, 1)
        v.require_page_multiple("size_full", size_full, page_size)
        v.require_page_multiple("size_swa", size_swa, page_size)
        self.size_full, self.size_swa, self.page_size = size_full, size_swa, page_size
        # allocated flags per page; index 0 is the reserved page and stays False
        self._full_alloc = np.zeros(size_full // page_size + 1, dtype=bool)
        self._swa_alloc = np.zeros(size_swa // page_size + 1, dtype=bool)
        self._mapping = make_swa_mapping(size_full, page_size)

    # -- read-only views ---------------------------------------------------------------------

    @property
    def mapping(self) -> np.ndarray:
        """A copy of the full->SWA table (int64, trailing -1 sentinel)."""
        return self._mapping.copy()

    @property
    def live_full_slots(self) -> np.ndarray:
        """Every slot of every allocated full page, ascending (int64). Allocation is
        page-granular, so a page's not-yet-written tail is live: it is reserved for the owning
        request's next ``alloc_extend``."""
        return self._page_slots(np.flatnonzero(self._full_alloc))

    @property
    def available_full(self) -> int:
        """Free full slots (free pages x page_size), like sglang's ``full_available_size``."""
        return int((~self._full_alloc[1:]).sum()) * self.page_size

    @property
    def available_swa(self) -> int:
        """Free SWA slots (free pages x page_size), like sglang's ``swa_available_size``."""
        return int((~self._swa_alloc[1:]).sum()) * self.page_size

    def translate(self, loc: np.ndarray) -> np.ndarray:
        """:func:`translate_full_to_swa` on the current mapping."""
        return translate_full_to_swa(self._mapping, loc)

    # -- helpers -----------------------------------------------------------------------------

    def _page_slots(self, pages) -> np.ndarray:
        pages = np.asarray(pages, dtype=np.int64)
        return (pages[:, None] * self.page_size + np.arange(self.page_size)).reshape(-1)

    @staticmethod
    def _lowest_free(allocated: np.ndarray, count: int) -> np.ndarray | None:
        free = np.flatnonzero(~allocated[1:]) + 1
        return free[:count] if free.size >= count else None

    def _require_full_slots(self, name: str, slots) -> np.ndarray:
        """Validated 1-D full slots whose pages are allocated; returns their unique pages."""
        v.require_index(name, slots)
        lo, hi = self.page_size, self.size_full + self.page_size
        for i, s in enumerate(slots.tolist()):
            if not lo <= s < hi:
                raise ValueError(f"{name}[{i}] = {s}: not a full slot; full slots are [{lo}, {hi})")
            if not self._full_alloc[s // self.page_size]:
                raise ValueError(
                    f"{name}[{i}] = {s}: full page {s // self.page_size} is not allocated "
                    "(double free, or never allocated)"
                )
        return np.unique(slots.astype(np.int64) // self.page_size)

    def _swa_page_of(self, name: str, full_page: int) -> int | None:
        """The SWA page a full page maps into, None if it maps nowhere (all zero).
        Raises on a corrupt page (several SWA pages, or one that is not allocated)."""
        entries = self._mapping[self._page_slots([full_page])]
        nonzero = entries[entries != 0]
        if nonzero.size == 0:
            return None
        pages = np.unique(nonzero // self.page_size)
        page = int(pages[0])
        if pages.size != 1 or not 0 < page < self._swa_alloc.size or not self._swa_alloc[page]:
            raise ValueError(
                f"{name}: full page {full_page} maps to {nonzero.tolist()}, not into one allocated "
                "SWA page; the mapping is corrupt (see check_invariants())"
            )
        return page

    # -- operations --------------------------------------------------------------------------

    def alloc(self, n: int) -> np.ndarray | None:
        """Allocate ``n`` tokens as ``n / page_size`` whole pages from each pool and map them
        slot by slot (``mapping[full] = swa``). Returns the full slots (int64, ascending), or
        None when either pool lacks the pages. ``n`` must be a multiple of ``page_size``, as
        sglang's paged allocator asserts; use ``alloc_extend(-1, n)`` for a partial page."""
        n = v.require_int("n", n, 0)
        v.require_page_multiple("n", n, self.page_size)
        need = n // self.page_size
        full_pages = self._lowest_free(self._full_alloc, need)
        swa_pages = self._lowest_free(self._swa_alloc, need)
        if full_pages is None or swa_pages is None:
            return None
        self._full_alloc[full_pages] = True
        self._swa_alloc[swa_pages] = True
        full = self._page_slots(full_pages)
        self._mapping[full] = self._page_slots(swa_pages)
        return full

    def alloc_extend(self, last_loc: int, n: int) -> np.ndarray | None:
        """Append ``n`` tokens to a request whose last written full slot is ``last_loc``
        (-1: the request has no prefix). Returns the ``n`` new full slots in token order, or
        None when either pool lacks the pages.

        First the rest of ``last_loc``'s page is used: the translation of ``last_loc`` names the
        SWA page (-1 translates through the sentinel to -1: no page, nothing to fill), and slot
        ``last_loc + k`` maps to ``translate(last_loc) + k``. The remaining tokens take new pages,
        lowest first, from both pools; only the returned slots are mapped, so a new page's unused
        tail maps to 0 until a later extension. ``last_loc`` must be -1 or a slot of an allocated
        full page that still has its SWA page and is the last mapped slot of that page.
        """
        if isinstance(last_loc, (bool, np.bool_)) or not isinstance(last_loc, (int, np.integer)):
            raise TypeError(f"last_loc must be an int, got {type(last_loc).__name__} {last_loc!r}")
        last_loc = int(last_loc)
        n = v.require_int("n", n, 0)
        ps = self.page_size
        lo, hi = ps, self.size_full + ps
        if last_loc != SENTINEL:
            if not lo <= last_loc < hi:
                raise ValueError(f"last_loc={last_loc}: neither -1 nor a full slot; full slots "
                                 f"are [{lo}, {hi})")
            if not self._full_alloc[last_loc // ps]:
                raise ValueError(f"last_loc={last_loc}: full page {last_loc // ps} is not "
                                 "allocated")
            self._swa_page_of("last_loc", last_loc // ps)  # raises on a corrupt page
        swa_last = int(self.translate(np.array([last_loc], dtype=np.int64))[0])
        if last_loc == SENTINEL:
            room = 0  # -1 went through the sentinel: no page to continue
        else:
            if swa_last == 0:
                raise ValueError(
                    f"last_loc={last_loc} translates to 0: its SWA page was released (free_swa) "
                    "or the slot was never written; extending would write into the padding slot"
                )
            if swa_last % ps != last_loc % ps:
                raise ValueError(f"last_loc={last_loc} maps to SWA slot {swa_last} at another "
                                 "page offset; the mapping is corrupt (see check_invariants())")
            room = ps - 1 - last_loc % ps
            tail = self._mapping[last_loc + 1:last_loc + 1 + room]
            if np.any(tail != 0):
                first = last_loc + 1 + int(np.flatnonzero(tail)[0])
                raise ValueError(
                    f"last_loc={last_loc} is not the last written slot of its page: "
                    f"mapping[{first}] = {int(self._mapping[first])} is already set"
                )
        k = min(room, n)
        rest = n - k
        need = -(-rest // ps)
        full_pages = self._lowest_free(self._full_alloc, need)
        swa_pages = self._lowest_free(self._swa_alloc, need)
        if full_pages is None or swa_pages is None:
            return None
        full = np.concatenate([last_loc + 1 + np.arange(k), self._page_slots(full_pages)[:rest]])
        swa = np.concatenate([swa_last + 1 + np.arange(k), self._page_slots(swa_pages)[:rest]])
        self._full_alloc[full_pages] = True
        self._swa_alloc[swa_pages] = True
        self._mapping[full] = swa
        return full.astype(np.int64)

    def free(self, full_slots: np.ndarray) -> None:
        """Free the pages containing ``full_slots``: first their SWA pages, where still mapped
        (a page already released by ``free_swa`` is skipped), then the full pages; the mapping
        of each whole page is cleared to 0. Slots must lie in allocated full pages (a double
        free raises); duplicates and page-mates are fine. Models sglang's ``free``."""
        pages = self._require_full_slots("full_slots", full_slots)
        swa_pages = {self._swa_page_of("full_slots", int(p)) for p in pages} - {None}
        self._swa_alloc[sorted(swa_pages)] = False
        self._mapping[self._page_slots(pages)] = 0
        self._full_alloc[pages] = False

    def free_swa(self, full_slots: np.ndarray) -> None:
        """Free only the SWA pages of the pages containing ``full_slots`` and clear the mapping
        of each whole page to 0 (page-granular since sglang #27779); the full pages stay
        allocated. Each page must still have its SWA page: sglang only signals (it expects the
        mapping > 0 and drops entries <= 0), the model raises."""
        pages = self._require_full_slots("full_slots", full_slots)
        swa_pages = []
        for p in pages.tolist():
            page = self._swa_page_of("full_slots", p)
            if page is None:
                raise ValueError(
                    f"full_slots: full page {p} (slots {p * self.page_size}.."
                    f"{(p + 1) * self.page_size - 1}) has no SWA page (already released?)"
                )
            swa_pages.append(page)
        self._swa_alloc[swa_pages] = False
        self._mapping[self._page_slots(pages)] = 0

    def clear(self) -> None:
        """Everything free; the mapping is zero except the trailing sentinel (sglang ``clear``)."""
        self._full_alloc[:] = False
        self._swa_alloc[:] = False
        self._mapping[:-1] = 0

    def set_full_to_swa_mapping(self, full: np.ndarray, swa: np.ndarray) -> None:
        """Raw write ``mapping[full] = swa``, as sglang's ``set_full_to_swa_mapping``: no
        allocation state is checked or changed (``check_invariants`` reports what it breaks).
        ``full``: 1-D int32/int64 indices of the table proper ``[0, size_full + page_size)``,
        no duplicates (the write order would decide). ``swa``: same length, values in
        ``[0, size_swa + page_size)``."""
        v.require_index("full", full)
        v.require_index("swa", swa)
        v.require_shape("swa", swa, full.shape, "one SWA slot per full slot")
        table, swa_hi = self.size_full + self.page_size, self.size_swa + self.page_size
        for i, f in enumerate(full.tolist()):
            if not 0 <= f < table:
                raise ValueError(f"full[{i}] = {f}: outside the table [0, {table})")
        for i, s in enumerate(swa.tolist()):
            if not 0 <= s < swa_hi:
                raise ValueError(f"swa[{i}] = {s}: not an SWA slot; SWA slots are [0, {swa_hi})")
        uniq, counts = np.unique(full, return_counts=True)
        if np.any(counts > 1):
            dup = int(uniq[counts > 1][0])
            raise ValueError(f"full[{int(np.flatnonzero(full == dup)[1])}] = {dup}: duplicate "
                             "full slot (which write wins would be undefined)")
        self._mapping[full.astype(np.int64)] = swa

    # -- invariants --------------------------------------------------------------------------

    def check_invariants(self) -> list[str]:
        """Every broken invariant, one message each; empty when the state is consistent.

        1. the mapping is int64 of length ``size_full + page_size + 1`` ending in the -1 sentinel;
        2. slot 0 (the padding slot) maps to 0;
        3. full slots outside allocated pages (freed, never allocated, or page 0) map to 0;
        4. every nonzero entry points into an allocated SWA page;
        5. no SWA slot is mapped from two live full slots;
        6. each full page maps into one SWA page at the same offsets, and no two full pages
           share a SWA page (free_swa frees whole pages);
        7. every allocated SWA page is reached from some full slot (else it leaked).
        """
        problems = []
        m, ps = self._mapping, self.page_size
        expected_len = self.size_full + ps + 1
        if m.dtype != np.int64 or m.shape != (expected_len,):
            problems.append(f"mapping has dtype {m.dtype} shape {m.shape}; expected int64 "
                            f"({expected_len},)")
            return problems
        if m[-1] != SENTINEL:
            problems.append(f"sentinel broken: mapping[{expected_len - 1}] = {int(m[-1])}, not -1")
        table = m[:-1]
        if table[0] != 0:
            problems.append(f"slot 0 (padding) maps to {int(table[0])}, not 0")
        slot_page = np.arange(table.size) // ps
        live = self._full_alloc[slot_page]
        stray = np.flatnonzero(~live & (table != 0))
        if stray.size:
            problems.append(f"full slots outside allocated pages map to nonzero: "
                            f"{ {int(s): int(table[s]) for s in stray[:8]} }")
        nz = np.flatnonzero(table != 0)
        values = table[nz]
        swa_page = values // ps
        valid = (values >= ps) & (values < self.size_swa + ps)
        valid[valid] = self._swa_alloc[swa_page[valid]]
        if not valid.all():
            bad = nz[~valid]
            problems.append(f"entries point outside allocated SWA pages: "
                            f"{ {int(s): int(table[s]) for s in bad[:8]} }")
        live_nz = nz[live[nz]]
        uniq, counts = np.unique(table[live_nz], return_counts=True)
        if np.any(counts > 1):
            dup = int(uniq[counts > 1][0])
            problems.append(f"SWA slot {dup} is mapped from several live full slots: "
                            f"{np.flatnonzero(table == dup).tolist()}")
        owner = {}
        for s in live_nz.tolist():
            fp, sp = s // ps, int(table[s]) // ps
            if int(table[s]) % ps != s % ps:
                problems.append(f"full slot {s} (offset {s % ps}) maps to SWA slot "
                                f"{int(table[s])} (offset {int(table[s]) % ps})")
            owner.setdefault(sp, set()).add(fp)
        for sp, fps in sorted(owner.items()):
            if len(fps) > 1:
                problems.append(f"SWA page {sp} is shared by full pages {sorted(fps)}")
        pages_of = {}
        for sp, fps in owner.items():
            for fp in fps:
                pages_of.setdefault(fp, set()).add(sp)
        for fp, sps in sorted(pages_of.items()):
            if len(sps) > 1:
                problems.append(f"full page {fp} maps into several SWA pages {sorted(sps)}")
        reached = set(owner)
        leaked = [int(p) for p in np.flatnonzero(self._swa_alloc) if int(p) not in reached]
        if leaked:
            problems.append(f"allocated SWA pages reached from no full slot (leaked): {leaked}")
        if self._full_alloc[0] or self._swa_alloc[0]:
            problems.append("page 0 (the reserved padding page) is marked allocated")
        return problems
