"""``translate_full_to_swa(mapping, loc) -> Tensor``: sglang's full -> SWA slot translation.

mapping int64 or int32 ``[size_full + page_size + 1]``: the full->SWA table (zeros for unmapped
slots) followed by the -1 sentinel; loc int32 or int64, any shape, strides and storage offset.
Returns ``mapping[loc]`` as a new tensor of the mapping's dtype and loc's shape; -1 translates to
-1 through the sentinel. Writes nothing: mapping and loc must be left as they were.

Case axes: ``dtype`` is the mapping's dtype (int64, int32; the contract has no field for integer
table dtypes, so it is not a requirement), ``index`` loc's; ``shape`` ``(size_full, page_size)``,
or ``(size_full, page_size, cols)`` for a 2-D loc ``[n, cols]``; ``cache="offset"`` puts the
mapping at a storage offset. Every loc of two or more entries holds some -1 entries, so those cases
need ``padding="negative"`` (-1 is padding and translates to padding); the catalogue has no
padding class for ops that return.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import torch

from .. import reference
from ..buffers import NUMPY_DTYPES, TORCH_DTYPES, Arena, dtype_name, numpy_view, to_numpy
from ..contract import Contract
from ..diagnose.generic import dropped_counts, index_hypotheses, offset_hypotheses, run_hypotheses
from ..diagnose.stale_inputs import stale_hypotheses
from ..diagnose.hypothesis import Hypothesis
from ..diagnose.slot_arithmetic import through_float32
from ..reference.slots import FLOAT32_EXACT
from . import _build
from .base import Case, OpSpec, Prepared

SENTINEL = -1


class TranslateFullToSwa(OpSpec):
    name = "translate_full_to_swa"
    signature = "translate_full_to_swa(mapping, loc) -> Tensor"
    dtypes = ("int64", "int32")  # the mapping's dtype
    default_shape = (1024, 16)  # (size_full, page_size)
    # (size_full, page_size[, cols]): loc [N, cols]; cols 0 is a 0-d loc (one index, shape ())
    shapes = ((1024, 1), (1024, 16), (8192, 64), (16, 16), (1024, 16, 3), (1024, 16, 0))
    index_2d_shape = (1024, 16, 3)
    float_slots_shape = (1024, 16)  # its mapping's SWA slots moved past 2**24
    aliasing = ("offset",)
    returns = True

    def needs(self, case: Case) -> dict:
        out = super().needs(case)
        p = self.p_with_defaults(case)
        out["dtype"] = None
        count = self._count(p)
        out["padding"] = "negative" if count >= 2 else None
        return out

    def build(self, case: Case, arena: Arena, rng: np.random.Generator, contract: Contract) -> Prepared:
        p = self.p_with_defaults(case)
        size_full, page_size = p["shape"][:2]
        cols = p["shape"][2] if len(p["shape"]) > 2 else None
        n, bad = p["n"], p.get("bad")
        table = size_full + page_size  # mapping[table] is the sentinel
        values = self._table(rng, size_full, page_size)
        if p.get("slots") == "past_float":  # SWA slots of a pool past 2**24: odd numbers no float32 holds
            mapped = values[:-1] > 0
            values[:-1][mapped] = FLOAT32_EXACT + 1 + 2 * values[:-1][mapped]
        if bad == "no_sentinel":
            values[-1] = values[table - 1] or page_size
        mapping = self._mapping(arena, values.astype(NUMPY_DTYPES[p["dtype"]]), p["cache"], rng)

        count = self._count(p)
        entries = rng.integers(0, table, size=count).astype(np.int64)
        if p.get("slots") == "run":  # a prefill's consecutive slots (wrapping past the table)
            entries = _build.run_of_slots(count, count) % table
        elif count >= 2:  # the table's edges
            entries[rng.choice(count, size=2, replace=False)] = (0, table - 1)
        if p.get("slots") == "run" and count >= 4:  # -1 entries inside the run, its ends kept
            entries[1 + rng.choice(count - 2, size=max(1, count // 8), replace=False)] = SENTINEL
        elif count >= 2:  # -1 (padding) entries
            entries[rng.choice(count, size=max(1, count // 8), replace=False)] = SENTINEL
        where = _build.illegal_at(count)
        if bad == "negative_two" and count:
            entries[where] = -2
        elif bad == "sentinel_index" and count:
            entries[where] = table
        elif bad == "out_of_range" and count:
            entries[where] = table + 1 + 7
        if cols and p["index_layout"] != "contig":
            loc = _build.index(arena, "loc", entries.reshape(n, cols), p["index"], p["index_layout"], table, rng)
        elif cols is not None:
            shape = (n, cols) if cols else ()
            loc = arena.tensor("loc", entries.reshape(shape).astype(NUMPY_DTYPES[p["index"]]), role="index")
        else:
            loc = _build.index(arena, "loc", entries, p["index"], p["index_layout"], table, rng)
        if bad == "index_dtype":
            loc = loc.to(torch.int16)
        elif bad == "mapping_dtype":
            mapping = mapping.to(torch.float32)
        return Prepared(arena, (mapping, loc), ())

    @staticmethod
    def _count(p: dict) -> int:
        """How many entries loc holds: N, N * cols, or 1 for a 0-d loc."""
        cols = p["shape"][2] if len(p["shape"]) > 2 else None
        return 1 if cols == 0 else p["n"] * (cols or 1)

    @staticmethod
    def _table(rng: np.random.Generator, size_full: int, page_size: int) -> np.ndarray:
        """A table in a state the allocator can reach: about 3/4 of the full pages mapped, each
        slot by slot into its own SWA page, some with an unmapped tail (a partly filled page);
        page 0 and the other pages unmapped (0); the -1 sentinel last."""
        mapping = reference.make_swa_mapping(size_full, page_size)
        pages = size_full // page_size
        mapped = rng.permutation(np.arange(1, pages + 1))[: max(1, (3 * pages) // 4)]
        swa_pages = rng.permutation(np.arange(1, pages + 1))[: len(mapped)]
        offsets = np.arange(page_size)
        for full_page, swa_page in zip(mapped, swa_pages):
            used = page_size if rng.random() < 0.7 else int(rng.integers(1, page_size + 1))
            mapping[full_page * page_size + offsets[:used]] = swa_page * page_size + offsets[:used]
        return mapping

    @staticmethod
    def _mapping(arena: Arena, values: np.ndarray, layout: str, rng: np.random.Generator):
        if layout != "offset":
            return arena.tensor("mapping", values, role="source")
        lead = 5  # elements of decoy table entries before the mapping
        decoys = rng.integers(1, max(len(values), 2), size=len(values) + lead).astype(values.dtype)
        arena.tensor("mapping_storage", decoys, role="decoy")
        return arena.view("mapping", "mapping_storage", values.shape, (1,), lead * values.itemsize,
                          dtype_name(values.dtype), role="source", values=values)

    def expected(self, prepared: Prepared, case: Case, contract: Contract, **override) -> dict:
        """Nothing is written: every region must be left as it was (the returned tensor is
        judged by :meth:`check_returned`)."""
        return {}

    def expected_returned(self, prepared: Prepared) -> np.ndarray:
        return reference.translate_full_to_swa(prepared.numpy("mapping"), prepared.numpy("loc"))

    def check_returned(self, prepared: Prepared, expected: dict, returned) -> tuple:
        """(the memory expectation, unchanged; None, or why ``returned`` is wrong; the
        :class:`Hypothesis` that explains it, or None): ``returned`` must be a tensor on the case's
        device, of the mapping's dtype and loc's shape, equal to the reference."""
        want = self.expected_returned(prepared)
        want_dtype = TORCH_DTYPES[dtype_name(want.dtype)]
        if not isinstance(returned, torch.Tensor):
            return expected, f"returned {type(returned).__name__}, not a tensor", None
        device = torch.device(prepared.arena.device)
        problems = []
        if returned.device.type != device.type:
            problems.append(f"returned a tensor on {returned.device}; expected {device}")
        if returned.dtype != want_dtype:
            problems.append(f"returned dtype {returned.dtype}; expected {want_dtype} (the mapping's dtype)")
        if tuple(returned.shape) != want.shape:
            problems.append(f"returned shape {tuple(returned.shape)}; expected {want.shape} (loc's shape)")
            return expected, "\n".join(problems), _layout_cause(problems)
        got = to_numpy(returned).astype(np.int64).reshape(-1)
        flat = want.astype(np.int64).reshape(-1)
        differ = np.flatnonzero(got != flat)
        matched = None
        if differ.size:
            i = int(differ[0])
            loc = prepared.numpy("loc").reshape(-1)
            where = np.unravel_index(i, want.shape) if want.ndim else ()
            index = ", ".join(str(int(k)) for k in where)
            problems.append(f"returned[{index}] = {int(got[i])}, expected {int(flat[i])} "
                            f"(loc[{index}] = {int(loc[i])}); {differ.size} of {flat.size} entries differ")
            matched = (next((h for h, alt in self._misreads(prepared) if alt.shape == got.shape
                             and np.array_equal(alt, got)), None) or _filled_in_memory_order(returned, flat)
                       or _tail_dropped(differ, flat.size) or _first_dim_only(differ, want.shape)
                       or _permuted(got, flat, loc))
        if matched is None and problems and not differ.size:  # the right values, in the wrong tensor
            matched = _layout_cause(problems)
        return expected, "\n".join(problems) or None, matched

    @staticmethod
    def _misreads(prepared: Prepared):
        """What a kernel returns when it reads its inputs as a generic hypothesis says (loc's
        stride or storage offset ignored, the mapping's storage offset ignored, loc taken as the
        run its ends span), on a repeat case's second call the first call's loc or mapping, or
        with -1 clamped to slot 0: (hypothesis, the translation of what it read, flat)."""
        arena = prepared.arena
        mapping = prepared.numpy("mapping").astype(np.int64)
        loc = prepared.numpy("loc").astype(np.int64).reshape(-1)
        padding = (loc == SENTINEL)
        if padding.any() and np.all((loc >= SENTINEL) & (loc < len(mapping))):
            yield (Hypothesis("padding_policy", "-1 entries clamped to slot 0 (translated as mapping[0]) "
                              "instead of through the sentinel"),
                   mapping[np.where(padding, 0, loc)])
            spec = arena.views["mapping"]
            before = replace(spec, shape=(1,), strides=(1,), offset=spec.offset - spec.itemsize)
            word = numpy_view(prepared.before[spec.region], before, arena.regions[spec.region].guard)
            yield (Hypothesis("padding_policy", "-1 entries read as the word before the mapping "
                              "(mapping_ptr + loc, pointer arithmetic) instead of the sentinel"),
                   np.where(padding, word.astype(np.int64)[0], mapping[np.where(padding, 0, loc)]))
        valid = (loc >= 0) & (loc < len(mapping) - 1)
        try:  # a ValueError where every entry is exact in float32
            rounded = through_float32(mapping) if np.all(valid | padding) else None
        except ValueError:
            rounded = None
        if rounded is not None:
            yield (Hypothesis("slots_through_float", "the mapping's entries carried through float32 (a gather "
                              "in a float type, as an embedding lookup does): SWA slots past 2^24 rounded to an "
                              "even neighbour"), rounded[np.where(padding, SENTINEL, loc)])
        if valid.any() and np.all(valid | padding):
            for page in PAGE_GUESSES:
                first = mapping[np.where(valid, loc - loc % page, 0)]
                paged = np.where(valid, first + loc % page, mapping[SENTINEL])
                read = f"the mapping read once per page of {page} slots: mapping[loc & ~{page - 1}] + (loc & {page - 1})"
                yield (Hypothesis("mapping_assumed_paged", f"{read}, as if every page were mapped whole and in "
                                  "order (wrong for a partly filled page, or one mapped out of order)"), paged)
                yield (Hypothesis("mapping_assumed_paged", f"{read}, 0 where that first entry is 0, as if every "
                                  "page were mapped whole and in order"), np.where(valid & (first == 0), 0, paged))
        yield from _read_as_loc_dtype(prepared.numpy("mapping"), prepared.numpy("loc").reshape(-1))
        readdressed = [h for h in index_hypotheses(arena) if h.cause in ("index_stride_ignored", "index_offset_ignored")]
        for hypothesis in (stale_hypotheses(prepared) + run_hypotheses(prepared) + readdressed
                           + offset_hypotheses(arena, ())):
            try:
                read = {name: _as_read(prepared, hypothesis, name) for name in ("mapping", "loc")}
            except ValueError:  # a view that reaches past its allocation
                continue
            table, entries = len(read["mapping"]), read["loc"].reshape(-1)
            if np.all((entries >= -table) & (entries < table)):
                # plain indexing, as a kernel without checks gathers (the sentinel through -1)
                plain = read["mapping"][entries]
                yield hypothesis, plain
                # or -1 kept as the padding result, as a kernel that checks for it does
                yield hypothesis, np.where(entries == SENTINEL, mapping[SENTINEL], plain)

    def bad_inputs(self) -> tuple:
        return ("negative_two", "sentinel_index", "out_of_range", "index_dtype", "mapping_dtype",
                "no_sentinel")


__all__ = ["TranslateFullToSwa"]


PAGE_GUESSES = (8, 16, 32, 64, 128)  # page sizes a kernel that reads the mapping per page may assume


def _layout_cause(problems: list) -> Hypothesis:
    return Hypothesis("returned_layout", "; ".join(problems))


def _as_read(prepared: Prepared, hypothesis: Hypothesis, name: str) -> np.ndarray:
    """View ``name`` as the kernel read it under ``hypothesis``: re-addressed, then replaced."""
    arena = prepared.arena
    spec = arena.views[name]
    if name in hypothesis.views:
        shape, strides, offset = hypothesis.views[name][:3]
        spec = replace(spec, shape=tuple(shape), strides=tuple(strides), offset=offset)
    array = numpy_view(prepared.before[spec.region], spec, arena.regions[spec.region].guard)
    return hypothesis.inputs.get(name, lambda a: a)(array).astype(np.int64)


def _filled_in_memory_order(returned: torch.Tensor, flat: np.ndarray) -> Hypothesis | None:
    """result_strides_ignored where ``returned`` is a dense tensor of permuted strides whose
    memory, in address order, holds the reference's entries in their logical (C) order: a result
    allocated like a permuted input (``empty_like``) and filled through a flat pointer."""
    if returned.dim() < 2 or returned.is_contiguous():
        return None
    order = sorted(range(returned.dim()), key=lambda d: -returned.stride(d))
    in_memory = returned.permute(order)
    if not in_memory.is_contiguous():
        return None
    if not np.array_equal(to_numpy(in_memory).astype(np.int64).reshape(-1), flat):
        return None
    strides = tuple(returned.stride())
    return Hypothesis("result_strides_ignored", f"the result (strides {strides}, a permuted layout, as "
                      "empty_like of a permuted loc gives) filled in its memory order as if it were contiguous: "
                      "its logical entries transposed")


def _first_dim_only(differ: np.ndarray, shape: tuple) -> Hypothesis | None:
    """rows_dropped where a 2-D (or higher) loc's first ``shape[0]`` entries, in C order, are right
    and every differing entry lies past them: a count taken from loc's first dimension, not its
    number of entries (the rest of the result left as allocated)."""
    if len(shape) < 2 or not differ.size or int(differ[0]) < shape[0]:
        return None
    total = int(np.prod(shape))
    return Hypothesis("rows_dropped", f"only the first {shape[0]} of the {total} entries translated (loc.shape[0], "
                      f"not loc.numel(): a count from loc's first dimension); {differ.size} of the "
                      f"{total - shape[0]} after them differ, left as the result was allocated")


def _tail_dropped(differ: np.ndarray, n: int) -> Hypothesis | None:
    """rows_dropped where every differing entry lies in the result's last k, for k 1 or the
    entries past the last whole tile of a grid sized n // tile, and each of those k differs."""
    for k, why in dropped_counts(n):
        if k < n and differ.size == k and int(differ[0]) == n - k:  # and the entries before it right
            return Hypothesis("rows_dropped", f"the last {k} entries of the result not written ({why})")
    return None


