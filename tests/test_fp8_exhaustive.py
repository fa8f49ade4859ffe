"""Every float32 input (all 2**32 bit patterns), all four fp8 formats, both saturation modes, vs
ml_dtypes, exact code equality.

- non-saturating: ``quantize(x, fmt, preset="ml_dtypes")`` == ml_dtypes ``astype``;
- saturating: ``quantize(x, fmt, saturate=True, inf="max", nan=<ml_dtypes' NaN byte>)`` ==
  ml_dtypes after an explicit clamp to ±max. The clamp changes only inputs with |x| > max
  (finite or inf), which all become ml_dtypes(±max), so the saturating oracle is the
  non-saturating ml_dtypes output with those replaced: one ml_dtypes cast per format serves both.

64 test items of 2**26 inputs (the top 6 bits), so ``pytest -n 2`` spreads them over the cores;
each walks its range in blocks of 2**17 to keep the working set in cache and memory flat.
Run: ``pytest -m exhaustive -n 2 tests/test_fp8_exhaustive.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference.fp8 import quantize

N_CHUNKS = 64
CHUNK = (1 << 32) // N_CHUNKS
BLOCK = 1 << 17
OFFSETS = np.arange(BLOCK, dtype=np.uint32)
INF_BITS = o.F32_INF_BITS


def _saturating_expected(bits, nonsat, fmt, lo, hi, sat_code):
    """The clamped-ml_dtypes codes of one block of same-sign inputs whose magnitudes (bit
    patterns) span [lo, hi]; decided per block where the whole block is in or out of range."""
    max_bits = o.FMAX_BITS[fmt]
    if hi <= max_bits or lo > INF_BITS:  # all within ±max, or all NaN: the clamp changes nothing
        return nonsat
    if lo > max_bits and hi <= INF_BITS:  # all beyond max (or inf): all clamp to ±max
        return np.full(bits.shape, sat_code, np.uint8)
    return o.sat_from_nonsat(bits, nonsat, fmt)


def check_range(start: int, count: int, formats=o.FORMAT_NAMES):
    """Check inputs with bit patterns [start, start + count) (block-aligned); returns a list of
    failure descriptions (empty when everything matches)."""
    assert start % BLOCK == 0 and count % BLOCK == 0
    sat_knobs = {fmt: o.sat_knobs(fmt) for fmt in formats}
    max_codes = {fmt: o.ml_max_codes(fmt) for fmt in formats}
    failures = {}
    for block_start in range(start, start + count, BLOCK):
        bits = OFFSETS + np.uint32(block_start)
        x = bits.view(np.float32)
        negative = block_start >= 1 << 31
        lo = block_start & 0x7FFFFFFF
        hi = lo + BLOCK - 1
        for fmt in formats:
            nonsat = o.ml_codes(x, fmt)
            got = quantize(x, fmt, preset="ml_dtypes")
            if not np.array_equal(got, nonsat):
                _record(failures, (fmt, "non-saturating"), got, nonsat, x)
            sat_code = max_codes[fmt][1 if negative else 0]
            expected = _saturating_expected(bits, nonsat, fmt, lo, hi, sat_code)
            got = quantize(x, fmt, **sat_knobs[fmt])
            if not np.array_equal(got, expected):
                _record(failures, (fmt, "saturating"), got, expected, x)
    return [f"{fmt} {mode}: {n} inputs differ; (input bits, reference, oracle): {rows}"
            for (fmt, mode), (n, rows) in failures.items()]


def _record(failures, key, got, expected, x):
    rows, count = o.mismatches(got, expected, x, limit=4)
    n, old = failures.get(key, (0, []))
    failures[key] = (n + count, (old + rows)[:8])


@pytest.mark.exhaustive
@pytest.mark.parametrize("chunk", range(N_CHUNKS), ids=lambda c: f"0x{c * CHUNK:08X}")
def test_every_float32(chunk):
    failures = check_range(chunk * CHUNK, CHUNK)
    assert not failures, "\n".join(failures)


def test_check_range_catches_a_wrong_oracle(monkeypatch):
    """The harness itself: with the oracle's max code deliberately wrong it must report
    failures (and only in saturating mode), so a silent pass means something."""
    assert check_range(0x43E80000 & ~(BLOCK - 1), BLOCK, formats=("e4m3fn",)) == []
    monkeypatch.setattr(o, "ml_max_codes", lambda fmt: (0x7D, 0xFD))
    failures = check_range(0x43E80000 & ~(BLOCK - 1), BLOCK, formats=("e4m3fn",))
    assert len(failures) == 1 and failures[0].startswith("e4m3fn saturating")


def test_block_shortcuts_match_the_elementwise_clamp():
    """_saturating_expected's per-block shortcuts equal ml_dtypes of the explicitly clamped
    input, on blocks all below max, straddling max, all above max, straddling inf, all NaN."""
    for fmt in o.FORMAT_NAMES:
        max_bits = o.FMAX_BITS[fmt]
        for sign in (0, 1 << 31):
            for block_start in (0x3F800000, max_bits & ~(BLOCK - 1), (max_bits | 0xFFFFF) + 1,
                                INF_BITS & ~(BLOCK - 1), INF_BITS + BLOCK, 0x7FFF0000):
                block_start |= sign
                bits = OFFSETS + np.uint32(block_start)
                x = bits.view(np.float32)
                lo = block_start & 0x7FFFFFFF
                nonsat = o.ml_codes(x, fmt)
                got = _saturating_expected(bits, nonsat, fmt, lo, lo + BLOCK - 1,
                                           o.ml_max_codes(fmt)[1 if sign else 0])
                np.testing.assert_array_equal(got, o.ml_saturating(x, fmt),
                                              err_msg=f"{fmt} block 0x{block_start:08X}")
