"""Kernel throughput against the torch baseline and the machine's copy bandwidth: a thin script
over ``oracle bench`` (``oracle/bench/``; options there: --backend, --op, --json, --plot, --sizes,
--repeats).

    python benchmarks/bench_kernels.py                                  # every op, N = 1 .. 16384
    python benchmarks/bench_kernels.py --op store_cache --sizes 256,16384 --repeats 31
    python benchmarks/bench_kernels.py --json bench.json --plot bench.png

The CPU kernels (``oracle.kernels.cpu``) are added through ORACLE_PLUGINS unless an installed entry
point already registers them.
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points

CPU_PLUGIN = "oracle.kernels.cpu:register"

if __name__ == "__main__":
    declared = {ep.value for ep in entry_points(group="oracle.kernels")}
    plugins = [p for p in os.environ.get("ORACLE_PLUGINS", "").split(",") if p.strip()]
    if CPU_PLUGIN not in declared and CPU_PLUGIN not in plugins:
        os.environ["ORACLE_PLUGINS"] = ",".join(plugins + [CPU_PLUGIN])
    from oracle.bench import cli

    sys.exit(cli())
