"""The CUDA writers that check nothing: lean kernels or the checking ones with the check off? (run on a GPU)

A CUDA writer called with ``validate=False``, or replayed from a CUDA graph (where the binding
leaves the slot check out), checks no slot. It can launch the kernel instantiated without the
check's code, which keeps fewer registers (80 against 56-60 a thread for the dense 16-byte paged
kernels, 64 against 37-39 for MLA direct) and so fits more blocks per SM, or the checking kernel
with its check switched off. The switch is ``torch.ops.kv_oracle_cuda.tune("lean_unchecked",
bits)``: bit 0 the paged-row kernels (store_cache, the paged copy and fp8 writes), bit 1 MLA
direct. Each cell times the ``.unchecked`` writer both ways, eagerly and replayed from a graph,
with inputs rotated past the L2 (oracle bench's timer), alternated round by round in one process.

    python benchmarks/lean_unchecked.py [--sizes 1,64,4096,16384] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse

from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.registry import default_registry

CELLS = (("cuda.store_cache", "bf16", 1), ("cuda.reshape_and_cache_flash", "auto", 1),
         ("cuda.reshape_and_cache_flash", "e4m3fn", 1), ("cuda.set_mla_kv_buffer", "bf16", 2))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,64,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    registry = default_registry.discover()
    from oracle.kernels import cuda
    tune = cuda.ops().tune
    default = tune("lean_unchecked", 3)
    rows = []
    print(f"{'kernel':34s} {'variant':7s} {'N':>6s} {'mode':6s} {'lean':>7s} {'checking':>9s}  (us, inputs cold)")
    try:
        for name, variant, bit in CELLS:
            kernel = registry.kernels[name + ".unchecked"]
            for n in (int(s) for s in args.sizes.split(",")):
                first = make_workload(kernel.contract.op, variant, n, "cuda")
                rotation = cold_sets(kernel.contract.op, variant, n, first)
                for mode in ("eager", "graph"):
                    variants = {"lean": (lambda: tune("lean_unchecked", 3), kernel.fn),
                                "checking": (lambda b=bit: tune("lean_unchecked", 3 & ~b), kernel.fn)}
                    times = alternated(variants, first.args, "cuda", rotation, args.rounds, graph=mode == "graph")
                    med = medians(times)
                    rows.append({"kernel": kernel.name, "variant": variant, "n": n, "mode": mode,
                                 "median_us": med, "samples_us": times})
                    print(f"{kernel.name:34s} {variant:7s} {n:6d} {mode:6s} {med['lean']:7.2f} "
                          f"{med['checking']:9.2f}", flush=True)
    finally:
        tune("lean_unchecked", default)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
