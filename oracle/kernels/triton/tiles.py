"""How a launch splits its rows (:class:`Tile`, :func:`tile`) and which launches first ask the L2
for their source rows (:data:`PREFETCH`): the defaults measured fastest on the H100
(docs/benchmarks.md), and :data:`TUNING`, the overrides the tuning script sweeps. Changing
``PREFETCH`` or ``TUNING`` at run time is seen by the next call (the writers' launch plans are
forgotten then)."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from . import _runtime

def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def next_pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


@dataclass(frozen=True)
class Tile:
    """How a launch splits the rows: ``block_n`` rows per program, ``block_r`` row elements per
    program (the MLA writer: ``block_a`` and ``block_b`` per part), ``num_warps`` warps each."""

    block_n: int
    block_r: int
    num_warps: int
    block_a: int = 0
    block_b: int = 0


# (rows per program, warps) for N >= 1024 rows: the H100 sweep's choice (benchmarks/tune_gpu.py,
# inputs rotated past the L2; docs/benchmarks.md), within a point or two of the fastest at both
# N = 16384 and 65536 for each kernel.
# Fewer rows per program keep more programs in flight; more warps than the tile needs starve it.
# mla_write has two entries: behind set_mla_kv_buffer ("mla_write") and behind
# concat_and_cache_mla ("concat_mla": paged, maybe fp8), which (2, 4) made 2-17% slower.
LARGE_N_TILES = {"paged_write": (2, 4), "paged_write_fp8": (2, 2), "mla_write": (2, 4), "concat_mla": (2, 1)}
SMALL_N = 1024
# (rows per program, warps) below SMALL_N rows, by LARGE_N_TILES key; else one row, 4 warps. On
# the H100 (graphs, benchmarks/tune_gpu.py --sizes 1,16,64 and 64,256,512) two rows per program
# against one: equal at N = 1 and 16, faster from 64 (MLA 1.32 -> 1.23 us, .pdl 0.81 -> 0.77;
# store_cache 1.42 -> 1.36, .pdl 0.89 -> 0.82) to 512 (store_cache.pdl 1.96 -> 1.63, MLA .pdl
# 1.12 -> 0.93). The other kernels were not measured below SMALL_N.
SMALL_N_TILES = {"paged_write": (2, 4), "mla_write": (2, 4)}
# One-wave tiles, by LARGE_N_TILES key: one-warp programs taken where they fill more than
# ONE_WAVE_FILL of one wave (32 resident programs per SM on sm_90) without passing it, so every row
# is loaded at once and no partial second wave trails. mla_write's (4 rows, 1 warp): on the H100
# 15207 < N <= 16896, where it beat (2, 4) by 2-3% plainly and with PDL (N = 16384: 14.95 vs 15.35
# us, .pdl 14.35 vs 14.65); at 12288 (a 73% fill) it lost with PDL (13.1 vs 11.4 us) and at 20480
# (two waves) both ways (docs/benchmarks.md). Only measured there: the other kernels have none.
ONE_WAVE_TILES = {"mla_write": (4, 1)}
ONE_WAVE_FILL = 0.9
# Tiles for PDL launches that prefetch (PREFETCH), by LARGE_N_TILES key, in place of both tables
# above: for mla_write (4 rows, 4 warps) was the fastest of six tiles at N = 4096, 16384 and 65536
# (3.89, 13.91, 54.09 us against 4.15, 16.78, 54.61 for the plain launches' tiles; one-warp
# programs of 4 rows lose 17% when they prefetch: docs/benchmarks.md).
PDL_TILES = {"mla_write": (4, 4)}
# Overrides for benchmarks/tune_gpu.py, by LARGE_N_TILES key:
# {"block_n": ..., "num_warps": ...}; empty in normal use.
TUNING: dict = {}


def tile(n_rows: int, row: int, kernel: str = "paged_write", parts: tuple = (),
         device: torch.device | None = None, pdl_prefetch: bool = False) -> Tile:
    """A whole row per program where it fits (the next power of two of the row, each MLA part
    in its own tile), and on a GPU the rows per program measured fastest on the H100 (by N:
    SMALL_N_TILES, LARGE_N_TILES; docs/benchmarks.md; for a PDL launch that prefetches, the
    kernel's PDL_TILES entry; else on an sm_90 ``device`` its ONE_WAVE_TILES entry where it fills
    one wave), and few large programs under the interpreter, where each program is one Python
    call."""
    if _runtime.interpreting():
        return _interpreter_tile(next_pow2(n_rows), row, parts)
    shape = (LARGE_N_TILES if n_rows >= SMALL_N else SMALL_N_TILES).get(kernel, (1, 4))
    if n_rows >= SMALL_N:
        one_wave = ONE_WAVE_TILES.get(kernel)
        if pdl_prefetch and kernel in PDL_TILES:
            shape = PDL_TILES[kernel]
        elif one_wave and device is not None:
            slots = _one_warp_slots(device.index if device.index is not None else torch.cuda.current_device())
            if ONE_WAVE_FILL * slots < cdiv(n_rows, one_wave[0]) <= slots:
                shape = one_wave
    t = _gpu_tile(shape, row, parts)
    override = TUNING.get(kernel)
    if override:
        t = Tile(override.get("block_n", t.block_n), t.block_r, override.get("num_warps", t.num_warps),
                 t.block_a, t.block_b)
    return t


@functools.lru_cache(maxsize=256)
def _interpreter_tile(rows_pow2: int, row: int, parts: tuple) -> Tile:
    block_r = min(next_pow2(row), 1 << 14)
    block_n = max(1, min(rows_pow2, (1 << 16) // block_r))
    return Tile(block_n, block_r, 4, *(min(next_pow2(w), block_r) for w in parts))


@functools.lru_cache(maxsize=16)
def _one_warp_slots(index: int) -> int:
    """One-warp programs resident at once on CUDA device ``index`` if it is sm_90+ (32 per SM),
    else 0: the one-wave tile is measured on the H100 only."""
    props = torch.cuda.get_device_properties(index)
    return props.multi_processor_count * 32 if props.major >= 9 else 0


@functools.lru_cache(maxsize=256)
def _gpu_tile(shape: tuple, row: int, parts: tuple) -> Tile:
    block_r = min(next_pow2(row), 1 << 12)
    block_n, num_warps = shape
    block_n = max(1, min(block_n, 4096 // block_r))  # wide rows: one per program (registers)
    return Tile(block_n, block_r, num_warps, *(min(next_pow2(w), block_r) for w in parts))


# When the writers first ask the L2 for their source rows (``_prefetch_l2``, before the PDL wait):
# "pdl" for launches with programmatic dependent launch, where the reads then start while the
# previous kernel is still finishing; "always"; or "never". benchmarks/tune_gpu.py sweeps it.
PREFETCH = "pdl"


def prefetching(pdl: bool) -> bool:
    """Whether a launch (with programmatic dependent launch or not) prefetches, by PREFETCH."""
    return PREFETCH == "always" or (PREFETCH == "pdl" and pdl)


def prefetch_counts(pdl: bool, element_size: int, blocks_and_widths) -> dict:
    """``{"PF_SECTOR": elements per 32-byte sector, "PF_*": sectors per tile row}`` for the given
    ``(name, block, width, unit_stride)`` parts, zero (no prefetch) where ``PREFETCH`` says no,
    for an empty part or a strided one."""
    on = prefetching(pdl)
    sector = max(1, 32 // element_size)
    meta = {"PF_SECTOR": sector}
    for name, block, width, unit in blocks_and_widths:
        meta[name] = max(1, block // sector) if on and unit and width > 0 else 0
    return meta
