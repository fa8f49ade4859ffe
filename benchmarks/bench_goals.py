"""The speed goals of the GPU writers, judged from one ``oracle bench --json`` report: a thin script
over ``oracle report bench-goals`` (the goals are listed in ``oracle/bench/goals.py``).

    python benchmarks/bench_goals.py reports/h100-bench.json [--before OLD.json]

Prints the goals as a Markdown table, then how many are met. ``--markdown``, which earlier versions
needed for the table, is accepted and changes nothing.
"""

from __future__ import annotations

import sys

from oracle.cli import main

if __name__ == "__main__":
    sys.exit(main(["report", "bench-goals", *(a for a in sys.argv[1:] if a != "--markdown")]))
