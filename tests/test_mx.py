"""MXFP8 in the reference (oracle/reference/mx.py) against independent oracles: ml_dtypes for the
E8M0 scale codes, a block-at-a-time loop (tests/mx_oracle.py: exponents from float32 bit fields,
elements by ml_dtypes after an explicit clamp) for every knob, hand-derived golden vectors, and
properties the spec implies."""

import itertools
import json
import zlib

import ml_dtypes
import numpy as np
import pytest

import mx_oracle
from oracle.reference import golden, mx


def rows(seed: int, shape=(6, 72)) -> np.ndarray:
    """Rows whose blocks span many binades: normal values times 2**k for a k per block, some
    zero blocks, float32 subnormals and values near float32's largest."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=shape).astype(np.float32)
    k = rng.integers(-140, 120, size=shape[:-1] + (-(-shape[-1] // 32),))
    x = x * np.repeat(np.exp2(k.astype(np.float64)), 32, axis=-1)[..., :shape[-1]]
    x = x.astype(np.float32)
    x[0, :32] = 0  # a zero block
    x[1, 3] = np.float32(3e38)
    x[2, 40] = np.float32(1e-44)  # a float32 subnormal
    return x


def test_e8m0_codes_decode_as_ml_dtypes_does():
    codes = np.arange(256, dtype=np.uint8)
    want = codes.view(ml_dtypes.float8_e8m0fnu).astype(np.float32)
    got = mx.e8m0_values(codes)
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(got[:255], want[:255])


@pytest.mark.parametrize("fmt, rule, saturate", list(itertools.product(("e4m3fn", "e5m2"), mx.EXPONENT_RULES,
                                                                       (True, False))))
def test_quantize_matches_a_block_by_block_oracle(fmt, rule, saturate):
    x = rows(seed=zlib.crc32(f"{fmt}-{rule}-{saturate}".encode()) % 1000)
    codes, scales = mx.quantize_mxfp8(x, fmt, exponent=rule, saturate=saturate)
    for r, row in enumerate(x):
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], fmt, rule, saturate=saturate)
        assert scales[r].tolist() == want_scales, (r, scales[r].tolist(), want_scales)
        assert codes[r].tolist() == want_codes, r


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_a_float32_log2_takes_the_exponent_above_just_below_a_power_of_two(fmt):
    """floor_log2f against floor on every float just below 2**k and on 2**k itself. Hand-derived:
    log2 of the float below 2**k is k - 2**-24 / ln 2 (k - 8.6e-8), which rounds to k in float32
    where half the float32 step next to k exceeds 8.6e-8: k >= 3 (the step below 3 is 2**-22) and
    k <= -2 (the step above 2 is 2**-22), not k = -1, 0, 1, 2; and only where floor's exponent is
    not clamped to -127 already."""
    k = np.arange(-120, 121)
    below = np.ldexp(np.float32(1) - np.float32(2.0 ** -24), k).astype(np.float32)
    x = np.stack([below, np.ldexp(np.float32(1), k).astype(np.float32)], axis=1)[:, :, None] * np.ones(32, np.float32)
    floor = mx.quantize_mxfp8(x, fmt)[1][..., 0]
    log2f = mx.quantize_mxfp8(x, fmt, exponent="floor_log2f")[1][..., 0]
    assert np.array_equal(log2f[:, 1], floor[:, 1])  # a power of two: the same exponent
    up = log2f[:, 0].astype(int) - floor[:, 0].astype(int)
    emax = 8 if fmt == "e4m3fn" else 15
    want = ((k >= 3) | (k <= -2)) & (k - 1 - emax >= -127)
    assert np.array_equal(up, want.astype(int)), k[up != want]
    for r in range(len(k)):
        want = mx_oracle.quantize_row([float(v) for v in x[r, 0]], fmt, "floor_log2f")[1]
        assert log2f[r, 0] == want[0], k[r]


@pytest.mark.parametrize("fmt, offset", list(itertools.product(("e4m3fn", "e5m2"), (-7, -1, 1, 7))))
def test_the_exponent_offset_fault_matches_the_oracle(fmt, offset):
    """exponent_offset: E moved by the offset in every nonzero block, before the clamp."""
    x = rows(seed=zlib.crc32(f"offset-{fmt}-{offset}".encode()) % 1000)
    codes, scales = mx.quantize_mxfp8(x, fmt, exponent_offset=offset)
    assert not np.array_equal(scales, mx.quantize_mxfp8(x, fmt)[1])
    for r, row in enumerate(x):
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], fmt, "floor", exponent_offset=offset)
        assert scales[r].tolist() == want_scales and codes[r].tolist() == want_codes, r


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_the_exponent_clamped_before_emax_fault_matches_the_oracle(fmt):
    """exponent_clamp="before_emax": floor(log2(amax)) clamped to [-127, 127], emax subtracted
    after; blocks below 2**(emax - 127) get E under -127, a wrapped scale byte and an infinite
    multiplier; every other block as without the fault."""
    rng = np.random.default_rng(zlib.crc32(f"clamp-{fmt}".encode()))
    exponents = np.array([-149, -140, -130, -126, -121, -118, -110, -20, 0, 12])  # amax binades
    x = (rng.uniform(1, 2, (len(exponents), 64)) * np.exp2(exponents)[:, None]).astype(np.float32)
    x[:, 5] = 0.0  # a zero in every block: 0 * inf is NaN
    codes, scales = mx.quantize_mxfp8(x, fmt, exponent_clamp="before_emax")
    plain_codes, plain_scales = mx.quantize_mxfp8(x, fmt)
    for r, row in enumerate(x):
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], fmt, "floor", clamp_first=True)
        assert scales[r].tolist() == want_scales and codes[r].tolist() == want_codes, r
    emax = 8 if fmt == "e4m3fn" else 15
    tiny = exponents < emax - 127
    assert (scales[tiny] > 0xF0).all() and np.array_equal(scales[~tiny], plain_scales[~tiny])
    assert np.array_equal(codes[~tiny], plain_codes[~tiny])


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("shape", [(3, 4, 40), (2, 72), (5, 46), (4, 64), (1, 7)])
@pytest.mark.parametrize("nonfinite", ["nan_scale", "inf_saturates"])
def test_the_tail_amax_read_ahead_fault_matches_the_oracle(fmt, shape, nonfinite):
    """tail_amax="read_ahead": each row's partial last block takes its scale from its elements
    and the next 32 - D % 32 of the tensor in C order (the next row's first ones), none past its
    end; its codes, and every other block, as without the fault."""
    rng = np.random.default_rng(zlib.crc32(f"ahead-{fmt}-{shape}".encode()))
    x = (rng.normal(size=shape) * np.exp2(rng.integers(-6, 7, size=shape))).astype(np.float32)
    x.reshape(-1, shape[-1])[1:, 0] *= 1024  # each row's first element outgrows the row before's tail
    x.reshape(-1)[rng.integers(0, x.size, size=2)] = [np.inf, np.nan]
    codes, scales = mx.quantize_mxfp8(x, fmt, tail_amax="read_ahead", nonfinite=nonfinite)
    flat, width = [float(v) for v in x.reshape(-1)], shape[-1]
    tail = width % 32
    for r, row in enumerate(x.reshape(-1, width)):
        ahead = flat[(r + 1) * width:(r + 1) * width + (32 - tail)] if tail else []
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], fmt, "floor", nonfinite=nonfinite,
                                                         ahead=ahead)
        got = scales.reshape(-1, scales.shape[-1])[r].tolist(), codes.reshape(-1, width)[r].tolist()
        assert got == (want_scales, want_codes), r
    assert np.array_equal(scales, mx.quantize_mxfp8(x, fmt, nonfinite=nonfinite)[1]) == (not tail or x.size == width)


@pytest.mark.parametrize("width", [1, 31, 32, 33, 40, 64, 100])
@pytest.mark.parametrize("zero_block, nonfinite", [("min", "nan_scale"), ("one", "finite_amax"), ("min", "nan_block"),
                                                   ("min", "inf_saturates")])
def test_partial_blocks_zero_blocks_and_non_finite_blocks(width, zero_block, nonfinite):
    rng = np.random.default_rng(width)
    x = rng.normal(size=(4, width)).astype(np.float32) * 8
    x[1] = 0
    x[2, 0] = np.nan
    x[3, width - 1] = -np.inf
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn", zero_block=zero_block, nonfinite=nonfinite)
    assert codes.shape == x.shape and scales.shape == (4, -(-width // 32))
    for r, row in enumerate(x):
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], "e4m3fn", "floor",
                                                         zero_block=zero_block, nonfinite=nonfinite)
        assert scales[r].tolist() == want_scales and codes[r].tolist() == want_codes, r


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_inputs_are_widened_exactly(dtype):
    x = rows(seed=7, shape=(3, 64))
    narrow = x.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    a = mx.quantize_mxfp8(narrow, "e4m3fn")
    b = mx.quantize_mxfp8(narrow.astype(np.float32), "e4m3fn")
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


def test_the_ceil_rule_never_saturates_and_floor_may():
    x = rows(seed=3)
    finite = np.isfinite(x)
    for rule in ("floor", "ceil"):
        codes, scales = mx.quantize_mxfp8(x, "e4m3fn", exponent=rule)
        exponent = np.repeat(scales.astype(np.int64) - 127, 32, axis=-1)[..., :x.shape[-1]]
        quotient = np.abs(x.astype(np.float64)) * np.exp2(-exponent.astype(np.float64))
        over = (quotient > 448) & finite
        assert (not over.any()) if rule == "ceil" else over.any()


def test_dequantize_inverts_within_half_an_element_step():
    x = rows(seed=5)
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn", exponent="ceil")
    back = mx.dequantize_mxfp8(codes, scales, "e4m3fn")
    scale = np.repeat(mx.e8m0_values(scales), 32, axis=-1)[..., :x.shape[-1]].astype(np.float64)
    # an e4m3fn step is at most 2**-3 of the value, and never below 2**-9 (subnormals), times X
    step = np.maximum(np.abs(x) * 2.0 ** -3, 2.0 ** -9 * scale)
    assert np.all(np.abs(back.astype(np.float64) - x) <= step / 2 + 1e-45)


def test_a_nan_scale_decodes_its_whole_block_as_nan():
    codes = np.full((1, 40), 0x38, dtype=np.uint8)
    scales = np.array([[0xFF, 127]], dtype=np.uint8)
    back = mx.dequantize_mxfp8(codes, scales, "e4m3fn")
    assert np.isnan(back[0, :32]).all() and np.all(back[0, 32:] == 1.0)


def test_the_golden_vectors_hold_and_are_pinned(tmp_path):
    results, failures = golden.check_mx_golden()
    assert failures == [] and sum(r.cases for r in results) == 20
    edited = tmp_path / "mx.json"
    data = json.loads(golden.MX_GOLDEN_PATH.read_text())
    data["cases"][0]["expected"]["ocp_mx_v1"]["scale"] = "0x78"
    edited.write_text(json.dumps(data))
    with pytest.raises(golden.GoldenIntegrityError, match="MX_GOLDEN_SHA256"):
        golden.check_mx_golden(edited)


@pytest.mark.parametrize("call, message", [
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.float32), "e4m3fnuz"), "fmt='e4m3fnuz'"),
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.int32)), "x"),
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.float32), exponent="nearest"), "exponent='nearest'"),
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.float32), block=0), "block=0"),
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.float32), preset="nvfp4"), "preset='nvfp4'"),
    (lambda: mx.quantize_mxfp8(np.zeros(4, np.float32), scale_op="div"), "scale_op"),
    (lambda: mx.dequantize_mxfp8(np.zeros((2, 40), np.uint8), np.zeros((2, 1), np.uint8)), "scales has shape"),
])
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace("[", r"\[")):
        call()


@pytest.mark.parametrize("fmt, unit", [("e4m3fn", 3e-40), ("e5m2", 1e-42)])
@pytest.mark.parametrize("rule", ["floor", "ceil"])
def test_a_block_of_float32_subnormals_keeps_its_values(fmt, unit, rule):
    """A block of float32 subnormals gets E = -127, so its elements (x * 2**127) stay nonzero. For
    e5m2 with amax below 2**-150 * 57344, amax / max_elem underflows to 0 in float32 under the ceil
    rule: E is still -127 (every E fits; the clamp keeps the smallest), never 0."""
    x = (np.arange(1, 33, dtype=np.float32) * np.float32(unit)).reshape(1, 32)
    codes, scales = mx.quantize_mxfp8(x, fmt, exponent=rule)
    want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in x[0]], fmt, rule)
    assert scales[0].tolist() == want_scales == [0] and codes[0].tolist() == want_codes
    assert np.count_nonzero(codes) == 32


@pytest.mark.parametrize("preset, rule, nonfinite", [("ocp_mx_v1", "floor", "nan_scale"),
                                                     ("torchao_floor", "floor", "nan_block"),
                                                     ("rceil", "ceil", "nan_scale")])
def test_each_preset_is_the_rule_its_writers_use(preset, rule, nonfinite):
    x = rows(seed=11)
    x[3, 5], x[4, 70] = np.nan, -np.inf
    codes, scales = mx.quantize_mxfp8(x, "e5m2", preset=preset)
    for r, row in enumerate(x):
        want_codes, want_scales = mx_oracle.quantize_row([float(v) for v in row], "e5m2", rule,
                                                         nonfinite=nonfinite)
        assert scales[r].tolist() == want_scales and codes[r].tolist() == want_codes, r


@pytest.mark.parametrize("rule", ["floor", "ceil"])
@pytest.mark.parametrize("factor", ["exact", "one"])
def test_the_multiplier_of_a_byte_zero_block(rule, factor):
    """A block of float32 subnormals gets E = -127 (byte 0): "one" writes its elements unscaled
    (TransformerEngine: all zero in e4m3fn), "exact" scales them by 2**127; a block of tiny
    normals (E = -126) is scaled either way."""
    x = np.concatenate([np.arange(1, 33, dtype=np.float32) * np.float32(3e-40),
                        np.arange(1, 33, dtype=np.float32) * np.float32(1e-37)]).reshape(1, 64)
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn", exponent=rule, min_scale_factor=factor)
    want = mx_oracle.quantize_row([float(v) for v in x[0]], "e4m3fn", rule, min_scale_factor=factor)
    assert (codes[0].tolist(), scales[0].tolist()) == want
    assert scales[0, 0] == 0 and scales[0, 1] == 1
    assert (np.count_nonzero(codes[0, :32]) == 0) == (factor == "one") and np.count_nonzero(codes[0, 32:]) == 32


def test_an_inf_block_saturates_its_scale_under_inf_saturates():
    x = np.full((1, 64), 3.0, np.float32)
    x[0, 5], x[0, 9], x[0, 40] = np.inf, np.nan, np.nan
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn", nonfinite="inf_saturates")
    assert scales[0].tolist() == [0xFE, 127 - 7]  # the inf block saturated; the other from 3 (E = 1 - 8)
    assert set(codes[0, :32].tolist()) == {0x00, 0x7F}  # +-0 for finite, NaN for inf and NaN
    assert codes[0, 40] == 0x7F and codes[0, 41] == mx_oracle.element_code(3.0 * 2 ** 7, "e4m3fn", True)


def test_the_transformer_engine_preset():
    x = rows(seed=13)
    x[1, 3], x[2, 33], x[3, 64] = np.inf, np.nan, -np.inf
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn", preset="te_mxfp8")
    for r, row in enumerate(x):
        want = mx_oracle.quantize_row([float(v) for v in row], "e4m3fn", "ceil", nonfinite="inf_saturates",
                                      min_scale_factor="one", nan_sign=False)
        assert (codes[r].tolist(), scales[r].tolist()) == want, r
