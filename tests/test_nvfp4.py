"""NVFP4 in the reference (oracle/reference/nvfp4.py) against independent oracles: a block-at-a-time
loop (tests/nvfp4_oracle.py: e4m3fn scales by ml_dtypes after an explicit clamp, e2m1 by a
hand-written table with explicit ties) for every knob, ml_dtypes' float4_e2m1fn over every
float16 and bfloat16 bit pattern, ml_dtypes' decoding of every fp4, e4m3fn and E8M0 code,
hand-derived golden vectors, and properties the convention implies."""

import itertools
import json
import zlib

import ml_dtypes
import numpy as np
import pytest

import nvfp4_oracle as o
from oracle.reference import golden, mx, nvfp4

F4 = ml_dtypes.float4_e2m1fn
KNOB_COMBOS = [dict(zip(o.KNOB_CHOICES, values)) for values in itertools.product(*o.KNOB_CHOICES.values())]
GLOBAL_SCALES = (1.0, float(np.float32(268.8)), float(np.float32(0.1)), 3.0)  # 448 * 6 / 10, and others


def seed(text: str) -> int:
    return zlib.crc32(text.encode()) % 100000


def f32_bits(values) -> list:
    return [f"0x{b:08X}" for b in np.asarray(values, np.float32).reshape(-1).view(np.uint32).tolist()]


