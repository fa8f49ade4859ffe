"""DCP-sharded set_mla_kv_buffer: the reference against a plain Python loop (C truncation written
out in integers, Python's own floor % and //) and hand-derived vectors, on poisoned buffers
compared whole; the torch DCP kernels and the floor-modulo mutant through the conformance engine."""

from __future__ import annotations

import dataclasses
import functools
import math

import ml_dtypes
import numpy as np
import pytest
import torch

from loop_oracles import Unchanged, assert_bits_equal, poison, random_bits
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.mutants import self_check
from oracle.ops import _dcp
from oracle.ops.base import Case
from oracle.reference.mla import set_mla_kv_buffer
from oracle.reference.slots import OneOfRows, dcp_local_rows
from oracle.registry import Kernel, Registry
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, UNDECLARED, run_case

ROWS, NOPE, ROPE, WIDTH = 6, 5, 3, 10  # W > nope + rope: the tail must stay as it was


# ---- the independent oracle ---------------------------------------------------------------------

def c_divmod(a: int, w: int) -> tuple[int, int]:
    """C's / and % (quotient toward zero), in Python integers: exact for any int64."""
    q = a // w if a >= 0 else -((-a) // w)
    return q, a - q * w


def loop_dcp(buffer, loc, nope, rope, world, rank, modulo, padding="none"):
    """The shard after the write, or None when some kept loc names a row outside the buffer."""
    out = buffer.copy()
    rows = buffer.shape[0]
    for i in range(len(loc)):
        value = int(loc[i])
        if padding == "negative" and value < 0:
            continue
        if padding.startswith("reserved:"):
            k = int(padding.split(":")[1])
            if value == k and k < rows * world:
                continue
        row, rem = c_divmod(value, world) if modulo == "truncate" else (value // world, value % world)
        if rem != rank:
            continue
        if not 0 <= row < rows:
            return None
        for j in range(nope.shape[1]):
            out[row, j] = nope[i, j]
        for j in range(rope.shape[1]):
            out[row, nope.shape[1] + j] = rope[i, j]
    return out


def sources(count, dtype=ml_dtypes.bfloat16, seed=0):
    rng = np.random.default_rng(seed)
    return (poison((ROWS, WIDTH), dtype, salt=seed), random_bits(rng, (count, NOPE), dtype),
            random_bits(rng, (count, ROPE), dtype))


def write(loc, world, rank, modulo, padding="none", **kw):
    """The reference's result on a poisoned shard, after checking it left its inputs alone."""
    loc = np.asarray(loc, dtype=kw.pop("index_dtype", np.int64))
    buffer, nope, rope = sources(len(loc))
    guard = Unchanged(buffer, loc, nope, rope)
    try:
        return set_mla_kv_buffer(buffer, loc, nope, rope, padding=padding, dcp_world=world,
                                 dcp_rank=rank, dcp_modulo=modulo, **kw)
    finally:
        guard.verify()


def test_c_divmod_agrees_with_math_fmod():
    for a in range(-50, 51):
        for w in (1, 2, 3, 4, 7):
            q, r = c_divmod(a, w)
            assert r == int(math.fmod(a, w)) and q == int(a / w)


# ---- the reference --------------------------------------------------------------------------------

@pytest.mark.parametrize("modulo", ["truncate", "floor"])
@pytest.mark.parametrize("padding", ["none", "negative", "reserved:0"])
def test_width_one_is_the_plain_write(modulo, padding):
    rng = np.random.default_rng(len(padding))
    for trial in range(20):
        loc = rng.permutation(ROWS)[: rng.integers(0, ROWS + 1)].astype(np.int32)
        if len(loc) and padding != "none":
            loc[rng.random(len(loc)) < 0.3] = -1 if padding == "negative" else 0
        buffer, nope, rope = sources(len(loc), seed=trial)
        plain = set_mla_kv_buffer(buffer, loc, nope, rope, padding=padding)
        assert_bits_equal(set_mla_kv_buffer(buffer, loc, nope, rope, padding=padding, dcp_world=1,
                                            dcp_rank=0, dcp_modulo=modulo), plain)
    bad = np.array([2, -1], np.int64) if padding != "negative" else np.array([2, ROWS], np.int64)
    buffer, nope, rope = sources(2)
    with pytest.raises(ValueError) as plain_error:
        set_mla_kv_buffer(buffer, bad, nope, rope, padding=padding)
    with pytest.raises(ValueError) as dcp_error:
        set_mla_kv_buffer(buffer, bad, nope, rope, padding=padding, dcp_world=1, dcp_modulo=modulo)
    assert str(dcp_error.value) == str(plain_error.value)


@pytest.mark.parametrize("modulo", ["truncate", "floor"])
@pytest.mark.parametrize("padding", ["none", "negative", "reserved:0", "reserved:5"])
@pytest.mark.parametrize("world", [2, 3, 4])
def test_matches_the_loop(world, padding, modulo):
    rng = np.random.default_rng([world, len(padding), len(modulo)])
    for rank in range(world):
        for trial in range(30):
            # rows of this rank, other ranks' locs, negatives, and now and then a row past the end
            count = int(rng.integers(0, 9))
            mine = rng.integers(0, ROWS + 1, size=count) * world + rank
            others = rng.integers(0, ROWS * world + 2, size=count)
            negatives = rng.choice([-1, -2, -3, -world, -world - 1, -2**31, -2**63 + 1], size=count)
            pick = rng.integers(0, 3, size=count)
            loc = np.where(pick == 0, mine, np.where(pick == 1, others, negatives)).astype(np.int64)
            rows = np.where(loc >= 0, loc // world, loc)
            loc = loc[np.unique(rows, return_index=True)[1]]  # no two positions on one row
            buffer, nope, rope = sources(len(loc))  # what write() passes the reference
            want = loop_dcp(buffer, loc, nope, rope, world, rank, modulo, padding)
            if want is None:
                with pytest.raises(ValueError, match=r"is kept by dcp_rank"):
                    write(loc, world, rank, modulo, padding)
            else:
                assert_bits_equal(write(loc, world, rank, modulo, padding), want)


def test_hand_derived_rows():
    """W = 4, rank 3: 7, 3, 11 and 15 are rows 1, 0, 2, 3; 8 (rank 0) and 6 (rank 2) are left."""
    loc = np.array([7, 8, 3, 11, 6, 15], np.int64)
    buffer, nope, rope = sources(len(loc))
    want = buffer.copy()
    for i, row in ((0, 1), (2, 0), (3, 2), (5, 3)):
        want[row, :NOPE], want[row, NOPE:NOPE + ROPE] = nope[i], rope[i]
    for modulo in ("truncate", "floor"):
        assert_bits_equal(set_mla_kv_buffer(buffer, loc, nope, rope, dcp_world=4, dcp_rank=3,
                                            dcp_modulo=modulo), want)


def test_local_rows_by_hand():
    """W = 3 over -4..4, and the int64 minimum (2**63 = 3 * 3074457345618258602 + 2)."""
    loc = np.array([-4, -3, -2, -1, 0, 1, 2, 3, 4, -2**63], np.int64)
    truncate = dcp_local_rows(loc, 3, 2, "truncate")[1].tolist()
    floor = dcp_local_rows(loc, 3, 2, "floor")[1].tolist()
    assert truncate == [-1, -1, 0, 0, 0, 0, 0, 1, 1, -3074457345618258602]
    assert floor == [-2, -1, -1, -1, 0, 0, 0, 1, 1, -3074457345618258603]
    # remainders -1, 0, -2, -1, 0, 1, 2, 0, 1, -2 (truncate) and 2, 0, 1, 2, 0, 1, 2, 0, 1, 1 (floor)
    kept = {m: dcp_local_rows(loc, 3, 2, m)[0].nonzero()[0].tolist() for m in ("truncate", "floor")}
    assert kept == {"truncate": [6], "floor": [0, 3, 6]}


def test_the_two_moduli_disagree_on_minus_one():
    """W = 3, rank 2, loc -1: floor keeps it (-1 % 3 = 2) as row -1, which is rejected;
    truncate's remainder is -1, no rank, so it is skipped and the shard is unchanged."""
    buffer, nope, rope = sources(1)
    with pytest.raises(ValueError, match=r"loc\[0\] = -1 is kept by dcp_rank=2 \(-1 mod 3 = 2 under "
                                         r"dcp_modulo='floor'\) but names row -1 div 3 = -1"):
        write([-1], 3, 2, "floor")
    assert_bits_equal(write([-1], 3, 2, "truncate"), buffer)


def test_minus_two_at_width_two():
    """rank 0 keeps -2 under both moduli (remainder 0) as row -1: rejected; rank 1 skips it."""
    for modulo in ("truncate", "floor"):
        with pytest.raises(ValueError, match=r"loc\[1\] = -2 is kept by dcp_rank=0 .* div 2 = -1, "
                                             r"out of range \[0, 6\)"):
            write([4, -2], 2, 0, modulo)
        assert_bits_equal(write([-2], 2, 1, modulo), sources(1)[0])


def test_padding_applies_to_the_widened_loc_first():
    """Under "negative" every negative loc is skipped before any rank keeps it; the out-of-range
    message counts the other bad positions."""
    buffer, nope, rope = sources(3)
    assert_bits_equal(write([-2, -4, 2], 2, 0, "floor", padding="negative"),
                      loop_dcp(buffer, np.array([2]), nope[2:], rope[2:], 2, 0, "floor"))
    with pytest.raises(ValueError, match=r"loc\[0\] = -2 .*padding='none'; 1 more position"):
        write([-2, -4, 2], 2, 0, "floor")


def test_reserved_slot_is_the_widened_loc():
    buffer, nope, rope = sources(2)
    # rank 0: loc 0 (row 0) is the reserved slot; loc 2 is row 1
    want = buffer.copy()
    want[1, :NOPE], want[1, NOPE:NOPE + ROPE] = nope[1], rope[1]
    assert_bits_equal(write([0, 2], 2, 0, "truncate", padding="reserved:0"), want)
    # rank 1: loc 1 is row 0 and is written; loc 0 would belong to rank 0 anyway
    want = buffer.copy()
    want[0, :NOPE], want[0, NOPE:NOPE + ROPE] = nope[0], rope[0]
    assert_bits_equal(write([1, 0], 2, 1, "truncate", padding="reserved:0"), want)
    # reserved:3 at rank 1 skips loc 3 (row 1), not loc 2 * 3 + 1 (the loc of row 3)
    want = buffer.copy()
    want[3, :NOPE], want[3, NOPE:NOPE + ROPE] = nope[1], rope[1]
    assert_bits_equal(write([3, 7], 2, 1, "floor", padding="reserved:3"), want)
    # a reserved K past the shard's locs (6 rows x 2 = 12) is not skipped, as at width 1
    with pytest.raises(ValueError, match=r"loc\[0\] = 13 .* div 2 = 6, out of range \[0, 6\) "
                                         r"under padding='reserved:13'"):
        write([13], 2, 1, "truncate", padding="reserved:13")


def test_duplicates_apply_to_rows():
    with pytest.raises(ValueError, match=r"loc writes slot 1 more than once, at positions 0, 2"):
        write([3, 2, 3], 2, 1, "truncate")
    buffer, nope, rope = sources(3)
    assert_bits_equal(write([3, 2, 5], 2, 1, "truncate"),
                      loop_dcp(buffer, np.array([3, 2, 5]), nope, rope, 2, 1, "truncate"))
    outcome = write([3, 2, 3], 2, 1, "truncate", duplicates="any")
    assert isinstance(outcome, OneOfRows) and outcome.collisions[0].positions == (0, 2)


def test_int32_minimum_and_large_locs():
    """int32: -2**31 is a multiple of 2 (rank 0 keeps it under both, as row -2**30: rejected);
    at width 3 its truncated remainder is -2 (no rank), its floor remainder 1."""
    with pytest.raises(ValueError, match=r"-2147483648 is kept by dcp_rank=0"):
        write([-2**31], 2, 0, "truncate", index_dtype=np.int32)
    assert_bits_equal(write([-2**31], 3, 0, "truncate", index_dtype=np.int32), sources(1)[0])
    with pytest.raises(ValueError, match=r"div 3 = -715827883"):
        write([-2**31], 3, 1, "floor", index_dtype=np.int32)
    assert_bits_equal(write([2**31 - 1], 3, 0, "floor", index_dtype=np.int32), sources(1)[0])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dcp_world": 0}, ValueError, r"dcp_world=0 must be >= 1"),
    ({"dcp_world": True}, TypeError, r"dcp_world=True must be an integer"),
    ({"dcp_world": 2.0}, TypeError, r"dcp_world=2.0 must be an integer"),
    ({"dcp_world": 2, "dcp_rank": 2}, ValueError, r"dcp_rank=2 must lie in \[0, dcp_world=2\)"),
    ({"dcp_world": 2, "dcp_rank": -1}, ValueError, r"dcp_rank=-1"),
    ({"dcp_rank": 1}, ValueError, r"dcp_rank=1 must lie in \[0, dcp_world=1\)"),
    ({"dcp_world": 2, "dcp_rank": "1"}, TypeError, r"dcp_rank='1' must be an integer"),
    ({"dcp_world": 2, "dcp_modulo": "python"}, ValueError, r"dcp_modulo='python' is not one of"),
])
def test_bad_dcp_arguments(kwargs, error, message):
    buffer, nope, rope = sources(1)
    with pytest.raises(error, match=message):
        set_mla_kv_buffer(buffer, np.array([1]), nope, rope, **kwargs)


