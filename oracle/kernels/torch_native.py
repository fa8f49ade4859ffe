"""The torch baseline backend: every op in plain torch (index_put_, torch's own fp8 casts).

It is what a serving engine falls back to when no fused kernel applies, and the baseline every
benchmark compares against. Registered through the public plug-in API (entry point
``oracle.kernels: torch``), with an honest contract.
"""

from __future__ import annotations

import functools

import torch

import oracle

from . import torch_block
from ._nan_signs import with_signs_of
from ._checks import (FLOAT_DTYPES, INDEX_DTYPES, check_concat_mla, check_paged_write, check_rows, check_scale,
                      check_scale_values, check_translate, check_translate_values, mla_rows, mla_sources)



def _check_index(name: str, index: torch.Tensor, num_slots: int) -> None:
    """torch.index_put_ bounds-checks while it writes; checking first keeps a rejected call from
    leaving a partial write behind."""
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} has dtype {index.dtype}; expected torch.int32 or torch.int64")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")
    if index.numel():
        low, high = int(index.min()), int(index.max())
        if low < 0 or high >= num_slots:
            bad = low if low < 0 else high
            raise ValueError(f"{name} holds slot {bad}, out of range [0, {num_slots})")




def store_cache(k, v, k_cache, v_cache, loc):
    """``k_cache[loc] = k; v_cache[loc] = v`` (sglang's naive fallback)."""
    _check_index("loc", loc, k_cache.shape[0])
    check_rows("k", k, "k_cache", k_cache, loc.shape[0])
    check_rows("v", v, "v_cache", v_cache, loc.shape[0])
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"v_cache has {v_cache.shape[0]} slots but k_cache has {k_cache.shape[0]}")
    index = loc.long()
    k_cache.index_put_((index,), k)
    v_cache.index_put_((index,), v)


