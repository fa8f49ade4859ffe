"""The ``oracle`` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__


def _selfcheck(args: argparse.Namespace) -> int:
    from .reference.golden import check_golden

    results, failures = check_golden()
    width = max(len(r.name) for r in results)
    print(f"{'format / mode':<{width}}  {'vectors':>7}  {'failures':>8}")
    for r in results:
        print(f"{r.name:<{width}}  {r.cases:>7}  {r.failures:>8}")
    for f in failures:
        print(f"FAIL {f.name}: x={f.x} {f.knobs or ''} expected {f.expected}, got {f.actual} ({f.why})")
    failed = sum(r.failures for r in results)
    total = sum(r.cases for r in results)
    print(f"\n{total - failed} of {total} golden fp8 vectors agree with the reference"
          + ("" if not failed else f"; {failed} FAIL"))
    return 1 if failed else 0


def _replay(args: argparse.Namespace) -> int:
    from .bundle import replay
    from .registry import default_registry

    registry = default_registry.discover()
    for error in registry.errors:
        print(f"warning: plug-in {error.plugin} failed to load: {error.error}", file=sys.stderr)
    if args.kernel not in registry.kernels:
        known = ", ".join(sorted(registry.kernels)) or "none"
        print(f"error: --kernel {args.kernel!r} is not registered (known: {known})", file=sys.stderr)
        return 2
    kernel = registry.kernels[args.kernel]
    reason = kernel.unavailable()
    if reason:
        print(f"error: kernel {args.kernel} is unavailable here: {reason}", file=sys.stderr)
        return 2
    passed, report = replay(args.bundle, kernel)
    print(report)
    return 0 if passed else 1


def _list(args: argparse.Namespace) -> int:
    from .registry import default_registry

    registry = default_registry.discover()
    kernels = registry.select(backend=args.backend, op=args.op)
    width = max((len(k.name) for k in kernels), default=10)
    for k in kernels:
        reason = k.unavailable()
        state = f"UNAVAILABLE: {reason}" if reason else "available"
        print(f"{k.name:<{width}}  [{k.contract.backend}] {k.contract.describe()}  ({state}; from {k.plugin})")
    for error in registry.errors:
        print(f"BROKEN plug-in {error.plugin}: {error.error}")
    available = sum(1 for k in kernels if not k.unavailable())
    print(f"\n{len(kernels)} kernels, {available} available here"
          + (f"; {len(registry.errors)} plug-in(s) failed to load" if registry.errors else ""))
    return 1 if registry.errors else 0


def _run(args: argparse.Namespace) -> int:
    from .run import main

    return main(args)


def _report_merge(args: argparse.Namespace) -> int:
    from . import report

    try:
        reports = [report.load(path) for path in args.reports]
    except (OSError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(report.render_text(reports))
    if args.markdown:
        Path(args.markdown).write_text(report.render_markdown(reports))
        print(f"\nwrote {args.markdown}")
    return 0


def _bench(args: argparse.Namespace) -> int:
    from .bench import main

    return main(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="oracle",
        description="kv-oracle: conformance oracle for LLM-serving KV-cache write kernels",
    )
    parser.add_argument("--version", action="version", version=f"kv-oracle {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    selfcheck = commands.add_parser(
        "selfcheck", help="check the reference against its committed golden fp8 vectors")
    selfcheck.set_defaults(handler=_selfcheck)
    replay = commands.add_parser(
        "replay", help="re-run a failing case dumped with pytest --oracle-dump on a kernel")
    replay.add_argument("bundle", help="the .npz bundle")
    replay.add_argument("--kernel", required=True, help="registered kernel name")
    replay.set_defaults(handler=_replay)
    listing = commands.add_parser("list", help="every kernel found, its contract in one line, and "
                                               "why any is unavailable here")
    listing.add_argument("--backend", help="only these backends (comma-separated)")
    listing.add_argument("--op", help="only these ops (comma-separated)")
    listing.set_defaults(handler=_list)
    from .run import configure as configure_run

    run = commands.add_parser("run", help="run the conformance suite (pytest + xdist) and print the "
                                          "op x kernel x case-class matrix")
    configure_run(run)
    run.set_defaults(handler=_run)
    report = commands.add_parser("report", help="work with JSON conformance reports")
    report_commands = report.add_subparsers(dest="report_command", metavar="ACTION", required=True)
    merge = report_commands.add_parser("merge", help="one matrix across machines (a column per target)")
    merge.add_argument("reports", nargs="+", help="JSON reports written by oracle run --report")
    merge.add_argument("--markdown", metavar="OUT.md", help="also write the matrix as Markdown")
    merge.set_defaults(handler=_report_merge)
    try:
        from .bench import configure as configure_bench
    except ImportError:  # pragma: no cover - the bench module ships with the package
        configure_bench = None
    if configure_bench is not None:
        bench = commands.add_parser("bench", help="time every available kernel of an op against the "
                                                  "torch baseline and the copy-bandwidth ceiling")
        configure_bench(bench)
        bench.set_defaults(handler=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        try:
            return _dispatch(argv)
        finally:
            sys.stdout.flush()  # so a closed pipe is seen here (also after --help), not at exit
    except BrokenPipeError:
        # The reader went away (``oracle ... | head``): stop without a traceback. Python flushes
        # stdout again at exit, which would fail the same way, so it gets /dev/null instead.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _dispatch(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
