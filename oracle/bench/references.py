"""What every bench cell is compared with besides the registered kernels: plain ``index_put_``
(the op in torch with no checks, as an engine's fallback writes it), the seed's baseline MLA
writer, and peers' writers loaded from their own source files (``--peer-file``).

Each reference is a ``(name, fn)`` with the op's calling convention
(:mod:`oracle.kernels.torch_native`), timed and checked like a kernel.
"""

from __future__ import annotations

import functools
from pathlib import Path

import torch

from .. import peers

FP8_TORCH = {"e4m3fn": "float8_e4m3fn", "e5m2": "float8_e5m2"}


# ---------------------------------------------------------------- index_put_, unchecked

def _codes(x: torch.Tensor, scale: torch.Tensor, variant: str) -> torch.Tensor:
    return (x.float() / scale.reshape(-1, 1) if scale.numel() > 1 else x.float() / scale).to(
        getattr(torch, FP8_TORCH[variant])).view(torch.uint8)


def index_put(op: str):
    """The op as plain ``index_put_`` (plus torch's cast for fp8), no argument or slot checks: the
    cost of the write in torch itself. None for an op without an index."""
    if op == "store_cache":
        def store(k, v, k_cache, v_cache, loc):
            k_cache.index_put_((loc,), k)
            v_cache.index_put_((loc,), v)
        return store
    if op == "set_mla_kv_buffer":
        def mla(kv_buffer, loc, nope, rope):
            kv_buffer.index_put_((loc,), torch.cat((nope, rope), -1))
        return mla
    if op == "reshape_and_cache_flash":
        def paged(key, value, key_cache, value_cache, slots, variant, k_scale, v_scale):
            for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
                rows = src if variant == "auto" else _codes(src, scale, variant)
                cache.view(-1, *cache.shape[2:]).index_put_((slots,), rows)
        return paged
    if op == "concat_and_cache_mla":
        def concat(kv_c, k_pe, cache, slots, variant, scale):
            rows = torch.cat((kv_c, k_pe), -1)
            cache.view(-1, cache.shape[-1]).index_put_((slots,), rows if variant == "auto" else _codes(rows, scale, variant))
        return concat
    return None


# ---------------------------------------------------------------- the seed's baseline MLA writer

_seed_kernel = None


def seed_mla_writer():
    """set_mla_kv_buffer as the seed report describes its baseline: a 1-D Triton kernel, BLOCK=128,
    grid ``(N, cdiv(nope + rope, 128))``, each program one 128-element slice of one row, launched
    through ``kernel[grid]``. Written here from that description (CUDA + triton only)."""
    global _seed_kernel
    if _seed_kernel is None:
        import triton
        import triton.language as tl

        @triton.jit
        def seed_set_mla_kv_buffer(buf_ptr, loc_ptr, nope_ptr, rope_ptr, buf_stride, nope_stride, rope_stride,
                                   nope_dim, rope_dim, BLOCK: tl.constexpr):
            row = tl.program_id(0)
            offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
            loc = tl.load(loc_ptr + row).to(tl.int64)
            is_nope = offs < nope_dim
            is_rope = (offs >= nope_dim) & (offs < nope_dim + rope_dim)
            nope = tl.load(nope_ptr + row * nope_stride + offs, mask=is_nope)
            rope = tl.load(rope_ptr + row * rope_stride + (offs - nope_dim), mask=is_rope)
            tl.store(buf_ptr + loc * buf_stride + offs, tl.where(is_nope, nope, rope), mask=is_nope | is_rope)

        _seed_kernel = seed_set_mla_kv_buffer
    kernel = _seed_kernel

    def seed(kv_buffer, loc, nope, rope):
        n = loc.shape[0]
        width = nope.shape[1] + rope.shape[1]
        kernel[(n, -(-width // 128))](kv_buffer, loc, nope, rope, kv_buffer.stride(0), nope.stride(0), rope.stride(0),
                                      nope.shape[1], rope.shape[1], BLOCK=128)
    return seed


# ---------------------------------------------------------------- peers, from their own files

def _fp8_view(cache: torch.Tensor, variant: str) -> torch.Tensor:
    return cache if variant == "auto" else cache.view(getattr(torch, FP8_TORCH[variant]))


def load_peers(path: str) -> list[tuple[str, str, object]]:
    """``(name, op, fn)`` for each writer found in the Python file ``path``, adapted to our
    calling convention: sglang's ``launch_reshape_and_cache_flash`` and vLLM's
    ``triton_reshape_and_cache_flash``. The file is loaded as it is, by path."""
    module = peers.load_module(path, "--peer-file")
    stem = Path(path).stem
    found = []
    if hasattr(module, "launch_reshape_and_cache_flash"):
        launch = module.launch_reshape_and_cache_flash

        def sglang(key, value, key_cache, value_cache, slots, variant, k_scale, v_scale):
            scaled = variant != "auto"
            launch(key, value, _fp8_view(key_cache, variant), _fp8_view(value_cache, variant), slots, None,
                   k_scale if scaled else None, v_scale if scaled else None)
        found.append((f"sglang.{stem}", "reshape_and_cache_flash", sglang))
    if hasattr(module, "triton_reshape_and_cache_flash"):
        write = module.triton_reshape_and_cache_flash

        def vllm(key, value, key_cache, value_cache, slots, variant, k_scale, v_scale):
            write(key, value, key_cache, value_cache, slots, "auto" if variant == "auto" else "fp8", k_scale, v_scale)
        found.append((f"vllm.{stem}", "reshape_and_cache_flash", vllm))
    if not found:
        raise ValueError(f"--peer-file {path!r} defines neither launch_reshape_and_cache_flash (sglang) nor "
                         "triton_reshape_and_cache_flash (vLLM)")
    return found


PLAIN = ".plain"  # a bench-only suffix: the registered writer launched without PDL


def kernel_fn(kernels: dict, name: str):
    """The function of registered kernel ``name``; ``<name>.plain`` is ``<name>`` called with
    ``pdl=False`` (the GPU writers launch with programmatic dependent launch by default; the tuning
    scripts time the plain launch beside it)."""
    if name.endswith(PLAIN):
        return functools.partial(kernels[name[:-len(PLAIN)]].fn, pdl=False)
    return kernels[name].fn
