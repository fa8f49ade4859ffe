"""Where the reference's rows went (oracle.diagnose.provenance): moves found from hand-built
caches, the rules among index entries, and kernels that pair rows with the wrong slots named
rows_misrouted only when nothing else differs."""

import numpy as np
import pytest
import torch

from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.diagnose.provenance import entry_rule, entries_of, find_moves
from oracle.kernels import torch_native as tn
from oracle.registry import Kernel
from oracle.runner import FAIL, run_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _cache(rows: int, width: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 2**16, (rows, width), dtype=np.uint16)


def test_a_row_written_at_another_slot_is_found_and_its_own_slot_left_as_it_was():
    before = _cache(10, 6, 0)
    want = before.copy()
    want[[2, 5]] = _cache(2, 6, 1)  # the reference writes slots 2 and 5
    got = before.copy()
    got[7] = want[2]  # slot 2's row landed at 7; slot 5 is right
    got[5] = want[5]
    moves = find_moves("c", want, got, before)
    assert moves.moved == [(2, 7)] and moves.untouched.tolist() == [2] and moves.unexplained.size == 0
    assert moves.columns is None and moves.explained


def test_a_row_holding_no_row_of_the_references_is_unexplained():
    before = _cache(8, 4, 0)
    want = before.copy()
    want[[1, 3]] = _cache(2, 4, 1)
    got = want.copy()
    got[3, 0] ^= 1  # a wrong value, at the right slot
    moves = find_moves("c", want, got, before)
    assert moves.moved == [] and moves.unexplained.tolist() == [3] and not moves.explained


def test_rows_mixed_from_two_slots_are_matched_on_the_columns_that_differ():
    """Columns 0-3 (nope) of slot 4 come from the row of slot 6; the rest (rope) is slot 4's own."""
    before = _cache(9, 6, 0)
    want = before.copy()
    want[[4, 6]] = _cache(2, 6, 2)
    got = want.copy()
    got[4, :4] = want[6, :4]
    moves = find_moves("c", want, got, before)
    assert moves.moved == [(6, 4)] and moves.columns.tolist() == [0, 1, 2, 3] and moves.explained


def test_paged_caches_are_matched_by_slot_with_block_and_token_merged():
    before = np.random.default_rng(0).integers(0, 2**8, (3, 4, 2, 5), dtype=np.uint8)  # [block, token, head, d]
    want = before.copy()
    want[1, 3] = 200  # slot 7
    got = before.copy()
    got[2, 0] = 200  # slot 8
    moves = find_moves("c", want, got, before)
    assert moves.moved == [(7, 8)] and moves.untouched.tolist() == [7]


def test_entries_number_the_rows_only_where_each_written_slot_is_one_entry():
    assert entries_of(np.array([5, -1, 2]), np.array([2, 5])) == {5: 0, 2: 2}
    assert entries_of(np.array([5, 5, 2]), np.array([2, 5])) is None  # a slot named twice
    assert entries_of(np.array([5, 2]), np.array([2, 3])) is None  # a written slot no entry names
    assert entries_of(None, np.array([1])) is None


@pytest.mark.parametrize("pairs, words", [
    ([(3, 1), (7, 5), (4, 2)], "entry i - 2"),
    ([(0, 1), (1, 0), (6, 7)], "swapped in pairs"),
    ([(1024, 0), (2047, 1023), (3072, 0), (3073, 1)], "entry i mod 1024"),
])
def test_a_rule_among_the_moved_entries_is_said(pairs, words):
    assert words in entry_rule(pairs)


def test_moves_without_a_rule_get_none():
    assert entry_rule([(5, 1), (2, 7), (9, 3)]) is None


def _named(fn, op, case_id):
    kernel = Kernel(Contract(op=op, name="misroutes", backend="test"), fn, "test")
    case = next(c for c in catalogue(op, "quick") if c.id == case_id)
    outcome = run_case(kernel, case)
    assert outcome.status == FAIL
    return outcome


def writes_next_slot(k, v, k_cache, v_cache, loc):
    tn.store_cache(k, v, k_cache, v_cache, (loc.long() + 1) % k_cache.shape[0])


