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
An fp8 call's scales are checked on the device the same way (finite and > 0, or nothing is
written and the error is deferred). The writers launch with programmatic dependent launch wherever the GPU
has it (sm_90+; keyword ``pdl``: None, the default, decides by the device, False launches
plainly): the kernel may start while the previous one on the stream finishes and waits for it
(``griddepcontrol.wait``) before any load or store, so launch latency and L2 prefetches (hints)
overlap. A check grid lets the writer launch at once, before its own wait, so the writer's
launch and prefetches overlap the kernels before the check too. Metadata (dtypes, shapes, strides, devices)
is always checked, and the kernels never write a slot outside the cache whatever the index holds:
an out-of-range slot is skipped, not written.

The host work of a call depends only on its signature, so the writers replay it from a launch
plan after the first call of each signature (:mod:`._plans`; ``KV_ORACLE_TRITON_PLANS=0`` turns
that off). Each writer takes an :class:`oracle.kernels.CheckedIndex` wherever it takes an index
(checked once for many writes: :mod:`oracle.kernels.checked_index`); it then reads the checked copy
and its verdict word instead of checking the index itself. Argument checks live in :mod:`._host`, tiles and prefetch defaults in :mod:`.tiles`,
launching in :mod:`._runtime`.
"""

from __future__ import annotations

import torch

from .. import _deferred
from .._compile import eager_under_compile
from ..check_reuse import reusing
from .._checks import (FLOAT_DTYPES, FP8_FORMATS, KV_CACHE_DTYPES, check_concat_mla, check_paged_write,
                       check_rows, check_scale, check_translate, check_translate_values, mla_rows, mla_sources)
from . import _host, _plans, _runtime, _validate, tiles
from ._host import Padding, parse_padding  # noqa: F401  (part of this module's interface)
from ._runtime import INTERPRETER_FP8, KERNEL_FP8, interpreting, kernels  # noqa: F401
from .tiles import tile  # noqa: F401
from .block_ops import quantize_block, reshape_and_cache_block  # noqa: F401  (the block-scaled writers)


def _paged_rows(src, cache5, index, n, block_size, num_slots, padding: _host.Padding, fp8: int = 0,
                scale=None, device=None, second=None, pdl: bool = False, check: _validate.Check | None = None,
                scale_codes: tuple = (0, 0), other_scale=None):
    """Launch ``paged_write`` for rows ``src`` ``[N, H, D]`` into a cache addressed by
    ``cache5 = (tensor, block_stride, token_stride, head_stride, dim_stride)``; ``second``, a
    ``(src, cache, scale)`` with the same shapes and strides, rides along as side 1 of the same
    launch. ``check``: the call's device slot check (:func:`_host.begin_check`; none by default).
    Where ``check`` reports to the mailbox, an fp8 launch also checks its scale and the other
    side's (``second``'s, or ``other_scale`` for a launch of one side of a K/V call), whose
    argument codes (``_deferred.SCALE_ARGUMENTS``) are ``scale_codes``."""
    (_, heads, dim), (s0, s1, s2) = _host.rows3("source", src)
    cache, block_stride, token_stride, c_h, c_d = cache5
    if n == 0 or heads * dim == 0:
        return
    check = check or _validate.unchecked(cache)
    pdl = pdl or check.pdl
    flat = (heads == 1 or (s1 == dim * s2 and c_h == dim * c_d)) and (scale is None or scale.numel() == 1)
    t = tiles.tile(n, heads * dim, "paged_write_fp8" if fp8 else "paged_write")
    index_t = index if index is not None else cache
    src2, cache2, scale2 = second if second is not None else (src, cache, other_scale)
    scale_t, scale_stride, scale_count = _scale_args(scale, cache)
    scale2_t, scale2_stride, scale2_count = _scale_args(scale2, scale_t) if scale2 is not None else \
        (scale_t, scale_stride, scale_count)
    scale_check = tiles.next_pow2(max(scale_count, scale2_count)) if fp8 and check.reports else 0
    grid = (tiles.cdiv(n, t.block_n), tiles.cdiv(heads * dim, t.block_r), 1 if second is None else 2)
    _runtime.launch(_runtime.kernels().paged_write, grid, device,
                    src, s0, s1, s2, cache, block_stride, token_stride, c_h, c_d,
                    index_t, index.stride(0) if index is not None else 0, scale_t, scale_stride, scale_count,
                    n, heads, dim, block_size, num_slots,
                    padding.reserved if padding.reserved is not None else 0,
                    src2, cache2, scale2_t, scale2_stride, scale2_count, *scale_codes, *check.args,
                    HAS_INDEX=index is not None, HAS_PAD_SLOT=padding.reserved is not None, FP8=fp8, FLAT=flat,
                    BLOCK_N=t.block_n, BLOCK_R=t.block_r, PDL=pdl, num_warps=t.num_warps, SCALE_CHECK=scale_check,
                    **check.meta,
                    **tiles.prefetch_counts(pdl, src.element_size(), (("PF_R", t.block_r, heads * dim, flat and s2 == 1),)))


def _scale_args(scale, placeholder) -> tuple:
    """(pointer, stride, count) of a scale [1] or [H] for the kernels; ``placeholder`` (count 1)
    where there is none."""
    if scale is None:
        return placeholder, 0, 1
    return scale, 0 if scale.numel() == 1 else scale.stride(0), scale.numel()


# --- the ops -------------------------------------------------------------------------------

@eager_under_compile
@reusing("store_cache")
@_plans.planned(_host.plans_enabled)
def store_cache(k, v, k_cache, v_cache, loc, *, padding="none", validate=True, pdl=None):
    """``k_cache[loc] = k; v_cache[loc] = v``, rows ``[H, D]`` copied bitwise (any dtype; fp8
    pools as uint8), every stride honoured. ``padding`` (default "none": every slot in range)."""
    pad = _host.parse_padding(padding)
    loc, checked = _host.index_arg(loc)
    _host.check_index("loc", loc)
    check_rows("k", k, "k_cache", k_cache, loc.shape[0])
    check_rows("v", v, "v_cache", v_cache, loc.shape[0])
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"v_cache has {v_cache.shape[0]} slots but k_cache has {k_cache.shape[0]}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if t.dim() < 1 or t.dim() > 3:
            raise ValueError(f"{name} has shape {tuple(t.shape)}; expected [S, H, D] or [S, W]")
    device = _host.device_of(k, v, k_cache, v_cache, loc)
    num_slots = k_cache.shape[0]
    n = loc.shape[0]
    pdl = _host.launch_pdl(pdl, device)
    check = _host.begin_check("loc", loc, n, num_slots, pad, validate, device, k_cache, pdl, checked)
    if _host.one_launch(((k, v),), ((k_cache, v_cache),)):  # the usual case
        _, strides = _host.rows3("cache", k_cache)
        _paged_rows(_host.as_bits(k), (_host.as_bits(k_cache), strides[0], 0, strides[1], strides[2]), loc, n,
                    1, num_slots, pad, device=device, second=(_host.as_bits(v), _host.as_bits(v_cache), None), pdl=pdl,
                    check=check)
    else:
        for src, cache in ((k, k_cache), (v, v_cache)):
            _, strides = _host.rows3("cache", cache)
            _paged_rows(_host.as_bits(src), (_host.as_bits(cache), strides[0], 0, strides[1], strides[2]), loc, n,
                        1, num_slots, pad, device=device, pdl=pdl, check=check)
    _validate.finish(check)


@eager_under_compile
@reusing("set_mla_kv_buffer")
@_plans.planned(_host.plans_enabled)
def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, *, padding="none", validate=True, pdl=None):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)``, bitwise; elements past nope + rope
    untouched. ``padding`` (default "none")."""
    pad = _host.parse_padding(padding)
    loc, checked = _host.index_arg(loc)
    _host.check_index("loc", loc)
    if kv_buffer.dim() != 2:  # an [S, 1, W] buffer as its [:, 0] view
        kv_buffer = mla_rows("kv_buffer", kv_buffer, None, "[S, W] or [S, 1, W]")
    for name, src in (("cache_k_nope", cache_k_nope), ("cache_k_rope", cache_k_rope)):
        if src.dtype != kv_buffer.dtype:
            raise TypeError(f"{name} has dtype {src.dtype} but kv_buffer has dtype {kv_buffer.dtype}")
    n = loc.shape[0]
    cache_k_nope, cache_k_rope = mla_sources(cache_k_nope, cache_k_rope, n)
    width = cache_k_nope.shape[1] + cache_k_rope.shape[1]
    if kv_buffer.shape[1] < width:
        raise ValueError(f"kv_buffer rows have {kv_buffer.shape[1]} elements, fewer than nope + rope = {width}")
    device = _host.device_of(kv_buffer, loc, cache_k_nope, cache_k_rope)
    pdl = _host.launch_pdl(pdl, device)
    check = _host.begin_check("loc", loc, n, kv_buffer.shape[0], pad, validate, device, kv_buffer, pdl, checked)
    if n == 0 or width == 0:
        return
    _mla_rows(_host.as_bits(cache_k_nope), _host.as_bits(cache_k_rope),
              (_host.as_bits(kv_buffer), kv_buffer.stride(0), 0, kv_buffer.stride(1)), loc, n, 1,
              kv_buffer.shape[0], pad, 0, None, device, pdl, check=check)
    _validate.finish(check)


