"""The allocator half of :class:`~oracle.kernels.swa_pool.SwaKVPool`: the full and SWA page pools
and the full->SWA table, and every operation that changes them.

The table. ``size_full + page_size`` int64 entries, then one ``-1`` *sentinel*. Page 0 of each
pool is reserved (slot 0 is the padding slot), so full slots are ``[page_size, size_full +
page_size)`` and SWA slots ``[page_size, size_swa + page_size)``; 0 means "unmapped", and a freed
or never-allocated full slot translates to the SWA padding slot 0.

Allocation order: every allocation takes the lowest-numbered free pages, ascending, in both pools,
so that the pool and the numpy model (:class:`oracle.reference.swa_model.SwaAllocatorModel`) agree slot
for slot. Every operation checks all its arguments before it changes anything.

:class:`PageAllocator` is a base class, not a pool on its own: the pool's constructor sets up its
state (:meth:`PageAllocator._init_pages`), and every completed call of a method in
:data:`MUTATORS` ends in ``self._mapping_changed(<method name>)``, where the pool drops its
translation cache.
"""

from __future__ import annotations

import operator

import numpy as np
import torch

from .._checks import INDEX_DTYPES, require_index
from .translate import SENTINEL

# the mutating methods, each of which must invalidate the translation cache
MUTATORS = ("alloc", "alloc_extend", "free", "free_swa", "clear", "set_full_to_swa_mapping",
            "register_mapping")


def _as_int(name: str, value) -> int:
    """A Python, numpy or 0-d tensor integer (not a bool) as an int; ``TypeError`` otherwise."""
    if isinstance(value, (bool, np.bool_)) or not hasattr(value, "__index__"):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    try:
        return operator.index(value)
    except TypeError:
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}") from None


def _require_int(name: str, value, minimum: int) -> int:
    value = _as_int(name, value)
    if value < minimum:
        raise ValueError(f"{name}={value} must be >= {minimum}")
    return value


