"""Host-side argument checks shared by the kernels that take the op calling conventions as torch
tensors (the torch baseline, the Triton wrappers and the SWA pool): one wording of every error,
and the checks run before anything is written."""

from __future__ import annotations

import torch

INDEX_DTYPES = (torch.int32, torch.int64)
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
FP8_FORMATS = ("e4m3fn", "e5m2", "e4m3fnuz", "e5m2fnuz")
KV_CACHE_DTYPES = {"auto": None, "fp8": "e4m3fn", "fp8_e4m3": "e4m3fn", "fp8_e5m2": "e5m2",
                   **{name: name for name in FP8_FORMATS}}  # format names and vLLM's spellings


def require_index(name: str, index) -> None:
    """``index`` is a 1-D int32/int64 torch tensor, else a TypeError or ValueError naming ``name``."""
    if not isinstance(index, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(index).__name__}")
    if index.dtype not in INDEX_DTYPES:
        raise TypeError(f"{name} has dtype {index.dtype}; expected torch.int32 or torch.int64")
    if index.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(index.shape)}")


def mla_rows(name: str, t: torch.Tensor, rows: int | None, what: str) -> torch.Tensor:
    """An MLA writer's ``[N, W]`` argument as 2-D: ``[N, 1, W]`` (sglang's callers pass nope and
    rope so, and the buffer may be so) becomes its ``[:, 0]`` view, whose row stride is
    ``stride(0)`` (never the unit axis's stride). ``rows``: the row count required (None: any)."""
    if t.dim() == 3 and t.shape[1] == 1:
        t = t[:, 0]
    if t.dim() != 2 or (rows is not None and t.shape[0] != rows):
        raise ValueError(f"{name} has shape {tuple(t.shape)}; expected {what}")
    return t


def mla_sources(nope: torch.Tensor, rope: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """set_mla_kv_buffer's ``cache_k_nope`` and ``cache_k_rope`` as ``[n, width]`` (see
    :func:`mla_rows`); the 2-D forms pass on a plain test, as they do on the eager host path."""
    if nope.dim() != 2 or nope.shape[0] != n:
        nope = mla_rows("cache_k_nope", nope, n, f"[{n}, width] or [{n}, 1, width]")
    if rope.dim() != 2 or rope.shape[0] != n:
        rope = mla_rows("cache_k_rope", rope, n, f"[{n}, width] or [{n}, 1, width]")
    return nope, rope


def check_rows(name: str, src: torch.Tensor, cache_name: str, cache: torch.Tensor, n: int) -> None:
    if src.dtype != cache.dtype:
        raise TypeError(f"{name} has dtype {src.dtype} but {cache_name} has dtype {cache.dtype}")
    if tuple(src.shape) != (n,) + tuple(cache.shape[1:]):
        raise ValueError(f"{name} has shape {tuple(src.shape)}; expected {(n,) + tuple(cache.shape[1:])}")


def check_scale(name: str, scale, heads: int) -> None:
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got "
                        f"{scale.dtype if isinstance(scale, torch.Tensor) else type(scale).__name__}")
    if scale.dim() != 1 or scale.numel() not in (1, heads):
        raise ValueError(f"{name} has shape {tuple(scale.shape)}; expected [1] or [{heads}] (per head)")


def check_scale_values(name: str, scale: torch.Tensor) -> None:
    """Every element of ``scale`` finite and > 0, or a ValueError naming the first other one
    (reads the values: on a GPU this synchronizes)."""
    bad = ~(torch.isfinite(scale) & (scale > 0))
    if bool(bad.any()):
        where = int(bad.nonzero()[0, 0])
        label = name if scale.numel() == 1 else f"{name}[{where}]"
        raise ValueError(f"{label} = {float(scale.reshape(-1)[where])!r} must be finite and > 0")


def check_paged_write(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype, k_scale,
                      v_scale) -> str | None:
    """Everything about a reshape_and_cache_flash call but the slot values; returns the fp8 format
    (None under "auto")."""
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of {sorted(KV_CACHE_DTYPES)}")
    fmt = KV_CACHE_DTYPES[kv_cache_dtype]
    for name, cache in (("key_cache", key_cache), ("value_cache", value_cache)):
        if cache.dim() != 4:
            raise ValueError(f"{name} must be 4-D [num_blocks, block_size, H, D], got {tuple(cache.shape)}")
        if cache.stride(-1) != 1:
            raise ValueError(f"{name} has strides {cache.stride()}; its last dimension must be contiguous")
        if fmt is not None and cache.dtype != torch.uint8:
            raise TypeError(f"{name} has dtype {cache.dtype}; kv_cache_dtype {kv_cache_dtype} stores uint8 codes")
    num_blocks, block_size, heads, _ = key_cache.shape
    if tuple(value_cache.shape[:3]) != (num_blocks, block_size, heads):
        raise ValueError(f"value_cache has shape {tuple(value_cache.shape)}; key_cache {tuple(key_cache.shape)}")
    if slot_mapping.dtype not in INDEX_DTYPES or slot_mapping.dim() != 1:
        raise TypeError(f"slot_mapping must be 1-D int32/int64, got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    num_tokens = slot_mapping.shape[0]
    for name, src, cache_name, cache in (("key", key, "key_cache", key_cache),
                                         ("value", value, "value_cache", value_cache)):
        if src.dim() != 3 or src.shape[0] < num_tokens or tuple(src.shape[1:]) != tuple(cache.shape[2:]):
            raise ValueError(f"{name} has shape {tuple(src.shape)}; expected [>= {num_tokens}, "
                             f"{', '.join(map(str, cache.shape[2:]))}] to match {cache_name}")
        if fmt is None and src.dtype != cache.dtype:
            raise TypeError(f"{name} has dtype {src.dtype} but {cache_name} has dtype {cache.dtype}")
        if fmt is not None and src.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} has dtype {src.dtype}; expected float32, float16 or bfloat16")
    if fmt is not None:
        check_scale("k_scale", k_scale, heads)
        check_scale("v_scale", v_scale, heads)
    return fmt


