"""Input builders shared by the op specs: slots, index tensors, source rows and caches, each in
the layout variant a case asks for (contiguous, sliced from a fused tensor, strided, aliased)."""

from __future__ import annotations

import numpy as np
import torch

from ..buffers import NUMPY_DTYPES, Arena, contiguous_strides
from ..reference.slots import FLOAT32_EXACT, Padding

GUARD_MIN = 256

# The "large" case class: uint8 caches of LARGE_UNITS rows (slots, or blocks when paged) whose row
# stride is LARGE_STRIDE elements, so units 32..63 sit past 2**31 elements. Only the last two are
# written there: computed in int32, their offsets wrap to 2**26 and 2**27 below the cache, into
# LARGE_LEAD bytes of poisoned lead, where the comparison names them (``k_cache[-1, ...]``)
# instead of the kernel scribbling over unrelated memory. About 4.3 GB, held sparsely.
# The "wide" paged case: a cache of at least WIDE_SLOTS narrow slots in blocks that are no power of
# two, so slot numbers pass 2**16 (a block index kept in 16 bits, a slot divided by a fixed-point
# reciprocal) while the cache stays a few MiB.
WIDE_SLOTS = 1 << 18
# The "past_float" case: a cache of FLOAT_SLOTS narrow slots written at odd slot numbers past
# 2**24, the last integer float32 holds exactly (a slot carried through a float, or a block index
# from a float division, lands on a neighbour).
FLOAT_SLOTS = FLOAT32_EXACT + 1024
LARGE_STRIDE = 1 << 26
LARGE_UNITS = 64
LARGE_LEAD = 3 << 26


# Bit patterns a copy must keep that a round trip through another float type loses or changes:
# quiet and signalling NaNs with payloads, of both signs; +-inf, -0, the smallest subnormal, max.
SPECIAL_BITS = {
    "float32": (0x7FC00001, 0xFFC12345, 0x7F800001, 0xFFA00000, 0x7F800000, 0xFF800000, 0x80000000,
                0x00000001, 0x7F7FFFFF),
    "float16": (0x7E01, 0xFE55, 0x7C01, 0xFD00, 0x7C00, 0xFC00, 0x8000, 0x0001, 0x7BFF),
    "bfloat16": (0x7FC1, 0xFFD5, 0x7F81, 0xFFA0, 0x7F80, 0xFF80, 0x8000, 0x0001, 0x7F7F),
}


def values(rng: np.random.Generator, shape, dtype: str, kind: str = "random") -> np.ndarray:
    """Source values: random finite ones (uint8: random bytes), ("bits") random bit patterns,
    every row starting with :data:`SPECIAL_BITS` (as many as fit), for ops that copy rows as bits,
    or ("zero_rows") random ones with some token rows all zeros (:func:`zero_rows`)."""
    if kind == "zero_rows":
        return zero_rows(rng, values(rng, shape, dtype))
    if dtype == "uint8":
        return rng.integers(0, 256, shape, dtype=np.uint8)
    if kind == "bits":
        itemsize = NUMPY_DTYPES[dtype].itemsize
        raw = rng.integers(0, 1 << (8 * itemsize), shape, dtype=np.uint64 if itemsize == 8 else np.uint32)
        out = raw.astype(f"<u{itemsize}")
        rows = out.reshape(out.shape[0], -1) if out.ndim > 1 else out.reshape(1, -1)
        special = np.array(SPECIAL_BITS[dtype], dtype=f"<u{itemsize}")[: rows.shape[1]]
        rows[:, : special.size] = special
        return out.view(NUMPY_DTYPES[dtype])
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= 2.0
    return out.astype(NUMPY_DTYPES[dtype], copy=False)


ZERO_ROWS_EVERY = 4  # tokens 1, 5, 9, ... have every source row all zeros


def zero_rows(rng: np.random.Generator, rows: np.ndarray) -> np.ndarray:
    """``rows`` ``[N, ...]`` with some token rows all zeros, as a real step holds (zero-initialised
    or pruned heads, a padded token's rows): tokens 1, 5, 9, ... (every source alike), and two more
    tokens drawn for this source alone. Float rows alternate +0 and -0 in token order, and token 1 mixes
    both signs: a kernel that takes a row of zeros for padding, by value or by bits, skips them."""
    flat = rows.reshape(rows.shape[0], -1)
    if flat.shape[0] < 2 or flat.shape[1] == 0:
        return rows
    chosen = np.union1d(np.arange(1, flat.shape[0], ZERO_ROWS_EVERY),
                        rng.choice(flat.shape[0], size=2, replace=False))
    for order, token in enumerate(chosen):
        flat[token] = -0.0 if order % 2 and flat.dtype != np.uint8 else 0
    if flat.dtype != np.uint8:
        flat[1, ::2] = -0.0
    return rows


