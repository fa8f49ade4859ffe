"""Meta-tests of the diagnosis: a failure names the cause that holds, byte for byte, and only then.

Every mutant fails every class that should catch it, and each such failure names its own bug; correct kernels never get a
cause; a failure no hypothesis explains is described by its pattern; the cause reaches the JSON
report and JUnit; and nothing is diagnosed for a passing case.
"""

import json
from dataclasses import replace
import xml.etree.ElementTree as ET

import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.diagnose import CAUSES, Hypothesis
from oracle.kernels import torch_native as tn
from oracle.mutants import MUTANTS, mutant_contract
from oracle.registry import Kernel, default_registry
from oracle.runner import FAIL, NOT_SUPPORTED, PASS, UNDECLARED, run_case

from test_run_and_report import oracle

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # fp8 special values overflow


def named(outcome) -> set:
    cause = outcome.cause or {}
    return {cause.get("id")} | {c["id"] for c in cause.get("also", [])}


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.short)
def test_every_expected_class_kills_the_mutant_and_every_failure_names_its_own_cause(mutant):
    """The quick profile's cases of each class a mutant names: every class fails it, and every
    failure names the mutant's own bug. (That each kill is real, on a case the kernel it mutates
    passes under the same contract, is test_mutants.py's test_base_passes_every_case.)"""
    kernel = Kernel(mutant_contract(mutant), mutant.fn, "test")
    failures, killed_by = {}, set()
    for case in catalogue(mutant.op, "quick"):
        if case.cls in mutant.catches:
            outcome = run_case(kernel, case)
            if outcome.status == FAIL:
                failures[case.id] = outcome
                killed_by.add(case.cls)
    missed = [c for c in mutant.catches if c not in killed_by]
    assert not missed, f"{mutant.name} survived the quick profile's {missed} ({mutant.bug})"
    wrong = {cid: (o.cause or {}).get("id") for cid, o in failures.items() if mutant.cause not in named(o)}
    assert not wrong, f"{mutant.name} ({mutant.cause}): {wrong}"


def test_every_mutant_cause_is_a_known_cause():
    assert {m.cause for m in MUTANTS} <= set(CAUSES)
    with pytest.raises(ValueError, match="cause='no_such'"):
        Hypothesis("no_such", "x")


@pytest.mark.parametrize("name", ["store_cache", "set_mla_kv_buffer", "concat_and_cache_mla",
                                  "reshape_and_cache_flash", "quantize_fp8", "translate_full_to_swa"])
def test_correct_kernels_never_get_a_cause(name, monkeypatch):
    """The baseline passes every case it runs, and the diagnosis is never reached."""
    def never(*args, **kwargs):
        raise AssertionError("a diagnosis ran for a passing case")

    monkeypatch.setattr("oracle.runner.explain", never)
    monkeypatch.setattr("oracle.runner.explain_raise", never)
    contract = next(c for c in _torch_contracts() if c.op == name)
    kernel = Kernel(contract, getattr(tn, name), "test")
    for case in catalogue(name, "quick"):
        if case.cls == "large":
            continue
        outcome = run_case(kernel, case)
        assert outcome.status in (PASS, UNDECLARED, NOT_SUPPORTED) and outcome.cause is None, case.id


def _torch_contracts():
    from oracle.registry import Registry

    registry = Registry()
    registry.load_plugin("torch", tn.register)
    return [k.contract for k in registry.kernels.values() if k.contract.device == "cpu"]


def test_a_hypothesis_that_does_not_hold_is_never_named():
    """K's strides for V do not explain a kernel that wrote K into V: the named cause is the one
    that holds, and the wrong one, replayed, is refused."""
    k_into_v = next(m for m in MUTANTS if m.short == "store_cache.k_into_v")
    kernel = Kernel(mutant_contract(k_into_v), k_into_v.fn, "test")
    case = next(c for c in catalogue("store_cache", "quick") if c.id == "aliased_cache")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "sources_swapped"
    assert "cache_strides_swapped" not in named(outcome)