class PageAllocator:
    """Full and SWA page pools and the full->SWA table (see the module doc); the base of
    :class:`~oracle.kernels.swa_pool.SwaKVPool`, which documents the operations as one API."""

    def _init_pages(self, size_full: int, size_swa: int, page_size: int, device) -> None:
        """The empty pools and table, on ``device``, for already validated sizes."""
        self.size_full, self.size_swa, self.page_size = size_full, size_swa, page_size
        # as tensors report it ("cuda" becomes "cuda:0"), so that device checks compare equal
        self.device = torch.empty(0, device=device).device
        # allocated flags per page; index 0 is the reserved page and stays False
        self._full_alloc = torch.zeros(size_full // page_size + 1, dtype=torch.bool, device=self.device)
        self._swa_alloc = torch.zeros(size_swa // page_size + 1, dtype=torch.bool, device=self.device)
        self._offsets = torch.arange(page_size, dtype=torch.int64, device=self.device)
        self.full_to_swa_index_mapping = torch.zeros(size_full + page_size + 1, dtype=torch.int64,
                                                     device=self.device)
        self.full_to_swa_index_mapping[-1] = SENTINEL

    def _mapping_changed(self, method: str) -> None:
        """Every mutating method ends here (``method`` names it); the pool invalidates its cache."""
        raise NotImplementedError

    # -- read-only views ---------------------------------------------------------------------

    @property
    def table_size(self) -> int:
        """Entries of the table proper, ``size_full + page_size`` (the sentinel is after them)."""
        return self.size_full + self.page_size

    @property
    def live_full_slots(self) -> torch.Tensor:
        """Every slot of every allocated full page, ascending (int64, on the pool's device)."""
        return self._page_slots(torch.nonzero(self._full_alloc).reshape(-1))

    @property
    def available_full(self) -> int:
        """Free full slots (free pages x page_size)."""
        return int((~self._full_alloc[1:]).sum()) * self.page_size

    @property
    def available_swa(self) -> int:
        """Free SWA slots (free pages x page_size)."""
        return int((~self._swa_alloc[1:]).sum()) * self.page_size

    # -- helpers -----------------------------------------------------------------------------

    def _page_slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages.to(torch.int64)[:, None] * self.page_size + self._offsets).reshape(-1)

    @staticmethod
    def _lowest_free(allocated: torch.Tensor, count: int) -> torch.Tensor | None:
        free = torch.nonzero(~allocated[1:]).reshape(-1) + 1
        return free[:count] if free.numel() >= count else None

    def _require_slots(self, name: str, slots) -> torch.Tensor:
        """A 1-D int32/int64 tensor on the pool's device, returned as int64."""
        require_index(name, slots)
        if slots.device != self.device:
            raise ValueError(f"{name} is on {slots.device}; the pool is on {self.device}")
        return slots.to(torch.int64)

    def _require_full_slots(self, name: str, slots) -> torch.Tensor:
        """Validated full slots whose pages are allocated; returns their unique pages."""
        slots = self._require_slots(name, slots)
        lo, hi, ps = self.page_size, self.table_size, self.page_size
        outside = (slots < lo) | (slots >= hi)
        if bool(outside.any()):
            i = int(torch.nonzero(outside)[0, 0])
            raise ValueError(f"{name}[{i}] = {int(slots[i])}: not a full slot; full slots are "
                             f"[{lo}, {hi})")
        unallocated = ~self._full_alloc[slots // ps]
        if bool(unallocated.any()):
            i = int(torch.nonzero(unallocated)[0, 0])
            s = int(slots[i])
            raise ValueError(f"{name}[{i}] = {s}: full page {s // ps} is not allocated (double "
                             "free, or never allocated)")
        return torch.unique(slots // ps)

    def _swa_pages_of(self, name: str, full_pages: torch.Tensor) -> list:
        """Per full page, the SWA page it maps into, or None when it maps nowhere; raises on a
        corrupt page (several SWA pages, or an unallocated one)."""
        ps = self.page_size
        entries = self.full_to_swa_index_mapping[self._page_slots(full_pages)].reshape(-1, ps)
        out = []
        for page, row in zip(full_pages.tolist(), entries.tolist()):
            nonzero = [e for e in row if e != 0]
            if not nonzero:
                out.append(None)
                continue
            pages = sorted({e // ps for e in nonzero})
            swa = pages[0]
            if len(pages) != 1 or not 0 < swa < self._swa_alloc.numel() or not bool(self._swa_alloc[swa]):
                raise ValueError(f"{name}: full page {page} maps to {nonzero}, not into one "
                                 "allocated SWA page; the mapping is corrupt")
            out.append(swa)
        return out

    # -- allocation --------------------------------------------------------------------------

    def alloc(self, n: int) -> torch.Tensor | None:
        """``n / page_size`` whole pages from each pool (lowest free first), mapped slot by slot;
        returns the full slots (int64, ascending), or None, changing nothing, when either pool
        lacks the pages. ``n`` must be a multiple of ``page_size``. Invalidates the cache."""
        n = _require_int("n", n, 0)
        if n % self.page_size:
            raise ValueError(f"n={n} is not a multiple of page_size={self.page_size}")
        need = n // self.page_size
        full_pages = self._lowest_free(self._full_alloc, need)
        swa_pages = self._lowest_free(self._swa_alloc, need)
        if full_pages is None or swa_pages is None:
            return None
        self._full_alloc[full_pages] = True
        self._swa_alloc[swa_pages] = True
        full = self._page_slots(full_pages)
        self.full_to_swa_index_mapping[full] = self._page_slots(swa_pages)
        self._mapping_changed("alloc")
        return full

    def alloc_extend(self, last_loc: int, n: int) -> torch.Tensor | None:
        """Append ``n`` tokens to a request whose last written full slot is ``last_loc`` (-1: no
        prefix); returns the ``n`` new full slots in token order, or None (no change) when
        either pool lacks the pages.

        The rest of ``last_loc``'s page is used first: slot ``last_loc + k`` maps to
        ``translate(last_loc) + k`` (for -1 the translation is -1: no page to continue). The
        remaining tokens take new pages, lowest first; only the returned slots are mapped.
        ``last_loc`` must be -1 or the last mapped slot of an allocated full page that still has
        its SWA page. Invalidates the cache.
        """
        last_loc = _as_int("last_loc", last_loc)
        n = _require_int("n", n, 0)
        ps, m = self.page_size, self.full_to_swa_index_mapping
        lo, hi = ps, self.table_size
        if last_loc == SENTINEL:
            room, swa_last = 0, SENTINEL
        else:
            if not lo <= last_loc < hi:
                raise ValueError(f"last_loc={last_loc}: neither -1 nor a full slot; full slots are "
                                 f"[{lo}, {hi})")
            if not bool(self._full_alloc[last_loc // ps]):
                raise ValueError(f"last_loc={last_loc}: full page {last_loc // ps} is not allocated")
            self._swa_pages_of("last_loc", torch.tensor([last_loc // ps], device=self.device))
            swa_last = int(m[last_loc])
            if swa_last == 0:
                raise ValueError(f"last_loc={last_loc} translates to 0: its SWA page was released "
                                 "(free_swa) or the slot was never written")
            if swa_last % ps != last_loc % ps:
                raise ValueError(f"last_loc={last_loc} maps to SWA slot {swa_last} at another page "
                                 "offset; the mapping is corrupt")
            room = ps - 1 - last_loc % ps
            tail = m[last_loc + 1:last_loc + 1 + room]
            if bool((tail != 0).any()):
                first = last_loc + 1 + int(torch.nonzero(tail)[0, 0])
                raise ValueError(f"last_loc={last_loc} is not the last written slot of its page: "
                                 f"mapping[{first}] = {int(m[first])} is already set")
        k = min(room, n)
        rest = n - k
        need = -(-rest // ps)
        full_pages = self._lowest_free(self._full_alloc, need)
        swa_pages = self._lowest_free(self._swa_alloc, need)
        if full_pages is None or swa_pages is None:
            return None
        step = torch.arange(1, k + 1, dtype=torch.int64, device=self.device)
        full = torch.cat([last_loc + step, self._page_slots(full_pages)[:rest]])
        swa = torch.cat([swa_last + step, self._page_slots(swa_pages)[:rest]])
        self._full_alloc[full_pages] = True
        self._swa_alloc[swa_pages] = True
        m[full] = swa
        self._mapping_changed("alloc_extend")
        return full

    def free(self, full_slots: torch.Tensor) -> None:
        """Free the pages containing ``full_slots``: their SWA pages where still mapped, then the
        full pages; the mapping of each **whole page** is cleared to 0, not only the named
        slots. Slots must lie in allocated full pages (a double free raises); duplicates and
        page-mates are fine. Invalidates the cache."""
        pages = self._require_full_slots("full_slots", full_slots)
        swa_pages = [p for p in self._swa_pages_of("full_slots", pages) if p is not None]
        if swa_pages:
            self._swa_alloc[torch.tensor(swa_pages, device=self.device)] = False
        self._clear_mapping(pages, full_slots)
        self._full_alloc[pages] = False
        self._mapping_changed("free")

    def _clear_mapping(self, pages: torch.Tensor, full_slots: torch.Tensor) -> None:
        """``free``'s clearing: every slot of ``pages`` maps to 0 again."""
        self.full_to_swa_index_mapping[self._page_slots(pages)] = 0

    def free_swa(self, full_slots: torch.Tensor) -> None:
        """Free only the SWA pages of the pages containing ``full_slots`` and clear the mapping
        of each whole page to 0; the full pages stay allocated. Each page must still have its
        SWA page (``ValueError`` otherwise). Invalidates the cache."""
        pages = self._require_full_slots("full_slots", full_slots)
        swa_pages = self._swa_pages_of("full_slots", pages)
        for page, swa in zip(pages.tolist(), swa_pages):
            if swa is None:
                raise ValueError(f"full_slots: full page {page} (slots {page * self.page_size}.."
                                 f"{(page + 1) * self.page_size - 1}) has no SWA page (already "
                                 "released?)")
        if swa_pages:
            self._swa_alloc[torch.tensor(swa_pages, device=self.device)] = False
        self.full_to_swa_index_mapping[self._page_slots(pages)] = 0
        self._mapping_changed("free_swa")

    def clear(self) -> None:
        """Everything free; the mapping is zero except the trailing -1 sentinel, which stays.
        Invalidates the cache."""
        self._full_alloc.zero_()
        self._swa_alloc.zero_()
        self.full_to_swa_index_mapping[:-1] = 0
        self._mapping_changed("clear")

    def set_full_to_swa_mapping(self, full: torch.Tensor, swa: torch.Tensor) -> None:
        """Raw write ``mapping[full] = swa`` (no allocation state checked or changed). ``full``:
        1-D int32/int64 slots of the table proper ``[0, size_full + page_size)``, no duplicates;
        ``swa``: as many SWA slots in ``[0, size_swa + page_size)``. Invalidates the cache."""
        full = self._require_slots("full", full)
        swa = self._require_slots("swa", swa)
        if swa.shape != full.shape:
            raise ValueError(f"swa has shape {tuple(swa.shape)}; expected {tuple(full.shape)} (one "
                             "SWA slot per full slot)")
        for name, values, hi, what in (("full", full, self.table_size, "outside the table"),
                                       ("swa", swa, self.size_swa + self.page_size, "not an SWA slot")):
            bad = (values < 0) | (values >= hi)
            if bool(bad.any()):
                i = int(torch.nonzero(bad)[0, 0])
                raise ValueError(f"{name}[{i}] = {int(values[i])}: {what}; allowed [0, {hi})")
        if torch.unique(full).numel() != full.numel():
            raise ValueError("full has duplicate slots (which write wins would be undefined)")
        self.full_to_swa_index_mapping[full] = swa
        self._mapping_changed("set_full_to_swa_mapping")

    def register_mapping(self, mapping: torch.Tensor) -> None:
        """Adopt ``mapping`` as the full->SWA table (sglang's allocator hands its table to the
        pool this way; HiCache rebuilds it). It must be 1-D int32/int64 of length ``size_full +
        page_size + 1`` with table entries in ``[0, size_swa + page_size)`` and the -1 sentinel
        last. The pool copies it (onto its device, as int64), so a later write by the caller
        cannot bypass invalidation; allocation state is not changed. Invalidates the cache."""
        if not isinstance(mapping, torch.Tensor) or mapping.dtype not in INDEX_DTYPES:
            raise TypeError(f"mapping must be an int32/int64 torch.Tensor, got "
                            f"{getattr(mapping, 'dtype', type(mapping).__name__)}")
        want = self.table_size + 1
        if tuple(mapping.shape) != (want,):
            raise ValueError(f"mapping has shape {tuple(mapping.shape)}; expected ({want},)")
        new = mapping.to(device=self.device, dtype=torch.int64, copy=True)
        if int(new[-1]) != SENTINEL:
            raise ValueError(f"mapping[-1] = {int(new[-1])}: the last entry must be the -1 sentinel")
        table = new[:-1]
        bad = (table < 0) | (table >= self.size_swa + self.page_size)
        if bool(bad.any()):
            i = int(torch.nonzero(bad)[0, 0])
            raise ValueError(f"mapping[{i}] = {int(table[i])}: not an SWA slot; allowed "
                             f"[0, {self.size_swa + self.page_size})")
        self.full_to_swa_index_mapping = new
        self._mapping_changed("register_mapping")
