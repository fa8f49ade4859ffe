"""``oracle run``: the conformance suite through pytest and pytest-xdist, then the matrix.

Cases run in xdist worker processes, never in the ``oracle`` process itself. A kernel that
segfaults takes down only its worker: xdist reports the case it was running as crashed and starts
a fresh worker for the rest. A CUDA kernel that leaves a sticky error ends its worker right after
that case (the plug-in's teardown check), so no later case inherits a poisoned context. A case
that runs past ``--timeout`` ends its worker the same way and is reported TIMEOUT; large cases run
only as many at a time as the memory budget (``--memory``) allows (oracle/limits.py). On a host
with several GPUs each worker is pinned to one of them (``--devices``; oracle/devices.py). (One xdist
group per kernel, ``--dist loadgroup``, would be tidier, but xdist 3.8 fails with an internal
error when it replaces a crashed worker under that scheduler.)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import tempfile
from pathlib import Path

from . import limits
from . import report as _report


def _ini() -> Path:
    """The suite's own pytest configuration, wherever the conformance package is installed."""
    return Path(importlib.util.find_spec("conformance").origin).parent / "oracle-run.ini"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--backend", help="only kernels of these backends (comma-separated)")
    parser.add_argument("--kernel", help="only these kernels (comma-separated names)")
    parser.add_argument("--op", help="only these ops (comma-separated)")
    parser.add_argument("--origin", default="all", choices=("all", "entry-points", "env"),
                        help="only installed kernels, or only those ORACLE_PLUGINS names")
    parser.add_argument("--profile", default="quick", choices=("quick", "full", "exhaustive"))
    parser.add_argument("-n", dest="workers", default="auto",
                        help="worker processes (pytest-xdist), 'auto' for one per core (on several GPUs: "
                             "--workers-per-device on each); 0 runs in this process, without crash isolation")
    parser.add_argument("--devices", metavar="LIST",
                        help="GPUs to use, comma-separated ordinals among the visible ones; the workers are "
                             "pinned to them round-robin (default: every visible GPU)")
    parser.add_argument("--workers-per-device", metavar="N",
                        help="with -n auto on several GPUs: N workers per device (default: the cores shared out)")
    parser.add_argument("--report", metavar="PATH", help="write the JSON report here")
    parser.add_argument("--junit", metavar="PATH", help="write JUnit XML here (pytest's --junitxml)")
    parser.add_argument("--markdown", metavar="PATH", help="write the matrix as Markdown here")
    parser.add_argument("--target", help="the execution target's name in the report")
    parser.add_argument("--dump", metavar="DIR", help="write each failing case as an .npz bundle")
    parser.add_argument("--timeout", metavar="SECONDS", type=limits.seconds_argument,
                        help="per-case time limit: a case past it is reported TIMEOUT, its worker is replaced "
                             f"and the run goes on; 0 for none (default {limits.DEFAULT_TIMEOUT_S:g}; none "
                             "under --sanitize)")
    parser.add_argument("--memory", metavar="GB", type=limits.gigabytes_argument,
                        help="memory budget of the large cases (~4.7 GB each): they run only as many at a "
                             "time as fit, and one that cannot fit is reported 'not run' (default: 90%% of "
                             "the memory available when the first one starts)")
    parser.add_argument("--self-check", action="store_true",
                        help="run the catalogue of deliberately wrong kernels instead, and print "
                             "the kill rate")
    parser.add_argument("--sanitize", metavar="DIR", nargs="?", const="reports/sanitize",
                        help="on a CUDA machine: run the selected cases in one process under "
                             "compute-sanitizer memcheck, writing the log and summary to DIR")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")


def pytest_arguments(args: argparse.Namespace, report_path: str) -> list[str]:
    ini = _ini()
    out = ["-c", str(ini), "--rootdir", str(ini.parent), "--pyargs", "conformance",
           "--oracle-profile", args.profile, "--oracle-origin", args.origin, "--oracle-report", report_path,
           "--oracle-timeout", f"{limits.DEFAULT_TIMEOUT_S if args.timeout is None else args.timeout:g}"]
    if str(args.workers) != "0":
        out += ["-n", str(args.workers), "--dist", "load", "--max-worker-restart", "1000"]
    for option, value in (("--oracle-backend", args.backend), ("--oracle-kernel", args.kernel),
                          ("--oracle-op", args.op), ("--oracle-target", args.target),
                          ("--oracle-dump", args.dump), ("--junitxml", args.junit),
                          ("--oracle-memory", args.memory and f"{args.memory:g}"),
                          ("--oracle-devices", args.devices),
                          ("--oracle-workers-per-device", args.workers_per_device)):
        if value:
            out += [option, value]
    return out + list(args.pytest_args)


def main(args: argparse.Namespace) -> int:
    if args.self_check:  # the same entry as ``python -m oracle.mutants``
        from .mutants.__main__ import main as self_check

        return self_check(["--profile", args.profile])
    if args.sanitize:
        from .lanes.sanitize import sanitize

        if args.backend is None:
            args.backend = "cuda,triton"
        if args.timeout is None:  # memcheck slows kernels 100-fold, in one process: no worker to replace
            args.timeout = 0.0
        summary = sanitize(pytest_arguments(args, str(Path(args.sanitize) / "report.json")), args.sanitize)
        print(json.dumps({k: v for k, v in summary.items() if k != "command"}, indent=1, default=str))
        return 0 if summary.get("ok") else 1
    import pytest

    with tempfile.TemporaryDirectory() as scratch:
        path = args.report or str(Path(scratch) / "report.json")
        status = pytest.main(pytest_arguments(args, path))
        if not Path(path).exists():
            print(f"oracle run: pytest ended with status {int(status)} before writing a report")
            return int(status) or 2
        report = _report.load(path)
    print("\n" + _report.render_text([report]))
    if args.markdown:
        Path(args.markdown).write_text(_report.render_markdown([report]))
    failed = [c for c in report["cases"] if c["status"] in _report.FAILING]
    counts = {s: sum(c["status"] == s for c in report["cases"]) for s in _report.STATUSES}
    print("\n" + ", ".join(f"{n} {s}" for s, n in counts.items() if n)
          + (f"; report: {args.report}" if args.report else ""))
    if report.get("interrupted"):
        return int(status) or 2  # stopped from outside: the matrix is partial, whatever it holds
    if failed:
        return 1
    return 0 if int(status) in (0, 5) else int(status)