def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)`` (sglang's naive MLA writer)."""
    set_mla_kv_buffer_dcp(kv_buffer, loc, cache_k_nope, cache_k_rope)


DCP_MODULI = ("truncate", "floor")


def set_mla_kv_buffer_dcp(kv_buffer, loc, cache_k_nope, cache_k_rope, *, dcp_world=1, dcp_rank=0,
                          dcp_modulo="truncate"):
    """:func:`set_mla_kv_buffer` on rank ``dcp_rank`` of ``dcp_world`` (decode-context
    parallelism): ``loc`` holds widened locs; this rank keeps those with
    ``loc % dcp_world == dcp_rank`` and writes row ``loc // dcp_world``, where ``%`` and ``//``
    truncate (``"truncate"``, as Triton computes them: every negative loc but the multiples of
    the width goes to no rank) or floor (``"floor"``, torch's: ``-1`` goes to the last rank as
    row ``-1``). A kept loc whose row lies outside the buffer is rejected with ``ValueError``, as
    is any bad argument, before anything is written. Width 1 is :func:`set_mla_kv_buffer`.
    (A separate function, so the baseline's own signature stays the four tensors every backend
    implements.)"""
    for name, value in (("dcp_world", dcp_world), ("dcp_rank", dcp_rank)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{name}={value!r} must be an int")
    if dcp_world < 1 or not 0 <= dcp_rank < dcp_world:
        raise ValueError(f"dcp_world={dcp_world}, dcp_rank={dcp_rank}: need 0 <= dcp_rank < dcp_world")
    if dcp_modulo not in DCP_MODULI:
        raise ValueError(f"dcp_modulo={dcp_modulo!r} is not one of {', '.join(DCP_MODULI)}")
    if dcp_world == 1:
        _check_index("loc", loc, kv_buffer.shape[0])
        keep, rows = None, loc.long()
    else:
        keep, rows = _dcp_rows(loc, kv_buffer.shape[0], dcp_world, dcp_rank, dcp_modulo)
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
    data = torch.cat([cache_k_nope, cache_k_rope], dim=1)
    if keep is not None:
        data, rows = data[keep], rows[keep]
    kv_buffer[:, :width].index_put_((rows,), data)


def _dcp_rows(loc: torch.Tensor, num_rows: int, world: int, rank: int, modulo: str):
    """(mask of the locs this rank keeps, every loc's row), after checking that each kept row
    lies in ``[0, num_rows)``."""
    if loc.dtype not in INDEX_DTYPES:
        raise TypeError(f"loc has dtype {loc.dtype}; expected torch.int32 or torch.int64")
    if loc.dim() != 1:
        raise ValueError(f"loc must be 1-D, got shape {tuple(loc.shape)}")
    locs = loc.long()
    if modulo == "floor":
        keep, rows = torch.remainder(locs, world) == rank, torch.div(locs, world, rounding_mode="floor")
    else:
        keep, rows = torch.fmod(locs, world) == rank, torch.div(locs, world, rounding_mode="trunc")
    bad = keep & ((rows < 0) | (rows >= num_rows))
    if bad.any():
        i = int(bad.nonzero()[0])
        raise ValueError(f"loc[{i}] = {int(locs[i])} is kept by rank {rank} of {world} ({modulo} "
                         f"modulo) but names row {int(rows[i])}, out of range [0, {num_rows})")
    return keep, rows


FP8_DTYPES = {"e4m3fn": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2,
              "e4m3fnuz": torch.float8_e4m3fnuz, "e5m2fnuz": torch.float8_e5m2fnuz}


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """Entry ``slot`` (block ``slot // block_size``, token ``slot % block_size``) of ``kv_cache``
    gets ``cat(kv_c[i], k_pe[i])``, as fp8 codes of ``x / scale`` (in float32, then torch's cast)
    when ``kv_cache_dtype`` names an fp8 format; negative slots are skipped, as in vLLM."""
    fmt = check_concat_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                           {name: name for name in FP8_DTYPES})
    num_blocks, block_size, _ = kv_cache.shape
    num_slots = num_blocks * block_size
    num_tokens = slot_mapping.shape[0]
    fp8 = FP8_DTYPES[fmt] if fmt else None
    if fp8 is not None:
        check_scale_values("scale", scale)
    if num_tokens and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping holds slot {int(slot_mapping.max())}, out of range [0, {num_slots})")
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    rows = torch.cat([kv_c[:num_tokens][keep], k_pe[:num_tokens][keep]], dim=1)
    if fp8 is not None:
        rows = _fp8_codes(rows, scale.reshape(()), fmt)
    kv_cache.index_put_((slots // block_size, slots % block_size), rows)


def translate_full_to_swa(mapping, loc):
    """``mapping[loc]``, after checking that only -1 is negative and nothing reaches past the
    table (the sentinel only through -1)."""
    check_translate(mapping, loc)
    check_translate_values(mapping, loc)
    return mapping[loc.long()]


def _fp8_codes(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """uint8 codes of ``x / scale`` (``scale`` > 0, broadcast against ``x``): the quotient in
    float32, then :func:`_quotient_codes`."""
    return _quotient_codes(x.float() / scale, x, fmt)


def _quotient_codes(quotient: torch.Tensor, x: torch.Tensor, fmt: str) -> torch.Tensor:
    """uint8 codes of a float32 ``quotient`` of ``x``: with ``x``'s sign on its NaNs
    (:mod:`._nan_signs`), then torch's own cast."""
    return with_signs_of(quotient, x).to(FP8_DTYPES[fmt]).view(torch.uint8)


def _to_fp8_codes(rows: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """uint8 codes of ``rows / scale`` (``[N, H, D]``; the scale broadcast over heads)."""
    return _fp8_codes(rows, scale.reshape(1, -1, 1), fmt)


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale):
    """Token ``i`` goes to block ``slot // block_size``, token ``slot % block_size`` of the
    ``[num_blocks, block_size, H, D]`` caches (any strides, HND views included; last dim
    contiguous), as fp8 codes of ``x / scale`` when ``kv_cache_dtype`` names an fp8 format.
    Negative slots are skipped, as in vLLM; everything is checked before anything is written."""
    fmt = check_paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                            k_scale, v_scale)
    if fmt is not None:
        check_scale_values("k_scale", k_scale)
        check_scale_values("v_scale", v_scale)
    num_blocks, block_size = key_cache.shape[:2]
    num_tokens = slot_mapping.shape[0]
    num_slots = num_blocks * block_size
    if num_tokens and int(slot_mapping.max()) >= num_slots:
        raise ValueError(f"slot_mapping holds slot {int(slot_mapping.max())}, out of range [0, {num_slots}) "
                         "(negative slots are padding)")
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    index = (slots // block_size, slots % block_size)
    for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        rows = src[:num_tokens][keep]
        cache.index_put_(index, rows if fmt is None else _to_fp8_codes(rows, scale, fmt))


def quantize_fp8(out, x, scale, fmt):
    """``out = fp8(x / scale)`` as uint8 codes; x ``[N, H, D]``, scale [1] or [H]."""
    if fmt not in FP8_DTYPES:
        raise ValueError(f"fmt={fmt!r} is not one of {sorted(FP8_DTYPES)}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if out.dtype != torch.uint8:
        raise TypeError(f"out has dtype {out.dtype}; expected torch.uint8 (fp8 codes)")
    if x.dim() != 3 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} and x {tuple(x.shape)}; expected one [N, H, D] shape")
    check_scale("scale", scale, x.shape[1])
    check_scale_values("scale", scale)
    out.copy_(_to_fp8_codes(x, scale, fmt))


def _torch_fp8_preset() -> str:
    """torch >= 2.12 saturates e4m3fn on CPU (preset torch_2_13); older torch does not."""
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return "torch_2_13" if (major, minor) >= (2, 12) else "torch_2_11"


def register() -> None:
    """The baselines on the CPU, and again on CUDA (names ``torch-cuda.*``) where a GPU is visible:
    the same functions, since index_put_ and the fp8 casts run on either device."""
    for device in ("cpu",) + (("cuda",) if torch.cuda.is_available() else ()):
        _register_on(device, "torch" if device == "cpu" else "torch-cuda")


def _register_dcp(device: str, prefix: str) -> None:
    """set_mla_kv_buffer as one rank of a DCP group, under each modulo convention sglang has."""
    common = dict(op="set_mla_kv_buffer", backend="torch", device=device, validates=True,
                  dtypes=("float32", "float16", "bfloat16", "uint8"))
    oracle.register(functools.partial(set_mla_kv_buffer_dcp, dcp_world=2, dcp_rank=1,
                                      dcp_modulo="truncate"),
                    name=f"{prefix}.set_mla_kv_buffer.dcp2", dcp_world=2, dcp_rank=1,
                    dcp_modulo="truncate", padding="reserved:0", **common,
                    notes="rank 1 of 2, % and // truncating as sglang's Triton DCP writer computes "
                          "them: keeps loc % 2 == 1 (so every negative loc is skipped) and writes row "
                          "loc // 2 by index_put_; loc 0, the reserved padding slot, belongs to rank 0 "
                          "and is never written here")
    oracle.register(functools.partial(set_mla_kv_buffer_dcp, dcp_world=4, dcp_rank=3,
                                      dcp_modulo="floor"),
                    name=f"{prefix}.set_mla_kv_buffer.dcp4_floor", dcp_world=4, dcp_rank=3,
                    dcp_modulo="floor", **common,
                    notes="rank 3 of 4, % and // flooring as sglang's naive DCP path computes them: "
                          "-1 is kept as row -1, which index_put_ would wrap to the last row, so a "
                          "kept loc outside the buffer is rejected and out of contract; index_put_ "
                          "skips nothing, so no padding policy is declared")


def _register_on(device: str, prefix: str) -> None:
    common = dict(backend="torch", device=device, validates=True,
                  notes="plain torch; -1 would wrap to the last row, so padding is out of contract")
    fp8 = dict(fp8_formats=tuple(FP8_DTYPES), fp8_preset=_torch_fp8_preset())
    if device == "cuda":
        # Measured on an H100 with torch 2.11 (reports/h100.md): the CUDA cast writes e5m2 NaN as
        # 0x7F, sign dropped, and keeps e4m3fn NaN's sign (preset torch_2_11_cuda); the fnuz casts
        # were not measured there, so they are not declared. Newer torch on CUDA is unmeasured:
        # it declares the CPU cast's preset until a GPU run says otherwise.
        preset = "torch_2_11_cuda" if fp8["fp8_preset"] == "torch_2_11" else fp8["fp8_preset"]
        fp8 = dict(fp8, fp8_formats=("e4m3fn", "e5m2"), fp8_preset=preset,
                   reasons=(("fp8_format", "torch's CUDA fnuz casts are not measured yet"),))
    oracle.register(store_cache, op="store_cache", name=f"{prefix}.store_cache",
                    dtypes=("float32", "float16", "bfloat16", "uint8"), **common)
    oracle.register(set_mla_kv_buffer, op="set_mla_kv_buffer", name=f"{prefix}.set_mla_kv_buffer",
                    backend="torch", device=device, validates=True,
                    dtypes=("float32", "float16", "bfloat16", "uint8"),
                    notes="sglang's naive writer: index_put_ of cat(nope, rope); -1 would wrap to the "
                          "last row and slot 0 is written, so padding is out of contract")
    _register_dcp(device, prefix)
    oracle.register(concat_and_cache_mla, op="concat_and_cache_mla", name=f"{prefix}.concat_and_cache_mla",
                    backend="torch", device=device, validates=True, padding="negative",
                    scales=("tensor",), **fp8,
                    notes="index_put_ of cat(kv_c, k_pe); fp8 by x / scale in float32 and torch's cast")
    oracle.register(translate_full_to_swa, op="translate_full_to_swa", name=f"{prefix}.translate_full_to_swa",
                    backend="torch", device=device, validates=True, padding="negative",
                    notes="mapping[loc] after range checks; -1 translates through the sentinel")
    oracle.register(reshape_and_cache_flash, op="reshape_and_cache_flash",
                    name=f"{prefix}.reshape_and_cache_flash", backend="torch", device=device,
                    validates=True, padding="negative", **fp8,
                    notes="index_put_ by (block, offset) on any cache view; fp8 by x / scale in "
                          "float32 (scale broadcast over heads) and torch's cast; -1 slots skipped")
    oracle.register(quantize_fp8, op="quantize_fp8", name=f"{prefix}.quantize_fp8", backend="torch",
                    device=device, validates=True, **fp8,
                    notes="out.copy_((x.float() / scale).to(fp8).view(uint8))")
    block = dict(backend="torch", device=device, validates=True, block_formats=tuple(torch_block.FORMATS))
    if device == "cuda":  # measured on an H100 (torch 2.11): CUDA's float arithmetic returns the positive
        # canonical NaN, so a negative NaN element of an MX block is written 0x7F (NaN without its sign)
        block["block_knobs"] = (("element_preset", "cuda_satfinite"),)
    oracle.register(torch_block.quantize_block, op="quantize_block", name=f"{prefix}.quantize_block", **block,
                    notes="block amax by amax(), the exponent by frexp, elements clamped and cast "
                          "(MX) or bucketized (e2m1)")
    oracle.register(torch_block.reshape_and_cache_block, op="reshape_and_cache_block",
                    name=f"{prefix}.reshape_and_cache_block", padding="negative",
                    scale_layouts=("linear", "swizzled"), **block,
                    notes="torch_block.encode of the kept rows, index_put_ of codes and scale bytes "
                          "(swizzled pages by a gathered offset table); -1 slots skipped")
