"""Correct variants of the torch kernels, for mutants whose bug needs a contract the torch
baseline does not declare (a padding policy, duplicate slots, saturating fp8 on every format).

Each is as honest as the torch baseline: a mutant of it declares exactly its contract, and the
self-check (and tests/test_mutants.py) checks that the base itself passes every case it runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..kernels import torch_native as tn
from ..kernels import _checks as checks

BACKEND = "mutant-base"


@dataclass(frozen=True)
class Base:
    name: str
    op: str
    fn: Callable
    fields: dict  # Contract fields besides op, name and backend
    why: str


def check_loc(loc, num_slots: int, padding: str = "none") -> torch.Tensor:
    """A 1-D int32/int64 ``loc`` whose every entry but the padding policy's is a slot of
    ``[0, num_slots)``; returns the mask of the positions that are written."""
    if loc.dtype not in tn.INDEX_DTYPES:
        raise TypeError(f"loc has dtype {loc.dtype}; expected torch.int32 or torch.int64")
    if loc.dim() != 1:
        raise ValueError(f"loc must be 1-D, got shape {tuple(loc.shape)}")
    keep = torch.ones(loc.shape, dtype=torch.bool)
    if padding == "negative":
        keep = loc >= 0
    elif padding.startswith("reserved:") and int(padding.split(":")[1]) < num_slots:
        keep = loc != int(padding.split(":")[1])
    written = loc[keep]
    if written.numel() and (int(written.min()) < 0 or int(written.max()) >= num_slots):
        bad = int(written.min()) if int(written.min()) < 0 else int(written.max())
        raise ValueError(f"loc holds slot {bad}, out of range [0, {num_slots}) under padding={padding}")
    return keep


def check_store(k, v, k_cache, v_cache, loc, padding: str = "none") -> torch.Tensor:
    """torch.store_cache's checks, with the slots a padding policy skips allowed; returns the
    mask of the positions that are written."""
    keep = check_loc(loc, k_cache.shape[0], padding)
    checks.check_rows("k", k, "k_cache", k_cache, loc.shape[0])
    checks.check_rows("v", v, "v_cache", v_cache, loc.shape[0])
    if v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(f"v_cache has {v_cache.shape[0]} slots but k_cache has {k_cache.shape[0]}")
    return keep


def store_cache_skip_negative(k, v, k_cache, v_cache, loc):
    """``cache[loc] = rows``, skipping negative slots (vLLM's padding)."""
    keep = check_store(k, v, k_cache, v_cache, loc, "negative")
    index = loc[keep].long()
    k_cache.index_put_((index,), k[keep])
    v_cache.index_put_((index,), v[keep])


def store_cache_skip_reserved0(k, v, k_cache, v_cache, loc):
    """``cache[loc] = rows``, skipping slot 0 (sglang's CUDA-graph padding slot)."""
    keep = check_store(k, v, k_cache, v_cache, loc, "reserved:0")
    index = loc[keep].long()
    k_cache.index_put_((index,), k[keep])
    v_cache.index_put_((index,), v[keep])


def set_mla_skip_reserved0(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)``, skipping slot 0 (sglang's
    ``reserved_skip_index=0``)."""
    keep = check_loc(loc, kv_buffer.shape[0], "reserved:0")
    tn.set_mla_kv_buffer(kv_buffer, loc[:0], cache_k_nope[:0], cache_k_rope[:0])  # dtypes and widths
    nope, rope = checks.mla_sources(cache_k_nope, cache_k_rope, loc.shape[0])
    tn.set_mla_kv_buffer(kv_buffer, loc[keep], nope[keep], rope[keep])


def first_and_last(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For each distinct slot of ``index`` (int64), the first and the last position naming it."""
    unique, inverse = torch.unique(index, return_inverse=True)
    positions = torch.arange(index.numel())
    first = torch.full(unique.shape, index.numel(), dtype=torch.int64)
    last = torch.full(unique.shape, -1, dtype=torch.int64)
    first = first.scatter_reduce(0, inverse, positions, reduce="amin")
    last = last.scatter_reduce(0, inverse, positions, reduce="amax")
    return first, last


def store_cache_last_wins(k, v, k_cache, v_cache, loc):
    """``cache[loc] = rows`` where a duplicated slot gets its last row, whole (each slot written
    once, so no two writes race)."""
    check_store(k, v, k_cache, v_cache, loc)
    index = loc.long()
    _, last = first_and_last(index)
    k_cache.index_put_((index[last],), k[last])
    v_cache.index_put_((index[last],), v[last])


def satfinite_codes(rows: torch.Tensor, scale: torch.Tensor, fmt: str, saturate: bool = True):
    """fp8 codes of ``rows / scale`` (float32 quotient), saturating: finite overflow and inf go to
    ±max (clamping the quotient first is exact: everything past max rounds to max or overflows),
    NaN stays NaN. ``saturate=False`` is torch's own cast."""
    quotient = rows.float() / scale.reshape(1, -1, 1)
    if saturate:
        top = torch.finfo(tn.FP8_DTYPES[fmt]).max
        quotient = quotient.clamp(-top, top)
    return quotient.to(tn.FP8_DTYPES[fmt]).view(torch.uint8)


def check_quantize(out, x, scale, fmt) -> None:
    """torch.quantize_fp8's checks."""
    if fmt not in tn.FP8_DTYPES:
        raise ValueError(f"fmt={fmt!r} is not one of {sorted(tn.FP8_DTYPES)}")
    if x.dtype not in tn.FLOAT_DTYPES:
        raise TypeError(f"x has dtype {x.dtype}; expected float32, float16 or bfloat16")
    if out.dtype != torch.uint8:
        raise TypeError(f"out has dtype {out.dtype}; expected torch.uint8 (fp8 codes)")
    if x.dim() != 3 or tuple(out.shape) != tuple(x.shape):
        raise ValueError(f"out has shape {tuple(out.shape)} and x {tuple(x.shape)}; "
                         "expected one [N, H, D] shape")
    checks.check_scale("scale", scale, x.shape[1])
    checks.check_scale_values("scale", scale)


def quantize_fp8_satfinite(out, x, scale, fmt):
    """``out = fp8(x / scale)``, saturating on every format (the OCP satfinite conversion)."""
    check_quantize(out, x, scale, fmt)
    out.copy_(satfinite_codes(x, scale, fmt))


_COMMON = dict(device="cpu", validates=True)
BASES = (
    Base("mutant-base.store_cache.pad_negative", "store_cache", store_cache_skip_negative,
         dict(_COMMON, dtypes=("float32", "float16", "bfloat16", "uint8"), padding="negative"),
         "torch.store_cache that skips negative slots, for the -1 slot mutant"),
    Base("mutant-base.store_cache.pad_reserved0", "store_cache", store_cache_skip_reserved0,
         dict(_COMMON, dtypes=("float32", "float16", "bfloat16", "uint8"), padding="reserved:0"),
         "torch.store_cache that skips slot 0, for the reserved slot mutant"),
    Base("mutant-base.set_mla_kv_buffer.pad_reserved0", "set_mla_kv_buffer", set_mla_skip_reserved0,
         dict(_COMMON, dtypes=("float32", "float16", "bfloat16", "uint8"), padding="reserved:0"),
         "torch.set_mla_kv_buffer that skips slot 0, for the no-rope path mutant"),
    Base("mutant-base.store_cache.dups_any", "store_cache", store_cache_last_wins,
         dict(_COMMON, dtypes=("float32", "float16", "bfloat16", "uint8"), duplicates="any"),
         "torch.store_cache that writes each duplicated slot once, for the torn row mutant"),
    Base("mutant-base.quantize_fp8.satfinite", "quantize_fp8", quantize_fp8_satfinite,
         dict(_COMMON, fp8_formats=tuple(tn.FP8_DTYPES), fp8_preset="ocp_satfinite"),
         "quantize_fp8 saturating every format, for the non-saturating mutant"),
)