# ---- the torch kernels --------------------------------------------------------------------------

def torch_inputs(count):
    rng = np.random.default_rng(count)
    buffer = torch.from_numpy(poison((ROWS, WIDTH), np.float32))
    nope, rope = (torch.from_numpy(rng.standard_normal((count, w), dtype=np.float32)) for w in (NOPE, ROPE))
    return buffer, nope, rope


def torch_call(loc, world, rank, modulo):
    """The torch kernel's shard compared whole with the loop's; None when it rejected the call,
    after checking that it wrote nothing."""
    buffer, nope, rope = torch_inputs(len(loc))
    before = buffer.clone()
    loc = torch.tensor(loc, dtype=torch.int64)
    want = loop_dcp(before.numpy(), loc.numpy(), nope.numpy(), rope.numpy(), world, rank, modulo)
    if want is None:
        with pytest.raises(ValueError, match=r"is kept by rank .* out of range \[0, 6\)"):
            tn.set_mla_kv_buffer_dcp(buffer, loc, nope, rope, dcp_world=world, dcp_rank=rank,
                                     dcp_modulo=modulo)
        assert torch.equal(buffer, before), "the kernel wrote before rejecting"
        return None
    tn.set_mla_kv_buffer_dcp(buffer, loc, nope, rope, dcp_world=world, dcp_rank=rank, dcp_modulo=modulo)
    assert np.array_equal(buffer.numpy().view(np.uint8), want.view(np.uint8))
    return buffer


