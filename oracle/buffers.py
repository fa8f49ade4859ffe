"""Guarded, poisoned allocations and the tensor views a case hands to a kernel.

Every tensor a kernel sees (caches, sources, indices, scales) is a strided view into a ``Region``:
one byte allocation whose payload is surrounded by guard bands, all filled with a seeded pseudo-
random poison (never zeros, so "left untouched" and "wrote zeros" differ). After the call the whole
region, guards included, is compared byte for byte, which catches out-of-bounds writes such as a
-1 slot written one row before the cache. Each view has a numpy twin over the same bytes, so the
reference sees exactly what the kernel saw.

A region past 2**31 elements (the int32-offset case class) is *sparse*: it is poisoned with a
repeating tile, and a snapshot keeps only the bytes some view can reach (each view's rows, plus
the guard bands) and scans the rest against the tile in place. Its cache views have few rows and
a huge row stride, so the reference still works on small arrays.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

import ml_dtypes
import numpy as np
import torch

TORCH_DTYPES = {
    "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "uint8": torch.uint8, "int32": torch.int32, "int64": torch.int64,
}
NUMPY_DTYPES = {
    "float32": np.dtype(np.float32), "float16": np.dtype(np.float16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16), "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
}
# fp8 caches handed over as torch float8 tensors (Contract.fp8_cache="float8"): their numpy twins
# hold the codes as uint8, as the reference writes them
for _fmt in ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz"):
    TORCH_DTYPES[f"float8_{_fmt}"] = getattr(torch, f"float8_{_fmt}")
    NUMPY_DTYPES[f"float8_{_fmt}"] = np.dtype(np.uint8)
SHORT_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "uint8": "u8"}


TILE_BYTES = 8 * 8191  # the period of a sparse region's poison: a multiple of 8, no power of two


def poison(nbytes: int, seed: int) -> np.ndarray:
    """``nbytes`` seeded random bytes, none zero (a zero becomes 1)."""
    out = np.frombuffer(np.random.default_rng(seed).bytes(nbytes), np.uint8).copy()
    return np.maximum(out, 1, out=out)


@dataclass
class SparseBytes:
    """A snapshot of a sparse region: the bytes of its windows (sorted, disjoint ``[start, end)``
    ranges in region coordinates, guards included) packed into ``data``; every other byte is
    known to equal ``tile[offset % len(tile)]``, except ``stray``: the first few offsets where it
    did not when the snapshot was taken, and how many there were in all."""

    size: int
    starts: np.ndarray
    ends: np.ndarray
    data: np.ndarray
    tile: np.ndarray
    stray: tuple = ()  # ((offset, byte), ...) for the first differing bytes outside the windows
    stray_count: int = 0

    @property
    def bases(self) -> np.ndarray:
        return np.concatenate(([0], np.cumsum(self.ends - self.starts)[:-1])).astype(np.int64)

    def copy(self) -> "SparseBytes":
        return SparseBytes(self.size, self.starts, self.ends, self.data.copy(), self.tile,
                           self.stray, self.stray_count)

    def region_offset(self, packed: int) -> int:
        """Region offset of byte ``packed`` of ``data``."""
        window = int(np.searchsorted(self.bases, packed, side="right")) - 1
        return int(self.starts[window] + packed - self.bases[window])

    def packed_offset(self, offset: int) -> int | None:
        window = int(np.searchsorted(self.starts, offset, side="right")) - 1
        if window < 0 or offset >= self.ends[window]:
            return None
        return int(self.bases[window] + offset - self.starts[window])

    def read(self, offset: int, count: int) -> np.ndarray:
        """``count`` bytes at region offset ``offset`` (a stray byte reads as it was seen)."""
        stray = dict(self.stray)
        out = np.empty(count, np.uint8)
        for i in range(count):
            at = offset + i
            packed = self.packed_offset(at)
            if packed is not None:
                out[i] = self.data[packed]
            else:
                out[i] = stray.get(at, self.tile[at % self.tile.size])
        return out


def read_bytes(region_bytes, offset: int, count: int) -> np.ndarray:
    """``count`` bytes of a snapshot's region at ``offset``, dense or sparse."""
    if isinstance(region_bytes, SparseBytes):
        return region_bytes.read(offset, count)
    return region_bytes[offset: offset + count]


