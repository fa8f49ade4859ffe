"""The ``cpu`` backend: KV-cache writers in C++ (``csrc/``), registered as torch custom ops
``torch.ops.kv_oracle_cpu.*`` and, through :func:`register`, as oracle kernels.

The library is compiled on first use and cached per machine and torch version (see ``_build``);
registering never builds, and a missing compiler or a failed build makes ``available()`` return
the reason instead of raising. Each Python function here has exactly the positional signature of
the torch baseline (``oracle.kernels.torch_native``) and calls the custom op with the padding
policy its peers use.

fp8: ``x / scale`` in float32, bit for bit (scales that are 1 or powers of two multiply by the
exact reciprocal, which rounds identically; on AVX-512, scales with full significands multiply by
the rounded reciprocal and divide only the vectors where that could change a code, see
``csrc/fp8.h``), then one round-to-nearest-even to the format with the ``ocp_satfinite``
specials. The conversion runs on AVX-512 or AVX2 when the CPU has them, else scalar code, chosen
at run time; ``set_isa("scalar")`` (or ``KV_ORACLE_CPU_ISA=scalar`` before the first call) forces
a slower path, for tests.

Block-scaled formats (``quantize_block``, ``reshape_and_cache_block``; ``fmt`` one of
:data:`BLOCK_FORMATS`): MXFP8 (blocks of 32 along each head, E8M0 scale byte from amax's float32
exponent field, elements fp8 of ``x * 2**-E``) and NVFP4 (blocks of 16, e4m3fn scale byte, e2m1
elements packed two per byte, low nibble first, one float32 global scale), bit for bit with
``oracle.reference.block_scaled``'s default presets; the paged writer fills code caches (NHD or
HND views) and scale caches in the linear or the 128x4 swizzled layout, skipping negative slots.
AVX-512 or scalar code, by the same ISA setting (``csrc/block_scaled.h``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import platform

import torch

import oracle

from .. import _jit
from . import _build

NAMESPACE = _build.NAMESPACE
FP8_FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
BLOCK_FORMATS = ("mxfp8_e4m3fn", "mxfp8_e5m2", "nvfp4")
ISAS = ("scalar", "avx2", "avx512")

_LIB = _jit.Library("CPU", NAMESPACE, lambda: _build.load(), f"{__name__}._fake")
available = _LIB.available  # None when the C++ kernels are loaded (built on first use), else why not
ops = _LIB.ops  # torch.ops.kv_oracle_cpu, loading the library first; RuntimeError when unavailable


# ---- ISA control (the fp8 conversion path) -----------------------------------------------------

def isa() -> str:
    """The fp8 path the kernels use now: "avx512", "avx2" or "scalar"."""
    return ops().isa()


def detected_isa() -> str:
    """The best fp8 path this CPU supports (as the C++ code detects it)."""
    return ops().detected_isa()


def set_isa(name: str) -> str:
    """Use fp8 path ``name`` ("auto", "avx512", "avx2" or "scalar"); returns the previous one.
    A path the CPU lacks is a ValueError."""
    return ops().set_isa(name)


@contextlib.contextmanager
def forced_isa(name: str):
    previous = set_isa(name)
    try:
        yield
    finally:
        set_isa(previous)


@functools.lru_cache(maxsize=1)
def cpu_isa() -> str:
    """The fp8 path this CPU will get, from its flags, without loading the library (for notes)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return "scalar"
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        capability = torch.backends.cpu.get_cpu_capability()
        return {"AVX512": "avx512", "AVX2": "avx2"}.get(capability, "scalar")
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "f16c", "fma"} <= flags:
        return "avx512"
    if {"avx2", "f16c", "fma"} <= flags:
        return "avx2"
    return "scalar"


# ---- the kernels, in the torch baseline's calling conventions -----------------------------------

def _scale_arg(name: str, scale, fp8: bool):
    if isinstance(scale, torch.Tensor) or scale is None:
        return scale
    if fp8:
        raise TypeError(f"{name} must be a float32 tensor, got {type(scale).__name__}")
    return None  # ignored under "auto", as vLLM does


