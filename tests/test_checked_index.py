"""An index checked once for many writes (oracle.kernels.check_index, CheckedIndex).

The verdict is tested against a plain loop over the entries (hypothesis draws the indices), the
Triton kernel of the check chunk by chunk; the writers that take a CheckedIndex run on Triton's
CPU interpreter (in a subprocess), each write compared, whole cache, with an index_put_ of the same
rows into the same poisoned cache; the meta-tests give the suite writers that honour or ignore the
verdict. On a GPU: tests/test_checked_index_gpu.py.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import oracle.kernels
from oracle.kernels.checked_index import INDEX_ARGUMENTS, CheckedIndex, CheckedIndexWriter, check_index, resolve

from test_triton_kernels import run as run_interpreted

has_triton = importlib.util.find_spec("triton") is not None


def first_illegal_by_loop(values: list, num_slots: int, negative_ok: bool) -> int:
    """The reference's legality, one entry at a time: the first entry outside [0, num_slots) that
    is not a negative entry under padding="negative", else len(values)."""
    for i, v in enumerate(values):
        if v >= num_slots or (v < 0 and not negative_ok):
            return i
    return len(values)


# ================================================================ the check

@settings(max_examples=150, deadline=None)
@given(values=st.lists(st.integers(-3, 40), max_size=70), num_slots=st.integers(0, 40),
       padding=st.sampled_from(["none", "negative", "reserved:0", "reserved:7"]),
       dtype=st.sampled_from([torch.int32, torch.int64]), step=st.sampled_from([1, 2]))
def test_verdict_is_the_first_illegal_entry(values, num_slots, padding, dtype, step):
    spread = torch.full((max(1, len(values) * step),), 12345, dtype=dtype)
    spread[::step][:len(values)] = torch.tensor(values, dtype=dtype)
    index = spread[::step][:len(values)]  # a strided view when step is 2
    checked = check_index(index, num_slots, padding=padding)
    assert checked.verdict.dtype == torch.int64 and tuple(checked.verdict.shape) == (1,)
    assert int(checked.verdict) == first_illegal_by_loop(values, num_slots, padding == "negative")
    assert checked.index.is_contiguous() and checked.index.dtype == dtype
    assert checked.index.tolist() == values and len(checked) == len(values)
    assert checked.num_slots == num_slots and checked.padding == padding


def test_the_copy_is_private():
    index = torch.tensor([3, 1, 2])
    checked = check_index(index, 4)
    index[0] = 99  # the caller's tensor changes after the check
    assert checked.index.tolist() == [3, 1, 2] and int(checked.verdict) == 3
    assert checked.index.data_ptr() != index.data_ptr()


@pytest.mark.parametrize("index, num_slots, padding, error, words", [
    ([1, 2], 4, "none", TypeError, "index must be a torch.Tensor, got list"),
    (torch.tensor([1.0]), 4, "none", TypeError, "index has dtype torch.float32"),
    (torch.zeros(2, 2, dtype=torch.int64), 4, "none", ValueError, "index must be 1-D, got shape (2, 2)"),
    (torch.zeros(2, dtype=torch.int64), -1, "none", ValueError, "num_slots=-1 must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), True, "none", ValueError, "num_slots=True must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), 4.0, "none", ValueError, "num_slots=4.0 must be an int >= 0"),
    (torch.zeros(2, dtype=torch.int64), 4, "skip", ValueError, "padding='skip' is not a padding policy"),
])
def test_bad_arguments_are_named(index, num_slots, padding, error, words):
    with pytest.raises(error) as info:
        check_index(index, num_slots, padding=padding)
    assert words in str(info.value)


def test_resolve_refuses_another_cache_or_policy_and_passes_tensors_through():
    index = torch.tensor([0, 5])
    assert resolve("loc", index, 8, "none") == (index, None)
    checked = check_index(index, 8, padding="negative")
    tensor, verdict = resolve("slot_mapping", checked, 8, "negative")
    assert tensor is checked.index and verdict is checked.verdict
    with pytest.raises(ValueError, match=r"slot_mapping was checked against num_slots=8, but the cache has 16 slots"):
        resolve("slot_mapping", checked, 16, "negative")
    with pytest.raises(ValueError, match=r"loc was checked under padding='negative', but this writer's padding "
                                         r"is 'none'"):
        resolve("loc", checked, 8, "none")
    assert "num_slots=8" in repr(checked) and "padding='negative'" in repr(checked)


def test_the_public_names():
    assert oracle.kernels.CheckedIndex is CheckedIndex
    assert isinstance(oracle.kernels.check_index(torch.tensor([1]), 2), CheckedIndex)


def _op_args(op: str, n: int, num_slots: int):
    """Arguments of ``op`` in the baseline's positional convention (CPU tensors), slots legal."""
    loc = torch.randperm(num_slots)[:n]
    rows = torch.randn(n, 2, 8)
    if op == "store_cache":
        return (rows, rows, torch.zeros(num_slots, 2, 8), torch.zeros(num_slots, 2, 8), loc)
    if op == "set_mla_kv_buffer":
        return (torch.zeros(num_slots, 12), loc, torch.randn(n, 8), torch.randn(n, 4))
    if op == "concat_and_cache_mla":
        return (torch.randn(n, 8), torch.randn(n, 4), torch.zeros(num_slots // 4, 4, 12), loc, "auto",
                torch.ones(1))
    if op == "reshape_and_cache_flash":
        caches = [torch.zeros(num_slots // 4, 4, 2, 8) for _ in range(2)]
        return (rows, rows, *caches, loc, "auto", torch.ones(1), torch.ones(1))
    caches = [torch.zeros(num_slots // 4, 4, 2, 32, dtype=torch.uint8) for _ in range(4)]
    return (torch.randn(n, 2, 32), torch.randn(n, 2, 32), *caches, loc, "mxfp8_e4m3fn")


@pytest.mark.parametrize("op", sorted(INDEX_ARGUMENTS))
def test_prepare_checks_against_the_cache_the_op_writes(op):
    calls = []
    writer = CheckedIndexWriter(lambda *a, **k: calls.append((a, k)), op, "none")
    args = _op_args(op, 5, 16)
    position, _, _ = INDEX_ARGUMENTS[op]
    prepared = writer.prepare(args)
    checked = prepared[position]
    assert isinstance(checked, CheckedIndex) and checked.num_slots == 16
    assert torch.equal(checked.index, args[position]) and int(checked.verdict) == 5
    assert all(a is b for i, (a, b) in enumerate(zip(args, prepared)) if i != position)
    assert writer.prepare(prepared) == prepared  # already checked: left as it is
    writer(*args, validate="sync")
    assert isinstance(calls[0][0][position], CheckedIndex) and calls[0][1] == {"validate": "sync"}
    float_index = args[:position] + (torch.zeros(5),) + args[position + 1:]
    assert writer.prepare(float_index)[position] is float_index[position]  # the writer refuses it itself


def test_prepare_refuses_an_op_without_an_index():
    with pytest.raises(ValueError, match=r"op='quantize_fp8' has no index argument"):
        CheckedIndexWriter(print, "quantize_fp8", "none")


def test_check_index_launches_nothing_of_its_own_for_a_cpu_index():
    """On the CPU the check is torch ops: no library is loaded or compiled for it."""
    from oracle.kernels.checked_index import _fused_check
    assert _fused_check(torch.arange(4)) is None


def test_triton_copy_and_check_matches_a_plain_loop_per_chunk():
    """The Triton kernel of check_index (on GPUs without the CUDA library), on the interpreter:
    a contiguous copy of the caller's entries as they are (int32 or int64, strided or not), and a
    verdict word per chunk of 1024 entries or more (64 at most), each the first illegal entry of
    its chunk by a plain loop, at chunk edges and past 64 chunks."""
    cases = [(0, None), (1, 0), (5, 3), (1023, 1022), (1025, 1024), (3000, 2047), (3000, None),
             (70000, 69999), (70000, 1093)]
    out = run_interpreted("""
    from oracle.kernels.triton import _validate
    rows = []
    for n, bad_at, dtype, step, negative in CASES:
        g = torch.Generator().manual_seed(n)
        values = torch.randperm(4 * n + 1, generator=g)[:n] - (n // 3 if negative else 0)
        spread = torch.full((max(1, n * step),), 12345, dtype=getattr(torch, dtype))
        index = spread[::step][:n]
        index.copy_(values)
        if bad_at is not None:
            index[bad_at] = 4 * n + 7
        copy, verdict = _validate.copy_and_check(index, 4 * n + 1, negative)
        rows.append({"copy_ok": copy.is_contiguous() and copy.dtype == index.dtype and torch.equal(copy, index),
                     "private": n == 0 or copy.data_ptr() != index.data_ptr(),
                     "words": verdict.tolist(), "values": index.tolist()})
    emit(rows)
    """.replace("CASES", repr([(n, bad, dtype, step, negative) for n, bad in cases
                                for dtype, step, negative in (("int32", 2, True), ("int64", 1, False))])))
    specs = [(n, bad, dtype, step, negative) for n, bad in cases
             for dtype, step, negative in (("int32", 2, True), ("int64", 1, False))]
    for (n, _, _, _, negative), row in zip(specs, out):
        assert row["copy_ok"] and row["private"], n
        chunks = min(64, max(1, -(-n // 1024)))
        chunk = -(-n // chunks) if n else 0
        want = []
        for p in range(chunks):
            part = row["values"][p * chunk:(p + 1) * chunk]
            first = first_illegal_by_loop(part, 4 * n + 1, negative)
            want.append(p * chunk + first if first < len(part) else n)  # n: none in this chunk
        assert row["words"] == want, (n, negative)
        assert min(row["words"]) == first_illegal_by_loop(row["values"], 4 * n + 1, negative)


# ================================================================ the Triton writers, interpreted

@pytest.mark.skipif(not has_triton, reason="triton is not importable")
def test_triton_writers_take_a_checked_index():
    """Every Triton writer that takes an index, on the interpreter: a checked index writes what a
    plain one does (whole poisoned caches against index_put_); an illegal entry writes nothing and
    names the argument, entry and value; the caller's index changed after the check changes
    nothing; another cache size or policy is refused before anything is written; calls replay
    from their launch plans."""
    out = run_interpreted("""
    from oracle.kernels import check_index, DeferredSlotError
    from oracle.kernels.triton import block_ops, _plans
    torch.manual_seed(0)
    S, n = 128, 300   # 300 > the fused-check limit: a plain index would take the check grid
    results = {}

    def poisoned(*shape, dtype=torch.float32):
        return torch.full(shape, 77, dtype=dtype)

    def mla(index, buf):
        ops.set_mla_kv_buffer(buf, index, nope, rope)

    nope, rope = torch.randn(n, 8), torch.randn(n, 4)
    S4 = 4 * S
    loc = torch.randperm(S4)[:n]
    checked = check_index(loc, S4)
    want = poisoned(S4, 16); want[loc, :12] = torch.cat([nope, rope], 1)
    got = poisoned(S4, 16); mla(checked, got)
    results["mla"] = torch.equal(got, want)
    loc_after = loc.clone(); checked_after = check_index(loc_after, S4); loc_after[:] = 0
    got = poisoned(S4, 16); mla(checked_after, got)
    results["private"] = torch.equal(got, want)
    bad = loc.clone(); bad[123] = S4 + 9
    got = poisoned(S4, 16)
    try:
        mla(check_index(bad, S4), got); results["bad"] = None
    except DeferredSlotError as exc:
        results["bad"] = str(exc)
    results["bad_unchanged"] = bool(got.eq(77).all())
    short = loc[:40].clone(); short[17] = -3  # a short index: every program scans the copy itself
    got = poisoned(S4, 16)
    try:
        ops.set_mla_kv_buffer(got, check_index(short, S4), nope[:40], rope[:40]); results["short"] = None
    except DeferredSlotError as exc:
        results["short"] = str(exc)
    results["short_unchanged"] = bool(got.eq(77).all())
    got = poisoned(S4, 16)
    ops.set_mla_kv_buffer(got, check_index(loc[:40], S4), nope[:40], rope[:40])
    want = poisoned(S4, 16); want[loc[:40], :12] = torch.cat([nope[:40], rope[:40]], 1)
    results["short_legal"] = torch.equal(got, want)
    refused = []
    for other in (check_index(loc, S4 + 16), check_index(loc, S4, padding="negative")):
        got = poisoned(S4, 16)
        try:
            mla(other, got)
        except ValueError as exc:
            refused.append([str(exc), bool(got.eq(77).all())])
    results["refused"] = refused

    rows = torch.randn(n, 2, 8)
    kc, vc = poisoned(S4, 2, 8), poisoned(S4, 2, 8)
    ops.store_cache(rows, rows * 2, kc, vc, check_index(loc, S4))
    wk, wv = poisoned(S4, 2, 8), poisoned(S4, 2, 8); wk[loc] = rows; wv[loc] = rows * 2
    results["store"] = torch.equal(kc, wk) and torch.equal(vc, wv)

    sm = loc.clone(); sm[::7] = -1  # padding entries, skipped
    kc, vc = poisoned(S, 4, 2, 8), poisoned(S, 4, 2, 8)
    ops.reshape_and_cache_flash(rows, rows * 2, kc, vc, check_index(sm, S4, padding="negative"), "auto",
                                torch.ones(1), torch.ones(1))
    wk, wv = poisoned(S4, 2, 8), poisoned(S4, 2, 8)
    keep = sm >= 0
    wk[sm[keep]] = rows[keep]; wv[sm[keep]] = rows[keep] * 2
    results["paged"] = torch.equal(kc.view(S4, 2, 8), wk) and torch.equal(vc.view(S4, 2, 8), wv)

    kv = poisoned(S, 4, 12)
    ops.concat_and_cache_mla(nope, rope, kv, check_index(sm, S4, padding="negative"), "auto", torch.ones(1))
    want = poisoned(S4, 12); want[sm[keep]] = torch.cat([nope, rope], 1)[keep]
    results["concat"] = torch.equal(kv.view(S4, 12), want)

    x = torch.randn(n, 2, 32)
    caches = [torch.full((S, 4, 2, w), 0xA5, dtype=torch.uint8) for w in (32, 32, 1, 1)]
    plain = [c.clone() for c in caches]
    block_ops.reshape_and_cache_block(x, x, *caches, check_index(sm, S4, padding="negative"), "mxfp8_e4m3fn")
    block_ops.reshape_and_cache_block(x, x, *plain, sm, "mxfp8_e4m3fn")
    results["block"] = all(torch.equal(a, b) for a, b in zip(caches, plain))
    results["block_wrote"] = not torch.equal(caches[0], torch.full_like(caches[0], 0xA5))

    before = dict(_plans.stats)
    for seed in range(3):  # new CheckedIndex objects, one signature: replayed
        other = torch.randperm(S4)[:n]
        got = poisoned(S4, 16); mla(check_index(other, S4), got)
        want = poisoned(S4, 16); want[other, :12] = torch.cat([nope, rope], 1)
        results.setdefault("replays", []).append(torch.equal(got, want))
    results["replayed"] = _plans.stats["replayed"] - before["replayed"]
    emit(results)
    """)
    for key in ("mla", "private", "store", "paged", "concat", "block", "block_wrote", "bad_unchanged", "short_unchanged",
                "short_legal"):
        assert out[key] is True, key
    assert out["bad"].startswith("loc[123] = 521 is out of range [0, 512) under padding='none'"), out["bad"]
    assert out["short"].startswith("loc[17] = -3 is out of range [0, 512) under padding='none'"), out["short"]
    assert out["refused"][0] == ["loc was checked against num_slots=528, but the cache has 512 slots; check it "
                                 "against the cache it writes", True]
    assert out["refused"][1] == ["loc was checked under padding='negative', but this writer's padding is 'none'",
                                 True]
    assert out["replays"] == [True, True, True] and out["replayed"] >= 2


# ================================================================ the suite judges the checked path

def _honours_the_verdict(k, v, k_cache, v_cache, loc):
    """A store_cache that takes a CheckedIndex and does what the writers do: nothing written and an
    error naming the entry when the verdict says an entry is illegal."""
    first = int(loc.verdict.min())
    if first < len(loc):
        raise ValueError(f"loc[{first}] = {int(loc.index[first])} is out of range [0, {loc.num_slots})")
    k_cache[loc.index] = k
    v_cache[loc.index] = v


def _ignores_the_verdict(k, v, k_cache, v_cache, loc):
    """Writes the legal rows of a checked index and never looks at the verdict."""
    keep = (loc.index >= 0) & (loc.index < k_cache.shape[0])
    k_cache[loc.index[keep]] = k[keep]
    v_cache[loc.index[keep]] = v[keep]


def _writes_then_checks(k, v, k_cache, v_cache, loc):
    """Stores the legal rows first, then reads the verdict and raises: memory changed before the error."""
    _ignores_the_verdict(k, v, k_cache, v_cache, loc)
    if int(loc.verdict.min()) < len(loc):
        raise ValueError("loc holds an illegal entry")


def _checked_kernel(fn):
    from oracle.contract import Contract
    from oracle.registry import Kernel

    contract = Contract(op="store_cache", name=fn.__name__, backend="test", validates=True,
                        dtypes=("float32", "bfloat16"))
    return Kernel(contract, CheckedIndexWriter(fn, "store_cache", "none"), "test")


@pytest.mark.parametrize("fn, verdict", [(_honours_the_verdict, "pass"), (_ignores_the_verdict, "fail"),
                                         (_writes_then_checks, "fail")])
def test_the_suite_runs_bad_input_through_a_checked_index_and_catches_what_ignores_it(fn, verdict):
    """Meta-test: a ``<name>.checked_index`` registration gets its bad-input cases through
    check_index, so a writer that ignores the verdict, or stores before it reads it, fails them; the
    in-contract cases pass for all three."""
    from oracle.ops.base import Case
    from oracle.runner import run_case

    kernel = _checked_kernel(fn)
    bad = run_case(kernel, Case.make("store_cache", "bad_input", bad="out_of_range", dtype="float32",
                                     index="int64", n=33))
    assert bad.status == verdict, bad.message
    if verdict == "fail":
        assert "accepted bad input" in bad.message or "memory changed first" in bad.message
    legal = run_case(kernel, Case.make("store_cache", "dtypes", dtype="bfloat16", index="int32", n=40))
    assert legal.status == "pass", legal.message
