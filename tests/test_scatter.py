"""store_cache against the per-row loop oracle, on sentinel-filled caches, compared bitwise whole.

Sources are arbitrary bit patterns (NaN payloads, -0, infinities): the writer copies rows, so
every byte must arrive unchanged.
"""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loop_oracles import (Unchanged, assert_bits_equal, loop_store_cache, poison, random_bits)
from oracle.reference.scatter import store_cache
from oracle.reference.slots import OneOfRows, check_outcome

DTYPES = [ml_dtypes.bfloat16, np.float16, np.float32, np.uint8]
PADDINGS = ["none", "negative", "reserved:0", "reserved:3"]


def pad_value(padding):
    """The slot a padding entry uses under ``padding`` (None: the policy has none)."""
    if padding == "none":
        return None
    return -1 if padding == "negative" else int(padding.split(":")[1])


def make_loc(rng, num_slots, count, padding, index_dtype, pad_fraction=0.3):
    """Up to ``count`` distinct in-range slots, plus the policy's padding entry mixed in (at
    least once, when ``count`` > 0)."""
    pad = pad_value(padding)
    slots = rng.permutation([s for s in range(num_slots) if s != pad])[:count].astype(np.int64)
    if pad is not None and count:
        chosen = rng.random(count) < pad_fraction
        chosen[0] = True
        slots = np.resize(slots, count) if len(slots) else np.full(count, pad)
        slots = np.where(chosen, pad, slots)
    return slots.astype(index_dtype)


def run_and_compare(cache, loc, src, padding, **kwargs):
    guard = Unchanged(cache, loc, src)
    got = store_cache(cache, loc, src, padding=padding, **kwargs)
    guard.verify()
    assert_bits_equal(got, loop_store_cache(cache, loc, src, padding))
    assert not np.shares_memory(got, cache)
    return got


@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("padding", PADDINGS)
@pytest.mark.parametrize("width", [1, 46, 97])
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_matches_loop(dtype, width, padding, index_dtype):
    rng = np.random.default_rng([width, len(padding), np.dtype(index_dtype).itemsize])
    num_slots = 40
    for count in (0, 1, 7, 33):
        loc = make_loc(rng, num_slots, count, padding, index_dtype)
        cache = poison((num_slots, width), dtype, salt=count)
        src = random_bits(rng, (len(loc), width), dtype)
        got = run_and_compare(cache, loc, src, padding)
        pad = pad_value(padding)
        if pad is not None and count:
            assert (loc == pad).any()
            if pad >= 0:
                assert_bits_equal(got[pad], cache[pad])  # the reserved slot keeps its sentinel


def test_multi_axis_rows():
    rng = np.random.default_rng(1)
    cache = poison((16, 3, 5), np.float16)
    loc = np.array([4, 0, 15, 9], np.int32)
    run_and_compare(cache, loc, random_bits(rng, (4, 3, 5), np.float16), "none")


def test_empty_loc_returns_an_unchanged_copy():
    cache = poison((8, 4), np.float32)
    got = store_cache(cache, np.zeros(0, np.int64), np.zeros((0, 4), np.float32))
    assert_bits_equal(got, cache)
    assert got is not cache


def test_repeated_padding_entries_are_not_duplicates():
    cache = poison((8, 4), np.uint8)
    src = np.arange(16, dtype=np.uint8).reshape(4, 4)
    run_and_compare(cache, np.array([-1, 3, -1, -1], np.int64), src, "negative")
    run_and_compare(cache, np.array([0, 3, 0, 5], np.int64), src, "reserved:0")


@settings(max_examples=60, derandomize=True, deadline=None)
@given(num_slots=st.integers(4, 50), width=st.integers(1, 20),
       dtype=st.sampled_from(DTYPES), padding=st.sampled_from(PADDINGS),
       index_dtype=st.sampled_from([np.int32, np.int64]), seed=st.integers(0, 2**32 - 1),
       data=st.data())
