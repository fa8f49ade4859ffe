"""Mutants for the block-scaled writers (MXFP8, NVFP4): each commits one bug real block-scaled
writers have had or easily have, under exactly the torch baseline's contract, and is killed by
the case class named in its row.

Each is the torch baseline (:mod:`oracle.kernels.torch_block`) with one step of its encoder or
its slot handling changed; the argument checks run unchanged first.
"""

from __future__ import annotations

import torch

from ..kernels import torch_block as tb
from .kernels import Mutant


def _mx_exponent_plus_one(x, fmt, global_scale):
    """MX with E one too large for every nonzero block (half the elements' range wasted)."""
    dtype, block, emax = tb.FORMATS[fmt]
    if fmt == "nvfp4":
        return tb.encode(x, fmt, global_scale)
    return tb._mx(x.float(), dtype, block, emax - 1)


def _mx_log2f(x, fmt, global_scale):
    """MX with E = floor(log2f(amax)) - emax: the float32 log2 of an amax just below 2**k rounds
    to k, so that block's exponent is one too large."""
    dtype, block, emax = tb.FORMATS[fmt]
    if fmt == "nvfp4":
        return tb.encode(x, fmt, global_scale)
    return tb._mx(x.float(), dtype, block, emax,
                  floor_log2=lambda amax: torch.floor(torch.log2(amax)).nan_to_num(neginf=0).to(torch.int32))


def _mx_signed_amax(x, fmt, global_scale):
    """MX whose amax is the block's largest element, not its largest magnitude (the abs
    forgotten): a block whose largest magnitude is a negative element's gets too small a scale."""
    dtype, block, emax = tb.FORMATS[fmt]
    if fmt == "nvfp4":
        return tb.encode(x, fmt, global_scale)
    return tb._mx(x.float(), dtype, block, emax, magnitude=lambda blocks: blocks)