def rows(seed_: int, shape=(6, 72), gs: float = 1.0) -> np.ndarray:
    """Rows whose blocks of 16 span e4m3fn's scale range and beyond: normal values times 2**k / gs
    for a k per block in [-12, 13] (sf from below half the smallest subnormal to past 448), a zero
    block (scale 0x00), a block of subnormal scale 0x03, NaN, +-inf, a float32 subnormal and a
    value near float32's largest (scale 0x7E)."""
    rng = np.random.default_rng(seed_)
    x = rng.normal(size=shape)
    k = rng.integers(-12, 14, size=shape[:-1] + (-(-shape[-1] // 16),))
    x = x * np.repeat(np.exp2(k.astype(np.float64)), 16, axis=-1)[..., :shape[-1]] / gs
    x = x.astype(np.float32)
    x[0, :16] = 0  # a zero block
    x[0, 17] = -0.0
    x[1, 3] = np.float32(3e38)
    x[2, 40] = np.float32(1e-44)  # a float32 subnormal
    x[3, 20] = np.nan
    x[4, 33], x[4, 34] = np.inf, -np.inf
    x[5, 50:52] = [np.nan, -np.inf]
    x[5, :16] = np.linspace(-1, 1, 16) * np.float32(2.0 ** -9 * 3 * 6 / gs)  # sf 3 * 2**-9: subnormal 0x03
    return x


def near_ties(seed_: int, gs: float, blocks: int = 24) -> np.ndarray:
    """Rows of 16-element blocks built to sit on the rounding boundaries, where the order of the
    float32 operations decides: amax is sf * 6 / gs for sf an e4m3fn value or the midpoint of two
    (nudged by -1, 0 or +1 ulp), and the other elements are e2m1 midpoints or magnitudes times
    sfq / gs, nudged by -2..2 ulps, with random signs."""
    rng = np.random.default_rng(seed_)
    e4m3 = np.arange(0x01, 0x7F, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float64)
    targets = np.concatenate([e4m3, (e4m3[:-1] + e4m3[1:]) / 2])
    points = np.array([0.25, 0.5, 0.75, 1, 1.25, 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6])
    x = np.empty((blocks, 16), np.float32)
    for b in range(blocks):
        sf = rng.choice(targets)
        amax = np.float32(sf * 6 / gs)
        x[b, 0] = nudge(amax, rng.integers(-1, 2))
        sfq = float(np.float32(sf).astype(ml_dtypes.float8_e4m3fn).astype(np.float64))
        for i in range(1, 16):
            v = np.float32(rng.choice(points) * sfq / gs) * rng.choice([-1, 1])
            x[b, i] = nudge(np.float32(v), rng.integers(-2, 3))
    return x.reshape(-1, 64)


def nudge(v: np.float32, ulps: int) -> np.float32:
    """``v`` moved by ``ulps`` float32 steps in magnitude (0 stays 0)."""
    if v == 0:
        return v
    return (np.array([v], np.float32).view(np.int32) + np.int32(ulps)).view(np.float32)[0]


def check_against_oracle(x, gs, **knobs):
    packed, scales = nvfp4.quantize_nvfp4(x, gs, **knobs)
    width = x.shape[-1]
    assert packed.shape == x.shape[:-1] + (width // 2,) and scales.shape == x.shape[:-1] + (-(-width // 16),)
    for r, row in enumerate(x.reshape(-1, width)):
        want_packed, want_scales = o.quantize_row([float(v) for v in row], gs, **knobs)
        got_packed = packed.reshape(-1, width // 2)[r].tolist()
        got_scales = scales.reshape(-1, scales.shape[-1])[r].tolist()
        assert got_scales == want_scales, (r, f32_bits(row), gs, got_scales, want_scales)
        assert got_packed == want_packed, (r, f32_bits(row), gs, [hex(b) for b in got_packed],
                                           [hex(b) for b in want_packed])


@pytest.mark.parametrize("gs", GLOBAL_SCALES)
@pytest.mark.parametrize("knobs", KNOB_COMBOS, ids=lambda k: "-".join(k.values()))
def test_quantize_matches_a_block_by_block_oracle(knobs, gs):
    x = rows(seed(f"{sorted(knobs.items())}-{gs}"), gs=gs)
    scales = nvfp4.quantize_nvfp4(x, gs, **knobs)[1]
    assert {0x00, 0x03, 0x7E} <= set(scales.ravel().tolist()) and ((scales > 0x08) & (scales < 0x7E)).sum() >= 5
    check_against_oracle(x, gs, **knobs)
    check_against_oracle(near_ties(seed(f"ties-{sorted(knobs.items())}-{gs}"), gs), gs, **knobs)


@pytest.mark.parametrize("element_scale, uses", list(itertools.product(("stored", "unrounded"), (0, 1, 2, -1))))
@pytest.mark.parametrize("at", ("block_scale", "input"))
def test_fault_knobs_match_the_oracle(element_scale, uses, at):
    for x in (rows(seed(f"{element_scale}-{uses}-{at}"), gs=3.0), near_ties(seed(f"{element_scale}{uses}{at}"), 3.0)):
        check_against_oracle(x, 3.0, element_scale=element_scale, global_scale_uses=uses, global_scale_at=at)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("gs", [1.0, 3.0, 448 * 6 / 37.5])
def test_the_16_bit_element_product_fault_matches_the_oracle(dtype, gs):
    """element_product="source_dtype": the multiplier and x * multiplier rounded to the source's
    own type before the e2m1 conversion; on float32 sources it changes nothing."""
    name = np.dtype(dtype).name
    with np.errstate(over="ignore"):  # the random rows reach past float16's range: inf is a case too
        cases = [a.astype(dtype) for a in (rows(seed(f"product-{name}-{gs}"), gs=gs),
                                           near_ties(seed(f"product-ties-{name}-{gs}"), gs))]
    for x in cases:
        packed, scales = nvfp4.quantize_nvfp4(x, gs, element_product="source_dtype")
        for r, row in enumerate(x.reshape(-1, x.shape[-1])):
            want_packed, want_scales = o.quantize_row([float(v) for v in row], gs, product_dtype=np.dtype(dtype))
            assert scales.reshape(-1, scales.shape[-1])[r].tolist() == want_scales
            assert packed.reshape(-1, packed.shape[-1])[r].tolist() == want_packed, r
        wide = x.astype(np.float32)
        assert np.array_equal(nvfp4.quantize_nvfp4(wide, gs, element_product="source_dtype")[0],
                              nvfp4.quantize_nvfp4(wide, gs)[0])
    if gs != 1.0:  # near the e2m1 ties the double rounding shows
        ties = cases[1]
        assert not np.array_equal(nvfp4.quantize_nvfp4(ties, gs, element_product="source_dtype")[0],
                                  nvfp4.quantize_nvfp4(ties, gs)[0])


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("gs", [0.37, 448 * 6 / 37.5])  # neither is a float16 or a bfloat16 value
def test_the_per_tensor_scale_narrowed_to_the_source_type_matches_the_oracle(dtype, gs):
    """global_scale_dtype="source_dtype": the oracle under gs rounded to the source's type (its
    cast), for 16-bit sources; on float32 sources it changes nothing."""
    name = np.dtype(dtype).name
    narrowed = float(np.asarray(gs, np.float32).astype(dtype))
    assert narrowed != float(np.float32(gs))
    with np.errstate(over="ignore"):
        cases = [a.astype(dtype) for a in (rows(seed(f"gs-dtype-{name}-{gs}"), gs=gs),
                                           near_ties(seed(f"gs-dtype-ties-{name}-{gs}"), gs))]
    changed = False
    for x in cases:
        packed, scales = nvfp4.quantize_nvfp4(x, gs, global_scale_dtype="source_dtype")
        for r, row in enumerate(x.reshape(-1, x.shape[-1])):
            want_packed, want_scales = o.quantize_row([float(v) for v in row], narrowed)
            assert scales.reshape(-1, scales.shape[-1])[r].tolist() == want_scales
            assert packed.reshape(-1, packed.shape[-1])[r].tolist() == want_packed, r
        changed |= not all(np.array_equal(a, b) for a, b in zip((packed, scales), nvfp4.quantize_nvfp4(x, gs)))
    assert changed
    x = cases[0]
    wide = x.astype(np.float32)
    assert all(np.array_equal(a, b) for a, b in zip(nvfp4.quantize_nvfp4(wide, gs, global_scale_dtype="source_dtype"),
                                                    nvfp4.quantize_nvfp4(wide, gs)))


@pytest.mark.parametrize("conversion", ["toward_zero", "nonsaturating", "flush_subnormals"])
@pytest.mark.parametrize("gs", [3.0, 448 * 6 / 2.0 ** -3])  # the second puts block scales past 448
def test_the_block_scale_conversion_faults_match_the_oracle(conversion, gs):
    for x in (rows(seed(f"{conversion}-{gs}"), gs=gs), near_ties(seed(f"{conversion}{gs}"), gs)):
        check_against_oracle(x, gs, scale_conversion=conversion)
    scales = nvfp4.quantize_nvfp4(rows(seed(f"{conversion}-{gs}"), gs=gs), gs, scale_conversion=conversion)[1]
    if conversion == "nonsaturating" and gs > 3:
        assert (scales == 0x7F).any()  # past 448: the NaN byte


@pytest.mark.parametrize("preset", sorted(nvfp4.NVFP4_PRESETS))
def test_presets_are_their_knobs(preset):
    x = rows(seed(preset), gs=268.8)
    knobs = {"nvfp4_ref": {}, "nvfp4_prescaled": {"global_scale_at": "input"},
             "nvfp4_vllm": {"nonfinite": "all_nan_scale"},
             "nvfp4_trtllm": {"nonfinite": "all_nan_scale", "zero_guard": "unrounded"}}[preset]
    a = nvfp4.quantize_nvfp4(x, np.float32(268.8), preset=preset)
    b = nvfp4.quantize_nvfp4(x, np.float32(268.8), **knobs)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))
    check_against_oracle(x, float(np.float32(268.8)), **knobs)


@pytest.mark.parametrize("width", [2, 18, 40, 72])
@pytest.mark.parametrize("knobs", [{}, {"nonfinite": "nan_scale", "nan_element": "zero"},
                                   {"global_scale_at": "input", "nibble_order": "high_first"}])
@pytest.mark.parametrize("gs", [1.0, float(np.float32(0.37))])
def test_partial_blocks_zero_blocks_and_non_finite_blocks(width, knobs, gs):
    rng = np.random.default_rng(width)
    x = (rng.normal(size=(6, width)) * 8).astype(np.float32)
    x[1] = 0
    x[2, 0] = np.nan
    x[3, width - 1] = -np.inf
    x[4, width - 2:] = [np.nan, np.inf]  # the last (partial) block
    x[5, -1] = -np.nan
    check_against_oracle(x, gs, **knobs)
    check_against_oracle(x.reshape(2, 3, width), gs, **knobs)  # [N, H, D]
    wide = np.zeros((6, width + 5), np.float32)
    wide[:, 3:3 + width] = x
    a, b = nvfp4.quantize_nvfp4(wide[:, 3:3 + width], gs, **knobs), nvfp4.quantize_nvfp4(x, gs, **knobs)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))  # a strided view reads as its copy


@pytest.mark.parametrize("gs", [1.0, 2.0 ** 126, float(np.float32(3e38)), float(np.float32(1.7e38)),
                                float(np.float32(1e-40))])
@pytest.mark.parametrize("at", ("block_scale", "input"))
def test_float32_subnormal_blocks_and_extreme_global_scales(gs, at):
    """Subnormal inputs: with gs 1 every sf underflows to scale 0 (codes +-0); with gs near
    float32's largest, fl(1/gs) and fl(sfq * fl(1/gs)) are float32 subnormals and round; with a
    subnormal gs, fl(1/gs) is inf and out = 1 / inf = 0."""
    x = (np.arange(-16, 16, dtype=np.float32) * np.float32(3e-40)).reshape(2, 16)
    y = np.concatenate([x, (x * np.float32(2.0 ** 100)).astype(np.float32)], axis=0)
    check_against_oracle(y, gs, global_scale_at=at)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_16_bit_inputs_are_widened_exactly(dtype):
    x = rows(7, shape=(6, 64))
    narrow = x.astype(np.float16 if dtype == "float16" else ml_dtypes.bfloat16)
    a = nvfp4.quantize_nvfp4(narrow, 3.0)
    b = nvfp4.quantize_nvfp4(narrow.astype(np.float32), 3.0)
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_e2m1_codes_match_ml_dtypes_on_every_16_bit_pattern(dtype):
    """Every float16 / bfloat16 bit pattern but NaN: the reference's e2m1_codes (on the exact
    float32 widening), ml_dtypes' float4_e2m1fn after a clamp to +-6, and the oracle's table."""
    values = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    wide = values.astype(np.float32)
    keep = ~np.isnan(wide)
    values, wide = values[keep], wide[keep]
    with np.errstate(invalid="ignore"):
        clamped = np.clip(values, dtype(-6.0), dtype(6.0))
    want = clamped.astype(F4).view(np.uint8)
    got = nvfp4.e2m1_codes(wide)
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, [(hex(int(b)), int(g), int(w)) for b, g, w in
                           zip(values[bad].view(np.uint16)[:8], got[bad][:8], want[bad][:8])]
    table = np.array([o.e2m1_code(float(v)) for v in wide], np.uint8)
    assert np.array_equal(table, want)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_e2m1_negative_zero_fault_clears_the_sign_of_every_zero_magnitude_alone(dtype):
    """negative_zero="positive" (a fault: the sign applied only to a nonzero magnitude): every
    16-bit pattern but NaN gets ml_dtypes' code, its sign bit cleared where the magnitude code is
    0 (-0 and the negatives that round to 0), and nowhere else."""
    values = np.arange(1 << 16, dtype=np.uint16).view(dtype)
    wide = values.astype(np.float32)
    keep = ~np.isnan(wide)
    values, wide = values[keep], wide[keep]
    with np.errstate(invalid="ignore"):
        want = np.clip(values, dtype(-6.0), dtype(6.0)).astype(F4).view(np.uint8)
    want = np.where(want == 8, np.uint8(0), want)
    assert np.array_equal(nvfp4.e2m1_codes(wide, negative_zero="positive"), want)
    assert (want == 0).sum() > (nvfp4.e2m1_codes(wide) == 0).sum()  # the fault moves codes


# (tie, its code to even, the other code): the midpoint between two adjacent e2m1 magnitudes
FLIPPED_TIES = [(0.25, 0, 1), (0.75, 2, 1), (1.25, 2, 3), (1.75, 4, 3), (2.5, 4, 5), (3.5, 6, 5), (5.0, 6, 7)]


@pytest.mark.parametrize("tie, even, other", FLIPPED_TIES)
def test_a_single_flipped_tie_moves_that_tie_alone(tie, even, other):
    """element_rounding="tie_flipped_at_T": the tie T rounds to its other neighbour, both signs;
    every other tie, and every value off a tie, as to even; the block-by-block oracle agrees."""
    flip = f"tie_flipped_at_{tie:g}"
    ties = np.array([t for t, _, _ in FLIPPED_TIES], np.float32)
    plain = nvfp4.e2m1_codes(np.concatenate([ties, -ties]))
    flipped = nvfp4.e2m1_codes(np.concatenate([ties, -ties]), rounding=flip)
    moved = np.flatnonzero(plain != flipped)
    assert moved.tolist() == [ties.tolist().index(tie), len(ties) + ties.tolist().index(tie)]
    assert flipped[moved].tolist() == [other, other | 8] and plain[moved].tolist() == [even, even | 8]
    near = np.nextafter(np.float32(tie), np.float32([0, 10]))
    assert np.array_equal(nvfp4.e2m1_codes(near, rounding=flip), nvfp4.e2m1_codes(near))
    for x in (rows(seed(flip), gs=3.0), near_ties(seed(f"ties-{flip}"), 3.0)):
        check_against_oracle(x, 3.0, element_rounding=flip)


@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16, np.float32])
def test_e2m1_codes_of_nan(dtype):
    bits_type = {np.float16: np.uint16, ml_dtypes.bfloat16: np.uint16, np.float32: np.uint32}[dtype]
    width = 8 * np.dtype(bits_type).itemsize
    nans = np.array([(sign << (width - 1)) | payload for sign in (0, 1) for payload in
                     ([0x7C01, 0x7E00, 0x7FFF] if dtype is np.float16 else
                      [0x7F81, 0x7FC0, 0x7FFF] if width == 16 else [0x7F800001, 0x7FC00000, 0x7FFFFFFF])],
                    dtype=bits_type).view(dtype).astype(np.float32)
    assert np.isnan(nans).all()
    assert nvfp4.e2m1_codes(nans).tolist() == [7] * 6 == [o.e2m1_code(float(v)) for v in nans]
    assert nvfp4.e2m1_codes(nans, nan_element="zero").tolist() == [0] * 6
    assert nvfp4.e2m1_codes(nans, nan_element="signed_max").tolist() == [7] * 3 + [15] * 3  # the sign ORed in


