"""Independent oracles for the cache writers: plain per-row Python loops written from the contract,
sharing no code with oracle.reference (fp8 goes through ml_dtypes after an explicit clamp).

Each writer takes ``winners``, a dict slot -> source position: after the loop, those positions are
written again, so a test can build every outcome a racing kernel may leave at duplicated slots.
Also small test helpers: sentinel-filled caches, random bytes, bitwise comparison.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

FP8_TYPES = {"e4m3fn": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2,
             "e4m3fnuz": ml_dtypes.float8_e4m3fnuz, "e5m2fnuz": ml_dtypes.float8_e5m2fnuz,
             "fp8": ml_dtypes.float8_e4m3fn, "fp8_e4m3": ml_dtypes.float8_e4m3fn,
             "fp8_e5m2": ml_dtypes.float8_e5m2}


def is_skipped(slot, padding):
    if padding == "negative":
        return slot < 0
    if padding.startswith("reserved:"):
        return slot == int(padding.split(":")[1])
    return False


def fp8_row(row, fmt, scale):
    """Saturating fp8 codes of a finite row: clamp x/scale to ±max in float32, then ml_dtypes."""
    fp8_type = FP8_TYPES[fmt]
    largest = float(ml_dtypes.finfo(fp8_type).max)
    quotient = row.astype(np.float32) / np.float32(scale)
    return np.clip(quotient, -largest, largest).astype(fp8_type).view(np.uint8)


def head_scale(scale, head):
    scale = np.asarray(scale, dtype=np.float32).reshape(-1)
    return scale[0] if scale.size == 1 else scale[head]


def loop_store_cache(cache, loc, src, padding="none", winners=None):
    out = cache.copy()

    def put(i):
        out[int(loc[i])] = src[i]

    for i in range(len(loc)):
        slot = int(loc[i])
        if is_skipped(slot, padding):
            continue
        assert 0 <= slot < out.shape[0]
        put(i)
    for i in (winners or {}).values():
        put(i)
    return out


def loop_paged(key_cache, value_cache, slot_mapping, key, value, layout="NHD", fmt=None,
               k_scale=1.0, v_scale=1.0, padding="negative", winners=None):
    key_out, value_out = key_cache.copy(), value_cache.copy()
    block_size = key_cache.shape[1] if layout == "NHD" else key_cache.shape[2]

    def put(i):
        slot = int(slot_mapping[i])
        block, offset = slot // block_size, slot % block_size
        for out, source, scale in ((key_out, key, k_scale), (value_out, value, v_scale)):
            for head in range(source.shape[1]):
                row = source[i, head]
                if fmt is not None:
                    row = fp8_row(row, fmt, head_scale(scale, head))
                if layout == "NHD":
                    out[block, offset, head] = row
                else:
                    out[block, head, offset] = row

    for i in range(len(slot_mapping)):
        if not is_skipped(int(slot_mapping[i]), padding):
            put(i)
    for i in (winners or {}).values():
        put(i)
    return key_out, value_out


def loop_mla_buffer(kv_buffer, loc, nope, rope, padding="none", winners=None):
    out = kv_buffer.copy()

    def put(i):
        row = out[int(loc[i])].reshape(-1)
        assert np.shares_memory(row, out)
        nope_row, rope_row = nope[i].reshape(-1), rope[i].reshape(-1)
        for j in range(len(nope_row)):
            row[j] = nope_row[j]
        for j in range(len(rope_row)):
            row[len(nope_row) + j] = rope_row[j]

    for i in range(len(loc)):
        slot = int(loc[i])
        if not is_skipped(slot, padding):
            assert 0 <= slot < out.shape[0]
            put(i)
    for i in (winners or {}).values():
        put(i)
    return out


def loop_concat_mla(kv_cache, slot_mapping, kv_c, k_pe, fmt=None, scale=1.0,
                    padding="negative", winners=None):
    out = kv_cache.copy()
    block_size = kv_cache.shape[1]

    def put(i):
        slot = int(slot_mapping[i])
        entry = np.concatenate([kv_c[i], k_pe[i]])
        if fmt is not None:
            entry = fp8_row(entry, fmt, head_scale(scale, 0))
        out[slot // block_size, slot % block_size] = entry

    for i in range(len(slot_mapping)):
        if not is_skipped(int(slot_mapping[i]), padding):
            put(i)
    for i in (winners or {}).values():
        put(i)
    return out


# ---- test helpers -------------------------------------------------------------------------

def poison(shape, dtype, salt=0):
    """A cache filled with a sentinel byte pattern (never zeros), viewed as ``dtype``."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    pattern = (np.arange(salt, salt + count, dtype=np.uint64) * np.uint64(2654435761)) % 251 + 1
    return pattern.astype(np.uint8).view(dtype).reshape(shape)


def random_bits(rng, shape, dtype):
    """Arbitrary bit patterns (NaN payloads, -0, infinities included), viewed as ``dtype``."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    return rng.integers(0, 256, count, dtype=np.uint8).view(dtype).reshape(shape)


def random_values(rng, shape, dtype):
    """Finite float values over many magnitudes (some overflow fp8 after scaling), a few ±0."""
    magnitude = rng.choice([1e-6, 1e-2, 1.0, 30.0, 1e3, 1e5], size=shape)
    values = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    values[rng.random(shape) < 0.03] = 0.0
    values[rng.random(shape) < 0.03] = -0.0
    largest = float(ml_dtypes.finfo(dtype).max)
    return np.clip(values, -largest, largest).astype(dtype)


def bits(array):
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


def assert_bits_equal(actual, expected):
    assert isinstance(actual, np.ndarray), f"got {type(actual).__name__}"
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, (
        f"{actual.shape} {actual.dtype} vs {expected.shape} {expected.dtype}")
    differ = np.flatnonzero(bits(actual) != bits(expected))
    assert len(differ) == 0, f"{len(differ)} bytes differ, first at byte {differ[0]}"


class Unchanged:
    """Snapshot the bytes of input arrays; ``verify()`` asserts none was modified."""

    def __init__(self, *arrays):
        self.arrays = [a for a in arrays if isinstance(a, np.ndarray)]
        self.saved = [bits(a).copy() for a in self.arrays]

    def verify(self):
        for array, saved in zip(self.arrays, self.saved):
            assert np.array_equal(bits(array), saved), "an input array was modified"
