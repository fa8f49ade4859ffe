"""The suite's own power: a catalogue of deliberately wrong kernels, and the self-check that runs
the case catalogue against them.

Each mutant (:data:`MUTANTS`) is a small variant of a correct torch kernel with one real bug,
registered through the public plug-in API under backend ``"mutant"`` with exactly the contract of
the kernel it mutates, plus its metadata: the bug, in one line, and the case class(es) expected to
catch it. Where a bug needs a contract the torch baseline does not declare (a padding policy,
duplicate slots, saturation on every fp8 format), the mutated kernel is a correct variant
registered under backend ``"mutant-base"`` (:data:`BASES`).

Use it as a plug-in (``ORACLE_PLUGINS=oracle.mutants:register``: the conformance suite must then
fail every ``mutant.*`` kernel and pass every ``mutant-base.*`` one), or in-process through
:func:`self_check` and :func:`format_table` (``oracle run --self-check``).
"""

from __future__ import annotations

from dataclasses import replace

import oracle

from ..contract import Contract
from .bases import BACKEND as BASE_BACKEND
from .bases import BASES, Base
from .block_faults import BLOCK_MUTANTS
from .conventions import CONVENTION_MUTANTS
from .fp8_faults import FP8_MUTANTS
from .kernels import MUTANTS as KERNEL_MUTANTS
from .kernels import Mutant
from .stateful import STATEFUL_MUTANTS
from .torch_modes import MODE_MUTANTS
from .selfcheck import BaseResult, MutantResult, SelfCheckResult, format_table, self_check

BACKEND = "mutant"
MUTANTS = (KERNEL_MUTANTS + CONVENTION_MUTANTS + FP8_MUTANTS + BLOCK_MUTANTS + STATEFUL_MUTANTS
           + MODE_MUTANTS)  # the whole catalogue


def base_contracts() -> dict[str, Contract]:
    """The contract of every kernel a mutant mutates, by name: the torch baseline's, as its own
    plug-in registers them, and the :data:`BASES` variants'."""
    from ..kernels import torch_native
    from ..registry import Registry

    torch_registry = Registry()
    torch_registry.load_plugin("oracle.kernels.torch_native:register", torch_native.register)
    if torch_registry.errors:
        raise RuntimeError(f"the torch baseline failed to register: {torch_registry.errors[0].error}")
    out = {name: kernel.contract for name, kernel in torch_registry.kernels.items()}
    for base in BASES:
        out[base.name] = Contract(op=base.op, name=base.name, backend=BASE_BACKEND, notes=base.why,
                                  **base.fields)
    return out


def mutant_contract(mutant: Mutant, contracts: dict[str, Contract] | None = None) -> Contract:
    """The mutant's contract: its base's, renamed, under backend ``"mutant"``."""
    contracts = contracts if contracts is not None else base_contracts()
    base = contracts[mutant.base]
    if base.op != mutant.op:
        raise ValueError(f"mutant {mutant.name} of op {mutant.op} names base {mutant.base} of op {base.op}")
    return replace(base, name=mutant.name, backend=BACKEND,
                   notes=f"MUTANT of {mutant.base}: {mutant.bug} (expected to be caught by "
                         f"{', '.join(mutant.catches)})")


def register() -> None:
    """The plug-in function: registers the :data:`BASES` variants, then every mutant."""
    contracts = base_contracts()
    for base in BASES:
        oracle.register(base.fn, contract=contracts[base.name])
    for mutant in MUTANTS:
        oracle.register(mutant.fn, contract=mutant_contract(mutant, contracts))


__all__ = ["BACKEND", "BASES", "BASE_BACKEND", "Base", "BaseResult", "MUTANTS", "Mutant",
           "MutantResult", "SelfCheckResult", "base_contracts", "format_table", "mutant_contract",
           "register", "self_check"]
