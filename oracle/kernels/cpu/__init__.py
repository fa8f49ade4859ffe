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


__all__ = ["available", "ops", "isa", "detected_isa", "set_isa", "forced_isa", "cpu_isa", "register",
           "store_cache", "store_cache_reserved0", "set_mla_kv_buffer", "set_mla_kv_buffer_reserved0",
           "concat_and_cache_mla", "reshape_and_cache_flash", "quantize_fp8", "FP8_FORMATS", "ISAS"]

if os.environ.get("KV_ORACLE_CPU_EAGER"):  # build at import, e.g. to warm the cache in an image
    available()