def test_every_fp4_code_decodes_as_ml_dtypes_does():
    codes = np.arange(16, dtype=np.uint8)
    want = codes.view(F4).astype(np.float32)
    got = nvfp4.e2m1_values(codes)
    assert np.array_equal(got, want) and np.array_equal(np.signbit(got), np.signbit(want))
    assert [o.e2m1_value(c) for c in range(16)] == want.tolist()


@pytest.mark.parametrize("gs", [1.0, float(np.float32(268.8)), float(np.float32(0.1)), 2.0 ** -20])
def test_every_fp4_and_e4m3fn_scale_code_through_dequantize(gs):
    """A row per scale byte (256), holding the 16 fp4 codes: e2m1 * e4m3fn(scale) / gs, decoded
    by ml_dtypes; a NaN scale byte (0x7F, 0xFF) decodes its block as NaN."""
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    packed = np.tile(np.array([0x10, 0x32, 0x54, 0x76, 0x98, 0xBA, 0xDC, 0xFE], np.uint8), (256, 1))
    element = np.arange(16, dtype=np.uint8).view(F4).astype(np.float32)
    scale = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        want = ((element[None, :] * scale) / np.float32(gs)).astype(np.float32)
    got = nvfp4.dequantize_nvfp4(packed, scales, np.float32(gs))
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.isnan(got[[0x7F, 0xFF]]).all()
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok], want[ok]) and np.array_equal(np.signbit(got[ok]), np.signbit(want[ok]))
    assert [o.dequantize_value(c, 0x3A, gs) for c in range(16)] == got[0x3A].tolist()
    swapped = ((packed << 4) | (packed >> 4)).astype(np.uint8)
    assert np.array_equal(nvfp4.dequantize_nvfp4(swapped, scales, np.float32(gs), nibble_order="high_first"),
                          got, equal_nan=True)