def store_cache(k, v, k_cache, v_cache, loc):
    """``k_cache[loc] = k; v_cache[loc] = v`` (sglang's store_cache; no padding: every slot in range)."""
    (_LIB.loaded or ops()).store_cache(k, v, k_cache, v_cache, loc, "none")


def store_cache_reserved0(k, v, k_cache, v_cache, loc):
    """store_cache skipping slot 0 (sglang's default ``reserved_skip_index=0``)."""
    (_LIB.loaded or ops()).store_cache(k, v, k_cache, v_cache, loc, "reserved:0")


def set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """``kv_buffer[loc, :nope + rope] = cat(nope, rope)`` (sglang; no padding)."""
    (_LIB.loaded or ops()).set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, "none")


def set_mla_kv_buffer_reserved0(kv_buffer, loc, cache_k_nope, cache_k_rope):
    """set_mla_kv_buffer skipping slot 0 (sglang's default ``reserved_skip_index=0``)."""
    (_LIB.loaded or ops()).set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, "reserved:0")


def concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale):
    """vLLM's paged MLA writer: ``cat(kv_c[i], k_pe[i])`` (fp8 codes of ``x / scale`` for an fp8
    ``kv_cache_dtype``) into slot ``slot_mapping[i]``; negative slots skipped."""
    scale = _scale_arg("scale", scale, kv_cache_dtype != "auto")
    (_LIB.loaded or ops()).concat_and_cache_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                                                "negative")


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    """vLLM's paged K/V writer on any [num_blocks, block_size, H, D] cache view (NHD or HND);
    fp8 with per-tensor [1] or per-head [H] scales; negative slots skipped."""
    fp8 = kv_cache_dtype != "auto"
    (_LIB.loaded or ops()).reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                                                   _scale_arg("k_scale", k_scale, fp8),
                                                   _scale_arg("v_scale", v_scale, fp8), "negative")


def quantize_fp8(out, x, scale, fmt):
    """``out = fp8(x / scale)`` as uint8 codes; x ``[N, H, D]``, scale [1] or [H]."""
    if not isinstance(scale, torch.Tensor):
        raise TypeError(f"scale must be a float32 tensor, got {type(scale).__name__}")
    (_LIB.loaded or ops()).quantize_fp8(out, x, scale, fmt)


def quantize_block(codes, scales, x, fmt, global_scale):
    """``codes, scales = block-scaled(x)`` for ``x`` ``[N, H, D]``: codes uint8 ``[N, H, D]`` (MX)
    or ``[N, H, D // 2]`` (NVFP4), scales uint8 ``[N, H, ceil(D / block)]``; ``global_scale`` a
    float32 [1] tensor (NVFP4; MX ignores it, None or a float included)."""
    global_scale = _scale_arg("global_scale", global_scale, fmt == "nvfp4")
    (_LIB.loaded or ops()).quantize_block(codes, scales, x, fmt, global_scale)


def reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache, value_scale_cache, slot_mapping,
                            fmt, k_global_scale, v_global_scale):
    """The paged block-scaled writer: token ``i`` (of ``len(slot_mapping)``) goes to block
    ``slot // block_size``, token ``slot % block_size`` of the code caches (any
    [num_blocks, block_size, H, Dc] view, NHD or HND) and of the scale caches (4-D: linear, any
    strides; 2-D ``[num_blocks, page_bytes]``: the 128x4 swizzled page); negative slots skipped."""
    nvfp4 = fmt == "nvfp4"
    (_LIB.loaded or ops()).reshape_and_cache_block(key, value, key_cache, value_cache, key_scale_cache,
                                                   value_scale_cache, slot_mapping, fmt,
                                                   _scale_arg("k_global_scale", k_global_scale, nvfp4),
                                                   _scale_arg("v_global_scale", v_global_scale, nvfp4))