def same_bytes(a, b) -> bool:
    if isinstance(a, SparseBytes):
        return (np.array_equal(a.data, b.data) and a.stray_count == b.stray_count
                and a.stray == b.stray)
    return np.array_equal(a, b)


@dataclass(frozen=True)
class ViewSpec:
    """A strided view of a region: ``offset`` bytes past the region's payload start; ``strides``
    in elements, like torch's."""

    name: str
    region: str
    offset: int
    shape: tuple
    strides: tuple
    dtype: str
    role: str  # "cache" (written by the kernel), "source", "index", "scale" or "output"

    @property
    def itemsize(self) -> int:
        return NUMPY_DTYPES[self.dtype].itemsize

    def row_extents(self) -> list[tuple[int, int]]:
        """[first, last) payload bytes of each element of the first axis."""
        if not self.shape:
            return [self.extent()]
        row = ViewSpec(self.name, self.region, self.offset, self.shape[1:], self.strides[1:], self.dtype, self.role)
        first, last = row.extent()
        step = self.strides[0] * self.itemsize
        return [(first + i * step, last + i * step) for i in range(self.shape[0])]

    def extent(self) -> tuple[int, int]:
        """[first, last) payload bytes the view can touch."""
        if 0 in self.shape:
            return self.offset, self.offset
        low = sum(min(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        high = sum(max(0, (n - 1) * s) for n, s in zip(self.shape, self.strides))
        return self.offset + low * self.itemsize, self.offset + (high + 1) * self.itemsize


@dataclass
class Region:
    name: str
    payload: int  # bytes
    guard: int  # bytes on each side
    tensor: torch.Tensor  # uint8, guard + payload + guard
    tile: np.ndarray | None = None  # a sparse region's poison period
    pristine: bool = False  # a sparse region not yet snapshotted: nothing but its views' rows has
    # been written since it was filled with the tile, so its first snapshot needs no scan

    @property
    def sparse(self) -> bool:
        return self.tile is not None


class Arena:
    """The allocations of one case, on one device."""

    def __init__(self, device: str, seed: int):
        self.device = device
        self.seed = seed
        self.regions: dict[str, Region] = {}
        self.views: dict[str, ViewSpec] = {}

    def region(self, name: str, payload: int, guard: int = 256, sparse: bool = False) -> Region:
        """A poisoned allocation of ``payload`` bytes between two guard bands. ``sparse`` poisons
        it with a repeating tile and snapshots only what views can reach (see SparseBytes)."""
        if name in self.regions:
            raise ValueError(f"region {name!r} allocated twice")
        guard = -(-guard // 64) * 64  # keep every payload 64-byte aligned
        seed = self.seed * 7919 + len(self.regions)
        if sparse:
            tile = poison(TILE_BYTES, seed)
            self.regions[name] = Region(name, payload, guard, fill_tiled(payload + 2 * guard, tile, self.device),
                                        tile, pristine=True)
        else:
            data = poison(payload + 2 * guard, seed)
            self.regions[name] = Region(name, payload, guard, torch.from_numpy(data).to(self.device))
        return self.regions[name]

    def view(self, name: str, region: str, shape, strides=None, offset: int = 0,
             dtype: str = "uint8", role: str = "cache", values: np.ndarray | None = None) -> torch.Tensor:
        """A torch view into ``region``; ``values`` (numpy) are written into it when given."""
        shape = tuple(int(n) for n in shape)
        strides = tuple(int(s) for s in (strides or contiguous_strides(shape)))
        spec = ViewSpec(name, region, offset, shape, strides, dtype, role)
        reg = self.regions[region]
        start, end = spec.extent()
        empty = 0 in shape  # an empty view touches nothing, wherever it points
        if not empty and (start < 0 or end > reg.payload) or offset % spec.itemsize:
            raise ValueError(f"view {name} [{start}, {end}) does not fit region {region} "
                             f"({reg.payload} bytes) aligned to {spec.itemsize}")
        self.views[name] = spec
        tensor = self.torch_view(spec)
        if values is not None:
            tensor.copy_(to_torch(values).to(self.device))
        return tensor

    def tensor(self, name: str, values: np.ndarray, role: str, guard: int = 256) -> torch.Tensor:
        """A fresh contiguous tensor holding ``values``, in a region of its own."""
        dtype = dtype_name(values.dtype)
        self.region(name, max(values.nbytes, 1), guard)
        return self.view(name, name, values.shape, dtype=dtype, role=role, values=values)

    def torch_view(self, spec: ViewSpec) -> torch.Tensor:
        reg = self.regions[spec.region]
        flat = reg.tensor[reg.guard: reg.guard + reg.payload]
        usable = reg.payload - reg.payload % spec.itemsize
        typed = flat[:usable].view(TORCH_DTYPES[spec.dtype])
        return typed.as_strided(spec.shape, spec.strides, typed.storage_offset() + spec.offset // spec.itemsize)

    def snapshot(self) -> dict:
        """A host copy of every region's bytes, guards included (SparseBytes for sparse ones)."""
        return {name: self._sparse_snapshot(reg) if reg.sparse else reg.tensor.detach().cpu().numpy().copy()
                for name, reg in self.regions.items()}

    def numpy_view(self, snapshot: dict, name: str) -> np.ndarray:
        """The numpy twin of view ``name`` over a snapshot (writable: it aliases the snapshot)."""
        spec = self.views[name]
        return numpy_view(snapshot[spec.region], spec, self.regions[spec.region].guard)

    def windows(self, region: str) -> tuple[np.ndarray, np.ndarray]:
        """The byte ranges of a sparse region that a snapshot keeps: both guard bands and every
        row (first-axis element) of every view into it, merged where they touch."""
        reg = self.regions[region]
        ranges = [(0, reg.guard), (reg.guard + reg.payload, reg.payload + 2 * reg.guard)]
        for spec in self.views.values():
            if spec.region == region and 0 not in spec.shape:
                ranges += [(reg.guard + a, reg.guard + b) for a, b in spec.row_extents()]
        ranges.sort()
        starts, ends = [ranges[0][0]], [ranges[0][1]]
        for a, b in ranges[1:]:
            if a <= ends[-1]:
                ends[-1] = max(ends[-1], b)
            else:
                starts.append(a)
                ends.append(b)
        return np.array(starts, np.int64), np.array(ends, np.int64)

    def _sparse_snapshot(self, reg: Region) -> SparseBytes:
        starts, ends = self.windows(reg.name)
        flat = reg.tensor.detach()
        data = torch.cat([flat[a:b] for a, b in zip(starts.tolist(), ends.tolist())]).cpu().numpy()
        if reg.pristine:  # only views (inside the windows) wrote since the fill: nothing to scan
            stray, count, reg.pristine = (), 0, False
        else:
            stray, count = _scan_outside(flat, reg.tile, starts, ends)
        return SparseBytes(int(flat.numel()), starts, ends, data, reg.tile, stray, count)


def numpy_view(region_bytes, spec: ViewSpec, guard: int) -> np.ndarray:
    dtype = NUMPY_DTYPES[spec.dtype]
    strides = tuple(s * dtype.itemsize for s in spec.strides)
    if 0 in spec.shape:  # touches nothing, wherever it points
        return np.empty(spec.shape, dtype)
    if not isinstance(region_bytes, SparseBytes):
        return np.ndarray(spec.shape, dtype=dtype, buffer=region_bytes, offset=guard + spec.offset,
                          strides=strides)
    # each row sits in one window; rows packed at equal distances keep a plain strided twin
    rows = [region_bytes.packed_offset(guard + a) for a, _ in spec.row_extents()]
    low = sum(min(0, (n - 1) * s) for n, s in zip(spec.shape[1:], strides[1:]))
    packed = [r - low for r in rows]
    step = packed[1] - packed[0] if len(packed) > 1 else 0
    if any(p is None for p in rows) or any(b - a != step for a, b in zip(packed, packed[1:])):
        raise ValueError(f"view {spec.name} of a sparse region has rows that do not pack evenly")
    return np.ndarray(spec.shape, dtype=dtype, buffer=region_bytes.data, offset=packed[0],
                      strides=(step,) + strides[1:])


HUGE_PAGES_FROM = 1 << 28  # bytes: the large cases' pools (GBs), not the ordinary regions


def empty_bytes(nbytes: int, device: str) -> torch.Tensor:
    """``nbytes`` uninitialized bytes on ``device``. On the host, a pool of ``HUGE_PAGES_FROM`` bytes
    or more is mapped with transparent huge pages where the system offers them (``madvise``):
    filling a 4.7 GB pool in 4 KiB pages takes over a million page faults, several times the
    time of the fill itself."""
    if device != "cpu" or nbytes < HUGE_PAGES_FROM or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(nbytes, dtype=torch.uint8, device=device)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    pages.madvise(mmap.MADV_HUGEPAGE)
    return torch.frombuffer(pages, dtype=torch.uint8)  # holds the mapping until the tensor is freed


def fill_tiled(nbytes: int, tile: np.ndarray, device: str) -> torch.Tensor:
    """``nbytes`` bytes of ``tile`` repeated, made on ``device`` (no host copy of the whole)."""
    period = tile.size
    rows = -(-nbytes // period)
    full = empty_bytes(rows * period, device)
    full.view(rows, period).copy_(torch.from_numpy(tile).to(device).expand(rows, period))
    return full[:nbytes]


def _scan_outside(flat: torch.Tensor, tile: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                  keep: int = 16, chunk_rows: int = 1024) -> tuple[tuple, int]:
    """Bytes of a sparse region outside its windows that no longer match the tile: the first
    ``keep`` as (offset, byte), and the count. Compared in place, 8 bytes at a time."""
    period = tile.size
    rows = flat.numel() // period
    pattern = torch.from_numpy(tile.view(np.int64)).to(flat.device)
    body = flat[: rows * period].view(torch.int64).view(rows, period // 8)
    found, count = [], 0

    def note(offsets: np.ndarray) -> None:
        nonlocal count
        inside = np.searchsorted(starts, offsets, side="right") - 1
        outside = offsets[(inside < 0) | (offsets >= ends[np.maximum(inside, 0)])]
        count += int(outside.size)
        for at in outside[: max(0, keep - len(found))].tolist():
            found.append((int(at), int(flat[at])))

    for first in range(0, rows, chunk_rows):
        block = body[first: first + chunk_rows]
        differs = block != pattern
        if not bool(differs.any()):
            continue
        words = torch.nonzero(differs.reshape(-1)).reshape(-1).cpu().numpy() + first * (period // 8)
        raw = flat[: rows * period].view(-1, 8)[torch.from_numpy(words).to(flat.device)].cpu().numpy()
        candidates = words[:, None] * 8 + np.arange(8)
        note(candidates[raw != tile[candidates % period]].astype(np.int64))
    tail = flat[rows * period:].cpu().numpy()
    if tail.size:
        offsets = np.flatnonzero(tail != tile[: tail.size]) + rows * period
        note(offsets.astype(np.int64))
    return tuple(found), count


def contiguous_strides(shape) -> tuple:
    """The element strides of a packed row-major tensor of ``shape``."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def dtype_name(dtype) -> str:
    for name, np_dtype in NUMPY_DTYPES.items():
        if np.dtype(dtype) == np_dtype:
            return name
    raise TypeError(f"no torch twin for numpy dtype {dtype}")


def to_torch(values: np.ndarray) -> torch.Tensor:
    values = np.ascontiguousarray(values).reshape(np.shape(values))  # 0-d stays 0-d
    if values.dtype == NUMPY_DTYPES["bfloat16"]:
        return torch.from_numpy(values.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A host numpy copy of ``tensor``; bf16 through ml_dtypes, fp8 tensors as uint8 codes."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    if tensor.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.float8_e4m3fnuz, torch.float8_e5m2fnuz):
        return tensor.view(torch.uint8).numpy()
    return tensor.numpy()
