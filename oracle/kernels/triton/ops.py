"""Host wrappers of the Triton kernels: the positional calling conventions of
:mod:`oracle.kernels.torch_native`, everything validated on the host before anything is launched.

Importing this module does not import triton; the kernels (:mod:`._kernels`) are imported on the
first launch. Each writer takes a keyword-only ``padding`` (``"none"``, ``"negative"`` or
``"reserved:K"``; the default is the policy its peers use: ``"none"`` for the sglang writers,
``"negative"`` for the vLLM ones) that decides which slots the host accepts and which the kernel
skips. Copies are bitwise: sources and caches are reinterpreted as integers of the same width, so
the kernel moves bits, never floats.

The writers check their slots on the device, never reading them on the host (a synchronization
costs tens of microseconds, and a CUDA graph cannot capture one): a call with an illegal slot
writes nothing, and its error is raised by the next validating call, by
``oracle.kernels.raise_deferred_errors()``, or at once with ``validate="sync"`` or
``KV_ORACLE_SYNC_ERRORS=1`` (:mod:`._validate`, :mod:`oracle.kernels._deferred`). While a CUDA graph
is being captured the check is left out, so a replayed decode step costs what it cost before the
check existed (the kernels still drop any slot outside the cache). ``validate=False`` skips it,
the fast path for callers that vouch for their slots (serving engines in decode; registered as ``triton.<op>.unchecked`` with ``validates=False``).
concat_and_cache_mla's scale value (finite, > 0) is read, and so checked, under
``validate="sync"`` only. The writers' keyword ``pdl=True`` launches
with programmatic dependent launch (sm_90+): the kernel may start while the previous one on the
stream finishes and waits for it (``griddepcontrol.wait``) before touching memory, so only launch
latency overlaps; registered as ``triton.<op>.pdl`` (with ``validate=False``, the way a decode
graph calls it). Metadata (dtypes, shapes, strides, devices)
is always checked, and the kernels never write a slot outside the cache whatever the index holds:
an out-of-range slot is skipped, not written.
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass

import torch

from .._checks import (FLOAT_DTYPES, FP8_FORMATS, INDEX_DTYPES, KV_CACHE_DTYPES, check_concat_mla,
                       check_paged_write, check_rows, check_scale, check_translate, check_translate_values)
from . import _plans, _validate

KERNEL_FP8 = {"e4m3fn": 1, "e5m2": 2}  # formats the kernels implement (Triton float8e4nv, float8e5)
_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

INTERPRETER_FP8 = ("the Triton interpreter's fp8 conversion is wrong for several % of inputs "
                   "(triton#8322; 464 -> NaN, inf -> 256, mantissa carries dropped), so the fp8 paths "
                   "are refused under TRITON_INTERPRET=1; they run on CUDA")

_kernels = None


def kernels():
    """The kernel module (imports triton on first use)."""
    global _kernels
    if _kernels is None:
        from . import _kernels as module

        _kernels = module
    return _kernels


_interpreting = None


def interpreting() -> bool:
    """Whether the kernels run on Triton's CPU interpreter (TRITON_INTERPRET=1 when they were
    defined) rather than compiled for a GPU (fixed once the kernels are imported)."""
    global _interpreting
    if _interpreting is None:
        from triton.runtime.interpreter import InterpretedFunction

        _interpreting = isinstance(kernels().paged_write, InterpretedFunction)
    return _interpreting


# --- validation ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=64)
def parse_padding(spec: str) -> "Padding":
    """The parsed policy (cached: the writers parse theirs on every call)."""
    return Padding(spec)


class Padding:
    """A parsed padding policy: which slots the host accepts besides ``[0, num_slots)`` and
    which the kernel skips."""

    def __init__(self, spec: str):
        self.spec = spec
        self.negative = spec == "negative"
        self.reserved = None
        self.kind = spec if spec in ("none", "negative") else "reserved"
        if spec.startswith("reserved:"):
            try:
                self.reserved = int(spec.split(":", 1)[1])
            except ValueError:
                self.reserved = None
            if self.reserved is None or self.reserved < 0:
                raise ValueError(f"padding={spec!r}: reserved:K needs a slot K >= 0")
        elif spec not in ("none", "negative"):
            raise ValueError(f"padding={spec!r} is not 'none', 'negative' or 'reserved:K'")


def _capturing(tensor: torch.Tensor) -> bool:
    # torch's C query directly: torch.cuda.is_current_stream_capturing() adds microseconds per call
    return tensor.is_cuda and torch._C._cuda_isCurrentStreamCapturing()


def _device(*tensors: torch.Tensor) -> torch.device:
    index = tensors[0].get_device()  # an int: cheaper than comparing torch.device objects
    if index >= 0 and all(t.get_device() == index for t in tensors):
        return tensors[0].device  # all on one CUDA device
    device = tensors[0].device
    if any(t.device != device for t in tensors):
        devices = sorted({str(t.device) for t in tensors})
        raise ValueError(f"tensors on different devices: {', '.join(devices)}")
    if device.type != "cuda" and not interpreting():
        raise ValueError(f"tensors are on {device}; the Triton kernels need CUDA tensors "
                         "(or TRITON_INTERPRET=1 for the CPU interpreter)")
    return device


def _check_index(name: str, index: torch.Tensor) -> None:
    if not isinstance(index, torch.Tensor) or index.dtype not in INDEX_DTYPES:
        got = index.dtype if isinstance(index, torch.Tensor) else type(index).__name__
        raise TypeError(f"{name} has dtype {got}; expected torch.int32 or torch.int64")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")


def _reads_device(validate: bool, tensor: torch.Tensor) -> bool:
    """Whether the checks that read device values (slot ranges, scales, the sentinel) run: not
    with ``validate=False`` (the caller vouches for them, as serving engines do in decode), and
    not while a CUDA graph is being captured (reading would break the capture)."""
    return validate and not _capturing(tensor)


def _begin_check(argument: str, index: torch.Tensor, n: int, num_slots: int, padding: Padding, validate,
                 device: torch.device, placeholder: torch.Tensor, pdl: bool) -> _validate.Check:
    """The device check of a writer call (:mod:`._validate`): none with ``validate=False`` or
    while a CUDA graph is being captured (the graph then replays the writer as it was before the
    check existed: a decode graph's slots are its engine's; the kernel still drops any slot outside
    the cache), else planned (and, for a long index, the check grid launched) before the writer's
    launch."""
    if validate is False or _capturing(index):
        return _validate.unchecked(placeholder)
    return _validate.plan(kernels(), _launch, index, n, num_slots, padding, argument, validate, device,
                          interpreting(), _pdl_capable(device), pdl)


@functools.lru_cache(maxsize=16)
def _pdl_capable_index(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= (9, 0)


def _pdl_capable(device: torch.device) -> bool:
    """Whether launches on ``device`` can use programmatic dependent launch (sm_90+)."""
    return device.type == "cuda" and not interpreting() and _pdl_capable_index(device.index)


def _kernel_format(fmt: str, allow_interpreter_fp8: bool) -> int:
    """The kernel's FP8 code for a validated format name; raises where the kernels cannot
    produce it (after validation, before any launch)."""
    if fmt not in KERNEL_FP8:
        raise NotImplementedError(f"fp8 format {fmt!r}: the Triton kernels write e4m3fn and e5m2 "
                                  "only (Triton has no fnuz conversion on NVIDIA GPUs)")
    if interpreting() and not allow_interpreter_fp8:
        raise NotImplementedError(INTERPRETER_FP8)
    return KERNEL_FP8[fmt]


# dtypes a compiled kernel loads and stores bitwise as they are (the copy paths always store into a
# cache of the source's own dtype, so no conversion is emitted; no NaN is canonicalized)
_NATIVE_BITS = frozenset((torch.bfloat16, torch.float16, torch.float32, torch.float64, torch.uint8,
                          torch.int8, torch.int16, torch.int32, torch.int64))


def _as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """The same view as integers of the same width (strides and offset unchanged). On a GPU the
    common dtypes go as they are: the view costs a microsecond of host time per tensor, and the
    compiled copy moves their bits unchanged (the conformance suite's special values, NaN payloads
    included, check it); the interpreter computes through numpy, so it always gets integers."""
    if tensor.dtype in _NATIVE_BITS and not interpreting():
        return tensor
    return tensor.view(_INT_OF_SIZE[tensor.element_size()])


def _rows3(name: str, t: torch.Tensor) -> tuple[tuple, tuple]:
    """(shape, strides) of ``t`` as ``[N, H, D]`` (1-D rows are ``[N, 1, D]``)."""
    if t.dim() == 3:
        return tuple(t.shape), tuple(t.stride())
    if t.dim() == 2:
        return (t.shape[0], 1, t.shape[1]), (t.stride(0), 0, t.stride(1))
    if t.dim() == 1:
        return (t.shape[0], 1, 1), (t.stride(0), 0, 0)
    raise ValueError(f"{name} has shape {tuple(t.shape)}; the Triton writer takes rows of up to two "
                     "dims ([N, H, D])")


# --- launching -----------------------------------------------------------------------------

def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class Tile:
    """How a launch splits the rows: ``block_n`` rows per program, ``block_r`` row elements per
    program (the MLA writer: ``block_a`` and ``block_b`` per part), ``num_warps`` warps each."""

    block_n: int
    block_r: int
    num_warps: int
    block_a: int = 0
    block_b: int = 0


# (rows per program, warps) for N >= 1024 rows: the H100 sweep's choice (benchmarks/tune_gpu.py,
# inputs rotated past the L2; docs/benchmarks.md), within a point or two of the fastest at both
# N = 16384 and 65536 for each kernel.
# Fewer rows per program keep more programs in flight; more warps than the tile needs starve it.
# mla_write has two entries: behind set_mla_kv_buffer ("mla_write") and behind
# concat_and_cache_mla ("concat_mla": paged, maybe fp8), which (2, 4) made 2-17% slower.
LARGE_N_TILES = {"paged_write": (2, 4), "paged_write_fp8": (2, 2), "mla_write": (2, 4), "concat_mla": (2, 1)}
SMALL_N = 1024
# (rows per program, warps) below SMALL_N rows, by LARGE_N_TILES key; else one row, 4 warps. On
# the H100 (graphs, benchmarks/tune_gpu.py --sizes 1,16,64 and 64,256,512) two rows per program
# against one: equal at N = 1 and 16, faster from 64 (MLA 1.32 -> 1.23 us, .pdl 0.81 -> 0.77;
# store_cache 1.42 -> 1.36, .pdl 0.89 -> 0.82) to 512 (store_cache.pdl 1.96 -> 1.63, MLA .pdl
# 1.12 -> 0.93). The other kernels were not measured below SMALL_N.
SMALL_N_TILES = {"paged_write": (2, 4), "mla_write": (2, 4)}
# One-wave tiles, by LARGE_N_TILES key: one-warp programs taken where they fill more than
# ONE_WAVE_FILL of one wave (32 resident programs per SM on sm_90) without passing it, so every row
# is loaded at once and no partial second wave trails. mla_write's (4 rows, 1 warp): on the H100
# 15207 < N <= 16896, where it beat (2, 4) by 2-3% plainly and with PDL (N = 16384: 14.95 vs 15.35
# us, .pdl 14.35 vs 14.65); at 12288 (a 73% fill) it lost with PDL (13.1 vs 11.4 us) and at 20480
# (two waves) both ways (docs/benchmarks.md). Only measured there: the other kernels have none.
ONE_WAVE_TILES = {"mla_write": (4, 1)}
ONE_WAVE_FILL = 0.9
# Tiles for PDL launches that prefetch (PREFETCH), by LARGE_N_TILES key, in place of both tables
# above: for mla_write (4 rows, 4 warps) was the fastest of six tiles at N = 4096, 16384 and 65536
# (3.89, 13.91, 54.09 us against 4.15, 16.78, 54.61 for the plain launches' tiles; one-warp
# programs of 4 rows lose 17% when they prefetch: docs/benchmarks.md).
PDL_TILES = {"mla_write": (4, 4)}
# Overrides for benchmarks/tune_gpu.py, by LARGE_N_TILES key:
# {"block_n": ..., "num_warps": ...}; empty in normal use.
TUNING: dict = {}


def tile(n_rows: int, row: int, kernel: str = "paged_write", parts: tuple = (),
         device: torch.device | None = None, pdl_prefetch: bool = False) -> Tile:
    """A whole row per program where it fits (the next power of two of the row, each MLA part
    in its own tile), and on a GPU the rows per program measured fastest on the H100 (by N:
    SMALL_N_TILES, LARGE_N_TILES; docs/benchmarks.md; for a PDL launch that prefetches, the
    kernel's PDL_TILES entry; else on an sm_90 ``device`` its ONE_WAVE_TILES entry where it fills
    one wave), and few large programs under the interpreter, where each program is one Python
    call."""
    if interpreting():
        return _interpreter_tile(_next_pow2(n_rows), row, parts)
    shape = (LARGE_N_TILES if n_rows >= SMALL_N else SMALL_N_TILES).get(kernel, (1, 4))
    if n_rows >= SMALL_N:
        one_wave = ONE_WAVE_TILES.get(kernel)
        if pdl_prefetch and kernel in PDL_TILES:
            shape = PDL_TILES[kernel]
        elif one_wave and device is not None:
            slots = _one_warp_slots(device.index if device.index is not None else torch.cuda.current_device())
            if ONE_WAVE_FILL * slots < _cdiv(n_rows, one_wave[0]) <= slots:
                shape = one_wave
    t = _gpu_tile(shape, row, parts)
    override = TUNING.get(kernel)
    if override:
        t = Tile(override.get("block_n", t.block_n), t.block_r, override.get("num_warps", t.num_warps),
                 t.block_a, t.block_b)
    return t


@functools.lru_cache(maxsize=256)
def _interpreter_tile(rows_pow2: int, row: int, parts: tuple) -> Tile:
    block_r = min(_next_pow2(row), 1 << 14)
    block_n = max(1, min(rows_pow2, (1 << 16) // block_r))
    return Tile(block_n, block_r, 4, *(min(_next_pow2(w), block_r) for w in parts))


@functools.lru_cache(maxsize=16)
def _one_warp_slots(index: int) -> int:
    """One-warp programs resident at once on CUDA device ``index`` if it is sm_90+ (32 per SM),
    else 0: the one-wave tile is measured on the H100 only."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count * 32 if props.major >= 9 else 0


