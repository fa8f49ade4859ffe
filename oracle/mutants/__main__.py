"""``python -m oracle.mutants [--profile P] [--mutant NAME ...] [--complete]``: the self-check."""

from __future__ import annotations

import argparse
import sys
import warnings

from . import MUTANTS, format_table, self_check


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.mutants",
                                     description="run the case catalogue against the mutant kernels")
    parser.add_argument("--profile", default="quick", choices=("quick", "full", "exhaustive"))
    parser.add_argument("--mutant", action="append", metavar="NAME",
                        help="only this mutant (repeatable); known: "
                             + ", ".join(m.short for m in MUTANTS))
    parser.add_argument("--complete", action="store_true",
                        help="run every case, even after a class has killed the mutant")
    parser.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    args = parser.parse_args(argv)

    def progress(done, total, result):
        print(f"[{done}/{total}] {result.name} ({result.seconds:.1f}s)", file=sys.stderr, flush=True)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # fp8 special values overflow on purpose
        result = self_check(args.profile, args.mutant, None if args.quiet else progress,
                            complete=args.complete)
    print(format_table(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
