"""The self-check: run the case catalogue against every mutant and every kernel a mutant mutates.

A mutant is killed by a case class when some case of that class fails it. It is caught as
expected when every class it declares (``Mutant.catches``) kills it; other killing classes are
reported too. The bases must pass every case they run, or the kills prove nothing.

Speed: each mutant runs its expected classes first, then the rest, and skips (1) the remaining
cases of a class once one of them has killed it (the class is known to kill), and (2) the cases
of the expensive classes (:data:`EXPENSIVE`: ``large``, gigabytes per case) once it is killed,
unless it expects them. Neither hides which class kills it: every expected class runs to its
first kill, and every other class runs at least one case unless expensive. A base skips the
expensive classes none of its selected mutants expects. Skips are listed in the results;
``complete=True`` runs everything.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..cases import CASE_CLASSES, catalogue
from ..kernels import torch_native
from ..runner import FAIL, NOT_SUPPORTED, PASS, UNAVAILABLE, UNDECLARED, run_case

EXPENSIVE = ("large",)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text and text.strip() else ""


@dataclass
class MutantResult:
    name: str
    op: str
    base: str
    bug: str
    catches: tuple  # the classes expected to kill it
    cause: str = ""  # the cause its failures must name
    killed_by: dict = field(default_factory=dict)  # case class -> ids of the cases that failed it
    # (the first only, unless complete=True: a class's other cases are skipped once it kills)
    why: dict = field(default_factory=dict)  # case class -> first line of its first failure
    named: dict = field(default_factory=dict)  # case class -> the cause its first failure named
    ran: int = 0
    not_supported: int = 0
    unavailable: str = ""  # why the kernel could not run here, if it could not
    errors: list = field(default_factory=list)  # (case id, error) where the engine itself raised
    skipped: list = field(default_factory=list)  # ids of the cases not run (see EXPENSIVE)
    seconds: float = 0.0

    @property
    def killed(self) -> bool:
        return bool(self.killed_by)

    @property
    def by_expected(self) -> tuple:
        """The expected classes that killed it."""
        return tuple(c for c in self.catches if c in self.killed_by)

    @property
    def by_others(self) -> tuple:
        """The classes that killed it though not expected to."""
        return tuple(c for c in CASE_CLASSES if c in self.killed_by and c not in self.catches)

    @property
    def missed(self) -> tuple:
        """The expected classes that did not kill it (they should have)."""
        return tuple(c for c in self.catches if c not in self.killed_by)

    @property
    def as_expected(self) -> bool:
        return not self.missed

    @property
    def diagnosed(self) -> bool:
        """Every expected class that killed it named its own cause in its first failure."""
        return bool(self.by_expected) and all(self.named.get(c) == self.cause for c in self.by_expected)


@dataclass
class BaseResult:
    """A correct kernel that some mutant mutates: it must pass every case it runs."""

    name: str
    op: str
    passed: int = 0
    not_supported: int = 0
    failed: list = field(default_factory=list)  # (case id, status, first line of the message)
    skipped: list = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass
class SelfCheckResult:
    profile: str
    mutants: list
    bases: list
    seconds: float = 0.0

    @property
    def killed(self) -> list:
        return [m for m in self.mutants if m.killed]

    @property
    def survivors(self) -> list:
        return [m for m in self.mutants if not m.killed]

    @property
    def kill_rate(self) -> float:
        return len(self.killed) / len(self.mutants) if self.mutants else 1.0

    @property
    def as_expected(self) -> list:
        return [m for m in self.mutants if m.as_expected]

    @property
    def diagnosis_rate(self) -> float:
        """The share of mutants whose failures name their own bug."""
        return sum(m.diagnosed for m in self.mutants) / len(self.mutants) if self.mutants else 1.0

    @property
    def ok(self) -> bool:
        """Every mutant killed by every class expected to kill it and diagnosed, and every base
        clean."""
        return (all(m.as_expected and m.diagnosed for m in self.mutants)
                and all(b.ok for b in self.bases))


def _order(cases: list, first: tuple) -> list:
    """The cases of the classes in ``first`` first, each group in catalogue order."""
    return [c for c in cases if c.cls in first] + [c for c in cases if c.cls not in first]


def _run_mutant(kernel, mutant, cases: list, complete: bool) -> MutantResult:
    result = MutantResult(mutant.name, mutant.op, mutant.base, mutant.bug, tuple(mutant.catches),
                          mutant.cause)
    start = time.perf_counter()
    reason = kernel.unavailable()
    if reason:
        result.unavailable = reason
        return result
    for case in _order(cases, result.catches):
        if not complete and (case.cls in result.killed_by or (
                case.cls in EXPENSIVE and case.cls not in result.catches and result.killed)):
            result.skipped.append(case.id)
            continue
        try:
            outcome = run_case(kernel, case)
        except Exception as exc:  # the engine itself failed: not a kill, reported
            result.errors.append((case.id, f"{type(exc).__name__}: {exc}"))
            continue
        if outcome.status == NOT_SUPPORTED:
            result.not_supported += 1
            continue
        result.ran += 1
        if outcome.status == FAIL:
            result.killed_by.setdefault(case.cls, []).append(case.id)
            result.why.setdefault(case.cls, f"{case.id}: {_first_line(outcome.message)}")
            result.named.setdefault(case.cls, (outcome.cause or {}).get("id"))
    result.seconds = time.perf_counter() - start
    return result


def _run_base(kernel, cases: list, wanted_expensive: set, complete: bool) -> BaseResult:
    result = BaseResult(kernel.name, kernel.contract.op)
    start = time.perf_counter()
    reason = kernel.unavailable()
    if reason:
        result.failed.append(("*", UNAVAILABLE, reason))
        return result
    for case in cases:
        if not complete and case.cls in EXPENSIVE and case.cls not in wanted_expensive:
            result.skipped.append(case.id)
            continue
        try:
            outcome = run_case(kernel, case)
        except Exception as exc:
            result.failed.append((case.id, "error", f"{type(exc).__name__}: {exc}"))
            continue
        if outcome.status in (PASS, UNDECLARED):
            result.passed += 1
        elif outcome.status == NOT_SUPPORTED:
            result.not_supported += 1
        else:
            result.failed.append((case.id, outcome.status, _first_line(outcome.message)))
    result.seconds = time.perf_counter() - start
    return result


def self_check(profile: str = "quick", mutants=None, progress: Callable | None = None, *,
               check_bases: bool = True, complete: bool = False) -> SelfCheckResult:
    """Run every catalogue case of each mutant's op (``oracle.cases.catalogue(op, profile)``)
    through :func:`oracle.runner.run_case`, in-process, and record which case classes killed it.

    ``mutants``: names (with or without the ``mutant.`` prefix) or :class:`Mutant` objects (the
    catalogue's, or new ones, registered here under their base's contract); None means all.
    ``check_bases``: also run the kernels they mutate, which must pass every case they run.
    ``progress``: called as ``progress(done, total, result)`` after each mutant and each base,
    ``result`` a :class:`MutantResult` or :class:`BaseResult` (both have ``name`` and
    ``seconds``). ``complete``: skip nothing (see the module docstring).
    """
    from ..registry import Registry
    from . import MUTANTS, mutant_contract, register

    start = time.perf_counter()
    chosen = _select(MUTANTS, mutants)
    registry = Registry()
    registry.load_plugin("oracle.mutants:register", register)
    torch_registry = Registry()  # the torch bases, from their own plug-in
    torch_registry.load_plugin("oracle.kernels.torch_native:register", torch_native.register)
    errors = registry.errors + torch_registry.errors
    if errors:
        raise RuntimeError(f"plug-in {errors[0].plugin} failed: {errors[0].error}")

    for mutant in chosen:  # Mutant objects of the caller's own, not in the catalogue
        known = registry.kernels.get(mutant.name)
        if known is None:
            registry.register(mutant.fn, contract=mutant_contract(mutant))
        elif known.fn is not mutant.fn:
            raise ValueError(f"mutant {mutant.name!r} clashes with the catalogue's mutant of that name")
    cases = {op: catalogue(op, profile) for op in dict.fromkeys(m.op for m in chosen)}
    bases = list(dict.fromkeys(m.base for m in chosen)) if check_bases else []
    total, done = len(chosen) + len(bases), 0
    results = []
    for mutant in chosen:
        results.append(_run_mutant(registry.kernels[mutant.name], mutant, cases[mutant.op], complete))
        done += 1
        if progress:
            progress(done, total, results[-1])
    base_results = []
    for name in bases:
        kernel = (torch_registry if name.startswith("torch.") else registry).kernels[name]
        wanted = {c for m in chosen if m.base == name for c in m.catches}
        base_results.append(_run_base(kernel, cases[kernel.contract.op], wanted, complete))
        done += 1
        if progress:
            progress(done, total, base_results[-1])
    return SelfCheckResult(profile, results, base_results, time.perf_counter() - start)


def _select(all_mutants, wanted) -> list:
    if wanted is None:
        return list(all_mutants)
    by_name = {m.name: m for m in all_mutants}
    out = []
    for item in wanted:
        if not isinstance(item, str):
            out.append(item)
            continue
        name = item if item in by_name else "mutant." + item
        if name not in by_name:
            raise ValueError(f"no mutant named {item!r}; known: {', '.join(m.short for m in all_mutants)}")
        out.append(by_name[name])
    return out


def format_table(result: SelfCheckResult) -> str:
    """The self-check as text: the kill rate, one row per mutant (the classes that killed it,
    expected ones first, and the bug), survivors and bases that failed spelled out."""
    mutants = result.mutants
    diagnosed = sum(m.diagnosed for m in mutants)
    lines = [f"mutant self-check, profile {result.profile}: {len(result.killed)}/{len(mutants)} "
             f"killed ({100 * result.kill_rate:.0f}%), {len(result.as_expected)}/{len(mutants)} "
             f"by every expected class; diagnosis rate {diagnosed}/{len(mutants)} "
             f"({100 * result.diagnosis_rate:.0f}%: the failure names the mutant's own bug); "
             f"in {result.seconds:.1f}s"]
    rows = [("mutant", "expected", "killed by expected", "killed by others", "cause named", "bug")]
    for m in mutants:
        mark = ("" if m.as_expected else "  <- MISSED") + ("" if m.diagnosed or not m.as_expected
                                                          else f"  <- NOT DIAGNOSED (wants {m.cause})")
        named = ",".join(sorted({str(m.named.get(c)) for c in m.by_expected})) or "-"
        rows.append((m.name.removeprefix("mutant."), ",".join(m.catches),
                     ",".join(m.by_expected) or "-", ",".join(m.by_others) or "-", named, m.bug + mark))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines.append("")
    for r in rows:
        lines.append("  ".join(cell.ljust(w) for cell, w in zip(r[:5], widths)) + "  " + r[5])
    survivors = [m for m in mutants if not m.as_expected]
    if survivors:
        lines += ["", "not caught as expected:"]
        for m in survivors:
            what = "survived" if not m.killed else f"killed only by {', '.join(m.by_others)}"
            detail = f" ({m.unavailable})" if m.unavailable else ""
            lines.append(f"  {m.name}: {what}{detail}; should have been caught by "
                         f"{', '.join(m.missed)}: {m.bug}")
    skipped = sum(len(m.skipped) for m in mutants)
    errors = [(m.name, e) for m in mutants for e in m.errors]
    if skipped:
        lines += ["", f"{skipped} case run(s) skipped: the rest of a class that already killed, "
                      f"and {', '.join(EXPENSIVE)} cases of mutants already killed (complete=True "
                      "runs them)"]
    for name, (case_id, error) in errors:
        lines.append(f"engine error: {name} [{case_id}]: {error}")
    if result.bases:
        bad = [b for b in result.bases if not b.ok]
        lines += ["", f"bases: {len(result.bases) - len(bad)}/{len(result.bases)} pass every case they run"]
        for b in bad:
            for case_id, status, text in b.failed[:5]:
                lines.append(f"  BASE FAILS {b.name} [{case_id}] {status}: {text}")
            if len(b.failed) > 5:
                lines.append(f"  ... and {len(b.failed) - 5} more failures of {b.name}")
    return "\n".join(lines)
