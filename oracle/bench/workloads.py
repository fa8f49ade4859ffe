"""The `oracle bench` workloads: one op (and fp8 variant) at one N, inputs and byte counts."""

from __future__ import annotations

from dataclasses import dataclass

import torch

HEADS, HEAD_DIM = 8, 128
MLA_NOPE, MLA_ROPE = 512, 64
BLOCK_SIZE = 16


@dataclass
class Workload:
    op: str
    variant: str  # "bf16", "auto", "e4m3fn"
    args: tuple
    caches: tuple  # indices into args of the written tensors
    bytes_read: int
    bytes_written: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


VARIANTS = {
    "store_cache": ("bf16",),
    "set_mla_kv_buffer": ("bf16",),
    "concat_and_cache_mla": ("auto", "e4m3fn"),
    "reshape_and_cache_flash": ("auto", "e4m3fn"),
    "quantize_fp8": ("e4m3fn",),
    "reshape_and_cache_block": ("mxfp8_e4m3fn", "nvfp4"),
}
BLOCKS = {"mxfp8_e4m3fn": 32, "mxfp8_e5m2": 32, "nvfp4": 16}  # elements per block scale


def _slots(n: int, num_slots: int, gen: torch.Generator, device) -> torch.Tensor:
    """n distinct random slots in [1, num_slots): slot 0 stays free, as sglang keeps it for padding,
    so kernels that skip it (reserved:0) write exactly what the others write."""
    return (torch.randperm(num_slots - 1, generator=gen)[:n] + 1).to(torch.int64).to(device)


def _randn(shape, gen, device, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * 2).to(dtype).to(device)


def _calibrated_scale(*sources: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale a dynamic calibration picks (vLLM's calculate_kv_scales): amax / 448
    (e4m3fn's max), the amax taken on the bf16 source, the division in float32."""
    if not all(s.numel() for s in sources):
        return torch.ones(1, dtype=torch.float32, device=sources[0].device)
    amax = torch.stack([s.abs().max().float() for s in sources]).max().reshape(1)
    return (amax / 448.0).to(torch.float32)


def make_workload(op: str, variant: str, n: int, device: str = "cpu", seed: int = 0) -> Workload:
    """Inputs for one timing cell; ``args`` are in the op's calling convention."""
    gen = torch.Generator().manual_seed(seed * 1000003 + n)
    bf16 = torch.bfloat16
    num_slots = max(2 * n, 64) + 1
    index_bytes = n * 8
    if op == "store_cache":
        k, v = (_randn((n, HEADS, HEAD_DIM), gen, device) for _ in range(2))
        caches = tuple(torch.zeros((num_slots, HEADS, HEAD_DIM), dtype=bf16, device=device) for _ in range(2))
        loc = _slots(n, num_slots, gen, device)
        row = HEADS * HEAD_DIM * 2
        return Workload(op, variant, (k, v, *caches, loc), (2, 3), 2 * n * row + index_bytes, 2 * n * row)
    if op == "set_mla_kv_buffer":
        nope, rope = _randn((n, MLA_NOPE), gen, device), _randn((n, MLA_ROPE), gen, device)
        buffer = torch.zeros((num_slots, MLA_NOPE + MLA_ROPE), dtype=bf16, device=device)
        loc = _slots(n, num_slots, gen, device)
        row = (MLA_NOPE + MLA_ROPE) * 2
        return Workload(op, variant, (buffer, loc, nope, rope), (0,), n * row + index_bytes, n * row)
    num_blocks = -(-num_slots // BLOCK_SIZE)
    fp8 = variant != "auto"
    cache_dtype, cache_size = (torch.uint8, 1) if fp8 else (bf16, 2)
    if op == "concat_and_cache_mla":
        kv_c, k_pe = _randn((n, MLA_NOPE), gen, device), _randn((n, MLA_ROPE), gen, device)
        cache = torch.zeros((num_blocks, BLOCK_SIZE, MLA_NOPE + MLA_ROPE), dtype=cache_dtype, device=device)
        slots = _slots(n, num_blocks * BLOCK_SIZE, gen, device)
        scale = _calibrated_scale(kv_c, k_pe)
        width = MLA_NOPE + MLA_ROPE
        return Workload(op, variant, (kv_c, k_pe, cache, slots, variant, scale), (2,),
                        n * width * 2 + index_bytes + (4 if fp8 else 0), n * width * cache_size)
    if op == "reshape_and_cache_flash":
        key, value = (_randn((n, HEADS, HEAD_DIM), gen, device) for _ in range(2))
        caches = tuple(torch.zeros((num_blocks, BLOCK_SIZE, HEADS, HEAD_DIM), dtype=cache_dtype, device=device)
                       for _ in range(2))
        slots = _slots(n, num_blocks * BLOCK_SIZE, gen, device)
        k_scale, v_scale = _calibrated_scale(key), _calibrated_scale(value)
        row = HEADS * HEAD_DIM
        return Workload(op, variant, (key, value, *caches, slots, variant, k_scale, v_scale), (2, 3),
                        2 * n * row * 2 + index_bytes + (8 if fp8 else 0), 2 * n * row * cache_size)
    if op == "quantize_fp8":
        x = _randn((n, HEADS, HEAD_DIM), gen, device)
        out = torch.zeros((n, HEADS, HEAD_DIM), dtype=torch.uint8, device=device)
        scale = _calibrated_scale(x)
        return Workload(op, variant, (out, x, scale, variant), (0,), n * HEADS * HEAD_DIM * 2 + 4,
                        n * HEADS * HEAD_DIM)
    if op == "reshape_and_cache_block":
        key, value = (_randn((n, HEADS, HEAD_DIM), gen, device) for _ in range(2))
        width = HEAD_DIM // 2 if variant == "nvfp4" else HEAD_DIM
        count = HEAD_DIM // BLOCKS[variant]
        caches = tuple(torch.zeros((num_blocks, BLOCK_SIZE, HEADS, width), dtype=torch.uint8, device=device)
                       for _ in range(2))
        scale_caches = tuple(torch.zeros((num_blocks, BLOCK_SIZE, HEADS, count), dtype=torch.uint8,
                                         device=device) for _ in range(2))
        slots = _slots(n, num_blocks * BLOCK_SIZE, gen, device)
        # NVFP4's per-tensor scale as vLLM calibrates it: 448 * 6 / amax (MX ignores it)
        k_gs, v_gs = ((448.0 * 6.0) / (_calibrated_scale(s) * 448.0) for s in (key, value))
        row = HEADS * HEAD_DIM
        return Workload(op, variant, (key, value, *caches, *scale_caches, slots, variant, k_gs, v_gs),
                        (2, 3, 4, 5), 2 * n * row * 2 + index_bytes + 8, 2 * n * HEADS * (width + count))
    raise ValueError(f"op={op!r} has no bench workload; ops: {', '.join(VARIANTS)}")
