"""Diagnosis after a failure: the hypotheses of the op spec and the generic ones, each replayed
through the reference; the ones that hold name the cause. Where none holds, the pattern of the
difference is described instead. Runs only after a failure, never on a passing case."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from ..buffers import contiguous_strides, same_bytes
from ..ops._repeat import calls_before
from ..ops.base import shape_text
from ..reference.slots import Padding
from . import accumulated, byte_order, generic, patterns, provenance, row_bounds, skipped_writes, stray_writes
from .hypothesis import CAUSES, Hypothesis, by_role
from .probes import outside_mode, probes, variants
from .replay import changed_bytes, holds, within_approx_division


@dataclass
class Diagnosis:
    """``matched``: the hypotheses the kernel's memory is the exact result of, most specific
    first; ``pattern``: lines describing the difference (always computed)."""

    matched: list = field(default_factory=list)
    pattern: list = field(default_factory=list)
    found: list = field(default_factory=list)  # where the reference's rows went (provenance.of_case)

    def lines(self) -> list[str]:
        """The message lines: up to three causes that hold, else the pattern."""
        if not self.matched:
            return ["no known cause matches; the difference:"] + [f"  {line}" for line in self.pattern]
        out = [f"cause: {h.text} [{h.cause}]: the result matches the reference replayed under "
               "this hypothesis, byte for byte" for h in self.matched[:3]]
        if len(self.matched) > 3:
            out.append(f"({len(self.matched) - 3} more hypotheses match too)")
        return out


def candidates(spec, case, contract, prepared, after: dict) -> list[Hypothesis]:
    """The op's own hypotheses first (they know its layout), then the generic ones, then those
    built from the kernel's own result."""
    return (list(spec.alternatives(case, contract)) + list(spec.layout_alternatives(case, contract, prepared))
            + generic.hypotheses(spec, case, contract, prepared)
            + list(spec.observed_alternatives(case, contract, prepared, after))
            + row_bounds.prefix_hypotheses(prepared.arena, prepared.caches, prepared.before, after)
            + row_bounds.head_prefix_hypotheses(prepared.arena, prepared.caches, prepared.before, after))


def diagnose(spec, case, contract, prepared, after: dict, expected_regions: dict) -> Diagnosis:
    """Which hypotheses hold for a failing case (``expected_regions``: the reference's whole
    memory under the contract, as compared)."""
    changed = changed_bytes(prepared.before, after)
    matched = [h for h in candidates(spec, case, contract, prepared, after)
               if holds(h, spec, case, contract, prepared, after, changed)]
    pattern = patterns.describe(prepared.arena, prepared.before, expected_regions, after, prepared.caches)
    found = provenance.of_case(prepared.arena, prepared.before, expected_regions, after, prepared.caches)
    pattern += [line for moves, entries in found for line in provenance.describe(moves, entries)]
    return Diagnosis(matched, pattern, found)


def cause_record(hypothesis: Hypothesis, also=()) -> dict:
    """The report's machine-readable cause of a hypothesis that holds."""
    return {"id": hypothesis.cause, "text": hypothesis.text, "class": CAUSES[hypothesis.cause],
            "also": [{"id": h.cause, "text": h.text} for h in also]}


def named(failed, hypothesis: Hypothesis):
    """``failed`` (a runner Outcome) with ``hypothesis`` as its cause."""
    failed.message += f"\ncause: {hypothesis.text} [{hypothesis.cause}]"
    failed.cause = cause_record(hypothesis)
    return failed


