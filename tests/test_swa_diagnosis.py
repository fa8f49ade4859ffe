"""A wrong SWA translation is named by what it returned: the wrong dtype or shape
(returned_layout), -1 read through pointer arithmetic (padding_policy), the mapping read from its
storage's start (storage_offset_ignored), the last entries left unwritten (rows_dropped), the
mapping read once per page (mapping_assumed_paged) or with loc's dtype (mapping_dtype_misread), the
right results in another order (results_permuted). Every
failure of each such kernel in the quick catalogue names its cause; the baseline passes the same
cases."""

from __future__ import annotations

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

OP = "translate_full_to_swa"


def always_int32(mapping, loc):
    return tn.translate_full_to_swa(mapping, loc).to(torch.int32)


def minus_one_reads_the_word_before(mapping, loc):
    out = tn.translate_full_to_swa(mapping, loc)
    before = mapping.as_strided((1,), (1,), mapping.storage_offset() - 1)[0]  # mapping_ptr + (-1)
    return torch.where(loc == -1, before, out)


def mapping_from_storage_start(mapping, loc):
    tn.translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the checks
    return mapping.as_strided(mapping.shape, mapping.stride(), 0)[loc.long()]  # storage pointer, plain gather


def last_entry_unwritten(mapping, loc):
    out = tn.translate_full_to_swa(mapping, loc)
    if out.numel() > 1:
        out[(-1,) * out.dim()] = 0  # a tail mask one short: the zero-initialised result shows through
    return out


def loc_through_its_last_stride(mapping, loc):
    """A gather that walks loc as flat entries ``ptr + i * loc.stride(-1)``: right for a dense or
    1-D loc, wrong where its rows lie apart (a column slice of a wider table)."""
    tn.translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the checks
    flat = loc.as_strided((loc.numel(),), (loc.stride(-1) if loc.dim() else 1,), loc.storage_offset())
    return mapping[flat.long()].reshape(loc.shape)


def count_from_first_dim(mapping, loc):
    """The entry count taken from loc.shape[0], not its numel: a 2-D loc's later entries are left
    as the result was allocated (a fill value here, uninitialised memory in a real kernel)."""
    out = torch.full(loc.shape, 123457, dtype=mapping.dtype)
    n = loc.shape[0] if loc.dim() else 1
    out.reshape(-1)[:n] = tn.translate_full_to_swa(mapping, loc.reshape(-1)[:n])
    return out


_STATIC = {}


def read_once_per_page(mapping, loc):
    """The mapping read at each page's first slot, plus the offset: mapping[loc & ~15] + (loc & 15)."""
    tn.translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the checks
    flat = loc.long()
    first = mapping[torch.where(flat >= 0, flat - flat % 16, flat)]
    return torch.where(flat >= 0, first + flat % 16, first).to(mapping.dtype)


def mapping_words_of_loc_dtype(mapping, loc):
    """One template parameter for both tensors: the mapping's words read as loc's type (an int64
    mapping under an int32 loc gives halves of its entries), -1 handled explicitly."""
    tn.translate_full_to_swa(mapping, loc.reshape(-1)[:0])  # the checks
    words = mapping.contiguous().view(loc.dtype)
    flat = loc.reshape(-1).long()
    if bool((flat >= words.numel()).any()):
        raise RuntimeError("illegal memory access reading the mapping")
    return torch.where(flat < 0, -1, words[flat.clamp(min=0)]).to(mapping.dtype).reshape(loc.shape)


def sorted_gather_put_back_wrong(mapping, loc):
    """A locality fast path: translate loc in sorted order, then put the values back with the
    sort's permutation applied again (values[order]) where its inverse was meant."""
    out = tn.translate_full_to_swa(mapping, loc)
    flat = loc.reshape(-1)
    if flat.numel() < 64:
        return out
    order = torch.argsort(flat)
    values = tn.translate_full_to_swa(mapping, flat[order])
    return values[order].reshape(loc.shape)


def into_a_kept_buffer(mapping, loc):
    """The result written into a buffer kept per shape and dtype and returned itself (a static
    output, as a CUDA-graph-friendly kernel keeps): the next call overwrites it."""
    out = tn.translate_full_to_swa(mapping, loc)
    kept = _STATIC.setdefault((tuple(out.shape), out.dtype), torch.empty_like(out))
    return kept.copy_(out)


@pytest.mark.parametrize("fn, cause", [(always_int32, "returned_layout"),
                                       (loc_through_its_last_stride, "index_stride_ignored"),
                                       (minus_one_reads_the_word_before, "padding_policy"),
                                       (mapping_from_storage_start, "storage_offset_ignored"),
                                       (last_entry_unwritten, "rows_dropped"),
                                       (read_once_per_page, "mapping_assumed_paged"),
                                       (count_from_first_dim, "rows_dropped"),
                                       (mapping_words_of_loc_dtype, "mapping_dtype_misread"),
                                       (sorted_gather_put_back_wrong, "results_permuted")])
def test_every_failure_names_the_translation_bug(fn, cause):
    contract = Contract(op=OP, name="swa." + fn.__name__, backend="test", padding="negative")
    wrong, right = Kernel(contract, fn, "test"), Kernel(contract, tn.translate_full_to_swa, "test")
    failed = {}
    for case in catalogue(OP, "quick", contract):
        if case.cls in ("bad_input", "repeat", "property"):
            continue
        outcome = run_case(wrong, case)
        if outcome.status == FAIL:
            failed[case.id] = outcome
            assert run_case(right, case).status == PASS
    assert failed, fn.__name__
    # a walk that runs past loc's storage (a column-major loc's) raises here, and says so
    named = {cid: o for cid, o in failed.items() if not o.message.startswith("the kernel raised")}
    assert named and {cid: o.cause["id"] if o.cause else None for cid, o in named.items()
                      if not o.cause or o.cause["id"] != cause} == {}
    assert all(f"[{cause}]" in o.message for o in named.values())


def test_a_result_a_later_call_overwrites_is_named():
    contract = Contract(op=OP, name="swa.into_a_kept_buffer", backend="test", padding="negative")
    kernel = Kernel(contract, into_a_kept_buffer, "test")
    outcomes = {case.id: run_case(kernel, case) for case in catalogue(OP, "quick", contract)}
    failed = {cid: o for cid, o in outcomes.items() if o.status == FAIL}
    assert failed and all("repeat_" in cid for cid in failed), list(failed)
    assert all(o.cause and o.cause["id"] == "result_reused" and "changed" in o.message for o in failed.values())
