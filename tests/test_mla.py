"""set_mla_kv_buffer and concat_and_cache_mla against per-row loop oracles, on sentinel-filled
buffers (so untouched tails and skipped slots are visible), compared bitwise whole."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from loop_oracles import (Unchanged, assert_bits_equal, loop_concat_mla, loop_mla_buffer, poison,
                          random_bits, random_values)
from oracle.reference.mla import concat_and_cache_mla, set_mla_kv_buffer
from oracle.reference.slots import OneOfRows, check_outcome

PADS = {"none": None, "negative": -1, "reserved:0": 0}


def make_loc(rng, num_slots, count, padding, index_dtype):
    slots = rng.permutation(np.arange(1, num_slots))[:count]
    pad = PADS[padding]
    if pad is not None and count:
        slots[rng.random(count) < 0.3] = pad
        slots[0] = pad
    return slots.astype(index_dtype)


def shaped(rows, three_d):
    return rows.reshape(rows.shape[0], 1, rows.shape[1]) if three_d else rows


# (dtype, nope, rope, W): fp8 byte rows (528 + 128 in 656 and wider), bf16 latent, odd sizes
LAYOUTS = [(np.uint8, 528, 128, 656), (np.uint8, 528, 128, 700), (ml_dtypes.bfloat16, 512, 64, 576),
           (np.float16, 46, 1, 97), (np.float32, 1, 46, 47), (np.uint8, 97, 3, 128)]


@pytest.mark.parametrize("buffer_3d, nope_3d, rope_3d", [
    (False, False, False), (True, True, True), (True, False, True), (False, True, False)])
@pytest.mark.parametrize("padding", list(PADS))
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype, n, r, width", LAYOUTS,
                         ids=[f"{np.dtype(d).name}-{n}+{r}in{w}" for d, n, r, w in LAYOUTS])
def test_set_mla_kv_buffer_matches_loop(dtype, n, r, width, index_dtype, padding, buffer_3d,
                                        nope_3d, rope_3d):
    rng = np.random.default_rng([n, r, width, len(padding)])
    num_slots = 24
    shape = (num_slots, 1, width) if buffer_3d else (num_slots, width)
    buffer = poison(shape, dtype, salt=width)
    for count in (0, 1, 13):
        loc = make_loc(rng, num_slots, count, padding, index_dtype)
        nope = shaped(random_bits(rng, (count, n), dtype), nope_3d)
        rope = shaped(random_bits(rng, (count, r), dtype), rope_3d)
        guard = Unchanged(buffer, loc, nope, rope)
        got = set_mla_kv_buffer(buffer, loc, nope, rope, padding=padding)
        guard.verify()
        assert_bits_equal(got, loop_mla_buffer(buffer, loc, nope, rope, padding))


def test_set_mla_kv_buffer_duplicates():
    rng = np.random.default_rng(2)
    buffer = poison((8, 656), np.uint8)
    loc = np.array([3, 5, 3, 3, 0, 5], np.int64)
    nope = random_bits(rng, (6, 528), np.uint8)
    rope = random_bits(rng, (6, 128), np.uint8)
    with pytest.raises(ValueError, match=r"loc writes slot 3 more than once, at positions 0, 2, 3"):
        set_mla_kv_buffer(buffer, loc, nope, rope)
    outcome = set_mla_kv_buffer(buffer, loc, nope, rope, padding="reserved:0", duplicates="any")
    assert isinstance(outcome, OneOfRows)
    for at3, at5 in itertools.product((0, 2, 3), (1, 5)):
        actual = loop_mla_buffer(buffer, loc, nope, rope, "reserved:0", winners={3: at3, 5: at5})
        assert check_outcome(outcome, actual) is None
    torn = loop_mla_buffer(buffer, loc, nope, rope, "reserved:0", winners={3: 0})
    torn[3, 528:656] = rope[2]  # nope of position 0, rope of position 2
    assert "torn row: bytes 0..527 from position 0, 528..655 from position 2" in outcome.check(torn)
    foreign = loop_mla_buffer(buffer, loc, nope, rope, "reserved:0")
    foreign[3, :] = foreign[5, :]
    assert "matches none of the 3 colliding rows" in outcome.check(foreign)


@pytest.mark.parametrize("padding", ["negative", "none", "reserved:0"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16, np.float32, np.uint8],
                         ids=lambda d: np.dtype(d).name)
def test_concat_and_cache_mla_copy_matches_loop(dtype, index_dtype, padding):
    rng = np.random.default_rng([np.dtype(dtype).itemsize, len(padding)])
    rank, rope = 46, 17
    cache = poison((3, 5, rank + rope), dtype)
    for count in (0, 1, 11):
        mapping = make_loc(rng, 15, count, padding, index_dtype)
        kv_c = random_bits(rng, (count + 2, rank), dtype)  # padded batch: extra rows ignored
        k_pe = random_bits(rng, (count + 2, rope), dtype)
        guard = Unchanged(cache, mapping, kv_c, k_pe)
        got = concat_and_cache_mla(cache, mapping, kv_c, k_pe, padding=padding)
        guard.verify()
        assert_bits_equal(got, loop_concat_mla(cache, mapping, kv_c, k_pe, padding=padding))


@pytest.mark.parametrize("scale", [1.0, 0.1, np.array(3.0, np.float32), np.array([0.02], np.float32)],
                         ids=["1", "0.1", "array()", "array(1)"])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "fp8_e4m3"])
def test_concat_and_cache_mla_fp8_matches_clamped_ml_dtypes(fmt, scale):
    rng = np.random.default_rng([len(fmt), 9])
    rank, rope = 64, 16
    for dtype in [ml_dtypes.bfloat16, np.float16, np.float32]:
        cache = poison((4, 4, rank + rope), np.uint8)
        mapping = make_loc(rng, 16, 12, "negative", np.int64)
        kv_c = random_values(rng, (12, rank), dtype)
        k_pe = random_values(rng, (12, rope), dtype)
        guard = Unchanged(cache, mapping, kv_c, k_pe, scale)
        got = concat_and_cache_mla(cache, mapping, kv_c, k_pe, kv_cache_dtype=fmt, scale=scale)
        guard.verify()
        assert_bits_equal(got, loop_concat_mla(cache, mapping, kv_c, k_pe, fmt, scale))


def test_concat_and_cache_mla_duplicates_fp8():
    rng = np.random.default_rng(4)
    cache = poison((2, 4, 10), np.uint8)
    mapping = np.array([6, 6, -1, 1], np.int64)
    kv_c = random_values(rng, (4, 8), np.float32)
    k_pe = random_values(rng, (4, 2), np.float32)
    outcome = concat_and_cache_mla(cache, mapping, kv_c, k_pe, kv_cache_dtype="fp8",
                                   scale=0.5, duplicates="any")
    for at6 in (0, 1):
        actual = loop_concat_mla(cache, mapping, kv_c, k_pe, "fp8", 0.5, winners={6: at6})
        assert outcome.check(actual) is None
    actual[1, 2, 8:] = loop_concat_mla(cache, mapping, kv_c, k_pe, "fp8", 0.5, winners={6: 0})[1, 2, 8:]
    assert "torn" in outcome.check(actual)


# ---- bad arguments ------------------------------------------------------------------------

def mla_buffer_args():
    return dict(kv_buffer=poison((8, 1, 656), np.uint8), loc=np.array([1, 6, 0], np.int64),
                nope=np.ones((3, 528), np.uint8), rope=np.ones((3, 1, 128), np.uint8))


@pytest.mark.parametrize("change, error, message", [
    ({"loc": np.array([1, 6, 0], np.uint32)}, TypeError, r"loc has dtype uint32; expected one of"),
    ({"loc": np.array([1, 6, 0], np.float32)}, TypeError, r"loc has dtype float32"),
    ({"loc": np.array([1, 6, 0], np.int16)}, TypeError, r"loc has dtype int16"),
    ({"loc": np.array([[1, 6, 0]], np.int64)}, ValueError, r"loc must be 1-D"),
    ({"loc": np.array([1, 8, 0], np.int64)}, ValueError,
     r"loc\[1\] = 8 is out of range \[0, 8\) under padding='none'"),
    ({"loc": np.array([1, -1, 0], np.int64)}, ValueError, r"loc\[1\] = -1 is out of range"),
    ({"loc": np.array([1, -1, 0], np.int64), "padding": "reserved:0"}, ValueError,
     r"loc\[1\] = -1 .*padding='reserved:0'"),
    ({"padding": "negatives"}, ValueError, r"padding='negatives'"),
    ({"duplicates": "none"}, ValueError, r"duplicates='none'"),
    ({"kv_buffer": poison((8, 600), np.uint8)}, ValueError,
     r"kv_buffer rows have 600 elements, fewer than nope \(528\) \+ rope \(128\) = 656"),
    ({"kv_buffer": poison((8, 2, 656), np.uint8)}, ValueError, r"kv_buffer must have shape"),
    ({"nope": np.ones((3, 2, 264), np.uint8)}, ValueError, r"nope must have shape"),
    ({"nope": np.ones((2, 528), np.uint8)}, ValueError, r"nope has 2 rows but loc has 3"),
    ({"rope": np.ones((3, 64), np.uint16)}, TypeError, r"rope has dtype uint16 but kv_buffer"),
    ({"nope": np.ones((3, 528), np.int8)}, TypeError, r"nope has dtype int8"),
])
def test_set_mla_kv_buffer_bad_arguments(change, error, message):
    args = mla_buffer_args()
    args.update(change)
    positional = [args.pop(k) for k in ("kv_buffer", "loc", "nope", "rope")]
    with pytest.raises(error, match=message):
        set_mla_kv_buffer(*positional, **args)


def concat_args(fmt="auto"):
    dtype = np.uint8 if fmt != "auto" else ml_dtypes.bfloat16
    return dict(kv_cache=poison((2, 4, 20), dtype), slot_mapping=np.array([1, -1, 6], np.int64),
                kv_c=np.ones((3, 16), ml_dtypes.bfloat16), k_pe=np.ones((3, 4), ml_dtypes.bfloat16),
                kv_cache_dtype=fmt)


@pytest.mark.parametrize("fmt, change, error, message", [
    ("auto", {"slot_mapping": np.array([1, 2, 6], np.uint32)}, TypeError,
     r"slot_mapping has dtype uint32; expected one of: int32, int64"),
    ("auto", {"slot_mapping": np.array([1, 2, 6], np.float32)}, TypeError, r"slot_mapping has dtype float32"),
    ("auto", {"slot_mapping": np.array([[1, 2, 6]], np.int32)}, ValueError, r"slot_mapping must be 1-D"),
    ("auto", {"slot_mapping": np.array([1, 2, 8], np.int32)}, ValueError,
     r"slot_mapping\[2\] = 8 is out of range \[0, 8\) under padding='negative'"),
    ("auto", {"padding": "reserved:0"}, ValueError, r"slot_mapping\[1\] = -1 .*reserved:0"),
    ("auto", {"kv_cache": poison((2, 4, 21), ml_dtypes.bfloat16)}, ValueError,
     r"kv_cache has entries of 21 elements; expected kv_c \(16\) \+ k_pe \(4\) = 20"),
    ("auto", {"kv_cache": poison((2, 4, 19), ml_dtypes.bfloat16)}, ValueError, r"kv_cache has entries of 19"),
    ("auto", {"kv_cache": poison((8, 20), ml_dtypes.bfloat16)}, ValueError, r"kv_cache must be 3-D"),
    ("auto", {"k_pe": np.ones((3, 1, 4), ml_dtypes.bfloat16)}, ValueError, r"k_pe must be 2-D"),
    ("auto", {"kv_c": np.ones((2, 16), ml_dtypes.bfloat16)}, ValueError, r"kv_c has 2 tokens"),
    ("auto", {"k_pe": np.ones((3, 4), np.float16)}, TypeError, r"k_pe has dtype float16 but kv_c"),
    ("auto", {"kv_cache": poison((2, 4, 20), np.float32)}, TypeError, r"kv_cache has dtype float32"),
    ("auto", {"kv_cache_dtype": "fp8_ds_mla"}, ValueError, r"kv_cache_dtype='fp8_ds_mla'"),
    ("auto", {"duplicates": "all"}, ValueError, r"duplicates='all'"),
    ("auto", {"nan": "0x7F"}, ValueError, r"preset and fp8 knobs apply only"),
    ("fp8", {"kv_c": np.ones((3, 16), np.float64), "k_pe": np.ones((3, 4), np.float64)}, TypeError,
     r"kv_c has dtype float64"),
    ("fp8", {"kv_cache": poison((2, 4, 20), ml_dtypes.bfloat16)}, TypeError,
     r"kv_cache has dtype bfloat16; expected one of: uint8"),
    ("fp8", {"scale": 0.0}, ValueError, r"scale: .*> 0, got 0.0"),
    ("fp8", {"scale": -1}, ValueError, r"scale: .*> 0, got -1"),
    ("e5m2", {"scale": np.array([1.0, 2.0], np.float32)}, ValueError,
     r"scale has shape \(2,\); concat_and_cache_mla takes one per-tensor scale"),
    ("e5m2", {"scale": np.array(1.0, np.float64)}, TypeError, r"scale: scale has dtype float64"),
])
def test_concat_and_cache_mla_bad_arguments(fmt, change, error, message):
    args = concat_args(fmt)
    args.update(change)
    positional = [args.pop(k) for k in ("kv_cache", "slot_mapping", "kv_c", "k_pe")]
    with pytest.raises(error, match=message):
        concat_and_cache_mla(*positional, **args)

