"""oracle.reference.block_scaled.reshape_and_cache_block with a slot written twice
(``duplicates="any"``), in both scale layouts, against a plain loop.

A kernel whose threads race on one slot may leave any one of the colliding rows there, so the
reference returns a OneOfRows that must accept each writing order a loop can produce, and refuse
a slot whose scale bytes come from no row or from two rows. In a swizzled scale cache a slot's
scales are scattered over its page (cuBLAS's 128x4 tiles, re-derived here from the layout's
description), and the same must hold for those scattered bytes. This is what lets the diagnosis
replay a racing writer on a swizzled cache (e.g. padding rows quantized into slot 0)."""

from __future__ import annotations

import numpy as np
import pytest

from oracle.reference import block_scaled as ref
from oracle.reference.slots import OneOfRows

BLOCK_SIZE, HEADS, DIM, BLOCKS = 4, 3, 64, 2
FMT = "mxfp8_e4m3fn"


def page_offset(row: int, col: int, cols: int) -> int:
    """cuBLAS's 1D block-scaling-factor layout: 128x4 tiles of 512 bytes, row-major, each storing
    row r at 16 * (r % 32) + 4 * ((r % 128) // 32) and column c at c % 4."""
    tile = (row // 128) * (-(-cols // 4)) + col // 4
    return tile * 512 + 16 * (row % 32) + 4 * ((row % 128) // 32) + col % 4


def loop_write(scale_cache: np.ndarray, order, slots, scales, layout: str) -> np.ndarray:
    """Each position of ``order`` written in turn: the last one to reach a slot wins."""
    out = scale_cache.copy()
    count = scales.shape[-1]
    for i in order:
        page, token = divmod(int(slots[i]), BLOCK_SIZE)
        for h in range(HEADS):
            for c in range(count):
                if layout == "linear":
                    out[page, token, h, c] = scales[i, h, c]
                else:
                    out[page, page_offset(token * HEADS + h, c, count)] = scales[i, h, c]
    return out


def _case(layout: str):
    rng = np.random.default_rng(5)
    count = ref.scale_count(FMT, DIM)
    codes = [rng.integers(0, 256, (BLOCKS, BLOCK_SIZE, HEADS, DIM), dtype=np.uint8) for _ in range(2)]
    if layout == "linear":
        scales = [rng.integers(0, 256, (BLOCKS, BLOCK_SIZE, HEADS, count), dtype=np.uint8) for _ in range(2)]
    else:
        page = ref.swizzled_page_bytes(BLOCK_SIZE * HEADS, count)
        scales = [rng.integers(0, 256, (BLOCKS, page + 8), dtype=np.uint8) for _ in range(2)]
    # rows of very different magnitudes, so the colliding rows' scales differ
    key = (rng.standard_normal((4, HEADS, DIM)) * np.array([1, 2**10, 2**-10, 1])[:, None, None]).astype(np.float32)
    slots = np.array([5, 2, 5, 0])  # positions 0 and 2 collide on slot 5
    return codes, scales, key, slots, count


@pytest.mark.parametrize("layout", ["linear", "swizzled"])
def test_a_slot_written_twice_allows_either_row_and_no_mix(layout):
    codes, scales, key, slots, count = _case(layout)
    out = ref.reshape_and_cache_block(*codes, *scales, slots, key, key, fmt=FMT, scale_layout=layout,
                                      duplicates="any")
    key_scales = out[2]
    assert isinstance(key_scales, OneOfRows)
    _, block_scales = ref.quantize_block(key, FMT)
    assert not np.array_equal(block_scales[0], block_scales[2])  # the collision is visible
    forward = loop_write(scales[0], [0, 1, 2, 3], slots, block_scales, layout)  # position 2 wins
    backward = loop_write(scales[0], [2, 1, 0, 3], slots, block_scales, layout)  # position 0 wins
    assert not np.array_equal(forward, backward)
    assert key_scales.check(forward) is None
    assert key_scales.check(backward) is None
    # one scale byte of slot 5 taken from the other row: torn between the two, refused
    torn = forward.copy()
    page, token = divmod(5, BLOCK_SIZE)
    h, c = np.argwhere(block_scales[0] != block_scales[2])[0]
    where = (page, token, h, c) if layout == "linear" else (page, page_offset(token * HEADS + h, c, count))
    torn[where] = block_scales[0, h, c]
    assert torn[where] != forward[where]
    assert "torn row" in key_scales.check(torn)
    # a byte outside slot 5 changed: refused whatever the collision
    stray = forward.copy()
    stray.reshape(-1)[-1] ^= 0xFF
    assert key_scales.check(stray) is not None


def test_without_duplicates_the_swizzled_write_is_a_plain_array_as_the_loop_writes_it():
    codes, scales, key, slots, _ = _case("swizzled")
    slots = np.array([5, 2, 7, 0])
    out = ref.reshape_and_cache_block(*codes, *scales, slots, key, key, fmt=FMT, scale_layout="swizzled")
    _, block_scales = ref.quantize_block(key, FMT)
    assert isinstance(out[2], np.ndarray)
    assert np.array_equal(out[2], loop_write(scales[0], range(4), slots, block_scales, "swizzled"))