def _mla_rows(a, b, cache4, index, n, block_size, num_slots, pad: _host.Padding, fp8, scale, device, pdl=False,
              table="mla_write", check: _validate.Check | None = None, scale_code: int = 0):
    """Launch ``mla_write``: rows ``a | b`` into ``cache4 = (tensor, block stride, token stride,
    element stride)``; an fp8 launch whose ``check`` reports to the mailbox also checks ``scale``
    (argument code ``scale_code``)."""
    cache, block_stride, token_stride, elem_stride = cache4
    check = check or _validate.unchecked(cache)
    pdl = pdl or check.pdl
    width_a, width_b = a.shape[1], b.shape[1]
    t = tiles.tile(n, max(width_a, width_b), table, (width_a, width_b), device, pdl and tiles.prefetching(pdl))
    grid = (tiles.cdiv(n, t.block_n), max(tiles.cdiv(width_a, t.block_a), tiles.cdiv(width_b, t.block_b)))
    a0, a1 = a.stride()
    b0, b1 = b.stride()
    _runtime.launch(_runtime.kernels().mla_write, grid, device,
                    a, a0, a1, b, b0, b1,
                    cache, block_stride, token_stride, elem_stride,
                    index, index.stride(0), scale if scale is not None else cache,
                    n, width_a, width_b, block_size, num_slots,
                    pad.reserved if pad.reserved is not None else 0, *check.args, scale_code,
                    HAS_PAD_SLOT=pad.reserved is not None, FP8=fp8, BLOCK_N=t.block_n, BLOCK_A=t.block_a,
                    BLOCK_B=t.block_b, PDL=pdl, num_warps=t.num_warps, SCALE_CHECK=1 if fp8 and check.reports else 0,
                    **check.meta,
                    **tiles.prefetch_counts(pdl, a.element_size(), (("PF_A", t.block_a, width_a, a1 == 1),
                                                               ("PF_B", t.block_b, width_b, b1 == 1))))


