"""Meta-tests: the catalogue generates what real kernels get fed, in the quick profile.

Slot 0 is a real destination unless the kernel reserves it; every kind of negative is padding
under "negative"; every layout axis and padding policy also runs past the size gates of fast
paths (N = 4096); sources may be longer than the index (vLLM's convention), with valid unused
slots after the index for a kernel that reads past it. Each is checked on the inputs a case
actually builds, and each has a kernel that gets it wrong and must fail.
"""

import numpy as np
import pytest
import torch

from oracle.buffers import Arena
from oracle.cases import LARGE_N, catalogue
from oracle.contract import Contract, gaps
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.ops.base import Case
from oracle.registry import Kernel
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, run_case

WRITERS = ("store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash")
INDEX_NAME = {"store_cache": "loc", "set_mla_kv_buffer": "loc", "concat_and_cache_mla": "slot_mapping",
              "reshape_and_cache_flash": "slot_mapping"}


def built(op: str, case: Case, **fields):
    contract = Contract(op=op, name="probe", backend="test", **fields)
    arena = Arena("cpu", case.seed)
    prepared = SPECS[op].build(case, arena, np.random.default_rng(case.seed), contract)
    prepared.before = arena.snapshot()
    return prepared, arena


def index_values(op: str, prepared) -> np.ndarray:
    position = {"store_cache": 4, "set_mla_kv_buffer": 1, "concat_and_cache_mla": 3,
                "reshape_and_cache_flash": 4}[op]
    return prepared.args[position].to(torch.int64).numpy()


def ordinary(op: str):
    return [c for c in catalogue(op, "quick") if c.cls in ("dtypes", "sizes") and c.p.get("n", 133) > 0
            and not c.p.get("padding") and not c.p.get("large") and c.p.get("src") != "longer"
            and not c.p.get("slots")]  # a run of slots holds slot 0 unless a reserved slot is in its way


@pytest.mark.parametrize("op", WRITERS)
def test_slot_zero_is_written_in_ordinary_cases_unless_reserved(op):
    for case in ordinary(op):
        prepared, _ = built(op, case)
        assert 0 in index_values(op, prepared), f"{op} {case.id}: slot 0 is never a destination"
        reserved, _ = built(op, case, padding="reserved:0")
        assert 0 not in index_values(op, reserved), f"{op} {case.id}: the reserved slot is written"


@pytest.mark.parametrize("op", WRITERS)
@pytest.mark.parametrize("index", ("int32", "int64"))
def test_negative_padding_mixes_every_kind_of_negative(op, index):
    case = Case.make(op, "padding", padding="negative", index=index)
    prepared, _ = built(op, case, padding="negative")
    entries = index_values(op, prepared)
    negatives = set(entries[entries < 0].tolist())
    num_slots = int(entries.max()) + 1  # a lower bound is enough for -(S + 1) below
    assert {-1, -2, np.iinfo(np.dtype(index)).min} <= negatives, negatives
    assert any(x < -num_slots for x in negatives) and any(x < -(2**24) for x in negatives), negatives
    if index == "int64":  # one whose low 32-bit word is a slot no real entry writes
        real = set(entries[entries >= 0].tolist())
        low_words = {x & 0xFFFFFFFF for x in negatives if x & 0xFFFFFFFF < 2**31}
        assert any(w not in real and 0 < w for w in low_words), (negatives, sorted(real)[:8])


@pytest.mark.parametrize("op", WRITERS)
def test_every_layout_axis_and_padding_policy_runs_at_large_n(op):
    spec = SPECS[op]
    large = [c.p for c in catalogue(op, "quick") if c.p.get("n") == LARGE_N]
    axes = [("src", "fused"), ("src", "longer"), ("index_layout", "strided"), ("index_layout", "offset"),
            ("padding", "negative"), ("padding", "reserved:0")]
    axes += [("cache", c) for c in spec.aliasing] + [("layout", l) for l in spec.layouts[1:]]
    for key, value in axes:
        assert any(p.get(key) == value for p in large), f"{op}: no N = {LARGE_N} case with {key}={value}"


