"""make_swa_mapping and translate_full_to_swa against hand-built tables and a plain Python loop.

The oracle for translation is a Python loop over a hand-written list, never the code under test:
-1 gives -1 (the sentinel), any other in-table index gives the list entry.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oracle.reference.swa import make_swa_mapping, translate_full_to_swa

INDEX = [np.int32, np.int64]

# a hand-built table: 8 entries of the table proper (slot 0 -> 0, some unmapped zeros, arbitrary
# SWA slots, out of order), then the -1 sentinel at index 8.
HAND = [0, 7, 3, 0, 9, 2, 11, 5, -1]


def loop_translate(table: list, locs) -> list:
    """The independent oracle: a Python loop over a list."""
    out = []
    for x in locs:
        x = int(x)
        out.append(-1 if x == -1 else table[x])
    return out


# ------------------------------------------------------------------ make_swa_mapping

@pytest.mark.parametrize("size_full,page_size", [(1, 1), (7, 1), (16, 4), (64, 16), (128, 64)])
def test_make_swa_mapping_layout(size_full, page_size):
    m = make_swa_mapping(size_full, page_size)
    assert m.dtype == np.int64 and m.ndim == 1
    assert m.shape == (size_full + page_size + 1,)
    assert m.tolist() == [0] * (size_full + page_size) + [-1]


def test_make_swa_mapping_numpy_ints_and_fresh_arrays():
    a = make_swa_mapping(np.int64(8), np.int32(2))
    b = make_swa_mapping(8, 2)
    assert a.tolist() == b.tolist() == [0] * 10 + [-1]
    assert not np.shares_memory(a, b)


@pytest.mark.parametrize("args,exc,pattern", [
    ((0, 1), ValueError, r"size_full=0"),
    ((-4, 1), ValueError, r"size_full=-4"),
    ((4, 0), ValueError, r"page_size=0"),
    ((4, -2), ValueError, r"page_size=-2"),
    ((6, 4), ValueError, r"size_full=6 is not a multiple of page_size=4"),
    ((4.0, 1), TypeError, r"size_full.*float"),
    ((4, 1.0), TypeError, r"page_size.*float"),
    ((True, 1), TypeError, r"size_full.*bool"),
    ((4, None), TypeError, r"page_size.*NoneType"),
    (("4", 1), TypeError, r"size_full.*str"),
])
def test_make_swa_mapping_bad_sizes(args, exc, pattern):
    with pytest.raises(exc, match=pattern):
        make_swa_mapping(*args)


# ------------------------------------------------------------------ translate: valid inputs

@pytest.mark.parametrize("mdt", INDEX)
@pytest.mark.parametrize("ldt", INDEX)
def test_translate_hand_table_all_dtype_pairs(mdt, ldt):
    mapping = np.array(HAND, dtype=mdt)
    locs = [0, 1, 2, 3, 4, 5, 6, 7, -1, 7, 1, -1, 0]
    loc = np.array(locs, dtype=ldt)
    out = translate_full_to_swa(mapping, loc)
    assert out.dtype == np.dtype(mdt)
    assert out.shape == loc.shape
    assert out.tolist() == loop_translate(HAND, locs)
    assert out.tolist() == [0, 7, 3, 0, 9, 2, 11, 5, -1, 5, 7, -1, 0]  # written out by hand


@pytest.mark.parametrize("mdt", INDEX)
@pytest.mark.parametrize("ldt", INDEX)
def test_translate_empty(mdt, ldt):
    mapping = np.array(HAND, dtype=mdt)
    for shape in [(0,), (0, 3), (2, 0)]:
        out = translate_full_to_swa(mapping, np.zeros(shape, dtype=ldt))
        assert out.shape == shape and out.dtype == np.dtype(mdt)


def test_translate_minus_one_is_the_sentinel():
    mapping = np.array([0, 4, 5, -1], dtype=np.int64)
    assert translate_full_to_swa(mapping, np.array([-1, -1])).tolist() == [-1, -1]
    # -1 works on a table with nothing but the sentinel
    only = np.array([-1], dtype=np.int32)
    assert translate_full_to_swa(only, np.array([-1], dtype=np.int32)).tolist() == [-1]


def test_translate_preserves_2d_and_0d_shapes():
    mapping = np.array(HAND, dtype=np.int32)
    loc = np.array([[1, 2, -1], [7, 0, 4]], dtype=np.int64)
    out = translate_full_to_swa(mapping, loc)
    assert out.shape == (2, 3)
    assert out.tolist() == [[7, 3, -1], [5, 0, 9]]
    scalar = translate_full_to_swa(mapping, np.array(6, dtype=np.int32))
    assert scalar.shape == () and int(scalar) == 11


@pytest.mark.parametrize("ldt", INDEX)
def test_translate_strided_and_noncontiguous_views(ldt):
    mapping = np.array(HAND, dtype=np.int64)
    big = np.array([99, 1, 99, 4, 99, -1, 99, 6, 99], dtype=ldt)  # 99 would be out of range
    view = big[1::2]
    assert not view.flags.c_contiguous
    assert translate_full_to_swa(mapping, view).tolist() == loop_translate(HAND, [1, 4, -1, 6])
    rev = np.array([0, 1, 2, 3], dtype=ldt)[::-1]
    assert translate_full_to_swa(mapping, rev).tolist() == [0, 3, 7, 0]
    grid = np.array([[1, 2], [3, 4], [5, 6]], dtype=ldt).T  # Fortran-ordered view, shape (2, 3)
    assert translate_full_to_swa(mapping, grid).tolist() == [[7, 0, 2], [3, 9, 11]]
    # a strided mapping view is a valid mapping too
    wide = np.array([0, 50, 7, 50, 3, 50, -1], dtype=np.int64)[::2]
    assert translate_full_to_swa(wide, np.array([1, 2, -1], dtype=ldt)).tolist() == [7, 3, -1]


def test_translate_does_not_mutate_and_returns_new_array():
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([[3, -1], [1, 7]], dtype=np.int32)
    before = (mapping.tobytes(), loc.tobytes())
    out = translate_full_to_swa(mapping, loc)
    assert (mapping.tobytes(), loc.tobytes()) == before
    assert not np.shares_memory(out, mapping) and not np.shares_memory(out, loc)
    out[...] = 123
    assert mapping.tolist() == HAND


def test_translate_read_only_inputs():
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([1, -1], dtype=np.int64)
    mapping.flags.writeable = False
    loc.flags.writeable = False
    assert translate_full_to_swa(mapping, loc).tolist() == [7, -1]


@settings(max_examples=150, derandomize=True, deadline=None)
@given(data=st.data(), mdt=st.sampled_from(INDEX), ldt=st.sampled_from(INDEX))
def test_translate_matches_python_loop(data, mdt, ldt):
    info = np.iinfo(mdt)
    table = data.draw(st.lists(st.integers(int(info.min), int(info.max)), max_size=40))
    full = table + [-1]
    shape = data.draw(st.lists(st.integers(0, 4), max_size=3).map(tuple))
    count = int(np.prod(shape)) if shape else 1
    locs = data.draw(st.lists(st.integers(-1, len(table) - 1), min_size=count, max_size=count))
    mapping = np.array(full, dtype=mdt)
    loc = np.array(locs, dtype=ldt).reshape(shape)
    out = translate_full_to_swa(mapping, loc)
    assert out.dtype == np.dtype(mdt) and out.shape == shape
    assert out.reshape(-1).tolist() == loop_translate(full, locs)


# ------------------------------------------------------------------ translate: rejected locs

@pytest.mark.parametrize("ldt", INDEX)
@pytest.mark.parametrize("bad", [-2, -3, -9])
def test_translate_other_negatives_raise_with_position(ldt, bad):
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([1, -1, bad, 4], dtype=ldt)
    msg = (f"loc[2] = {bad}: only -1 (the padding sentinel) may be negative; plain indexing would "
           f"wrap it to mapping[{bad}]")
    with pytest.raises(ValueError, match=re.escape(msg)):
        translate_full_to_swa(mapping, loc)
    # plain indexing really would have returned a table entry: the hazard being refused
    assert mapping[bad] == HAND[bad]


def test_translate_int32_min_raises():
    mapping = np.array(HAND, dtype=np.int32)
    loc = np.array([np.iinfo(np.int32).min], dtype=np.int32)
    with pytest.raises(ValueError, match=r"loc\[0\] = -2147483648: only -1"):
        translate_full_to_swa(mapping, loc)


@pytest.mark.parametrize("ldt", INDEX)
@pytest.mark.parametrize("bad", [len(HAND) - 1, len(HAND), 1000])
def test_translate_past_the_table_raises(ldt, bad):
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([0, bad], dtype=ldt)
    with pytest.raises(ValueError, match=rf"loc\[1\] = {bad}: past the table \(entries 0\.\.7\); "
                                         r"mapping\[8\] is the sentinel"):
        translate_full_to_swa(mapping, loc)


def test_translate_position_is_multi_index_and_first_in_c_order():
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([[0, 1, 2], [3, 50, -2]], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^loc\[1, 1\] = 50: past the table"):
        translate_full_to_swa(mapping, loc)
    with pytest.raises(ValueError, match=r"^loc\[1, 2\] = -2"):
        translate_full_to_swa(mapping, np.array([[0, 1, 2], [3, 4, -2]], dtype=np.int32))
    with pytest.raises(ValueError, match=r"^loc\[\(\)\] = -5"):
        translate_full_to_swa(mapping, np.array(-5))


def test_translate_position_in_strided_view_is_the_views_position():
    mapping = np.array(HAND, dtype=np.int64)
    big = np.array([0, 1, -7, 2, 0, -3], dtype=np.int64)
    with pytest.raises(ValueError, match=r"^loc\[2\] = -3"):
        translate_full_to_swa(mapping, big[1::2])  # [1, 2, -3]; -7 is not part of the view


@settings(max_examples=100, derandomize=True, deadline=None)
@given(data=st.data())
def test_translate_reports_the_first_bad_position(data):
    n = data.draw(st.integers(1, 12))
    mapping = np.array(list(range(n)) + [-1], dtype=np.int64)
    shape = data.draw(st.lists(st.integers(1, 3), min_size=1, max_size=3).map(tuple))
    size = int(np.prod(shape))
    locs = data.draw(st.lists(st.integers(-1, n - 1), min_size=size, max_size=size))
    bad_values = st.one_of(st.integers(-10**6, -2), st.integers(n, n + 10**6))
    for _ in range(data.draw(st.integers(1, 3))):
        locs[data.draw(st.integers(0, size - 1))] = data.draw(bad_values)
    loc = np.array(locs, dtype=np.int64).reshape(shape)
    # independent: walk positions in C order with np.ndindex
    first = next(idx for idx in np.ndindex(*shape) if not -1 <= loc[idx] < n)
    where = f"loc[{', '.join(map(str, first))}] = {loc[first]}:"
    with pytest.raises(ValueError) as err:
        translate_full_to_swa(mapping, loc)
    assert str(err.value).startswith(where)


# ------------------------------------------------------------------ translate: rejected arguments

@pytest.mark.parametrize("last", [0, 5, -2])
def test_translate_mapping_must_end_in_sentinel(last):
    mapping = np.array([0, 3, 4, last], dtype=np.int64)
    with pytest.raises(ValueError, match=rf"mapping\[-1\] = {last} \(mapping\[3\]\)"):
        translate_full_to_swa(mapping, np.array([1], dtype=np.int64))


@pytest.mark.parametrize("mapping,exc,pattern", [
    ([0, 1, -1], TypeError, r"mapping must be a numpy array, got list"),
    (np.array([0.0, 1.0, -1.0]), TypeError, r"mapping has dtype float64"),
    (np.array([0, 1, 2**32 - 1], dtype=np.uint32), TypeError, r"mapping has dtype uint32"),
    (np.array([0, 1, -1], dtype=np.int16), TypeError, r"mapping has dtype int16"),
    (np.array([[0, -1], [0, -1]], dtype=np.int64), ValueError, r"mapping must be 1-D"),
    (np.array([], dtype=np.int64), ValueError, r"mapping is empty"),
])
def test_translate_bad_mapping(mapping, exc, pattern):
    with pytest.raises(exc, match=pattern):
        translate_full_to_swa(mapping, np.array([0], dtype=np.int64))


@pytest.mark.parametrize("loc,exc,pattern", [
    ([0, 1], TypeError, r"loc must be a numpy array, got list"),
    (3, TypeError, r"loc must be a numpy array, got int"),
    (np.array([0.0]), TypeError, r"loc has dtype float64"),
    (np.array([True]), TypeError, r"loc has dtype bool"),
    (np.array([1], dtype=np.uint64), TypeError, r"loc has dtype uint64"),
    (np.array([1], dtype=np.int8), TypeError, r"loc has dtype int8"),
])
def test_translate_bad_loc(loc, exc, pattern):
    with pytest.raises(exc, match=pattern):
        translate_full_to_swa(np.array(HAND, dtype=np.int64), loc)


def test_translate_rejects_before_mutating_or_computing():
    mapping = np.array(HAND, dtype=np.int64)
    loc = np.array([1, 2, -4], dtype=np.int64)
    before = (mapping.tobytes(), loc.tobytes())
    with pytest.raises(ValueError):
        translate_full_to_swa(mapping, loc)
    assert (mapping.tobytes(), loc.tobytes()) == before
