"""Host wrappers of the block-scaled Triton writers (MXFP8, NVFP4): :func:`quantize_block` and
:func:`reshape_and_cache_block` (oracle.reference.block_scaled is the arithmetic's single source
of truth; oracle/ops/block_scaled.py the calling conventions).

Both check on the host what the host knows without reading device memory (dtypes, shapes,
strides, devices, ``fmt``), and on the device what it would have to read: the slots (none at or
past ``num_blocks * block_size``; negative slots are padding and write nothing) and the NVFP4
per-tensor scales (finite and > 0). A call that fails either writes nothing at all, as the other
Triton writers do (:mod:`._validate`, :mod:`oracle.kernels._deferred`): its error, a ValueError
naming the argument and its value, is raised by the next validating call on that device, by
``oracle.kernels.raise_deferred_errors()``, or at once with ``validate="sync"``,
``KV_ORACLE_SYNC_ERRORS=1`` and on the CPU interpreter. ``validate=False`` checks neither.

The kernels (:mod:`._block_kernels`) convert with integer arithmetic, so they are exact on
Triton's CPU interpreter (TRITON_INTERPRET=1); on a GPU that converts to fp8 in hardware (NVIDIA
sm_89+, :func:`hardware_fp8`) the fp8 codes and NVFP4 scale bytes come from its saturating
conversion instead, bit for bit the same. ``reshape_and_cache_block`` writes K and V in one
launch (each program both sides of its rows) where their layouts match and the caches do not
overlap, else K's launch then V's. As the other Triton writers, both ops launch with
programmatic dependent launch where the device has it (keyword ``pdl``: None, the default,
decides by the device; False launches plainly) and replay a launch plan after the first call of
each signature (:mod:`._plans`: the checks, the tile and Triton's argument binder run once per
signature; slots and per-tensor scales are data, checked on the device by every validating call).
Importing this module does not import triton.
"""

from __future__ import annotations

import functools

import torch

from .._checks import FLOAT_DTYPES, INDEX_DTYPES
from .. import _deferred
from .._compile import eager_under_compile
from ..check_reuse import reusing
from . import _host, _plans, _runtime, _validate

# fmt -> (the kernel's FMT code, elements per block, elements per code byte)
FORMATS = {"mxfp8_e4m3fn": (1, 32, 1), "mxfp8_e5m2": (2, 32, 1), "nvfp4": (3, 16, 2)}
_SRC = {torch.float32: (0, torch.int32), torch.float16: (1, torch.int16), torch.bfloat16: (2, torch.int16)}
# source elements per program on a GPU, by the kernel's FMT (rows of blocks; a power of two), and
# warps per program: benchmarks/tune_block.py sweeps both (docs/benchmarks.md)
TILE_ELEMENTS = {1: 2048, 2: 2048, 3: 2048}
NUM_WARPS = 4
PREFETCH = True  # under PDL, the sources read after the wait asked of the L2 before it
# the interpreter's cost is per operation and program, not per element: far fewer, larger programs
INTERPRETER_TILE_ELEMENTS = 1 << 16
INT32_LIMIT = 2**31  # row numbers and slots from here up take the kernel's 64-bit path (WIDE)

_block_kernels = None


def kernels():
    """The block kernel module (imports triton on first use)."""
    global _block_kernels
    if _block_kernels is None:
        from . import _block_kernels as module

        _block_kernels = module
    return _block_kernels


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


# --- checks ----------------------------------------------------------------------------------

def _format(fmt) -> tuple[int, int, int]:
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {', '.join(FORMATS)}")
    return FORMATS[fmt]


def _tensor(name: str, t) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def _source(name: str, x) -> None:
    _tensor(name, x)
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if x.dim() != 3:
        raise ValueError(f"{name} has shape {tuple(x.shape)}; expected [N, H, D]")


def _uint8(name: str, t, shape: tuple) -> None:
    """``t`` a uint8 tensor of ``shape`` whose last dimension is contiguous."""
    _tensor(name, t)
    if t.dtype != torch.uint8:
        raise TypeError(f"{name} has dtype {t.dtype}; expected torch.uint8")
    if tuple(t.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {list(shape)}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} has strides {t.stride()}; its last dimension must be contiguous")


def _global_scale(name: str, gs) -> None:
    """A float32 tensor [1] (its value is checked by the kernel, or by
    :func:`._validate.empty_call_scales`)."""
    _tensor(name, gs)
    if gs.dtype != torch.float32:
        raise TypeError(f"{name} has dtype {gs.dtype}; expected torch.float32")
    if tuple(gs.shape) != (1,):
        raise ValueError(f"{name} has shape {tuple(gs.shape)}; expected [1]")