@pytest.mark.parametrize("op", WRITERS)
def test_longer_sources_hold_extra_rows_and_valid_unused_slots_past_the_index(op):
    case = Case.make(op, "sizes", src="longer", n=133)
    prepared, arena = built(op, case, source_rows="index")
    entries = index_values(op, prepared)
    rows = [prepared.numpy(name).shape[0] for name in SPECS[op].sources]
    assert len(entries) == 133 and all(r > 133 for r in rows), rows
    storage = arena.numpy_view(prepared.before, INDEX_NAME[op] + "_storage")
    assert np.array_equal(storage[:133], entries)
    tail = storage[133:]
    assert len(tail) == rows[0] - 133
    assert set(tail.tolist()).isdisjoint(entries.tolist()) and (tail >= 0).all()


def test_longer_sources_are_outside_an_equal_rows_contract():
    case = Case.make("store_cache", "sizes", src="longer", n=133)
    equal = Contract(op="store_cache", name="x", backend="test")
    assert equal.source_rows == "equal"
    assert [g.key for g in gaps(equal, SPECS["store_cache"].needs(case))] == ["longer_source"]
    assert Contract(op="reshape_and_cache_flash", name="x", backend="test").source_rows == "index"
    with pytest.raises(ValueError, match="source_rows='rows'"):
        Contract(op="store_cache", name="x", backend="test", source_rows="rows")


def grid_from_source_rows(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's paged write with num_tokens = key.size(0): reads slot_mapping past its end."""
    storage = slot_mapping.untyped_storage()
    widened = torch.empty(0, dtype=slot_mapping.dtype).set_(storage, slot_mapping.storage_offset(),
                                                            (key.shape[0],), slot_mapping.stride())
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, widened.clone(), kv_cache_dtype,
                               k_scale, v_scale)


def test_a_kernel_that_sizes_its_grid_from_the_sources_fails_the_longer_cases():
    paged = Kernel(Contract(op="reshape_and_cache_flash", name="grid", backend="test",
                            padding="negative"), grid_from_source_rows, "test")
    outcomes = {c.id: run_case(paged, c) for c in catalogue("reshape_and_cache_flash", "quick")
                if c.p.get("src") == "longer"}
    assert outcomes and all(o.status == FAIL for o in outcomes.values()), outcomes
    assert all(run_case(paged, c).status == PASS for c in catalogue("reshape_and_cache_flash", "quick")
               if c.cls == "dtypes")


def test_a_kernel_that_skips_slot_zero_fails_ordinary_cases():
    def skips_zero(k, v, k_cache, v_cache, loc):
        keep = loc != 0
        tn.store_cache(k[keep], v[keep], k_cache, v_cache, loc[keep])

    kernel = Kernel(Contract(op="store_cache", name="skip0", backend="test",
                             dtypes=("float32", "float16", "bfloat16", "uint8")), skips_zero, "test")
    statuses = [run_case(kernel, c).status for c in ordinary("store_cache")]
    assert statuses and all(s == FAIL for s in statuses), statuses
    reserved = Kernel(Contract(op="store_cache", name="skip0r", backend="test", padding="reserved:0",
                               dtypes=("float32", "float16", "bfloat16", "uint8")), skips_zero, "test")
    assert all(run_case(reserved, c).status in (PASS, NOT_SUPPORTED) for c in catalogue("store_cache", "quick")
               if c.cls in ("dtypes", "sizes", "padding") and not c.p.get("large"))


def skip_slot(reserved: int):
    def store_cache(k, v, k_cache, v_cache, loc):
        keep = loc != reserved
        tn.store_cache(k[keep], v[keep], k_cache, v_cache, loc[keep])
    return store_cache


