"""The property tests' strategy draws only cases inside the kernel's contract: whatever a contract
leaves out (a dtype, a layout, strided indices, caches of different strides, an fp8 format, a
kv_cache_dtype name) is never drawn, so a property failure is always a kernel's failure."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings

from oracle.contract import Contract, gaps
from oracle.ops import SPECS
from oracle.strategies import cases

NARROW = dict(dtypes=("bfloat16",), index_dtypes=("int32",), strided_index=False, strided_sources=False,
              layouts=("NHD",), scales=("tensor",), fp8_formats=("e4m3fn",), shared_cache_strides=True,
              kv_cache_dtypes=(("fp8", "e4m3fn"), ("fp8_e4m3", "e4m3fn")), padding="negative")


def contract(op: str, **fields) -> Contract:
    spec = SPECS[op]
    if not spec.fp8:
        fields = {k: v for k, v in fields.items() if k not in ("fp8_formats", "kv_cache_dtypes", "scales")}
    return Contract(op=op, name="drawn", backend="test", **fields)


@pytest.mark.parametrize("op", ["store_cache", "reshape_and_cache_flash", "concat_and_cache_mla", "set_mla_kv_buffer"])
@pytest.mark.parametrize("fields", [{}, NARROW], ids=["defaults", "narrow"])
def test_every_drawn_case_is_inside_the_contract(op, fields):
    declared = contract(op, **fields)

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(cases(op, declared))
    def inside(case):
        assert gaps(declared, SPECS[op].needs(case)) == [], case.id

    inside()
