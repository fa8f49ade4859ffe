"""reshape_and_cache_flash against the per-row, per-head loop oracle (fp8 via ml_dtypes after a
clamp), on sentinel-filled caches in both layouts, compared bitwise whole."""

from __future__ import annotations

import itertools

import ml_dtypes
import numpy as np
import pytest

from loop_oracles import (FP8_TYPES, Unchanged, assert_bits_equal, loop_paged, poison,
                          random_bits, random_values)
from oracle.reference.paged import reshape_and_cache_flash
from oracle.reference.slots import OneOfRows, check_outcome

FLOATS = [ml_dtypes.bfloat16, np.float16, np.float32]


def caches(layout, num_blocks, block_size, heads, head_size, value_head_size, dtype):
    def shape(d):
        return ((num_blocks, block_size, heads, d) if layout == "NHD"
                else (num_blocks, heads, block_size, d))
    return poison(shape(head_size), dtype, salt=1), poison(shape(value_head_size), dtype, salt=2)


def slot_mapping(rng, num_slots, count, index_dtype, padding="negative"):
    slots = rng.permutation(np.arange(1, num_slots))[:count]
    pad = {"negative": -1, "reserved:0": 0}.get(padding)
    if pad is not None and count:
        slots[rng.random(count) < 0.3] = pad
        slots[0] = pad
    return slots.astype(index_dtype)


def run_and_compare(key_cache, value_cache, mapping, key, value, *, layout, fmt=None,
                    k_scale=1.0, v_scale=1.0, padding="negative"):
    guard = Unchanged(key_cache, value_cache, mapping, key, value, k_scale, v_scale)
    got = reshape_and_cache_flash(key_cache, value_cache, mapping, key, value, layout=layout,
                                  kv_cache_dtype=fmt or "auto", k_scale=k_scale,
                                  v_scale=v_scale, padding=padding)
    guard.verify()
    want = loop_paged(key_cache, value_cache, mapping, key, value, layout, fmt, k_scale, v_scale,
                      padding)
    for g, w in zip(got, want):
        assert_bits_equal(g, w)
    return got


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("index_dtype", [np.int32, np.int64])
@pytest.mark.parametrize("dtype", FLOATS + [np.uint8], ids=lambda d: np.dtype(d).name)
def test_copy_matches_loop(dtype, index_dtype, layout):
    rng = np.random.default_rng([np.dtype(dtype).itemsize, len(layout), 7])
    heads, head_size, value_head_size = 3, 46, 97  # V has its own head size
    key_cache, value_cache = caches(layout, 5, 4, heads, head_size, value_head_size, dtype)
    for count in (0, 1, 9, 19):
        mapping = slot_mapping(rng, 20, count, index_dtype)
        tokens = count + 3  # CUDA-graph padding: rows past len(slot_mapping) are ignored
        key = random_bits(rng, (tokens, heads, head_size), dtype)
        value = random_bits(rng, (tokens, heads, value_head_size), dtype)
        run_and_compare(key_cache, value_cache, mapping, key, value, layout=layout)


@pytest.mark.parametrize("padding", ["none", "reserved:0"])
def test_other_padding_policies(padding):
    rng = np.random.default_rng(11)
    key_cache, value_cache = caches("NHD", 3, 8, 2, 4, 4, np.float16)
    mapping = slot_mapping(rng, 24, 10, np.int64, padding)
    key = random_bits(rng, (10, 2, 4), np.float16)
    value = random_bits(rng, (10, 2, 4), np.float16)
    k, v = run_and_compare(key_cache, value_cache, mapping, key, value, layout="NHD",
                           padding=padding)
    if padding == "reserved:0":
        assert_bits_equal(k[0, 0], key_cache[0, 0])


def test_extra_source_rows_are_never_written():
    key_cache, value_cache = caches("HND", 2, 4, 1, 2, 2, np.float32)
    key = np.arange(12, dtype=np.float32).reshape(6, 1, 2)
    k, v = reshape_and_cache_flash(key_cache, value_cache, np.array([7], np.int64), key, key,
                                   layout="HND")
    expected = key_cache.copy()
    expected[1, 0, 3] = key[0, 0]
    assert_bits_equal(k, expected)


