"""The ``oracle`` command."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from . import __version__


def _selfcheck(args: argparse.Namespace) -> int:
    from .reference.golden import check_golden, check_mx_golden, check_nvfp4_golden

    results, failures = check_golden()
    for more_results, more_failures in (check_mx_golden(), check_nvfp4_golden()):
        results, failures = results + more_results, failures + more_failures
    width = max(len(r.name) for r in results)
    print(f"{'format / mode':<{width}}  {'vectors':>7}  {'failures':>8}")
    for r in results:
        print(f"{r.name:<{width}}  {r.cases:>7}  {r.failures:>8}")
    for f in failures:
        print(f"FAIL {f.name}: x={f.x} {f.knobs or ''} expected {f.expected}, got {f.actual} ({f.why})")
    failed = sum(r.failures for r in results)
    total = sum(r.cases for r in results)
    print(f"\n{total - failed} of {total} golden fp8, MXFP8 and NVFP4 vectors agree with the reference"
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


def _bench_report(args: argparse.Namespace) -> int:
    """``oracle report bench-table|bench-goals|bench-plot``: a saved bench report read back."""
    from .bench import goals, saved

    try:
        loaded = saved.load(args.report)  # errors name the file
        before = saved.load(args.before) if args.before else None
        if args.report_command == "bench-table":
            print(saved.bench_table(loaded, args.mode, args.l2, path=args.report))
        elif args.report_command == "bench-goals":
            try:
                lines = goals.goals(loaded) + (goals.graph_regressions(loaded, before) if before else [])
            except ValueError as exc:
                raise ValueError(f"{args.report}: {exc}") from None
            print(goals.render(lines))
        else:
            try:
                import matplotlib  # noqa: F401
            except ImportError:
                print("error: bench-plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
                return 2
            from .bench.output import plot

            plot(loaded, args.out)
            print(f"wrote {args.out}")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
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
    table = report_commands.add_parser(
        "bench-table", help="a saved bench report (oracle bench --json) as Markdown tables: the machine, "
                            "the command, per op and timing each kernel's us and %% of the copy ceiling "
                            "at each N beside the references")
    table.add_argument("report", help="JSON report written by oracle bench --json")
    table.add_argument("--mode", choices=("eager", "graph", "both"), default="both",
                       help="only rows timed eagerly or graph-replayed (CPU rows are eager; default both)")
    table.add_argument("--l2", choices=("cold", "hot", "both"), default="both",
                       help="only rows timed with inputs rotated past the L2 (cold) or not (hot; CPU rows "
                            "are hot); default both")
    table.set_defaults(handler=_bench_report, before=None)
    goals = report_commands.add_parser(
        "bench-goals", help="the GPU writers' speed goals judged from a saved bench report, as a "
                            "Markdown table")
    goals.add_argument("report", help="JSON report written by oracle bench --mode both --l2 cold --json")
    goals.add_argument("--before", metavar="OLD.json",
                       help="an earlier bench report: graph-replayed writers may not be more than 3%% slower")
    goals.set_defaults(handler=_bench_report)
    bench_plot = report_commands.add_parser(
        "bench-plot", help="GB/s against N from a saved bench report, as a PNG (matplotlib)")
    bench_plot.add_argument("report", help="JSON report written by oracle bench --json")
    bench_plot.add_argument("out", metavar="OUT.png")
    bench_plot.set_defaults(handler=_bench_report, before=None)
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
