"""Guarded, poisoned allocations and the tensor views a case hands to a kernel.

Every tensor a kernel sees (caches, sources, indices, scales) is a strided view into a ``Region``:
one byte allocation whose payload is surrounded by guard bands, all filled with a seeded pseudo-
random poison (never zeros, so "left untouched" and "wrote zeros" differ). After the call the whole
region, guards included, is compared byte for byte, which catches out-of-bounds writes such as a
-1 slot written one row before the cache. Each view has a numpy twin over the same bytes, so the
reference sees exactly what the kernel saw.
"""

from __future__ import annotations

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
SHORT_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "uint8": "u8"}


def poison(nbytes: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(1, 256, nbytes, dtype=np.uint8)


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


class Arena:
    """The allocations of one case, on one device."""

    def __init__(self, device: str, seed: int):
        self.device = device
        self.seed = seed
        self.regions: dict[str, Region] = {}
        self.views: dict[str, ViewSpec] = {}

    def region(self, name: str, payload: int, guard: int = 256) -> Region:
        if name in self.regions:
            raise ValueError(f"region {name!r} allocated twice")
        guard = -(-guard // 64) * 64  # keep every payload 64-byte aligned
        data = poison(payload + 2 * guard, self.seed * 7919 + len(self.regions))
        tensor = torch.from_numpy(data).to(self.device)
        self.regions[name] = Region(name, payload, guard, tensor)
        return self.regions[name]

    def view(self, name: str, region: str, shape, strides=None, offset: int = 0,
             dtype: str = "uint8", role: str = "cache", values: np.ndarray | None = None) -> torch.Tensor:
        """A torch view into ``region``; ``values`` (numpy) are written into it when given."""
        shape = tuple(int(n) for n in shape)
        strides = tuple(int(s) for s in (strides or _contiguous_strides(shape)))
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

    def snapshot(self) -> dict[str, np.ndarray]:
        """A host copy of every region's bytes, guards included."""
        return {name: reg.tensor.detach().cpu().numpy().copy() for name, reg in self.regions.items()}

    def numpy_view(self, snapshot: dict[str, np.ndarray], name: str) -> np.ndarray:
        """The numpy twin of view ``name`` over a snapshot (writable: it aliases the snapshot)."""
        return numpy_view(snapshot[self.views[name].region], self.views[name], self.regions[self.views[name].region].guard)


def numpy_view(region_bytes: np.ndarray, spec: ViewSpec, guard: int) -> np.ndarray:
    dtype = NUMPY_DTYPES[spec.dtype]
    return np.ndarray(spec.shape, dtype=dtype, buffer=region_bytes, offset=guard + spec.offset,
                      strides=tuple(s * dtype.itemsize for s in spec.strides))


def _contiguous_strides(shape) -> tuple:
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
    values = np.ascontiguousarray(values)
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
