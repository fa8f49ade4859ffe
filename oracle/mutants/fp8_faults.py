"""Mutants for the fp8 bug classes the diagnosis names: each commits one fp8 conversion or scale
bug that a failure should be explained by (``Mutant.cause``, a key of
:data:`oracle.diagnose.CAUSES`), under exactly its base's contract, and is killed by the "fp8"
case class.

Built like :data:`oracle.mutants.kernels.MUTANTS`; each validates its input as its base does
(the base's own call or checks run first), then writes what the buggy kernel would.
"""

from __future__ import annotations

import torch

from ..kernels import _checks as checks
from ..kernels import torch_native as tn
from .bases import check_quantize
from .kernels import Mutant, paged_write

MANTISSA_BITS = {"e4m3fn": 3, "e5m2": 2, "e4m3fnuz": 3, "e5m2fnuz": 2}
WRONG_FORMAT = {"e4m3fn": "e4m3fnuz", "e5m2": "e5m2fnuz"}  # the ROCm format of the same layout


# --- reshape_and_cache_flash (base torch.reshape_and_cache_flash) ------------------------------

def paged_collapses_head_scale(*args):
    def codes(rows, scale, fmt):  # scale[0] for every head: a kernel that loads k_scale[0]
        return tn._to_fp8_codes(rows, scale.reshape(-1)[:1], fmt)
    paged_write(*args, codes=codes)


def paged_v_uses_k_scale(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                         k_scale, v_scale):
    paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
           write=False)  # the checks, on the real arguments
    paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, k_scale)


def paged_v_unscaled(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale,
                write=False)  # the checks, on the real arguments
    paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, torch.ones_like(v_scale))


