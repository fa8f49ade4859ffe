"""The sanitizer lane: the conformance suite under ``compute-sanitizer --tool memcheck``, for the
GPU kernels of every backend (CUDA and Triton by default).

    python -m oracle.lanes.sanitize --out DIR [--backend cuda,triton] [--profile quick]
                                    [--kernel ...] [--op ...] [--bad] [--timeout S]

runs ``python -m pytest --pyargs conformance -p no:xdist --oracle-backend cuda,triton
--oracle-profile quick`` (one process: xdist workers would each need their own sanitizer) under
``compute-sanitizer --tool memcheck --leak-check no --error-exitcode 86``, with torch's caching
allocator off (``PYTORCH_NO_CUDA_MEMORY_CACHING=1``, so every tensor is its own allocation and an
access past it is out of bounds for memcheck too). It writes under DIR:

- ``sanitizer.log``: everything the run printed, the sanitizer's reports interleaved with marker
  lines naming the test that was running (``-p oracle.lanes._sanitize_markers``);
- ``report.json``: the oracle's own conformance report of the same run;
- ``summary.json``: the parsed result (:func:`sanitize` returns it): the sanitizer's error count,
  each error (kind, access size, device function, source line, address, the test and oracle kernel
  it was attributed to by output order), counts per oracle kernel, per device function and per
  test, the pytest outcome counts, and ``ok``.

``--bad`` runs instead only the deliberately wrong ``cuda-bad.store_cache_u32slot``
(``ORACLE_PLUGINS=oracle.lanes.bad_kernels:register``, see :mod:`oracle.lanes.bad_kernels`) on the
store_cache cases; the lane must report invalid global writes in its kernel, and ``ok`` is then
whether it did. Exit status: 0 when ``ok``, 1 when not, 2 when the lane could not run at all (no
compute-sanitizer, no CUDA).

``oracle run --sanitize`` calls :func:`sanitize` with the pytest arguments it would run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from . import _sanitize_markers as markers

ERROR_EXITCODE = 86
PREFIX = "========="
BAD_PLUGIN = "oracle.lanes.bad_kernels:register"
# memcheck options, each kept only if this compute-sanitizer's --help lists it
DEFAULT_OPTIONS = (("--tool", "memcheck"), ("--leak-check", "no"), ("--error-exitcode", str(ERROR_EXITCODE)),
                   ("--report-api-errors", "no"), ("--show-backtrace", "device"), ("--print-limit", "1000"),
                   ("--target-processes", "application-only"))
XDIST_OPTIONS_WITH_VALUE = ("-n", "--numprocesses", "--dist", "--max-worker-restart", "--maxprocesses")


# ---- locating the tool --------------------------------------------------------------------------

def find_sanitizer() -> str | None:
    """compute-sanitizer from $COMPUTE_SANITIZER, CUDA_HOME (bin/ or compute-sanitizer/), or PATH."""
    explicit = os.environ.get("COMPUTE_SANITIZER")
    if explicit:
        return explicit if Path(explicit).is_file() else None
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    try:
        from torch.utils.cpp_extension import CUDA_HOME

        homes.append(CUDA_HOME)
    except Exception:
        pass
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        for rel in ("bin/compute-sanitizer", "compute-sanitizer/compute-sanitizer"):
            candidate = Path(home) / rel
            if candidate.is_file():
                return str(candidate)
    return shutil.which("compute-sanitizer")


def sanitizer_options(tool: str) -> list[str]:
    """DEFAULT_OPTIONS that ``tool --help`` lists (an option the installed version lacks would make
    it refuse to start)."""
    try:
        text = subprocess.run([tool, "--help"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    out = []
    for option, value in DEFAULT_OPTIONS:
        if not text or option in text or option == "--tool":
            out += [option, value]
    return out


def sanitizer_version(tool: str) -> str:
    try:
        text = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


# ---- the pytest command -------------------------------------------------------------------------

def default_pytest_args(*, backend: str | None = "cuda,triton", profile: str = "quick", kernel: str | None = None,
                        op: str | None = None, report: str | None = None) -> list[str]:
    """The arguments of ``python -m pytest`` for the conformance suite, as ``oracle run -n 0`` would
    build them."""
    import importlib.util

    spec = importlib.util.find_spec("conformance")
    if spec is None or spec.origin is None:
        raise RuntimeError("the conformance package is not importable (pip install -e . in the kv-oracle checkout)")
    ini = Path(spec.origin).parent / "oracle-run.ini"  # the configuration `oracle run` hands to pytest
    out = ["-c", str(ini), "--rootdir", str(ini.parent), "--pyargs", "conformance", "--oracle-profile", profile]
    for option, value in (("--oracle-backend", backend), ("--oracle-kernel", kernel), ("--oracle-op", op),
                          ("--oracle-report", report)):
        if value:
            out += [option, value]
    return out


def prepare_pytest_args(args: list[str], report: str | None) -> list[str]:
    """``args`` made fit for one sanitized process: xdist off (its options dropped), the marker
    plug-in on, and an oracle report written when none is asked for."""
    out, skip = [], False
    for arg in args:
        if skip:
            skip = False
            continue
        if arg in XDIST_OPTIONS_WITH_VALUE:
            skip = True
            continue
        if any(arg.startswith(o + "=") for o in XDIST_OPTIONS_WITH_VALUE if o.startswith("--")) or \
                (arg.startswith("-n") and arg[2:].isdigit()):
            continue
        out.append(arg)
    if "no:xdist" not in out:
        out += ["-p", "no:xdist"]
    out += ["-p", markers.__name__]
    if report and not any(a == "--oracle-report" or a.startswith("--oracle-report=") for a in out):
        out += ["--oracle-report", report]
    return out


# ---- parsing the sanitizer's output -------------------------------------------------------------

_ERROR_HEAD = re.compile(r"^=========\s(?!\s)(?P<text>.+)$")
_NOT_ERRORS = re.compile(r"^(ERROR SUMMARY|LEAK SUMMARY|COMPUTE-SANITIZER|Target application returned|"
                         r"This tool is|Error: process didn't terminate|Internal Sanitizer Error)")
_AT_NEW = re.compile(r"^at (?P<func>.+?)\+0x[0-9a-fA-F]+(?: in (?P<file>.+?)(?::(?P<line>\d+))?)?$")
_AT_OLD = re.compile(r"^at 0x[0-9a-fA-F]+ in (?P<file>[^:]+):(?P<line>\d+):(?P<func>.+)$")
_AT_BARE = re.compile(r"^at (?P<func>.+?)(?: in (?P<file>.+?))?$")
_SIZE = re.compile(r"of size (\d+)")
_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) error")
_NODE_KERNEL = re.compile(r"::test_(?P<op>\w+)\[(?P<kernel>[^\]]+)\]")


def _kind(text: str) -> str:
    for pattern, kind in (("Invalid __global__ write", "invalid global write"),
                          ("Invalid __global__ read", "invalid global read"),
                          ("Invalid __global__ atomic", "invalid global atomic"),
                          ("Invalid __shared__", "invalid shared access"),
                          ("Invalid __local__", "invalid local access"),
                          ("Misaligned", "misaligned access"), ("Program hit", "CUDA API error"),
                          ("Malloc/Free", "malloc/free error"), ("Warp Illegal", "hardware exception"),
                          ("Warp Out-of-range", "hardware exception"), ("Warp Misaligned", "hardware exception"),
                          ("Illegal", "hardware exception"), ("Leak", "leak")):
        if pattern in text:
            return kind
    return "other"


def parse_output(lines) -> dict:
    """Errors, the reported error count and the tests seen, from the run's output lines."""
    errors, current, test, tests = [], None, None, []
    summary = None
    for raw in lines:
        line = raw.rstrip("\n")
        if line.startswith(markers.START):
            test = line[len(markers.START):].strip()
            tests.append(test)
            current = None
            continue
        if line.startswith(markers.END):
            current = None
            continue
        if not (line == PREFIX or line.startswith(PREFIX + " ")):
            continue  # not the sanitizer's (pytest's own ===== rules included)
        m = _SUMMARY.search(line)
        if m:
            summary = int(m.group(1))
            current = None
            continue
        head = _ERROR_HEAD.match(line)
        if head and not _NOT_ERRORS.match(head.group("text")):
            text = head.group("text").strip()
            size = _SIZE.search(text)
            current = {"kind": _kind(text), "text": text, "size": int(size.group(1)) if size else None,
                       "function": None, "file": None, "line": None, "thread": None, "address": None,
                       "detail": [], "test": test, "kernel": _oracle_kernel(test)}
            errors.append(current)
            continue
        if current is None:
            continue
        detail = line[len(PREFIX):].strip()
        if not detail:
            current = None
            continue
        if len(current["detail"]) < 12:
            current["detail"].append(detail)
        if detail.startswith("at ") and current["function"] is None:
            m = _AT_OLD.match(detail) or _AT_NEW.match(detail) or _AT_BARE.match(detail)
            if m:
                current["function"] = m.group("func").strip()
                current["file"] = m.groupdict().get("file")
                current["line"] = int(m.group("line")) if m.groupdict().get("line") else None
        elif detail.startswith("by thread"):
            current["thread"] = detail
        elif detail.startswith("Address"):
            current["address"] = detail
    return {"errors": errors, "summary": summary, "tests": tests}