def heads_after_the_first_scaled_twice(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache, loc)
    index = loc.long()
    k_cache[index, 1:] = (k[:, 1:].float() * 2).to(k_cache.dtype)


def test_a_failure_no_hypothesis_explains_is_described_by_its_pattern():
    kernel = Kernel(Contract(op="store_cache", name="twice", backend="test"), heads_after_the_first_scaled_twice,
                    "test")
    case = next(c for c in catalogue("store_cache", "quick") if c.id == "bf16-int64")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL and outcome.cause is None
    assert "no known cause matches" in outcome.message
    assert "k_cache: heads 1-7 of 8 differ in every differing slot; head(s) 0 match" in outcome.pattern
    assert any(line.startswith("k_cache: 133 of 133 written slots differ") for line in outcome.pattern)


def writes_next_slot(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache, (loc.long() + 1) % k_cache.shape[0])


def test_the_pattern_names_stray_and_missing_rows():
    kernel = Kernel(Contract(op="store_cache", name="next", backend="test"), writes_next_slot, "test")
    case = next(c for c in catalogue("store_cache", "quick") if c.id == "bf16-int64")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL
    text = "\n".join(outcome.pattern)
    assert "slot(s) written that should stay untouched" in text
    assert "slot(s) left untouched that should have been written" in text


def test_the_cause_reaches_the_json_report_and_junit(tmp_path):
    done = oracle("run", "--kernel", "collapsed.reshape_and_cache_flash", "-n", "0",
                  "--report", str(tmp_path / "r.json"), "--junit", str(tmp_path / "j.xml"),
                  "--", "-k", "scale_head and not bad", env={"ORACLE_PLUGINS": "collapsed:register"})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    data = json.loads((tmp_path / "r.json").read_text())
    failed = [c for c in data["cases"] if c["status"] == "fail"]
    assert failed and all(c["cause"]["id"] == "scale_collapsed" for c in failed), \
        [(c["case_id"], c["cause"]) for c in failed]
    props = {p.get("name"): p.get("value") for p in ET.parse(tmp_path / "j.xml").iter("property")}
    assert props.get("oracle_cause_id") == "scale_collapsed"
    assert "cause: " in done.stdout and "scale_collapsed" in done.stdout