def test_every_e8m0_code_through_mx_dequantize():
    scales = np.arange(256, dtype=np.uint8).reshape(256, 1)
    codes = np.tile(np.array([0x38, 0xC4, 0x00, 0x01], np.uint8), (256, 1))  # 1, -3, 0, 2**-9 (e4m3fn)
    with np.errstate(over="ignore"):  # -3 * 2**127 overflows to -inf, in both
        want = (codes.view(ml_dtypes.float8_e4m3fn).astype(np.float64)
                * scales.view(ml_dtypes.float8_e8m0fnu).astype(np.float64)).astype(np.float32)
        got = mx.dequantize_mxfp8(codes, scales, "e4m3fn")
    assert np.isnan(got[255]).all() and np.array_equal(np.isnan(got), np.isnan(want))
    assert np.array_equal(got[:255], want[:255])


def step(q):
    """The gap between the e2m1 magnitudes around |q| (saturated values: the top gap)."""
    return np.where(q < 2, 0.5, np.where(q < 4, 1.0, 2.0))


@pytest.mark.parametrize("preset", sorted(nvfp4.NVFP4_PRESETS))
@pytest.mark.parametrize("gs", [1.0, float(np.float32(268.8)), float(np.float32(0.37))])
def test_dequantize_inverts_within_half_an_element_step(preset, gs):
    """Where the block scale is a normal e4m3fn value below 448 (not saturated, not flushed),
    every finite element comes back within half an e2m1 step times sfq / gs."""
    rng = np.random.default_rng(seed(f"{preset}{gs}"))
    k = rng.integers(-5, 8, size=(8, 4))
    x = (rng.normal(size=(8, 64)) * np.repeat(np.exp2(k), 16, axis=-1) / gs).astype(np.float32)
    packed, scales = nvfp4.quantize_nvfp4(x, np.float32(gs), preset=preset)
    back = nvfp4.dequantize_nvfp4(packed, scales, np.float32(gs)).astype(np.float64)
    sfq = np.repeat(scales.view(ml_dtypes.float8_e4m3fn).astype(np.float64), 16, axis=-1)
    good = (sfq >= 2.0 ** -6) & (sfq < 448)
    assert good.mean() > 0.8
    unit = sfq / np.float32(gs)
    bound = step(np.abs(x) / unit) / 2 * unit * (1 + 2.0 ** -18)
    assert np.all((np.abs(back - x) <= bound)[good])


