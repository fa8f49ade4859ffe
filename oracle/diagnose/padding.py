"""Hypotheses of how a kernel treats padding entries: another policy than the declared one, the
batch taken to end at its first padding entry, live entries compacted to the front (padding assumed
only at the tail), a whole low page taken as reserved, slot 0 skipped though nothing is reserved,
and tokens whose rows are all zeros taken for padding."""

from __future__ import annotations

import functools

import numpy as np

from ..reference.slots import Padding
from .hypothesis import ANY_DUPLICATES, Hypothesis, by_role


def padding_hypotheses(case, views: dict, prepared, contract) -> list[Hypothesis]:
    """Another padding policy than the declared one (a case with padding entries: each padding
    slot written repeats, so any whole colliding row is allowed); slot 0 skipped though the
    contract reserves nothing."""
    out = [Hypothesis("padding_policy", f"padding={other!r} instead of {contract.padding!r}",
                      override={"padding": other, **ANY_DUPLICATES})
           for other in ("none", "negative", "reserved:0")
           if case.p.get("padding") and other != contract.padding]
    policy = Padding.parse(contract.padding)
    if case.p.get("padding") and policy.kind != "none":
        pad = policy.reserved if policy.kind == "reserved" else -1
        for index in by_role(views, "index"):
            entries = prepared.numpy(index.name).astype(np.int64)
            marked = np.flatnonzero(policy.skipped(entries, np.iinfo(np.int64).max)) if entries.ndim == 1 else []
            if len(marked) and marked[0] < entries.size - 1:
                out.append(Hypothesis("rows_dropped", f"the entries of {index.name} from its first padding entry "
                                      f"(position {marked[0]} of {entries.size}) on not written: the batch taken to "
                                      "end there, as if padding came only at its tail",
                                      inputs={index.name: lambda a, at=marked[0]: np.concatenate(
                                          [a[:at], np.full(a.size - at, pad, a.dtype)])}))
                live = np.flatnonzero(~policy.skipped(entries, np.iinfo(np.int64).max))
                if live.size and not np.array_equal(live, np.arange(live.size)):
                    out.append(Hypothesis("rows_misrouted", f"the non-padding entries of {index.name} compacted to "
                                          f"the front ({live.size} of {entries.size}) and the j-th of them written "
                                          "with source row j, not its own position's (padding assumed to come only "
                                          "at the batch's tail)", inputs={source.name: functools.partial(
                                              _compacted, live) for source in by_role(views, "source")}))
    out += _low_slots_skipped(views, prepared, contract, policy)
    if policy.kind == "reserved":
        return out
    for index in by_role(views, "index"):
        entries = prepared.numpy(index.name)
        if entries.ndim == 1 and (entries == 0).any():
            out.append(Hypothesis("slot_zero_skipped", f"slot 0 skipped as if reserved, though the "
                                  f"contract declares padding={contract.padding!r}",
                                  inputs={index.name: lambda a: np.where(a == 0, -1, a)},
                                  override={"padding": "negative"}))
    return out


def _compacted(live: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``rows`` as a kernel that compacts the live entries reads them: live entry j takes row j."""
    out = rows.copy()
    out[live] = rows[:live.size]
    return out


LOW_SLOT_PAGES = (2, 4, 8, 16, 32, 64, 128, 256)  # how many low slots a reserved page may span


def _low_slots_skipped(views: dict, prepared, contract, policy) -> list[Hypothesis]:
    """Every slot below P skipped, for each P of :data:`LOW_SLOT_PAGES` whose upper half holds an
    entry and past which an entry writes (else it would write nothing at all, which is named
    as that): a whole reserved page (or block) taken for the one reserved slot, or a padding test
    ``slot < P``."""
    out = []
    for index in by_role(views, "index"):
        entries = prepared.numpy(index.name).astype(np.int64)
        if entries.ndim != 1:
            continue
        for page in LOW_SLOT_PAGES:
            if not ((entries >= page // 2) & (entries < page) & (entries > 0)).any() or not (entries >= page).any():
                continue
            text = (f"slots 0-{page - 1} skipped, a whole page of {page} taken as reserved, not only slot "
                    f"{policy.reserved}" if policy.kind == "reserved" else
                    f"slots 0-{page - 1} skipped as if reserved (a page of {page}), though the contract declares "
                    f"padding={contract.padding!r}")
            out.append(Hypothesis("padding_policy" if policy.kind == "reserved" else "slot_zero_skipped", text,
                                  inputs={index.name: lambda a, p=page: np.where((a >= 0) & (a < p), -1, a)},
                                  override={"padding": "negative"}))
    return out


def zero_row_hypotheses(views: dict, prepared) -> list[Hypothesis]:
    """Tokens whose rows are all zeros (as floats: +0 and -0 alike; as bits: +0 alone) taken for
    padding and not written: where the first source's row is, where every source's is, or where
    any source's is (a "CUDA-graph padding" shortcut that tests the rows, not the index)."""
    sources = [v for v in by_role(views, "source") if v.shape]
    indexes = [v for v in by_role(views, "index") if len(v.shape) == 1]
    if not sources or len(indexes) != 1:
        return []
    index = indexes[0]
    n = index.shape[0]
    masks = {}
    for test, zero in (("as floats", lambda a: a == 0), ("as bits", lambda a: _bits(a) == 0)):
        rows = [zero(_rows(prepared.numpy(v.name), n)).all(axis=1) for v in sources]
        for which, mask in ((f"{sources[0].name}'s row", rows[0]),
                            ("every source's row", np.logical_and.reduce(rows)),
                            ("any source's row", np.logical_or.reduce(rows))):
            if mask.any() and mask.tobytes() not in masks:
                masks[mask.tobytes()] = (mask, f"the tokens whose {which} is all zeros ({test}: "
                                         f"{int(mask.sum())} of {n}) taken for padding and not written")
    return [Hypothesis("zero_rows_skipped", text,
                       inputs={index.name: lambda a, m=mask: np.where(m, -1, a).astype(a.dtype)},
                       override={"padding": "negative"})
            for mask, text in masks.values()]


def _rows(array: np.ndarray, n: int) -> np.ndarray:
    """The first ``n`` token rows of a source, one row of elements each."""
    return array[:n].reshape(n, int(np.prod(array.shape[1:], dtype=np.int64)))


def _bits(array: np.ndarray) -> np.ndarray:
    """``array``'s elements as unsigned integers of their width (a float's bits)."""
    return array.view(f"<u{array.dtype.itemsize}")
