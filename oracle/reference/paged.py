"""Paged KV write: the contract of vLLM's ``reshape_and_cache_flash`` (and aiter's, and sglang's
Triton ``launch_reshape_and_cache_flash`` apart from its SWA remap).

Slot ``s`` is token ``s % block_size`` of block ``s // block_size``. Also home of the
``kv_cache_dtype`` handling shared with the MLA writers: "auto" copies, an fp8 name quantizes.
"""

from __future__ import annotations

import numpy as np

from . import _validate as v
from . import fp8
from .slots import parse_policies, plan_slots, write_rows

LAYOUTS = ("NHD", "HND")
KV_CACHE_DTYPES = {"auto": None, "e4m3fn": "e4m3fn", "e5m2": "e5m2", "e4m3fnuz": "e4m3fnuz",
                   "e5m2fnuz": "e5m2fnuz", "fp8": "e4m3fn", "fp8_e4m3": "e4m3fn",
                   "fp8_e5m2": "e5m2"}  # the last three are vLLM's spellings


def cache_format(kv_cache_dtype) -> str | None:
    """The fp8 format a ``kv_cache_dtype`` name stores, or None for "auto" (plain copy)."""
    v.require_choice("kv_cache_dtype", kv_cache_dtype, tuple(KV_CACHE_DTYPES))
    return KV_CACHE_DTYPES[kv_cache_dtype]


def row_encoder(fmt, scales: dict, preset, knobs: dict, rows_shape: tuple):
    """For each scale in ``scales`` (argument name -> value), the function from source rows to
    cache rows: identity when ``fmt`` is None, else :func:`fp8.quantize` with that scale. Every
    argument is checked now, on an empty batch of rows of ``rows_shape``, so a call that writes
    no row still rejects a bad scale, and the error names the scale's argument."""
    if fmt is None:
        if preset is not None or knobs:
            raise ValueError("preset and fp8 knobs apply only when kv_cache_dtype names an fp8 "
                             f"format; got preset={preset!r}, knobs={sorted(knobs)} with 'auto'")
        return {name: (lambda rows: rows) for name in scales}
    probe = np.empty((0,) + tuple(rows_shape), np.float32)
    fp8.quantize(probe, fmt, preset=preset, **knobs)
    for name, scale in scales.items():
        try:
            fp8.quantize(probe, fmt, scale=scale, preset=preset, **knobs)
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name}: {error}") from None
    return {name: (lambda rows, scale=scale: fp8.quantize(rows, fmt, scale=scale, preset=preset,
                                                          head_axis=-2, **knobs))
            for name, scale in scales.items()}


def require_cache_dtype(fmt, cache_name, cache, source_name, source) -> None:
    """Under "auto" cache and source share a dtype; under fp8 the cache is uint8 (codes) and the
    source float32, float16 or bfloat16."""
    if fmt is None:
        v.require_same_dtype(cache_name, cache, source_name, source)
        return
    v.require_dtype(cache_name, cache, (np.uint8,), f" (kv_cache_dtype {fmt} stores fp8 codes)")
    v.require_float_input(source_name, source)


def reshape_and_cache_flash(key_cache, value_cache, slot_mapping, key, value, *,
                            kv_cache_dtype="auto", k_scale=1.0, v_scale=1.0, layout="NHD",
                            padding="negative", duplicates="forbid", preset=None, **fp8_knobs):
    """The caches after writing token ``i`` of ``key``/``value`` to slot ``slot_mapping[i]``.

    Caches ``[num_blocks, block_size, H, D]`` (``layout="NHD"``) or ``[num_blocks, H,
    block_size, D]`` (``"HND"``); the value cache has its own head size ``Dv``. ``key``
    ``[T, H, D]``, ``value`` ``[T, H, Dv]``, one dtype. Only the first ``len(slot_mapping)``
    tokens are written: ``T`` may be larger (vLLM V1 pads the batch for CUDA graphs and takes
    ``num_tokens = len(slot_mapping)``); the extra rows are never read.

    ``kv_cache_dtype``: "auto" copies (cache dtype = source dtype); "e4m3fn", "e5m2",
    "e4m3fnuz", "e5m2fnuz" (or vLLM's "fp8", "fp8_e4m3", "fp8_e5m2") store
    ``fp8.quantize(row, fmt, scale=k_scale or v_scale, preset=preset, **fp8_knobs)`` codes in a
    uint8 cache; a scale is a number or a float32 array of shape ``()``, ``(1,)`` or ``(H,)``
    (per head). Scales are ignored under "auto", as vLLM does.

    ``padding`` (default "negative": slots < 0 are skipped) and ``duplicates`` as in
    :mod:`oracle.reference.slots`. Returns ``(new_key_cache, new_value_cache)``; each is an array,
    or a :class:`~oracle.reference.slots.OneOfRows` (checked on its own) when
    ``duplicates="any"`` and a slot is actually written twice. Inputs are never modified.
    """
    parse_policies(padding, duplicates)
    fmt = cache_format(kv_cache_dtype)
    v.require_choice("layout", layout, LAYOUTS)
    arrays = (("key_cache", key_cache), ("value_cache", value_cache),
              ("slot_mapping", slot_mapping), ("key", key), ("value", value))
    for name, array in arrays:
        v.require_array(name, array)
    v.require_index("slot_mapping", slot_mapping)
    for name, array, rank in (("key_cache", key_cache, 4), ("value_cache", value_cache, 4),
                              ("key", key, 3), ("value", value, 3)):
        if array.ndim != rank:
            raise ValueError(f"{name} must be {rank}-D, got shape {array.shape}")
    num_tokens = len(slot_mapping)
    heads, head_size = key.shape[1:]
    if value.shape[1] != heads:
        raise ValueError(f"value has {value.shape[1]} heads but key has {heads}")
    if layout == "NHD":
        num_blocks, block_size = key_cache.shape[:2]
        expected = {"key_cache": (num_blocks, block_size, heads, head_size),
                    "value_cache": (num_blocks, block_size, heads, value.shape[2])}
    else:
        num_blocks, block_size = key_cache.shape[0], key_cache.shape[2]
        expected = {"key_cache": (num_blocks, heads, block_size, head_size),
                    "value_cache": (num_blocks, heads, block_size, value.shape[2])}
    v.require_shape("key_cache", key_cache, expected["key_cache"],
                    f"{layout}, from key {key.shape}")
    v.require_shape("value_cache", value_cache, expected["value_cache"],
                    f"{layout}, blocks from key_cache, heads from key, head size from value")
    for name, array in (("key", key), ("value", value)):
        if array.shape[0] < num_tokens:
            raise ValueError(f"{name} has {array.shape[0]} tokens but slot_mapping has "
                             f"{num_tokens} entries")
    v.require_same_dtype("value", value, "key", key)
    require_cache_dtype(fmt, "key_cache", key_cache, "key", key)
    require_cache_dtype(fmt, "value_cache", value_cache, "value", value)
    encode = row_encoder(fmt, {"k_scale": k_scale, "v_scale": v_scale}, preset, fp8_knobs,
                         (heads, head_size))
    plan = plan_slots("slot_mapping", slot_mapping, num_blocks * block_size, padding=padding,
                      duplicates=duplicates)

    slot_axes = (0, 1) if layout == "NHD" else (0, 2)
    return tuple(write_rows(cache.copy(), plan, encode[scale_name](source[plan.positions]),
                            slot_axes=slot_axes)
                 for cache, source, scale_name in ((key_cache, key, "k_scale"),
                                                   (value_cache, value, "v_scale")))