@eager_under_compile
@reusing("concat_and_cache_mla")
@_plans.planned(_host.plans_enabled)
def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, *,
                         padding="negative", allow_interpreter_fp8=False, validate=True, pdl=None):
    """Entry ``slot`` (block ``slot // block_size``, token ``slot % block_size``) of ``kv_cache``
    gets ``cat(kv_c[i], k_pe[i])``, bitwise under "auto", else as fp8 codes of ``x / scale``
    (IEEE division in float32, then Triton's conversion). ``padding`` (default "negative":
    slots < 0 skipped, as in vLLM)."""
    pad = _host.parse_padding(padding)
    slot_mapping, checked = _host.index_arg(slot_mapping)
    fmt = check_concat_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale, KV_CACHE_DTYPES)
    num_blocks, block_size, width = kv_cache.shape
    num_slots = num_blocks * block_size
    num_tokens = slot_mapping.shape[0]
    tensors = (kv_c, k_pe, kv_cache, slot_mapping) + ((scale,) if fmt else ())
    device = _host.device_of(*tensors)
    code = _host.kernel_format(fmt, allow_interpreter_fp8) if fmt else 0
    if num_tokens == 0 or width == 0:  # nothing launched to check the scale
        if fmt:
            _validate.empty_call_scales(validate, (("scale", scale),), _host.capturing(kv_cache))
        return
    pdl = _host.launch_pdl(pdl, device)
    check = _host.begin_check("slot_mapping", slot_mapping, num_tokens, num_slots, pad, validate, device, kv_cache, pdl,
                              checked)
    s0, s1, s2 = kv_cache.stride()
    if code:
        _mla_rows(kv_c, k_pe, (kv_cache, s0, s1, s2), slot_mapping, num_tokens, block_size,
                  num_slots, pad, code, scale, device, pdl, table="concat_mla", check=check,
                  scale_code=_deferred.SCALE_ARGUMENTS.index("scale"))
    else:
        _mla_rows(_host.as_bits(kv_c), _host.as_bits(k_pe), (_host.as_bits(kv_cache), s0, s1, s2), slot_mapping,
                  num_tokens, block_size, num_slots, pad, 0, None, device, pdl, table="concat_mla", check=check)
    _validate.finish(check)


