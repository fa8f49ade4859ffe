"""The validating CUDA MLA writer's slot check inside its own grid against the check grid (run on a GPU).

A validating ``cuda.set_mla_kv_buffer`` call on an index longer than 256 entries either launches a
check grid before the writer (``mla_check_in_grid`` 0), or, where one pass of a resident grid holds
the call (``ops().mla_checked_rows(1152)`` rows), checks inside the writer's own grid, which meets
at a grid barrier before its first store (``csrc/mla_checked.cu``): with each thread's rows of that
pass in registers (``mla_check_in_grid`` 1; 7508 rows on the H100) or in registers and shared
memory (2), the grid launched cooperative or plainly (``mla_check_cooperative``). Each size is
timed eagerly with inputs rotated past the L2 (oracle bench's timer, without a graph), every
setting and the ``validate=False`` writer alternated round by round in one process, so a host's
drift hits them alike; the table gives each one's median over the rounds. Past a setting's
one-pass size it takes the check grid.

    python benchmarks/mla_in_grid_check.py [--sizes 512,4096,7000,12000,16384,24000] [--rounds 9] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools

from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.kernels import cuda

# label: (mla_check_in_grid, mla_check_cooperative), or None for the validate=False writer
SETTINGS = {"registers": (1, 1), "registers_plain": (1, 0), "shared": (2, 1), "check_grid": (0, 1),
            "unchecked": None}
KNOBS = ("mla_check_in_grid", "mla_check_cooperative")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="512,4096,7000,12000,16384,24000")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    tune = cuda.ops().tune
    defaults = {knob: tune(knob, 1) for knob in KNOBS}

    def setting(values) -> None:
        for knob, value in zip(KNOBS, values or (defaults[k] for k in KNOBS)):
            tune(knob, value)

    for mode in (1, 2):
        tune("mla_check_in_grid", mode)
        print(f"mla_check_in_grid {mode}: one pass holds {cuda.ops().mla_checked_rows(1152)} rows of 1152 bytes")
    print(f"{'N':>6s} " + " ".join(f"{label:>15s}" for label in SETTINGS) + "  (us, eager, cold)")
    rows = []
    try:
        for n in (int(s) for s in args.sizes.split(",")):
            first = make_workload("set_mla_kv_buffer", "bf16", n, "cuda")
            rotation = cold_sets("set_mla_kv_buffer", "bf16", n, first)
            variants = {label: (functools.partial(setting, values),
                                functools.partial(cuda.set_mla_kv_buffer, validate=values is not None))
                        for label, values in SETTINGS.items()}
            times = alternated(variants, first.args, "cuda", rotation, args.rounds)
            med = medians(times)
            rows.append({"n": n, "median_us": med, "samples_us": times})
            print(f"{n:6d} " + " ".join(f"{med[label]:15.2f}" for label in SETTINGS), flush=True)
    finally:
        setting(None)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