SCALES = {
    "float": (0.37, 2.0),
    "scalar_array": (np.array(0.37, np.float32), np.array(1.0, np.float32)),
    "one_array": (np.array([3.0], np.float32), np.array([0.05], np.float32)),
    "per_head": (np.array([0.5, 1.0, 7.0], np.float32), np.array([0.01, 2.5, 0.3], np.float32)),
}


@pytest.mark.parametrize("scales", list(SCALES), ids=list(SCALES))
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz", "fp8", "fp8_e5m2"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_matches_clamped_ml_dtypes(fmt, scales, layout):
    rng = np.random.default_rng([len(fmt), len(scales), len(layout)])
    k_scale, v_scale = SCALES[scales]
    for dtype in FLOATS:
        key_cache, value_cache = caches(layout, 4, 4, 3, 16, 8, np.uint8)
        mapping = slot_mapping(rng, 16, 12, np.int64)
        key = random_values(rng, (14, 3, 16), dtype)
        value = random_values(rng, (14, 3, 8), dtype)
        run_and_compare(key_cache, value_cache, mapping, key, value, layout=layout, fmt=fmt,
                        k_scale=k_scale, v_scale=v_scale)


def test_fp8_sees_saturation_and_zero_signs():
    """The generated values do reach the edges this test family is meant to cover."""
    values = random_values(np.random.default_rng(0), (14, 3, 16), np.float32)
    assert (np.abs(values) / 0.37 > 448).any() and (np.signbit(values) & (values == 0)).any()


def test_fp8_preset_reaches_the_conversion():
    """preset="ml_dtypes" must give ml_dtypes' own non-saturating codes (overflow to NaN)."""
    key_cache, value_cache = caches("NHD", 1, 4, 1, 4, 4, np.uint8)
    key = np.array([[[1.0, 500.0, -1e6, 0.3]]] * 2, np.float32)
    mapping = np.array([2, 0], np.int64)
    k, v = reshape_and_cache_flash(key_cache, value_cache, mapping, key, key,
                                   kv_cache_dtype="e4m3fn", preset="ml_dtypes")
    codes = (key[0, 0] / np.float32(1.0)).astype(FP8_TYPES["e4m3fn"]).view(np.uint8)
    assert_bits_equal(k[0, 2, 0], codes)
    assert_bits_equal(k[0, 0, 0], codes)
    k_sat, _ = reshape_and_cache_flash(key_cache, value_cache, mapping, key, key,
                                       kv_cache_dtype="e4m3fn", saturate=True)
    assert k_sat[0, 2, 0, 1] == 0x7E and k[0, 2, 0, 1] == 0x7F


def test_fp8_double_rounding_knob_reaches_the_conversion():
    """intermediate="bfloat16" changes codes where rounding twice differs (0x3F37F333: 0x33 vs
    0x34 via float16, documented in the peer facts)."""
    key_cache, value_cache = caches("NHD", 1, 1, 1, 1, 1, np.uint8)
    key = np.array([0x3F37F333], np.uint32).view(np.float32).reshape(1, 1, 1)
    mapping = np.array([0], np.int64)
    once, _ = reshape_and_cache_flash(key_cache, value_cache, mapping, key, key,
                                      kv_cache_dtype="fp8")
    twice, _ = reshape_and_cache_flash(key_cache, value_cache, mapping, key, key,
                                       kv_cache_dtype="fp8", intermediate="float16")
    assert (once.item(), twice.item()) == (0x33, 0x34)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("fmt", [None, "e4m3fn"])