@eager_under_compile
@reusing("reshape_and_cache_flash")
@_plans.planned(_host.plans_enabled)
def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale, *, padding="negative", allow_interpreter_fp8=False,
                            validate=True, pdl=None):
    """Token ``i`` goes to block ``slot // block_size``, token ``slot % block_size`` of the
    ``[num_blocks, block_size, H, D]`` caches (any strides: NHD, HND views, padded blocks; last
    dim contiguous, as the op requires), bitwise under "auto", else as fp8 codes of ``x / scale``
    (scale [1] or [H]). ``padding`` (default "negative": slots < 0 skipped, as in vLLM)."""
    pad = _host.parse_padding(padding)
    slot_mapping, checked = _host.index_arg(slot_mapping)
    if not isinstance(kv_cache_dtype, str) or kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of {sorted(KV_CACHE_DTYPES)}")
    fmt = check_paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale)
    num_blocks, block_size, heads, _ = key_cache.shape
    num_tokens = slot_mapping.shape[0]
    tensors = (key, value, key_cache, value_cache, slot_mapping)
    device = _host.device_of(*(tensors + ((k_scale, v_scale) if fmt else ())))
    num_slots = num_blocks * block_size
    code = _host.kernel_format(fmt, allow_interpreter_fp8) if fmt else 0
    pdl = _host.launch_pdl(pdl, device)
    check = _host.begin_check("slot_mapping", slot_mapping, num_tokens, num_slots, pad, validate, device, key_cache, pdl,
                              checked)
    if code and num_tokens * heads * key_cache.shape[3] == 0:  # nothing launched to check the scales
        _validate.empty_call_scales(validate, (("k_scale", k_scale), ("v_scale", v_scale)),
                                    _host.capturing(key_cache))
    c0, c1, c2, c3 = key_cache.stride()
    scale_codes = tuple(_deferred.SCALE_ARGUMENTS.index(name) for name in ("k_scale", "v_scale"))
    if _host.one_launch(((key, value),) + (((k_scale, v_scale),) if code else ()),
                        ((key_cache, value_cache),)):  # the usual case
        if code:
            _paged_rows(key, (key_cache, c0, c1, c2, c3), slot_mapping, num_tokens, block_size,
                        num_slots, pad, code, k_scale, device, second=(value, value_cache, v_scale), pdl=pdl,
                        check=check, scale_codes=scale_codes)
        else:
            _paged_rows(_host.as_bits(key), (_host.as_bits(key_cache), c0, c1, c2, c3), slot_mapping, num_tokens,
                        block_size, num_slots, pad, device=device,
                        second=(_host.as_bits(value), _host.as_bits(value_cache), None), pdl=pdl, check=check)
    else:
        for src, cache, scale, other, codes in ((key, key_cache, k_scale, v_scale, scale_codes),
                                                (value, value_cache, v_scale, k_scale, scale_codes[::-1])):
            c0, c1, c2, c3 = cache.stride()
            if code:  # each launch checks both scales: neither side is written if one is bad
                _paged_rows(src, (cache, c0, c1, c2, c3), slot_mapping, num_tokens, block_size,
                            num_slots, pad, code, scale, device, pdl=pdl, check=check, scale_codes=codes,
                            other_scale=other)
            else:
                _paged_rows(_host.as_bits(src), (_host.as_bits(cache), c0, c1, c2, c3), slot_mapping, num_tokens,
                            block_size, num_slots, pad, device=device, pdl=pdl, check=check)
    _validate.finish(check)


