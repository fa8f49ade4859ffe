"""Where a validating CUDA writer's extra time at small N goes (run on a GPU; prints a table, writes JSON).

At N <= 256 a validating CUDA call launches one kernel, as its ``validate=False`` twin does: its
full build, in which every block scans the index before its first store. What the call adds can be
host time (the binding's check plan, the stream-capture query it makes) or GPU time (the scan
before the stores). This times, in one process, alternated round by round (eager, inputs rotated
past the L2; oracle.bench.timers.alternated):

- the op called positionally through its ``default`` overload with ``validate`` 0 and 1, eagerly
  and replayed from a CUDA graph (where no call is checked: the graph rows show what the replay
  costs, the eager ones what a call costs);
- the host's time to issue the same calls, back to back without waiting (time.perf_counter around
  ``--calls`` calls, then one synchronization outside the timed part);
- torch's stream-capture query alone (``torch._C._cuda_isCurrentStreamCapturing``), which the
  binding makes on every validating call.

    python benchmarks/small_n_check_cost.py [--sizes 1,16,64] [--rounds 9] [--calls 2000] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from oracle.bench.timers import alternated, cold_sets
from oracle.bench.workloads import make_workload


def issue_us(fn, args: tuple, calls: int) -> float:
    """Host microseconds per call to issue ``calls`` calls without waiting for the GPU."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn(*args)
    seconds = time.perf_counter() - start
    torch.cuda.synchronize()
    return seconds / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--json")
    opts = parser.parse_args()
    from oracle.kernels import cuda

    lib = cuda.ops()
    query = torch._C._cuda_isCurrentStreamCapturing
    rows = []
    for _ in range(3):
        issue_us(query, (), opts.calls)
    capture_query = statistics.median(issue_us(query, (), opts.calls) for _ in range(opts.rounds))
    print(f"torch._C._cuda_isCurrentStreamCapturing(): {capture_query:.3f} us per call")
    ops = {
        "store_cache": lambda check: (lambda k, v, kc, vc, loc: lib.store_cache.default(
            k, v, kc, vc, loc, cuda.MAX_VEC, True, check, None)),
        "set_mla_kv_buffer": lambda check: (lambda buf, loc, nope, rope: lib.set_mla_kv_buffer.default(
            buf, loc, nope, rope, cuda.MLA_PATH, cuda.MAX_VEC, True, check, None)),
    }
    for op, make in ops.items():
        for n in [int(s) for s in opts.sizes.split(",")]:
            work = make_workload(op, "bf16", n, device="cuda")
            sets = cold_sets(op, "bf16", n, work)
            variants = {f"validate={c}": ((lambda: None), make(c)) for c in (0, 1)}
            eager = alternated(variants, work.args, "cuda", sets, rounds=opts.rounds)
            graph = alternated(variants, work.args, "cuda", sets, rounds=opts.rounds, graph=True)
            issue = {label: [] for label in variants}
            for _ in range(opts.rounds):
                for label, (_, fn) in variants.items():
                    issue[label].append(issue_us(fn, work.args, opts.calls))
            row = {"op": op, "n": n}
            for label in variants:
                row[label] = {"eager": eager[label], "graph": graph[label], "issue": issue[label]}
            paired = {how: statistics.median(a - b for a, b in zip(row["validate=1"][how], row["validate=0"][how]))
                      for how in ("eager", "graph", "issue")}
            row["validate=1 - validate=0, round by round"] = paired
            rows.append(row)
            print(f"{op} N={n}: " + "; ".join(
                f"{how} {statistics.median(row['validate=0'][how]):.2f} / {statistics.median(row['validate=1'][how]):.2f}"
                f" us (+{paired[how]:.2f})" for how in ("eager", "graph", "issue")))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": opts.rounds,
                       "calls": opts.calls, "capture_query_us": capture_query, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