def destinations(rng: np.random.Generator, p: dict, num_slots: int, contract) -> np.ndarray:
    """The index entries of a case (:func:`slots` with the case's padding, duplicates and index
    dtype), keeping clear of the slot the kernel's contract reserves."""
    return slots(rng, p["n"], num_slots, padding=p.get("padding"), dups=p.get("dups", False),
                 index_dtype=p["index"], reserved=Padding.parse(contract.padding).reserved,
                 run=p.get("slots") == "run", past_float=p.get("slots") == "past_float")


def slot_count(p: dict) -> int:
    """The slots of an ordinary case's cache: twice its rows and more (FLOAT_SLOTS for "past_float")."""
    return FLOAT_SLOTS if p.get("slots") == "past_float" else max(2 * p["n"], 64) + 3


def index_of(arena: Arena, name: str, entries: np.ndarray, p: dict, num_slots: int,
             rng: np.random.Generator):
    """:func:`index` in the case's index layout, with a tail of unused slots for "longer" sources."""
    tail = extra_rows(p["n"]) if p.get("src") == "longer" else 0
    return index(arena, name, entries, p["index"], p["index_layout"], num_slots, rng, tail)


def slots(rng: np.random.Generator, n: int, num_slots: int, *, padding: str | None = None,
          dups: bool = False, index_dtype: str = "int64", reserved: int | None = None,
          run: bool = False, past_float: bool = False) -> np.ndarray:
    """``n`` distinct real slots drawn from ``[0, num_slots)``, then padding entries or duplicated
    slots mixed in when the case asks for them.

    Slot 0, slot 1 and the last slot are always among the real slots (as many as ``n`` allows,
    at random positions): slot 0 is a real destination wherever the kernel's own contract does not
    reserve it, so a kernel that skips it fails. ``reserved``: the kernel's reserved padding slot
    (its contract's ``reserved:K``), never drawn as a real slot. Padding entries: under
    "negative", a mix of every kind of negative (:func:`negative_padding`); under "reserved:K",
    slot K. ``past_float``: the real slots but 0 and 1 are odd numbers past FLOAT32_EXACT, up to
    ``num_slots - 3`` (where a round trip through float32 rounds down, so none lands past the
    cache), every other one 31 mod 32 (rounded up into the next block of up to 32 slots).
    """
    skip = {reserved} if reserved is not None else set()
    if padding and padding.startswith("reserved:"):
        skip.add(int(padding.split(":")[1]))
    if run:
        out = run_of_slots(n, num_slots, skip)
    else:
        # past_float: odd slots up to num_slots - 3 only, so that one rounded up stays in the cache
        last = num_slots - 3 if past_float else num_slots - 1
        edges = [s for s in dict.fromkeys((0, 1, last)) if s not in skip and 0 <= s < num_slots]
        if past_float:  # alternately a slot that rounds up across a block's end (31 mod 32) and any odd one
            ends = rng.permutation(np.arange(FLOAT32_EXACT + 31, last, 32))
            odd = rng.permutation(np.setdiff1d(np.arange(FLOAT32_EXACT + 1, last, 2), ends))
            rest = np.stack([ends[:n], odd[:n]], axis=1).reshape(-1)
        else:
            rest = rng.permutation(np.setdiff1d(np.arange(num_slots), edges + sorted(skip)))
        real = np.concatenate([edges[:n], rest[: max(n - len(edges), 0)]])
        out = rng.permutation(real).astype(np.int64)
    if n and padding:
        count = max(1, n // 8) if padding != "negative" else max(min(n // 2, len(NEGATIVE_KINDS)), n // 8, 1)
        marked = rng.choice(n, size=count, replace=False)
        unused = np.setdiff1d(np.arange(num_slots), np.delete(out, marked))
        out[marked] = (negative_padding(count, num_slots, index_dtype, int(unused[unused.size // 2]) if unused.size else None)
                       if padding == "negative" else int(padding.split(":")[1]))
    if n > 1 and dups:
        targets = rng.choice(n, size=max(1, n // 8), replace=False)
        out[targets] = out[rng.integers(0, n, size=targets.size)]
    return out


def run_of_slots(n: int, num_slots: int, skip=frozenset()) -> np.ndarray:
    """``n`` slots a prefill writes: one consecutive run (from slot 0, or past a skipped slot it
    would hold), its second and next-to-last entries swapped, so the run's ends are consecutive
    (``loc[-1] - loc[0] == n - 1``) but its order is not: a kernel that checks only the ends before
    it copies one slab writes two rows into each other's slots."""
    start = 0
    while inside := [s for s in skip if start <= s < start + n]:
        start = max(inside) + 1
    out = np.arange(start, start + n, dtype=np.int64)
    if n >= 4:
        out[[1, n - 2]] = out[[n - 2, 1]]
    if out.size and out[-1] >= num_slots:
        raise ValueError(f"a run of {n} slots from {start} does not fit {num_slots} slots")
    return out


NEGATIVE_KINDS = ("-1", "dtype min", "-2", "below -num_slots", "large", "low word a slot")


def negative_padding(count: int, num_slots: int, index_dtype: str, unused: int | None = None) -> np.ndarray:
    """``count`` padding entries cycling through every kind of negative: -1, the index dtype's
    minimum, -2, ``-(num_slots + 1)``, ``-(2**24 + 3)`` and, for int64, ``-(2**32) + unused``,
    whose low 32-bit word is ``unused``, a slot no real entry writes (-3 where there is none, or
    for int32). A kernel that skips only ``slot == -1`` then writes -2 two rows before the cache
    (inside the guard band), wraps ``-(num_slots + 1)`` and the large ones past it, or overflows
    on the minimum; one that truncates the slot to 32 bits before its ``slot < 0`` test writes
    slot ``unused``."""
    low_word = -(2**32) + unused if unused is not None and NUMPY_DTYPES[index_dtype].itemsize == 8 else -3
    kinds = np.array([-1, np.iinfo(NUMPY_DTYPES[index_dtype]).min, -2, -(num_slots + 1),
                      -(2**24 + 3), low_word], dtype=np.int64)
    return kinds[np.arange(count) % kinds.size]


def extra_rows(n: int) -> int:
    """Source rows past the index's length in a "longer" case (vLLM pads key/value for CUDA-graph
    capture; the token count is the index's length)."""
    return 5 + n // 4


def index(arena: Arena, name: str, entries: np.ndarray, dtype: str, layout: str, num_slots: int,
          rng: np.random.Generator, tail: int = 0):
    """The index tensor: contiguous, every other element of a larger tensor ("strided"; a 2-D
    index's rows also lie 3 entries further apart, as a column slice of a wider table's do), at
    a storage offset ("offset"), or (a 2-D index, "transposed") the transpose of a contiguous
    ``[cols, n]`` tensor, column-major. The skipped elements hold valid but wrong slots, so a kernel that
    ignores the stride or the offset writes wrong rows instead of crashing. ``tail``: the
    contiguous index is followed in its storage by that many valid slots it does not hold, so a
    kernel that reads past its length (a grid sized from the sources' rows) writes them."""
    entries = entries.astype(NUMPY_DTYPES[dtype])
    n = len(entries)
    if entries.ndim == 2 and layout != "contig":
        cols = entries.shape[1]
        strides, offset = {"strided": ((2 * cols + 3, 2), 1), "offset": ((cols, 1), 5),
                           "transposed": ((1, n), 0)}[layout]
        extent = offset + (n - 1) * strides[0] + (cols - 1) * strides[1] + 1
        decoys = rng.integers(1, max(num_slots, 2), size=max(extent, offset + n * strides[0])).astype(entries.dtype)
        out = _index_view(arena, name, name + "_storage", decoys, entries.shape, strides,
                          offset * entries.itemsize, entries)
        _decoy_guards(arena, arena.views[name].region, entries.dtype, num_slots, rng)
        return out
    if tail and layout == "contig":
        unused = np.setdiff1d(np.arange(2, num_slots), entries)  # 0 and 1 may be reserved
        storage = np.concatenate([entries, rng.permutation(unused)[:tail].astype(entries.dtype)])
        out = _index_view(arena, name, name + "_storage", storage, (n,), (1,), 0, entries)
    elif layout == "contig":
        out = _index_view(arena, name, name, entries, entries.shape, (1,), 0, entries)
    else:
        decoys = rng.integers(1, max(num_slots, 2), size=2 * (n + tail) + 8).astype(entries.dtype)
        step, offset = (2, 1) if layout == "strided" else (1, 5)
        out = _index_view(arena, name, name + "_storage", decoys, (n,), (step,),
                          offset * entries.itemsize, entries)
    _decoy_guards(arena, arena.views[name].region, entries.dtype, num_slots, rng)
    return out


def _index_view(arena: Arena, name: str, region: str, storage: np.ndarray, shape, strides, offset: int,
                entries: np.ndarray):
    """``name``, a view of ``entries`` into a region holding ``storage`` (region == name: the view
    is the whole region)."""
    if region == name:
        return arena.tensor(name, storage, role="index")
    arena.tensor(region, storage, role="decoy")
    return arena.view(name, region, shape, strides, offset, dtype_of(entries), role="index",
                      values=entries)


def _decoy_guards(arena: Arena, region: str, dtype, num_slots: int, rng: np.random.Generator) -> None:
    """Fill the guard bands around an index with valid slots: a kernel that reads the index from
    its storage's start (its storage offset ignored) or past its end then writes wrong rows, which
    the comparison and the diagnosis can see, instead of jumping to a random address. Writes there
    are still caught: the bands are compared like any other byte."""
    reg = arena.regions[region]
    count = reg.guard // np.dtype(dtype).itemsize
    for start in (0, reg.guard + reg.payload):
        band = rng.integers(1, max(num_slots, 2), size=count).astype(dtype).view(np.uint8)
        reg.tensor[start: start + band.size].copy_(torch.from_numpy(band).to(reg.tensor.device))


SOURCE_GAP_BYTES = 16  # other columns between the sources of a "gapped" fused row (alignment kept)
SOURCE_TAIL_BYTES = 8  # and past the last one: every source 16-byte aligned, its row stride not


def rows(arena: Arena, names: tuple, arrays: tuple, layout: str, rng: np.random.Generator | None = None):
    """Source tensors ``[N, *row]``: each in its own allocation, or ("fused") all sliced out of one
    row-major tensor that also holds a leading block of other columns (a fused qkv projection),
    so each one's row stride exceeds its row; ("fused_unsqueezed") those as ``[N, 1, *row]`` views
    with ``unsqueeze(1)``'s strides; ("interleaved") ``[N, H, D]`` sources whose heads interleave
    (:func:`_interleaved`); ("padded") each in its own allocation, its rows
    SOURCE_ROW_PAD elements apart past their end; ("gapped") the same with SOURCE_GAP_BYTES of other columns
    between one source and the next, so a kernel that reads a source right after the one before
    it (the adjacency assumed, not the source's own pointer) reads the gap, and SOURCE_TAIL_BYTES
    past the last (a row stride of no multiple of 16 bytes under 16-byte aligned sources: a vector
    path chosen on the base pointers alone loads misaligned rows). "longer": each
    followed by :func:`extra_rows` more rows of other random values (drawn from ``rng``), which
    the kernel must not read."""
    if layout == "longer":
        arrays = tuple(np.concatenate([a, values(rng, (extra_rows(len(a)),) + a.shape[1:], _dtype_name(a.dtype))])
                       for a in arrays)
        layout = "contig"
    if layout == "contig":
        return tuple(arena.tensor(n, a, role="source") for n, a in zip(names, arrays))
    if layout == "padded":
        return tuple(_padded_rows(arena, n, a) for n, a in zip(names, arrays))
    if layout == "interleaved":
        return _interleaved(arena, names, arrays)
    if layout == "fused_unsqueezed":  # x.unsqueeze(1) of each fused slice: [N, 1, *row]
        rows(arena, names, arrays, "fused", rng)
        return tuple(_unsqueezed(arena, name) for name in names)
    dtype = arrays[0].dtype
    n = arrays[0].shape[0]
    widths = [int(np.prod(a.shape[1:])) for a in arrays]
    lead = widths[0]  # the "q" columns no kernel should touch
    gap = SOURCE_GAP_BYTES // dtype.itemsize if layout == "gapped" else 0
    tail = SOURCE_TAIL_BYTES // dtype.itemsize if layout == "gapped" else 0
    row = lead + sum(widths) + gap * (len(arrays) - 1) + tail
    region = "_".join(names) + "_fused"
    arena.region(region, max(n * row * dtype.itemsize, 1), GUARD_MIN)
    out, column = [], lead
    for name, a, w in zip(names, arrays, widths):
        strides = (row,) + contiguous_strides(a.shape[1:])
        out.append(arena.view(name, region, a.shape, strides, column * dtype.itemsize,
                              _dtype_name(dtype), role="source", values=a))
        column += w + gap
    return tuple(out)


def _interleaved(arena: Arena, names: tuple, arrays: tuple):
    """``[N, H, D]`` sources whose heads interleave with each other's and a leading part's, as
    ``qkv.view(N, H, 3, D)[:, :, j]`` gives (GPT-NeoX-style fused projections): a head's D
    elements are contiguous, the heads ``(len(arrays) + 1) * D`` apart, so a kernel that copies
    each row's ``H * D`` elements as one run reads the other tensors' heads."""
    if len({a.shape for a in arrays}) != 1 or arrays[0].ndim != 3:
        raise ValueError(f"interleaved sources need one [N, H, D] shape, got {[a.shape for a in arrays]}")
    n, heads, dim = arrays[0].shape
    parts, dtype = len(arrays) + 1, arrays[0].dtype
    region = "_".join(names) + "_interleaved"
    arena.region(region, max(n * heads * parts * dim * dtype.itemsize, 1), GUARD_MIN)
    strides = (heads * parts * dim, parts * dim, 1)
    return tuple(arena.view(name, region, a.shape, strides, (j + 1) * dim * dtype.itemsize, _dtype_name(dtype),
                            role="source", values=a) for j, (name, a) in enumerate(zip(names, arrays)))


def _unsqueezed(arena: Arena, name: str):
    """Fused source ``name`` re-viewed as ``[N, 1, *row]`` with the strides ``unsqueeze(1)``
    gives: the unit axis's stride is the row's width, not its stride, so a kernel that takes
    ``stride(-2)`` (or ``stride(1)``) for the row stride reads the wrong rows."""
    spec = arena.views[name]
    width = int(np.prod(spec.shape[1:]))
    return arena.view(name, spec.region, (spec.shape[0], 1) + spec.shape[1:], (spec.strides[0], width) + spec.strides[1:],
                      spec.offset, spec.dtype, role="source")


SOURCE_ROW_PAD = 8  # elements past each row of a "padded" source: no multiple of a head's D


def _padded_rows(arena: Arena, name: str, array: np.ndarray):
    """``array`` as a source whose rows lie SOURCE_ROW_PAD elements apart past their end (a row
    of a larger tensor whose extra columns are no whole head), so offsets from the row's start
    are no multiple of the row's or a head's width."""
    width = int(np.prod(array.shape[1:]))
    row = width + SOURCE_ROW_PAD
    region = name + "_padded"
    arena.region(region, max(len(array) * row * array.itemsize, 1), GUARD_MIN)
    return arena.view(name, region, array.shape, (row,) + contiguous_strides(array.shape[1:]), 0,
                      _dtype_name(array.dtype), role="source", values=array)


UNEQUAL_PAD = 16  # bytes past each slot of every cache but the first, in the "unequal" layout


def caches(arena: Arena, names: tuple, shapes: tuple, dtype: str, layout: str, slot_axes: int = 1):
    """Cache tensors, poisoned: separate allocations ("plain"), each at a storage offset of three
    slots ("offset"), ("unequal") separate allocations where every cache but the first has a slot
    stride UNEQUAL_PAD bytes past its slot (a dense K cache beside a padded V cache: their strides
    differ), ("padded") every one so, ("aliased") interleaved views of one allocation, slot by
    slot, the way a fused kv tensor ``[S, 2, ...]`` is split into K and V, or ("halves") one
    allocation's consecutive halves, as vLLM's ``kv_cache[0]`` and ``kv_cache[1]`` of a ``[2, S,
    ...]`` tensor (equal shapes and strides in one storage, yet not interleaved). ``slot_axes``
    leading axes address a slot; the guard band is at least two slot strides, so a -1 or -2 write
    lands in it."""
    itemsize = NUMPY_DTYPES[dtype].itemsize
    if layout == "halves":
        sizes = [int(np.prod(s)) for s in shapes]
        region = "_".join(names) + "_halves"
        slot = max(int(np.prod(s[1:])) for s in shapes)
        arena.region(region, sum(sizes) * itemsize, max(GUARD_MIN, 2 * slot * itemsize))
        offsets = np.cumsum([0] + sizes[:-1]) * itemsize
        return tuple(arena.view(name, region, shape, contiguous_strides(shape), int(at), dtype, role="cache")
                     for name, shape, at in zip(names, shapes, offsets))
    if layout in ("plain", "offset", "unequal", "padded"):
        out = []
        for i, (name, shape) in enumerate(zip(names, shapes)):
            slot = int(np.prod(shape[1:]))
            padded = layout == "padded" or (layout == "unequal" and i)
            stride0 = slot + (UNEQUAL_PAD // itemsize if padded else 0)
            lead = 3 * slot * itemsize if layout == "offset" else 0
            arena.region(name + "_storage", lead + shape[0] * stride0 * itemsize,
                         max(GUARD_MIN, 2 * stride0 * itemsize))
            strides = (stride0,) + contiguous_strides(shape[1:])
            out.append(arena.view(name, name + "_storage", shape, strides, lead, dtype, role="cache"))
        return tuple(out)
    per_slot = [int(np.prod(s[1:])) for s in shapes]
    stride0 = sum(per_slot)
    region = "_".join(names) + "_storage"
    arena.region(region, shapes[0][0] * stride0 * itemsize, max(GUARD_MIN, 2 * stride0 * itemsize))
    out, column = [], 0
    for name, shape, width in zip(names, shapes, per_slot):
        strides = (stride0,) + contiguous_strides(shape[1:])
        out.append(arena.view(name, region, shape, strides, column * itemsize, dtype, role="cache"))
        column += width
    return tuple(out)


def large_caches(arena: Arena, names: tuple, shapes: tuple, dtype: str = "uint8"):
    """Byte-wide caches (``dtype`` uint8 or a float8 one) ``[LARGE_UNITS, *row]`` in one sparse region, each row a contiguous block at
    a stride of LARGE_STRIDE, the caches interleaved within that stride after LARGE_LEAD bytes."""
    share = LARGE_STRIDE // len(names)
    rows = [int(np.prod(shape[1:])) for shape in shapes]
    if any(shape[0] != LARGE_UNITS for shape in shapes) or max(rows) > share:
        raise ValueError(f"large caches are [{LARGE_UNITS}, row] with rows of at most {share} bytes")
    payload = LARGE_LEAD + (LARGE_UNITS - 1) * LARGE_STRIDE + (len(names) - 1) * share + rows[-1]
    region = "_".join(names) + "_large"
    arena.region(region, payload, GUARD_MIN, sparse=True)
    return tuple(arena.view(name, region, shape, (LARGE_STRIDE,) + contiguous_strides(shape[1:]),
                            LARGE_LEAD + i * share, dtype, role="cache")
                 for i, (name, shape) in enumerate(zip(names, shapes)))


def large_slots(rng: np.random.Generator, n: int, per_unit: int = 1) -> np.ndarray:
    """``n`` distinct slots of a large cache: in its last two units (past 2**31 elements) and in
    units 1..31 (below), ``per_unit`` slots to a unit (the block size, paged)."""
    if n < 2:
        raise ValueError("a large case writes at least the last two units")
    units = np.concatenate([[LARGE_UNITS - 1, LARGE_UNITS - 2],
                            rng.choice(np.arange(1, LARGE_UNITS // 2), size=n - 2, replace=False)])
    return (units * per_unit + rng.integers(0, per_unit, size=n)).astype(np.int64)


def dtype_of(array: np.ndarray) -> str:
    return _dtype_name(array.dtype)


def _dtype_name(dtype) -> str:
    for name, d in NUMPY_DTYPES.items():
        if d == dtype:
            return name
    raise TypeError(dtype)


LARGE_N = 4096  # past the size gates real kernels switch paths at (about N = 1024 upwards)


def illegal_at(n: int) -> int:
    """Where a bad-input case of N entries puts its illegal one: the middle, or past the size
    gates (N >= LARGE_N) the last entry, which a check of only a prefix (its first 1024 entries,
    one block's worth) misses."""
    return n - 1 if n >= LARGE_N else n // 2
