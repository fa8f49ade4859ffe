"""Meta-tests: the conformance engine itself catches what it claims to, and says so precisely.

Each wrong kernel here is a few lines of torch with one deliberate bug; the engine must fail it
with a message that names the bug's location, and must pass the correct baseline.
"""

import numpy as np
import pytest
import torch

import oracle
from oracle.bundle import replay, write_bundle
from oracle.contract import Contract, gaps
from oracle.kernels.torch_native import store_cache as good_store_cache
from oracle.ops.base import Case
from oracle.registry import Kernel, Registry
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, UNAVAILABLE, UNDECLARED, run_case

BASE = Case.make("store_cache", "dtypes", dtype="bfloat16", index="int64", n=33)


def kernel(fn, **fields):
    contract = Contract(**{"op": "store_cache", "name": fn.__name__, "backend": "test", **fields})
    return Kernel(contract, fn, "test")


def writes_one_row_before(k, v, k_cache, v_cache, loc):
    good_store_cache(k, v, k_cache, v_cache, loc)
    base = k_cache.as_strided((1,) + tuple(k_cache.shape[1:]), k_cache.stride(),
                              k_cache.storage_offset() - k_cache.stride(0))
    base.copy_(k[:1])  # the row a -1 slot would hit


def scales_source_in_place(k, v, k_cache, v_cache, loc):
    k.mul_(2)
    good_store_cache(k, v, k_cache, v_cache, loc)


def accepts_anything(k, v, k_cache, v_cache, loc):
    n = min(len(loc), k.shape[0])
    k_cache[loc[:n].long().clamp(0, k_cache.shape[0] - 1)] = k[:n].to(k_cache.dtype)[..., : k_cache.shape[-1]]


def writes_then_rejects(k, v, k_cache, v_cache, loc):
    k_cache[0].fill_(0)
    raise ValueError("rejected, too late")


def test_correct_baseline_passes():
    assert run_case(kernel(good_store_cache), BASE).status == PASS


def test_out_of_bounds_write_is_named_as_guard_band_row_minus_one():
    outcome = run_case(kernel(writes_one_row_before), BASE)
    assert outcome.status == FAIL
    assert "guard band written" in outcome.message
    assert "k_cache[-1, 0, 0]" in outcome.message


def test_modified_source_is_reported_as_input():
    outcome = run_case(kernel(scales_source_in_place), BASE)
    assert outcome.status == FAIL
    assert "k is an input (source): the kernel modified it" in outcome.message


@pytest.mark.parametrize("bad", ["out_of_range", "index_dtype", "dtype_mismatch", "shape_mismatch"])
def test_bad_input_must_be_rejected_by_validating_kernels(bad):
    case = Case.make("store_cache", "bad_input", bad=bad)
    assert run_case(kernel(good_store_cache, validates=True), case).status == PASS
    outcome = run_case(kernel(accepts_anything, validates=True), case)
    assert outcome.status == FAIL and "without an error" in outcome.message


def test_rejection_after_a_write_fails():
    case = Case.make("store_cache", "bad_input", bad="out_of_range")
    outcome = run_case(kernel(writes_then_rejects, validates=True), case)
    assert outcome.status == FAIL
    assert "memory changed first in: k_cache_storage" in outcome.message


def test_bad_input_is_not_run_on_kernels_that_do_not_validate():
    case = Case.make("store_cache", "bad_input", bad="out_of_range")
    outcome = run_case(kernel(accepts_anything), case)
    assert outcome.status == NOT_SUPPORTED and "validates=False" in outcome.message


def test_unavailable_kernel_reports_its_reason():
    outcome = run_case(kernel(good_store_cache, available=lambda: "needs a GPU"), BASE)
    assert (outcome.status, outcome.message) == (UNAVAILABLE, "needs a GPU")


def test_broken_availability_probe_is_a_reason_not_a_crash():
    def probe():
        raise RuntimeError("driver exploded")
    outcome = run_case(kernel(good_store_cache, available=probe), BASE)
    assert outcome.status == UNAVAILABLE and "driver exploded" in outcome.message


