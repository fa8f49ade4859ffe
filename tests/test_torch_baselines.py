"""The torch baselines' fp8 and MXFP8 writes keep a NaN's sign in every element.

torch's CPU float16-to-float32 conversion returns the default NaN (sign cleared) in the elements
its vector loop leaves to the tail, so ``x.float() / scale`` then ``.to(fp8)`` wrote 0x7F instead
of 0xFF for some of a row's negative NaNs, against the baselines' declared presets (torch_2_11,
torch_2_13: NaN is 0x7F|sign). The property suite found it on an H100 host; here every element of rows of awkward
widths is a negative NaN, and the expected byte is derived by hand: sign bit, all-ones exponent
and mantissa, 0xFF in both e4m3fn and (torch's encoding) e5m2.
"""

from __future__ import annotations

import pytest
import torch

from oracle.kernels import torch_block as tb
from oracle.kernels import torch_native as tn

WIDTHS = [1, 7, 46, 129]


NEGATIVE_NAN_BITS = {torch.float32: (torch.int32, -0x400000), torch.float16: (torch.int16, -0x200),
                     torch.bfloat16: (torch.int16, -0x40)}  # 0xFFC00000, 0xFE00, 0xFFC0


def _negative_nans(n, heads, dim, dtype):
    """A [n, heads, dim] tensor of quiet NaNs with the sign bit set, made from their bits (torch's
    own negation and casts are what is under suspicion)."""
    int_dtype, bits = NEGATIVE_NAN_BITS[dtype]
    return torch.full((n, heads, dim), bits, dtype=int_dtype).view(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["e4m3fn", "e5m2"])
@pytest.mark.parametrize("dim", WIDTHS)
def test_reshape_and_cache_flash_keeps_the_nan_sign(dtype, fmt, dim):
    n, heads, block = 5, 3, 4
    key = _negative_nans(n, heads, dim, dtype)
    assert bool(key.isnan().all()) and bool((key.view(NEGATIVE_NAN_BITS[dtype][0]) < 0).all())
    caches = [torch.full((2, block, heads, dim), 0x11, dtype=torch.uint8) for _ in range(2)]
    slots = torch.tensor([0, 3, 4, 6, 7])
    scale = torch.tensor([0.75])
    tn.reshape_and_cache_flash(key, key.clone(), caches[0], caches[1], slots, fmt, scale, scale)
    for cache in caches:
        written = cache.view(-1, heads, dim)[slots]
        assert bool((written == 0xFF).all()), f"{int((written != 0xFF).sum())} of {written.numel()} codes lost the sign"
        untouched = torch.ones(8, dtype=torch.bool)
        untouched[slots] = False
        assert bool((cache.view(-1, heads, dim)[untouched] == 0x11).all()), "a slot not named was written"


@pytest.mark.parametrize("dim", WIDTHS)
def test_quantize_fp8_and_concat_mla_keep_the_nan_sign(dim):
    x = _negative_nans(4, 2, dim, torch.float16)
    out = torch.zeros(x.shape, dtype=torch.uint8)
    tn.quantize_fp8(out, x, torch.tensor([1.0, 3.0]), "e4m3fn")
    assert bool((out == 0xFF).all())
    kv_c, k_pe = _negative_nans(4, 1, dim, torch.bfloat16)[:, 0], _negative_nans(4, 1, 5, torch.bfloat16)[:, 0]
    cache = torch.zeros((2, 4, dim + 5), dtype=torch.uint8)
    tn.concat_and_cache_mla(kv_c, k_pe, cache, torch.tensor([1, 2, 5, 7]), "e4m3fn", torch.tensor([0.5]))
    written = cache.view(-1, dim + 5)[[1, 2, 5, 7]]
    assert bool((written == 0xFF).all())
    assert bool((cache.view(-1, dim + 5)[[0, 3, 4, 6]] == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("fmt", ["mxfp8_e4m3fn", "mxfp8_e5m2"])
@pytest.mark.parametrize("dim", [32, 46, 129])
def test_block_quantize_keeps_the_nan_sign(dtype, fmt, dim):
    """MXFP8 elements: a NaN is 0x7F with its sign (0xFF), in blocks whose scale byte is 0xFF."""
    x = _negative_nans(3, 2, dim, dtype)
    blocks = -(-dim // 32)
    codes = torch.full((3, 2, dim), 0x11, dtype=torch.uint8)
    scales = torch.full((3, 2, blocks), 0x11, dtype=torch.uint8)
    tb.quantize_block(codes, scales, x, fmt, torch.tensor([1.0]))
    assert bool((codes == 0xFF).all()), f"{int((codes != 0xFF).sum())} of {codes.numel()} codes lost the sign"
    assert bool((scales == 0xFF).all())
