"""Launch-parameter sweep for the GPU kernels (run on a GPU; prints one table, writes JSON).

Every cell times one kernel on the `oracle bench` workload (oracle.bench.make_workload: 2 KiB bf16
rows for MHA, 512 + 64 bf16 for MLA, random distinct slots in a cache twice the batch) with CUDA
events over a CUDA graph of back-to-back calls rotating among input sets that span 4x the L2
(oracle.bench.cold_sets), median of --repeats samples, next to the copy
ceiling measured in the same run (a 1 GiB ``copy_``, bytes read + written). Each cell's caches are
compared byte for byte with the torch-on-CUDA baseline's ("check").

- Triton: rows per program (``block_n``) x ``num_warps`` for the three kernels, through
  ``oracle.kernels.triton.tiles.TUNING`` (the writers' default launch, with PDL on sm_90+; with
  ``--plain`` also the plain launches, ``pdl=False``).
- CUDA: the ``kv_oracle_cuda::tune`` knobs: ``mla_rows`` (rows a warp stages per iteration on the
  TMA path) x ``mla_warps`` (warps per block), ``mla_evict_first`` (L2 evict-first bulk stores),
  ``mla_grid`` (blocks per SM, -1 one warp per row), the direct MLA path x ``mla_warps``, both paths
  launched plainly and with PDL, and
  ``copy_grid`` / ``fp8_grid`` for the copy and fp8 kernels. Knobs not named in a row keep their defaults.
  ``--knobs 'mla_prefetch=0,2;mla_grid=-1,0'`` instead sweeps exactly those combinations on every CUDA
  writer (both MLA paths), plainly and with PDL, next to Triton's PDL and plain launches with
  and without their L2 prefetches (``tiles.PREFETCH``).

The defaults in ``oracle/kernels/triton/tiles.py`` (``tile``) and ``csrc/kv_cuda.h``
(``LaunchTuning``) come from this sweep; docs/benchmarks.md records the run.

    python benchmarks/tune_gpu.py [--json OUT] [--repeats 15] [--only triton|cuda] [--sizes 16384,65536]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics
from unittest import mock

import torch

from oracle.bench import CudaTimer, cold_sets, copy_bandwidth, make_workload
from oracle.bench.references import kernel_fn
from oracle.registry import default_registry

SIZES = (16384, 65536)
TRITON = {  # triton kernel tuned -> (op, variant) workloads that launch it
    "mla_write": (("set_mla_kv_buffer", "bf16"),),
    "concat_mla": (("concat_and_cache_mla", "auto"), ("concat_and_cache_mla", "e4m3fn")),
    "paged_write": (("store_cache", "bf16"),),
    "paged_write_fp8": (("reshape_and_cache_flash", "e4m3fn"), ("quantize_fp8", "e4m3fn")),
}
BLOCK_N = (1, 2, 4, 8)
WARPS = (1, 2, 4, 8)


def time_us(fn, workload, n, repeats: int, sorted_slots: bool = False) -> float:
    rotation = cold_sets(workload.op, workload.variant, n, workload)
    if sorted_slots:  # keep every set's slots ascending (set_mla_kv_buffer: args[1])
        for args in rotation:
            args[1].copy_(args[1].sort().values)
    timer = CudaTimer(fn, workload.args, use_graph=True, rotation=rotation)
    return statistics.median(timer.sample() for _ in range(repeats)) * 1e6


def check(fn, args, baseline, workload) -> str:
    """``ok`` when ``fn`` writes the baseline's caches byte for byte, else the differing bytes."""
    ours = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    theirs = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
    fn(*ours)
    baseline(*theirs)
    diff = sum(int((ours[i].view(torch.uint8) != theirs[i].view(torch.uint8)).sum()) for i in workload.caches)
    return "ok" if diff == 0 else f"DIFF {diff}"


def cell(what, config, workload, n, fn, baseline, copy_gbps, repeats, sorted_slots=False):
    args = workload.args
    us = time_us(fn, workload, n, repeats, sorted_slots)
    gbps = workload.bytes / us / 1e3
    row = {"kernel": what, "config": dict(config), "op": workload.op, "variant": workload.variant, "n": n,
           "us": us, "gbps": gbps, "pct_copy": 100 * gbps / copy_gbps, "check": check(fn, args, baseline, workload)}
    print(f"{what:28} {workload.op:24} {workload.variant:6} {json.dumps(config):36} "
          f"{us:9.2f} us {gbps:8.1f} GB/s {row['pct_copy']:6.1f}%  {row['check']}", flush=True)
    return row