def _dim(name: str, d: int, per_byte: int, fmt: str) -> None:
    if d % per_byte:
        raise ValueError(f"{name} has head dim D = {d}; {fmt} packs two elements a byte and needs D even")


def swizzled_page_bytes(block_size: int, heads: int, nb: int) -> int:
    """Bytes of one cache block's page of scales in cuBLAS's 128x4 tiling: roundup(block_size *
    heads, 128) * roundup(nb, 4)."""
    return _cdiv(block_size * heads, 128) * 128 * _cdiv(nb, 4) * 4


# --- launching -------------------------------------------------------------------------------

def _log2(x: int) -> int:
    """log2 of a power of two, else -1 (the kernel then divides)."""
    return x.bit_length() - 1 if x > 0 and x & (x - 1) == 0 else -1


def _launch(sides: list, index, n: int, fmt_code: int, block: int, block_size: int, num_slots: int,
            swizzled: bool, cp4: int, device, check: _validate.Check, scale_codes: tuple | None, pdl: bool) -> None:
    """``block_write`` for one or two sides, each ``(src, codes4, scales4, gs)``: ``codes4`` and
    ``scales4`` = (tensor, block stride, token stride, head stride) (swizzled scales: the page
    stride as block stride), ``gs`` the NVFP4 per-tensor scale or None. Two sides whose sources,
    caches and scale caches share their layouts, and whose caches do not overlap, go in one launch
    (each program writes both: ``SIDES``; :func:`._host.one_launch`), else one launch each, K
    first. ``check``: the slot check (:mod:`._validate`); ``scale_codes``: each side's per-tensor
    scale's argument code (``_deferred.SCALE_ARGUMENTS``) where the scales are checked on the
    device, else None (every launch checks both sides' scales)."""
    src = sides[0][0]
    _, heads, dim = src.shape
    n_rows = n * heads
    if n_rows == 0 or dim == 0:
        return
    nb = _cdiv(dim, block)
    nbp = _pow2(nb)
    interpreting = _runtime.interpreting()
    tile = INTERPRETER_TILE_ELEMENTS if interpreting else TILE_ELEMENTS[fmt_code]
    rows = max(1, min(_pow2(n_rows), tile // (nbp * block)))
    code, int_dtype = _SRC[src.dtype]
    grid = _cdiv(n_rows, rows)
    # int32 row and slot arithmetic where every row number a program forms and every slot fits
    wide = grid * rows >= INT32_LIMIT or num_slots >= INT32_LIMIT
    meta = dict(SRC=code, FMT=fmt_code, BLOCK=block, NBP=nbp, ROWS=rows, HAS_INDEX=index is not None,
                SWIZZLED=swizzled, CHECK_GS=scale_codes is not None, WIDE=wide, WHOLE=dim % block == 0,
                HW_FP8=not interpreting and hardware_fp8(device), PDL=pdl or check.pdl,
                HEADS_LOG2=_log2(heads), BS_LOG2=_log2(block_size), PREFETCH=PREFETCH and not interpreting,
                num_warps=NUM_WARPS, **check.meta)
    codes_of = scale_codes or (0,) * len(sides)
    k = kernels()
    parts = [_side_args(side, int_dtype) for side in sides]
    # (the launch's side, the side riding along or checked beside it, sides written): every launch
    # checks both per-tensor scales, its own first
    if len(sides) == 1:
        plan = [(0, 0, 1)]
    elif _host.one_launch(((sides[0][0], sides[1][0]),), tuple(zip((s[0] for s in sides[0][1:3]),
                                                                    (s[0] for s in sides[1][1:3])))):
        plan = [(0, 1, 2)]
    else:
        plan = [(0, 1, 1), (1, 0, 1)]  # K's launch, then V's
    for first, second, count in plan:
        (src, *src_strides), (codes, *codes_strides), (scales, *scales_strides) = parts[first]
        args = (src, *src_strides, codes, *codes_strides, scales, *scales_strides,
                parts[second][0][0], parts[second][1][0], parts[second][2][0],
                index if index is not None else codes, index.stride(0) if index is not None else 0,
                _or(sides[first][3], codes), _or(sides[second][3], codes),
                n_rows, heads, dim, nb, block_size, num_slots, cp4, *check.args, codes_of[first], codes_of[second])
        _runtime.launch(k.block_write, (grid,), device, *args, SIDES=count, **meta)


def _side_args(side, int_dtype) -> tuple:
    """((source bits, its strides), codes4, scales4) of one side: the source loaded as integers
    (the kernel widens them itself, exactly)."""
    bits = side[0].view(int_dtype)
    return (bits, *bits.stride()), tuple(side[1]), tuple(side[2])


def _or(tensor, placeholder):
    return tensor if tensor is not None else placeholder


@functools.lru_cache(maxsize=None)
def hardware_fp8(device: torch.device) -> bool:
    """Whether ``device`` converts float32 to e4m3fn and e5m2 in hardware (``cvt.rn.satfinite``:
    NVIDIA sm_89 and later), which the kernels then use instead of their integer rounding: the
    same codes (RNE, finite overflow and inf saturated, NaN 0x7F with the source's sign), in one
    instruction. Cached per device."""
    return device.type == "cuda" and torch.version.hip is None and torch.cuda.get_device_capability(device) >= (8, 9)


# --- the ops -----------------------------------------------------------------------------------

@eager_under_compile
@_plans.planned(_host.plans_enabled)
def quantize_block(codes, scales, x, fmt, global_scale=None, *, validate=True, pdl=None) -> None:
    """Quantize ``x`` ``[N, H, D]`` (float32/float16/bfloat16, any strides) into ``codes`` (uint8
    ``[N, H, D]`` for MXFP8, ``[N, H, D // 2]`` for NVFP4, last dimension contiguous) and
    ``scales`` (uint8 ``[N, H, ceil(D / block)]``: E8M0 for MXFP8, e4m3fn for NVFP4), blocks of
    32 (MXFP8) or 16 (NVFP4) elements along each head's D, never straddling heads.
    ``global_scale``: float32 ``[1]``, finite and > 0 (NVFP4, checked on the device; ignored by
    MXFP8). Returns None."""
    fmt_code, block, per_byte = _format(fmt)
    _source("x", x)
    n, heads, dim = x.shape
    _dim("x", dim, per_byte, fmt)
    _uint8("codes", codes, (n, heads, dim // per_byte))
    _uint8("scales", scales, (n, heads, _cdiv(dim, block)))
    tensors = [codes, scales, x]
    nvfp4 = fmt_code == 3
    if nvfp4:
        _global_scale("global_scale", global_scale)
        tensors.append(global_scale)
    device = _host.device_of(*tensors)
    if n * heads * dim == 0:
        _validate.empty_call_scales(validate, (("global_scale", global_scale),) if nvfp4 else (),
                                    _host.capturing(x))
        return
    check = _validate.scale_check(codes, validate, device, _runtime.interpreting(), _host.capturing(x))
    code = _deferred.SCALE_ARGUMENTS.index("global_scale")
    # a [N, H, *] output is a cache of N blocks of one token: slot i = token i
    side = (x, (codes, codes.stride(0), 0, codes.stride(1)), (scales, scales.stride(0), 0, scales.stride(1)),
            global_scale if nvfp4 else None)
    _launch([side], None, n, fmt_code, block, 1, n, False, 0, device, check,
            (code,) if nvfp4 and check.reports else None, _host.launch_pdl(pdl, device))
    _validate.finish(check)


@eager_under_compile
@reusing("reshape_and_cache_block", padding="negative")
@_plans.planned(_host.plans_enabled)
def reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache,
                            slot_mapping, fmt, k_global_scale=None, v_global_scale=None, *, validate=True,
                            pdl=None) -> None:
    """Token ``i < len(slot_mapping)`` of ``key``/``value`` (``[T, H, D]``, T >= the slot count,
    float32/float16/bfloat16, any strides) goes, quantized as :func:`quantize_block` does, to
    entry ``(slot // block_size, slot % block_size)`` of ``key_cache``/``value_cache`` (uint8
    ``[num_blocks, block_size, H, D or D // 2]``, any strides: NHD or HND views; last dimension
    contiguous) with its scales in the scale caches: "linear" (uint8 ``[num_blocks, block_size, H,
    nb]``, any strides, last dimension contiguous) or "swizzled" (uint8 ``[num_blocks, >=
    page_bytes]``, :func:`swizzled_page_bytes`; bytes no scale maps to are never written), told
    apart by rank. ``slot_mapping``: int32/int64, 1-D, any stride, or an
    :class:`oracle.kernels.CheckedIndex` of one; slots
    < 0 are padding (nothing written), slots >= num_blocks * block_size are rejected.
    ``k_global_scale``, ``v_global_scale``: float32 ``[1]`` (NVFP4; ignored by MXFP8)."""
    fmt_code, block, per_byte = _format(fmt)
    _source("key", key)
    _source("value", value)
    if value.dtype != key.dtype:
        raise TypeError(f"value has dtype {value.dtype} but key has dtype {key.dtype}")
    slot_mapping, checked = _host.index_arg(slot_mapping)
    _tensor("slot_mapping", slot_mapping)
    if slot_mapping.dtype not in INDEX_DTYPES:
        raise TypeError(f"slot_mapping has dtype {slot_mapping.dtype}; expected torch.int32 or torch.int64")
    if slot_mapping.dim() != 1:
        raise ValueError(f"slot_mapping must be 1-D, got shape {tuple(slot_mapping.shape)}")
    n = slot_mapping.shape[0]
    _, heads, dim = key.shape
    _dim("key", dim, per_byte, fmt)
    for name, src in (("key", key), ("value", value)):
        if src.shape[0] < n or tuple(src.shape[1:]) != (heads, dim):
            raise ValueError(f"{name} has shape {tuple(src.shape)}; expected [>= {n}, {heads}, {dim}] "
                             "(key's heads and head dim, a row per slot_mapping entry at least)")
    _tensor("key_cache", key_cache)
    if key_cache.dim() != 4:
        raise ValueError(f"key_cache has shape {tuple(key_cache.shape)}; expected [num_blocks, block_size, H, Dc]")
    num_blocks, block_size = key_cache.shape[0], key_cache.shape[1]
    nb = _cdiv(dim, block)
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        _uint8(name, cache, (num_blocks, block_size, heads, dim // per_byte))
    _tensor("key_scale_cache", key_scale_cache)
    swizzled = key_scale_cache.dim() == 2
    page = swizzled_page_bytes(block_size, heads, nb)
    for name, sc in (("key_scale_cache", key_scale_cache), ("value_scale_cache", value_scale_cache)):
        if swizzled:  # a page a row, rows at least a page wide (the bytes past it are never written)
            _tensor(name, sc)
            if sc.dtype != torch.uint8:
                raise TypeError(f"{name} has dtype {sc.dtype}; expected torch.uint8")
            if sc.dim() != 2 or sc.shape[0] != num_blocks or sc.shape[1] < page:
                raise ValueError(f"{name} has shape {tuple(sc.shape)}; a swizzled scale cache (as "
                                 f"key_scale_cache) is [num_blocks={num_blocks}, page_bytes >= {page}]")
            if sc.stride(1) != 1 or (num_blocks > 1 and sc.stride(0) < page):
                raise ValueError(f"{name} has strides {sc.stride()}; a swizzled scale cache needs contiguous "
                                 f"pages of {page} bytes (row stride >= {page}, element stride 1)")
        else:
            _tensor(name, sc)
            if sc.dim() != 4:
                raise ValueError(f"{name} has shape {tuple(sc.shape)}; expected [num_blocks, block_size, H, "
                                 f"{nb}] (linear) or [num_blocks, {page}] (swizzled, as key_scale_cache)")
            _uint8(name, sc, (num_blocks, block_size, heads, nb))
    tensors = [key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping]
    if fmt_code == 3:
        _global_scale("k_global_scale", k_global_scale)
        _global_scale("v_global_scale", v_global_scale)
        tensors += [k_global_scale, v_global_scale]
    device = _host.device_of(*tensors)
    nvfp4 = fmt_code == 3
    num_slots = num_blocks * block_size
    if n * heads * dim == 0:
        _validate.empty_call_scales(validate, (("k_global_scale", k_global_scale),
                                               ("v_global_scale", v_global_scale)) if nvfp4 else (),
                                    _host.capturing(key))
        return
    pdl = _host.launch_pdl(pdl, device)
    check = _host.begin_check("slot_mapping", slot_mapping, n, num_slots, _host.parse_padding("negative"),
                               validate, device, key_cache, pdl, checked)
    sides = [(src, (cache,) + tuple(cache.stride()[:3]),
              (sc, sc.stride(0), 0, 0) if swizzled else (sc,) + tuple(sc.stride()[:3]), gs if nvfp4 else None)
             for src, cache, sc, gs in ((key, key_cache, key_scale_cache, k_global_scale),
                                        (value, value_cache, value_scale_cache, v_global_scale))]
    scale_codes = tuple(_deferred.SCALE_ARGUMENTS.index(name) for name in ("k_global_scale", "v_global_scale"))
    _launch(sides, slot_mapping, n, fmt_code, block, block_size, num_slots, swizzled, _cdiv(nb, 4), device, check,
            scale_codes if nvfp4 and check.reports else None, pdl)
    _validate.finish(check)
