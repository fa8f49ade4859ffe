"""Run one case through one kernel and judge it against the reference under the kernel's contract."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .buffers import Arena, same_bytes
from .compare import expected_regions, first_difference, mixed_slots
from .contract import gaps
from .diagnose.engine import earlier_state, explain, explain_raise, explain_rejection, explain_returned, named
from .diagnose.replay import within_approx_division
from .diagnose.hypothesis import Hypothesis
from .ops import get_spec
from .ops._repeat import calls_before, first_call_inputs, redraw_in_place
from .ops._modes import as_called, call_context, fresh_compile
from .ops.base import Case, Prepared, is_bad
from .registry import Kernel

PASS, FAIL, NOT_SUPPORTED, UNAVAILABLE, UNDECLARED = (
    "pass", "fail", "not supported", "unavailable", "works, not declared")


@dataclass
class Outcome:
    status: str
    message: str = ""
    first: dict = field(default_factory=dict)  # the first difference, machine-readable
    seconds: float = 0.0
    warning: str = ""  # passed with a tolerance
    prepared: Prepared | None = None  # kept on failure, for the dump bundle
    expected: dict | None = None
    cause: dict | None = None  # the diagnosed cause of a failure (oracle.diagnose.Diagnosis.cause)
    pattern: list = field(default_factory=list)  # the difference's pattern, on failure
    returned: object = None  # what a passing call of an op that returns a tensor returned


def run_case(kernel: Kernel, case: Case) -> Outcome:
    reason = kernel.unavailable()
    if reason:
        return Outcome(UNAVAILABLE, reason)
    spec = get_spec(case.op)
    contract = kernel.contract
    out_of_contract = gaps(contract, spec.needs(case))
    if any(not g.probe for g in out_of_contract):
        return Outcome(NOT_SUPPORTED, "; ".join(g.text for g in out_of_contract))
    before = calls_before(case)
    if before is not None and not out_of_contract:  # the other variant must be declared too
        other = gaps(contract, spec.needs(before[1]))
        if other:
            return Outcome(NOT_SUPPORTED, "the call before it: " + "; ".join(g.text for g in other))
    start = time.perf_counter()
    text = "; ".join(g.text for g in out_of_contract)
    try:
        outcome = _execute(kernel, spec, case)
    except (TypeError, ValueError) as exc:
        if not out_of_contract:
            raise
        # the contract's own knobs cannot describe the case (an OCP-only fp8 preset and a fnuz
        # format): there is no expectation to probe against
        return Outcome(NOT_SUPPORTED, f"{text} (not probed: {exc})")
    outcome.seconds = time.perf_counter() - start
    if out_of_contract:  # a harmless probe of an undeclared capability
        if outcome.status == PASS:
            return Outcome(UNDECLARED, text, seconds=outcome.seconds)
        return Outcome(NOT_SUPPORTED, f"{text} (probed: it does not work either)", seconds=outcome.seconds)
    return outcome


BALLAST_LIMIT = 1 << 28  # bytes of a case's allocations past which no rerun elsewhere is tried


def _rerun(kernel: Kernel, spec, case: Case, change, *, like: Arena | None = None) -> bool:
    """Whether ``case`` (changed by ``change``) passes when built and run again; with ``like``,
    built at other addresses: two ballast allocations of each of ``like``'s regions are held
    while it is built, so the allocator cannot hand it the blocks earlier cases of its sizes
    freed. A kernel that keeps state keyed on tensor addresses then misses its memo."""
    ballast = [_allocation(r.tensor) for r in (like.regions.values() if like is not None else ()) for _ in range(2)]
    try:
        return _execute(kernel, spec, case, edit=change).status == PASS
    finally:
        del ballast


def _execute(kernel: Kernel, spec, case: Case, edit=None) -> Outcome:
    """Build, call, judge, all in the case's torch mode (oracle.ops._modes.call_context)."""
    with call_context(case):
        return _execute_in_mode(kernel, spec, case, edit)


