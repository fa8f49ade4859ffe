"""Which build of a CUDA writer kernel should a launch take? Times the lean builds against the full one (run on a GPU).

Each CUDA writer kernel is built three ways (CheckCode in csrc/slot_check.cuh): without any slot-check
code, reading the verdict of an index checked beforehand and nothing more, and with the full check
(the scan of a short index, and the first row loaded beside the check). The full build keeps more
registers (80 against 56-64 a thread for the dense 16-byte paged kernels, 64 against 37-40 for MLA
direct), so the lean builds fit more blocks per SM. Two knobs pick the build, per kernel family
(bit 0 the paged-row kernels: store_cache, the paged copy and fp8 writes; bit 1 MLA direct):

- ``lean_unchecked``: a launch that checks nothing (``validate=False``, or replayed from a CUDA
  graph, where the check is left out) takes the build without check code, or the full build with
  its check off;
- ``lean_verdict``: a launch on an index checked beforehand (``oracle.kernels.check_index``) takes
  the verdict-only build, or the full one.

Each cell times ``.unchecked`` both ways (eager and graph-replayed) and ``.checked_index`` both
ways (eager; under capture it checks nothing, as ``.unchecked`` does), with inputs rotated past the
L2 (oracle bench's timer), alternated round by round in one process.

    python benchmarks/lean_kernels.py [--sizes 1,64,4096,16384] [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse

from oracle.bench.runner import prepared
from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.registry import default_registry

CELLS = (("cuda.store_cache", "bf16", 1), ("cuda.reshape_and_cache_flash", "auto", 1),
         ("cuda.reshape_and_cache_flash", "e4m3fn", 1), ("cuda.set_mla_kv_buffer", "bf16", 2))
KNOBS = ("lean_unchecked", "lean_verdict")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1,64,4096,16384")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    registry = default_registry.discover()
    from oracle.kernels import cuda
    tune = cuda.ops().tune
    defaults = {knob: tune(knob, 3) for knob in KNOBS}

    def setting(knob: str, bit: int, lean: bool):
        return lambda: tune(knob, 3 if lean else 3 & ~bit)

    rows = []
    print(f"{'kernel':44s} {'variant':7s} {'N':>6s} {'mode':6s} {'lean':>7s} {'full':>7s}  (us, inputs cold)")
    try:
        for name, variant, bit in CELLS:
            for path, knob, modes in ((".unchecked", "lean_unchecked", ("eager", "graph")),
                                      (".checked_index", "lean_verdict", ("eager",))):
                kernel = registry.kernels[name + path]
                for n in (int(s) for s in args.sizes.split(",")):
                    first = make_workload(kernel.contract.op, variant, n, "cuda")
                    # a .checked_index writer: its index checked once, outside the timed calls, as a step does
                    fn, call_args, sets = prepared(kernel, first.args,
                                                   cold_sets(kernel.contract.op, variant, n, first))
                    for mode in modes:
                        variants = {"lean": (setting(knob, bit, True), fn),
                                    "full": (setting(knob, bit, False), fn)}
                        times = alternated(variants, call_args, "cuda", sets, args.rounds, graph=mode == "graph")
                        med = medians(times)
                        rows.append({"kernel": kernel.name, "knob": knob, "variant": variant, "n": n, "mode": mode,
                                     "median_us": med, "samples_us": times})
                        print(f"{kernel.name:44s} {variant:7s} {n:6d} {mode:6s} {med['lean']:7.2f} "
                              f"{med['full']:7.2f}", flush=True)
    finally:
        for knob, value in defaults.items():
            tune(knob, value)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
