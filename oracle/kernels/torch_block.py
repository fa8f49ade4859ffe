"""The torch baseline of the block-scaled writes (MXFP8, NVFP4), in plain torch.

What a serving engine without a fused kernel writes: block amax by ``amax`` over a reshaped
tensor, the shared exponent from ``torch.frexp``, elements by clamping and torch's fp8 cast, e2m1
codes by ``torch.bucketize`` over the rounding boundaries, scale bytes and codes scattered with
``index_put_``. Every argument is checked before anything is written. Registered by
:func:`oracle.kernels.torch_native.register` under the same backend.
"""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, INDEX_DTYPES
from ._nan_signs import signs, with_signs_of

FORMATS = {"mxfp8_e4m3fn": (torch.float8_e4m3fn, 32, 8), "mxfp8_e5m2": (torch.float8_e5m2, 32, 15),
           "nvfp4": (None, 16, None)}  # name -> (element dtype, block, emax of the element format)
SIXTH = torch.tensor(1.0, dtype=torch.float32) / 6  # fl32(1/6)
# e2m1: the boundary above each magnitude 0, 0.5, 1, 1.5, 2, 3, 4; a value on a boundary goes to
# the even code (0, 1, 2, 4 are even codes 0, 2, 4, 6).
_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_TIE_UP = torch.tensor([False, True, False, True, False, True, False])


def _check_format(fmt, head_size: int) -> tuple:
    if fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {sorted(FORMATS)}")
    if fmt == "nvfp4" and head_size % 2:
        raise ValueError(f"head size {head_size}: nvfp4 packs two codes per byte, so it must be even")
    return FORMATS[fmt]