def explain(failed, spec, case, contract, after: dict, regions: dict, difference, problems: list, *,
            rerun, inside):
    """Name the cause of a failed comparison, in order: what the comparison itself observed (a
    torn row, a modified input), whether the same case passes when run again (then it depends on
    earlier calls), the hypotheses replayed through the reference, nothing written, then the
    probes (``rerun(case, edit)`` runs the kernel again and says whether it passed;
    ``inside(case)`` whether a case lies inside the contract). Else the difference's pattern."""
    prepared = failed.prepared
    if any("torn row" in p for p in problems):
        return named(failed, Hypothesis("torn_rows", "a duplicated slot holds a row torn from "
                                        "several of its colliding sources"))
    if difference is None:
        return failed
    view = difference.first.get("view")
    if view and prepared.arena.views[view].role != "cache":
        return named(failed, Hypothesis("input_modified", f"an input ({view}) was modified"))
    repeat = bool(case.p.get("repeat"))
    # before any hypothesis, which might match a stateful kernel's result by chance (a repeat
    # case's second call is what its stale-state hypotheses are for: there it comes before probes)
    again = (None if repeat else _passes_again(failed, case, rerun)) or _passes_elsewhere(failed, case, rerun)
    if again is not None:
        return again
    diagnosis = diagnose(spec, case, contract, prepared, after, regions)
    failed.pattern = diagnosis.pattern
    if diagnosis.matched:
        failed.message += "\n" + "\n".join(diagnosis.lines())
        failed.cause = cause_record(diagnosis.matched[0], diagnosis.matched[1:])
    before = calls_before(case)
    if before is not None:  # its own variant passed as its first call: the call between is the cause
        return earlier_state(failed, before[1], case, second=False)
    if diagnosis.matched:
        return failed
    # scales of 1 or powers of two divide exactly, approximately or not: nothing to name there
    if spec.fp8 and contract.fp8_division == "ieee" and not _exact_scales(prepared) and within_approx_division(
            spec, case, contract, prepared, regions, after) is not None:
        return named(failed, Hypothesis("approximate_division", "every differing code is the "
                                        "neighbouring code of a quotient within 2 ulps: an approximate "
                                        "division, as Triton's default float32 x / scale (declare "
                                        "fp8_division='approx' if the kernel uses it)"))
    if all(same_bytes(after[r], prepared.before[r]) for r in after):  # after the hypotheses: a
        # kernel that skips slot 0 writes nothing when slot 0 is all there is
        return named(failed, _write_dropped_by_compile(case, rerun) or _nothing_written(prepared))
    return ((_passes_again(failed, case, rerun) if repeat else None)
            or _probe(failed, case, contract, rerun, inside, after) or _misplaced(failed, diagnosis, after, regions)
            or _read_off(failed, spec, case, contract, diagnosis, after, regions)
            or _from_memory(failed, case, diagnosis, after, regions) or _with_pattern(failed, diagnosis))


def _exact_scales(prepared) -> bool:
    """Whether every scale input holds only powers of two (1 included), whose division is exact."""
    scales = [prepared.numpy(v.name) for v in by_role(prepared.arena.views, "scale")]
    return bool(scales) and all(np.all(np.frexp(np.asarray(a, np.float64))[0] == 0.5) for a in scales)


def earlier_state(failed, previous, case, *, second: bool):
    """A failed call of an ``after`` case (oracle.ops._repeat.calls_before) that came right after a
    passing call of ``previous``, another variant: named ``earlier_call_state`` where it wrote
    ``previous``'s fp8 format (its diagnosis matched that wrong format), where it is the case's
    third call (its own variant passed as the first: ``second`` False), or where, as the second
    call, no hypothesis named it. A second call whose diagnosis named another cause keeps it:
    that variant may be wrong on its own (its ordinary case says)."""
    key = next(k for k in previous.p.keys() | case.p.keys()
               if k != "after" and previous.p.get(k) != case.p.get(k))  # what calls_before changed
    was, now = ((shape_text(v) if isinstance(v, tuple) else v) for v in (previous.p.get(key), case.p.get(key)))
    what = {"fp8": "fp8 format", "block": "block format", "dtype": "source dtype", "src": "source layout (its strides)",
            "layout": "cache layout", "shape": "row shape", "index": "index dtype",
            "scale": "scale's kind (per tensor or per head)"}.get(key, key)
    cause = failed.cause or {}
    wrote_previous = cause.get("id") == "wrong_fp8_format" and str(cause.get("text", "")).startswith(f"{was} codes")
    if second and not wrote_previous and failed.cause is not None:
        return failed
    # a hypothesis the replay matched stays in the message, as what was written; the cause recorded
    # is the call before
    how = (f"it wrote {was} codes where {now} is asked, the {what} of the call just before it"
           if wrote_previous else
           f"{now} fails right after a call in {was} that passed (its ordinary case, run alone, tells "
           f"whether {now} fails without it)" if second else
           f"{now} passed as the case's first call and fails after a call in {was}")
    return named(failed, Hypothesis("earlier_call_state", f"{how}: the kernel keeps something made for an "
                                    f"earlier call (a lookup table, a compiled variant, a launch plan) keyed "
                                    f"without the {what}"))


def explain_rejection(failed, case, *, rerun):
    """A bad input not rejected as it must be: whether the same case, built at other addresses,
    is rejected (then a check or a memo kept from an earlier call at these addresses let it
    through), or outside inference mode (then what let it through is kept under a version counter
    that inference tensors lack)."""
    return _passes_elsewhere(failed, case, rerun) or _passes_outside_mode(failed, case, rerun) or failed