def test_torch_kernel_by_hand():
    assert torch_call([5, -1], 3, 2, "truncate") is not None  # 5 is row 1; -1 goes to no rank
    assert torch_call([5, -1], 3, 2, "floor") is None  # -1 is row -1 of rank 2: rejected, unwritten
    assert torch_call([4, 12, -2], 2, 0, "truncate") is None  # 12 is row 6 of 6
    assert torch_call([-2**63, 9, 7], 4, 3, "floor") is not None  # the minimum goes to rank 0
    assert torch_call([-2**63, 9, 7], 4, 0, "truncate") is None  # ... as row -2**61


@pytest.mark.parametrize("kwargs, error, message", [
    ({"dcp_modulo": "c"}, ValueError, r"dcp_modulo='c'"),
    ({"dcp_rank": True}, TypeError, r"dcp_rank=True"),
    ({"dcp_rank": 2}, ValueError, r"need 0 <= dcp_rank < dcp_world"),
    ({"dcp_world": 0}, ValueError, r"dcp_world=0"),
])
def test_torch_kernel_bad_arguments(kwargs, error, message):
    buffer, nope, rope = torch_inputs(1)
    before = buffer.clone()
    with pytest.raises(error, match=message):
        tn.set_mla_kv_buffer_dcp(buffer, torch.tensor([1]), nope, rope, **{"dcp_world": 2, **kwargs})
    assert torch.equal(buffer, before)