def paged_repeats_head_scale(*args):
    def codes(rows, scale, fmt):  # scale.repeat(D): element j of the [H * D] row gets scale[j % H]
        m, heads, dim = rows.shape
        per_element = scale.reshape(-1).repeat(heads * dim // scale.numel()).reshape(1, heads, dim)
        return tn._fp8_codes(rows, per_element, fmt)
    paged_write(*args, codes=codes)


def paged_nan_clamped(*args):
    def codes(rows, scale, fmt):  # fminf(fmaxf(q, -max), max): fmaxf returns -max for a NaN q
        top = torch.finfo(tn.FP8_DTYPES[fmt]).max
        q = rows.float() / scale.reshape(1, -1, 1)
        clamped = torch.where(torch.isnan(q), torch.full_like(q, -top), q.clamp(-top, top))
        return clamped.to(tn.FP8_DTYPES[fmt]).view(torch.uint8)  # no NaN left to sign
    paged_write(*args, codes=codes)


def paged_clamps_e5m2_at_448(*args):
    def codes(rows, scale, fmt):  # one saturation bound for every format: e4m3fn's
        return tn._quotient_codes((rows.float() / scale.reshape(1, -1, 1)).clamp(-448.0, 448.0), rows, fmt)
    paged_write(*args, codes=codes)


# --- concat_and_cache_mla (base torch.concat_and_cache_mla) ------------------------------------

def concat_mla_k_pe_unscaled(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    tn.concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale)
    fmt = checks.KV_CACHE_DTYPES[kv_cache_dtype]
    if fmt is None:
        return
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    block_size = kv_cache.shape[1]
    rows = k_pe[: slot_mapping.shape[0]][keep]
    codes = rows.float().to(tn.FP8_DTYPES[fmt]).view(torch.uint8)  # k_pe cast without / scale
    kv_cache[..., kv_c.shape[1]:].index_put_((slots // block_size, slots % block_size), codes)


# --- quantize_fp8 (base torch.quantize_fp8) ---------------------------------------------------

def _quotient(out, x, scale, fmt) -> torch.Tensor:
    check_quantize(out, x, scale, fmt)
    return x.float() / scale.reshape(1, -1, 1)


def _truncated(q: torch.Tensor, fmt: str) -> torch.Tensor:
    """``q`` truncated toward zero to a value of ``fmt`` (or to the first step past max, which the
    cast then treats as overflow): the low mantissa bits cleared for normal magnitudes, whole
    subnormal quanta kept below the smallest normal. inf and NaN pass unchanged."""
    m = MANTISSA_BITS[fmt]
    smallest_normal = torch.finfo(tn.FP8_DTYPES[fmt]).smallest_normal
    cleared = (q.view(torch.int32) & ~((1 << (23 - m)) - 1)).view(torch.float32)
    quantum = smallest_normal * 2.0 ** -m  # a power of two: q / quantum and back are exact
    subnormal = torch.trunc(q / quantum) * quantum
    out = torch.where(q.abs() < smallest_normal, subnormal, cleared)
    return torch.where(torch.isfinite(q), out, q)


def quantize_rounds_toward_zero(out, x, scale, fmt):
    q = _truncated(_quotient(out, x, scale, fmt), fmt)
    out.copy_(q.to(tn.FP8_DTYPES[fmt]).view(torch.uint8))


def quantize_flushes_subnormals(out, x, scale, fmt):
    codes = _quotient(out, x, scale, fmt).to(tn.FP8_DTYPES[fmt]).view(torch.uint8)
    magnitude = codes & 0x7F
    subnormal = (magnitude != 0) & (magnitude >> MANTISSA_BITS[fmt] == 0)
    zero = torch.zeros_like(codes) if fmt.endswith("fnuz") else codes & 0x80  # fnuz: 0x80 is NaN
    out.copy_(torch.where(subnormal, zero, codes))


def quantize_truncates_subnormals(out, x, scale, fmt):
    q = _quotient(out, x, scale, fmt)
    smallest_normal = torch.finfo(tn.FP8_DTYPES[fmt]).smallest_normal
    q = torch.where(q.abs() < smallest_normal, _truncated(q, fmt), q)  # exact there: the cast keeps it
    out.copy_(q.to(tn.FP8_DTYPES[fmt]).view(torch.uint8))


def quantize_loses_negative_zero(out, x, scale, fmt):
    codes = _quotient(out, x, scale, fmt).to(tn.FP8_DTYPES[fmt]).view(torch.uint8)
    if not fmt.endswith("fnuz"):  # there 0x80 is the NaN, and -0 already +0
        codes = torch.where(codes == 0x80, torch.zeros_like(codes), codes)
    out.copy_(codes)


def quantize_writes_fnuz(out, x, scale, fmt):
    q = _quotient(out, x, scale, fmt)
    out.copy_(q.to(tn.FP8_DTYPES[WRONG_FORMAT.get(fmt, fmt)]).view(torch.uint8))


# --- the catalogue -----------------------------------------------------------------------------

T = "torch."
_ROWS = [
    ("reshape_and_cache_flash.collapses_head_scale", "reshape_and_cache_flash",
     T + "reshape_and_cache_flash", "quantizes every head with head 0's scale (k_scale[0], v_scale[0])",
     "scale_collapsed", paged_collapses_head_scale),
    ("reshape_and_cache_flash.v_uses_k_scale", "reshape_and_cache_flash",
     T + "reshape_and_cache_flash", "quantizes V with K's scale (k_scale for both caches)",
     "scale_swapped", paged_v_uses_k_scale),
    ("reshape_and_cache_flash.v_unscaled", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "quantizes V without its scale (K with k_scale)", "scale_missing", paged_v_unscaled),
    ("reshape_and_cache_flash.repeats_head_scale", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "broadcasts the per-head scale with repeat, not repeat_interleave (element j gets scale[j % H])",
     "scale_misindexed", paged_repeats_head_scale),
    ("reshape_and_cache_flash.nan_clamped", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "clamps the quotient with fmaxf/fminf, which write NaN as -max", "nan_mishandled", paged_nan_clamped),
    ("reshape_and_cache_flash.clamps_e5m2_at_448", "reshape_and_cache_flash", T + "reshape_and_cache_flash",
     "saturates every format at e4m3fn's 448 (e5m2 included)", "fp8_conversion", paged_clamps_e5m2_at_448),
    ("concat_and_cache_mla.k_pe_unscaled", "concat_and_cache_mla", T + "concat_and_cache_mla",
     "stores k_pe as fp8(k_pe) without the scale (kv_c scaled)",
     "part_unscaled", concat_mla_k_pe_unscaled),
    ("quantize_fp8.rounds_toward_zero", "quantize_fp8", T + "quantize_fp8",
     "rounds to fp8 toward zero (truncates the mantissa) instead of to nearest even",
     "round_toward_zero", quantize_rounds_toward_zero),
    ("quantize_fp8.flushes_subnormals", "quantize_fp8", T + "quantize_fp8",
     "flushes fp8 subnormal results to zero (of their sign)",
     "subnormals_flushed", quantize_flushes_subnormals),
    ("quantize_fp8.truncates_subnormals", "quantize_fp8", T + "quantize_fp8",
     "shifts subnormal results into place without rounding (toward zero); normal ones round to nearest even",
     "subnormals_truncated", quantize_truncates_subnormals),
    ("quantize_fp8.loses_negative_zero", "quantize_fp8", T + "quantize_fp8",
     "writes -0 as +0 (0x00 instead of 0x80)",
     "negative_zero_mishandled", quantize_loses_negative_zero),
    ("quantize_fp8.writes_fnuz", "quantize_fp8", T + "quantize_fp8",
     "writes e4m3fnuz (e5m2fnuz) codes where e4m3fn (e5m2) is asked",
     "wrong_fp8_format", quantize_writes_fnuz),
]
FP8_MUTANTS = tuple(Mutant("mutant." + name, op, base, bug, ("fp8",), fn, cause)
                    for name, op, base, bug, cause, fn in _ROWS)

__all__ = ["FP8_MUTANTS"]
