"""Tile sweep for the block-scaled Triton writer (run on a GPU; prints one table, writes JSON).

Every cell times ``triton.reshape_and_cache_block`` (validating) and its ``.unchecked`` twin on
the `oracle bench` workload (8 heads x 128 bf16, block size 16, N = 16384 by default) eagerly,
with CUDA events around back-to-back calls rotating among input sets past the L2 (as `oracle
bench --mode eager --l2 cold` times them), median of --repeats samples, under one setting of
``block_ops.TILE_ELEMENTS`` (source elements per program, every format) and
``block_ops.NUM_WARPS``. Each
cell's caches are compared byte for byte with the torch-on-CUDA baseline's ("check"), and the
copy ceiling is measured in the same run.

    python benchmarks/tune_block.py [--tiles 2048,4096,8192] [--warps 4,8] [--sizes 16384] [--json OUT]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics

import torch

from oracle.bench import CudaTimer, cold_sets, copy_bandwidth, make_workload
from oracle.kernels.triton import _plans, block_ops
from oracle.registry import default_registry
from tune_gpu import check  # benchmarks/ is the script's directory, so on sys.path

WRITERS = ("triton.reshape_and_cache_block", "triton.reshape_and_cache_block.unchecked")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tiles", default="2048,4096,8192")
    parser.add_argument("--warps", default="4,8")
    parser.add_argument("--variants", default="mxfp8_e4m3fn,nvfp4")
    parser.add_argument("--sizes", default="16384")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json")
    opts = parser.parse_args()
    kernels = default_registry.discover().kernels
    copy_gbps = copy_bandwidth("cuda", nbytes=1 << 30)["gbps"]
    print(f"copy ceiling {copy_gbps:.1f} GB/s")
    rows = []
    for variant, n in itertools.product(opts.variants.split(","), map(int, opts.sizes.split(","))):
        workload = make_workload("reshape_and_cache_block", variant, n, "cuda")
        rotation = cold_sets(workload.op, variant, n, workload)
        baseline = kernels["torch-cuda.reshape_and_cache_block"].fn
        for tile, warps in itertools.product(map(int, opts.tiles.split(",")), map(int, opts.warps.split(","))):
            block_ops.TILE_ELEMENTS = dict.fromkeys(block_ops.TILE_ELEMENTS, tile)
            block_ops.NUM_WARPS = warps
            _plans.clear()  # a plan keeps the launch it was made with
            for name in WRITERS:
                fn = kernels[name].fn
                timer = CudaTimer(fn, workload.args, use_graph=False, rotation=rotation)
                us = statistics.median(timer.sample() for _ in range(opts.repeats)) * 1e6
                pct = 100 * workload.bytes / us / 1e3 / copy_gbps
                rows.append({"variant": variant, "n": n, "tile": tile, "warps": warps, "kernel": name, "us": us,
                             "pct_copy": pct, "check": check(fn, workload.args, baseline, workload)})
                print(f"{variant:13} N={n:6} tile {tile:5} warps {warps} {name:42} {us:8.2f} us {pct:5.1f}%  "
                      f"{rows[-1]['check']}", flush=True)
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_gbps": copy_gbps, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
