"""A plug-in whose paged writer collapses the per-head fp8 scale to head 0 (a real bug class),
for the end-to-end diagnosis test."""


import oracle
from oracle.kernels import torch_native as tn


def reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale, v_scale):
    tn.reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
                               k_scale[:1].expand_as(k_scale).contiguous(), v_scale[:1].expand_as(v_scale).contiguous())


def register():
    oracle.register(reshape_and_cache_flash, op="reshape_and_cache_flash", name="collapsed.reshape_and_cache_flash",
                    backend="collapsed", padding="negative", fp8_formats=("e4m3fn",),
                    fp8_preset=tn._torch_fp8_preset(), validates=True)
