"""A slot index checked once per step against a check on every call (run on a GPU).

A serving engine writes every layer of a forward step with one slot index. Each validating writer
call checks it on the device (a check grid first, for an index longer than 256 entries);
``oracle.kernels.check_index`` checks it once, and each writer given the CheckedIndex reads the
check's verdict word instead. For each writer and size this times, eagerly with inputs rotated
past the L2 (oracle bench's timer, without a graph), alternated round by round in one process:

- ``per_call``: the validating writer on a plain index with check reuse off
  (``oracle.kernels.check_reuse``): the check on every call, as a new index tensor each call pays;
- ``reused``: the validating writer on the same index tensors, check reuse on (the default): each
  input set's index checked on its first call, its verdict read after that;
- ``checked``: the writer on an index checked beforehand (``<name>.checked_index`` with its inputs
  prepared once, outside the timed calls: what each layer of a step costs);
- ``unchecked``: ``validate=False``;
- ``check``: ``check_index`` alone (what a step pays once).

A step of L layers then costs ``check + L * checked`` against ``L * per_call``; the table gives L =
61 (DeepSeek-V3's layer count) per layer.

    python benchmarks/checked_index.py [--sizes 4096,16384] [--rounds 7] [--json OUT]
"""

from __future__ import annotations

import argparse

from oracle.bench.runner import prepared
from oracle.bench.timers import alternated, cold_sets, medians, save_alternated
from oracle.bench.workloads import make_workload
from oracle.kernels import check_reuse
from oracle.kernels.checked_index import INDEX_ARGUMENTS, check_index
from oracle.registry import default_registry

WRITERS = (("set_mla_kv_buffer", "bf16"), ("store_cache", "bf16"), ("reshape_and_cache_flash", "e4m3fn"))
LABELS = ("per_call", "reused", "checked", "unchecked", "check")
LAYERS = 61


def _variants(name: str, op: str, first: tuple, rotation: tuple) -> dict:
    kernels = default_registry.kernels
    checked = kernels[f"{name}.checked_index"]
    position, _, _ = INDEX_ARGUMENTS[op]
    fn, checked_args, checked_sets = prepared(checked, first, rotation)
    bound, padding = checked_args[position].num_slots, checked.fn.padding

    def check(*args):
        check_index(args[position], bound, padding=padding)

    nothing = lambda: check_reuse.set_enabled(True)  # noqa: E731  (the default)
    return {"per_call": (lambda: check_reuse.set_enabled(False), kernels[name].fn),
            "reused": (nothing, kernels[name].fn),
            "checked": (nothing, fn, checked_args, checked_sets),
            "unchecked": (nothing, kernels[f"{name}.unchecked"].fn),
            "check": (nothing, check)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="4096,16384")
    parser.add_argument("--backends", default="cuda,triton")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--json", default="")
    args = parser.parse_args()
    default_registry.discover()
    print(f"{'writer':44s} {'N':>6s} {'per_call':>9s} {'reused':>7s} {'checked':>8s} {'unchecked':>9s} {'check':>7s} "
          f"{'per layer, ' + str(LAYERS) + ' layers':>20s}  (us, eager, cold)")
    rows = []
    for op, variant in WRITERS:
        for backend in args.backends.split(","):
            name = f"{backend}.{op}"
            kernel = default_registry.kernels.get(name)
            if kernel is None or kernel.unavailable() is not None:
                print(f"{name}: unavailable")
                continue
            for n in (int(s) for s in args.sizes.split(",")):
                first = make_workload(op, variant, n, "cuda")
                rotation = cold_sets(op, variant, n, first)
                times = alternated(_variants(name, op, first.args, rotation), first.args, "cuda", rotation,
                                   args.rounds)
                med = medians(times)
                per_layer = med["checked"] + med["check"] / LAYERS
                rows.append({"kernel": name, "op": op, "variant": variant, "n": n, "bytes": first.bytes,
                             "median_us": med, "per_layer_us": per_layer, "samples_us": times})
                print(f"{name + ' [' + variant + ']':44s} {n:6d} {med['per_call']:9.2f} {med['reused']:7.2f} {med['checked']:8.2f} "
                      f"{med['unchecked']:9.2f} {med['check']:7.2f} {per_layer:20.2f}", flush=True)
    save_alternated(args.json, args.rounds, rows, layers=LAYERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
