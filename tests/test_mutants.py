"""The suite's own power: the kernels the mutants of oracle.mutants mutate pass every case under
the same contracts, so each kill is real (that every class a mutant names kills it, and names its
bug, is test_diagnosis.py's); and the self-check (``oracle selfcheck``) reports kills, survivors
and causes."""

import dataclasses

import pytest
import torch

from oracle.cases import CASE_CLASSES, catalogue
from oracle.kernels import torch_native
from oracle.mutants import (BACKEND, BASE_BACKEND, BASES, MUTANTS, Mutant, base_contracts,
                            format_table, self_check)
from oracle.mutants import _raw
from oracle.registry import Registry
from oracle.runner import NOT_SUPPORTED, PASS, UNDECLARED, run_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # fp8 special values overflow


@pytest.fixture(scope="module")
def kernels():
    """Every kernel involved, loaded through the public plug-in mechanism (ORACLE_PLUGINS)."""
    registry = Registry()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORACLE_PLUGINS", "oracle.mutants:register")
        registry.discover()
    mine = [e.error for e in registry.errors if "oracle.mutants" in e.plugin or "torch" in e.plugin]
    assert not mine, mine
    return registry.kernels


def test_catalogue_metadata():
    assert len(MUTANTS) >= 20
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names)
    contracts = base_contracts()
    for m in MUTANTS:
        assert m.name.startswith("mutant.") and m.short.startswith(m.op + ".")
        assert m.bug.strip() and "\n" not in m.bug
        assert m.catches and set(m.catches) <= set(CASE_CLASSES), m.name
        assert contracts[m.base].op == m.op, m.name


def test_every_mutant_declares_its_base_contract(kernels):
    """A mutant declaring less than its base would escape cases instead of failing them."""
    for m in MUTANTS:
        mutant, base = kernels[m.name], kernels[m.base]
        assert mutant.contract.backend == BACKEND and mutant.fn is m.fn
        same = dict(name=base.contract.name, backend=base.contract.backend, notes=base.contract.notes)
        assert dataclasses.replace(mutant.contract, **same) == base.contract
        assert m.bug in mutant.contract.notes
    assert {b.name for b in BASES} <= {n for n, k in kernels.items() if k.contract.backend == BASE_BACKEND}


BASE_NAMES = sorted({m.base for m in MUTANTS})


@pytest.mark.parametrize("name", BASE_NAMES)
def test_base_passes_every_case(name, kernels):
    kernel = kernels[name]
    expected = {c for m in MUTANTS if m.base == name for c in m.catches}
    statuses = {}
    for case in catalogue(kernel.contract.op, "quick"):
        outcome = run_case(kernel, case)
        assert outcome.status in (PASS, UNDECLARED, NOT_SUPPORTED), \
            f"{name} [{case.cls}/{case.id}]: {outcome.status}\n{outcome.message}"
        statuses.setdefault(case.cls, set()).add(outcome.status)
    for cls in expected:  # the class its mutants must die in is inside its contract
        assert PASS in statuses.get(cls, ()), f"{name} passes no {cls} case: {statuses.get(cls)}"


def test_self_check_table_and_progress():
    seen = []
    result = self_check("quick", ["translate_full_to_swa.wraps_negative",
                                  "mutant.translate_full_to_swa.ignores_index_stride"],
                        progress=lambda done, total, r: seen.append((done, total, r.name)))
    assert seen == [(1, 3, "mutant.translate_full_to_swa.wraps_negative"),
                    (2, 3, "mutant.translate_full_to_swa.ignores_index_stride"),
                    (3, 3, "torch.translate_full_to_swa")]
    assert result.ok and result.kill_rate == 1.0
    assert result.mutants[0].killed_by.keys() == {"bad_input"}
    assert result.mutants[0].killed_by["bad_input"] == ["bad_negative_two"]
    table = format_table(result)
    assert "2/2 killed (100%), 2/2 by every expected class; diagnosis rate 2/2 (100%" in table
    assert result.diagnosis_rate == 1.0 and "index_stride_ignored" in table
    assert "translate_full_to_swa.wraps_negative" in table and "bad_input" in table
    assert "bases: 1/1 pass every case they run" in table


def test_survivor_is_reported_with_the_class_that_should_have_caught_it():
    honest = Mutant("mutant.translate_full_to_swa.honest", "translate_full_to_swa",
                    "torch.translate_full_to_swa", "no bug at all", ("bad_input",),
                    torch_native.translate_full_to_swa)
    result = self_check("quick", [honest], check_bases=False)
    assert not result.ok and result.kill_rate == 0.0 and result.survivors[0].missed == ("bad_input",)
    table = format_table(result)
    assert "0/1 killed (0%)" in table
    assert "mutant.translate_full_to_swa.honest: survived; should have been caught by bad_input" in table


def test_a_kill_that_names_another_cause_is_not_diagnosed():
    """A mutant declared with the wrong cause is killed but not diagnosed, and the check fails."""
    stride = next(m for m in MUTANTS if m.short == "translate_full_to_swa.ignores_index_stride")
    mislabelled = dataclasses.replace(stride, name="mutant.translate_full_to_swa.mislabelled",
                                      cause="index_offset_ignored")
    result = self_check("quick", [mislabelled], check_bases=False)
    m = result.mutants[0]
    assert m.killed and m.as_expected and not m.diagnosed and not result.ok
    assert result.diagnosis_rate == 0.0
    assert "NOT DIAGNOSED (wants index_offset_ignored)" in format_table(result)


def test_unknown_mutant_name_is_an_error():
    with pytest.raises(ValueError, match="no mutant named"):
        self_check("quick", ["store_cache.no_such_bug"])


def test_raw_writes_stay_inside_the_allocation():
    storage = torch.zeros(64, dtype=torch.uint8)
    cache = storage[16:48].view(4, 8)
    _raw.write_rows_at(cache, torch.tensor([cache.storage_offset() - 8]), torch.ones(1, 8, dtype=torch.uint8))
    assert storage[8:16].eq(1).all() and storage[16:].eq(0).all()  # row -1: before the view
    with pytest.raises(IndexError, match="outside the allocation"):
        _raw.write_rows_at(cache, torch.tensor([60]), torch.ones(1, 8, dtype=torch.uint8))
    with pytest.raises(IndexError):
        _raw.copy_bytes(cache, torch.tensor([-1]), cache, torch.tensor([0]), 4)