def sweep_triton(kernels, copy_gbps, repeats, sizes=SIZES, only=None, suffixes=("",), block_ns=BLOCK_N,
                 warps_=WARPS, prefetch=("pdl",)):
    from oracle.kernels.triton import tiles

    rows = []
    for name, workloads in TRITON.items():
        if only and name not in only:
            continue
        for (op, variant), n, suffix in itertools.product(workloads, sizes, suffixes):
            w = make_workload(op, variant, n, "cuda")
            baseline = kernels[f"torch-cuda.{op}"].fn
            if f"triton.{op}" not in kernels or (suffix and op == "quantize_fp8"):  # quantize_fp8 takes no pdl
                continue
            fn = kernel_fn(kernels, f"triton.{op}{suffix}")
            for block_n, warps, mode in itertools.product(block_ns, warps_, prefetch):
                tuning = {"block_n": block_n, "num_warps": warps}
                with mock.patch.dict(tiles.TUNING, {name: tuning}), mock.patch.object(tiles, "PREFETCH", mode):
                    rows.append(cell(f"triton {name}{suffix}", dict(tuning, prefetch=mode), w, n, fn, baseline,
                                     copy_gbps, repeats))
    return rows


def knob_grid(spec: str) -> list[dict]:
    """``"mla_prefetch=0,2;mla_grid=-1,0"`` -> every combination, as ``{knob: value}`` dicts."""
    pairs = [part.split("=") for part in spec.split(";") if part]
    names = [name for name, _ in pairs]
    values = [[int(v) for v in vals.split(",")] for _, vals in pairs]
    return [dict(zip(names, combo)) for combo in itertools.product(*values)]


