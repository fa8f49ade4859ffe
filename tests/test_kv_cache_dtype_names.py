"""A writer with vLLM's calling convention runs unmodified: its own kv_cache_dtype names
("fp8", "fp8_e4m3", "fp8_e5m2") and float8 caches (Contract.kv_cache_dtypes, Contract.fp8_cache),
every declared name tested, and a name read as the wrong format caught and named."""

from __future__ import annotations

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, PASS, run_case

VLLM_NAMES = (("fp8", "e4m3fn"), ("fp8_e4m3", "e4m3fn"), ("fp8_e5m2", "e5m2"))
FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)


def vllm_style(formats: dict):
    """Writers that take only vLLM's names (``formats``: name -> the format it writes) and float8
    caches, refusing anything else, around the torch baselines."""

    def codes(cache):
        if cache.dtype not in FLOAT8:
            raise TypeError(f"kv cache must be a float8 tensor, got {cache.dtype}")
        return cache.view(torch.uint8)

    def fmt(kv_cache_dtype):
        if kv_cache_dtype != "auto" and kv_cache_dtype not in formats:
            raise ValueError(f"unsupported kv_cache_dtype {kv_cache_dtype!r}")
        return formats.get(kv_cache_dtype, "auto")

    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        to = fmt(kv_cache_dtype)
        if to != "auto":
            key_cache, value_cache = codes(key_cache), codes(value_cache)
        tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, to, k_scale, v_scale)

    def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
        to = fmt(kv_cache_dtype)
        tn.concat_and_cache_mla(kv_c, k_pe, codes(kv_cache) if to != "auto" else kv_cache, slot_mapping, to, scale)

    return {"reshape_and_cache_flash": reshape_and_cache_flash, "concat_and_cache_mla": concat_and_cache_mla}


def kernel(op: str, formats: dict, **fields) -> Kernel:
    contract = Contract(op=op, name=f"vllm_style.{op}", backend="test", fp8_formats=("e4m3fn", "e5m2"),
                        fp8_preset=tn._torch_fp8_preset(), padding="negative", kv_cache_dtypes=VLLM_NAMES,
                        fp8_cache="float8", **fields)
    return Kernel(contract, vllm_style(formats)[op], "test")


def fp8_cases(k: Kernel) -> list:
    return [c for c in catalogue(k.contract.op, "quick", k.contract) if c.cls == "fp8"]


@pytest.mark.parametrize("op", ["reshape_and_cache_flash", "concat_and_cache_mla"])
def test_a_writer_taking_only_vllm_names_and_float8_caches_passes_every_fp8_case(op):
    k = kernel(op, {name: fmt for name, fmt in VLLM_NAMES})
    cases = fp8_cases(k)
    spelled = {c.p["spelling"] for c in cases if "spelling" in c.p}
    assert spelled == {name for name, _ in VLLM_NAMES}  # every declared name gets its own cases
    outcomes = [run_case(k, c) for c in cases]
    assert [(c.id, o.message) for c, o in zip(cases, outcomes) if o.status != PASS] == []


@pytest.mark.parametrize("op", ["reshape_and_cache_flash", "concat_and_cache_mla"])
def test_a_name_read_as_the_wrong_format_fails_its_own_cases_and_is_named(op):
    # vLLM's Triton writer maps every name starting with "fp8" to the platform's one fp8 dtype
    k = kernel(op, {"fp8": "e4m3fn", "fp8_e4m3": "e4m3fn", "fp8_e5m2": "e4m3fn"})
    failed = {}
    for case in fp8_cases(k):
        outcome = run_case(k, case)
        if outcome.status != PASS:
            failed[case.id] = outcome
    assert failed and all("as_fp8_e5m2" in case_id or "e5m2" in case_id.split("-")[:2] for case_id in failed)
    spelled = [o for case_id, o in failed.items() if "as_fp8_e5m2" in case_id]
    assert spelled and all(o.status == FAIL for o in spelled)
    random = next(o for case_id, o in failed.items() if "as_fp8_e5m2" in case_id and "random" in case_id)
    assert random.cause["id"] == "wrong_fp8_format"
    assert "e4m3fn codes written where kv_cache_dtype 'fp8_e5m2' asks for e5m2" in random.message


def test_format_names_reach_a_kernel_without_declared_names():
    k = Kernel(Contract(op="reshape_and_cache_flash", name="plain", backend="test", fp8_formats=("e5m2",)),
               tn.reshape_and_cache_flash, "test")
    case = next(c for c in fp8_cases(k) if c.p["fp8"] == "e5m2")
    assert "spelling" not in case.p
    assert k.contract.kv_cache_dtype("e5m2") == "e5m2" and k.contract.kv_cache_dtype(None) == "auto"


@pytest.mark.parametrize("names, fragment", [
    ((("fp8", "e5m2"),), "'fp8' names 'e5m2', which is not among fp8_formats"),
    ((("fp8", "e4m3fn"), ("fp8", "e4m3fn")), "names 'fp8' twice"),
    (("fp8",), "kv_cache_dtypes must be (name, format) pairs of strings"),
])
def test_a_broken_name_table_is_a_broken_contract_naming_it(names, fragment):
    with pytest.raises(ValueError, match="kv_cache_dtypes") as error:
        Contract(op="reshape_and_cache_flash", name="x", backend="test", fp8_formats=("e4m3fn",),
                 kv_cache_dtypes=names)
    assert fragment in str(error.value)


def test_fp8_cache_must_be_uint8_or_float8():
    with pytest.raises(ValueError, match="fp8_cache='fp16' is not one of uint8, float8"):
        Contract(op="reshape_and_cache_flash", name="x", backend="test", fp8_cache="fp16")
