"""Meta-tests: the catalogue reaches what careless or clever kernels do outside the ordinary case.

Kernels that keep state between calls, take a fast path on a consecutive run of slots, round-trip
rows through another float type, address V with K's strides, drop the rows past the last whole
tile, hard-code the block size, or check only large batches. Each test builds the inputs a case
actually gets, then runs a kernel that gets it wrong: it must fail, with its cause named where the
oracle can replay one, and the torch baseline must pass the same cases.
"""

import numpy as np
import pytest
import torch

from oracle.bundle import replay, write_bundle
from oracle.buffers import Arena
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels import torch_native as tn
from oracle.ops import SPECS
from oracle.ops._build import SPECIAL_BITS
from oracle.ops._repeat import redraw_in_place
from oracle.ops.base import Case
from oracle.registry import Kernel
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, run_case

ALL = ("float32", "float16", "bfloat16", "uint8")


def kernel(op: str, fn, **fields) -> Kernel:
    return Kernel(Contract(op=op, name="reach." + fn.__name__, backend="test", **fields), fn, "test")


def baseline(op: str, **fields) -> Kernel:
    return kernel(op, getattr(tn, op), **fields)


def cases(op: str, pick, contract=None) -> list:
    return [c for c in catalogue(op, "quick", contract) if pick(c)]


# --- repeat: two calls on the same tensors ------------------------------------------------------

def test_every_op_gets_a_repeat_case_and_every_indexed_op_a_repeated_bad_one():
    for op, spec in SPECS.items():
        repeats = cases(op, lambda c: c.cls == "repeat")
        assert any(c.p.get("repeat") == "inplace" for c in repeats), op
        if "out_of_range" in spec.bad_inputs():
            assert {c.p.get("n", 133) for c in repeats if c.p.get("repeat") == "bad"} == {133, 1}, op


@pytest.mark.parametrize("op", sorted(SPECS))
def test_the_second_call_gets_every_input_redrawn_in_place_and_the_caches_as_they_were(op):
    case = next(c for c in cases(op, lambda c: c.cls == "repeat" and c.p.get("repeat") == "inplace"))
    contract = Contract(op=op, name="probe", backend="test")
    arena = Arena("cpu", case.seed)
    prepared = SPECS[op].build(case, arena, np.random.default_rng(case.seed), contract)
    prepared.before = arena.snapshot()
    pointers = [t.data_ptr() for t in prepared.args if isinstance(t, torch.Tensor)]
    redraw_in_place(SPECS[op], case, prepared, contract)
    second = arena.snapshot()
    assert [t.data_ptr() for t in prepared.args if isinstance(t, torch.Tensor)] == pointers
    for name, view in arena.views.items():
        first, now = arena.numpy_view(prepared.earlier, name), arena.numpy_view(second, name)
        if view.role == "cache":
            assert first.tobytes() == now.tobytes(), f"{op}: cache {name} changed"
        elif view.role == "scale" and view.dtype == "float32":
            assert first.tobytes() != now.tobytes(), f"{op}: scale {name} not changed"
        elif view.role in ("source", "index") and first.size > 1:
            assert first.tobytes() != now.tobytes(), f"{op}: {name} not redrawn"


_MAPPINGS = {}


def translate_keeps_its_table(mapping, loc):
    key = (mapping.data_ptr(), mapping.numel())
    table = _MAPPINGS.setdefault(key, mapping.clone())
    return tn.translate_full_to_swa(table, loc)


