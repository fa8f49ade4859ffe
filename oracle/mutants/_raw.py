"""Raw memory access for the mutants: what a C kernel does with ``ptr + offset``.

A mutant that computes a wrong address must write where that address lands (a guard band, a lead
area, a neighbour's row), not where torch's bounds-checked indexing would put it. These helpers
address a tensor's whole underlying storage by element or byte offset. They never touch memory
outside that storage: an address past it raises ``IndexError`` (a segfault, in C), so Python
cannot crash.
"""

from __future__ import annotations

import torch


def storage_elements(t: torch.Tensor) -> torch.Tensor:
    """A 1-D tensor of ``t``'s dtype over ``t``'s whole storage (element 0 = the storage start)."""
    count = t.untyped_storage().nbytes() // t.element_size()
    return t.as_strided((count,), (1,), 0)


def storage_bytes(t: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 tensor over ``t``'s whole storage."""
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(t.untyped_storage())


def row_offsets(t: torch.Tensor, axes: int = 1) -> torch.Tensor:
    """Element offsets, relative to a row's start, of every element of one row of ``t`` (the axes
    after the first ``axes``), in row-major logical order (int64)."""
    offsets = torch.zeros((), dtype=torch.int64, device=t.device)
    for size, stride in zip(t.shape[axes:], t.stride()[axes:]):
        offsets = offsets.unsqueeze(-1) + torch.arange(size, device=t.device) * stride
    return offsets.reshape(-1)


def _check(positions: torch.Tensor, limit: int, what: str) -> None:
    if positions.numel() and (int(positions.min()) < 0 or int(positions.max()) >= limit):
        raise IndexError(f"{what}: address {int(positions.min())}..{int(positions.max())} lies "
                         f"outside the allocation [0, {limit}) (a segfault, in C)")


def write_rows_at(cache: torch.Tensor, starts: torch.Tensor, rows: torch.Tensor, axes: int = 1) -> None:
    """Write ``rows[i]`` (the shape of one row of ``cache``: its axes after the first ``axes``) at
    absolute storage element offset ``starts[i]``, with ``cache``'s row strides, in order (a later
    row wins). ``starts`` int64 ``[N]``."""
    flat = storage_elements(cache)
    positions = starts.to(torch.int64).reshape(-1, 1) + row_offsets(cache, axes).reshape(1, -1)
    _check(positions, flat.numel(), "row write")
    values = rows.reshape(positions.shape).to(cache.dtype)
    if torch.unique(starts).numel() == starts.numel():  # disjoint rows: order does not matter
        flat.index_put_((positions.reshape(-1),), values.reshape(-1))
        return
    for i in range(positions.shape[0]):  # in order, like one thread per row finishing in turn
        flat[positions[i]] = values[i]


def copy_bytes(dst: torch.Tensor, dst_starts: torch.Tensor, src: torch.Tensor,
               src_starts: torch.Tensor, nbytes: int) -> None:
    """For each ``i``, copy ``nbytes`` bytes from byte ``src_starts[i]`` of ``src``'s storage to
    byte ``dst_starts[i]`` of ``dst``'s storage (memcpy between raw pointers), in order."""
    dst_b, src_b = storage_bytes(dst), storage_bytes(src)
    span = torch.arange(nbytes, device=dst.device)
    reads = src_starts.to(torch.int64).reshape(-1, 1) + span
    writes = dst_starts.to(torch.int64).reshape(-1, 1) + span
    _check(reads, src_b.numel(), "vector read")
    _check(writes, dst_b.numel(), "vector write")
    for i in range(writes.shape[0]):
        dst_b[writes[i]] = src_b[reads[i]].clone()
