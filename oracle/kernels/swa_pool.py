"""A torch sliding-window (SWA) KV pool and allocator with a cached full->SWA translation.

Hybrid models keep a *full* pool (full-attention layers) and a smaller *SWA* pool (sliding-window
layers). Every token gets a slot in both; ``full_to_swa_index_mapping`` records, per full slot,
the SWA slot that holds the same token. :class:`SwaKVPool` is the allocator and the SWA pool in
one object, on CPU or CUDA tensors (``device`` is an argument). It follows the contract of the
numpy model :class:`oracle.reference.swa.SwaAllocatorModel` operation by operation (same pages,
same slots, same errors by type), and ``conformance/test_swa_pool.py`` drives the two side by
side. The caching design follows sglang #25824 (facts only: ``../shared/seeds``); see
``docs/swa-pool.md``.

The table. ``size_full + page_size`` int64 entries, then one ``-1`` *sentinel*. Page 0 of each
pool is reserved (slot 0 is the padding slot), so full slots are ``[page_size, size_full +
page_size)`` and SWA slots ``[page_size, size_swa + page_size)``; 0 means "unmapped", and a freed
or never-allocated full slot translates to the SWA padding slot 0.

The cache. :meth:`SwaKVPool.translate_loc_from_full_to_swa` memoises its last result, keyed on
the index tensor's ``data_ptr()`` (the address of its first element, which includes the storage
offset) and ``numel()``, plus its shape, strides, dtype and device. ``data_ptr()``, never
``untyped_storage().data_ptr()``: two views at different offsets of one buffer share the storage
base pointer and would collide. Shape and strides are added because ``(data_ptr, numel)`` alone
still lets ``buf[0:4]`` and ``buf[0:8:2]`` (same start, same length, other elements) collide.
The entry keeps a reference to the keyed tensor, so its memory cannot be recycled for a new tensor
that would then hit the entry.

Invalidation. Every completed call of a method that changes the mapping
(:meth:`~SwaKVPool.alloc`, :meth:`~SwaKVPool.alloc_extend`, :meth:`~SwaKVPool.free`,
:meth:`~SwaKVPool.free_swa`, :meth:`~SwaKVPool.clear`, :meth:`~SwaKVPool.set_full_to_swa_mapping`,
:meth:`~SwaKVPool.register_mapping`) drops the cache, even when it ends up changing no entry; a
call that raises, or an allocation that returns None, has changed nothing and keeps it.
What the pool cannot see is a caller rewriting an index tensor in place (a static buffer reused
across forward steps, a CUDA-graph input): the caller calls :meth:`~SwaKVPool.invalidate_loc_cache`
once per forward step, before the first translation, as sglang's graph runners do in
``run_once``.

Registered through the plug-in API like any kernel: :func:`register` registers
:func:`translate_full_to_swa`, the function the pool translates with on a cache miss, as
``swa_pool.translate_full_to_swa`` (and ``swa_pool.translate_full_to_swa.cuda`` on CUDA
tensors).
"""

from __future__ import annotations

import operator
from typing import Callable

import numpy as np
import torch

import oracle

from ._checks import INDEX_DTYPES, check_translate

SENTINEL = -1
DEFAULT_STORE_CACHE = "torch.store_cache"

# the mutating methods, each of which must invalidate the translation cache
MUTATORS = ("alloc", "alloc_extend", "free", "free_swa", "clear", "set_full_to_swa_mapping",
            "register_mapping")


# --------------------------------------------------------------------------------------------
# the translation a cache miss runs (also the registered kernel)


def _position(shape: tuple, flat_index: int) -> str:
    """``'loc[3]'`` or ``'loc[1, 2]'`` for the C-order flat index into a tensor of that shape."""
    if len(shape) == 0:
        return "loc[()]"
    idx = []
    for size in reversed(shape):
        idx.append(flat_index % size)
        flat_index //= size
    return f"loc[{', '.join(str(i) for i in reversed(idx))}]"