def _execute_in_mode(kernel: Kernel, spec, case: Case, edit=None) -> Outcome:
    """Build, call, judge. ``edit(prepared)`` changes the fresh inputs before the judged call (a
    probe's changed input); an edited run is judged without a diagnosis. A ``repeat`` case calls
    the kernel twice on the same tensors (oracle.ops._repeat): the first call is judged as any
    case is, then every input is redrawn in place and the second call is judged. An ``after``
    case first runs its ordinary case and its other variant (calls_before), each judged on
    tensors of its own (diagnosed only where this run is), and stops at the first that fails."""
    contract = kernel.contract
    before = calls_before(case)
    if before is not None:  # an "after" case: its own variant, then the other, on tensors of their own
        for position, earlier in enumerate(before):
            first = _execute(kernel, spec, earlier, edit=(lambda prepared: None) if edit is not None else None)
            if first.status != PASS:
                return _earlier_call_failed(first, position, earlier, before)
    fresh_compile(case)
    arena = Arena(contract.device, case.seed)
    prepared = spec.build(case, arena, np.random.default_rng(case.seed), contract)
    kept = None
    if case.p.get("repeat"):
        first_call_inputs(case, prepared)
        first = _judged_call(kernel, spec, case, prepared, diagnose=edit is None, bad=False)
        if first.status != PASS:
            first.message = ("the first of the case's two calls failed, before its inputs were redrawn "
                             "(an ordinary case's inputs: see its other classes)\n" + first.message)
            return first
        kept = _kept_result(first.returned, prepared.arena)
        redraw_in_place(spec, case, prepared, contract)
    if edit is not None:
        edit(prepared)
    second = _judged_call(kernel, spec, case, prepared, diagnose=edit is None, bad=is_bad(case))
    second.returned = None  # judged: nothing holds on to the kernel's tensor
    if kept is not None and second.status == PASS and not is_bad(case):
        return _first_result_kept(kept) or second
    return second


def _earlier_call_failed(failed: Outcome, position: int, earlier: Case, before: tuple) -> Outcome:
    """The outcome of an ``after`` case whose first or second call failed: the ordinary case's
    own failure (first call), or the other variant's failure right after the case's own variant
    passed (second call), then named ``earlier_call_state`` where it wrote the first call's
    format (see explain)."""
    if position == 0:
        failed.message = ("the first of the case's three calls, its ordinary case "
                          f"({earlier.id}), failed\n" + failed.message)
        return failed
    failed.message = (f"the second of the case's three calls ({earlier.id}) failed, right after a call of "
                      f"{before[0].id} that passed\n" + failed.message)
    return earlier_state(failed, before[0], earlier, second=True)


def _kept_result(returned, arena: Arena):
    """(the tensor a first call returned, a copy of its bytes then), where it is a tensor of its
    own (not a view of the case's inputs, whose redraw is meant to change it); else None."""
    if not isinstance(returned, torch.Tensor) or returned.numel() == 0:
        return None
    storage = returned.untyped_storage().data_ptr()
    if any(region.tensor.untyped_storage().data_ptr() == storage for region in arena.regions.values()):
        return None
    return returned, returned.detach().clone()


def _first_result_kept(kept) -> Outcome | None:
    """A failure where the first call's result changed during the second call (its bytes, NaN
    bits included); else None."""
    result, copy = kept
    same = torch.equal(result.reshape(-1).contiguous().view(torch.uint8), copy.reshape(-1).contiguous().view(torch.uint8))
    if same:
        return None
    changed = int((result.reshape(-1) != copy.reshape(-1)).sum())
    return named(Outcome(FAIL, f"the first call's result changed when the kernel was called again: {changed} of "
                               f"its {copy.numel()} elements now differ from what it returned (first "
                               f"{copy.reshape(-1)[:4].tolist()}, now {result.reshape(-1)[:4].tolist()})"),
                 Hypothesis("result_reused", "the tensor a call returns is a buffer the kernel keeps and writes "
                            "again on its next call (a static output buffer), so an earlier result changes"))