@pytest.fixture(scope="module")
def kernels():
    registry = Registry()
    registry.load_plugin("oracle.kernels.torch_native:register", tn.register)
    assert not registry.errors
    return registry.kernels


DCP_KERNELS = ("torch.set_mla_kv_buffer.dcp2", "torch.set_mla_kv_buffer.dcp4_floor")


def test_dcp_kernels_declare_their_shard(kernels):
    c2, c4 = (kernels[name].contract for name in DCP_KERNELS)
    assert (c2.dcp_world, c2.dcp_rank, c2.dcp_modulo, c2.padding) == (2, 1, "truncate", "reserved:0")
    assert (c4.dcp_world, c4.dcp_rank, c4.dcp_modulo, c4.padding) == (4, 3, "floor", "none")


@pytest.mark.parametrize("name", DCP_KERNELS)
def test_dcp_kernels_pass_their_cases(name, kernels):
    statuses = {}
    for case in catalogue("set_mla_kv_buffer", "quick"):
        outcome = run_case(kernels[name], case)
        assert outcome.status in (PASS, UNDECLARED, NOT_SUPPORTED), \
            f"{name} [{case.cls}/{case.id}]: {outcome.status}\n{outcome.message}"
        # tokens whose rows are zeros hold no padding entry: apart from the padding policies' cases
        statuses.setdefault("zero_rows" if case.p.get("values") == "zero_rows" else case.cls, set()).add(outcome.status)
    assert statuses["dcp"] == {PASS} and statuses["zero_rows"] == {PASS}
    for cls in ("dtypes", "sizes", "strides", "aliasing", "bad_input"):
        assert PASS in statuses[cls], (cls, statuses[cls])
    if name.endswith("dcp2"):  # declares reserved:0, which rank 1 never sees as a kept loc
        assert PASS in statuses["padding"]
    else:
        assert statuses["padding"] == {NOT_SUPPORTED}