@functools.lru_cache(maxsize=256)
def _gpu_tile(shape: tuple, row: int, parts: tuple) -> Tile:
    block_r = min(_next_pow2(row), 1 << 12)
    block_n, num_warps = shape
    block_n = max(1, min(block_n, 4096 // block_r))  # wide rows: one per program (registers)
    return Tile(block_n, block_r, num_warps, *(min(_next_pow2(w), block_r) for w in parts))


# When the writers first ask the L2 for their source rows (``_prefetch_l2``, before the PDL wait):
# "pdl" for launches with programmatic dependent launch, where the reads then start while the
# previous kernel is still finishing; "always"; or "never". benchmarks/tune_gpu.py sweeps it.
PREFETCH = "pdl"


def _prefetching(pdl: bool) -> bool:
    """Whether a launch (with programmatic dependent launch or not) prefetches, by PREFETCH."""
    return PREFETCH == "always" or (PREFETCH == "pdl" and pdl)


def _prefetch_counts(pdl: bool, element_size: int, blocks_and_widths) -> dict:
    """``{"PF_SECTOR": elements per 32-byte sector, "PF_*": sectors per tile row}`` for the given
    ``(name, block, width, unit_stride)`` parts, zero (no prefetch) where ``PREFETCH`` says no,
    for an empty part or a strided one."""
    on = _prefetching(pdl)
    sector = max(1, 32 // element_size)
    meta = {"PF_SECTOR": sector}
    for name, block, width, unit in blocks_and_widths:
        meta[name] = max(1, block // sector) if on and unit and width > 0 else 0
    return meta


def _launch(kernel, grid, device: torch.device, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)`` on ``device``: on a GPU through the cached compiled kernel
    (:mod:`._launch`), which costs about half the JIT's host time per call. A true ``PDL``
    constexpr also asks for programmatic dependent launch (sm_90+); the interpreter has no
    launches to overlap, so there it is turned off, and so are the L2 prefetches (``PF_*``: inline
    PTX, which it cannot run). The launch is noted for the call's plan (:mod:`._plans`)."""
    if interpreting():  # CPU tensors, or CUDA tensors the interpreter copies to the host
        if meta.get("PDL"):
            meta["PDL"] = False
        for name in meta:
            if name.startswith("PF_") and name != "PF_SECTOR":
                meta[name] = 0
        kernel[grid](*args, **meta)
        _plans.note("launch", kernel, grid, args, meta, None)
        return
    if meta.get("PDL"):
        meta["launch_pdl"] = True
    global _launcher
    if _launcher is None:
        _import_launcher()
    index = device.index
    if index != torch._C._cuda_getDevice():  # the current device, without torch.cuda's lazy-init checks
        _plans.spoil()  # a replay launches on the current device: plan only calls made there
        with torch.cuda.device(index):
            _launcher(kernel).launch(grid, index, args, meta)
        return
    entry = _launcher(kernel).launch(grid, index, args, meta)
    if entry is None:
        _plans.spoil()
    else:
        _plans.note("launch", kernel, grid, args, meta, entry)


_launcher = None  # ._launch.launcher, imported (with triton) on the first GPU launch
_hooks_installed = None  # ._launch.hooks_installed, likewise


def _import_launcher() -> None:
    global _launcher, _hooks_installed
    from ._launch import hooks_installed, launcher

    _launcher, _hooks_installed = launcher, hooks_installed


# KV_ORACLE_TRITON_PLANS=0 turns the launch plans off (every call runs the wrapper in full)
PLANS = os.environ.get("KV_ORACLE_TRITON_PLANS", "1").strip().lower() not in ("0", "false", "off", "no")


_settings_planned = None  # (PREFETCH, a copy of TUNING) the current plans were made under


def _plans_enabled() -> bool:
    """Whether writer calls may be replayed from their plans (:mod:`._plans`): not with
    ``PLANS`` off, nor while a Triton launch hook is installed. A change of ``PREFETCH`` or
    ``TUNING`` (tuning scripts and tests set them) forgets every plan first."""
    global _settings_planned
    if not PLANS or (_hooks_installed is not None and _hooks_installed()):
        return False
    seen = _settings_planned
    if seen is None or seen[0] is not PREFETCH or seen[1] != TUNING:
        _plans.clear()
        _settings_planned = (PREFETCH, copy.deepcopy(TUNING))
    return True


def _paged_rows(src, cache5, index, n, block_size, num_slots, padding: Padding, fp8: int = 0,
                scale=None, device=None, second=None, pdl: bool = False, check: _validate.Check | None = None):
    """Launch ``paged_write`` for rows ``src`` ``[N, H, D]`` into a cache addressed by
    ``cache5 = (tensor, block_stride, token_stride, head_stride, dim_stride)``; ``second``, a
    ``(src, cache, scale)`` with the same shapes and strides, rides along as side 1 of the same
    launch. ``check``: the call's device slot check (:func:`_begin_check`; none by default)."""
    (_, heads, dim), (s0, s1, s2) = _rows3("source", src)
    cache, block_stride, token_stride, c_h, c_d = cache5
    if n == 0 or heads * dim == 0:
        return
    check = check or _validate.unchecked(cache)
    pdl = pdl or check.pdl
    flat = (heads == 1 or (s1 == dim * s2 and c_h == dim * c_d)) and (scale is None or scale.numel() == 1)
    t = tile(n, heads * dim, "paged_write_fp8" if fp8 else "paged_write")
    scale_t = scale if scale is not None else cache
    scale_stride = 0 if scale is None or scale.numel() == 1 else scale.stride(0)
    index_t = index if index is not None else cache
    src2, cache2, scale2 = second if second is not None else (src, cache, scale_t)
    grid = (_cdiv(n, t.block_n), _cdiv(heads * dim, t.block_r), 1 if second is None else 2)
    _launch(kernels().paged_write, grid, device,
            src, s0, s1, s2, cache, block_stride, token_stride, c_h, c_d,
            index_t, index.stride(0) if index is not None else 0, scale_t, scale_stride,
            n, heads, dim, block_size, num_slots,
            padding.reserved if padding.reserved is not None else 0,
            src2, cache2, scale2 if scale2 is not None else scale_t, *check.args,
            HAS_INDEX=index is not None, HAS_PAD_SLOT=padding.reserved is not None, FP8=fp8, FLAT=flat,
            BLOCK_N=t.block_n, BLOCK_R=t.block_r, PDL=pdl, num_warps=t.num_warps, **check.meta,
            **_prefetch_counts(pdl, src.element_size(), (("PF_R", t.block_r, heads * dim, flat and s2 == 1),)))


def _same_layout(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.stride() == b.stride()


# --- the ops -------------------------------------------------------------------------------

@_plans.planned(_plans_enabled)
def store_cache(k, v, k_cache, v_cache, loc, *, padding="none", validate=True, pdl=False):
    """``k_cache[loc] = k; v_cache[loc] = v``, rows ``[H, D]`` copied bitwise (any dtype; fp8
    pools as uint8), every stride honoured. ``padding`` (default "none": every slot in range)."""
    pad = parse_padding(padding)
    _check_index("loc", loc)
    check_rows("k", k, "k_cache", k_cache, loc.shape[0])
    check_rows("v", v, "v_cache", v_cache, loc.shape[0])
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"v_cache has {v_cache.shape[0]} slots but k_cache has {k_cache.shape[0]}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() < 1 or t.dim() > 3:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [S, H, D] or [S, W]")
    device = _device(k, v, k_cache, v_cache, loc)
    num_slots = k_cache.shape[0]
    n = loc.shape[0]
    check = _begin_check("loc", loc, n, num_slots, pad, validate, device, k_cache, pdl)
    if _same_layout(k, v) and _same_layout(k_cache, v_cache):  # the usual case: one launch
        _, strides = _rows3("cache", k_cache)
        _paged_rows(_as_bits(k), (_as_bits(k_cache), strides[0], 0, strides[1], strides[2]), loc, n,
                    1, num_slots, pad, device=device, second=(_as_bits(v), _as_bits(v_cache), None), pdl=pdl,
                    check=check)
    else:
        for src, cache in ((k, k_cache), (v, v_cache)):
            _, strides = _rows3("cache", cache)
            _paged_rows(_as_bits(src), (_as_bits(cache), strides[0], 0, strides[1], strides[2]), loc, n,
                        1, num_slots, pad, device=device, pdl=pdl, check=check)
    _validate.finish(check)


@_plans.planned(_plans_enabled)
def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, *, padding="none", validate=True, pdl=False):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)``, bitwise; elements past nope + rope
    untouched. ``padding`` (default "none")."""
    pad = parse_padding(padding)
    _check_index("loc", loc)
    if kv_buffer.dim() != 2:
        raise ValueError(f"kv_buffer must be 2-D [S, W], got shape {tuple(kv_buffer.shape)}")
    for name, src in (("cache_k_nope", cache_k_nope), ("cache_k_rope", cache_k_rope)):
        if src.dtype != kv_buffer.dtype:
            raise TypeError(f"{name} has dtype {src.dtype} but kv_buffer has dtype {kv_buffer.dtype}")
        if src.dim() != 2 or src.shape[0] != loc.shape[0]:
            raise ValueError(f"{name} has shape {tuple(src.shape)}; expected [{loc.shape[0]}, width]")
    width = cache_k_nope.shape[1] + cache_k_rope.shape[1]
    if kv_buffer.shape[1] < width:
        raise ValueError(f"kv_buffer rows have {kv_buffer.shape[1]} elements, fewer than nope + rope = {width}")
    device = _device(kv_buffer, loc, cache_k_nope, cache_k_rope)
    n = loc.shape[0]
    check = _begin_check("loc", loc, n, kv_buffer.shape[0], pad, validate, device, kv_buffer, pdl)
    if n == 0 or width == 0:
        return
    _mla_rows(_as_bits(cache_k_nope), _as_bits(cache_k_rope),
              (_as_bits(kv_buffer), kv_buffer.stride(0), 0, kv_buffer.stride(1)), loc, n, 1,
              kv_buffer.shape[0], pad, 0, None, device, pdl, check=check)
    _validate.finish(check)


def _mla_rows(a, b, cache4, index, n, block_size, num_slots, pad: Padding, fp8, scale, device, pdl=False,
              tiles="mla_write", check: _validate.Check | None = None):
    cache, block_stride, token_stride, elem_stride = cache4
    check = check or _validate.unchecked(cache)
    pdl = pdl or check.pdl
    width_a, width_b = a.shape[1], b.shape[1]
    t = tile(n, max(width_a, width_b), tiles, (width_a, width_b), device, pdl and _prefetching(pdl))
    grid = (_cdiv(n, t.block_n), max(_cdiv(width_a, t.block_a), _cdiv(width_b, t.block_b)))
    a0, a1 = a.stride()
    b0, b1 = b.stride()
    _launch(kernels().mla_write, grid, device,
            a, a0, a1, b, b0, b1,
            cache, block_stride, token_stride, elem_stride,
            index, index.stride(0), scale if scale is not None else cache,
            n, width_a, width_b, block_size, num_slots,
            pad.reserved if pad.reserved is not None else 0, *check.args,
            HAS_PAD_SLOT=pad.reserved is not None, FP8=fp8, BLOCK_N=t.block_n, BLOCK_A=t.block_a,
            BLOCK_B=t.block_b, PDL=pdl, num_warps=t.num_warps, **check.meta,
            **_prefetch_counts(pdl, a.element_size(), (("PF_A", t.block_a, width_a, a1 == 1),
                                                       ("PF_B", t.block_b, width_b, b1 == 1))))


@_plans.planned(_plans_enabled)
def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *,
                         padding="negative", allow_interpreter_fp8=False, validate=True, pdl=False):
    """Entry ``slot`` (block ``slot // block_size``, token ``slot % block_size``) of ``kv_cache``
    gets ``cat(kv_c[i], k_pe[i])``, bitwise under "auto", else as fp8 codes of ``x / scale``
    (IEEE division in float32, then Triton's conversion). ``padding`` (default "negative":
    slots < 0 skipped, as in vLLM)."""
    pad = parse_padding(padding)
    fmt = check_concat_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, KV_CACHE_DTYPES)
    num_blocks, block_size, width = kv_cache.shape
    num_slots = num_blocks * block_size
    num_tokens = slot_mapping.shape[0]
    tensors = (kv_c, k_pe, kv_cache, slot_mapping) + ((scale,) if fmt else ())
    device = _device(*tensors)
    if fmt and validate == "sync" and not _capturing(scale):  # reads the scale: synchronizes
        if not (torch.isfinite(scale).all() and (scale > 0).all()):
            raise ValueError(f"scale must be finite and > 0, got {float(scale.reshape(()))}")
    code = _kernel_format(fmt, allow_interpreter_fp8) if fmt else 0
    if num_tokens == 0 or width == 0:
        return
    check = _begin_check("slot_mapping", slot_mapping, num_tokens, num_slots, pad, validate, device, kv_cache, pdl)
    s0, s1, s2 = kv_cache.stride()
    if code:
        _mla_rows(kv_c, k_pe, (kv_cache, s0, s1, s2), slot_mapping, num_tokens, block_size,
                  num_slots, pad, code, scale, device, pdl, tiles="concat_mla", check=check)
    else:
        _mla_rows(_as_bits(kv_c), _as_bits(k_pe), (_as_bits(kv_cache), s0, s1, s2), slot_mapping,
                  num_tokens, block_size, num_slots, pad, 0, None, device, pdl, tiles="concat_mla", check=check)
    _validate.finish(check)


@_plans.planned(_plans_enabled)
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale, *, padding="negative", allow_interpreter_fp8=False,
                            validate=True, pdl=False):
    """Token ``i`` goes to block ``slot // block_size``, token ``slot % block_size`` of the
    ``[num_blocks, block_size, H, D]`` caches (any strides: NHD, HND views, padded blocks; last
    dim contiguous, as the op requires), bitwise under "auto", else as fp8 codes of ``x / scale``
    (scale [1] or [H]). ``padding`` (default "negative": slots < 0 skipped, as in vLLM)."""
    pad = parse_padding(padding)
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of {sorted(KV_CACHE_DTYPES)}")
    fmt = check_paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale)
    num_blocks, block_size, heads, _ = key_cache.shape
    num_tokens = slot_mapping.shape[0]
    tensors = (key, value, key_cache, value_cache, slot_mapping)
    device = _device(*(tensors + ((k_scale, v_scale) if fmt else ())))
    num_slots = num_blocks * block_size
    code = _kernel_format(fmt, allow_interpreter_fp8) if fmt else 0
    check = _begin_check("slot_mapping", slot_mapping, num_tokens, num_slots, pad, validate, device, key_cache, pdl)
    c0, c1, c2, c3 = key_cache.stride()
    if _same_layout(key, value) and _same_layout(key_cache, value_cache) and \
            (not code or _same_layout(k_scale, v_scale)):  # the usual case: one launch
        if code:
            _paged_rows(key, (key_cache, c0, c1, c2, c3), slot_mapping, num_tokens, block_size,
                        num_slots, pad, code, k_scale, device, second=(value, value_cache, v_scale), pdl=pdl,
                        check=check)
        else:
            _paged_rows(_as_bits(key), (_as_bits(key_cache), c0, c1, c2, c3), slot_mapping, num_tokens,
                        block_size, num_slots, pad, device=device,
                        second=(_as_bits(value), _as_bits(value_cache), None), pdl=pdl, check=check)
    else:
        for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
            c0, c1, c2, c3 = cache.stride()
            if code:
                _paged_rows(src, (cache, c0, c1, c2, c3), slot_mapping, num_tokens, block_size,
                            num_slots, pad, code, scale, device, pdl=pdl, check=check)
            else:
                _paged_rows(_as_bits(src), (_as_bits(cache), c0, c1, c2, c3), slot_mapping, num_tokens,
                            block_size, num_slots, pad, device=device, pdl=pdl, check=check)
    _validate.finish(check)


def quantize_fp8(out, x, scale, fmt, *, allow_interpreter_fp8=False):
    """``out = fp8(x / scale)`` as uint8 codes; x ``[N, H, D]`` (any strides), scale [1] or [H];
    the quotient by IEEE division in float32, then Triton's conversion."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {sorted(FP8_FORMATS)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if out.dtype != torch.uint8:
        raise TypeError(f"out has dtype {out.dtype}; expected torch.uint8 (fp8 codes)")
    if x.dim() != 3 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} and x {tuple(x.shape)}; expected one [N, H, D] shape")
    check_scale("scale", scale, x.shape[1])
    device = _device(out, x, scale)
    code = _kernel_format(fmt, allow_interpreter_fp8)
    n = x.shape[0]
    o0, o1, o2 = out.stride()
    _paged_rows(x, (out, o0, 0, o1, o2), None, n, 1, n, parse_padding("none"), code, scale, device)


def translate_full_to_swa(mapping, loc, *, validate=True):
    """``mapping[loc]`` as a new tensor (the mapping's dtype, loc's shape), after checking that
    only -1 is negative and nothing reaches past the table; -1 translates to -1 in the kernel
    (the sentinel's value, checked here), never by reading before the table."""
    check_translate(mapping, loc)
    device = _device(mapping, loc)
    table = mapping.numel() - 1
    if _reads_device(validate, mapping):
        check_translate_values(mapping, loc)
    out = torch.empty(loc.shape, dtype=mapping.dtype, device=device)
    numel = loc.numel()
    if numel == 0:
        return out
    flat = loc if loc.dim() <= 4 else loc.reshape(-1)
    sizes = (1,) * (4 - flat.dim()) + tuple(flat.shape)
    strides = (0,) * (4 - flat.dim()) + tuple(flat.stride())
    block = min(_next_pow2(numel), 1 << 16) if interpreting() else 1024
    _launch(kernels().translate, (_cdiv(numel, block),), device,
            mapping, mapping.stride(0), table, flat, *strides, sizes[1], sizes[2], sizes[3],
            out, numel, BLOCK=block)
    return out