def translate_full_to_swa(mapping: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """``mapping[loc]`` as a new tensor of ``mapping``'s dtype and ``loc``'s shape, strictly.

    * ``mapping``: a non-empty 1-D int32/int64 tensor whose last entry is the -1 sentinel (any
      stride or storage offset); entries ``[0, len - 1)`` are the table proper.
    * ``loc``: int32/int64, any shape, strides and storage offset, on ``mapping``'s device.
    * ``-1`` translates to ``-1``, handled explicitly (it is masked, not read through
      ``mapping[-1]``); any other negative value, and any value ``>= len - 1`` (the sentinel's
      own index included), raises ``ValueError`` naming the first offending position in C order,
      before anything is computed. Wrong types or dtypes raise ``TypeError``.

    Checking ``loc`` reads it on the host (one device synchronisation on CUDA). Neither input is
    modified and the result never shares memory with them.
    """
    check_translate(mapping, loc)
    if loc.device != mapping.device:
        raise ValueError(f"loc is on {loc.device} but mapping is on {mapping.device}")
    table = mapping.numel() - 1  # mapping[table] is the sentinel
    if int(mapping[table]) != SENTINEL:
        raise ValueError(f"mapping[-1] = {int(mapping[table])} (mapping[{table}]): the last entry "
                         "must be the -1 sentinel")
    bad = (((loc < 0) & (loc != SENTINEL)) | (loc >= table)).reshape(-1)
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0, 0])
        value = int(loc.reshape(-1)[i])
        where = f"{_position(tuple(loc.shape), i)} = {value}"
        if value < 0:
            raise ValueError(f"{where}: only -1 (the padding sentinel) may be negative; plain "
                             f"indexing would wrap it to mapping[{value}]")
        raise ValueError(f"{where}: past the table (entries 0..{table - 1}); mapping[{table}] is "
                         "the sentinel, reached only through -1")
    padding = loc == SENTINEL
    out = mapping[loc.long().clamp_min(0)]  # a fresh tensor; -1 reads mapping[0], then masked
    return out.masked_fill_(padding, SENTINEL)


def default_translate_fn(device) -> Callable:
    """The translation a pool on ``device`` uses on a cache miss: the Triton kernel
    (``oracle.kernels.triton.ops.translate_full_to_swa``, -1 handled in the kernel, nothing read
    outside the table) for CUDA tensors where Triton can run, else :func:`translate_full_to_swa`.
    The Triton package is imported here, lazily, and only for CUDA pools."""
    if torch.device(device).type == "cuda":
        try:
            from .triton import backend_info, ops
        except ImportError:
            return translate_full_to_swa
        info = backend_info()
        if info["reason"] is None and not info["interpret"]:
            return ops.translate_full_to_swa
    return translate_full_to_swa


def resolve_store_cache(name: str) -> Callable:
    """The ``store_cache`` kernel registered under ``name`` (plug-ins discovered on first use);
    ``ValueError`` listing the registered ones when there is none, or it cannot run here."""
    from ..registry import default_registry

    registry = default_registry.discover()
    found = registry.select(op="store_cache", kernel=name)
    if not found:
        names = [k.name for k in registry.select(op="store_cache")]
        raise ValueError(f"store_cache={name!r}: no store_cache kernel of that name is registered "
                         f"(registered: {', '.join(names) or 'none'})")
    reason = found[0].unavailable()
    if reason:
        raise ValueError(f"store_cache={name!r} cannot run here: {reason}")
    return found[0]


# --------------------------------------------------------------------------------------------
# argument checks


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


