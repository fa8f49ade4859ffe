"""Throughput of the fp8 reference ``quantize`` vs ml_dtypes' ``astype`` (single thread), and
optionally the wall time of the exhaustive 2**32-input check.

    python benchmarks/bench_fp8_reference.py                  # 2**24 values, all formats
    python benchmarks/bench_fp8_reference.py --log2n 22 --repeats 5 --formats e4m3fn
    python benchmarks/bench_fp8_reference.py --exhaustive     # also times the exhaustive tests

Inputs (float32): "sequential" = 2**log2n consecutive bit patterns from 0.5 up (all normal
numbers), "random" = uniformly random bit patterns (NaN, inf, subnormals included), "gaussian" =
standard normal * 10 (KV-cache-like). Our quantize is run with preset "ml_dtypes" (the same
semantics as astype) and with the default "ocp_satfinite"; numbers are Mvalues/s, best and median
of the repeats, after one warm-up call (which builds the 2**17-entry code table).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import ml_dtypes  # noqa: E402
import numpy as np  # noqa: E402

from oracle.reference.fp8 import FORMATS, dequantize, quantize  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
EXHAUSTIVE_CMD = [sys.executable, "-m", "pytest", "-m", "exhaustive", "-n", "2", "-q",
                  "-p", "no:cacheprovider", "tests/test_fp8_exhaustive.py"]


def make_inputs(kind: str, n: int) -> np.ndarray:
    if kind == "sequential":
        start = int(np.array([0.5], np.float32).view(np.uint32)[0])
        return (np.arange(n, dtype=np.uint32) + np.uint32(start)).view(np.float32)
    rng = np.random.default_rng(20261122)
    if kind == "random":
        return rng.integers(0, 1 << 32, size=n, dtype=np.uint32).view(np.float32)
    if kind == "gaussian":
        return (rng.standard_normal(n, dtype=np.float32) * np.float32(10))
    raise ValueError(kind)


def timed(fn, repeats: int) -> list[float]:
    fn()  # warm-up: table build, page faults
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def rates(times: list[float], n: int) -> tuple[float, float]:
    """(best, median) in Mvalues/s."""
    return n / min(times) / 1e6, n / statistics.median(times) / 1e6


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def header(args) -> None:
    flags = ""
    try:
        text = Path("/proc/cpuinfo").read_text()
        flags = "AVX-512" if "avx512f" in text else ("AVX2" if "avx2" in text else "")
    except OSError:
        pass
    print(f"# fp8 reference benchmark, {datetime.date.today().isoformat()}")
    print(f"# machine: {platform.machine()} {cpu_model()} {flags}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.2f}")
    print(f"# python {platform.python_version()}, numpy {np.__version__}, "
          f"ml_dtypes {ml_dtypes.__version__}; single thread; n = 2**{args.log2n}, "
          f"{args.repeats} repeats")
    print(f"# command: {' '.join([Path(sys.executable).name] + sys.argv)}")


def bench(args) -> None:
    n = 1 << args.log2n
    print()
    print("| format | input | ours ml_dtypes preset best / median | ours ocp_satfinite best / median"
          " | ml_dtypes astype best / median | ours / ml_dtypes (best, median) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for fmt in args.formats:
        ml_type = FORMATS[fmt].ml_dtype
        for kind in args.inputs:
            x = make_inputs(kind, n)
            with np.errstate(all="ignore"):
                t_ours = timed(lambda: quantize(x, fmt, preset="ml_dtypes"), args.repeats)
                t_sat = timed(lambda: quantize(x, fmt), args.repeats)
                t_ml = timed(lambda: x.astype(ml_type), args.repeats)
            ours, sat, ml = rates(t_ours, n), rates(t_sat, n), rates(t_ml, n)
            print(f"| {fmt} | {kind} | {ours[0]:.0f} / {ours[1]:.0f} | {sat[0]:.0f} / {sat[1]:.0f}"
                  f" | {ml[0]:.0f} / {ml[1]:.0f} | {ours[0] / ml[0]:.2f}, {ours[1] / ml[1]:.2f} |",
                  flush=True)
    print()
    print("| format | dequantize (ours) best / median | ml_dtypes astype(float32) best / median "
          "| ratio (best, median) |")
    print("| --- | --- | --- | --- |")
    for fmt in args.formats:
        codes = np.random.default_rng(1).integers(0, 256, size=n, dtype=np.uint8)
        view = codes.view(FORMATS[fmt].ml_dtype)
        ours = rates(timed(lambda: dequantize(codes, fmt), args.repeats), n)
        ml = rates(timed(lambda: view.astype(np.float32), args.repeats), n)
        print(f"| {fmt} | {ours[0]:.0f} / {ours[1]:.0f} | {ml[0]:.0f} / {ml[1]:.0f} | "
              f"{ours[0] / ml[0]:.2f}, {ours[1] / ml[1]:.2f} |", flush=True)


def exhaustive() -> int:
    print()
    print(f"# exhaustive: {' '.join(EXHAUSTIVE_CMD[1:])} (cwd {REPO})")
    load_before = os.getloadavg()[0]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(EXHAUSTIVE_CMD, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    tail = (proc.stdout.strip().splitlines() or [""])[-1]
    print(f"# exit {proc.returncode}: {tail}")
    print(f"# wall {wall:.1f} s ({wall / 60:.2f} min), CPU {cpu:.1f} s over all processes, "
          f"load average before {load_before:.2f}, after {os.getloadavg()[0]:.2f}")
    if proc.returncode:
        print(proc.stdout[-4000:], proc.stderr[-2000:], sep="\n")
    return proc.returncode


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--log2n", type=int, default=24, help="log2 of the number of values")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--formats", nargs="+", default=list(FORMATS), choices=list(FORMATS))
    parser.add_argument("--inputs", nargs="+", default=["sequential", "random", "gaussian"],
                        choices=["sequential", "random", "gaussian"])
    parser.add_argument("--exhaustive", action="store_true",
                        help="also time `pytest -m exhaustive -n 2 tests/test_fp8_exhaustive.py`")
    parser.add_argument("--exhaustive-only", action="store_true",
                        help="only time the exhaustive check")
    args = parser.parse_args(argv)
    header(args)
    if not args.exhaustive_only:
        bench(args)
    if args.exhaustive or args.exhaustive_only:
        return exhaustive()
    return 0


if __name__ == "__main__":
    sys.exit(main())