def block_size_from_heads(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's paged write with block_size = key_cache.size(2) (the heads) where dimension 1 holds
    it. Where the heads are fewer than the block size the misread block index runs past the
    cache, and this kernel skips those slots (bounds-checked)."""
    heads, block_size, blocks = key_cache.shape[2], key_cache.shape[1], key_cache.shape[0]
    if heads > block_size:
        blocks = -(-blocks * block_size // heads)
    else:
        slot_mapping = torch.where(slot_mapping >= blocks * heads, -1, slot_mapping)
    views = [c.as_strided((blocks, heads) + tuple(c.shape[2:]), c.stride(), c.storage_offset())
             for c in (key_cache, value_cache)]
    tn.reshape_and_cache_flash(key, value, *views, slot_mapping, kv_cache_dtype, k_scale, v_scale)


@pytest.mark.parametrize("shape", [(32, 128), (8, 128)], ids=["more_heads", "fewer_heads"])
def test_the_block_size_taken_from_the_wrong_dimension_is_named(shape):
    """32 heads or 8 against blocks of 16 slots."""
    kernel = Kernel(Contract(op="reshape_and_cache_flash", name="blocks", backend="test", padding="negative"),
                    block_size_from_heads, "test")
    case = next(c for c in catalogue("reshape_and_cache_flash", "quick") if c.p.get("shape") == shape)
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "block_size_wrong_dim", outcome.message
    assert ("slots past block" in outcome.cause["text"]) == (shape[0] < 16), outcome.cause


def translate_from_storage_start(mapping, loc):
    return tn.translate_full_to_swa(mapping, loc.as_strided(loc.shape, loc.stride(), 0))


def test_a_translation_that_ignores_the_index_offset_is_named():
    """The returned-tensor op is diagnosed through the same index hypotheses (the guard band
    before every index holds valid table entries, as a storage-start read sees)."""
    kernel = Kernel(Contract(op="translate_full_to_swa", name="start", backend="test", padding="negative"),
                    translate_from_storage_start, "test")
    case = next(c for c in catalogue("translate_full_to_swa", "quick") if c.id == "int32-offset_index")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "index_offset_ignored", outcome.message


def zeroes_first_element(k, v, k_cache, v_cache, loc):
    k = k.clone()
    k[:, 0, 0] = 0
    tn.store_cache(k, v, k_cache, v_cache, loc)


def test_the_pattern_counts_the_differing_values():
    kernel = Kernel(Contract(op="store_cache", name="zero", backend="test"), zeroes_first_element, "test")
    case = next(c for c in catalogue("store_cache", "quick") if c.id == "bf16-int64")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL
    line = next(p for p in outcome.pattern if p.startswith("k_cache: differing elements"))
    pairs = line.split(": ", 2)[2].split(", ")
    assert all(p.split(" -> ")[1].startswith("0x0000 (") for p in pairs[:4]), line
    assert not any(p.startswith("v_cache: differing") for p in outcome.pattern)


def reads_int64_as_int32(k, v, k_cache, v_cache, loc):
    """A kernel whose pointer is int32_t* whatever the index's dtype: an int64 index's low and high
    words are read as entries."""
    words = loc.contiguous().view(torch.int32)[:loc.shape[0]].to(loc.dtype) if loc.dtype == torch.int64 else loc
    keep = words >= 0
    k_cache[words[keep].long()] = k[keep]
    v_cache[words[keep].long()] = v[keep]


def test_an_int64_index_read_as_int32_is_named():
    kernel = Kernel(Contract(op="store_cache", name="t.int32_words", backend="test", padding="negative",
                             strided_index=False), reads_int64_as_int32, "test")
    failed = [run_case(kernel, c) for c in catalogue("store_cache", "quick", kernel.contract)
              if c.p.get("index", "int64") == "int64" and c.cls in ("dtypes", "sizes") and c.p.get("n", 1) > 1
              and c.p.get("slots") != "past_float"]  # 2**24 slots: the misread is the same, the diagnosis slow
    failed = [o for o in failed if o.status == FAIL]
    assert failed
    assert all(o.cause and o.cause["id"] == "index_dtype_misread" for o in failed), [o.message for o in failed]


def truncates_before_the_padding_test(k, v, k_cache, v_cache, loc):
    """``int slot = loc[i]; if (slot < 0) continue;``: an int64 entry truncated to 32 bits first."""
    slots = loc.to(torch.int32).long()
    keep = slots >= 0
    k_cache[slots[keep]] = k[keep]
    v_cache[slots[keep]] = v[keep]


def test_an_int64_index_truncated_before_the_padding_test_is_named():
    kernel = Kernel(Contract(op="store_cache", name="t.truncated", backend="test", padding="negative"),
                    truncates_before_the_padding_test, "test")
    case = next(c for c in catalogue("store_cache", "quick", kernel.contract) if c.id == "int64-pad_negative")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL
    assert outcome.cause and outcome.cause["id"] == "index_dtype_misread" and "truncated" in outcome.cause["text"], \
        outcome.message[-1000:]


def _narrowed(fn, through):
    """``fn`` with its two sources (a writer's first arguments) converted to ``through`` and back
    first (a float16 path taken for bfloat16 data, a bfloat16 one for float32)."""
    def narrowed(first, second, *rest):
        return fn(first.to(through).to(first.dtype), second.to(through).to(second.dtype), *rest)
    return narrowed


@pytest.mark.parametrize("op, through", [("store_cache", torch.float16), ("reshape_and_cache_flash", torch.bfloat16)])
def test_sources_narrowed_through_a_smaller_float_type_are_named(op, through):
    """bfloat16 keys through float16 lose range (past 65504: inf) and float16 ones through
    bfloat16 lose precision: every failing case names the round trip, the cases of special values
    and raw bit patterns too, whose NaNs torch's conversions write as a float unit does (x86's
    vcvtps2ph quiets them, keeping sign and payload; the bfloat16 conversions make them canonical)."""
    contract = next(c for c in _torch_contracts() if c.op == op)
    kernel = Kernel(contract, _narrowed(getattr(tn, op), through), "test")
    failures = [run_case(kernel, case) for case in catalogue(op, "quick") if case.cls in ("dtypes", "fp8")]
    failures = [o for o in failures if o.status == FAIL]
    assert failures
    assert all("source_narrowed" in named(o) for o in failures), [(o.cause or {}).get("id") for o in failures]


def boundary_vector_from_first(vector: int, first_at: int, second_at: int, call):
    """An MLA writer copying rows in ``vector``-element vectors whose vector across the two parts'
    boundary is loaded from the first source alone: the second part's first elements come from
    past the first source's row end (its next row, a guard band)."""
    def writer(*args):
        first, second = args[first_at], args[second_at]
        rows, width = first.shape[0], first.shape[-1]
        spill = min(vector - width % vector, second.shape[-1]) if width % vector else 0
        if spill and rows:
            shape, strides = first.shape[:-1] + (width + spill,), first.stride()
            wider = first.as_strided(shape, strides, first.storage_offset())
            second = second.clone()
            second[..., :spill] = wider[..., width:]
        args = list(args)
        args[second_at] = second
        call(*args)
    return writer


@pytest.mark.parametrize("op, first_at, second_at, call", [
    ("set_mla_kv_buffer", 2, 3, tn.set_mla_kv_buffer), ("concat_and_cache_mla", 0, 1, tn.concat_and_cache_mla)])
def test_a_vector_across_the_nope_rope_boundary_read_from_nope_is_named(op, first_at, second_at, call):
    contract = Contract(op=op, name="vec8", backend="test", validates=True,
                        dtypes=("float32", "float16", "bfloat16", "uint8"))
    kernel = Kernel(contract, boundary_vector_from_first(8, first_at, second_at, call), "test")
    outcomes = {c.id: run_case(kernel, c) for c in catalogue(op, "quick", contract)
                if c.cls in ("sizes", "strides") and not c.p.get("dups")}
    failed = {i: o for i, o in outcomes.items() if o.status == FAIL}
    assert failed, "no case has a part width that is no multiple of 8"
    assert all(o.cause and o.cause["id"] == "sources_assumed_adjacent" and "8" in o.cause["text"].split(" elements)")[0]
               for o in failed.values()), {i: o.message for i, o in failed.items()}
    assert all(o.status in (PASS, NOT_SUPPORTED) for i, o in outcomes.items() if i not in failed)


def winner_table(size: int):
    """store_cache resolving duplicated slots through a table of ``size`` entries indexed by slot %
    size (the highest position wins): distinct slots that collide there lose all but the last."""
    def store_cache(k, v, k_cache, v_cache, loc):
        slots = loc.long()
        positions = torch.arange(slots.numel())
        table = torch.full((size,), -1, dtype=torch.int64).scatter_reduce(0, slots % size, positions, reduce="amax")
        won = table[slots % size] == positions
        tn.store_cache(k[won], v[won], k_cache, v_cache, loc[won])
    return store_cache


def test_distinct_slots_colliding_in_a_winner_table_are_named():
    contract = Contract(op="store_cache", name="table", backend="test", duplicates="any", validates=True,
                        dtypes=("float32", "float16", "bfloat16", "uint8"))
    kernel = Kernel(contract, winner_table(1024), "test")
    cases = catalogue("store_cache", "quick", contract)
    large = next(c for c in cases if c.cls == "sizes" and c.p.get("n") == 4096)  # 8195 slots: collisions
    small = [c for c in cases if c.cls == "dtypes" or c.p.get("dups")]  # 269 slots: none modulo 1024
    outcome = run_case(kernel, large)
    assert outcome.status == FAIL and outcome.cause["id"] == "slot_table_collision", outcome.message
    assert "slot % 1024" in outcome.cause["text"]
    assert all(run_case(kernel, c).status == PASS for c in small)


def compacting_dcp_writer(kv_buffer, loc, nope, rope):
    """set_mla_kv_buffer on DCP rank 1 of 2 that compacts the locs it writes and then takes
    source row j for the j-th of them."""
    kept = torch.fmod(loc, 2) == 1  # truncating, as the contract declares
    positions = torch.nonzero(kept).flatten()
    nope, rope = nope.clone(), rope.clone()
    nope[positions], rope[positions] = nope[:positions.numel()].clone(), rope[:positions.numel()].clone()
    tn.set_mla_kv_buffer_dcp(kv_buffer, loc, nope, rope, dcp_world=2, dcp_rank=1, dcp_modulo="truncate")


def test_a_dcp_writer_that_reads_the_compacted_position_is_named():
    contract = Contract(op="set_mla_kv_buffer", name="compact", backend="test", validates=True, padding="reserved:0",
                        dcp_world=2, dcp_rank=1, dtypes=("float32", "float16", "bfloat16", "uint8"))
    kernel = Kernel(contract, compacting_dcp_writer, "test")
    outcomes = [run_case(kernel, c) for c in catalogue("set_mla_kv_buffer", "quick", contract)
                if c.cls in ("dtypes", "dcp") and not c.p.get("values")]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "rows_misrouted" and "compacted" in o.cause["text"]
                          for o in failed), [o.message for o in failed]



