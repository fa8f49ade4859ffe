"""The slot-arithmetic hypotheses (oracle.diagnose.slot_arithmetic) against hand-derived vectors, and
a kernel that keeps slots in 16 bits caught and named on the catalogue's slots past 2**24."""

import numpy as np
import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.diagnose.slot_arithmetic import narrowed
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, run_case

S = (1 << 24) + 256
ENTRIES = np.array([-1, 5, 32767, 32768, 65535, 65536 + 7, (1 << 24) + 475], dtype=np.int64)


@pytest.mark.parametrize("signed, wrap, want", [
    (True, True, [-1, 5, 32767, S - 32768, S - 1, 7, 475]),
    (True, False, [-1, 5, 32767, -1, -1, 7, 475]),
    (False, False, [-1, 5, 32767, 32768, 65535, 7, 475]),
])
def test_slots_kept_in_16_bits(signed, wrap, want):
    assert narrowed(ENTRIES, S, signed, wrap).tolist() == want
    assert narrowed(ENTRIES.astype(np.int32), S, signed, wrap).dtype == np.int32


def test_slots_that_fit_16_bits_leave_nothing_to_replay():
    with pytest.raises(ValueError, match="fits 16 bits"):
        narrowed(np.array([-1, 0, 32767, 65535]), 70000, False, False)
    assert narrowed(np.array([40000]), 30000, False, False).tolist() == [-1]  # past the cache: dropped


def int16_slots(k, v, k_cache, v_cache, loc):
    """The slots through int16 (a 16-bit slot table), a negative one wrapped from the end."""
    tn.store_cache(k, v, k_cache, v_cache, loc.to(torch.int16).long() % k_cache.shape[0])


def uint16_slots(k, v, k_cache, v_cache, loc):
    """The slots' low 16 bits (a uint16 slot table)."""
    tn.store_cache(k, v, k_cache, v_cache, loc.long() & 0xFFFF)


@pytest.mark.parametrize("fn, index", [(int16_slots, "int32"), (uint16_slots, "int64")])
def test_a_kernel_that_keeps_slots_in_16_bits_is_named(fn, index):
    """On the case of odd slots past 2**24 (one index dtype each: a case's diagnosis replays every
    hypothesis over its 2**24 slots); the torch baseline passes it in the conformance suite. Those
    slots' low 16 bits stay below 2**15, so the signed and unsigned readings agree there."""
    fields = dict(dtypes=("float32", "float16", "bfloat16", "uint8"))
    wrong = Kernel(Contract(op="store_cache", name="narrow." + fn.__name__, backend="test", **fields), fn, "test")
    case = next(c for c in catalogue("store_cache", "quick")
                if c.p.get("slots") == "past_float" and c.p.get("index", "int64") == index)
    outcome = run_case(wrong, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "slots_narrowed", f"{case.id}: {outcome.message}"