@eager_under_compile
def quantize_fp8(out, x, scale, fmt, *, allow_interpreter_fp8=False, validate=True):
    """``out = fp8(x / scale)`` as uint8 codes; x ``[N, H, D]`` (any strides), scale [1] or [H];
    the quotient by IEEE division in float32, then Triton's conversion. ``validate`` (True,
    "sync" or False) as the writers': a scale that is not finite and > 0 is found on the device,
    nothing is written, and the error is deferred (:mod:`oracle.kernels._deferred`)."""
    if fmt not in FP8_FORMATS:
        raise ValueError(f"fmt={fmt!r} is not one of {sorted(FP8_FORMATS)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if out.dtype != torch.uint8:
        raise TypeError(f"out has dtype {out.dtype}; expected torch.uint8 (fp8 codes)")
    if x.dim() != 3 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} and x {tuple(x.shape)}; expected one [N, H, D] shape")
    check_scale("scale", scale, x.shape[1])
    device = _host.device_of(out, x, scale)
    code = _host.kernel_format(fmt, allow_interpreter_fp8)
    n, heads, dim = x.shape
    if n * heads * dim == 0:  # nothing launched to check the scale
        _validate.empty_call_scales(validate, (("scale", scale),), _host.capturing(x))
        return
    check = _validate.scale_check(out, validate, device, _runtime.interpreting(), _host.capturing(x))
    o0, o1, o2 = out.stride()
    code_of_scale = _deferred.SCALE_ARGUMENTS.index("scale")
    _paged_rows(x, (out, o0, 0, o1, o2), None, n, 1, n, _host.parse_padding("none"), code, scale, device,
                check=check, scale_codes=(code_of_scale, code_of_scale))
    _validate.finish(check)


@eager_under_compile
def translate_full_to_swa(mapping, loc, *, validate=True):
    """``mapping[loc]`` as a new tensor (the mapping's dtype, loc's shape), after checking that
    only -1 is negative and nothing reaches past the table; -1 translates to -1 in the kernel
    (the sentinel's value, checked here), never by reading before the table."""
    check_translate(mapping, loc)
    device = _host.device_of(mapping, loc)
    table = mapping.numel() - 1
    if _host.reads_device(validate, mapping):
        check_translate_values(mapping, loc)
    out = torch.empty(loc.shape, dtype=mapping.dtype, device=device)
    numel = loc.numel()
    if numel == 0:
        return out
    flat = loc if loc.dim() <= 4 else loc.reshape(-1)
    sizes = (1,) * (4 - flat.dim()) + tuple(flat.shape)
    strides = (0,) * (4 - flat.dim()) + tuple(flat.stride())
    block = min(tiles.next_pow2(numel), 1 << 16) if _runtime.interpreting() else 1024
    _runtime.launch(_runtime.kernels().translate, (tiles.cdiv(numel, block),), device,
                    mapping, mapping.stride(0), table, flat, *strides, sizes[1], sizes[2], sizes[3],
                    out, numel, BLOCK=block)
    return out
