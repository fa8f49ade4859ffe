"""``saturate`` alone decides overflow and ±inf, under every preset: checked against ml_dtypes.

The rule (docs/semantics.md, "Knobs"): a knob the caller names wins over the preset, and naming
``saturate`` without ``inf`` also chooses that mode's inf rule. So for every preset and format:

- ``saturate=False`` is the OCP non-saturating conversion: ml_dtypes ``astype`` (overflow and
  ±inf to NaN for e4m3fn, inf for e5m2, 0x80 for fnuz);
- ``saturate=True`` is ml_dtypes after an explicit clamp to ±max (overflow and ±inf to ±max);

with ml_dtypes' own NaN bytes when ``nan`` names them, and the preset's NaN bytes otherwise.
Inputs: all 65,536 float16 and all 65,536 bfloat16 bit patterns, and float32 specials (±0, ±inf,
NaNs with payloads, float32's max / min normal and subnormal, and every float32 within one ulp of
each fp8 value, rounding tie, max and the tie and step past max, of every format).
"""

from __future__ import annotations

import numpy as np
import pytest

import fp8_oracle as o
from oracle.reference.fp8 import quantize
from oracle.reference.presets import PRESETS

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")

FLOAT32_EXTREMES = np.array([
    0x00000000, 0x80000000,  # ±0
    0x7F800000, 0xFF800000,  # ±inf
    0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FA5A5A5, 0xFFA5A5A5,  # quiet, signalling
    0x7FFFFFFF, 0xFFFFFFFF, 0x7FC00001, 0xFFBFFFFF,  # NaN payloads at both ends
    0x7F7FFFFF, 0xFF7FFFFF,  # float32 max
    0x00800000, 0x80800000,  # float32 min normal
    0x00000001, 0x80000001, 0x007FFFFF, 0x807FFFFF,  # float32 min and max subnormal
], dtype=np.uint32).view(np.float32)

# (preset, format) for every format each preset covers
PRESET_FORMATS = [(name, fmt) for name, preset in sorted(PRESETS.items()) for fmt in preset.formats]


@pytest.fixture(scope="module")
def inputs():
    """name -> (input array, the same values as float32 for the oracle)."""
    specials = np.unique(np.concatenate([FLOAT32_EXTREMES, o.boundary_float32(ulps=1)])
                         .view(np.uint32)).view(np.float32)
    sets = {"float16": o.all_float16(), "bfloat16": o.all_bfloat16(), "float32_specials": specials}
    return {name: (x, x.astype(np.float32)) for name, x in sets.items()}


def test_special_inputs_hold_what_the_docstring_says(inputs):
    x, _ = inputs["float32_specials"]
    bits = set(x.view(np.uint32).tolist())
    assert set(FLOAT32_EXTREMES.view(np.uint32).tolist()) <= bits
    for fmt in o.FORMAT_NAMES:
        top = int(o.FMAX_BITS[fmt])
        assert {top - 1, top, top + 1} <= bits, fmt  # at and just past max
    # e4m3fn's tie above max (464) and the step past max (480); e5m2's 61440 and 65536
    assert {0x43E80000, 0x43E80001, 0x43F00000, 0x47700000, 0x47700001, 0x47800000} <= bits


def _expected(x32: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    return o.ml_saturating(x32, fmt) if saturate else o.ml_codes(x32, fmt)


@pytest.mark.parametrize("input_set", ["float16", "bfloat16", "float32_specials"])
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_default_preset_saturate_alone_equals_ml_dtypes(inputs, fmt, saturate, input_set):
    """No preset named (ocp_satfinite): ``saturate`` and ml_dtypes' NaN byte, nothing else."""
    x, x32 = inputs[input_set]
    got = quantize(x, fmt, saturate=saturate, nan=o.ml_nan_spec(fmt))
    o.assert_codes_equal(got, _expected(x32, fmt, saturate), x,
                         f"{fmt} saturate={saturate} on {input_set}")


@pytest.mark.parametrize("input_set", ["float16", "bfloat16", "float32_specials"])
@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
def test_default_preset_keeps_its_nan_byte(inputs, fmt, saturate, input_set):
    """Without ``nan`` named, only NaN inputs differ from ml_dtypes: the preset's canonical
    0x7F|sign (fnuz 0x80) where ml_dtypes writes 0x7E|sign for e5m2. Overflow and ±inf follow
    ``saturate`` exactly."""
    x, x32 = inputs[input_set]
    expected = _expected(x32, fmt, saturate)
    if fmt == "e5m2":
        canonical = np.where(np.signbit(x32), 0xFF, 0x7F).astype(np.uint8)
        expected = np.where(np.isnan(x32), canonical, expected)
    o.assert_codes_equal(quantize(x, fmt, saturate=saturate), expected, x,
                         f"{fmt} saturate={saturate} (canonical NaN) on {input_set}")


@pytest.mark.parametrize("saturate", [False, True], ids=["nonsat", "sat"])
@pytest.mark.parametrize("preset,fmt", PRESET_FORMATS)
def test_every_preset_yields_to_saturate(inputs, preset, fmt, saturate):
    """Whatever the preset's own overflow and inf choice (onnx_saturate: e5m2 inf stays inf;
    torch_2_13: e4m3fn saturates, e5m2 does not; ...), naming ``saturate`` (and ml_dtypes' NaN
    byte) gives ml_dtypes' behaviour for that mode."""
    for input_set, (x, x32) in inputs.items():
        got = quantize(x, fmt, preset=preset, saturate=saturate, nan=o.ml_nan_spec(fmt))
        o.assert_codes_equal(got, _expected(x32, fmt, saturate), x,
                             f"preset {preset} {fmt} saturate={saturate} on {input_set}")


# The 24 inputs where the old rule (the preset's inf kept under a named saturate=False) disagreed
# with ml_dtypes: ±inf in each input type, for each format. Bytes by hand: e4m3fn NaN S.1111.111,
# e5m2 inf S.11111.00, fnuz's single NaN 0x80.
NONSAT_INF = {"e4m3fn": (0x7F, 0xFF), "e5m2": (0x7C, 0xFC), "e4m3fnuz": (0x80, 0x80),
              "e5m2fnuz": (0x80, 0x80)}


@pytest.mark.parametrize("fmt", o.FORMAT_NAMES)
@pytest.mark.parametrize("input_set", ["float16", "bfloat16", "float32_specials"])
def test_nonsaturating_infinities_by_hand(inputs, fmt, input_set):
    x, x32 = inputs[input_set]
    infinities = x[np.isinf(x32)]
    assert infinities.size == 2
    got = quantize(infinities, fmt, saturate=False)
    pos, neg = NONSAT_INF[fmt]
    assert got.tolist() == [pos if v > 0 else neg for v in infinities.astype(np.float32)]
