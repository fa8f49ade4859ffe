"""The ``oracle`` command."""

from __future__ import annotations

import argparse
import sys

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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "handler", None) is None:
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
