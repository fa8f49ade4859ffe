"""Where a small-N call's host time goes, Triton's and CUDA's (run on a GPU; prints one table, writes JSON).

At N <= 64 a KV write moves a few KB and the GPU finishes in about a microsecond, so an eager call
costs what the host spends issuing it. This splits that cost, per call, averaged over
``--calls`` back-to-back calls (time.perf_counter around the loop, one synchronization after it):

- ``empty kernel[grid]``: an empty ``@triton.jit`` kernel of one pointer through Triton's launcher;
- ``mla_write[grid] (raw)``: the MLA kernel through Triton's launcher with the arguments our wrapper
  would pass, precomputed (the launcher's cost for 19 arguments and 5 constexprs);
- ``compiled[grid] runner``: the same launch through the CompiledKernel's runner, skipping the JIT's
  binder and cache-key work;
- ``oracle.kernels.triton.ops.set_mla_kv_buffer(validate=False)`` and the validated call (and the
  validated call on an index made under ``torch.inference_mode()``, checked on every call), each with
  its wrapper run in full on every call (``_host.PLANS = False``) and replayed from its launch plan;
- the same for ``store_cache`` (K and V in one launch), the validated ``reshape_and_cache_flash`` and
  ``reshape_and_cache_block`` (NVFP4: two launches),
  and torch's ``index_put_`` of K and V for scale;
- with the CUDA library loaded, the CUDA MLA writer's op called as the wrapper calls it (keyword
  arguments) and positionally through its ``default`` overload, its wrapper unchecked, validating
  (its index's check reused, and an index made under ``torch.inference_mode()``, checked on every
  call) and given a CheckedIndex, and the registered ``.checked_index`` writer, at each N: where a CUDA
  call's host time goes (at N = 4096 a validating call adds the check grid's launch).

With ``--profile`` it also prints cProfile's top entries for the validated, replayed MLA call.

    python benchmarks/host_cost.py [--calls 3000] [--sizes 1,64,4096] [--json OUT] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import time

import torch
import triton

from oracle.kernels.triton import _host, _validate, ops, tiles


@triton.jit
def _empty(x_ptr):
    pass


def per_call_us(fn, calls: int) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    host = time.perf_counter() - start
    torch.cuda.synchronize()
    return host / calls * 1e6


def mla_raw_launch(buf, loc, nope, rope):
    """The MLA kernel launch exactly as ``ops.set_mla_kv_buffer`` issues it, arguments prepared."""
    n = loc.shape[0]
    a, b, cache = _host.as_bits(nope), _host.as_bits(rope), _host.as_bits(buf)
    unchecked = _validate.unchecked(cache)  # validate=False: no device check
    t = ops.tile(n, max(a.shape[1], b.shape[1]), "mla_write", (a.shape[1], b.shape[1]))
    grid = (tiles.cdiv(n, t.block_n), max(tiles.cdiv(a.shape[1], t.block_a), tiles.cdiv(b.shape[1], t.block_b)))
    args = (a, a.stride(0), a.stride(1), b, b.stride(0), b.stride(1), cache, buf.stride(0), 0, buf.stride(1),
            loc, loc.stride(0), cache, n, a.shape[1], b.shape[1], 1, buf.shape[0], 0, *unchecked.args, 0)
    meta = dict(HAS_PAD_SLOT=False, FP8=0, BLOCK_N=t.block_n, BLOCK_A=t.block_a, BLOCK_B=t.block_b, PDL=False,
                num_warps=t.num_warps, **unchecked.meta)
    kernel = ops.kernels().mla_write
    return (lambda: kernel[grid](*args, **meta)), kernel, grid, args, meta


def compiled_runner(kernel, grid, args, meta):
    """The same launch through the CompiledKernel's own runner (``compiled[grid](*params)``),
    skipping the JIT's binder, cache key and global checks: every parameter in order, constexprs
    included (their defaults where ``meta`` leaves them out), as ``JITFunction.run`` passes them."""
    compiled = kernel[grid](*args, **meta)
    params = args + tuple(meta[p.name] if p.name in meta else p.default for p in kernel.params if p.is_constexpr)
    runner = compiled[grid + (1,) * (3 - len(grid))]
    return lambda: runner(*params)


def cuda_rows(row, n, buf, loc, nope, rope) -> None:
    """The CUDA MLA writer's host cost per call, layer by layer (nothing where the library is not
    loaded)."""
    from oracle.kernels import check_index, cuda, raise_deferred_errors
    from oracle.kernels.checked_index import CheckedIndexWriter

    if cuda.available() is not None:
        return
    op = cuda.ops().set_mla_kv_buffer
    row("cuda op, keywords (validate=0)", n, lambda: op(buf, loc, nope, rope, pdl=True, validate=0, verdict=None))
    row("cuda op, positional .default (validate=0)", n,
        lambda: op.default(buf, loc, nope, rope, cuda.MLA_PATH, cuda.MAX_VEC, True, 0, None))
    row("cuda op, keywords (validate=1)", n, lambda: op(buf, loc, nope, rope, pdl=True, validate=1, verdict=None))
    row("cuda.set_mla_kv_buffer(validate=False)", n,
        lambda: cuda.set_mla_kv_buffer(buf, loc, nope, rope, validate=False))
    row("cuda.set_mla_kv_buffer (validated)", n, lambda: cuda.set_mla_kv_buffer(buf, loc, nope, rope))
    with torch.inference_mode():  # an engine's forward: no version counter, so the index is checked each call
        fresh = loc.clone()
        row("cuda.set_mla_kv_buffer (validated), inference-mode index", n,
            lambda: cuda.set_mla_kv_buffer(buf, fresh, nope, rope))
    checked = check_index(loc, buf.shape[0])
    row("cuda.set_mla_kv_buffer on a CheckedIndex", n, lambda: cuda.set_mla_kv_buffer(buf, checked, nope, rope))
    writer = CheckedIndexWriter(cuda.set_mla_kv_buffer, "set_mla_kv_buffer", "none")
    row("cuda.set_mla_kv_buffer.checked_index (registered)", n, lambda: writer(buf, checked, nope, rope))
    raise_deferred_errors()  # synchronizes: every call above was legal


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--sizes", default="1,64,4096", help="comma-separated N")
    opts = parser.parse_args()
    dev = "cuda"
    rows = []

    def row(what, n, fn):
        us = per_call_us(fn, opts.calls)
        rows.append({"what": what, "n": n, "host_us": us})
        print(f"{what:58} N={n:<3} {us:8.2f} us per call", flush=True)

    flag = torch.zeros(1, device=dev)
    row("empty kernel[grid]", 0, lambda: _empty[(1,)](flag))
    for n in (int(x) for x in opts.sizes.split(",")):
        slots = max(4096, 2 * n)  # a multiple of 16: the paged writers' blocks of 16
        loc = torch.randperm(slots, device=dev)[:n]
        nope = torch.randn(n, 512, device=dev, dtype=torch.bfloat16)
        rope = torch.randn(n, 64, device=dev, dtype=torch.bfloat16)
        buf = torch.zeros(slots, 576, device=dev, dtype=torch.bfloat16)
        k, v = (torch.randn(n, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        kc, vc = (torch.zeros(slots, 8, 128, device=dev, dtype=torch.bfloat16) for _ in range(2))
        raw, kernel, grid, args, meta = mla_raw_launch(buf, loc, nope, rope)
        row("mla_write[grid] (raw, arguments prepared)", n, raw)
        buf.zero_()
        row("mla_write compiled[grid] runner", n, compiled_runner(kernel, grid, args, meta))
        written = buf[loc.long()]
        ok = torch.equal(written[:, :512], nope) and torch.equal(written[:, 512:], rope)
        rows[-1]["writes_the_rows"] = ok
        print(f"  the runner wrote the rows: {ok}")
        for plans in (False, True):  # each wrapper run in full on every call, then replayed from its plan
            _host.PLANS = plans
            tag = "replayed" if plans else "wrapper in full"
            row(f"ops.set_mla_kv_buffer(validate=False), {tag}", n,
                lambda: ops.set_mla_kv_buffer(buf, loc, nope, rope, validate=False))
            row(f"ops.set_mla_kv_buffer (validated), {tag}", n, lambda: ops.set_mla_kv_buffer(buf, loc, nope, rope))
            with torch.inference_mode():  # checked on every call
                fresh = loc.clone()
                row(f"ops.set_mla_kv_buffer (validated), inference-mode index, {tag}", n,
                    lambda: ops.set_mla_kv_buffer(buf, fresh, nope, rope))
            row(f"ops.store_cache(validate=False), {tag}", n,
                lambda: ops.store_cache(k, v, kc, vc, loc, validate=False))
            row(f"ops.store_cache (validated), {tag}", n, lambda: ops.store_cache(k, v, kc, vc, loc))
            pk, pv = (c.view(slots // 16, 16, 8, 128) for c in (kc, vc))
            scale = torch.ones(1, device=dev)
            row(f"ops.reshape_and_cache_flash auto (validated), {tag}", n,
                lambda: ops.reshape_and_cache_flash(k, v, pk, pv, loc, "auto", scale, scale))
            # the block-scaled writer, NVFP4 into linear scale caches: K and V in one launch, the most checks
            codes = [torch.zeros(slots // 16, 16, 8, 64, dtype=torch.uint8, device=dev) for _ in range(2)]
            scales = [torch.zeros(slots // 16, 16, 8, 8, dtype=torch.uint8, device=dev) for _ in range(2)]
            row(f"ops.reshape_and_cache_block nvfp4 (validated), {tag}", n,
                lambda: ops.reshape_and_cache_block(k, v, *codes, *scales, loc, "nvfp4", scale, scale))
        row("torch index_put_ (K and V)", n, lambda: (kc.index_put_((loc,), k), vc.index_put_((loc,), v)))
        cuda_rows(row, n, buf, loc, nope, rope)
        if opts.profile and n == 1:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(opts.calls):
                ops.set_mla_kv_buffer(buf, loc, nope, rope)  # validated, replayed from its plan
            prof.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(25)
            print(text.getvalue())
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "triton": triton.__version__,
                       "torch": torch.__version__, "calls": opts.calls, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