def _judged_call(kernel: Kernel, spec, case: Case, prepared: Prepared, *, diagnose: bool, bad: bool) -> Outcome:
    """Snapshot the memory, call the kernel once on ``prepared`` and judge the call (a rejection
    where ``bad``), naming its cause where ``diagnose``."""
    contract = kernel.contract
    arena = prepared.arena
    prepared.before = arena.snapshot()
    _drain_deferred(contract)
    rerun = lambda other, change, elsewhere=False: (  # noqa: E731
        _rerun(kernel, spec, other, change, like=arena if elsewhere else None)
        if not elsewhere or _ballast_fits(arena) else False)
    if bad:
        rejected = _judge_rejection(kernel, case, prepared)
        return explain_rejection(rejected, case, rerun=rerun) if diagnose and rejected.status == FAIL else rejected
    inside = lambda other: not gaps(contract, spec.needs(other))  # noqa: E731
    try:
        returned = _call(kernel, case, prepared.args)
    except Exception as exc:
        failed = Outcome(FAIL, f"the kernel raised {type(exc).__name__}: {exc}", prepared=prepared)
        if not diagnose:
            return failed
        return explain_raise(failed, case, contract, rerun=rerun, inside=inside)
    after = arena.snapshot()
    expected = spec.expected(prepared, case, contract)
    if spec.returns:
        expected, returned_problem, matched = spec.check_returned(prepared, expected, returned)
        if returned_problem:
            failed = Outcome(FAIL, returned_problem, prepared=prepared, expected=expected)
            if matched is not None:
                failed = named(failed, matched)
            elif diagnose:
                failed = explain_returned(failed, case, rerun=rerun)
            return failed
    regions, problems = expected_regions(arena, prepared.before, after, expected)
    problems += mixed_slots(arena, after, expected, spec.slot_groups)
    difference = first_difference(arena, regions, after)
    if difference is None and not problems:
        return Outcome(PASS, returned=returned if spec.returns else None)
    if difference is not None and contract.tolerance and not problems:
        tolerated = _within_tolerance(arena, expected, after, contract.tolerance)
        if tolerated is not None:
            return Outcome(PASS, warning=f"{tolerated} fp8 code(s) off by at most "
                                         f"{contract.tolerance.codes} (budget {contract.tolerance.budget})")
    if difference is not None and contract.fp8_division == "approx" and spec.fp8 and not problems:
        neighbours = within_approx_division(spec, case, contract, prepared, regions, after)
        if neighbours is not None:
            return Outcome(PASS, warning=f"{neighbours} fp8 code(s) are the neighbouring code of a "
                                         "quotient within 2 ulps (fp8_division='approx')")
    lines = list(problems)
    if difference is not None:
        lines.append(difference.text)
    failed = Outcome(FAIL, "\n".join(lines), first=difference.first if difference else {"duplicates": problems},
                     prepared=prepared, expected=expected)
    if not diagnose:
        return failed
    return explain(failed, spec, case, contract, after, regions, difference, problems,
                   rerun=rerun, inside=inside)


def _allocation(like: torch.Tensor):
    """A fresh block of ``like``'s bytes from the allocator ``like``'s came from (a CPU region's
    bytes are numpy's, which caches small blocks of its own)."""
    if like.device.type == "cpu":
        return np.empty(like.numel() * like.element_size(), np.uint8)
    return torch.empty(like.numel() * like.element_size(), dtype=torch.uint8, device=like.device)


def _ballast_fits(arena: Arena) -> bool:
    return sum(r.tensor.numel() for r in arena.regions.values()) <= BALLAST_LIMIT


def _call(kernel: Kernel, case: Case, args: tuple):
    """Call the kernel as the case calls it (oracle.ops._modes.as_called) and wait for the device;
    for a kernel whose errors are deferred, then raise what it left pending (so a rejection, or a
    false alarm, surfaces here)."""
    returned = as_called(case, kernel.fn)(*args)
    _synchronize(kernel.contract.device)
    if kernel.contract.errors == "deferred":
        kernel.contract.raise_deferred()
    return returned


def _drain_deferred(contract) -> None:
    """Before a case of a kernel with deferred errors: drop an error an earlier case left pending
    (that case was already judged; its error must not be blamed on this one)."""
    if contract.errors != "deferred":
        return
    try:
        _synchronize(contract.device)
        contract.raise_deferred()
    except Exception:
        pass


def _judge_rejection(kernel: Kernel, case: Case, prepared: Prepared) -> Outcome:
    deferred = " (deferred to the synchronization)" if kernel.contract.errors == "deferred" else ""
    what = get_spec(case.op).bad_input_text(case)
    if case.p.get("repeat") == "bad":
        what += (" written in place into the index of a call the kernel had accepted: a check "
                 "kept from the first call, or skipped on the second")
    try:
        _call(kernel, case, prepared.args)
    except Exception as exc:
        after = prepared.arena.snapshot()
        changed = [name for name in after if not same_bytes(after[name], prepared.before[name])]
        if changed:
            return named(Outcome(FAIL, f"rejected bad input ({what}) with {type(exc).__name__}: "
                                        f"{exc}, but memory changed first in: {', '.join(changed)}",
                                  prepared=prepared),
                          Hypothesis("validation_missing", f"memory changed ({', '.join(changed)}) "
                                     "before the bad input was rejected"))
        return Outcome(PASS, f"rejected{deferred} with {type(exc).__name__}: {exc}")
    return named(Outcome(FAIL, f"accepted bad input ({what}) without an error{deferred}; the "
                                "contract declares validates=True", prepared=prepared),
                  Hypothesis("validation_missing", f"bad input ({what}) accepted without an error"))


def _within_tolerance(arena, expected: dict, after: dict, tolerance) -> int | None:
    off = 0
    for name, want in expected.items():
        got = arena.numpy_view(after, name)
        if got.dtype != np.uint8:
            return None
        delta = np.abs(got.astype(np.int16) - np.asarray(want).astype(np.int16))
        if delta.max(initial=0) > tolerance.codes:
            return None
        off += int(np.count_nonzero(delta))
    return off if off <= tolerance.budget else None


def _synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()