def test_rows_written_one_slot_on_are_named_with_their_shift():
    outcome = _named(writes_next_slot, "store_cache", "bf16-int64")
    assert outcome.cause["id"] == "rows_misrouted"
    assert "+1 slot(s) from their own in 132" in outcome.cause["text"]


def rows_of_the_next_entry(k, v, k_cache, v_cache, loc):
    order = torch.roll(torch.arange(loc.shape[0]), -1)  # entry i's slot gets row i + 1's row
    tn.store_cache(k[order], v[order], k_cache, v_cache, loc)


def test_each_slot_given_the_next_entrys_row_is_named_in_entries():
    outcome = _named(rows_of_the_next_entry, "store_cache", "bf16-int64")
    assert outcome.cause["id"] == "rows_misrouted"
    assert "the row of entry i at the slot of entry i - 1 (132 of the 133 moved rows), for entries 0-132" in outcome.cause["text"]


def nope_of_the_next_entry(kv_buffer, loc, cache_k_nope, cache_k_rope):
    tn.set_mla_kv_buffer(kv_buffer, loc, torch.roll(cache_k_nope, -1, 0), cache_k_rope)


def test_a_part_taken_from_another_entrys_row_is_named_with_its_columns():
    outcome = _named(nope_of_the_next_entry, "set_mla_kv_buffer", "bf16-int64")
    assert outcome.cause["id"] == "rows_misrouted"
    assert "element(s) 0-511 of rows" in outcome.cause["text"]


def moved_and_scaled(k, v, k_cache, v_cache, loc):
    tn.store_cache(k * 2, v, k_cache, v_cache, (loc.long() + 1) % k_cache.shape[0])


def test_moved_rows_that_also_differ_in_value_are_not_named_misrouted():
    outcome = _named(moved_and_scaled, "store_cache", "bf16-int64")
    assert outcome.cause is None or outcome.cause["id"] != "rows_misrouted"
    assert any("hold the rows the reference writes at another slot" in line for line in outcome.pattern)


def test_elements_moved_along_their_own_rows_are_found():
    before = _cache(6, 8, 0)
    want = before.copy()
    want[[0, 1, 2, 4]] = _cache(4, 8, 3)
    got = want.copy()
    got[[0, 1, 2, 4], 4:7] = want[[0, 1, 2, 4], 5:8]  # elements 5-7 written one to the left
    moves = find_moves("c", want, got, before)
    assert moves.shifted == [(5, 4), (6, 5), (7, 6)] and moves.explained and moves.moved == []


def test_elements_of_too_few_rows_to_tell_are_not_called_moved():
    """Two uint16 values per column (4 bytes) match another column by chance too often to name."""
    before = _cache(6, 8, 0)
    want = before.copy()
    want[[1, 2]] = _cache(2, 8, 3)
    got = want.copy()
    got[[1, 2], 4:7] = want[[1, 2], 5:8]
    assert find_moves("c", want, got, before).shifted == []


def rope_rotated(kv_buffer, loc, cache_k_nope, cache_k_rope):
    tn.set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, torch.roll(cache_k_rope, 16, dims=-1))


def test_a_part_written_at_another_offset_along_the_row_is_named_part_misplaced():
    outcome = _named(rope_rotated, "set_mla_kv_buffer", "bf16-int64")
    assert outcome.cause["id"] == "part_misplaced"
    assert "hold what the reference writes at element(s) 512-575 of the same row" in outcome.cause["text"]


def rows_three_quarters_written(k, v, k_cache, v_cache, loc):
    tn.store_cache(k[:0], v[:0], k_cache, v_cache, loc[:0])  # the checks
    for src, cache in ((k, k_cache), (v, v_cache)):
        width = src[0].numel()
        cache.view(cache.shape[0], -1)[loc.long(), : 3 * width // 4] = src.reshape(src.shape[0], -1)[:, : 3 * width // 4]


def test_rows_written_only_up_to_a_byte_read_off_the_result_are_named_row_tail_dropped():
    outcome = _named(rows_three_quarters_written, "store_cache", "bf16-int64")
    assert outcome.cause["id"] == "row_tail_dropped"
    assert "each row written only up to byte 1536 of 2048" in outcome.cause["text"]
