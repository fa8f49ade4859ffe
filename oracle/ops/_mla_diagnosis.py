"""Hypotheses of the MLA writers that depend on a case's layout or index: where a kernel writes
the rope part of a row, what it reads for the rope's first elements, and which source row a
DCP-sharded writer takes for each kept loc."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..buffers import numpy_view
from ..diagnose.hypothesis import Hypothesis, alternatives_text
from ..reference.slots import Padding, dcp_local_rows
from .base import Prepared

VECTORS = (2, 4, 8, 16)  # elements a vectorized row copy moves at once


def misplaced_rope(views: dict, cache: str, first: str, nope: int, rope: int, known: set) -> list[Hypothesis]:
    """rope (k_pe) written at another element of each row (entry) than ``nope`` (the first part's
    width): at the first part's source row stride (its stride taken for its width), at the
    first part's end rounded up to 16, 32, 64 or 128 bytes (a vector store's alignment), at a
    hard-coded 512 (DeepSeek's kv_lora_rank), or at its width in bytes of another element size
    (an element size hard-coded in a byte offset); offsets in ``known`` are tried elsewhere. Where the
    rope so runs past its row into the next, the cache is replayed one slot (block) longer, into
    its guard band, as the kernel writes it."""
    view = views[cache]
    itemsize, width = view.itemsize, view.shape[-1]
    offsets = {views[first].strides[0]: f"the {first} source's row stride, taken for its width"}
    for align in (16, 32, 64, 128):
        at = -(-nope * itemsize // align) * align // itemsize
        offsets.setdefault(at, f"{first}'s end rounded up to {align} bytes")
    offsets.setdefault(512, "a hard-coded kv_lora_rank")
    for size in (1, 2, 4):  # nope's bytes counted in another element size (bf16's 2 hard-coded)
        if size != itemsize and nope * size % itemsize == 0:
            offsets.setdefault(nope * size // itemsize, f"{first}'s width times {size} bytes, as if its "
                                                        f"elements were {size}-byte ones")
    out = []
    packed = view.strides[-2] == width and all(view.strides[i] == view.strides[i + 1] * view.shape[i + 1]
                                               for i in range(len(view.shape) - 2))
    for at, why in offsets.items():
        if at in known or at == nope or at <= 0:
            continue
        spills = at + rope > width
        if spills and not packed:  # into another view's columns: not replayed
            continue
        views_ext = {cache: ((view.shape[0] + 1,) + view.shape[1:], view.strides, view.offset)} if spills else {}
        out.append(Hypothesis("part_misplaced", f"the rope part written at element {at} ({why}) instead of "
                              f"at element {nope}" + (", past the row's end into the next" if spills else ""),
                              {"rope_at": at}, views=views_ext))
    return out


def boundary_vector_read(prepared: Prepared, first: str, second: str) -> list[Hypothesis]:
    """The ``second`` source's first elements read from past the ``first`` source's row end: a
    row copied in vectors of V elements whose vector straddling the boundary (the first part's
    width no multiple of V) is loaded whole from the first source, then stored where it belongs,
    so the second part's first ``V - width % V`` elements are whatever follows the first
    source's row in memory (its next row, a neighbour's columns, a guard band)."""
    arena, before = prepared.arena, prepared.before
    a, b = arena.views[first], arena.views[second]
    width, rope = a.shape[-1], b.shape[-1]
    region = arena.regions[a.region]
    if region.sparse or not rope or 0 in a.shape:
        return []
    spills: dict = {}  # elements read past the row -> the vector widths that read that many
    for vector in VECTORS:
        if width % vector:
            spills.setdefault(min(vector - width % vector, rope), []).append(vector)
    out = []
    for spill, vectors in spills.items():
        past = replace(a, shape=a.shape[:-1] + (width + spill,))
        if past.extent()[1] > region.payload + region.guard:
            continue

        def read(array, past=past, spill=spill):
            wider = numpy_view(before[past.region], past, region.guard)
            out = array.copy()
            out[..., :spill] = wider[..., width:]
            return out

        out.append(Hypothesis("sources_assumed_adjacent", f"the vector ({alternatives_text(vectors)} elements) "
                              f"across the {first} / {second} boundary loaded from {first} alone: {second}'s first "
                              f"{spill} elements read from past {first}'s row end", inputs={second: read}))
    return out


def compacted_sources(prepared: Prepared, contract, sources: tuple) -> list[Hypothesis]:
    """Under DCP (``dcp_world > 1``): the entries this rank keeps compacted to the front (the
    DCP-selected ones, or those that are also no padding), and the j-th of them written with source
    row j, its position in the compacted list, instead of its own position in the index."""
    if contract.dcp_world == 1:
        return []
    loc = prepared.numpy("loc").astype(np.int64)
    selected, _ = dcp_local_rows(loc, contract.dcp_world, contract.dcp_rank, contract.dcp_modulo)
    padding = Padding.parse(contract.padding).skipped(loc, np.iinfo(np.int64).max)
    out, seen = [], set()
    for kept, which in ((selected, "the locs this rank selects"), (selected & ~padding, "the locs it writes")):
        positions = np.flatnonzero(kept)
        if not positions.size or np.array_equal(positions, np.arange(positions.size)) or positions.tobytes() in seen:
            continue
        seen.add(positions.tobytes())

        def read(array, positions=positions):
            out = array.copy()
            out[positions] = array[:positions.size]
            return out

        out.append(Hypothesis("rows_misrouted", f"{which} compacted to the front ({positions.size} of {loc.size}) "
                              "and the j-th of them written with source row j, not the row of its own position",
                              inputs={name: read for name in sources}))
    return out


def local_row_reserved(prepared: Prepared, contract) -> list[Hypothesis]:
    """Under DCP with a reserved padding slot K: the padding test applied to the local row (``loc
    div W == K``) instead of the widened loc (``loc == K``), so the kept loc of local row K is
    skipped as if it were padding."""
    policy = Padding.parse(contract.padding)
    if contract.dcp_world == 1 or policy.kind != "reserved":
        return []
    loc = prepared.numpy("loc").astype(np.int64)
    selected, rows = dcp_local_rows(loc, contract.dcp_world, contract.dcp_rank, contract.dcp_modulo)
    hit = selected & (rows == policy.reserved) & (loc != policy.reserved)
    if not hit.any():
        return []
    return [Hypothesis("padding_policy", f"the reserved slot {policy.reserved} compared with the local row (loc "
                       f"div {contract.dcp_world}) instead of the widened loc: loc "
                       f"{int(loc[hit][0])}, local row {policy.reserved}, skipped as padding",
                       inputs={"loc": lambda a, hit=hit: np.where(hit, policy.reserved, a).astype(a.dtype)})]
