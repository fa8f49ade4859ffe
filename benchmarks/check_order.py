"""How should a check grid hand over to its writer? Times both ways in one process (run on a GPU).

``--switch order`` (the default): when the check grid lets its writer launch.

A validating call on a long index launches a check grid, then the writer, which reads the check's
verdict after its PDL wait. The check grid can let the writer launch

- ``early``: at once, before the check's own wait: the writer is scheduled and asks the L2 for its
  sources while the kernels before the check still run, and loads nothing before its wait;
- ``late``: after the check's own wait, once the kernels before it have completed (the CUDA writers
  then load their first row before their wait; the Triton writers do not).

The switch is ``torch.ops.kv_oracle_cuda.tune("check_early", 1 | 0)`` for the CUDA writers and
``oracle.kernels.triton._validate.CHECK_EARLY`` for the Triton ones.

``--switch fold`` (CUDA writers only): how the verdict reaches the writer, ``tune("check_fold")``,
at every size (``check_fold_blocks`` 0; by default a check grid folds only past 32 blocks):

- ``folded``: the check grid's last block folds the blocks' words into one, which each writer warp
  reads (8 bytes), at the cost of a fence, an atomic and the fold at the end of the check grid;
- ``words``: each writer warp reads every block's word (up to 64, 512 bytes), and the check grid
  ends as soon as each block has written its own.

Each cell is timed eagerly
with inputs rotated past the L2 (oracle bench's timer, without a graph), the two orders and the
kernel's ``.unchecked`` twin alternated round by round in one process, so a host's drift hits them
alike; the table gives each one's median over the rounds.

    python benchmarks/check_order.py [--switch order|fold] [--kernels cuda.set_mla_kv_buffer,...]
        [--sizes 4096,16384] [--rounds 7] [--json OUT]
"""

from __future__ import annotations

import argparse
import functools

from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.kernels import check_reuse
from oracle.registry import default_registry

DEFAULT_KERNELS = ("cuda.set_mla_kv_buffer", "triton.set_mla_kv_buffer", "cuda.reshape_and_cache_flash",
                   "triton.reshape_and_cache_flash", "triton.reshape_and_cache_block")
VARIANTS = {"set_mla_kv_buffer": ("bf16",), "reshape_and_cache_flash": ("e4m3fn",),
            "reshape_and_cache_block": ("nvfp4", "mxfp8_e4m3fn")}


SWITCHES = {"order": ("early", "late"), "fold": ("folded", "words")}


def set_fold(backend: str, folded: bool) -> None:
    """Make the CUDA check grids fold their verdict words into one, or leave them to the writer."""
    if backend != "cuda":
        raise SystemExit("--switch fold: the CUDA writers only")
    from oracle.kernels import cuda
    cuda.ops().tune("check_fold", 3 if folded else 0)
    cuda.ops().tune("check_fold_blocks", 0)  # at every size, however few the check blocks


def set_order(backend: str, early: bool) -> None:
    """Make the check grids of ``backend`` let their writer launch early or late."""
    if backend == "cuda":
        from oracle.kernels import cuda
        cuda.ops().tune("check_early", 1 if early else 0)
    else:
        from oracle.kernels.triton import _plans, _validate
        _validate.CHECK_EARLY = early
        _plans.clear()  # a launch plan keeps the constexprs it was built with


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--switch", choices=sorted(SWITCHES), default="order")
    parser.add_argument("--kernels", default="")
    parser.add_argument("--sizes", default="4096,16384")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    on, off = SWITCHES[args.switch]
    setter = set_order if args.switch == "order" else set_fold
    kernels = args.kernels or ",".join(k for k in DEFAULT_KERNELS if args.switch == "order" or k.startswith("cuda."))
    registry = default_registry.discover()
    check_reuse.set_enabled(False)  # the checks compared here run on every call
    in_grid = None
    if any(k.startswith("cuda.") for k in kernels.split(",")):
        from oracle.kernels import cuda
        in_grid = cuda.ops().tune("mla_check_in_grid", 0)  # the CUDA MLA writer takes the check grid at every size
    rows = []
    print(f"{'kernel':34s} {'variant':13s} {'N':>6s} {on:>7s} {off:>7s} {'unchecked':>9s}  (us, eager, cold)")
    for name in (k for k in kernels.split(",") if k):
        kernel = registry.kernels[name]
        twin = registry.kernels[name + ".unchecked"]
        backend = kernel.contract.backend
        for variant in VARIANTS[kernel.contract.op]:
            for n in (int(s) for s in args.sizes.split(",")):
                first = make_workload(kernel.contract.op, variant, n, "cuda")
                rotation = cold_sets(kernel.contract.op, variant, n, first)
                variants = {on: (functools.partial(setter, backend, True), kernel.fn),
                            off: (functools.partial(setter, backend, False), kernel.fn),
                            "unchecked": (functools.partial(setter, backend, True), twin.fn)}
                times = alternated(variants, first.args, "cuda", rotation, args.rounds)
                setter(backend, True)
                med = medians(times)
                rows.append({"kernel": name, "variant": variant, "n": n, "switch": args.switch, "median_us": med,
                             "samples_us": times})
                print(f"{name:34s} {variant:13s} {n:6d} {med[on]:7.2f} {med[off]:7.2f} "
                      f"{med['unchecked']:9.2f}", flush=True)
    if in_grid is not None:
        cuda.ops().tune("mla_check_in_grid", in_grid)
    save_alternated(args.json, args.rounds, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
