"""``oracle bench`` on the command line (also ``python -m oracle.bench``)."""

from __future__ import annotations

import argparse
import json
import sys

from .output import plot
from .runner import run
from .workloads import VARIANTS

DEFAULT_SIZES = (1, 16, 256, 4096, 16384)


def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--backend", default=None, metavar="B",
                        help="time only kernels of these backends (comma-separated); the torch baseline "
                             "is always timed")
    parser.add_argument("--op", default=None, metavar="OP",
                        help=f"ops to time (comma-separated; default all: {', '.join(VARIANTS)}); "
                             "OP:VARIANT picks one variant, e.g. reshape_and_cache_flash:e4m3fn")
    parser.add_argument("--json", default=None, metavar="OUT", help="write every row and the machine info as JSON")
    parser.add_argument("--plot", default=None, metavar="OUT.png", help="write GB/s against N as a PNG (matplotlib)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated row counts N (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=15,
                        help="timed samples per kernel and N; the median is reported (default %(default)s)")
    parser.add_argument("--mode", choices=("eager", "graph", "both"), default="both",
                        help="how CUDA kernels are timed: launched call by call as a user calls them (eager), "
                             "replayed from a CUDA graph, or both (default)")
    parser.add_argument("--l2", choices=("cold", "hot", "both"), default="cold",
                        help="CUDA inputs rotated past the L2 (cold, default), the same inputs every call (hot), "
                             "or both")
    parser.add_argument("--peer-file", action="append", default=[], metavar="PY",
                        help="a peer's Triton writer file to time beside ours, loaded by path (sglang's "
                             "kvcache/cache_ops.py, vLLM's triton_reshape_and_cache_flash.py); repeatable")
    parser.add_argument("--quiet", action="store_true",
                        help="on a shared machine: keep only samples during which no other process ran "
                             "(Linux /proc accounting), retaking the others for up to 2 minutes per cell")
    return parser


def _parse_ops(spec: str | None) -> tuple[list[str], dict]:
    if not spec:
        return list(VARIANTS), {}
    ops, only = [], {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        op, _, variant = item.partition(":")
        if op not in VARIANTS:
            raise ValueError(f"--op {op!r} has no bench workload; ops: {', '.join(VARIANTS)}")
        if variant and variant not in VARIANTS[op]:
            raise ValueError(f"--op {item!r}: {op} variants are {', '.join(VARIANTS[op])}")
        if op not in ops:
            ops.append(op)
        if variant:
            only.setdefault(op, []).append(variant)
    return ops, only


def main(args: argparse.Namespace) -> int:
    try:
        ops, only = _parse_ops(args.op)
        sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"--sizes {args.sizes!r}: expected positive integers")
        if args.repeats < 1:
            raise ValueError(f"--repeats {args.repeats}: expected at least 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    modes = ("eager", "graph") if args.mode == "both" else (args.mode,)
    l2_states = ("cold", "hot") if args.l2 == "both" else (args.l2,)
    try:
        result = run(ops, sizes, args.repeats, args.backend, only, quiet=getattr(args, "quiet", False),
                     modes=modes, l2_states=l2_states, peer_files=tuple(args.peer_file))
    except ValueError as exc:  # a peer file that is missing or defines no known writer
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result["command"] = " ".join(sys.argv)
    from ..report import describe_tool

    result["tool"] = describe_tool()  # the commit, so a saved report says which code it timed
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m oracle.bench``, benchmarks/bench_kernels.py)."""
    from . import __doc__ as package_doc

    parser = configure(argparse.ArgumentParser(prog="oracle bench", description=package_doc.split("\n\n")[0]))
    return main(parser.parse_args(argv))
