"""The validating CUDA MLA writer's slot check inside its own grid against the check grid (run on a GPU).

A validating ``cuda.set_mla_kv_buffer`` call on an index longer than 256 entries either launches a
check grid before the writer (``mla_check_in_grid`` 0), or, where one pass of a resident grid holds
the call, checks inside the writer's own grid, which meets at a grid barrier before its first store
(``csrc/mla_checked.cu``), in one of two shapes: the register pass (``mla_check_in_grid`` 1; a
thread holds a 16-byte chunk and the slot of each of 4 rows: 7508 rows of 1152 bytes on the H100)
or the wave (2; a block holds whole rows, a thread 9 chunks, the block the rows' slots in shared
memory: 16896 rows). Each size is timed eagerly with inputs rotated past the L2 (oracle bench's
timer, without a graph), every setting and the ``validate=False`` writer alternated round by round
in one process, so a host's drift hits them alike; the table gives each one's median over the
rounds. Past a shape's one-pass size that setting takes the check grid.

    python benchmarks/mla_in_grid_check.py [--sizes 512,4096,7000,12000,16384] [--rounds 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools

from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.kernels import cuda

SETTINGS = {"wave": 2, "register_pass": 1, "check_grid": 0, "unchecked": 0}  # label -> mla_check_in_grid


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,4096,7000,12000,16384")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    tune = cuda.ops().tune
    default = tune("mla_check_in_grid", 1)
    try:
        for label in ("register_pass", "wave"):
            tune("mla_check_in_grid", SETTINGS[label])
            print(f"{label}: one pass holds {cuda.ops().mla_checked_rows(1152)} rows of 1152 bytes")
        print(f"{'N':>6s} " + " ".join(f"{label:>13s}" for label in SETTINGS) + "  (us, eager, cold)")
        rows = []
        for n in (int(s) for s in args.sizes.split(",")):
            first = make_workload("set_mla_kv_buffer", "bf16", n, "cuda")
            rotation = cold_sets("set_mla_kv_buffer", "bf16", n, first)
            variants = {label: (functools.partial(tune, "mla_check_in_grid", setting),
                                functools.partial(cuda.set_mla_kv_buffer, validate=label != "unchecked"))
                        for label, setting in SETTINGS.items()}
            times = alternated(variants, first.args, "cuda", rotation, args.rounds)
            med = medians(times)
            rows.append({"n": n, "median_us": med, "samples_us": times})
            print(f"{n:6d} " + " ".join(f"{med[label]:13.2f}" for label in SETTINGS), flush=True)
    finally:
        tune("mla_check_in_grid", default)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