def test_plain_kernel_does_not_run_dcp_cases(kernels):
    case = Case.make("set_mla_kv_buffer", "dcp", dcp=True, n=133)
    outcome = run_case(kernels["torch.set_mla_kv_buffer"], case)
    assert outcome.status == NOT_SUPPORTED and "dcp_world=1" in outcome.message


# ---- the cases: what the widened locs hold ------------------------------------------------------

def contract(**fields):
    return Contract(op="set_mla_kv_buffer", name="t", backend="t", **fields)


def test_widen_at_width_one_is_the_identity():
    rng = np.random.default_rng(1)
    entries = np.arange(10, dtype=np.int64)
    assert _dcp.widen(rng, entries, contract(), "int64", negatives=True) is entries
    assert rng.integers(0, 2**62) == np.random.default_rng(1).integers(0, 2**62)  # nothing drawn


@pytest.mark.parametrize("world, rank, modulo", [(2, 1, "truncate"), (4, 3, "floor"), (4, 0, "floor"),
                                                 (3, 0, "truncate")])
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_widened_locs(world, rank, modulo, index_dtype):
    c = contract(dcp_world=world, dcp_rank=rank, dcp_modulo=modulo)
    rng = np.random.default_rng(world + rank)
    rows = rng.permutation(200)[:133].astype(np.int64)
    locs = _dcp.widen(rng, rows, c, index_dtype, negatives=True)
    info = np.iinfo(index_dtype)
    assert locs.min() >= info.min and locs.max() <= info.max
    kept, other, negative = [], [], []
    for i, value in enumerate(locs.tolist()):
        row, rem = c_divmod(value, world) if modulo == "truncate" else (value // world, value % world)
        if value < 0:
            negative.append(value)
            assert rem != rank, f"{value} is kept by rank {rank} under {modulo}: the case is illegal"
        elif rem == rank:
            kept.append(row)
            assert row == rows[i]
        else:
            other.append(i)
            assert row == rows[i]  # the same row, another rank's loc
    assert 50 <= len(other) <= 70 and len(kept) >= 40
    legal = set(_dcp.legal_negatives(c, index_dtype).tolist())
    assert set(negative) == legal and -2 in legal
    if modulo == "truncate" and rank == world - 1:
        assert -1 in legal  # what floor would keep as row -1
    assert (info.min in legal) == (c_divmod(int(info.min), world)[1] != rank if modulo == "truncate"
                                   else int(info.min) % world != rank)


def test_widen_keeps_padding_and_moves_one_row_to_the_reserved_index():
    c = contract(dcp_world=2, dcp_rank=1, padding="reserved:0")
    entries = np.array([0, 5, 0, 7, 9, 11, 13, 15], np.int64)
    locs = _dcp.widen(np.random.default_rng(3), entries, c, "int64", padding="reserved:0")
    assert locs[0] == 0 and locs[2] == 0  # padding stays: the policy compares the widened loc
    assert 1 in locs.tolist()  # local row 0 of rank 1: a kernel comparing rows with 0 skips it
    negative = _dcp.widen(np.random.default_rng(3), np.array([-1, 4, -7]), c, "int64", padding="negative")
    assert negative[0] == -1 and negative[2] == -7


# ---- engines that must fail -----------------------------------------------------------------------

def _variant(kernels, fn, name="torch.set_mla_kv_buffer.dcp2"):
    base = kernels[name]
    return Kernel(dataclasses.replace(base.contract, name=fn.__name__, backend="test"), fn, "test")


def ignores_the_rank(kv_buffer, loc, nope, rope):
    """Writes every loc's row loc // 2 that lies in the buffer, whichever rank it belongs to."""
    rows = loc.long() // 2
    keep = (loc >= 0) & (rows < kv_buffer.shape[0])
    kv_buffer[:, : nope.shape[1] + rope.shape[1]].index_put_((rows[keep],), torch.cat([nope, rope], 1)[keep])


def reserves_the_local_row(kv_buffer, loc, nope, rope):
    """Skips local row 0 instead of widened loc 0."""
    keep = (loc >= 0) & (loc % 2 == 1) & (loc // 2 != 0)
    kv_buffer[:, : nope.shape[1] + rope.shape[1]].index_put_((loc[keep].long() // 2,),
                                                              torch.cat([nope, rope], 1)[keep])


def test_a_kernel_ignoring_the_rank_fails_every_class(kernels):
    for case in (Case.make("set_mla_kv_buffer", "dtypes", dtype="bfloat16", index="int64"),
                 Case.make("set_mla_kv_buffer", "dcp", dcp=True, n=133)):
        outcome = run_case(_variant(kernels, ignores_the_rank), case)
        assert outcome.status == FAIL and "kv_buffer" in outcome.message


def test_a_kernel_reserving_the_local_row_fails_padding(kernels):
    case = Case.make("set_mla_kv_buffer", "padding", padding="reserved:0", index="int64")
    outcome = run_case(_variant(kernels, reserves_the_local_row), case)
    assert outcome.status == FAIL and "kv_buffer[0," in outcome.message


def skips_negatives_then_floor_rank0(kv_buffer, loc, nope, rope):
    keep = loc >= 0
    tn.set_mla_kv_buffer_dcp(kv_buffer, loc[keep], nope[keep], rope[keep], dcp_world=2, dcp_rank=0,
                             dcp_modulo="floor")


def test_negative_padding_is_skipped_before_the_rank(kernels):
    """Under padding="negative" the cases may hold negatives that rank 0 would keep (-2, the
    minimum); a kernel that skips them first passes, the plain floor kernel rejects them."""
    fields = dict(dcp_world=2, dcp_rank=0, dcp_modulo="floor", padding="negative")
    good = _variant(kernels, skips_negatives_then_floor_rank0)
    good = dataclasses.replace(good, contract=dataclasses.replace(good.contract, **fields))
    plain = dataclasses.replace(good, fn=functools.partial(tn.set_mla_kv_buffer_dcp, **{
        k: v for k, v in fields.items() if k != "padding"}))
    for case in (Case.make("set_mla_kv_buffer", "padding", padding="negative", index="int32"),
                 Case.make("set_mla_kv_buffer", "dcp", dcp=True, n=133)):
        assert run_case(good, case).status == PASS
        outcome = run_case(plain, case)
        assert outcome.status == FAIL and "is kept by rank 0 of 2" in outcome.message


def test_floor_modulo_mutant_dies_by_the_guard_band():
    result = self_check("quick", ["set_mla_kv_buffer.dcp_floor_modulo"])
    mutant = result.mutants[0]
    assert result.ok and set(mutant.killed_by) == {"dcp"}
    assert "guard band written" in mutant.why["dcp"] and "before the payload" in mutant.why["dcp"]
    assert result.bases[0].name == "torch.set_mla_kv_buffer.dcp2" and result.bases[0].ok