def test_a_translation_memoized_on_the_mapping_address_fails_its_repeat_case_with_its_cause(tmp_path):
    _MAPPINGS.clear()
    stale = kernel("translate_full_to_swa", translate_keeps_its_table, padding="negative")
    case = next(c for c in cases("translate_full_to_swa", lambda c: c.id == "repeat_inplace"))
    outcome = run_case(stale, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "stale_state", outcome.message
    assert "the second call read the first call's mapping" in outcome.message
    assert run_case(baseline("translate_full_to_swa", padding="negative"), case).status == PASS
    # the bundle replays both calls, so the stale table is reproduced on a fresh process's memo
    bundle = write_bundle(tmp_path, stale, case, outcome)
    _MAPPINGS.clear()
    passed, text = replay(bundle, stale)
    assert not passed and "entries differ" in text
    assert replay(bundle, baseline("translate_full_to_swa", padding="negative"))[0]


def checks_loc_once():
    checked = set()

    def store_cache(k, v, k_cache, v_cache, loc):
        if loc.data_ptr() not in checked:
            checked.add(loc.data_ptr())
            return tn.store_cache(k, v, k_cache, v_cache, loc)
        index = loc.long().clamp(0, k_cache.shape[0] - 1)
        k_cache[index] = k[: len(loc)]
        v_cache[index] = v[: len(loc)]
    return store_cache


def test_a_check_kept_from_the_first_call_fails_the_repeated_bad_cases():
    once = Kernel(Contract(op="store_cache", name="once", backend="test", dtypes=ALL, validates=True),
                  checks_loc_once(), "test")
    # not through torch.compile: dynamo graph-breaks at data_ptr() and the memo's set, and the
    # compiled call happens to check again
    bad = cases("store_cache", lambda c: c.p.get("repeat") == "bad" and c.p.get("torch_mode") != "compile")
    outcomes = [run_case(once, c) for c in bad]
    assert all(o.status == FAIL and o.cause["id"] == "validation_missing" for o in outcomes), outcomes
    assert "written in place into the index of a call the kernel had accepted" in outcomes[0].message
    assert all(run_case(baseline("store_cache", dtypes=ALL, validates=True), c).status == PASS for c in bad)


def test_a_first_call_failure_of_a_repeat_case_says_so_and_names_its_cause():
    def k_into_v(k, v, k_cache, v_cache, loc):
        tn.store_cache(k, k, k_cache, v_cache, loc)

    case = next(c for c in cases("store_cache", lambda c: c.id == "repeat_inplace"))
    outcome = run_case(kernel("store_cache", k_into_v, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.message.startswith("the first of the case's two calls failed")
    assert outcome.cause["id"] == "sources_swapped"


def test_a_case_that_passes_when_run_again_is_called_not_reproducible():
    calls = []

    def fails_first(k, v, k_cache, v_cache, loc):
        calls.append(1)
        tn.store_cache(k if len(calls) > 1 else v, v, k_cache, v_cache, loc)

    case = next(c for c in cases("store_cache", lambda c: c.id == "bf16-int64"))
    outcome = run_case(kernel("store_cache", fails_first, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "not_reproducible", outcome.message


def test_a_rewrite_case_changes_only_its_sources_signed_zeros_and_odd_rows_last_elements():
    from oracle.ops._repeat import first_call_inputs

    case = next(c for c in cases("store_cache", lambda c: c.id == "repeat_rewrite"))
    contract = Contract(op="store_cache", name="probe", backend="test")
    arena = Arena("cpu", case.seed)
    prepared = SPECS["store_cache"].build(case, arena, np.random.default_rng(case.seed), contract)
    first_call_inputs(case, prepared)
    prepared.before = arena.snapshot()
    redraw_in_place(SPECS["store_cache"], case, prepared, contract)
    second = arena.snapshot()
    for name, view in arena.views.items():
        first, now = arena.numpy_view(prepared.before, name), arena.numpy_view(second, name)
        if view.role != "source":
            assert first.tobytes() == now.tobytes(), name
            continue
        bits_first, bits_now = first.view(np.uint16), now.view(np.uint16)
        zero = (bits_first & 0x7FFF) == 0
        assert zero.mean() > 0.3 and (bits_first[zero] == 0x8000).any() and (bits_first[zero] == 0).any()
        # even rows: exactly the zeros changed, each to the other zero; odd rows: the last element only
        assert np.array_equal(bits_now[0::2] != bits_first[0::2], zero[0::2]), name
        assert np.all(bits_now[0::2][zero[0::2]] == bits_first[0::2][zero[0::2]] ^ 0x8000)
        changed = bits_now[1::2] != bits_first[1::2]
        assert changed[:, -1, -1].all() and changed.sum() == changed.shape[0], name


def skips_what_compares_equal(k, v, k_cache, v_cache, loc):
    for src, cache in ((k, k_cache), (v, v_cache)):
        index = loc.long()
        old, new = cache[index], src[: len(loc)]
        cache[index] = torch.where(old != new, new, old)


def skips_rows_whose_first_bytes_match(k, v, k_cache, v_cache, loc):
    for src, cache in ((k, k_cache), (v, v_cache)):
        for row, slot in enumerate(loc.tolist()):
            head = lambda t: t.reshape(-1)[:8].contiguous().view(torch.uint8)  # noqa: E731
            if not torch.equal(head(cache[slot]), head(src[row])):
                cache[slot] = src[row]


@pytest.mark.parametrize("writer", [skips_what_compares_equal, skips_rows_whose_first_bytes_match])
def test_a_rewrite_that_skips_what_the_cache_already_holds_is_caught_and_named(writer):
    """The ordinary cases write over poison, so nothing compares equal there: only the rewrite
    case reaches these kernels."""
    case = next(c for c in cases("store_cache", lambda c: c.id == "repeat_rewrite"))
    outcome = run_case(kernel("store_cache", writer, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "equal_values_skipped", outcome.message
    if writer is skips_what_compares_equal:
        assert "cannot tell -0 from +0" in outcome.cause["text"]
    else:
        assert "part of the row" in outcome.cause["text"]
    assert run_case(baseline("store_cache", dtypes=ALL), case).status == PASS
    ordinary = next(c for c in cases("store_cache", lambda c: c.id == "repeat_inplace"))
    assert run_case(kernel("store_cache", writer, dtypes=ALL), ordinary).status == PASS


def test_an_fp8_writer_that_skips_codes_equal_as_floats_is_caught_and_named():
    from oracle.reference.fp8 import dequantize

    def skips_equal_codes(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale):
        fresh = [key_cache.clone(), value_cache.clone()]
        tn.reshape_and_cache_flash(key, value, *fresh, slots, kv_cache_dtype, k_scale, v_scale)
        for cache, new in zip((key_cache, value_cache), fresh):
            as_float = lambda t: torch.from_numpy(dequantize(t.view(torch.uint8).numpy(), "e4m3fn"))  # noqa: E731
            cache.copy_(torch.where(as_float(cache) != as_float(new), new, cache))

    case = next(c for c in cases("reshape_and_cache_flash", lambda c: c.id == "e4m3fn-repeat_rewrite"))
    outcome = run_case(kernel("reshape_and_cache_flash", skips_equal_codes, fp8_formats=("e4m3fn",)), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "equal_values_skipped", outcome.message
    assert "cannot tell -0 from +0" in outcome.cause["text"]


def _scaled_even_unquantized(op):
    """A writer of ``op`` whose unquantized ("auto") path divides by its scale, as its fp8 path does."""
    def per_head(scale):
        return scale.reshape(-1, 1) if scale.numel() > 1 else scale

    if op == "reshape_and_cache_flash":
        def writer(key, value, key_cache, value_cache, slots, kv_cache_dtype, k_scale, v_scale):
            if kv_cache_dtype == "auto":
                key = (key.float() / per_head(k_scale)).to(key.dtype)
                value = (value.float() / per_head(v_scale)).to(value.dtype)
            return tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slots, kv_cache_dtype,
                                              k_scale, v_scale)
    else:
        def writer(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
            if kv_cache_dtype == "auto":
                kv_c, k_pe = ((t.float() / scale).to(t.dtype) for t in (kv_c, k_pe))
            return tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    return writer


@pytest.mark.parametrize("op", ["reshape_and_cache_flash", "concat_and_cache_mla"])
def test_an_unquantized_write_under_scales_it_must_ignore_catches_a_scaled_copy(op):
    """Unquantized cases under scale 1 cannot tell; the fp8 class gives "auto" its other scales."""
    picked = cases(op, lambda c: not c.p.get("fp8") and not c.p.get("bad") and c.p.get("scale") not in (None, "1.0"))
    assert {c.p["scale"] for c in picked} == set(SPECS[op].fp8_scales[1:])
    scaled = kernel(op, _scaled_even_unquantized(op))
    for case in picked:
        outcome = run_case(scaled, case)
        assert outcome.status == FAIL and outcome.cause["id"] == "scale_applied_unquantized", outcome.message
        assert run_case(baseline(op), case).status == PASS


def test_an_out_addressed_with_the_sources_strides_is_named():
    def one_offset_for_both(out, x, scale, fmt):
        codes = torch.empty_like(out)
        tn.quantize_fp8(codes, x, scale, fmt)
        memory = out.as_strided((out.untyped_storage().nbytes(),), (1,), 0)
        offsets = sum(torch.arange(size).reshape([-1] + [1] * (x.dim() - 1 - axis)) * stride
                      for axis, (size, stride) in enumerate(zip(x.shape, x.stride())))
        memory[(offsets + out.storage_offset()).reshape(-1)] = codes.reshape(-1)

    case = next(c for c in cases("quantize_fp8", lambda c: c.id == "padded_src"))
    outcome = run_case(kernel("quantize_fp8", one_offset_for_both, fp8_formats=("e4m3fn",)), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "cache_strides_swapped", outcome.message
    assert "out addressed with the source x's strides" in outcome.cause["text"]


def test_words_stored_in_the_other_byte_order_are_named():
    def big_endian_halves(k, v, k_cache, v_cache, loc):
        tn.store_cache(k, v, k_cache, v_cache, loc)
        for cache in (k_cache, v_cache):
            rows = cache[loc.long()].contiguous()
            cache[loc.long()] = rows.view(torch.uint8).reshape(-1, 2).flip(-1).reshape(rows.shape[:-1] + (-1,)).view(
                cache.dtype)

    case = next(c for c in cases("store_cache", lambda c: c.id == "int32-N133"))
    outcome = run_case(kernel("store_cache", big_endian_halves), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "byte_order_reversed", outcome.message
    assert "every aligned 2-byte word reversed" in outcome.cause["text"]


# --- slots a prefill writes: one consecutive run --------------------------------------------------

def copies_a_slab_when_the_ends_are_consecutive(k, v, k_cache, v_cache, loc):
    n = loc.shape[0]
    if n > 1 and int(loc[-1]) - int(loc[0]) == n - 1:  # "contiguous": one slab copy
        k_cache[int(loc[0]): int(loc[0]) + n] = k[:n]
        v_cache[int(loc[0]): int(loc[0]) + n] = v[:n]
        return None
    return tn.store_cache(k, v, k_cache, v_cache, loc)


def test_a_run_of_slots_has_consecutive_ends_but_not_order():
    runs = cases("store_cache", lambda c: c.p.get("slots") == "run")
    assert {c.p["n"] for c in runs} == {133, 4096}
    for case in runs:
        arena = Arena("cpu", case.seed)
        contract = Contract(op="store_cache", name="probe", backend="test")
        loc = SPECS["store_cache"].build(case, arena, np.random.default_rng(case.seed), contract).args[4]
        entries = loc.long().numpy()
        assert entries[-1] - entries[0] == len(entries) - 1 and not (np.diff(entries) == 1).all()
        assert sorted(entries.tolist()) == list(range(entries[0], entries[-1] + 1))


def test_a_slab_copy_on_consecutive_ends_fails_the_run_cases_and_names_the_run():
    slab = kernel("store_cache", copies_a_slab_when_the_ends_are_consecutive, dtypes=ALL)
    runs = cases("store_cache", lambda c: c.p.get("slots") == "run")
    outcomes = [run_case(slab, c) for c in runs]
    assert all(o.status == FAIL for o in outcomes), [o.message for o in outcomes]
    assert all(o.cause and o.cause["id"] == "index_assumed_consecutive" for o in outcomes), outcomes[0].message
    assert all(run_case(baseline("store_cache", dtypes=ALL), c).status == PASS for c in runs)


# --- rows copied as bits ----------------------------------------------------------------------------

def through_float32(k, v, k_cache, v_cache, loc):
    """Rows converted to float32 and back on the way (bit patterns a float type cannot hold, NaN
    payloads and signalling NaNs, come out changed)."""
    tn.store_cache(k.float().to(k.dtype), v.float().to(v.dtype), k_cache, v_cache, loc)


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_bit_pattern_cases_hold_every_special_pattern_and_catch_a_round_trip(dtype):
    case = Case.make("store_cache", "dtypes", dtype=dtype, values="bits")
    assert case in catalogue("store_cache", "quick")
    arena = Arena("cpu", case.seed)
    contract = Contract(op="store_cache", name="probe", backend="test")
    k = SPECS["store_cache"].build(case, arena, np.random.default_rng(case.seed), contract).args[0]
    width = {"float32": np.uint32, "float16": np.uint16, "bfloat16": np.uint16}[dtype]
    first = k.reshape(k.shape[0], -1)[0].view(torch.int16 if width is np.uint16 else torch.int32).numpy()
    assert [int(x) & (2 ** (8 * np.dtype(width).itemsize) - 1) for x in first[: len(SPECIAL_BITS[dtype])]] == \
        list(SPECIAL_BITS[dtype])
    if dtype != "float32":  # a float32 round trip keeps every float32 pattern on this CPU but NaN quieting
        outcome = run_case(kernel("store_cache", through_float32, dtypes=ALL), case)
        assert outcome.status == FAIL and outcome.cause["id"] == "nan_bits_changed", outcome.message
    assert run_case(baseline("store_cache", dtypes=ALL), case).status == PASS


def cuda_canonical_nan(k, v, k_cache, v_cache, loc):
    """Rows through float registers and back with CUDA's conversions: every NaN written as 0x7FFF
    (16-bit) or 0x7FFFFFFF (float32), sign and payload lost."""
    def canonical(x):
        bits = {2: torch.int16, 4: torch.int32}[x.element_size()]
        return torch.where(x.isnan(), torch.full_like(x.view(bits), torch.iinfo(bits).max).view(x.dtype), x)

    tn.store_cache(canonical(k), canonical(v), k_cache, v_cache, loc)


def cleared_then_added(k, v, k_cache, v_cache, loc):
    """The rows cleared, then the sources added in (index_fill_ and index_add_, a "deterministic
    scatter"): 0 + x, so -0 becomes +0 and NaNs come out of the float unit quieted."""
    for src, cache in ((k, k_cache), (v, v_cache)):
        cache.index_fill_(0, loc.long(), 0)
        cache.index_add_(0, loc.long(), src[: loc.shape[0]].contiguous())


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_a_copy_by_float_addition_is_named(dtype):
    """The raw-bit values (NaNs and -0 among them) catch it, and it is named by the sum."""
    case = Case.make("store_cache", "dtypes", dtype=dtype, values="bits")
    outcome = run_case(kernel("store_cache", cleared_then_added, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "copied_through_arithmetic", outcome.message
    assert "-0 written as +0" in outcome.cause["text"]


@pytest.mark.parametrize("dtype", ("float32", "float16", "bfloat16"))
def test_cudas_canonical_nan_in_a_copy_is_named(dtype):
    case = Case.make("store_cache", "dtypes", dtype=dtype, values="bits")
    outcome = run_case(kernel("store_cache", cuda_canonical_nan, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "nan_bits_changed", outcome.message
    assert "every bit but the sign set" in outcome.cause["text"], outcome.cause


def whole_vectors_only(k, v, k_cache, v_cache, loc):
    """Each row copied in whole 16-byte vectors, no tail loop: the last bytes of an odd row never written."""
    whole = k[0].numel() * k.element_size() // 16 * 16 // k.element_size()
    flat = lambda t: t.reshape(t.shape[0], -1)[:, :whole]  # noqa: E731
    tn.store_cache(flat(k), flat(v), flat(k_cache), flat(v_cache), loc)


def test_an_odd_row_catches_a_copy_without_a_tail_loop_and_names_it():
    odd = cases("store_cache", lambda c: c.cls == "sizes" and c.p.get("shape") in ((1, 46), (1, 97)))
    outcomes = [run_case(kernel("store_cache", whole_vectors_only, dtypes=ALL), c) for c in odd]
    assert odd and all(o.status == FAIL and o.cause["id"] == "row_tail_dropped" for o in outcomes), outcomes


# --- K's strides for V, tiles, block sizes, small batches -------------------------------------------

def v_with_k_strides(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache.as_strided(v_cache.shape, k_cache.stride(), v_cache.storage_offset()), loc)


def test_unequal_caches_catch_v_addressed_with_k_strides():
    unequal = cases("store_cache", lambda c: c.p.get("cache") == "unequal")
    assert unequal
    wrong = kernel("store_cache", v_with_k_strides, dtypes=ALL)
    outcomes = [run_case(wrong, c) for c in unequal]
    assert all(o.status == FAIL and o.cause["id"] == "cache_strides_swapped" for o in outcomes), outcomes
    assert all(run_case(baseline("store_cache", dtypes=ALL), c).status == PASS for c in unequal)


def dense_path_on_k_strides(key, value, key_cache, value_cache, slot_mapping, *rest):
    """Takes its dense path when key_cache is contiguous, and then treats value_cache as dense."""
    if key_cache.is_contiguous() and not value_cache.is_contiguous():
        value_cache = value_cache.as_strided(value_cache.shape, key_cache.stride(), value_cache.storage_offset())
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, *rest)


def test_a_dense_fast_path_chosen_on_k_alone_fails_the_unequal_paged_cases():
    unequal = cases("reshape_and_cache_flash", lambda c: c.p.get("cache") == "unequal")
    wrong = kernel("reshape_and_cache_flash", dense_path_on_k_strides, padding="negative")
    assert unequal and all(run_case(wrong, c).status == FAIL for c in unequal)


def test_a_kernel_declaring_shared_cache_strides_is_not_given_caches_of_different_strides():
    different = cases("reshape_and_cache_flash", lambda c: c.p.get("cache") in ("padded", "unequal"))
    same = cases("reshape_and_cache_flash", lambda c: c.p.get("cache") in ("aliased", "offset"))
    declared = kernel("reshape_and_cache_flash", dense_path_on_k_strides, padding="negative",
                      shared_cache_strides=True)
    outcomes = [run_case(declared, c) for c in different]
    assert different and all(o.status == NOT_SUPPORTED and "shared_cache_strides" in o.message for o in outcomes)
    assert same and all(run_case(declared, c).status == PASS for c in same)


def test_n_4099_catches_a_grid_that_drops_the_rows_past_its_last_tile():
    def bulk(k, v, k_cache, v_cache, loc):
        n = loc.shape[0]
        keep = n if n < 1024 else n - n % 8
        tn.store_cache(k[:keep], v[:keep], k_cache, v_cache, loc[:keep])

    case = next(c for c in cases("store_cache", lambda c: c.id == "int32-N4099"))
    outcome = run_case(kernel("store_cache", bulk, dtypes=ALL), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "rows_dropped", outcome.message
    assert "the last 3 entries of loc not written" in outcome.message
    assert run_case(kernel("store_cache", bulk, dtypes=ALL),
                    next(c for c in cases("store_cache", lambda c: c.id == "int32-N4096"))).status == PASS


def blocks_of_16(key, value, key_cache, value_cache, slot_mapping, *rest):
    """Slot s at block s >> 4, token s & 15, in the caches' own block stride: blocks of 16 tokens
    whatever the cache's block size (the slots past 16 blocks are dropped: it bounds-checks)."""
    blocks = key_cache.shape[0]
    views = [c.as_strided((blocks, 16) + c.shape[2:], c.stride(), c.storage_offset()) for c in (key_cache, value_cache)]
    tn.reshape_and_cache_flash(key, value, views[0], views[1],
                               torch.where(slot_mapping < blocks * 16, slot_mapping, -1), *rest)


def test_block_sizes_5_32_and_64_catch_a_hard_coded_16():
    shaped = cases("reshape_and_cache_flash", lambda c: len(c.p.get("shape", ())) == 3)
    assert {c.p["shape"][2] for c in shaped} == {5, 32, 64}
    wrong = kernel("reshape_and_cache_flash", blocks_of_16, padding="negative", dtypes=("bfloat16",))
    # (blocks of 5 catch it too, but this emulation cannot address 16-token blocks in a 5-token cache)
    outcomes = [run_case(wrong, c) for c in shaped if c.p.get("dtype", "bfloat16") == "bfloat16" and c.p["shape"][2] > 16]
    assert outcomes and all(o.status == FAIL and o.cause["id"] == "block_size_hardcoded" for o in outcomes), \
        [o.message for o in outcomes]
    assert all(run_case(baseline("reshape_and_cache_flash", padding="negative"), c).status == PASS for c in shaped)


def checks_only_large_batches(k, v, k_cache, v_cache, loc):
    if loc.shape[0] > 32:
        return tn.store_cache(k, v, k_cache, v_cache, loc)
    k_cache[loc.long().clamp(0, k_cache.shape[0] - 1)] = k[: len(loc)]
    v_cache[loc.long().clamp(0, v_cache.shape[0] - 1)] = v[: len(loc)]


def test_an_illegal_slot_in_a_decode_step_is_a_bad_input_case():
    decode = cases("store_cache", lambda c: c.cls == "bad_input" and c.p.get("n") == 1)
    assert decode
    wrong = kernel("store_cache", checks_only_large_batches, dtypes=ALL, validates=True)
    assert all(run_case(wrong, c).status == FAIL for c in decode)
    assert run_case(wrong, next(c for c in cases("store_cache", lambda c: c.id == "bad_out_of_range"))).status == PASS


def test_a_translation_that_clamps_minus_one_to_slot_zero_is_named():
    def clamps(mapping, loc):
        return mapping[loc.long().clamp(min=0)].to(mapping.dtype)

    case = next(c for c in cases("translate_full_to_swa", lambda c: c.id == "int64-int64"))
    outcome = run_case(kernel("translate_full_to_swa", clamps, padding="negative"), case)
    assert outcome.status == FAIL and outcome.cause["id"] == "padding_policy", outcome.message
    assert "-1 entries clamped to slot 0" in outcome.message


def flattens_a_scalar_loc(mapping, loc):
    return tn.translate_full_to_swa(mapping, loc).reshape(-1)


def test_a_zero_d_loc_catches_a_translation_that_returns_a_1_d_result():
    scalar = cases("translate_full_to_swa", lambda c: len(c.p.get("shape", ())) > 2 and c.p["shape"][2] == 0)
    assert scalar
    for case in scalar:
        outcome = run_case(kernel("translate_full_to_swa", flattens_a_scalar_loc, padding="negative"), case)
        assert outcome.status == FAIL and "returned shape (1,); expected ()" in outcome.message
        assert run_case(baseline("translate_full_to_swa", padding="negative"), case).status == PASS


def reads_k_pe_after_kv_c(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """A fused-row fast path: a strided kv_c taken as the first part of one latent row, so k_pe is
    read right after it through kv_c's pointer and stride."""
    if kv_c.stride(0) > kv_c.shape[1]:
        k_pe = kv_c.as_strided(k_pe.shape, (kv_c.stride(0), 1), kv_c.storage_offset() + kv_c.shape[1])
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)


def test_a_gap_between_fused_sources_catches_a_kernel_that_assumes_them_adjacent():
    gapped = cases("concat_and_cache_mla", lambda c: c.p.get("src") == "gapped")
    fused = cases("concat_and_cache_mla", lambda c: c.p.get("src") == "fused")
    wrong = kernel("concat_and_cache_mla", reads_k_pe_after_kv_c, padding="negative")
    assert fused and all(run_case(wrong, c).status == PASS for c in fused)  # adjacent: right by luck
    outcomes = [run_case(wrong, c) for c in gapped]
    assert gapped and all(o.status == FAIL and o.cause["id"] == "sources_assumed_adjacent" for o in outcomes)
    assert all(run_case(baseline("concat_and_cache_mla", padding="negative"), c).status == PASS for c in gapped)


def out_written_packed(out, x, scale, fmt):
    packed = torch.empty(out.shape, dtype=out.dtype)
    tn.quantize_fp8(packed, x, scale, fmt)
    out.as_strided((out.numel(),), (1,)).copy_(packed.reshape(-1))  # from out's data pointer, packed


def test_a_padded_out_catches_a_quantizer_that_writes_packed_rows():
    padded = cases("quantize_fp8", lambda c: c.p.get("cache") == "padded")
    fields = dict(fp8_formats=("e4m3fn", "e5m2"), fp8_preset=tn._torch_fp8_preset())
    outcomes = [run_case(kernel("quantize_fp8", out_written_packed, **fields), c) for c in padded]
    assert padded and all(o.status == FAIL and o.cause["id"] == "dense_cache_assumed" for o in outcomes), outcomes
    assert all(run_case(baseline("quantize_fp8", **fields), c).status == PASS for c in padded)


def drops_the_head_tail(key, value, key_cache, value_cache, slot_mapping, *rest):
    """A vector loop of 8 elements along D with no tail: the last D % 8 elements never written."""
    main = key.shape[-1] // 8 * 8
    tn.reshape_and_cache_flash(key[..., :main], value[..., :main], key_cache[..., :main], value_cache[..., :main],
                               slot_mapping, *rest)


def test_a_paged_writer_without_a_tail_loop_is_named():
    odd = cases("reshape_and_cache_flash", lambda c: c.cls == "sizes" and c.p.get("shape") in ((1, 46), (8, 96), (1, 97)))
    outcomes = [run_case(kernel("reshape_and_cache_flash", drops_the_head_tail, padding="negative"), c) for c in odd]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause["id"] == "row_tail_dropped" for o in failed), [o.message for o in failed]


def blocks_of_a_power_of_two(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """Block and offset by a shift and mask of the power of two below the block size (slot >> 2,
    slot & 3 for blocks of 5), block indices past the cache dropped."""
    block = 1 << (kv_cache.shape[1].bit_length() - 1)
    staged = torch.full((kv_cache.shape[0] * block,) + kv_cache.shape[2:], 0, dtype=kv_cache.dtype)
    slots = torch.where(slot_mapping < staged.shape[0], slot_mapping, -1)
    written = torch.zeros(staged.shape[0], dtype=torch.bool)
    tn.concat_and_cache_mla(kv_c, k_pe, staged.view(kv_cache.shape[0], block, -1), slots, kv_cache_dtype, scale)
    written[slots[slots >= 0].long()] = True
    for s in torch.nonzero(written).flatten().tolist():
        kv_cache[s // block, s % block] = staged[s]


def test_a_block_size_rounded_to_a_power_of_two_is_named():
    odd = cases("concat_and_cache_mla", lambda c: len(c.p.get("shape", ())) > 2 and c.p["shape"][2] & (c.p["shape"][2] - 1))
    outcomes = [run_case(kernel("concat_and_cache_mla", blocks_of_a_power_of_two, padding="negative"), c) for c in odd]
    assert odd and all(o.status == FAIL and o.cause["id"] == "block_size_power_of_two" for o in outcomes), \
        [o.message for o in outcomes]


def shift_and_mask_disagree(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """The block by slot // block_size, the token by slot & (p - 1) with p the power of two
    below the block size (one half of a shift-and-mask pair updated for blocks of 5)."""
    block_size = kv_cache.shape[1]
    mask = (1 << (block_size.bit_length() - 1)) - 1
    slots = slot_mapping.long()
    landed = torch.where(slots < 0, -1, slots // block_size * block_size + (slots & mask))
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, landed.to(slot_mapping.dtype), kv_cache_dtype, scale)


def test_a_shift_and_mask_that_disagree_are_named():
    odd = cases("concat_and_cache_mla", lambda c: len(c.p.get("shape", ())) > 2 and c.p["shape"][2] & (c.p["shape"][2] - 1))
    outcomes = [run_case(kernel("concat_and_cache_mla", shift_and_mask_disagree, padding="negative"), c)
                for c in odd]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause["id"] == "block_size_power_of_two" and "disagree" in o.cause["text"]
                          for o in failed), [o.message for o in failed]


def one_row_width(k, v, k_cache, v_cache, loc):
    """One row width for both, the narrower one (as a kernel that sizes its copy from one of its
    sources): the wider source's rows copied only that far, from its row starts."""
    width = min(k.shape[1] * k.shape[2], v.shape[1] * v.shape[2])
    for src, cache in ((k, k_cache), (v, v_cache)):
        for i, slot in enumerate(loc.tolist()):
            if slot >= 0:
                row = torch.as_strided(src, (width,), (1,), src.storage_offset() + i * src.stride(0))
                torch.as_strided(cache, (width,), (1,), cache.storage_offset() + slot * cache.stride(0)).copy_(row)


def test_one_row_width_for_k_and_v_is_caught_and_named():
    odd = cases("store_cache", lambda c: len(c.p.get("shape", ())) == 3)
    outcomes = [run_case(kernel("store_cache", one_row_width), c) for c in odd]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "cache_strides_swapped" and "row width" in o.cause["text"]
                          for o in failed), [o.message[-800:] for o in outcomes]


def rope_at_aligned_offset(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """nope's end rounded up to 16 bytes for rope's offset (a vectorized store's alignment), rope
    written there, row by row (in rows of 97 + 31 of 141 elements it fits; in rows of 97 + 31 it
    runs into the next row, and from the last row into the guard band)."""
    nope_w, rope_w = cache_k_nope.shape[1], cache_k_rope.shape[1]
    itemsize = kv_buffer.element_size()
    at = -(-nope_w * itemsize // 16) * 16 // itemsize
    for i, slot in enumerate(loc.tolist()):
        kv_buffer[slot, :nope_w] = cache_k_nope[i]
        start = kv_buffer.storage_offset() + slot * kv_buffer.stride(0) + at
        torch.as_strided(kv_buffer, (rope_w,), (1,), start).copy_(cache_k_rope[i])


def test_rope_at_an_aligned_offset_is_named():
    contract = kernel("set_mla_kv_buffer", rope_at_aligned_offset, aliased_caches=False)
    odd = cases("set_mla_kv_buffer", lambda c: c.p.get("shape") in ((97, 31, 141), (97, 31), (511, 65))
                and c.p.get("dtype", "bfloat16") == "bfloat16", contract.contract)
    outcomes = [run_case(contract, c) for c in odd]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "part_misplaced" and "rounded up to 16 bytes" in o.cause["text"]
                          for o in failed), [o.message[-800:] for o in outcomes]


def one_past_each_row(k, v, k_cache, v_cache, loc):
    """A copy loop with an inclusive bound: each row's elements 0..width, the last read past the
    source row and written past the cache row (into the next slot's first element)."""
    for src, cache in ((k, k_cache), (v, v_cache)):
        width = src.shape[1] * src.shape[2]
        for i, slot in enumerate(loc.tolist()):
            row = torch.as_strided(src, (width + 1,), (1,), src.storage_offset() + i * src.stride(0))
            torch.as_strided(cache, (width + 1,), (1,), cache.storage_offset() + slot * cache.stride(0)).copy_(row)


def test_an_inclusive_loop_bound_is_named():
    picked = cases("store_cache", lambda c: c.cls == "sizes" and c.p.get("shape") in ((1, 46), (1, 97)))
    outcomes = [run_case(kernel("store_cache", one_past_each_row), c) for c in picked]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "row_overrun" and "inclusive" in o.cause["text"]
                          for o in failed), [o.message[-800:] for o in outcomes]


def one_byte_past_each_tail(k, v, k_cache, v_cache, loc):
    """A byte copier: whole 16-byte vectors, then a tail loop with an inclusive bound (j <=
    row_bytes) where a row has a tail, so one byte past such a row is read and written."""
    for src, cache in ((k, k_cache), (v, v_cache)):
        row_bytes = src.shape[1] * src.shape[2] * src.element_size()
        length = row_bytes + (row_bytes % 16 != 0)
        for i, slot in enumerate(loc.tolist()):
            row = torch.as_strided(src.view(torch.uint8), (length,), (1,),
                                   (src.storage_offset() + i * src.stride(0)) * src.element_size())
            torch.as_strided(cache.view(torch.uint8), (length,), (1,),
                             (cache.storage_offset() + slot * cache.stride(0)) * cache.element_size()).copy_(row)


def test_a_byte_loop_one_past_the_row_is_named():
    picked = cases("store_cache", lambda c: c.cls == "sizes" and c.p.get("shape") in ((1, 46), (1, 64, 97))
                   and c.p.get("dtype", "bfloat16") == "bfloat16")
    outcomes = [run_case(kernel("store_cache", one_byte_past_each_tail), c) for c in picked]
    failed = [o for o in outcomes if o.status == FAIL]
    assert len(failed) == len(picked) >= 2, [o.message[-800:] for o in outcomes]
    assert all(o.cause and o.cause["id"] == "row_overrun" and "one byte past" in o.cause["text"]
               for o in failed), [o.message[-800:] for o in failed]


def k_pe_at_the_source_stride(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """k_pe written at element kv_c.stride(0) of the entry (the source's row stride taken for its
    width), entry by entry: with fused sources past the entry's end, into the next one."""
    rank, width = kv_c.shape[1], kv_cache.shape[-1]
    at = kv_c.stride(0)
    for i, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, token = divmod(slot, kv_cache.shape[1])
        kv_cache[block, token, :rank] = kv_c[i]
        start = kv_cache.storage_offset() + block * kv_cache.stride(0) + token * kv_cache.stride(1) + at
        torch.as_strided(kv_cache, (k_pe.shape[1],), (1,), start).copy_(k_pe[i])


def test_k_pe_at_the_source_stride_is_named():
    contract = kernel("concat_and_cache_mla", k_pe_at_the_source_stride, aliased_caches=False, padding="negative",
                      dtypes=("bfloat16",), index_dtypes=("int64",))
    fused = cases("concat_and_cache_mla", lambda c: c.p.get("src") in ("fused", "gapped"), contract.contract)
    outcomes = [run_case(contract, c) for c in fused]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "part_misplaced" and "row stride" in o.cause["text"]
                          for o in failed), [o.message[-800:] for o in outcomes]


def index_offset_twice(k, v, k_cache, v_cache, loc):
    """The index's pointer taken as data_ptr() + storage_offset() * itemsize: its storage offset
    counted twice (read as the view at twice its offset, where its storage reaches that far)."""
    twice = torch.as_strided(loc, loc.shape, loc.stride(), 2 * loc.storage_offset())
    for i, slot in enumerate(twice.tolist()):
        if 0 <= slot < k_cache.shape[0]:
            k_cache[slot], v_cache[slot] = k[i], v[i]


def test_an_index_offset_counted_twice_is_named():
    picked = cases("store_cache", lambda c: c.cls in ("sizes", "strides") and 0 < c.p.get("n", 133) < 1000
                   and c.p.get("slots") != "past_float")  # 2**24 slots: the same misread, a slow diagnosis
    outcomes = [run_case(kernel("store_cache", index_offset_twice, duplicates="any"), c) for c in picked]
    failed = [o for o in outcomes if o.status == FAIL]
    assert len(failed) >= 5, [o.message[-300:] for o in outcomes]
    assert all(o.cause and o.cause["id"] == "index_offset_ignored" and "twice" in o.cause["text"]
               for o in failed), [o.message[-600:] for o in failed if not o.cause or "twice" not in o.cause["text"]]


# --- source layouts a careless kernel misreads, and slot numbers past 2**16 --------------------

def _built(op: str, pick):
    case = cases(op, pick)[0]
    contract = Contract(op=op, name="probe", backend="test")
    return SPECS[op].build(case, Arena("cpu", case.seed), np.random.default_rng(case.seed), contract)


@pytest.mark.parametrize("op", ["store_cache", "reshape_and_cache_flash"])
def test_interleaved_sources_have_their_heads_apart_inside_each_row(op):
    prepared = _built(op, lambda c: c.p.get("src") == "interleaved")
    k = prepared.args[0]
    heads, dim = k.shape[1:]
    assert k.stride() == (heads * 3 * dim, 3 * dim, 1)
    assert prepared.args[1].data_ptr() - k.data_ptr() == dim * k.element_size()  # V's heads follow K's


def test_mla_sources_come_as_unsqueezed_slices_of_the_fused_row():
    prepared = _built("set_mla_kv_buffer", lambda c: c.p.get("src") == "fused_unsqueezed")
    for source in prepared.args[2:]:
        assert source.dim() == 3 and source.shape[1] == 1
        assert source.stride(1) == source.shape[2] != source.stride(0)  # unsqueeze(1)'s stride, not the row's


def test_the_wide_paged_case_writes_slots_past_two_to_the_sixteen_in_blocks_of_five():
    prepared = _built("reshape_and_cache_flash", lambda c: c.p.get("wide"))
    assert prepared.args[2].shape[1] == 5
    slots = prepared.args[4]
    assert int(((slots >= 1 << 16) & (slots % 5 == 4)).sum()) >= 10  # each a last token of its block