def test_undeclared_capability_that_works_is_noted():
    outcome = run_case(kernel(good_store_cache, dtypes=("float16",)), BASE)
    assert outcome.status == UNDECLARED and "dtype bfloat16 not declared" in outcome.message


def test_undeclared_capability_that_fails_is_not_supported():
    outcome = run_case(kernel(writes_one_row_before, dtypes=("float16",)), BASE)
    assert outcome.status == NOT_SUPPORTED and "does not work either" in outcome.message


def test_a_probe_the_contracts_fp8_preset_cannot_describe_is_not_supported():
    """An OCP-only preset (cuda_satfinite) has no knobs for fnuz: a fnuz case on a kernel that
    declares only e4m3fn is left out with the reason, not an exception out of the oracle."""
    from oracle.kernels.torch_native import quantize_fp8

    contract = Contract(op="quantize_fp8", name="q", backend="test", fp8_formats=("e4m3fn",),
                        fp8_preset="cuda_satfinite")
    case = Case.make("quantize_fp8", "fp8", fp8="e4m3fnuz", scale="1.0", values="random")
    outcome = run_case(Kernel(contract, quantize_fp8, "test"), case)
    assert outcome.status == NOT_SUPPORTED
    assert "e4m3fnuz" in outcome.message and "not probed" in outcome.message
    assert "does not cover format 'e4m3fnuz'" in outcome.message


def test_unsafe_gaps_are_never_probed():
    needs = {"padding": "negative", "dtype": "bfloat16"}
    found = gaps(Contract(op="store_cache", name="x", backend="t"), needs)
    assert [(g.key, g.probe) for g in found] == [("padding", False)]


def test_declared_reason_is_shown_with_the_gap():
    contract = Contract(op="store_cache", name="x", backend="t",
                        reasons=(("padding", "slot 0 is a real slot here"),))
    [gap] = gaps(contract, {"padding": "reserved:0"})
    assert gap.text.endswith("declares padding=none: slot 0 is a real slot here")
    with pytest.raises(ValueError, match="reasons must be"):
        Contract(op="store_cache", name="y", backend="t", reasons=(("colour", "no"),))


def test_contract_rejects_a_bad_manifest_with_every_problem():
    with pytest.raises(ValueError) as info:
        Contract(op="bogus", name="x", backend="t", dtypes=("float64",), padding="sometimes")
    text = str(info.value)
    assert "op='bogus'" in text and "float64" in text and "padding='sometimes'" in text


def test_registry_decorator_and_duplicate_names():
    registry = Registry()

    @registry.register(op="store_cache", name="a.store", backend="a")
    def store(*args):
        pass

    assert registry.kernels["a.store"].fn is store
    with pytest.raises(ValueError, match="already registered"):
        registry.register(store, op="store_cache", name="a.store", backend="a")


def test_broken_plugin_is_recorded_and_others_still_load(monkeypatch):
    registry = Registry()
    monkeypatch.setenv("ORACLE_PLUGINS", "no_such_module_xyz:register, oracle.kernels.torch_native:nope")
    registry.discover()
    plugins = {e.plugin: e.error for e in registry.errors}
    assert "ModuleNotFoundError" in plugins["ORACLE_PLUGINS no_such_module_xyz:register"]
    assert "AttributeError" in plugins["ORACLE_PLUGINS oracle.kernels.torch_native:nope"]
    assert "torch.store_cache" in registry.kernels  # the entry point still loaded


def test_our_kernels_arrive_through_the_public_entry_point():
    registry = Registry().discover()
    assert registry.kernels["torch.store_cache"].plugin.startswith("entry point torch")


def test_bundle_replays_the_failure_and_passes_a_correct_kernel(tmp_path):
    bad = kernel(writes_one_row_before)
    outcome = run_case(bad, BASE)
    path = write_bundle(tmp_path, bad, BASE, outcome)
    with np.load(path, allow_pickle=False) as data:
        assert "meta" in data.files
    passed, report = replay(path, bad)
    assert not passed and "guard band written" in report
    passed, report = replay(path, kernel(good_store_cache))
    assert passed, report


def test_public_api_is_small():
    assert set(oracle.__all__) == {"Contract", "Tolerance", "__version__", "register"}
    assert torch.__version__  # torch is the kernel side's dependency, present for these tests