def _notes(what: str) -> str:
    path = {"avx512": "AVX-512", "avx2": "AVX2", "scalar": "scalar"}[cpu_isa()]
    return (f"C++ (torch.utils.cpp_extension, built once per machine), at::parallel_for over rows, memcpy "
            f"of contiguous rows; {what}; fp8 path chosen at run time: {path} on this machine "
            f"(AVX-512, AVX2, scalar fallback)")


def register() -> None:
    """Register the CPU kernels with :func:`oracle.register` (never builds: ``available()`` does)."""
    common = dict(backend="cpu", device="cpu", validates=True, available=available)
    all_dtypes = ("float32", "float16", "bfloat16", "uint8")
    floats = ("float32", "float16", "bfloat16")
    fp8 = dict(fp8_formats=FP8_FORMATS, fp8_preset="ocp_satfinite")
    oracle.register(store_cache, op="store_cache", name="cpu.store_cache", dtypes=all_dtypes, padding="none",
                    notes=_notes("every slot must be in range (sglang store_cache with reserved_skip_index=-1)"),
                    **common)
    oracle.register(store_cache_reserved0, op="store_cache", name="cpu.store_cache.reserved0", dtypes=all_dtypes,
                    padding="reserved:0", notes=_notes("slot 0 skipped (sglang's default reserved_skip_index=0)"),
                    **common)
    oracle.register(set_mla_kv_buffer, op="set_mla_kv_buffer", name="cpu.set_mla_kv_buffer", dtypes=all_dtypes,
                    padding="none", notes=_notes("cat(nope, rope) per row; every slot must be in range"), **common)
    oracle.register(set_mla_kv_buffer_reserved0, op="set_mla_kv_buffer", name="cpu.set_mla_kv_buffer.reserved0",
                    dtypes=all_dtypes, padding="reserved:0",
                    notes=_notes("slot 0 skipped (sglang's default reserved_skip_index=0)"), **common)
    oracle.register(concat_and_cache_mla, op="concat_and_cache_mla", name="cpu.concat_and_cache_mla", dtypes=floats,
                    padding="negative", scales=("tensor",),
                    notes=_notes("negative slots skipped (vLLM); fp8 x / scale in float32"), **fp8, **common)
    oracle.register(reshape_and_cache_flash, op="reshape_and_cache_flash", name="cpu.reshape_and_cache_flash",
                    dtypes=floats, padding="negative", scales=("tensor", "head"),
                    notes=_notes("every cache stride honoured (NHD, HND); negative slots skipped (vLLM); "
                                 "fp8 x / scale in float32, per-tensor or per-head scale"), **fp8, **common)
    oracle.register(quantize_fp8, op="quantize_fp8", name="cpu.quantize_fp8", dtypes=floats,
                    scales=("tensor", "head"), notes=_notes("fp8 x / scale in float32"), **fp8, **common)
    block = dict(block_formats=BLOCK_FORMATS, scale_layouts=("linear", "swizzled"), dtypes=floats)
    oracle.register(quantize_block, op="quantize_block", name="cpu.quantize_block",
                    notes=_notes("MXFP8 (E8M0 from amax's exponent field) and NVFP4 (fl32 reference "
                                 "arithmetic, e2m1 packed low nibble first), AVX-512 or scalar"), **block, **common)
    oracle.register(reshape_and_cache_block, op="reshape_and_cache_block", name="cpu.reshape_and_cache_block",
                    padding="negative", layouts=("NHD", "HND"),
                    notes=_notes("MXFP8/NVFP4 codes into NHD or HND caches, scales linear or 128x4 swizzled; "
                                 "negative slots write nothing"), **block, **common)


__all__ = ["available", "ops", "isa", "detected_isa", "set_isa", "forced_isa", "cpu_isa", "register",
           "store_cache", "store_cache_reserved0", "set_mla_kv_buffer", "set_mla_kv_buffer_reserved0",
           "concat_and_cache_mla", "reshape_and_cache_flash", "quantize_fp8", "quantize_block",
           "reshape_and_cache_block", "FP8_FORMATS", "BLOCK_FORMATS", "ISAS"]

if os.environ.get("KV_ORACLE_CPU_EAGER"):  # build at import, e.g. to warm the cache in an image
    available()
