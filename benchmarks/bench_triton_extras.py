"""The two Triton goals `oracle bench` does not time by itself (run on a GPU):

1. small N against an empty launch: the Triton MLA and MHA writers at N = 1, 16, 64, validated
   (the default), ``validate=False`` (the decode fast path), both launched with programmatic
   dependent launch (the writers' default on sm_90+, compared with an empty kernel launched the same
   way), and ``.plain`` (validated, ``pdl=False``, compared with a plain empty launch), next
   to an empty Triton kernel, all
   timed the same three ways: ``graph`` (CUDA events over a CUDA graph of many calls: GPU time
   alone), ``do_bench`` (triton.testing.do_bench, median: one call between two events after an L2
   flush, so the host runs ahead unless the call synchronizes) and ``eager`` (CUDA events around
   back-to-back calls: the host's cost per call). Next to each write, in ``graph`` and
   ``do_bench``: the floor for its bytes, a Triton copy of the same bytes with the same launch
   (rows of the same width, as many rows per program and warps as the writer's tile, each side
   its own rows; the PDL copy waits on the previous kernel like the writers) but no slot to look up
   (``x_copy``), and an empty PDL kernel that waits the same way (the cost of the wait itself);
2. the fused fp8 paged write against quantize-then-store: reshape_and_cache_flash(e4m3fn) in one
   launch versus quantize_fp8 of K and of V followed by a store_cache of the codes (three launches)
   at N = 16384, bf16 8 x 128 heads, block size 16.

The small-N table is taken ``--rounds`` times, interleaved (all kernels of a round, then the next
round), and each row reports the median over rounds with the lowest and highest: one do_bench
median moves by about 0.5 us between runs, the resolution of a CUDA event pair (so the graph
column is the one that can tell 1.2x from 1.3x at 4 us).

    python benchmarks/bench_triton_extras.py [--rounds 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
import triton
import triton.testing

import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from oracle.bench import CudaTimer
from oracle.bench.references import kernel_fn
from oracle.registry import default_registry


@triton.jit
def _empty(x_ptr):
    pass


@triton.jit
def _empty_waits(x_ptr):
    gdc_wait()
    gdc_launch_dependents()


@triton.jit
def _copy_rows(src_ptr, dst_ptr, rows, width, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    """Rows ``[program_id(0) * BLOCK_N, ...)`` of side ``program_id(1)`` of ``src`` to ``dst``
    (both contiguous ``[sides, rows, width]``): the writers' bytes and launch without the slot
    lookup."""
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    r = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK)
    offs = (tl.program_id(1).to(tl.int64) * rows + r)[:, None] * width + cols[None, :]
    mask = (r < rows)[:, None] & (cols < width)[None, :]
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy_floor(n: int, sides: int, width: int, kernel: str, pdl: bool, device: str = "cuda"):
    """A launch of :func:`_copy_rows` over ``sides`` x ``n`` bf16 rows of ``width``, tiled like
    the Triton ``kernel`` at N = ``n``, and its arguments."""
    from oracle.kernels.triton import ops

    t = ops.tile(n, width, kernel)
    src = torch.randn(sides, n, width, device=device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    grid = (triton.cdiv(n, t.block_n), sides)
    block = triton.next_power_of_2(width)
    return (lambda s, d: _copy_rows[grid](s, d, n, width, BLOCK_N=t.block_n, BLOCK=block, PDL=pdl,
                                          num_warps=t.num_warps, launch_pdl=pdl),
            (src, dst))


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
    empty_waits = lambda x: _empty_waits[(1,)](x, launch_pdl=True)  # noqa: E731
    rounds = [small_n_round(kernels, flag, empty, empty_pdl, empty_waits) for _ in range(args.rounds)]
    rows = []
    for i, first in enumerate(rounds[0]):
        us = sorted(r[i]["us"] for r in rounds)
        x = sorted(r[i]["x_empty"] for r in rounds)
        rows.append(dict(first, us=statistics.median(us), us_low=us[0], us_high=us[-1],
                         x_empty=statistics.median(x), x_low=x[0], x_high=x[-1], rounds=len(rounds)))
        if "x_copy" in first:
            rows[-1]["x_copy"] = statistics.median(r[i]["x_copy"] for r in rounds)
    fused_fp8(kernels, out)
    out["small_n"] = rows
    for r in rows:
        floor = f"  {r['x_copy']:.2f}x copy" if "x_copy" in r else ""
        print(f"{r['mode']:8}  {r['what']:32} N={r['n']:<3} {r['us']:8.2f} us ({r['us_low']:.2f}-{r['us_high']:.2f})"
              f"  {r['x_empty']:.2f}x empty ({r['x_low']:.2f}-{r['x_high']:.2f}){floor}")
    f = out["fused_fp8"]
    print(f"fused fp8 paged write N={f['n']}: {f['fused_us']:.1f} us; quantize K, quantize V, store: "
          f"{f['quantize_then_store_us']:.1f} us; speed-up {f['speedup']:.2f}x")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 0


def small_n_round(kernels, flag, empty, empty_pdl, empty_waits) -> list[dict]:
    """One round of the small-N table: every (mode, kernel, N) once."""
    dev = "cuda"
    rows = []
    for mode in ("graph", "do_bench", "eager"):
        base = median_us(empty, (flag,), mode)
        base_pdl = median_us(empty_pdl, (flag,), mode)
        rows.append({"what": "empty triton launch", "mode": mode, "n": 0, "us": base, "x_empty": 1.0})
        rows.append({"what": "empty triton launch, pdl", "mode": mode, "n": 0, "us": base_pdl, "x_empty": 1.0})
        rows.append({"what": "empty triton launch, pdl, waits", "mode": mode, "n": 0,
                     "us": median_us(empty_waits, (flag,), mode), "x_empty": 1.0})
        for n in (1, 16, 64):
            loc = torch.randperm(4096, device=dev)[:n]
            nope, rope = torch.randn(n, 512, device=dev, dtype=torch.bfloat16), torch.randn(n, 64, device=dev, dtype=torch.bfloat16)
            buf = torch.zeros(4096, 576, device=dev, dtype=torch.bfloat16)
            k, v = (torch.randn(n, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
            kc, vc = (torch.zeros(4096, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
            # the floor for each write's bytes (MLA: N rows of 576; MHA: K and V, 2N rows of 1024),
            # launched plainly and with PDL; the JIT launcher's host cost makes eager timings moot
            floors = {} if mode == "eager" else {
                (name, pdl): median_us(*copy_floor(n, sides, width, kernel, pdl), mode)
                for name, sides, width, kernel in (("MLA 512+64", 1, 576, "mla_write"),
                                                   ("MHA 2 KiB", 2, 1024, "paged_write"))
                for pdl in (False, True)}
            for (name, pdl), us in floors.items():
                rows.append({"what": f"copy, {name} bytes{', pdl' if pdl else ''}", "mode": mode, "n": n, "us": us,
                             "x_empty": us / (base_pdl if pdl else base)})
            for suffix in ("", ".unchecked", ".plain"):
                for name, op, fargs in (("MLA 512+64", "set_mla_kv_buffer", (buf, loc, nope, rope)),
                                        ("MHA 2 KiB", "store_cache", (k, v, kc, vc, loc))):
                    us = median_us(kernel_fn(kernels, f"triton.{op}{suffix}"), fargs, mode)
                    # a PDL launch (the writers' default) against an empty PDL launch: the same
                    # launch mechanics; the plain launch against a plain one
                    pdl = suffix != ".plain"
                    row = {"what": f"triton {name}{suffix}", "mode": mode, "n": n, "us": us,
                           "x_empty": us / (base_pdl if pdl else base)}
                    if floors:
                        row["x_copy"] = us / floors[name, pdl]
                    rows.append(row)
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