def test_duplicates_any_every_combination_allowed(layout, fmt):
    rng = np.random.default_rng(5)
    dtype = np.uint8 if fmt else ml_dtypes.bfloat16
    key_cache, value_cache = caches(layout, 3, 4, 2, 6, 5, dtype)
    mapping = np.array([9, 3, -1, 9, 3, 11, 9], np.int32)
    src_dtype = np.float32 if fmt else dtype
    key = random_values(rng, (7, 2, 6), src_dtype)
    value = random_values(rng, (7, 2, 5), src_dtype)
    got = reshape_and_cache_flash(key_cache, value_cache, mapping, key, value, layout=layout,
                                  kv_cache_dtype=fmt or "auto", k_scale=0.5, v_scale=0.25,
                                  duplicates="any")
    assert all(isinstance(g, OneOfRows) for g in got)
    for at9, at3 in itertools.product((0, 3, 6), (1, 4)):
        want = loop_paged(key_cache, value_cache, mapping, key, value, layout, fmt, 0.5, 0.25,
                          winners={9: at9, 3: at3})
        assert check_outcome(got[0], want[0]) is None
        assert check_outcome(got[1], want[1]) is None
    # key and value are judged independently: slot 9 may hold position 0's key and 6's value
    k0, _ = loop_paged(key_cache, value_cache, mapping, key, value, layout, fmt, 0.5, 0.25,
                       winners={9: 0})
    assert check_outcome(got[0], k0) is None

    torn = want[0].copy()
    block, offset = divmod(9, 4)
    row = (torn[block, offset] if layout == "NHD" else torn[block, :, offset])
    other = loop_paged(key_cache, value_cache, mapping, key, value, layout, fmt, 0.5, 0.25,
                       winners={9: 0})[0]
    other_row = other[block, offset] if layout == "NHD" else other[block, :, offset]
    row[1] = other_row[1]  # head 1 from another colliding position
    assert "torn" in got[0].check(torn)


def test_duplicates_forbidden_by_default():
    key_cache, value_cache = caches("NHD", 2, 4, 1, 2, 2, np.float32)
    key = np.ones((3, 1, 2), np.float32)
    with pytest.raises(ValueError, match=r"slot_mapping writes slot 5 .* positions 0, 2"):
        reshape_and_cache_flash(key_cache, value_cache, np.array([5, 1, 5], np.int64), key, key)


# ---- bad arguments ------------------------------------------------------------------------

def good_args(fmt="auto"):
    cache_dtype = np.uint8 if fmt != "auto" else np.float16
    key_cache, value_cache = caches("NHD", 2, 4, 2, 3, 5, cache_dtype)
    return dict(key_cache=key_cache, value_cache=value_cache,
                slot_mapping=np.array([1, -1, 6], np.int64),
                key=np.ones((3, 2, 3), np.float16), value=np.ones((3, 2, 5), np.float16),
                kv_cache_dtype=fmt)