def unmasked_row_tiles(call, outputs: int, tile: int = 4):
    """A quantizing kernel (its ``outputs`` first, then x) that handles (token, head) rows ``tile``
    at a time with masked loads and unmasked stores: the last tile's rows past the end are written
    as zero rows convert, after each packed output."""
    def kernel(*args):
        outs, x, rest = args[:outputs], args[outputs], args[outputs + 1:]
        rows = x.shape[0] * x.shape[1]
        extra = -rows % tile
        if not extra or not all(o.is_contiguous() for o in outs):
            return call(*args)
        grown = [o.as_strided((rows + extra, 1, o.shape[-1]), (o.shape[-1], o.shape[-1], 1), o.storage_offset())
                 for o in outs]
        padded = torch.cat([x.reshape(rows, -1), x.new_zeros(extra, x.shape[-1])]).unsqueeze(1)
        call(*grown, padded, *rest)
    return kernel


@pytest.mark.parametrize("op", ["quantize_fp8", "quantize_block"])
def test_unmasked_stores_of_a_last_row_tile_are_named(op):
    from oracle.kernels import torch_block as tb

    if op == "quantize_fp8":
        contract = Contract(op=op, name="tiles", backend="test", fp8_formats=("e4m3fn", "e5m2"),
                            fp8_preset=tn._torch_fp8_preset(), scales=("tensor",))
        kernel = Kernel(contract, unmasked_row_tiles(tn.quantize_fp8, 1), "test")
    else:
        contract = Contract(op=op, name="tiles", backend="test", block_formats=tuple(tb.FORMATS))
        kernel = Kernel(contract, unmasked_row_tiles(tb.quantize_block, 2), "test")
    outcomes = [run_case(kernel, c) for c in catalogue(op, "quick", contract) if not c.p.get("bad")]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "row_overrun" and "4" in o.cause["text"].split(" at a time")[0]
                          for o in failed), [o.message for o in failed if not o.cause or o.cause["id"] != "row_overrun"]