def test_property_matches_loop(num_slots, width, dtype, padding, index_dtype, seed, data):
    rng = np.random.default_rng(seed)
    count = data.draw(st.integers(0, num_slots))
    loc = make_loc(rng, num_slots, count, padding, index_dtype)
    cache = poison((num_slots, width), dtype, salt=seed % 97)
    run_and_compare(cache, loc, random_bits(rng, (len(loc), width), dtype), padding)


# ---- duplicates ---------------------------------------------------------------------------

def duplicated_case(dtype=np.float32, width=8, seed=3):
    rng = np.random.default_rng(seed)
    loc = np.array([5, 2, 5, -1, 7, 2, 5, 0], np.int64)  # slot 5 thrice, slot 2 twice
    cache = poison((10, width), dtype)
    src = random_bits(rng, (len(loc), width), dtype)
    return cache, loc, src


def test_duplicates_are_forbidden_by_default():
    cache, loc, src = duplicated_case()
    with pytest.raises(ValueError, match=r"loc writes slot 2 more than once, at positions 1, 5"):
        store_cache(cache, loc, src, padding="negative")


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_every_colliding_combination_is_allowed(dtype):
    cache, loc, src = duplicated_case(dtype)
    guard = Unchanged(cache, loc, src)
    outcome = store_cache(cache, loc, src, padding="negative", duplicates="any")
    guard.verify()
    assert isinstance(outcome, OneOfRows)
    assert {c.slot: c.positions for c in outcome.collisions} == {2: (1, 5), 5: (0, 2, 6)}
    for at5, at2 in itertools.product((0, 2, 6), (1, 5)):
        actual = loop_store_cache(cache, loc, src, "negative", winners={5: at5, 2: at2})
        assert check_outcome(outcome, actual) is None, (at5, at2)


def test_torn_row_is_rejected():
    cache, loc, src = duplicated_case(np.float32, width=8)
    outcome = store_cache(cache, loc, src, padding="negative", duplicates="any")
    actual = loop_store_cache(cache, loc, src, "negative")
    actual[5, 4:] = src[0, 4:]  # first half from position 6 (the last writer), rest from 0
    reason = outcome.check(actual)
    assert "torn" in reason and "slot 5" in reason
    assert "0..15 from position 6, 16..31 from position 0" in reason


def test_row_from_a_non_colliding_source_is_rejected():
    cache, loc, src = duplicated_case(np.uint8)
    outcome = store_cache(cache, loc, src, padding="negative", duplicates="any")
    actual = loop_store_cache(cache, loc, src, "negative")
    actual[2] = src[4]  # position 4 writes slot 7
    reason = check_outcome(outcome, actual)
    assert "slot 2" in reason and "matches none of the 2 colliding rows" in reason


def test_untouched_row_at_a_duplicated_slot_is_rejected():
    cache, loc, src = duplicated_case(np.uint8)
    outcome = store_cache(cache, loc, src, padding="negative", duplicates="any")
    actual = loop_store_cache(cache, loc, src, "negative")
    actual[5] = cache[5]
    assert "matches none of the 3 colliding rows" in outcome.check(actual)


def test_any_without_actual_duplicates_returns_an_array():
    cache, loc, src = duplicated_case()
    loc = np.array([5, 2, 4, -1, 7, 3, 6, 0], np.int64)
    got = store_cache(cache, loc, src, padding="negative", duplicates="any")
    assert isinstance(got, np.ndarray)
    assert_bits_equal(got, loop_store_cache(cache, loc, src, "negative"))


# ---- bad arguments ------------------------------------------------------------------------

def good_args():
    return dict(cache=poison((8, 4), np.float16), loc=np.array([1, 6, 0], np.int64),
                src=np.ones((3, 4), np.float16))