def _read_as_loc_dtype(mapping: np.ndarray, loc: np.ndarray):
    """A kernel templated on one index type for both tensors reads the mapping's words as loc's
    type: an int64 mapping under an int32 loc gives the low or high half of entry ``slot // 2``,
    an int32 mapping under an int64 loc the pairs of entries (the result in the mapping's dtype:
    their low word). (hypothesis, result) with -1 read through those words, and kept as -1."""
    if mapping.dtype.itemsize == loc.dtype.itemsize or mapping.nbytes % loc.dtype.itemsize:
        return
    words = np.ascontiguousarray(mapping).view(loc.dtype)
    if not np.all((loc >= -1) & (loc < len(words))):  # past the table: such a kernel faults
        return
    read = f"the {mapping.dtype} mapping's words read as {loc.dtype} (loc's dtype): entry slot of {len(words)} such words"
    values = words[loc].astype(mapping.dtype).astype(np.int64)  # -1: the last word, as plain indexing reads it
    yield Hypothesis("mapping_dtype_misread", read), values
    yield Hypothesis("mapping_dtype_misread", f"{read}, -1 kept as -1"), np.where(loc < 0, SENTINEL, values)


def _permuted(got: np.ndarray, want: np.ndarray, loc: np.ndarray) -> Hypothesis | None:
    """The right results in another order: the same multiset, other places. Named more closely
    where it is the translation of sorted loc put back with the sort's permutation applied again
    (``values[order]``) where its inverse was meant (``out[order] = values``)."""
    if np.array_equal(np.sort(got), np.sort(want)):
        if _sort_applied_twice(got, want, loc):
            return Hypothesis("results_permuted", f"the translation of loc sorted ({loc.size} entries) put back "
                              "with the sort's permutation applied again (values[order]) where its inverse was "
                              "meant (out[order] = values)")
        return Hypothesis("results_permuted", f"the right translations, {np.count_nonzero(got != want)} of them in "
                          "other places (a permutation not undone, or undone wrongly)")
    return None


def _sort_applied_twice(got: np.ndarray, want: np.ndarray, loc: np.ndarray) -> bool:
    """Whether ``got[i] = values[order[i]]`` with ``values = want[order]`` for some sorting
    permutation ``order`` of ``loc``: the sort's tie order is the kernel's own, so output ``i``
    may hold the value at any rank of the original entries that tie with the ``i``-th smallest."""
    order = np.argsort(loc, kind="stable")
    ranked, sorted_values = loc[order], want[order]
    bounds = np.flatnonzero(np.diff(ranked)) + 1
    for start, end in zip(np.concatenate(([0], bounds)), np.concatenate((bounds, [loc.size]))):
        allowed = sorted_values[order[start:end]]  # ranks order[start:end]: the tie group's entries
        if not np.all(np.isin(got[start:end], allowed)):
            return False
    return True
