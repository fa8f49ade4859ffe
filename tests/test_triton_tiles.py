"""The Triton writers' launch shapes (:mod:`oracle.kernels.triton.tiles`), decided on the host from
a mocked device (no GPU needed)."""

import torch

from oracle.kernels.triton import _runtime, tiles


def test_mla_tile_fills_one_wave_where_it_fits(monkeypatch):
    """On an sm_90 device (132 SMs here, 32 one-warp programs each) mla_write takes the one-wave
    tile exactly where its programs fill 90-100% of one wave; elsewhere, on other kernels, without
    a device or on an older GPU, the sweep's tile."""
    monkeypatch.setattr(_runtime, "interpreting", lambda: False)
    slots = 132 * 32
    monkeypatch.setattr(tiles, "_one_warp_slots", lambda index: slots)
    dev = torch.device("cuda", 0)

    def shape(n, kernel="mla_write", device=dev):
        t = tiles.tile(n, 512, kernel, (512, 64) if "mla" in kernel else (), device)
        return t.block_n, t.num_warps

    rows = tiles.ONE_WAVE_TILES["mla_write"][0]
    first = int(tiles.ONE_WAVE_FILL * slots) * rows + 1  # the first N whose programs pass the fill
    for n in (first, 16384, slots * rows):
        assert shape(n) == tiles.ONE_WAVE_TILES["mla_write"], n
    for n in (first - rows, 12288, slots * rows + 1, 65536):
        assert shape(n) == tiles.LARGE_N_TILES["mla_write"], n
    assert shape(512) == tiles.SMALL_N_TILES["mla_write"]
    assert shape(64, "paged_write") == tiles.SMALL_N_TILES["paged_write"]
    assert shape(64, "concat_mla") == (1, 4)  # not measured at small N: one row, 4 warps
    assert shape(16384, device=None) == tiles.LARGE_N_TILES["mla_write"]
    assert shape(16384, "paged_write") == tiles.LARGE_N_TILES["paged_write"]
    assert shape(16384, "concat_mla") == tiles.LARGE_N_TILES["concat_mla"]  # the same kernel, paged
    monkeypatch.setattr(tiles, "_one_warp_slots", lambda index: 0)  # before sm_90
    assert shape(16384) == tiles.LARGE_N_TILES["mla_write"]
    monkeypatch.setattr(tiles, "_one_warp_slots", lambda index: slots)
    for n in (4096, 16384, 65536):  # a PDL launch that prefetches takes its own tile, one wave or not
        t = tiles.tile(n, 512, "mla_write", (512, 64), dev, pdl_prefetch=True)
        assert (t.block_n, t.num_warps) == tiles.PDL_TILES["mla_write"], n
    t = tiles.tile(16384, 512, "concat_mla", (512, 64), dev, pdl_prefetch=True)
    assert (t.block_n, t.num_warps) == tiles.LARGE_N_TILES["concat_mla"]  # not measured: unchanged

