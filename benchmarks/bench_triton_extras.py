"""The two Triton goals `oracle bench` does not time by itself (run on a GPU):

1. small N against an empty launch: the Triton MLA and MHA writers at N = 1, 16, 64, validated
   (the default), ``validate=False`` (the decode fast path) and ``.pdl`` (the fast path launched
   with programmatic dependent launch, compared with an empty kernel launched the same way), next
   to an empty Triton kernel, all
   timed the same three ways: ``graph`` (CUDA events over a CUDA graph of many calls: GPU time
   alone), ``do_bench`` (triton.testing.do_bench, median: one call between two events after an L2
   flush, so the host runs ahead unless the call synchronizes) and ``eager`` (CUDA events around
   back-to-back calls: the host's cost per call);
2. the fused fp8 paged write against quantize-then-store: reshape_and_cache_flash(e4m3fn) in one
   launch versus quantize_fp8 of K and of V followed by a store_cache of the codes (three launches)
   at N = 16384, bf16 8 x 128 heads, block size 16.

The small-N table is taken ``--rounds`` times, interleaved (all kernels of a round, then the next
round), and each row reports the median over rounds with the lowest and highest: on a shared host
one do_bench median moves by about 0.5 us between runs.

    python benchmarks/bench_triton_extras.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.testing

from oracle.bench import CudaTimer
from oracle.registry import default_registry


@triton.jit
def _empty(x_ptr):
    pass


def median_us(fn, args, mode, repeats=25):
    if mode == "do_bench":
        return triton.testing.do_bench(lambda: fn(*args), warmup=25, rep=100, return_mode="median") * 1e3
    timer = CudaTimer(fn, args, use_graph=mode == "graph")
    return statistics.median(timer.sample() for _ in range(repeats)) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    kernels = default_registry.discover().kernels
    dev = "cuda"
    out = {"gpu": torch.cuda.get_device_name(), "triton": triton.__version__, "torch": torch.__version__}
    flag = torch.zeros(1, device=dev)
    empty = lambda x: _empty[(1,)](x)  # noqa: E731
    empty_pdl = lambda x: _empty[(1,)](x, launch_pdl=True)  # noqa: E731
    rounds = [small_n_round(kernels, flag, empty, empty_pdl) for _ in range(args.rounds)]
    rows = []
    for i, first in enumerate(rounds[0]):
        us = sorted(r[i]["us"] for r in rounds)
        x = sorted(r[i]["x_empty"] for r in rounds)
        rows.append(dict(first, us=statistics.median(us), us_low=us[0], us_high=us[-1],
                         x_empty=statistics.median(x), x_low=x[0], x_high=x[-1], rounds=len(rounds)))
    fused_fp8(kernels, out)
    out["small_n"] = rows
    for r in rows:
        print(f"{r['mode']:8}  {r['what']:30} N={r['n']:<3} {r['us']:8.2f} us ({r['us_low']:.2f}-{r['us_high']:.2f})"
              f"  {r['x_empty']:.2f}x empty ({r['x_low']:.2f}-{r['x_high']:.2f})")
    f = out["fused_fp8"]
    print(f"fused fp8 paged write N={f['n']}: {f['fused_us']:.1f} us; quantize K, quantize V, store: "
          f"{f['quantize_then_store_us']:.1f} us; speed-up {f['speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def small_n_round(kernels, flag, empty, empty_pdl) -> list[dict]:
    """One round of the small-N table: every (mode, kernel, N) once."""
    dev = "cuda"
    rows = []
    for mode in ("graph", "do_bench", "eager"):
        base = median_us(empty, (flag,), mode)
        base_pdl = median_us(empty_pdl, (flag,), mode)
        rows.append({"what": "empty triton launch", "mode": mode, "n": 0, "us": base, "x_empty": 1.0})
        rows.append({"what": "empty triton launch, pdl", "mode": mode, "n": 0, "us": base_pdl, "x_empty": 1.0})
        for n in (1, 16, 64):
            loc = torch.randperm(4096, device=dev)[:n]
            nope, rope = torch.randn(n, 512, device=dev, dtype=torch.bfloat16), torch.randn(n, 64, device=dev, dtype=torch.bfloat16)
            buf = torch.zeros(4096, 576, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(n, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
            kc, vc = (torch.zeros(4096, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
            for suffix in ("", ".unchecked", ".pdl"):
                for name, op, fargs in (("MLA 512+64", "set_mla_kv_buffer", (buf, loc, nope, rope)),
                                        ("MHA 2 KiB", "store_cache", (k, v, kc, vc, loc))):
                    us = median_us(kernels[f"triton.{op}{suffix}"].fn, fargs, mode)
                    # a PDL launch against an empty PDL launch: the same launch mechanics
                    rows.append({"what": f"triton {name}{suffix}", "mode": mode, "n": n, "us": us,
                                 "x_empty": us / (base_pdl if suffix == ".pdl" else base)})
    return rows


def fused_fp8(kernels, out: dict) -> None:
    """The fused fp8 paged write against quantize K, quantize V, then store, into out["fused_fp8"]."""
    dev = "cuda"
    n, heads, dim, block = 16384, 8, 128, 16
    key, value = (torch.randn(n, heads, dim, device=dev, dtype=torch.bfloat16) for _ in range(2))
    kc, vc = (torch.zeros(2 * n // block, block, heads, dim, device=dev, dtype=torch.uint8) for _ in range(2))
    slots = torch.randperm(2 * n, device=dev)[:n]
    ks = (key.abs().max().float() / 448).reshape(1)
    vs = (value.abs().max().float() / 448).reshape(1)
    fused = kernels["triton.reshape_and_cache_flash"].fn
    quant, store = kernels["triton.quantize_fp8"].fn, kernels["triton.store_cache"].fn
    qk, qv = (torch.empty(n, heads, dim, device=dev, dtype=torch.uint8) for _ in range(2))

    def two_step(key, value, kc, vc, slots, ks, vs):
        quant(qk, key, ks, "e4m3fn")
        quant(qv, value, vs, "e4m3fn")
        store(qk, qv, kc.view(-1, heads, dim), vc.view(-1, heads, dim), slots)

    t_fused = median_us(lambda *a: fused(*a[:5], "e4m3fn", *a[5:]), (key, value, kc, vc, slots, ks, vs), "graph")
    t_two = median_us(two_step, (key, value, kc, vc, slots, ks, vs), "graph")
    out["fused_fp8"] = {"n": n, "fused_us": t_fused, "quantize_then_store_us": t_two, "speedup": t_two / t_fused}


if __name__ == "__main__":
    raise SystemExit(main())