def _oracle_kernel(nodeid: str | None) -> str | None:
    if not nodeid:
        return None
    m = _NODE_KERNEL.search(nodeid)
    return m.group("kernel") if m else None


def _short_function(name: str | None) -> str:
    """A device function name without its argument list (``void ns::k<int>(Args)`` -> ``ns::k<int>``)."""
    if not name:
        return "(unknown)"
    text = name.strip()
    if text.startswith("void "):
        text = text[5:]
    depth, cut = 0, len(text)
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
    return text[:cut]


# ---- running ------------------------------------------------------------------------------------

def _prebuild(env: dict, bad: bool, log) -> dict:
    """Build (or load from the cache) the CUDA extensions outside the sanitizer."""
    code = ("import json, oracle.kernels.cuda as m\n"
            "out = {'cuda': m.available()}\n"
            + ("import oracle.lanes.bad_kernels as b\nout['cuda-bad'] = b.available()\n" if bad else "")
            + "print('PREBUILD ' + json.dumps(out))\n")
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    result = {"seconds": round(time.perf_counter() - start, 1), "returncode": proc.returncode}
    for line in proc.stdout.splitlines():
        if line.startswith("PREBUILD "):
            result.update(json.loads(line[len("PREBUILD "):]))
    if proc.returncode != 0:
        result["stderr"] = proc.stderr[-4000:]
    log(f"prebuild: {result}")
    return result


