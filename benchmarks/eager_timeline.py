"""Where an eager call's time goes on the GPU (run on a GPU; prints one table, writes JSON).

`oracle bench --mode eager` gives one figure per call: the time between CUDA events around a loop
of back-to-back calls. This splits that figure. For each kernel and N it runs the same loop as the
eager timer (inputs rotated past the L2) three ways:

- ``host``: time.perf_counter around the loop, no synchronization inside it: what the host spends
  issuing one call (if it is longer than the GPU's work, the GPU waits for the host);
- ``eager``: CUDA events around the loop, as `oracle bench` times it;
- under torch.profiler (CUPTI), every kernel the calls launched, with its start and end on the GPU:
  per call, the kernels (name, mean duration), the GPU's busy time, and the idle time between the
  calls' kernels (a gap: the GPU had nothing to run, because the host was late or a dependency
  was being resolved).

    python benchmarks/eager_timeline.py [--kernels cuda.set_mla_kv_buffer,...] [--op set_mla_kv_buffer]
        [--variant bf16] [--sizes 1,16384] [--calls 400] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections import defaultdict

import torch
from torch.autograd import DeviceType

from oracle.bench.timers import cold_sets
from oracle.bench.workloads import make_workload
from oracle.registry import default_registry


def loop(fn, sets, calls: int) -> None:
    for i in range(calls):
        fn(*sets[i % len(sets)])


def host_and_eager(fn, sets, calls: int) -> tuple[float, float]:
    """(host us per call, event-timed us per call) of ``calls`` back-to-back calls."""
    loop(fn, sets, 20)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    t0 = time.perf_counter()
    start.record()
    loop(fn, sets, calls)
    end.record()
    host = time.perf_counter() - t0
    end.synchronize()
    return host / calls * 1e6, start.elapsed_time(end) / calls * 1e3


def kernel_timeline(fn, sets, calls: int) -> dict:
    """Per-call GPU figures from the CUPTI kernel records of ``calls`` calls."""
    loop(fn, sets, 20)
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        loop(fn, sets, calls)
        torch.cuda.synchronize()
    kernels = sorted(((e.time_range.start, e.time_range.end, e.name) for e in prof.events()
                      if e.device_type == DeviceType.CUDA), key=lambda k: k[0])
    if not kernels:
        return {"kernels": {}}
    per_name = defaultdict(list)
    for s, e, name in kernels:
        per_name[name[:80]].append(e - s)
    busy, gaps, last_end = 0.0, [], kernels[0][0]
    for s, e, _ in kernels:
        busy += max(0.0, e - max(s, last_end))
        if s > last_end:
            gaps.append(s - last_end)
        last_end = max(last_end, e)
    span = last_end - kernels[0][0]
    return {
        "span_us_per_call": span / calls,
        "busy_us_per_call": busy / calls,
        "idle_us_per_call": sum(gaps) / calls,
        "launches_per_call": len(kernels) / calls,
        "kernels": {name: {"count": len(d), "mean_us": statistics.fmean(d), "median_us": statistics.median(d)}
                    for name, d in per_name.items()},
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--op", default="set_mla_kv_buffer")
    parser.add_argument("--variant", default="bf16")
    parser.add_argument("--kernels", default="", help="comma-separated kernel names (default: every CUDA "
                        "and Triton kernel of the op)")
    parser.add_argument("--sizes", default="1,16384")
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    registry = default_registry.discover()
    names = [n for n in args.kernels.split(",") if n] or [
        k.name for k in registry.select(op=args.op) if k.contract.backend in ("cuda", "triton")
        and k.unavailable() is None]
    rows = []
    for n in (int(s) for s in args.sizes.split(",")):
        first = make_workload(args.op, args.variant, n, "cuda")
        sets = (first.args,) + cold_sets(args.op, args.variant, n, first)
        for name in names:
            fn = registry.kernels[name].fn
            host, eager = host_and_eager(fn, sets, args.calls)
            timeline = kernel_timeline(fn, sets, args.calls)
            rows.append({"kernel": name, "n": n, "host_us": host, "eager_us": eager, **timeline})
            kernels = "; ".join(f"{k[:40]} {v['median_us']:.2f}" for k, v in timeline["kernels"].items())
            print(f"{name:42s} N={n:6d} host {host:6.2f} eager {eager:6.2f} | gpu busy "
                  f"{timeline.get('busy_us_per_call', 0):6.2f} idle {timeline.get('idle_us_per_call', 0):6.2f} "
                  f"launches {timeline.get('launches_per_call', 0):.1f} | {kernels}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "op": args.op,
                       "variant": args.variant, "calls": args.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
