"""Hypotheses that hold for every op: how a kernel misreads the index, the sources and the caches.

They are derived from the case's views alone (their roles, shapes, strides and offsets), so every
op gets them without describing them: an index read as if contiguous or from its storage's start,
sources read as if packed, one cache addressed with the other's strides, caches assumed dense, the
index read past its end, slot 0 skipped.
"""

from __future__ import annotations

import numpy as np

from ..buffers import ViewSpec, contiguous_strides
from ..reference.slots import Padding
from .hypothesis import Hypothesis


# The index as a misreading kernel sees it can repeat a slot (decoys are drawn with replacement):
# any whole colliding row is then allowed, as for a kernel that declares duplicates="any".
ANY_DUPLICATES = {"duplicates": "any"}


def _by_role(views: dict, role: str) -> list[ViewSpec]:
    return [v for v in views.values() if v.role == role]


def index_hypotheses(arena) -> list[Hypothesis]:
    out = []
    views = arena.views
    for index in _by_role(views, "index"):
        if index.strides != contiguous_strides(index.shape):
            out.append(Hypothesis("index_stride_ignored", f"{index.name} read as if contiguous "
                                  f"(its stride {index.strides[-1]} ignored)",
                                  views={index.name: (index.shape, contiguous_strides(index.shape), index.offset)},
                                  override=ANY_DUPLICATES))
        start = -arena.regions[index.region].guard  # the storage starts at the leading guard band
        if index.offset != start:
            out.append(Hypothesis("index_offset_ignored", f"{index.name} read from its storage's "
                                  f"start (its storage offset of {(index.offset - start) // index.itemsize} "
                                  "elements ignored)",
                                  views={index.name: (index.shape, index.strides, start)},
                                  override=ANY_DUPLICATES))
        if index.shape and index.shape[0] > 1 and len(index.shape) == 1:
            out.append(Hypothesis("rows_dropped", f"the last entry of {index.name} not written (a loop "
                                  f"bound of {index.shape[0] - 1} instead of {index.shape[0]})",
                                  views={index.name: ((index.shape[0] - 1,), index.strides, index.offset)}))
    return out


def source_hypotheses(views: dict) -> list[Hypothesis]:
    strided = [v for v in _by_role(views, "source") if v.strides != contiguous_strides(v.shape)]
    if not strided:
        return []
    names = ", ".join(v.name for v in strided)
    out = [Hypothesis("source_stride_ignored", f"the row stride of {names} ignored (rows read as if packed)",
                      views={v.name: (v.shape, contiguous_strides(v.shape), v.offset) for v in strided})]
    if len(strided) > 1:
        out += [Hypothesis("source_stride_ignored", f"the row stride of {v.name} ignored (its rows read "
                           "as if packed)", views={v.name: (v.shape, contiguous_strides(v.shape), v.offset)})
                for v in strided]
    return out


def swapped_source_hypotheses(views: dict) -> list[Hypothesis]:
    """One source written where another belongs (K into the V cache)."""
    sources = _by_role(views, "source")
    return [Hypothesis("sources_swapped", f"{a.name} written in place of {b.name}",
                       views={b.name: (a.shape, a.strides, a.offset, a.region)})
            for a in sources for b in sources
            if a is not b and a.shape == b.shape and a.dtype == b.dtype]