class SwaKVPool:
    """Full and SWA page pools, the full->SWA table, the cached translation, SWA KV buffers.

    ``SwaKVPool(size_full, size_swa, page_size, device="cpu", *, num_layers=0, head_num=None,
    head_dim=None, dtype=torch.float32, store_cache="torch.store_cache", translate_fn=None)``

    * ``size_full`` / ``size_swa``: allocatable slots of each pool, positive multiples of the
      positive ``page_size``. Page 0 of each is reserved.
    * ``num_layers``, ``head_num``, ``head_dim``, ``dtype``: the SWA KV buffers, one K and one V
      tensor ``[size_swa + page_size, head_num, head_dim]`` per layer (none when ``num_layers``
      is 0: a pool used only for allocation and translation).
    * ``store_cache``: the registered ``store_cache`` kernel :meth:`set_kv_buffer` writes
      through, by name (resolved from the plug-in registry on first use), or a callable with
      its signature ``fn(k, v, k_cache, v_cache, loc)``.
    * ``translate_fn``: ``fn(mapping, loc) -> Tensor`` run on a cache miss; default
      :func:`default_translate_fn` for the device.

    Allocation order: every allocation takes the lowest-numbered free pages, ascending, in both
    pools, so that the pool and the model agree slot for slot. Every operation checks all its
    arguments before it changes anything: a rejected call (``ValueError`` / ``TypeError``
    naming the argument) leaves the pool as it was. ``alloc`` / ``alloc_extend`` return None,
    changing nothing, when either pool lacks the pages.

    Not thread-safe; one pool belongs to one scheduler.
    """

    def __init__(self, size_full: int, size_swa: int, page_size: int, device="cpu", *,
                 num_layers: int = 0, head_num: int | None = None, head_dim: int | None = None,
                 dtype: torch.dtype = torch.float32, store_cache: str | Callable = DEFAULT_STORE_CACHE,
                 translate_fn: Callable | None = None):
        page_size = _require_int("page_size", page_size, 1)
        size_full = _require_int("size_full", size_full, 1)
        size_swa = _require_int("size_swa", size_swa, 1)
        for name, value in (("size_full", size_full), ("size_swa", size_swa)):
            if value % page_size:
                raise ValueError(f"{name}={value} is not a multiple of page_size={page_size}")
        num_layers = _require_int("num_layers", num_layers, 0)
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
        self.translate_fn = translate_fn or default_translate_fn(self.device)
        self._store_cache = store_cache
        self.k_buffer: list[torch.Tensor] = []
        self.v_buffer: list[torch.Tensor] = []
        if num_layers:
            if head_num is None or head_dim is None:
                raise ValueError("num_layers > 0 needs head_num and head_dim for the KV buffers")
            head_num = _require_int("head_num", head_num, 1)
            head_dim = _require_int("head_dim", head_dim, 1)
            shape = (size_swa + page_size, head_num, head_dim)
            self.k_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
            self.v_buffer = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self._cache_key = None
        self._cache_loc = None  # keeps the keyed tensor alive: its address cannot be reused
        self._cache_value = None
        self.cache_hits = 0
        self.cache_misses = 0
        self.invalidations = 0

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(size_full={self.size_full}, size_swa={self.size_swa}, "
                f"page_size={self.page_size}, device={str(self.device)!r})")

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

    # -- the cache ---------------------------------------------------------------------------

    def _loc_key(self, loc: torch.Tensor) -> tuple:
        """The cache key: ``data_ptr()`` (first element's address, storage offset included),
        ``numel()``, and the shape, strides, dtype and device."""
        return (loc.data_ptr(), loc.numel(), tuple(loc.shape), loc.stride(), loc.dtype, loc.device)

    def invalidate_loc_cache(self) -> None:
        """Forget the cached translation. The pool calls it on every change of the mapping; a
        caller calls it once per forward step, before the first translation, because it may
        have rewritten an index tensor in place."""
        self._cache_key = self._cache_loc = self._cache_value = None
        self.invalidations += 1

    def _mapping_changed(self, method: str) -> None:
        """Every mutating method ends here (``method`` names it)."""
        self.invalidate_loc_cache()

    def translate_loc_from_full_to_swa(self, loc: torch.Tensor) -> torch.Tensor:
        """The SWA slots of the full slots in ``loc`` (-1 -> -1), through the cache.

        ``loc``: int32/int64 on the pool's device, any shape and strides. On a hit (same
        ``data_ptr``, numel, shape, strides, dtype, device as the last translation, and no
        invalidation since) the cached tensor itself is returned, so several SWA layers of one
        forward step translate once; callers must not write into it. On a miss the translation
        is computed by ``translate_fn`` (strict: other negatives and values past the table raise
        ``ValueError``, caching nothing) and becomes the cache entry.
        """
        if not isinstance(loc, torch.Tensor):
            raise TypeError(f"loc must be a torch.Tensor, got {type(loc).__name__}")
        if loc.device != self.device:
            raise ValueError(f"loc is on {loc.device}; the pool is on {self.device}")
        key = self._loc_key(loc)
        if key == self._cache_key:
            self.cache_hits += 1
            return self._cache_value
        value = self.translate_fn(self.full_to_swa_index_mapping, loc)
        self.cache_misses += 1
        self._cache_key, self._cache_loc, self._cache_value = key, loc, value
        return value

    # -- helpers -----------------------------------------------------------------------------

    def _page_slots(self, pages: torch.Tensor) -> torch.Tensor:
        return (pages.to(torch.int64)[:, None] * self.page_size + self._offsets).reshape(-1)

    @staticmethod
    def _lowest_free(allocated: torch.Tensor, count: int) -> torch.Tensor | None:
        free = torch.nonzero(~allocated[1:]).reshape(-1) + 1
        return free[:count] if free.numel() >= count else None

    def _require_slots(self, name: str, slots) -> torch.Tensor:
        """A 1-D int32/int64 tensor on the pool's device, returned as int64."""
        if not isinstance(slots, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(slots).__name__}")
        if slots.dtype not in INDEX_DTYPES:
            raise TypeError(f"{name} has dtype {slots.dtype}; expected torch.int32 or torch.int64")
        if slots.dim() != 1:
            raise ValueError(f"{name} must be 1-D, got shape {tuple(slots.shape)}")
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

    # -- writing -----------------------------------------------------------------------------

    def _store(self):
        if isinstance(self._store_cache, str):
            self._store_cache = resolve_store_cache(self._store_cache)
        return self._store_cache

    def set_kv_buffer(self, layer, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Write token ``i``'s ``k[i]`` / ``v[i]`` (``[N, head_num, head_dim]``) into the SWA
        buffers of ``layer`` (an int, an object with ``layer_id``, or None for layer 0) at the
        SWA slot of full slot ``loc[i]``: ``loc`` (1-D) is translated through the cache, then
        written by the ``store_cache`` kernel. An unmapped full slot translates to the padding
        slot 0 and is written there, as in sglang. ``-1`` translates to ``-1``; it is passed on
        only to a kernel whose contract declares ``padding="negative"`` and rejected
        (``ValueError``, nothing written) otherwise."""
        if not self.k_buffer:
            raise ValueError("this pool has no KV buffers (num_layers=0)")
        index = 0 if layer is None else getattr(layer, "layer_id", layer)
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.k_buffer):
            raise ValueError(f"layer={layer!r}: not a layer of this pool (0..{len(self.k_buffer) - 1})")
        if isinstance(loc, torch.Tensor) and loc.dim() != 1:
            raise ValueError(f"loc must be 1-D, got shape {tuple(loc.shape)}")
        swa_loc = self.translate_loc_from_full_to_swa(loc)
        store = self._store()
        fn, padding = (store.fn, store.contract.padding) if hasattr(store, "contract") else (store, "none")
        if padding != "negative" and swa_loc.numel() and bool((swa_loc == SENTINEL).any()):
            i = int(torch.nonzero(swa_loc == SENTINEL)[0, 0])
            raise ValueError(f"loc[{i}] = -1 translates to -1, which the store_cache kernel does "
                             f"not skip (its padding policy is {padding!r})")
        fn(k, v, self.k_buffer[index], self.v_buffer[index], swa_loc)


# --------------------------------------------------------------------------------------------
# the plug-in


def _cuda_available() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device"


def register() -> None:
    """Plug-in: ``oracle.kernels: swa_pool = "oracle.kernels.swa_pool:register"``."""
    notes = ("the translation SwaKVPool runs on a cache miss: range checks on the host, then "
             "mapping[loc] with -1 masked to -1 explicitly (never read through mapping[-1])")
    common = dict(op="translate_full_to_swa", backend="torch", validates=True, padding="negative",
                  notes=notes)
    oracle.register(translate_full_to_swa, name="swa_pool.translate_full_to_swa", device="cpu",
                    **common)
    oracle.register(translate_full_to_swa, name="swa_pool.translate_full_to_swa.cuda", device="cuda",
                    available=_cuda_available, **common)