def _passes_outside_mode(failed, case, rerun):
    """``failed`` named by the torch_mode variant (oracle.diagnose.probes.VARIANTS) where the same
    case run outside its torch mode passes; else None."""
    eager = outside_mode(case)
    if eager is None or not rerun(eager, _unchanged):
        return None
    return named(failed, next(h for h, variant in variants(case) if variant == eager))


def explain_returned(failed, case, *, rerun):
    """A wrong returned tensor that no misread explains (spec.check_returned): whether the case
    passes when run again (then it depends on earlier calls)."""
    return (None if case.p.get("repeat") else _passes_again(failed, case, rerun)) or failed


def explain_raise(failed, case, contract, *, rerun, inside):
    """Name the cause of a kernel that raised: only probes can (nothing was compared), and they are
    judged by the case run again, so first whether the unchanged case passes on its own."""
    return (_passes_again(failed, case, rerun) or _raised_on_nothing_to_write(failed, contract)
            or _probe(failed, case, contract, rerun, inside) or failed)


def _raised_on_nothing_to_write(failed, contract):
    """``failed`` named empty_call_raised where the call had no entry to write: its index empty,
    or every entry padding under the contract (which no probe can remove); else None."""
    arena = failed.prepared.arena if failed.prepared is not None else None
    indexes = by_role(arena.views, "index") if arena is not None else []
    if not indexes or failed.prepared.before is None:
        return None
    entries = arena.numpy_view(failed.prepared.before, indexes[0].name).reshape(-1)
    if entries.size and not Padding.parse(contract.padding).skipped(entries.astype(np.int64), 1 << 62).all():
        return None
    what = "an empty call (N = 0)" if not entries.size else f"a call whose {entries.size} entries are all padding"
    return named(failed, Hypothesis("empty_call_raised", f"the kernel raised on {what}, which writes nothing and "
                                    "must succeed: a reduction over the index or the rows (max(), min(), an "
                                    "argsort's first element, a reshape inferring a dimension) with no guard "
                                    "for an empty selection"))


def _passes_again(failed, case, rerun):
    """``failed`` named not_reproducible where the same case, built and run once more, passes (the
    failure depends on what ran before it, or on timing; no probe could tell anything); else None."""
    return _not_reproducible(failed) if rerun(case, _unchanged) else None


def _passes_elsewhere(failed, case, rerun):
    """``failed`` named stale_state where the same case, built at other addresses, passes: the
    kernel keeps state keyed on tensor addresses (a memo of a mapping, a scale or a check) from
    an earlier call on other data; else None."""
    if not rerun(case, _unchanged, elsewhere=True):
        return None
    if failed.cause is not None:  # what the judgement named (validation_missing) is not the cause
        failed.message, failed.cause = failed.message[:failed.message.rfind("\ncause: ")], None
    return named(failed, Hypothesis("stale_state", "the same case, built again at other addresses, passed: "
                                    "the kernel reuses what it kept from an earlier call on tensors at these "
                                    "addresses (a memo of a mapping, a scale or a check keyed on data_ptr)"))


def _probe(failed, case, contract, rerun, inside, after=None):
    for hypothesis, change in probes(case, contract, failed.prepared):
        if rerun(case, change):
            return named(failed, hypothesis)
    for hypothesis, variant in variants(case):
        if inside(variant) and rerun(variant, _unchanged):
            if hypothesis.cause == "cache_layout_ignored" and after is not None:
                hypothesis = _with_unwritten_caches(hypothesis, failed.prepared, after)
            return named(failed, hypothesis)
    return None


def _with_unwritten_caches(hypothesis, prepared, after: dict):
    """``hypothesis`` (a cache layout the kernel mishandles) with the caches it left exactly as
    they were, where some: their writes went into a copy (``reshape`` or ``contiguous()`` of a view
    that is not contiguous returns one) or somewhere else entirely."""
    arena = prepared.arena
    def view_bytes(snapshot, name):  # bits, not values: NaN poison compares unequal as floats
        return np.ascontiguousarray(arena.numpy_view(snapshot, name)).view(np.uint8)

    untouched = [name for name in prepared.caches
                 if np.array_equal(view_bytes(after, name), view_bytes(prepared.before, name))]
    if not untouched:
        return hypothesis
    return Hypothesis(hypothesis.cause, f"{hypothesis.text}; {' and '.join(untouched)} left exactly as "
                      f"{'they were' if len(untouched) > 1 else 'it was'}: {COPY_WRITES}")