def word_stores(word: int):
    """quantize_fp8 storing each (token, head) row of codes as whole ``word``-byte words, the last
    word's padding zeros past the row's end, the rows stored last to first."""
    def quantize_fp8(out, x, scale, fmt):
        codes = torch.empty_like(out)
        tn.quantize_fp8(codes, x, scale, fmt)
        n, h, d = out.shape
        width = -(-d // word) * word
        for r in reversed(range(n * h)):
            row = out.as_strided((width,), (1,), out.storage_offset() + (r // h) * out.stride(0) + (r % h) * out.stride(1))
            row.copy_(torch.cat([codes[r // h, r % h], codes.new_zeros(width - d)]))
    return quantize_fp8


def test_rows_stored_as_whole_words_spilling_zeros_are_named():
    contract = Contract(op="quantize_fp8", name="words", backend="test", fp8_formats=("e4m3fn", "e5m2"),
                        fp8_preset=tn._torch_fp8_preset())
    kernel = Kernel(contract, word_stores(4), "test")
    outcomes = [run_case(kernel, c) for c in catalogue("quantize_fp8", "quick", contract)
                if not c.p.get("bad") and c.p.get("n", 133) <= 133]
    failed = [o for o in outcomes if o.status == FAIL]
    assert failed and all(o.cause and o.cause["id"] == "row_overrun" and "4-byte words" in o.cause["text"]
                          for o in failed), [o.message for o in failed if not o.cause or "words" not in o.cause["text"]]


def copy_under_flush_to_zero(k, v, k_cache, v_cache, loc):
    """A copy through float arithmetic under flush-to-zero (x * 1.0f built with fast math):
    subnormals come out as zeros of their sign; float16 rows are moved as bits."""
    def flushed(x):
        if x.dtype == torch.float16 or not x.is_floating_point():
            return x
        tiny = torch.finfo(x.dtype).tiny
        return torch.where((x.abs() < tiny) & (x != 0), torch.copysign(torch.zeros_like(x), x), x)
    tn.store_cache(flushed(k), flushed(v), k_cache, v_cache, loc)


@pytest.mark.parametrize("case_id", ["bf16-bits", "fp32-bits"])
def test_subnormals_flushed_in_a_copy_are_named(case_id):
    kernel = Kernel(Contract(op="store_cache", name="ftz", backend="test"), copy_under_flush_to_zero, "test")
    outcome = run_case(kernel, next(c for c in catalogue("store_cache", "quick") if c.id == case_id))
    assert outcome.status == FAIL and outcome.cause["id"] == "source_narrowed", outcome.message
    assert "flushed to zero of their sign" in outcome.cause["text"]


def first_page_skipped(k, v, k_cache, v_cache, loc):
    """The padding test covers the whole first page of 16 slots, not only the reserved slot 0."""
    kept = loc >= 16
    tn.store_cache(k[kept], v[kept], k_cache, v_cache, loc[kept])


def test_a_whole_reserved_page_skipped_is_named_with_its_size():
    contract = Contract(op="store_cache", name="page", backend="test", padding="reserved:0")
    kernel = Kernel(contract, first_page_skipped, "test")
    outcome = run_case(kernel, next(c for c in catalogue("store_cache", "quick", contract) if c.id == "bf16-int64"))
    assert outcome.status == FAIL and outcome.cause["id"] == "padding_policy", outcome.message
    assert "slots 0-15 skipped" in outcome.cause["text"]


def cache_offset_in_source_elements(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                                    v_scale):
    """fp8 caches based at storage_offset * the source's element size bytes (the offset counted in
    the source's type): every row lands that many bytes further on."""
    def moved(cache):
        if cache.element_size() == key.element_size():
            return cache
        return cache.as_strided(cache.shape, cache.stride(), cache.storage_offset() * key.element_size())
    tn.reshape_and_cache_flash(key, value, moved(key_cache), moved(value_cache), slot_mapping, kv_cache_dtype,
                               k_scale, v_scale)


def test_a_cache_offset_counted_in_the_sources_element_size_is_named():
    contract = next(k for k in default_registry.discover().select(backend="torch")
                    if k.name == "torch.reshape_and_cache_flash").contract
    kernel = Kernel(replace(contract, name="offset_scaled"), cache_offset_in_source_elements, "test")
    case = next(c for c in catalogue("reshape_and_cache_flash", "quick", contract) if c.id == "e4m3fn-scale_1.0-random")
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL and outcome.cause["id"] == "storage_offset_ignored", outcome.message
    assert "counted in 2-byte elements" in outcome.cause["text"] or "counted in 4-byte" in outcome.cause["text"]
