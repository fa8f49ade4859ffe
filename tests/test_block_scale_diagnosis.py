"""Block scales a kernel wrote, replayed (oracle.diagnose.block_scales and the reference's
``scales=``): elements quantized under given scales agree with independent per-block oracles,
and the words name what every wrongly scaled block shares."""

import ml_dtypes
import numpy as np
import pytest

from mx_oracle import element_code
from nvfp4_oracle import e2m1_code, e4m3_value, f32, pack
from oracle.diagnose.block_scales import describe, properties
from oracle.reference import mx, nvfp4


def _rows(seed: int, shape=(6, 64)) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp2(rng.integers(-6, 7, shape))).astype(np.float32)


@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
def test_mx_elements_follow_the_given_scales(fmt):
    x = _rows(1)
    _, own = mx.quantize_mxfp8(x, fmt)
    given = own.astype(np.int64)
    given[::2, 0] += 1
    given[1::2, 1] -= 2
    given = given.astype(np.uint8)
    codes, scales = mx.quantize_mxfp8(x, fmt, scales=given)
    assert np.array_equal(scales, given)
    for r, row in enumerate(x):
        for b in range(2):
            factor = 2.0 ** -(int(given[r, b]) - 127)
            want = [element_code(float(np.float32(v) * np.float32(factor)), fmt, True) for v in row[32 * b:32 * b + 32]]
            assert codes[r, 32 * b:32 * b + 32].tolist() == want, (r, b)


def test_mx_given_scales_equal_to_the_computed_ones_change_nothing():
    x = _rows(2)
    assert all(np.array_equal(a, b) for a, b in zip(mx.quantize_mxfp8(x, "e4m3fn"),
                                                    mx.quantize_mxfp8(x, "e4m3fn", scales=mx.quantize_mxfp8(x, "e4m3fn")[1])))


def test_mx_nan_scaled_blocks_keep_the_given_codes_and_the_others_are_computed():
    x = _rows(3, (2, 64))
    x[0, 5] = np.nan  # block (0, 0) gets the NaN scale
    codes, scales = mx.quantize_mxfp8(x, "e4m3fn")
    kept = np.full(x.shape, 0x11, np.uint8)
    again, _ = mx.quantize_mxfp8(x, "e4m3fn", scales=scales, nan_block_codes=kept)
    assert scales[0, 0] == 0xFF
    assert (again[0, :32] == 0x11).all() and np.array_equal(again[0, 32:], codes[0, 32:])
    assert np.array_equal(again[1], codes[1])


def test_nvfp4_elements_follow_the_given_scales():
    x = _rows(4, (3, 32))
    gs = 448 * 6 / float(np.abs(x).max())
    _, own = nvfp4.quantize_nvfp4(x, gs)
    given = own.copy()
    given[:, 1] = np.clip(own[:, 1].astype(int) + 8, 0, 0x7E)  # one binade up in e4m3fn
    packed, scales = nvfp4.quantize_nvfp4(x, gs, scales=given)
    assert np.array_equal(scales, given)
    for r, row in enumerate(x):
        codes = []
        for b in range(2):
            out = f32(np.float32(1) / f32(e4m3_value(int(given[r, b])) * f32(np.float32(1) / f32(gs))))
            codes += [e2m1_code(float(f32(f32(v) * out))) for v in row[16 * b:16 * b + 16]]
        assert packed[r].tolist() == pack(codes), r


def test_the_properties_are_those_of_each_block():
    x = np.array([[1.0, -3.0] + [0.0] * 30 + [2.0, 1.0] + [0.0] * 30,
                  [-np.inf] + [1.0] * 31 + [0.0] * 32], np.float32)
    found = properties(x, 32, padded_tail=False)
    assert found["its largest magnitude is a negative element's"].tolist() == [[True, False], [False, False]]
    assert found["it holds -inf"].tolist() == [[False, False], [True, False]]
    assert found["it is all zero"].tolist() == [[False, False], [False, True]]
    tiny = np.full((1, 32), ml_dtypes.finfo(np.float16).smallest_subnormal, np.float32)
    assert properties(tiny, 32, padded_tail=False)["its amax is below float16's smallest normal (2^-14)"].all()


def test_the_words_give_the_offsets_and_the_property_every_wrong_block_shares():
    x = _rows(5, (8, 64))
    x[::2, :32] = -np.abs(x[::2, :32]) - 1  # every even row's first block: largest magnitude negative
    _, want = mx.quantize_mxfp8(x, "e4m3fn")
    got = want.copy()
    got[::2, 0] -= 1
    text = describe(x, want, got, "mx", 32)
    assert "in 4 of 16 blocks (-1 binade(s) in 4)" in text
    assert "every block with a wrong scale: its largest magnitude is a negative element's" in text


def _tile_offset(r: int, c: int, cols: int) -> int:
    """cuBLAS's 128x4 layout of block-scaling factors, written out from its definition."""
    cp = -(-cols // 4) * 4
    return ((r // 128) * (cp // 4) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


HEADS, BLOCK_SIZE, SLOTS = 3, 4, np.array([0, 3, 5, 6, 7])  # two blocks of 4 tokens


def _swizzled_write(fault: str, dim: int, seed: int) -> tuple:
    """(the K scale cache written by the reference under swizzle ``fault``, poisoned with 0xAA
    before, the scales each token's heads get, the number of scale columns) of MXFP8 rows."""
    from oracle.reference import block_scaled as bs
    key = np.random.default_rng(seed).standard_normal((len(SLOTS), HEADS, dim)).astype(np.float32)
    codes = np.zeros((2, BLOCK_SIZE, HEADS, dim), np.uint8)
    count = bs.scale_count("mxfp8_e4m3fn", dim)
    scales = np.full((2, bs.swizzled_page_bytes(BLOCK_SIZE * HEADS, count)), 0xAA, np.uint8)
    out = bs.reshape_and_cache_block(codes, codes, scales, scales, SLOTS, key, key, fmt="mxfp8_e4m3fn",
                                     scale_layout="swizzled", swizzle_fault=fault)[2]
    return out, bs.quantize_block(key, "mxfp8_e4m3fn")[1], count


def test_the_head_major_row_fault_puts_token_t_head_h_at_row_h_times_block_size_plus_t():
    out, want, count = _swizzled_write("rows_head_major", 64, 7)
    for i, slot in enumerate(SLOTS):
        p, t = divmod(int(slot), BLOCK_SIZE)
        for h in range(HEADS):
            for c in range(count):
                assert out[p, _tile_offset(h * BLOCK_SIZE + t, c, count)] == want[i, h, c], (i, h, c)


def test_the_padding_columns_fault_zeroes_each_written_rows_unowned_columns_and_nothing_else():
    out, want, count = _swizzled_write("padding_columns_zeroed", 160, 8)  # 5 scale columns, padded to 8
    expected = np.full(out.shape, 0xAA, np.uint8)
    for i, slot in enumerate(SLOTS):
        p, t = divmod(int(slot), BLOCK_SIZE)
        for h in range(HEADS):
            for c in range(8):
                expected[p, _tile_offset(t * HEADS + h, c, count)] = want[i, h, c] if c < count else 0
    assert count == 5 and np.array_equal(out, expected)