def _check_global_scale(name: str, scale: torch.Tensor) -> None:
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.numel() != 1:
        raise TypeError(f"{name} must be a float32 tensor of one element, got "
                        f"{getattr(scale, 'dtype', type(scale).__name__)} {tuple(getattr(scale, 'shape', ()))}")
    value = float(scale.reshape(()))
    if not (value > 0 and value != float("inf")):
        raise ValueError(f"{name} must be finite and > 0, got {value}")


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    """``x`` (``[..., D]``, float32) as ``[..., blocks, block]``, the last block padded with NaN."""
    width = x.shape[-1]
    pad = -width % block
    if pad:
        x = torch.cat([x, x.new_full(x.shape[:-1] + (pad,), float("nan"))], dim=-1)
    return x.reshape(x.shape[:-1] + (x.shape[-1] // block, block))


def _fp8_codes(q: torch.Tensor, dtype) -> torch.Tensor:
    """Saturating fp8 codes (NaN: 0x7F with the sign of ``q``, read from its bits)."""
    top = torch.finfo(dtype).max
    codes = q.clamp(-top, top).to(dtype).view(torch.uint8)
    nan = ((signs(q) < 0).to(torch.uint8) << 7) | 0x7F
    return torch.where(torch.isnan(q), nan, codes)


def _floor_log2(amax: torch.Tensor) -> torch.Tensor:
    """floor(log2(amax)) exactly, from the float32 exponent field (frexp: amax = m * 2**e, m in [0.5, 1))."""
    return torch.frexp(amax).exponent.to(torch.int32) - 1


def _mx(x: torch.Tensor, dtype, block: int, emax: int, floor_log2=_floor_log2,
        magnitude=torch.abs) -> tuple[torch.Tensor, torch.Tensor]:
    blocks = _blocks(x, block)
    finite = torch.isfinite(blocks)
    amax = torch.where(finite, magnitude(blocks), 0).amax(dim=-1)
    exponent = floor_log2(amax) - emax
    exponent = torch.where(amax > 0, exponent, -127).clamp(-127, 127)
    real = ~torch.isnan(_blocks(torch.zeros_like(x), block))  # the padding of the last block
    scales = torch.where((finite | ~real).all(dim=-1), exponent + 127, 255).to(torch.uint8)
    q = with_signs_of(blocks * torch.ldexp(torch.ones_like(amax), -exponent)[..., None], blocks)
    codes = _fp8_codes(q, dtype).flatten(-2)[..., :x.shape[-1]]
    return codes, scales


def _e2m1(q: torch.Tensor) -> torch.Tensor:
    magnitude = q.abs()
    bounds, tie_up = _BOUNDS.to(q.device), _TIE_UP.to(q.device)  # the baseline runs on any device
    index = torch.bucketize(magnitude, bounds)  # boundaries strictly below the magnitude
    on = bounds[index.clamp(max=6)] == magnitude
    code = torch.where(on & tie_up[index.clamp(max=6)], index + 1, index).clamp(max=7)
    code = torch.where(torch.signbit(q), code | 8, code)
    return torch.where(torch.isnan(q), 7, code).to(torch.uint8)


def _nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    gs = global_scale.reshape(()).float()
    blocks = _blocks(x, 16)
    amax = torch.where(torch.isnan(blocks), 0, blocks.abs()).amax(dim=-1)
    sf = gs * (amax * SIXTH)
    scales = sf.clamp(max=448).to(torch.float8_e4m3fn)
    sfq = scales.float()
    out = torch.where(sfq == 0, 0, 1 / (sfq * (1 / gs)))
    codes = _e2m1(blocks * out[..., None]).flatten(-2)[..., :x.shape[-1]]
    return codes[..., 0::2] | (codes[..., 1::2] << 4), scales.view(torch.uint8)


def encode(x: torch.Tensor, fmt: str, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of ``x`` (``[..., D]``) in block format ``fmt``."""
    dtype, block, emax = FORMATS[fmt]
    wide = with_signs_of(x.float(), x)  # a NaN keeps its sign (:mod:`._nan_signs`)
    if fmt == "nvfp4":
        return _nvfp4(wide, global_scale)
    return _mx(wide, dtype, block, emax)


def quantize_block(codes, scales, x, fmt, global_scale):
    """``codes, scales = block-scaled(x)``; x ``[N, H, D]``, codes uint8 ``[N, H, Dc]``, scales
    uint8 ``[N, H, ceil(D / block)]``; ``global_scale`` a float32 [1] (NVFP4; MX ignores it)."""
    write_quantized(codes, scales, x, fmt, global_scale, encode)


def write_quantized(codes, scales, x, fmt, global_scale, encoder) -> None:
    """:func:`quantize_block` with ``encoder`` (``encode``'s signature) computing the bytes."""
    check_quantize(codes, scales, x, fmt, global_scale)
    c, s = encoder(x, fmt, global_scale)
    codes.copy_(c)
    scales.copy_(s)


def check_quantize(codes, scales, x, fmt, global_scale) -> None:
    """:func:`quantize_block`'s argument checks."""
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if x.dim() != 3:
        raise ValueError(f"x must be 3-D [N, H, D], got shape {tuple(x.shape)}")
    _, block, _ = _check_format(fmt, x.shape[2])
    _check_global_scale("global_scale", global_scale)
    width = x.shape[2] // 2 if fmt == "nvfp4" else x.shape[2]
    for name, out, last in (("codes", codes, width), ("scales", scales, -(-x.shape[2] // block))):
        if out.dtype != torch.uint8:
            raise TypeError(f"{name} has dtype {out.dtype}; expected torch.uint8")
        if tuple(out.shape) != tuple(x.shape[:2]) + (last,):
            raise ValueError(f"{name} has shape {tuple(out.shape)}; expected {tuple(x.shape[:2]) + (last,)}")


def _swizzled_offsets(rows: int, cols: int, device) -> torch.Tensor:
    r = torch.arange(rows, device=device)[:, None]
    c = torch.arange(cols, device=device)[None, :]
    return ((r // 128) * (-(-cols // 4)) + c // 4) * 512 + (r % 32) * 16 + ((r % 128) // 32) * 4 + c % 4


def reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                            slot_mapping, fmt, k_global_scale, v_global_scale):
    """Token ``i`` to slot ``slot_mapping[i]`` of block-scaled paged caches (any strides; a 4-D
    scale cache is linear, a 2-D one swizzled); negative slots are skipped, as in vLLM."""
    write_paged(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                fmt, k_global_scale, v_global_scale, encode)


def write_paged(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                fmt, k_global_scale, v_global_scale, encoder) -> None:
    """:func:`reshape_and_cache_block` with ``encoder`` computing the bytes."""
    for name, src in (("key", key), ("value", value)):
        if src.dtype not in FLOAT_DTYPES or src.dim() != 3:
            raise TypeError(f"{name} must be a float32/float16/bfloat16 [T, H, D] tensor, got "
                            f"{src.dtype} {tuple(src.shape)}")
    if value.dtype != key.dtype or value.shape[1:] != key.shape[1:]:
        raise ValueError(f"value is {value.dtype} {tuple(value.shape)} but key is {key.dtype} {tuple(key.shape)}")
    heads, head_size = key.shape[1:]
    _, block, _ = _check_format(fmt, head_size)
    if slot_mapping.dtype not in INDEX_DTYPES or slot_mapping.dim() != 1:
        raise TypeError(f"slot_mapping must be a 1-D int32 or int64 tensor, got {slot_mapping.dtype} "
                        f"{tuple(slot_mapping.shape)}")
    tokens = slot_mapping.shape[0]
    if key.shape[0] < tokens or value.shape[0] < tokens:
        raise ValueError(f"key/value have {key.shape[0]}/{value.shape[0]} tokens but slot_mapping has {tokens}")
    for name, scale in (("k_global_scale", k_global_scale), ("v_global_scale", v_global_scale)):
        _check_global_scale(name, scale)
    num_blocks, block_size = key_cache.shape[:2]
    width, count = (head_size // 2 if fmt == "nvfp4" else head_size), -(-head_size // block)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dtype != torch.uint8 or tuple(cache.shape) != (num_blocks, block_size, heads, width):
            raise ValueError(f"{name} is {cache.dtype} {tuple(cache.shape)}; expected uint8 "
                             f"{(num_blocks, block_size, heads, width)}")
    page = (-(-block_size * heads // 128) * 128) * (-(-count // 4) * 4)
    for name, cache in (("key_scale_cache", key_scale_cache), ("value_scale_cache", value_scale_cache)):
        linear = (num_blocks, block_size, heads, count)
        if cache.dtype != torch.uint8 or not (tuple(cache.shape) == linear or (
                cache.dim() == 2 and cache.shape[0] == num_blocks and cache.shape[1] >= page)):
            raise ValueError(f"{name} is {cache.dtype} {tuple(cache.shape)}; expected uint8 {linear} "
                             f"(linear) or [{num_blocks}, >= {page}] (swizzled)")
    num_slots = num_blocks * block_size
    if tokens and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping holds slot {int(slot_mapping.max())}, out of range [0, {num_slots}) "
                         "(negative slots are padding)")
    keep = slot_mapping >= 0  # negative slots are padding: nothing written
    slots = slot_mapping[keep].long()
    pages, offsets = slots // block_size, slots % block_size
    for src, cache, scale_cache, gs in ((key, key_cache, key_scale_cache, k_global_scale),
                                        (value, value_cache, value_scale_cache, v_global_scale)):
        codes, scales = encoder(src[:tokens][keep], fmt, gs)
        cache.index_put_((pages, offsets), codes)
        if scale_cache.dim() == 4:
            scale_cache.index_put_((pages, offsets), scales)
        else:
            table = _swizzled_offsets(block_size * heads, count, offsets.device)  # on the cache's device
            where = table.reshape(block_size, heads, count)[offsets]
            scale_cache.index_put_((pages[:, None, None].expand_as(where), where), scales)

