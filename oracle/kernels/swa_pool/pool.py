"""The pool: :class:`SwaKVPool`, the allocator (:mod:`.allocator`) with the cached full->SWA
translation and the SWA KV buffers it writes through a registered ``store_cache`` kernel.

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
"""

from __future__ import annotations

from typing import Callable

import torch

from .allocator import PageAllocator, _require_int
from .translate import SENTINEL, default_translate_fn

DEFAULT_STORE_CACHE = "torch.store_cache"


def resolve_store_cache(name: str) -> Callable:
    """The ``store_cache`` kernel registered under ``name`` (plug-ins discovered on first use);
    ``ValueError`` listing the registered ones when there is none, or it cannot run here."""
    from ...registry import default_registry

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


class SwaKVPool(PageAllocator):
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

    Not thread-safe; one pool belongs to one scheduler. The read-only views and the operations
    that change the pages and the mapping (``alloc``, ``alloc_extend``, ``free``, ``free_swa``,
    ``clear``, ``set_full_to_swa_mapping``, ``register_mapping``) are defined in
    :class:`~oracle.kernels.swa_pool.allocator.PageAllocator`; the cache and the writes here.
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
        self._init_pages(size_full, size_swa, page_size, device)
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
