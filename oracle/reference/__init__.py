"""The executable semantics of KV-cache writes, in pure numpy + ml_dtypes (no torch, no triton).

Every function is functional (arrays in, new arrays out, inputs never modified), validates all its
arguments before computing anything, and raises ValueError/TypeError naming the argument and the
offending value. docs/semantics.md states each contract.
"""

from .block_scaled import quantize_block, reshape_and_cache_block
from .fp8 import FORMATS, Fp8Knobs, dequantize, quantize
from .mla import concat_and_cache_mla, set_mla_kv_buffer
from .paged import reshape_and_cache_flash
from .presets import PRESETS, get_preset
from .scatter import store_cache
from .slots import OneOfRows, Padding, check_outcome
from .swa import make_swa_mapping, translate_full_to_swa
from .swa_model import SwaAllocatorModel

__all__ = [
    "FORMATS", "Fp8Knobs", "OneOfRows", "PRESETS", "Padding", "SwaAllocatorModel", "check_outcome",
    "concat_and_cache_mla", "dequantize", "get_preset", "make_swa_mapping", "quantize",
    "quantize_block", "reshape_and_cache_block", "reshape_and_cache_flash", "set_mla_kv_buffer", "store_cache", "translate_full_to_swa",
]