def check_concat_mla(kv_c, k_pe, kv_cache, slot_mapping, kv_cache_dtype, scale,
                     formats: dict) -> str | None:
    """Everything about a concat_and_cache_mla call but the slot and scale values; ``formats``
    maps the kv_cache_dtype spellings a kernel accepts besides "auto" to fp8 format names.
    Returns the fp8 format (None under "auto")."""
    if kv_cache.dim() != 3:
        raise ValueError(f"kv_cache must be 3-D [num_blocks, block_size, entry], got {tuple(kv_cache.shape)}")
    width = kv_cache.shape[2]
    if slot_mapping.dtype not in INDEX_DTYPES or slot_mapping.dim() != 1:
        raise TypeError(f"slot_mapping must be 1-D int32/int64, got {slot_mapping.dtype} {tuple(slot_mapping.shape)}")
    num_tokens = slot_mapping.shape[0]
    if kv_c.dtype != k_pe.dtype or kv_c.dtype not in FLOAT_DTYPES:
        raise TypeError(f"kv_c ({kv_c.dtype}) and k_pe ({k_pe.dtype}) must share a float dtype")
    for name, src in (("kv_c", kv_c), ("k_pe", k_pe)):
        if src.dim() != 2 or src.shape[0] < num_tokens:
            raise ValueError(f"{name} has shape {tuple(src.shape)}; expected [>= {num_tokens}, width]")
    if width != kv_c.shape[1] + k_pe.shape[1]:
        raise ValueError(f"kv_cache entries have {width} elements; expected kv_c + k_pe = "
                         f"{kv_c.shape[1] + k_pe.shape[1]}")
    if kv_cache_dtype == "auto":
        if kv_cache.dtype != kv_c.dtype:
            raise TypeError(f"kv_cache has dtype {kv_cache.dtype} but kv_c has dtype {kv_c.dtype}")
        return None
    fmt = formats.get(kv_cache_dtype) if isinstance(kv_cache_dtype, str) else None
    if fmt not in FP8_FORMATS:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not 'auto' or one of {sorted(formats)}")
    if kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache has dtype {kv_cache.dtype}; kv_cache_dtype {kv_cache_dtype} needs uint8")
    if not isinstance(scale, torch.Tensor) or scale.dtype != torch.float32 or scale.numel() != 1:
        raise TypeError(f"scale must be a float32 tensor of one element, got {scale!r}")
    return fmt


def check_translate(mapping, loc) -> None:
    """translate_full_to_swa's argument types: ``mapping`` a non-empty 1-D int32/int64 tensor,
    ``loc`` an int32/int64 tensor (no device value is read)."""
    if not isinstance(mapping, torch.Tensor) or mapping.dtype not in INDEX_DTYPES \
            or mapping.dim() != 1 or mapping.numel() == 0:
        raise TypeError(f"mapping must be a non-empty 1-D int32/int64 tensor, got "
                        f"{getattr(mapping, 'dtype', type(mapping).__name__)} "
                        f"{tuple(getattr(mapping, 'shape', ()))}")
    if not isinstance(loc, torch.Tensor) or loc.dtype not in INDEX_DTYPES:
        raise TypeError(f"loc has dtype {getattr(loc, 'dtype', type(loc).__name__)}; "
                        "expected torch.int32 or torch.int64")


def check_translate_values(mapping: torch.Tensor, loc: torch.Tensor) -> None:
    """The -1 sentinel at the end of ``mapping``, and every entry of ``loc`` -1 or inside the
    table (reads device values: a synchronization on CUDA)."""
    if int(mapping[-1]) != -1:
        raise ValueError(f"mapping[-1] = {int(mapping[-1])}; the last entry must be the -1 sentinel")
    table = mapping.numel() - 1
    bad = ((loc < 0) & (loc != -1)) | (loc >= table)
    if bad.any():
        value = int(loc[bad].reshape(-1)[0])
        raise ValueError(f"loc holds {value}: only -1 may be negative, and entries must lie in [0, {table})")