@pytest.mark.parametrize("preset", sorted(nvfp4.NVFP4_PRESETS))
def test_high_first_is_low_first_with_the_nibbles_swapped(preset):
    x = rows(seed("nibbles"), gs=3.0)
    low, s_low = nvfp4.quantize_nvfp4(x, 3.0, preset=preset)
    high, s_high = nvfp4.quantize_nvfp4(x, 3.0, preset=preset, nibble_order="high_first")
    assert np.array_equal(s_low, s_high) and np.array_equal(high, ((low << 4) | (low >> 4)).astype(np.uint8))


@pytest.mark.parametrize("gs", [1.0, 2.0 ** -7, 2.0 ** 9])
def test_the_presets_agree_when_the_global_scale_is_a_power_of_two(gs):
    x = rows(seed(f"pow2-{gs}"), gs=gs)
    x[np.abs(x) > 1e30] = 1.0  # x * gs must not overflow for the two to agree
    a = nvfp4.quantize_nvfp4(x, gs, preset="nvfp4_ref")
    b = nvfp4.quantize_nvfp4(x, gs, preset="nvfp4_prescaled")
    assert all(np.array_equal(p, q) for p, q in zip(a, b))


def test_the_golden_vectors_hold_and_are_pinned(tmp_path):
    results, failures = golden.check_nvfp4_golden()
    assert failures == [] and {r.name: r.cases for r in results} == {"nvfp4 nvfp4_ref": 16,
                                                                     "nvfp4 nvfp4_prescaled": 16}
    edited = tmp_path / "nvfp4.json"
    data = json.loads(golden.NVFP4_GOLDEN_PATH.read_text())
    data["cases"][0]["expected"]["nvfp4_ref"]["scale"] = "0x39"
    edited.write_text(json.dumps(data))
    with pytest.raises(golden.GoldenIntegrityError, match="NVFP4_GOLDEN_SHA256"):
        golden.check_nvfp4_golden(edited)


