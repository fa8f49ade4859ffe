"""Launches for Nsight Compute: the MLA writers at one N, a few times each, to compare per-kernel
duration, DRAM traffic and occupancy outside any graph (run on a GPU under ncu):

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,\
sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size \
        python benchmarks/profile_mla.py [--n 16384] [--calls 5]

ncu flushes the caches before every profiled kernel (--cache-control all, its default), so each
launch reads cold, as `oracle bench` times them.
"""

from __future__ import annotations

import argparse

import torch

from oracle.bench import make_workload
from oracle.registry import default_registry

KERNELS = ("cuda.set_mla_kv_buffer", "cuda.set_mla_kv_buffer.unchecked", "triton.set_mla_kv_buffer",
           "triton.set_mla_kv_buffer.unchecked")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=16384)
    parser.add_argument("--calls", type=int, default=5)
    args = parser.parse_args()
    kernels = default_registry.discover().kernels
    work = make_workload("set_mla_kv_buffer", "bf16", args.n, "cuda")
    direct = lambda buf, loc, nope, rope: torch.ops.kv_oracle_cuda.set_mla_kv_buffer(buf, loc, nope, rope, "direct")  # noqa: E731
    calls = [(name, kernels[name].fn) for name in KERNELS] + [("cuda direct", direct)]
    for name, fn in calls:
        for _ in range(args.calls):
            fn(*work.args)
        torch.cuda.synchronize()
        print(f"launched {name} x{args.calls}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
