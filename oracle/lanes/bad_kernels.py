"""The sanitizer lane's fixture: a DELIBERATELY WRONG CUDA kernel, never installed as an entry point.

``ORACLE_PLUGINS=oracle.lanes.bad_kernels:register`` registers ``cuda-bad.store_cache_u32slot``
(backend ``cuda-bad``, so ``--oracle-backend cuda`` never selects it). It claims sglang/vLLM's
"negative slots are padding" contract but reads each slot into a 32-bit unsigned integer: a -1
slot becomes 4294967295 and the row is written 2^32 - 1 row strides past the cache, far beyond
every allocation and every guard band. Rows with real slots are copied correctly, so only the
padding cases go wrong: without a sanitizer the write faults (an illegal address, the worker
dies); under ``compute-sanitizer --tool memcheck`` it is reported as an invalid global write in
``store_cache_u32_slot_kernel``. ``python -m oracle.lanes.sanitize --bad`` demonstrates exactly
that. Its source is ``oracle/kernels/cuda/csrc/bad.cu``, built by ``oracle.kernels.cuda._build``
(``BAD``) like the real kernels.
"""

from __future__ import annotations

import torch

import oracle

from ..kernels.cuda import _build

NAME = "cuda-bad.store_cache_u32slot"
KERNEL_SYMBOL = "store_cache_u32_slot_kernel"
_OPS = None


def available() -> str | None:
    global _OPS
    if _OPS is not None:
        return None
    reason = _build.load(_build.BAD)
    if reason is None:
        _OPS = getattr(torch.ops, _build.BAD.namespace)
    return reason


def store_cache(k, v, k_cache, v_cache, loc):
    if _OPS is None:
        reason = available()
        if reason:
            raise RuntimeError(f"the deliberately wrong CUDA kernel is unavailable: {reason}")
    _OPS.store_cache(k, v, k_cache, v_cache, loc)


def register() -> None:
    oracle.register(store_cache, op="store_cache", name=NAME, backend="cuda-bad", device="cuda",
                    dtypes=("float32", "float16", "bfloat16", "uint8"), padding="negative", validates=False,
                    available=available,
                    notes="DELIBERATELY WRONG (sanitizer demo): the slot is read as uint32, so a -1 padding "
                          "slot writes 2^32 - 1 rows past the cache instead of being skipped")
