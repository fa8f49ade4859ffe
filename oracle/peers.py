"""Peers' Triton writers, loaded from their own source files and registered as plug-ins.

sglang's ``launch_reshape_and_cache_flash`` (``python/sglang/kernels/ops/kvcache/cache_ops.py``)
and vLLM's ``triton_reshape_and_cache_flash`` (``vllm/attention/ops/triton_reshape_and_cache_flash.py``)
are pure Triton files. Each is loaded by path, as it is (never copied into this project), and
registered with the contract its code implies, so the conformance suite judges it like any kernel:

    ORACLE_PEER_FILES=cache_ops.py:triton_reshape_and_cache_flash.py \\
    ORACLE_PLUGINS=oracle.peers:register oracle run --backend sglang,vllm --profile full

vLLM's function is registered itself: the contract names its kv_cache_dtype strings. sglang's
takes another argument order (and an SWA table, passed as None), so it is called through a
wrapper that only reorders the arguments. ``oracle bench --peer-file`` loads the same files.
"""

from __future__ import annotations

import enum
import importlib.util
import os
import sys
import types
from pathlib import Path

import torch

from .registry import register as _register

ENV = "ORACLE_PEER_FILES"


def load_module(path: str, what: str = ENV) -> types.ModuleType:
    """The Python file ``path`` executed as a module of its own (vLLM's imports stubbed where vLLM
    is not installed); a ValueError naming ``what`` and the path when it is not a file."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"{what} {path!r} is not a file")
    _vllm_stubs()
    spec = importlib.util.spec_from_file_location(f"oracle_peer_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: Triton and inspect look modules up by name
    spec.loader.exec_module(module)
    return module


def _cuda() -> str | None:
    return None if torch.cuda.is_available() else "no CUDA device (the peers' writers are Triton GPU kernels)"


# What both writers' code does, as contract fields: one token per program, the slot loaded as it
# is (the index's stride ignored), negative slots skipped, the quotient x / scale in Triton's
# default (approximate) division with one per-tensor scale, the store's own fp8 conversion, V's
# cache addressed with K's strides, and each source row's heads read as one run from its row
# stride (key.stride(0) is the only source stride passed).
_COMMON = dict(op="reshape_and_cache_flash", device="cuda", padding="negative", layouts=("NHD",),
               strided_index=False, shared_cache_strides=True, strided_heads=False, scales=("tensor",), fp8_preset="triton_sm90",
               fp8_division="approx", validates=False, available=_cuda)


def register() -> None:
    """Register the writers of every file in ``ORACLE_PEER_FILES`` (``os.pathsep``-separated)."""
    for path in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        module = load_module(path)
        stem, found = Path(path).stem, False
        if hasattr(module, "launch_reshape_and_cache_flash"):
            _register(_sglang(module.launch_reshape_and_cache_flash), name=f"sglang.{stem}", backend="sglang",
                      fp8_formats=("e4m3fn", "e5m2"), fp8_cache="float8", source_rows="equal",
                      notes=f"sglang's launch_reshape_and_cache_flash from {path}, arguments reordered",
                      **_COMMON)
            found = True
        if hasattr(module, "triton_reshape_and_cache_flash"):
            # every name starting with "fp8" stores the platform's fp8 type (e4m3fn on CUDA)
            _register(module.triton_reshape_and_cache_flash, name=f"vllm.{stem}", backend="vllm",
                      fp8_formats=("e4m3fn",), kv_cache_dtypes=(("fp8", "e4m3fn"), ("fp8_e4m3", "e4m3fn")),
                      source_rows="index", notes=f"vLLM's triton_reshape_and_cache_flash from {path}, unmodified",
                      **_COMMON)
            found = True
        if not found:
            raise ValueError(f"{ENV}: {path!r} defines neither launch_reshape_and_cache_flash (sglang) "
                             "nor triton_reshape_and_cache_flash (vLLM)")


def _sglang(launch):
    def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
        scaled = kv_cache_dtype != "auto"  # it quantizes when given scales, into the caches' fp8 type
        launch(key, value, key_cache, value_cache, slot_mapping, None, k_scale if scaled else None,
               v_scale if scaled else None)
    return reshape_and_cache_flash


# ---------------------------------------------------------------- vLLM's imports, where vLLM is absent

def _stub(name: str, **attrs) -> types.ModuleType:
    module = sys.modules.get(name) or types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    sys.modules[name] = module
    return module


class _CudaPlatform:
    """What vLLM's ``current_platform`` answers on a CUDA GPU, for its Triton file alone."""

    @staticmethod
    def has_device_capability(capability: int) -> bool:
        major, minor = torch.cuda.get_device_capability()
        return major * 10 + minor >= capability

    is_xpu = staticmethod(lambda: False)
    is_rocm = staticmethod(lambda: False)
    fp8_dtype = staticmethod(lambda: torch.float8_e4m3fn)


def _vllm_stubs() -> None:
    """vLLM's Triton file imports four names from the rest of vLLM; where vLLM is not installed,
    provide them as vLLM defines them for a CUDA GPU (the file itself runs unmodified)."""
    try:
        import vllm  # noqa: F401
        return
    except ImportError:
        pass
    import triton
    import triton.language as tl
    for name in ("vllm", "vllm.model_executor", "vllm.model_executor.layers", "vllm.model_executor.layers.quantization",
                 "vllm.model_executor.layers.quantization.utils", "vllm.v1"):
        _stub(name)
    _stub("vllm.model_executor.layers.quantization.utils.quant_utils", FP8_DTYPE=torch.float8_e4m3fn,
          get_fp8_min_max=lambda: (-448.0, 448.0))
    _stub("vllm.platforms", current_platform=_CudaPlatform())
    _stub("vllm.triton_utils", tl=tl, triton=triton)
    _stub("vllm.v1.kv_cache_interface", KVQuantMode=enum.Enum("KVQuantMode", "NONE FP8_PER_TENSOR FP8_PER_TOKEN_HEAD"),
          is_quantized_kv_cache=lambda dtype: str(dtype).startswith("fp8"))