def sanitize(args: list[str] | None, out_dir, *, bad: bool = False, timeout: float | None = None,
             caching: bool = False, sanitizer: str | None = None, echo: bool = True) -> dict:
    """Run ``python -m pytest <args>`` under compute-sanitizer memcheck; write ``sanitizer.log``,
    ``report.json`` and ``summary.json`` under ``out_dir``; return the summary.

    ``args``: pytest arguments (as ``oracle run`` builds them; xdist options are dropped); None for
    the default lane (``--oracle-backend cuda,triton --oracle-profile quick``), or with ``bad`` the
    deliberately wrong kernel on store_cache. ``timeout``: seconds before the run is killed.
    ``caching``: keep torch's caching allocator (off by default, see the module doc)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    log_path, report_path, summary_path = out / "sanitizer.log", out / "report.json", out / "summary.json"

    def say(text):
        if echo:
            print(f"[sanitize] {text}", flush=True)

    summary = {"mode": "bad" if bad else "suite", "ok": False, "log": str(log_path), "report": str(report_path)}
    tool = sanitizer or find_sanitizer()
    if not tool:
        summary.update(error="compute-sanitizer not found (set COMPUTE_SANITIZER or CUDA_HOME, or put it on PATH)",
                       unavailable=True)
        summary_path.write_text(json.dumps(summary, indent=2))
        return summary
    env = dict(os.environ)
    env["PYTHONUNBUFFERED"] = "1"
    if not caching:
        env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
    if bad:
        plugins = [p for p in env.get("ORACLE_PLUGINS", "").split(",") if p.strip()]
        if BAD_PLUGIN not in plugins:
            plugins.append(BAD_PLUGIN)
        env["ORACLE_PLUGINS"] = ",".join(plugins)
    if args is None:
        if bad:
            from .bad_kernels import NAME

            args = default_pytest_args(backend="cuda-bad", kernel=NAME, op="store_cache")
        else:
            args = default_pytest_args()
    pytest_args = prepare_pytest_args(list(args), str(report_path))
    if report_path.exists():
        report_path.unlink()
    summary["prebuild"] = _prebuild(env, bad, say)
    options = sanitizer_options(tool)
    command = [tool, *options, sys.executable, "-m", "pytest", *pytest_args]
    summary.update(sanitizer=tool, sanitizer_version=sanitizer_version(tool), command=command,
                   env={k: env[k] for k in ("PYTORCH_NO_CUDA_MEMORY_CACHING", "ORACLE_PLUGINS") if k in env})
    say("running: " + " ".join(command))
    start = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace", bufsize=1, start_new_session=True)
        deadline = start + timeout if timeout else None
        try:
            for line in proc.stdout:
                log.write(line)
                if echo and line.startswith(PREFIX + " ") and "ERROR SUMMARY" not in line:
                    print(line.rstrip("\n")[:300], flush=True)
                if deadline and time.perf_counter() > deadline:
                    timed_out = True
                    break
        finally:
            if timed_out:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            proc.wait()
    seconds = time.perf_counter() - start
    parsed = parse_output(log_path.read_text(errors="replace").splitlines())
    errors = parsed["errors"]
    by_kernel = Counter(e["kernel"] or "(no test running)" for e in errors)
    by_function = Counter(_short_function(e["function"]) for e in errors)
    by_test = Counter(e["test"] or "(no test running)" for e in errors)
    by_kind = Counter(e["kind"] for e in errors)
    statuses = {}
    if report_path.exists():
        try:
            report = json.loads(report_path.read_text())
            statuses = dict(Counter(c.get("status") for c in report.get("cases", [])))
        except (OSError, ValueError):
            statuses = {"(unreadable report)": 1}
    reported = parsed["summary"]
    summary.update(exit_code=proc.returncode, timed_out=timed_out, seconds=round(seconds, 1),
                   error_summary=reported, errors_parsed=len(errors), tests_run=len(parsed["tests"]),
                   by_kind=dict(by_kind), by_kernel=dict(by_kernel), by_device_function=dict(by_function),
                   by_test=dict(by_test.most_common(50)), case_statuses=statuses, errors=errors[:200])
    error_count = reported if reported is not None else len(errors)
    if bad:
        from .bad_kernels import KERNEL_SYMBOL, NAME

        caught = [e for e in errors if KERNEL_SYMBOL in (e["function"] or "") or e["kernel"] == NAME]
        summary["caught"] = len(caught)
        summary["ok"] = bool(caught) and any(e["kind"].startswith("invalid global") or
                                             e["kind"] == "hardware exception" for e in caught)
        summary["verdict"] = (f"the sanitizer caught the deliberately wrong kernel: {len(caught)} error(s) in "
                              f"{KERNEL_SYMBOL}" if summary["ok"] else
                              "NOT CAUGHT: the sanitizer reported no invalid access in the deliberately wrong "
                              f"kernel (case statuses: {statuses or 'no report'})")
    else:
        clean_exit = proc.returncode != ERROR_EXITCODE and not timed_out and reported is not None
        ran = sum(n for status, n in statuses.items() if status in ("pass", "fail", "crashed", "works, not declared"))
        summary["cases_run"] = ran
        summary["ok"] = error_count == 0 and clean_exit and ran > 0
        summary["verdict"] = (
            f"clean: memcheck reported no errors over {ran} cases" if summary["ok"] else
            f"timed out after {seconds:.0f} s" if timed_out else
            "no conformance case ran (kernels unavailable? see case_statuses)" if error_count == 0 and ran == 0 else
            "the sanitizer printed no ERROR SUMMARY (did it start?)" if reported is None else
            f"{error_count} memcheck error(s): " + ", ".join(f"{k} x{n}" for k, n in by_kernel.most_common(8)))
    summary_path.write_text(json.dumps(summary, indent=2, default=str))
    say(summary["verdict"])
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.lanes.sanitize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="directory for sanitizer.log, report.json, summary.json")
    parser.add_argument("--backend", default="cuda,triton", help="--oracle-backend (default cuda,triton)")
    parser.add_argument("--profile", default="quick", choices=("quick", "full", "exhaustive"))
    parser.add_argument("--kernel", help="--oracle-kernel")
    parser.add_argument("--op", help="--oracle-op")
    parser.add_argument("--bad", action="store_true",
                        help="run the deliberately wrong kernel instead; succeed if the sanitizer catches it")
    parser.add_argument("--timeout", type=float, default=None, help="kill the run after this many seconds")
    parser.add_argument("--caching", action="store_true", help="keep torch's caching allocator")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments, after --")
    ns = parser.parse_args(argv)
    if ns.bad:
        from .bad_kernels import NAME

        args = default_pytest_args(backend="cuda-bad", kernel=ns.kernel or NAME, op=ns.op or "store_cache",
                                   profile=ns.profile)
    else:
        args = default_pytest_args(backend=ns.backend, kernel=ns.kernel, op=ns.op, profile=ns.profile)
    result = sanitize(args + list(ns.pytest_args), ns.out, bad=ns.bad, timeout=ns.timeout, caching=ns.caching)
    shown = {k: v for k, v in result.items() if k not in ("errors", "command", "by_test")}
    print(json.dumps(shown, indent=2, default=str))
    if result.get("unavailable"):
        return 2
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