def sweep_cuda(kernels, copy_gbps, repeats, sizes=SIZES, mla_only=False, knobs=None):
    from oracle.kernels.cuda import _build
    from oracle.kernels.triton import tiles

    reason = _build.load()  # the registry loads the library lazily, on the first call
    if reason:
        print(f"CUDA kernels not swept: {reason}")
        return []
    tune = torch.ops.kv_oracle_cuda.tune
    rows = []

    def run(what, knobs, w, n, fn, baseline, sorted_slots=False):
        old = {k: tune(k, v) for k, v in knobs.items()}
        try:
            rows.append(cell(what, knobs, w, n, fn, baseline, copy_gbps, repeats, sorted_slots))
        finally:
            for k, v in old.items():
                tune(k, v)

    if knobs:  # the given knob combinations on every kernel, plainly and with PDL, Triton as the bar
        for n in sizes:
            for op, variant in (("set_mla_kv_buffer", "bf16"),) + (
                    () if mla_only else (("store_cache", "bf16"), ("reshape_and_cache_flash", "e4m3fn"))):
                w = make_workload(op, variant, n, "cuda")
                baseline = kernels[f"torch-cuda.{op}"].fn
                for name, mode in itertools.product((f"triton.{op}", f"triton.{op}.plain"), ("never", "always")):
                    with mock.patch.object(tiles, "PREFETCH", mode):
                        rows.append(cell(name, {"PREFETCH": mode}, w, n, kernel_fn(kernels, name), baseline, copy_gbps,
                                         repeats))
                paths = ("tma", "direct") if op == "set_mla_kv_buffer" else (None,)
                for pdl, path, combo in itertools.product((False, True), paths, knob_grid(knobs)):
                    fn = functools.partial(kernels[f"cuda.{op}"].fn, pdl=pdl)
                    if path:
                        fn = functools.partial(getattr(torch.ops.kv_oracle_cuda, op), path=path, pdl=pdl)
                    run(f"cuda.{op} {path or ''}{' pdl' if pdl else ''}", combo, w, n, fn, baseline)
        return rows

    for n in sizes:
        w = make_workload("set_mla_kv_buffer", "bf16", n, "cuda")
        baseline = kernels["torch-cuda.set_mla_kv_buffer"].fn
        for evict in (0, 2):
            run("cuda mla tma", {"mla_evict_first": evict}, w, n, kernels["cuda.set_mla_kv_buffer"].fn, baseline)
        for grid in (0, 4):
            run("cuda mla tma", {"mla_grid": grid}, w, n, kernels["cuda.set_mla_kv_buffer"].fn, baseline)
        for name in ("triton.set_mla_kv_buffer", "triton.set_mla_kv_buffer.plain"):  # the bar, same run
            run(name, {}, w, n, kernel_fn(kernels, name), baseline)
        for pdl in (False, True):
            for path in ("tma", "direct"):
                mla = functools.partial(torch.ops.kv_oracle_cuda.set_mla_kv_buffer, path=path, pdl=pdl)
                what = f"cuda mla {path}{' pdl' if pdl else ''}"
                for rows_, warps in itertools.product((1, 2, 4) if path == "tma" else (1,), (1, 2, 4)):
                    knobs = {"mla_rows": rows_, "mla_warps": warps} if path == "tma" else {"mla_warps": warps}
                    run(what, knobs, w, n, mla, baseline)
        # the same slots in ascending order: how much of the gap to the copy ceiling is the scatter
        ordered = make_workload("set_mla_kv_buffer", "bf16", n, "cuda")
        ordered.args[1].copy_(ordered.args[1].sort().values)
        for name in ("triton.set_mla_kv_buffer", "cuda.set_mla_kv_buffer"):
            run(f"{name.split('.')[0]} mla, sorted slots", {}, ordered, n, kernels[name].fn, baseline,
                sorted_slots=True)
        for op, variant in () if mla_only else (("store_cache", "bf16"), ("reshape_and_cache_flash", "e4m3fn")):
            w = make_workload(op, variant, n, "cuda")
            for grid in (0, -1, 4):
                knob = "fp8_grid" if variant == "e4m3fn" else "copy_grid"
                run(f"cuda {op}", {knob: grid}, w, n, kernels[f"cuda.{op}"].fn, kernels[f"torch-cuda.{op}"].fn)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--only", choices=("triton", "cuda"))
    parser.add_argument("--mla-only", action="store_true", help="only the MLA sweeps (Triton: mla_write)")
    parser.add_argument("--plain", action="store_true", help="Triton: sweep the plain launches (pdl=False) too")
    parser.add_argument("--triton-kernels", help=f"Triton: only these kernels (comma-separated, of {', '.join(TRITON)})")
    parser.add_argument("--knobs", help="CUDA: sweep only these tune knobs, e.g. 'mla_prefetch=0,2;mla_grid=-1,0', "
                        "on every CUDA writer, plainly and with PDL")
    parser.add_argument("--block-n", default=",".join(map(str, BLOCK_N)), help="Triton rows per program to try")
    parser.add_argument("--warps", default=",".join(map(str, WARPS)), help="Triton warps per program to try")
    parser.add_argument("--prefetch", default="pdl", help="Triton L2 prefetch modes to try (tiles.PREFETCH)")
    parser.add_argument("--sizes", default=",".join(map(str, SIZES)),
                        help="comma-separated row counts (default %(default)s)")
    args = parser.parse_args()
    sizes = tuple(int(x) for x in args.sizes.split(","))
    kernels = default_registry.discover().kernels
    copy = copy_bandwidth("cuda", nbytes=1 << 30)
    print(f"{torch.cuda.get_device_name()}: copy ceiling {copy['gbps']:.1f} GB/s", flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_gbps": copy["gbps"], "rows": []}
    if args.only in (None, "triton"):
        out["rows"] += sweep_triton(kernels, copy["gbps"], args.repeats, sizes,
                                    only=("mla_write",) if args.mla_only else
                                    args.triton_kernels and tuple(args.triton_kernels.split(",")),
                                    suffixes=("", ".plain") if args.plain else ("",),
                                    block_ns=tuple(int(x) for x in args.block_n.split(",")),
                                    warps_=tuple(int(x) for x in args.warps.split(",")),
                                    prefetch=tuple(args.prefetch.split(",")))
    if args.only in (None, "cuda"):
        out["rows"] += sweep_cuda(kernels, copy["gbps"], args.repeats, sizes, args.mla_only, args.knobs)
    best = {}
    for r in out["rows"]:
        key = (r["kernel"], r["op"], r["variant"], r["n"])
        if r["check"] == "ok" and (key not in best or r["us"] < best[key]["us"]):
            best[key] = r
    print("\nfastest correct configuration per kernel, op and N:")
    for (kernel, op, variant, n), r in sorted(best.items()):
        print(f"  {kernel:28} {op:24} {variant:6} N={n:<6} {json.dumps(r['config']):36} "
              f"{r['us']:8.2f} us {r['pct_copy']:6.1f}% of copy")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