def cache_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    caches = [views[name] for name in written if name in views]
    out = []
    for a in caches:
        for b in caches:
            if a is not b and a.shape == b.shape and a.strides != b.strides:
                out.append(Hypothesis("cache_strides_swapped", f"{b.name} addressed with {a.name}'s "
                                      f"strides {list(a.strides)} (its own are {list(b.strides)})",
                                      views={b.name: (b.shape, a.strides, b.offset)}))
    paged = [c for c in caches if len(c.shape) == 4]  # [blocks, block_size, heads, dim]
    if paged and paged[0].shape[2] != paged[0].shape[1]:
        block_size, wrong = paged[0].shape[1], paged[0].shape[2]
        blocks, inputs, dropped = -(-paged[0].shape[0] * block_size // wrong), {}, ""
        if wrong < block_size:
            # the misread block index runs past the cache's last block; what a kernel writes out
            # there is not modelled: the hypothesis takes those slots as dropped (a kernel that
            # bounds-checks its block index), and a kernel that writes them fails the guards
            blocks = paged[0].shape[0]
            inputs = {ix.name: (lambda a, limit=blocks * wrong: np.where(a >= limit, -1, a))
                      for ix in _by_role(views, "index")}
            dropped = f"; slots past block {blocks - 1} so addressed were dropped"
        out.append(Hypothesis("block_size_wrong_dim", f"the block size taken from the heads dimension "
                              f"({wrong}) instead of dimension 1 ({block_size}){dropped}",
                              views={c.name: ((blocks, wrong) + c.shape[2:], c.strides, c.offset) for c in paged},
                              inputs=inputs))
    undense = [c for c in caches if c.strides != contiguous_strides(c.shape)]
    if undense:
        out.append(Hypothesis("dense_cache_assumed", "the caches assumed dense in their logical "
                              f"[{', '.join(map(str, caches[0].shape[1:]))}] rows (strides ignored)",
                              views={c.name: (c.shape, contiguous_strides(c.shape), c.offset) for c in undense}))
    return out


VECTOR_BYTES = 16  # the widest plain vector store


def overrun_hypotheses(views: dict, written: tuple) -> list[Hypothesis]:
    """Rows copied in whole 16-byte vectors with no tail loop: each row's bytes rounded up to a
    multiple of 16, read past the source row and written past the cache row (flat [S, H, D]
    caches with packed rows only)."""
    caches = [views[n] for n in written if n in views]
    sources = _by_role(views, "source")
    rows = caches + sources
    if not caches or any(len(v.shape) != 3 for v in rows):
        return []
    if any(v.strides[1:] != contiguous_strides(v.shape[1:]) for v in rows):
        return []
    width = int(np.prod(caches[0].shape[1:]))
    itemsize = caches[0].itemsize
    rounded = -(-width * itemsize // VECTOR_BYTES) * VECTOR_BYTES // itemsize
    if rounded == width or any(int(np.prod(v.shape[1:])) != width for v in rows):
        return []
    return [Hypothesis("row_overrun", f"each row copied as whole {VECTOR_BYTES}-byte vectors: "
                       f"{rounded * itemsize} bytes where a row has {width * itemsize}, past its end",
                       views={v.name: ((v.shape[0], 1, rounded), (v.strides[0], rounded, 1), v.offset)
                              for v in rows})]


def index_past_end_hypotheses(views: dict, prepared) -> list[Hypothesis]:
    """The index read up to the sources' row count, where the sources have more rows."""
    out = []
    sources = _by_role(views, "source")
    for index in _by_role(views, "index"):
        rows = max((s.shape[0] for s in sources if s.shape), default=0)
        if index.shape and rows > index.shape[0]:
            out.append(Hypothesis("rows_past_index", f"{index.name} read past its end, to the sources' "
                                  f"{rows} rows (a grid sized from the sources, not from {index.name})",
                                  views={index.name: ((rows,) + index.shape[1:], index.strides, index.offset)},
                                  override=ANY_DUPLICATES))
    return out


def padding_hypotheses(case, views: dict, prepared, contract) -> list[Hypothesis]:
    """Another padding policy than the declared one (a case with padding entries: each padding
    slot written repeats, so any whole colliding row is allowed); slot 0 skipped though the
    contract reserves nothing."""
    out = [Hypothesis("padding_policy", f"padding={other!r} instead of {contract.padding!r}",
                      override={"padding": other, **ANY_DUPLICATES})
           for other in ("none", "negative", "reserved:0")
           if case.p.get("padding") and other != contract.padding]
    if Padding.parse(contract.padding).kind == "reserved":
        return out
    for index in _by_role(views, "index"):
        entries = prepared.numpy(index.name)
        if entries.ndim == 1 and (entries == 0).any():
            out.append(Hypothesis("slot_zero_skipped", f"slot 0 skipped as if reserved, though the "
                                  f"contract declares padding={contract.padding!r}",
                                  inputs={index.name: lambda a: np.where(a == 0, -1, a)},
                                  override={"padding": "negative"}))
    return out


def hypotheses(spec, case, contract, prepared) -> list[Hypothesis]:
    """Every generic hypothesis for this case, most specific first."""
    views = prepared.arena.views
    return (padding_hypotheses(case, views, prepared, contract) + index_hypotheses(prepared.arena)
            + source_hypotheses(views) + swapped_source_hypotheses(views)
            + cache_hypotheses(views, prepared.caches) + overrun_hypotheses(views, prepared.caches)
            + index_past_end_hypotheses(views, prepared))