def test_the_golden_derivations_agree_with_the_oracle():
    """Each hand derivation checked by the independent oracle too, so a slip in the derivation
    cannot hide behind a matching slip in the reference."""
    knobs_of = {"nvfp4_ref": {}, "nvfp4_prescaled": {"global_scale_at": "input"}}
    cases = golden.load_golden(golden.NVFP4_GOLDEN_PATH, sha256=golden.NVFP4_GOLDEN_SHA256)["cases"]
    assert len(cases) == 16 and all(len(c["x"]) % 2 == 0 and len(c["x"]) <= 16 for c in cases)
    for case in cases:
        x = [o.f32_from_bits(int(h, 16)) for h in case["x"]]
        gs = o.f32_from_bits(int(case["global_scale"], 16))
        for preset, expected in case["expected"].items():
            packed, scales = o.quantize_row(x, gs, **knobs_of[preset], **case.get("knobs", {}))
            assert [f"0x{s:02X}" for s in scales] == [expected["scale"]], (case["x"], preset)
            assert [f"0x{b:02X}" for b in packed] == expected["packed"], (case["x"], preset)


@pytest.mark.parametrize("call, message", [
    (lambda: nvfp4.quantize_nvfp4(np.zeros((2, 3), np.float32), 1.0), "3 elements per row"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 0.0), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), -2.0), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), float("nan")), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), float("inf")), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1e39), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1e-46), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), np.ones(2, np.float32)), "global_scale"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1.0, preset="ocp_mx_v1"), "preset='ocp_mx_v1'"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1.0, exponent="floor"), "exponent"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1.0, nibble_order="middle"), "nibble_order='middle'"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1.0, global_scale_at="output"), "global_scale_at"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.int32), 1.0), "x"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float64), 1.0), "float64"),
    (lambda: nvfp4.quantize_nvfp4(np.zeros(4, np.float32), 1.0, block=0), "block=0"),
    (lambda: nvfp4.dequantize_nvfp4(np.zeros((2, 20), np.uint8), np.zeros((2, 1), np.uint8), 1.0),
     "scales has shape"),
    (lambda: nvfp4.dequantize_nvfp4(np.zeros((2, 8), np.uint8), np.zeros((2, 1), np.uint8), 0.0), "global_scale"),
    (lambda: nvfp4.e2m1_codes(np.zeros(2, np.float32), nan_element="inf"), "nan_element='inf'"),
    (lambda: nvfp4.e2m1_values(np.array([16])), "codes"),
])
def test_bad_input_is_refused_by_name(call, message):
    with pytest.raises((ValueError, TypeError), match=message.replace("(", r"\(").replace("[", r"\[")):
        call()


