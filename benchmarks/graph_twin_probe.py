"""Why a `.checked_index` writer replays faster from a CUDA graph than its `.unchecked` twin (run on a GPU).

Under capture the binding leaves the slot check out, so a `.checked_index` writer and its twin
launch the same kernel; what differs is the index tensor they read (the CheckedIndex's private
copy against the workload's own) and the timer's graph (its length). This times, graph-replayed
with inputs rotated past the L2 (oracle bench's timer), round by round in one process:

- ``unchecked``: ``validate=False`` on the workload's index;
- ``checked``: the writer on an index checked beforehand (inputs prepared once);
- ``unchecked_on_copy``: ``validate=False`` on the CheckedIndex's copy as a plain tensor;
- ``validating``: the validating writer on the workload's index;

and prints each timer's graph length (calls) and input sets.

    python benchmarks/graph_twin_probe.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from oracle.bench.runner import prepared
from oracle.bench.timers import CudaTimer, cold_sets, medians
from oracle.bench.workloads import make_workload
from oracle.kernels.checked_index import INDEX_ARGUMENTS
from oracle.registry import default_registry

CELLS = (("reshape_and_cache_flash", "e4m3fn", 16384), ("reshape_and_cache_flash", "auto", 16384),
         ("set_mla_kv_buffer", "bf16", 16384))


def _on_copy(args: tuple, position: int) -> tuple:
    return args[:position] + (args[position].index,) + args[position + 1:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--backends", default="cuda,triton")
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    default_registry.discover()
    kernels = default_registry.kernels
    rows = []
    for op, variant, n in CELLS:
        first = make_workload(op, variant, n, "cuda")
        rotation = cold_sets(op, variant, n, first)
        position = INDEX_ARGUMENTS[op][0]
        for backend in args.backends.split(","):
            name = f"{backend}.{op}"
            checked_fn, checked_args, checked_sets = prepared(kernels[f"{name}.checked_index"], first.args, rotation)
            unchecked = kernels[f"{name}.unchecked"].fn
            variants = {
                "unchecked": (unchecked, first.args, rotation),
                "checked": (checked_fn, checked_args, checked_sets),
                "unchecked_on_copy": (unchecked, _on_copy(checked_args, position),
                                      tuple(_on_copy(p, position) for p in checked_sets)),
                "validating": (kernels[name].fn, first.args, rotation),
            }
            timers = {label: CudaTimer(fn, a, use_graph=True, rotation=sets) for label, (fn, a, sets) in variants.items()}
            times = {label: [] for label in timers}
            for _ in range(args.rounds):
                for label, timer in timers.items():
                    times[label].append(statistics.median(timer.sample() for _ in range(3)) * 1e6)
            med = medians(times)
            shape = {label: (t.calls, t.sets, t.name) for label, t in timers.items()}
            rows.append({"kernel": name, "variant": variant, "n": n, "median_us": med, "timers": shape,
                         "samples_us": times})
            print(f"{name} [{variant}] N={n}: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
            print("   timers: " + ", ".join(f"{k} calls={c} sets={s}" for k, (c, s, _) in shape.items()),
                  flush=True)
            del timers
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