def test_a_kernels_own_reserved_slot_gets_padding_cases_and_is_never_a_real_slot():
    contract = Contract(op="store_cache", name="r5", backend="test", padding="reserved:5",
                        dtypes=("float32", "float16", "bfloat16", "uint8"))
    cases = catalogue("store_cache", "quick", contract)
    own = [c for c in cases if c.p.get("padding") == "reserved:5"]
    assert own and not [c for c in catalogue("store_cache", "quick") if c.p.get("padding") == "reserved:5"]
    for case in ordinary("store_cache"):
        prepared, _ = built("store_cache", case, padding="reserved:5")
        entries = index_values("store_cache", prepared)
        assert 5 not in entries and 0 in entries, case.id
    right = Kernel(contract, skip_slot(5), "test")
    wrong = Kernel(contract, skip_slot(0), "test")
    assert all(run_case(right, c).status == PASS for c in own)
    assert all(run_case(wrong, c).status == FAIL for c in own)
    assert all(run_case(wrong, c).status == FAIL for c in ordinary("store_cache"))


@pytest.mark.parametrize("op", ("set_mla_kv_buffer", "concat_and_cache_mla"))
def test_rows_without_rope_run_in_the_sizes_class_and_under_every_padding_policy(op):
    """An MLA writer that takes another kernel for a rope of width 0 gets that path under every
    policy; ``empty_rope=False`` puts those cases out of contract (probed), and only those."""
    cases = [c for c in catalogue(op, "quick") if c.p.get("shape", (1, 1))[1] == 0]
    assert {c.cls for c in cases} == {"sizes", "padding"}
    assert {c.p.get("padding") for c in cases} == {None, "negative", "reserved:0"}
    for case in cases:
        prepared, _ = built(op, case, padding=case.p.get("padding", "none"))
        rope = prepared.args[{"set_mla_kv_buffer": 3, "concat_and_cache_mla": 1}[op]]
        assert rope.shape[-1] == 0 and prepared.args[0 if op == "set_mla_kv_buffer" else 2].shape[-1] >= 512
        narrow = Contract(op=op, name="x", backend="test", padding=case.p.get("padding", "none"), empty_rope=False)
        assert [(g.key, g.probe) for g in gaps(narrow, SPECS[op].needs(case))] == [("empty_rope", True)]
    others = [c for c in catalogue(op, "quick") if c not in cases and c.cls in ("sizes", "padding")]
    narrow = Contract(op=op, name="x", backend="test", empty_rope=False)
    assert all("empty_rope" not in [g.key for g in gaps(narrow, SPECS[op].needs(c))] for c in others)


def test_an_mla_writer_whose_no_rope_path_writes_the_reserved_slot_fails_there_alone():
    """sglang's set_mla_kv_buffer_kernel_norope skips no reserved slot where its main kernels skip
    slot 0: only the padding cases in rows without rope hold both."""
    from oracle.mutants.bases import set_mla_skip_reserved0

    def no_rope_path_writes_slot_zero(kv_buffer, loc, nope, rope):
        if rope.shape[-1]:
            set_mla_skip_reserved0(kv_buffer, loc, nope, rope)
        else:
            tn.set_mla_kv_buffer(kv_buffer, loc, nope, rope)

    contract = Contract(op="set_mla_kv_buffer", name="norope", backend="test", padding="reserved:0",
                        dtypes=("float32", "float16", "bfloat16", "uint8"), validates=True)
    kernel = Kernel(contract, no_rope_path_writes_slot_zero, "test")
    failed = {c.id: run_case(kernel, c) for c in catalogue("set_mla_kv_buffer", "quick", contract)
              if c.cls in ("sizes", "padding") and not c.p.get("large")}
    failing = {i for i, o in failed.items() if o.status == FAIL}
    assert failing == {"512x0-pad_reserved0"}, failing
    assert failed["512x0-pad_reserved0"].cause["id"] == "padding_policy"