def test_an_all_nan_block_and_a_scale_that_rounds_to_zero():
    """vLLM's and TensorRT-LLM's amax is NaN only for an all-NaN block (scale 0x7F); TensorRT-LLM
    guards the multiplier by the unrounded scale, so a block whose sf rounds to byte 0 gets an
    infinite multiplier: nonzero elements +-6, zeros NaN (code 7)."""
    x = np.zeros((1, 48), np.float32)
    x[0, :16] = np.nan
    x[0, 16:32] = [1e-6, -1e-6, 0.0, 2e-6] * 4  # sf = 2e-6 / 6 rounds to e4m3fn byte 0
    x[0, 32:] = np.linspace(-3, 3, 16)
    x[0, 40] = np.nan
    packed, scales = nvfp4.quantize_nvfp4(x, 1.0, preset="nvfp4_trtllm")
    codes = nvfp4.unpack(packed)
    assert scales[0, 0] == 0x7F and scales[0, 1] == 0 and scales[0, 2] != 0x7F
    assert codes[0, 16:20].tolist() == [7, 15, 7, 7]
    ref_packed, ref_scales = nvfp4.quantize_nvfp4(x, 1.0)
    assert ref_scales[0, 0] == 0 and nvfp4.unpack(ref_packed)[0, 16:20].tolist() == [0, 8, 0, 0]
    check_against_oracle(x, 1.0, nonfinite="all_nan_scale", zero_guard="unrounded")