# where the writes of a call that changes nothing of a cache view went, most often
COPY_WRITES = ("the writes went into a copy (reshape or contiguous() of a view that is not contiguous "
               "returns one) or elsewhere")


def _nothing_written(prepared) -> Hypothesis:
    """nothing_written, with the likely reason where a cache view is not contiguous."""
    views = prepared.arena.views
    strided = [name for name in prepared.caches if not _contiguous(views[name])]
    if not strided:
        return Hypothesis("nothing_written", "nothing was written")
    return Hypothesis("nothing_written", f"nothing was written; {' and '.join(strided)} "
                      f"{'are views that are' if len(strided) > 1 else 'is a view that is'} not contiguous, and a write "
                      "through reshape() or contiguous() of such a view lands in a copy")


def _write_dropped_by_compile(case, rerun) -> Hypothesis | None:
    """mutation_undeclared where a call through torch.compile wrote nothing and the same case called
    eagerly passes; else None."""
    if case.p.get("torch_mode") != "compile" or not rerun(outside_mode(case), _unchanged):
        return None
    return Hypothesis("mutation_undeclared", "called through torch.compile the kernel wrote nothing, and "
                      "called eagerly it passes: its op does not declare the caches it writes (torch.library "
                      "mutates_args, a Tensor(a!) schema), so functionalization takes it for a pure function "
                      "whose result nothing uses and drops the call")


def _contiguous(view) -> bool:
    return all(size <= 1 or s == e for size, s, e in zip(view.shape, view.strides, contiguous_strides(view.shape)))


def _not_reproducible(failed):
    return named(failed, Hypothesis("not_reproducible", "the same case, built and run again in this process, "
                                    "passed: the result depends on earlier calls (state kept between calls, "
                                    "as a memo keyed on a tensor's address) or on timing; the repeat cases "
                                    "call a kernel twice on the same tensors"))


def _unchanged(prepared) -> None:
    """The edit of a probe that runs another case as it is built."""


def _misplaced(failed, diagnosis: Diagnosis, after: dict, regions: dict):
    """``failed`` named rows_misrouted where every difference is rows of the reference's at other
    slots, part_misplaced where it is elements of the reference's moved along their own rows
    (found from the memory, after every hypothesis and probe); else None."""
    cause = provenance.misplaced(failed.prepared.arena, regions, after, diagnosis.found)
    return None if cause is None else _read_off_named(failed, diagnosis, Hypothesis(*cause))


def _read_off(failed, spec, case, contract, diagnosis: Diagnosis, after: dict, regions: dict):
    """``failed`` named by what its op reads off the difference (spec.difference_cause); else None."""
    cause = spec.difference_cause(case, contract, failed.prepared, after, regions)
    return None if cause is None else _read_off_named(failed, diagnosis, Hypothesis(*cause))


def _from_memory(failed, case, diagnosis: Diagnosis, after: dict, regions: dict):
    """``failed`` named by the first cause read off the memory itself (after every hypothesis and
    probe; each module says what its shape of difference is): bytes written outside the call's own
    (stray_writes), elements left as they were where they compared equal (equal_values_skipped),
    words in the other byte order (byte_order_reversed), old + new (accumulated_into_cache); else
    None."""
    skipped = functools.partial(skipped_writes.equal_values_skipped, fp8_codes=case.p.get("fp8") is not None,
                                rewrite=case.p.get("repeat") == "rewrite")
    for cause, read in (("stray_writes", stray_writes.stray_writes), ("equal_values_skipped", skipped),
                        ("byte_order_reversed", byte_order.byte_order_reversed),
                        ("accumulated_into_cache", accumulated.accumulated)):
        text = read(failed.prepared.arena, failed.prepared.before, regions, after)
        if text is not None:
            return _read_off_named(failed, diagnosis, Hypothesis(cause, text))
    return None


def _read_off_named(failed, diagnosis: Diagnosis, hypothesis: Hypothesis):
    """``failed`` named by a cause read off the memory, the difference's pattern shown with it
    (no replay stands behind such a cause)."""
    failed.message += "\nthe difference:\n" + "\n".join(f"  {line}" for line in diagnosis.pattern)
    return named(failed, hypothesis)


def _with_pattern(failed, diagnosis: Diagnosis):
    failed.message += "\n" + "\n".join(diagnosis.lines())
    return failed
