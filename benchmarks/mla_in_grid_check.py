"""The validating CUDA MLA writer's slot check inside its own grid against the check grid (run on a GPU).

A validating ``cuda.set_mla_kv_buffer`` call on an index longer than 256 entries either launches a
check grid before the writer (``mla_check_in_grid`` 0), or, where one pass of a resident grid holds
the call (``ops().mla_checked_rows(1152)`` rows; 7508 on the H100), checks inside the writer's own
grid, which meets at a grid barrier before its first store (``mla_check_in_grid`` 1, the default;
``csrc/mla_checked.cu``). Each size is timed eagerly with inputs rotated past the L2 (oracle bench's
timer, without a graph), both settings and the ``validate=False`` writer alternated round by round
in one process, so a host's drift hits them alike; the table gives each one's median over the
rounds. Past the one-pass size both settings take the check grid (the last size shows that).

    python benchmarks/mla_in_grid_check.py [--sizes 512,1024,4096,7000,16384] [--rounds 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools

from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.kernels import check_reuse, cuda

LABELS = ("in_grid", "check_grid", "unchecked")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,1024,4096,7000,16384")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    check_reuse.set_enabled(False)  # the checks compared here run on every call
    tune = cuda.ops().tune
    default = tune("mla_check_in_grid", 1)
    print(f"one pass holds {cuda.ops().mla_checked_rows(1152)} rows of 1152 bytes")
    print(f"{'N':>6s} {'in_grid':>8s} {'check_grid':>10s} {'unchecked':>9s}  (us, eager, cold)")
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            first = make_workload("set_mla_kv_buffer", "bf16", n, "cuda")
            rotation = cold_sets("set_mla_kv_buffer", "bf16", n, first)
            variants = {label: (functools.partial(tune, "mla_check_in_grid", 1 if label == "in_grid" else 0),
                                functools.partial(cuda.set_mla_kv_buffer, validate=label != "unchecked"))
                        for label in LABELS}
            times = alternated(variants, first.args, "cuda", rotation, args.rounds)
            med = medians(times)
            rows.append({"n": n, "median_us": med, "samples_us": times})
            print(f"{n:6d} {med['in_grid']:8.2f} {med['check_grid']:10.2f} {med['unchecked']:9.2f}", flush=True)
    finally:
        tune("mla_check_in_grid", default)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
