"""The shared slot machinery: policy parsing, slot planning, the row scatter through slot-indexed
views, and the judgement of OneOfRows / check_outcome (bitwise, with readable reasons)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from loop_oracles import poison, random_bits
from oracle.reference.slots import (OneOfRows, Padding, check_outcome, plan_slots,
                                    write_rows)


@pytest.mark.parametrize("spec, kind, reserved", [
    ("none", "none", None), ("negative", "negative", None), ("reserved:0", "reserved", 0),
    ("reserved:17", "reserved", 17)])
def test_padding_parses(spec, kind, reserved):
    policy = Padding.parse(spec)
    assert (policy.kind, policy.reserved, str(policy)) == (kind, reserved, spec)


@pytest.mark.parametrize("spec", ["", "None", "reserved", "reserved:", "reserved:-1",
                                  "reserved:x", " negative", "skip", 0, None])
def test_bad_padding_is_rejected(spec):
    with pytest.raises(ValueError, match=r"padding=.* is not a padding policy"):
        Padding.parse(spec)


def test_plan_lists_written_positions_and_collisions():
    loc = np.array([5, -1, 3, 5, 0, 3, 5, -1], np.int64)
    plan = plan_slots("loc", loc, 8, padding="negative", duplicates="any")
    assert plan.positions.tolist() == [0, 2, 3, 4, 5, 6]
    assert plan.slots.tolist() == [5, 3, 5, 0, 3, 5]
    got = {slot: plan.positions[members].tolist() for slot, members in plan.collisions}
    assert got == {3: [2, 5], 5: [0, 3, 6]}


def test_skipped_entries_never_collide():
    loc = np.array([0, 4, 0, 0, 2], np.int32)
    plan = plan_slots("loc", loc, 5, padding="reserved:0")
    assert plan.positions.tolist() == [1, 4] and plan.collisions == ()


@pytest.mark.parametrize("padding, loc, message", [
    ("none", [0, 3, 4], r"loc\[2\] = 4 is out of range \[0, 4\) under padding='none'"),
    ("none", [0, -1], r"loc\[1\] = -1 is out of range"),
    ("negative", [-5, 4], r"loc\[1\] = 4 is out of range .*negative slots are skipped"),
    ("reserved:0", [0, -1], r"loc\[1\] = -1 is out of range .*only slot 0 is skipped"),
    ("reserved:9", [9], r"loc\[0\] = 9 is out of range \[0, 4\)"),
])
def test_out_of_range_names_the_position(padding, loc, message):
    with pytest.raises(ValueError, match=message):
        plan_slots("loc", np.array(loc, np.int64), 4, padding=padding)


def test_first_out_of_range_position_is_named_and_the_rest_counted():
    with pytest.raises(ValueError, match=r"loc\[1\] = 7 .*; 2 more position"):
        plan_slots("loc", np.array([0, 7, 8, 9], np.int32), 4)


def test_forbidden_duplicate_names_slot_and_positions():
    with pytest.raises(ValueError, match=r"writes slot 2 more than once, at positions 1, 3, 4"):
        plan_slots("idx", np.array([0, 2, 1, 2, 2], np.int64), 4)


@pytest.mark.parametrize("dtype", [np.uint32, np.float32, np.int16, np.int8, np.uint64])
def test_index_dtype_is_checked(dtype):
    with pytest.raises(TypeError, match=f"loc has dtype {np.dtype(dtype)}; expected one of: "
                                        "int32, int64"):
        plan_slots("loc", np.array([0, 1], dtype), 4)


def test_plan_rejects_bad_duplicates_policy():
    with pytest.raises(ValueError, match=r"duplicates='first'"):
        plan_slots("loc", np.array([0], np.int64), 4, duplicates="first")


def test_write_rows_through_transposed_view_and_region():
    out = poison((2, 3, 4, 5), np.uint8)  # [block, head, offset, dim]: slot axes (0, 2)
    before = out.copy()
    plan = plan_slots("loc", np.array([6, 1], np.int64), 8)
    rows = np.arange(2 * 3 * 2, dtype=np.uint8).reshape(2, 3, 2) + 100
    result = write_rows(out, plan, rows, slot_axes=(0, 2), row_region=(slice(None), slice(1, 3)))
    assert result is out
    expected = before.copy()
    expected[1, :, 2, 1:3] = rows[0]
    expected[0, :, 1, 1:3] = rows[1]
    assert check_outcome(expected, result) is None


def _collided(rows, loc, width_dtype=np.uint8, cache_rows=4):
    cache = poison((cache_rows,) + rows.shape[1:], rows.dtype)
    plan = plan_slots("loc", np.array(loc, np.int64), cache_rows, duplicates="any")
    return write_rows(cache, plan, rows)


def test_torn_row_reason_gives_byte_ranges_and_positions():
    rng = np.random.default_rng(0)
    rows = random_bits(rng, (10, 512), np.uint8)
    loc = [1] * 10
    loc[3], loc[9] = 2, 2
    outcome = _collided(rows, loc, cache_rows=4)
    assert isinstance(outcome, OneOfRows)
    actual = outcome.base.copy()
    actual[2, :256], actual[2, 256:] = rows[3, :256], rows[9, 256:]
    reason = outcome.check(actual)
    assert "slot 2 (written by positions 3, 9)" in reason
    assert "torn row: bytes 0..255 from position 3, 256..511 from position 9" in reason


def test_torn_row_in_wide_elements_reports_bytes():
    rows = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]], np.float32)
    outcome = _collided(rows, [0, 0, 0])
    actual = outcome.base.copy()
    actual[0] = [7.0, 5.0, 3.0]
    assert outcome.check(actual).endswith(
        "torn row: bytes 0..3 from position 2, 4..7 from position 1, 8..11 from position 0")


def test_row_from_no_colliding_position_is_rejected():
    rows = np.array([[1, 2], [3, 4], [5, 6]], np.int16)
    outcome = _collided(rows, [0, 1, 0])
    actual = outcome.base.copy()
    actual[0] = rows[1]  # position 1 wrote slot 1, not slot 0
    reason = outcome.check(actual)
    assert "slot 0 (written by positions 0, 2)" in reason
    assert "matches none of the 2 colliding rows" in reason and "bytes 0..1" in reason


def test_each_colliding_row_is_allowed():
    rows = np.array([[1, 2], [3, 4], [5, 6]], np.int16)
    outcome = _collided(rows, [3, 3, 3])
    for k in range(3):
        actual = outcome.base.copy()
        actual[3] = rows[k]
        assert outcome.check(actual) is None and actual in outcome


def test_base_is_the_last_writer():
    rows = np.array([[1, 2], [3, 4], [5, 6]], np.int16)
    outcome = _collided(rows, [3, 3, 1])
    assert outcome.base[3].tolist() == [3, 4]


def test_difference_outside_duplicated_slots_is_rejected():
    rows = np.array([[1, 2], [3, 4]], np.int16)
    outcome = _collided(rows, [3, 3])
    actual = outcome.base.copy()
    actual[0, 1] ^= 1
    assert outcome.check(actual).startswith("outside the duplicated slots: element (0, 1)")


def test_bitwise_comparison_sees_nan_payloads_and_negative_zero():
    base = np.array([0.0, np.nan, 1.0], np.float32)
    other = base.copy()
    other[0] = -0.0
    assert "element (0,)" in check_outcome(base, other)
    other = base.copy()
    other.view(np.uint32)[1] ^= 1  # another NaN
    assert "element (1,) has bytes" in check_outcome(base, other)
    assert check_outcome(base, base.copy()) is None  # NaN == NaN bitwise


def test_check_outcome_counts_differences():
    expected = poison((4, 6), ml_dtypes.bfloat16)
    actual = expected.copy()
    actual.view(np.uint16)[2, 3] ^= 0x8000
    actual.view(np.uint16)[3, 0] ^= 1
    reason = check_outcome(expected, actual)
    assert reason.startswith("element (2, 3)") and "2 of 24 elements differ" in reason


@pytest.mark.parametrize("actual, message", [
    (np.zeros((4, 5), np.uint8), "shape"), (np.zeros((4, 6), np.int8), "dtype"),
    ([[0] * 6] * 4, "not a numpy array")])
def test_wrong_kind_of_result(actual, message):
    expected = np.zeros((4, 6), np.uint8)
    assert message in check_outcome(expected, actual)
    outcome = _collided(np.zeros((2, 6), np.uint8), [1, 1])
    assert message in outcome.check(actual)


def test_resolve_takes_allowed_rows_and_keeps_base_elsewhere():
    rows = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int16)
    outcome = _collided(rows, [0, 2, 0, 2])
    actual = outcome.base.copy()
    actual[0] = rows[0]  # allowed: position 0
    actual[2] = [3, 8]  # torn: stays the base's row
    actual[1, 0] += 1  # outside: never taken from actual
    resolved = outcome.resolve(actual)
    assert resolved[0].tolist() == [1, 2] and resolved[2].tolist() == [7, 8]
    assert check_outcome(outcome.base[1], resolved[1]) is None
    assert resolved is not outcome.base and resolved in outcome