@pytest.mark.parametrize("change, error, message", [
    ({"loc": np.array([1, 6, 0], np.uint32)}, TypeError,
     r"loc has dtype uint32; expected one of: int32, int64"),
    ({"loc": np.array([1, 6, 0], np.float32)}, TypeError, r"loc has dtype float32"),
    ({"loc": np.array([1, 6, 0], np.int16)}, TypeError, r"loc has dtype int16"),
    ({"loc": np.array([[1, 6, 0]], np.int64)}, ValueError, r"loc must be 1-D, got shape \(1, 3\)"),
    ({"loc": [1, 6, 0]}, TypeError, r"loc must be a numpy array, got list"),
    ({"src": np.ones((3, 4), np.float32)}, TypeError,
     r"src has dtype float32 but cache has dtype float16"),
    ({"src": np.ones((3, 5), np.float16)}, ValueError, r"src has shape \(3, 5\); expected \(3, 4\)"),
    ({"src": np.ones((2, 4), np.float16)}, ValueError, r"src has shape \(2, 4\)"),
    ({"loc": np.array([1, 8, 0], np.int64)}, ValueError,
     r"loc\[1\] = 8 is out of range \[0, 8\) under padding='none'"),
    ({"loc": np.array([1, -1, 0], np.int64)}, ValueError, r"loc\[1\] = -1 is out of range"),
    ({"loc": np.array([1, -1, 0], np.int64), "padding": "reserved:0"}, ValueError,
     r"loc\[1\] = -1 is out of range .*padding='reserved:0'"),
    ({"loc": np.array([1, 9, -1], np.int64), "padding": "negative"}, ValueError,
     r"loc\[1\] = 9 is out of range"),
    ({"padding": "skip-negative"}, ValueError, r"padding='skip-negative' is not a padding policy"),
    ({"duplicates": "last"}, ValueError, r"duplicates='last' is not one of"),
    ({"loc": np.array([1, 6, 1], np.int64)}, ValueError, r"loc writes slot 1 .* positions 0, 2"),
    ({"cache": np.float16(1)}, TypeError, r"cache must be a numpy array"),
    ({"cache": np.empty((), np.float16)}, ValueError, r"cache must have a slot axis"),
])
def test_bad_arguments(change, error, message):
    args = good_args()
    args.update(change)
    policies = {k: args.pop(k) for k in ("padding", "duplicates") if k in args}
    with pytest.raises(error, match=message):
        store_cache(args["cache"], args["loc"], args["src"], **policies)


@settings(max_examples=40, derandomize=True, deadline=None)
@given(num_slots=st.integers(1, 6), count=st.integers(2, 12), width=st.integers(2, 9),
       dtype=st.sampled_from(DTYPES), seed=st.integers(0, 2**32 - 1))
def test_property_duplicates(num_slots, count, width, dtype, seed):
    """Any loop-built winner choice is allowed; a row spliced from two colliding rows is torn."""
    rng = np.random.default_rng(seed)
    loc = rng.integers(0, num_slots, count).astype(np.int64)
    loc[1] = loc[0]  # at least one collision
    cache = poison((num_slots, width), dtype)
    src = random_bits(rng, (count, width), dtype)
    outcome = store_cache(cache, loc, src, duplicates="any")
    assert isinstance(outcome, OneOfRows)
    groups = {s: np.flatnonzero(loc == s).tolist() for s in set(loc.tolist())}
    winners = {s: int(rng.choice(p)) for s, p in groups.items() if len(p) > 1}
    actual = loop_store_cache(cache, loc, src, winners=winners)
    assert outcome.check(actual) is None

    first, second = groups[loc[0]][:2]
    same = (src[first].view(np.uint8).reshape(width, -1)
            == src[second].view(np.uint8).reshape(width, -1)).all(axis=1)
    split = int(rng.integers(1, width))
    actual[loc[0], :split], actual[loc[0], split:] = src[first, :split], src[second, split:]
    reason = outcome.check(actual)
    if same[:split].all() or same[split:].all():
        assert reason is None or "torn" in reason
    else:
        assert "torn" in reason and f"slot {loc[0]}" in reason
