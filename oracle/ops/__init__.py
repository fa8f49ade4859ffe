"""Op specs: one module per op family, each the calling convention its kernels implement.

Adding an op means one reference module, one spec module here, and one line below.
"""

from __future__ import annotations

from .base import Case, OpSpec, Prepared
from .block_scaled import QuantizeBlock, ReshapeAndCacheBlock
from .mla import ConcatAndCacheMla, SetMlaKvBuffer
from .paged import ReshapeAndCacheFlash
from .quantize import QuantizeFp8
from .store_cache import StoreCache
from .swa import TranslateFullToSwa

SPECS: dict[str, OpSpec] = {spec.name: spec for spec in (
    StoreCache(),
    SetMlaKvBuffer(),
    ConcatAndCacheMla(),
    TranslateFullToSwa(),
    ReshapeAndCacheFlash(),
    QuantizeFp8(),
    QuantizeBlock(),
    ReshapeAndCacheBlock(),
)}


def get_spec(op: str) -> OpSpec:
    if op not in SPECS:
        raise ValueError(f"op {op!r} has no spec; known ops: {', '.join(SPECS)}")
    return SPECS[op]


__all__ = ["Case", "OpSpec", "Prepared", "SPECS", "get_spec"]