def _mx_amax_reads_ahead(x, fmt, global_scale):
    """MX whose partial last block of a head takes its amax, and its NaN and inf test, from a
    whole block's load from its start: past the head's end into the next head's or token's
    elements of ``x``, masked only at the end of ``x``. Each row is quantized with those elements
    appended (its blocks then whole), and its own codes kept."""
    dtype, block, emax = tb.FORMATS[fmt]
    width = x.shape[-1]
    pad = -width % block
    if fmt == "nvfp4" or not pad:
        return tb.encode(x, fmt, global_scale)
    x32 = x.float()
    flat = torch.cat([x32.reshape(-1), x32.new_zeros(pad)])
    rows = torch.arange(1, x32.numel() // width + 1, device=x.device)
    ahead = flat[rows[:, None] * width + torch.arange(pad, device=x.device)].reshape(x.shape[:-1] + (pad,))
    codes, scales = tb._mx(torch.cat([x32, ahead], dim=-1), dtype, block, emax)
    return codes[..., :width], scales


def _e2m1_ties_away(q):
    """e2m1 codes with every tie rounded to the larger magnitude (a >= at every midpoint)."""
    magnitude = q.abs()
    code = (magnitude[..., None] >= tb._BOUNDS).sum(dim=-1)
    code = torch.where(torch.signbit(q), code | 8, code)
    return torch.where(torch.isnan(q), 7, code).to(torch.uint8)


def _e2m1_tie_at_2_5_up(q):
    """e2m1 codes with the tie at 2.5 rounded up to 3.0 (a >= at that threshold alone); every
    other tie to even."""
    code = tb._e2m1(q)
    return torch.where(q.abs() == 2.5, torch.where(torch.signbit(q), 5 | 8, 5), code).to(torch.uint8)


def _pair_amax(amax):
    """Each block's amax the larger of its aligned pair's (a reduction 32 elements wide, as MX's,
    over blocks of 16); an odd last block keeps its own."""
    count = amax.shape[-1]
    padded = torch.cat([amax, amax[..., -1:]], dim=-1) if count % 2 else amax
    return padded.unflatten(-1, (-1, 2)).amax(dim=-1).repeat_interleave(2, dim=-1)[..., :count]


def _nvfp4(x, fmt, global_scale, *, unrounded=False, uses=1, swap=False, ties_away=False, half_product=False,
           tie_flip=False, pair_amax=False):
    if fmt != "nvfp4":
        return tb.encode(x, fmt, global_scale)
    gs = global_scale.reshape(()).float()
    gs = {0: torch.ones_like(gs), 1: gs, 2: gs * gs, -1: 1 / gs}[uses]
    blocks = tb._blocks(x.float(), 16)
    amax = torch.where(torch.isnan(blocks), 0, blocks.abs()).amax(dim=-1)
    amax = _pair_amax(amax) if pair_amax else amax
    sf = gs * (amax * tb.SIXTH)
    scales = sf.clamp(max=448).to(torch.float8_e4m3fn)
    sfq = sf if unrounded else scales.float()
    out = torch.where(sfq == 0, 0, 1 / (sfq * (1 / gs)))
    if half_product and x.dtype != torch.float32:  # __hmul2: the multiplier and the product in x's type
        q = (blocks.to(x.dtype) * out[..., None].to(x.dtype)).float()
    else:
        q = blocks * out[..., None]
    convert = _e2m1_ties_away if ties_away else _e2m1_tie_at_2_5_up if tie_flip else tb._e2m1
    codes = convert(q).flatten(-2)[..., :x.shape[-1]]
    even, odd = codes[..., 0::2], codes[..., 1::2]
    return (odd | (even << 4)) if swap else (even | (odd << 4)), scales.view(torch.uint8)


def _quantize(encoder):
    def kernel(codes, scales, x, fmt, global_scale):
        tb.write_quantized(codes, scales, x, fmt, global_scale, encoder)
    return kernel


def _paged(encoder):
    def kernel(*args):
        tb.write_paged(*args, encoder)
    return kernel


def paged_padding_into_slot_zero(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                                 slot_mapping, fmt, k_global_scale, v_global_scale):
    """A negative slot clamped to 0 (a max(slot, 0) where a skip belongs), its race settled: the
    real rows are written first, then the last padding row alone into slot 0. (In a GPU kernel any
    colliding row may win slot 0; torch's index_put_ of colliding rows races too, so writing them
    all at once made which row won, and with it the failure, vary from run to run.)"""
    args = (key, value, key_cache, value_cache, key_scale_cache, value_scale_cache)
    tb.write_paged(*args, slot_mapping, fmt, k_global_scale, v_global_scale, tb.encode)
    padding = torch.nonzero(slot_mapping < 0).flatten()
    if padding.numel():
        last_padding_only = torch.full_like(slot_mapping, -1)
        last_padding_only[padding[-1]] = 0
        tb.write_paged(*args, last_padding_only, fmt, k_global_scale, v_global_scale, tb.encode)


def quantize_straddles_heads(codes, scales, x, fmt, global_scale):
    """Blocks over each token's whole [H * D] row, as a kernel that flattens the heads does; the
    row's scales first in the token's [H, blocks] scale row."""
    tb.check_quantize(codes, scales, x, fmt, global_scale)
    c, s = tb.encode(x.reshape(x.shape[0], -1), fmt, global_scale)
    codes.copy_(c.reshape(codes.shape))
    scales.view(scales.shape[0], -1)[:, :s.shape[1]] = s


def paged_swizzle_as_linear(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                            slot_mapping, fmt, k_global_scale, v_global_scale):
    """Writes each page of a swizzled scale cache in the linear [block_size, H, blocks] order."""
    if key_scale_cache.dim() == 2:
        heads, head_size = key.shape[1:]
        shape = (key_scale_cache.shape[0], key_cache.shape[1], heads, -(-head_size // tb.FORMATS[fmt][1]))
        key_scale_cache, value_scale_cache = (
            t.as_strided(shape, (t.stride(0), shape[2] * shape[3], shape[3], 1), t.storage_offset())
            for t in (key_scale_cache, value_scale_cache))
    tb.write_paged(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                   fmt, k_global_scale, v_global_scale, tb.encode)


def paged_block_size_from_hnd_heads(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                                    slot_mapping, fmt, k_global_scale, v_global_scale):
    """vLLM's NVFP4 writer on an HND cache: the block size read from the dimension that holds the
    heads there (its block index bounds-checked: a slot whose misread block lies past the cache is
    dropped, where the real kernel wrote past the cache)."""
    heads, block_size = key_cache.shape[2], key_cache.shape[1]
    caches = (key_cache, value_cache, key_scale_cache, value_scale_cache)
    if key_cache.stride(2) > key_cache.stride(1) and heads != block_size and key_scale_cache.dim() == 4:
        blocks = -(-key_cache.shape[0] * block_size // heads)
        if heads < block_size:
            blocks = key_cache.shape[0]
            slot_mapping = torch.where(slot_mapping >= blocks * heads, -1, slot_mapping)
        caches = tuple(c.as_strided((blocks, heads) + tuple(c.shape[2:]), c.stride(), c.storage_offset())
                       for c in caches)
    tb.write_paged(key, value, *caches, slot_mapping, fmt, k_global_scale, v_global_scale, tb.encode)


Q, P = "quantize_block", "reshape_and_cache_block"
_ROWS = [
    (Q + ".exponent_plus_one", Q, "MXFP8 shared exponent one too large (floor(log2 amax) - emax + 1)",
     "shared_exponent_off_by_one", _quantize(_mx_exponent_plus_one), ("block_scaled",)),
    (P + ".exponent_plus_one", P, "MXFP8 shared exponent one too large (floor(log2 amax) - emax + 1)",
     "shared_exponent_off_by_one", _paged(_mx_exponent_plus_one), ("block_scaled",)),
    (Q + ".amax_reads_ahead", Q, "MXFP8 partial last block's amax from an unmasked 32-element load (into the "
     "next head's elements)", "block_amax_read_ahead", _quantize(_mx_amax_reads_ahead), ("block_scaled",)),
    (P + ".exponent_from_log2f", P, "MXFP8 shared exponent floor(log2f(amax)) - emax, log2 in float32",
     "block_scaling_rule", _paged(_mx_log2f), ("block_scaled",)),
    (Q + ".signed_amax", Q, "MXFP8 amax taken as the block's largest element, not its largest magnitude",
     "block_scale_wrong", _quantize(_mx_signed_amax), ("block_scaled",)),
    (P + ".pair_amax", P, "NVFP4 amax reduced over 32 elements (two blocks of 16), as MX's reduction",
     "block_scale_wrong", _paged(lambda *a: _nvfp4(*a, pair_amax=True)), ("block_scaled",)),
    (Q + ".unrounded_block_scale", Q, "NVFP4 elements divided by the block scale before its e4m3fn rounding",
     "block_scale_unrounded", _quantize(lambda *a: _nvfp4(*a, unrounded=True)), ("block_scaled",)),
    (Q + ".nibbles_swapped", Q, "NVFP4 even elements in the high nibble, odd in the low",
     "nibbles_swapped", _quantize(lambda *a: _nvfp4(*a, swap=True)), ("block_scaled",)),
    (P + ".nibbles_swapped", P, "NVFP4 even elements in the high nibble, odd in the low",
     "nibbles_swapped", _paged(lambda *a: _nvfp4(*a, swap=True)), ("block_scaled",)),
    (Q + ".e2m1_ties_away", Q, "NVFP4 element ties rounded away from zero (>= at every midpoint)",
     "element_rounding", _quantize(lambda *a: _nvfp4(*a, ties_away=True)), ("block_scaled",)),
    (P + ".e2m1_tie_flipped", P, "NVFP4 elements at the 2.5 tie rounded up to 3 (>= at that threshold), every "
     "other tie to even", "element_rounding", _paged(lambda *a: _nvfp4(*a, tie_flip=True)), ("block_scaled",)),
    (Q + ".global_scale_twice", Q, "NVFP4 per-tensor scale applied twice (gs * gs)",
     "global_scale_misapplied", _quantize(lambda *a: _nvfp4(*a, uses=2)), ("block_scaled",)),
    (P + ".global_scale_ignored", P, "NVFP4 per-tensor scale never applied",
     "global_scale_misapplied", _paged(lambda *a: _nvfp4(*a, uses=0)), ("block_scaled",)),
    (P + ".global_scale_inverted", P, "NVFP4 per-tensor scale taken as the decode scale (1 / gs applied)",
     "global_scale_misapplied", _paged(lambda *a: _nvfp4(*a, uses=-1)), ("block_scaled",)),
    (Q + ".half_product", Q, "NVFP4 elements multiplied in the 16-bit source's type (__hmul2) before the "
     "e2m1 conversion", "element_rounding", _quantize(lambda *a: _nvfp4(*a, half_product=True)), ("block_scaled",)),
    (P + ".padding_into_slot_zero", P, "padding rows (negative slots) quantized into slot 0, as sglang's "
     "MXFP8 writers did", "padding_into_slot_zero", paged_padding_into_slot_zero, ("padding",)),
    (Q + ".blocks_straddle_heads", Q, "blocks run over each token's whole [H * D] row, across heads",
     "blocks_straddle_heads", quantize_straddles_heads, ("block_scaled",)),
    (P + ".block_size_from_hnd_heads", P, "the block size of an HND cache read from its heads dimension, as "
     "vLLM's NVFP4 reshape_and_cache_flash did", "block_size_wrong_dim", paged_block_size_from_hnd_heads,
     ("block_scaled",)),
    (P + ".swizzle_as_linear", P, "a swizzled scale cache written in the linear order of each page",
     "scale_layout_wrong", paged_swizzle_as_linear, ("block_scaled",)),
]
BLOCK_MUTANTS = tuple(Mutant("mutant." + name, op, "torch." + op, bug, catches, fn, cause)
                      for name, op, bug, cause, fn, catches in _ROWS)

__all__ = ["BLOCK_MUTANTS"]