BAD = [
    ("auto", {"slot_mapping": np.array([1, 2, 6], np.uint32)}, TypeError,
     r"slot_mapping has dtype uint32; expected one of: int32, int64"),
    ("auto", {"slot_mapping": np.array([1, 2, 6], np.float32)}, TypeError, r"slot_mapping has dtype float32"),
    ("auto", {"slot_mapping": np.array([1, 2, 6], np.int16)}, TypeError, r"slot_mapping has dtype int16"),
    ("auto", {"slot_mapping": np.array([[1, 2, 6]], np.int64)}, ValueError, r"slot_mapping must be 1-D"),
    ("auto", {"slot_mapping": np.array([1, 8, 6], np.int64)}, ValueError,
     r"slot_mapping\[1\] = 8 is out of range \[0, 8\) under padding='negative'"),
    ("auto", {"padding": "reserved:0"}, ValueError,
     r"slot_mapping\[1\] = -1 is out of range .*padding='reserved:0'"),
    ("auto", {"padding": "none"}, ValueError, r"slot_mapping\[1\] = -1 is out of range"),
    ("auto", {"padding": "neg"}, ValueError, r"padding='neg' is not a padding policy"),
    ("auto", {"duplicates": "first"}, ValueError, r"duplicates='first'"),
    ("auto", {"layout": "NDH"}, ValueError, r"layout='NDH'"),
    ("auto", {"kv_cache_dtype": "fp4"}, ValueError, r"kv_cache_dtype='fp4' is not one of"),
    ("auto", {"key": np.ones((3, 2, 3), np.float32)}, TypeError,
     r"value has dtype float16 but key has dtype float32"),
    ("auto", {"key": np.ones((3, 2, 3), np.float32), "value": np.ones((3, 2, 5), np.float32)},
     TypeError, r"key_cache has dtype float16 but key has dtype float32"),
    ("auto", {"key": np.ones((3, 2, 4), np.float16)}, ValueError,
     r"key_cache has shape \(2, 4, 2, 3\); expected \(2, 4, 2, 4\)"),
    ("auto", {"value": np.ones((3, 2, 4), np.float16)}, ValueError, r"value_cache has shape"),
    ("auto", {"value": np.ones((3, 1, 5), np.float16)}, ValueError, r"value has 1 heads but key has 2"),
    ("auto", {"key": np.ones((2, 2, 3), np.float16)}, ValueError,
     r"key has 2 tokens but slot_mapping has 3 entries"),
    ("auto", {"key": np.ones((3, 6), np.float16)}, ValueError, r"key must be 3-D"),
    ("auto", {"key_cache": np.ones((8, 2, 3), np.float16)}, ValueError, r"key_cache must be 4-D"),
    ("auto", {"layout": "HND"}, ValueError, r"key_cache has shape .* \(HND"),
    ("auto", {"preset": "cuda_satfinite"}, ValueError, r"preset and fp8 knobs apply only"),
    ("e4m3fn", {"key": np.ones((3, 2, 3), np.float64), "value": np.ones((3, 2, 5), np.float64)},
     TypeError, r"key has dtype float64"),
    ("fp8", {"key_cache": np.zeros((2, 4, 2, 3), np.int8)}, TypeError,
     r"key_cache has dtype int8; expected one of: uint8"),
    ("fp8", {"value_cache": np.zeros((2, 4, 2, 5), np.float16)}, TypeError,
     r"value_cache has dtype float16; expected one of: uint8"),
    ("e5m2", {"k_scale": 0.0}, ValueError, r"k_scale: .*finite and > 0, got 0.0"),
    ("e5m2", {"v_scale": -2.0}, ValueError, r"v_scale: .*> 0, got -2.0"),
    ("e5m2", {"k_scale": np.array([1.0, 0.0], np.float32)}, ValueError, r"k_scale: .*> 0"),
    ("e5m2", {"k_scale": np.ones(3, np.float32)}, ValueError, r"k_scale: per-head scale has shape \(3,\)"),
    ("e5m2", {"v_scale": np.ones(2, np.float64)}, TypeError, r"v_scale: scale has dtype float64"),
    ("e5m2", {"k_scale": "1"}, TypeError, r"k_scale: scale must be a number"),
    ("e4m3fnuz", {"preset": "cuda_satfinite"}, ValueError, r"preset 'cuda_satfinite' does not cover"),
    ("e4m3fn", {"saturated": True}, TypeError, r"unknown fp8 knob"),
]


@pytest.mark.parametrize("fmt, change, error, message", BAD, ids=[m[:40] for *_, m in BAD])
def test_bad_arguments(fmt, change, error, message):
    args = good_args(fmt)
    args.update(change)
    positional = [args.pop(k) for k in ("key_cache", "value_cache", "slot_mapping", "key", "value")]
    with pytest.raises(error, match=message):
        reshape_and_cache_flash(*positional, **args)


def test_bad_scale_is_rejected_even_when_nothing_is_written():
    args = good_args("fp8")
    args["slot_mapping"] = np.full(3, -1, np.int64)
    positional = [args.pop(k) for k in ("key_cache", "value_cache", "slot_mapping", "key", "value")]
    with pytest.raises(ValueError, match="k_scale"):
        reshape_and_cache_flash(*positional, k_scale=-1.0, **args)
