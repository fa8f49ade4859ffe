"""Everything about the CUDA kernels in one call on a Hopper machine, within a time budget.

    python3 -m oracle.lanes.gpu_check --out "$OUT" [--budget 560] [--sanitize bad,cuda]

Steps (a table printed last; everything in ``OUT/gpu_check.json``):

0. ``preflight``: which packages import (pytest, xdist, hypothesis, ml_dtypes, ninja, triton); when
   kv-oracle is not installed, ``pip install --no-build-isolation --no-deps -e .`` (offline) so its
   pytest plug-in and entry points exist, else ``-p oracle.pytest_plugin``;
1. ``env``: torch / CUDA / GPU / nvcc / compute-sanitizer versions;
2. ``build``: builds (or loads from the cache) the extension, timed; stops here if it fails;
3. ``plans``: the path and vector width each bench workload takes (MLA must say ``direct vec=16``);
4. ``unit``: ``pytest tests/test_cuda_kernels.py`` (opcheck, every width and MLA path against a
   reference, many rows per warp, fp8 specials, graph capture), when the tests directory exists;
5. ``conformance`` (and ``conformance-full`` with ``--profiles quick,full``): the suite's quick
   (full) profile for backend cuda (``oracle run --backend cuda --profile ...`` equivalent, -n 4;
   ORACLE_PLUGINS adds the kernels when no ``cuda`` entry point is installed);
6. ``bench``: the bench workloads (MLA 512+64 bf16 at N=16384 and 65536, store_cache 2 KiB rows,
   reshape_and_cache_flash auto and e4m3fn at 16384) against the device copy ceiling, the Triton
   writer when it is available, and torch ``index_put_`` on the GPU; each result checked byte for
   byte against torch;
7. ``sanitize-bad``: the sanitizer lane on the deliberately wrong kernel (must be caught);
8. ``sanitize-cuda``: the sanitizer lane on the cuda backend's quick profile (with what time is left).

At most 8 files land in OUT (the device tool returns no more): gpu_check.json, unit.log,
conformance.log, conformance.json (conformance-full.log, conformance-full.json with the full
profile), sanitize-bad.log, sanitize-cuda.log (logs cut to 15 MiB);
everything else goes to ``--scratch`` (a temporary directory by default). Exit status 0 when every
step that ran passed. The steps themselves are in :mod:`oracle.lanes.gpu_steps`; this module runs
them in order and writes the summary.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import traceback
from pathlib import Path

from .gpu_steps import (PLUGIN, REPO, TRITON_PLUGIN, Budget, clip_file, plugin_env, run_step, step_bench,
                        step_build, step_env, step_plans, step_preflight)


# ---- main ----------------------------------------------------------------------------------------

def conformance_args(workers: str, report: Path, plugin_arg: list[str], profile: str = "quick") -> list[str]:
    """``oracle run --backend cuda --profile <profile> -n <workers>`` as pytest arguments."""
    from .sanitize import default_pytest_args

    args = default_pytest_args(backend="cuda", profile=profile, report=str(report))
    if workers not in ("0", ""):
        args += ["-n", workers, "--dist", "load", "--max-worker-restart", "1000"]
    return args + ["--continue-on-collection-errors", "-q"] + plugin_arg


def summarize_report(path: Path) -> dict:
    """Counts per status and kernel, and the failing cases with their messages, from a report."""
    from oracle import report as report_mod

    data = report_mod.load(str(path))
    cases = data.get("cases", [])
    counts: dict = {}
    for c in cases:
        counts.setdefault(c["kernel"], {}).setdefault(c["status"], 0)
        counts[c["kernel"]][c["status"]] += 1
    failing = [{"kernel": c["kernel"], "op": c["op"], "case": c["case_id"], "status": c["status"],
                "message": (c.get("message") or "")[:1500]} for c in cases if c["status"] in report_mod.FAILING]
    undeclared = [f"{c['kernel']} {c['case_id']}" for c in cases if c["status"] == "works, not declared"]
    return {"counts": counts, "failing": failing[:60], "failing_total": len(failing),
            "works_not_declared": undeclared[:40], "text": report_mod.render_text([data])}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m oracle.lanes.gpu_check",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "gpu_check_out"),
                        help="at most 8 files land here (default $OUT)")
    parser.add_argument("--scratch", default=None, help="everything else (default: a temporary directory)")
    parser.add_argument("--budget", type=float, default=560.0, help="seconds for everything (default 560)")
    parser.add_argument("--workers", default="4", help="xdist workers for the unit tests and conformance")
    parser.add_argument("--sanitize", default="bad,cuda",
                        help="sanitizer runs, comma-separated: bad, or backends (cuda, triton, cuda+triton for "
                             "one run of both); 'none' to skip")
    parser.add_argument("--skip", default="", help="steps to skip (comma-separated: unit, conformance, bench)")
    parser.add_argument("--profiles", default="quick",
                        help="conformance profiles to run, comma-separated (quick, full, exhaustive); each "
                             "after the first is its own step, conformance-<profile>")
    ns = parser.parse_args(argv)
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    scratch = Path(ns.scratch or tempfile.mkdtemp(prefix="kvo-gpu-check-"))
    scratch.mkdir(parents=True, exist_ok=True)
    budget = Budget(ns.budget)
    skip = {s.strip() for s in ns.skip.split(",") if s.strip()}
    results: dict = {"scratch": str(scratch)}

    def save():
        (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))

    def guarded(name, fn, *args):
        try:
            results[name] = fn(*args)
        except Exception as exc:
            traceback.print_exc()
            results[name] = {"status": "fail", "error": f"{type(exc).__name__}: {exc}"}
        save()

    guarded("preflight", step_preflight)
    guarded("env", step_env)
    guarded("build", step_build)
    if results["build"]["status"] != "pass":
        return _finish(results, out)
    guarded("plans", step_plans)
    pre = results.get("preflight", {})
    mods = pre.get("modules", {})
    plugin_arg = [] if pre.get("pytest_plugin_installed") else ["-p", "oracle.pytest_plugin"]
    workers = ns.workers if mods.get("xdist") else "0"
    xdist = ["-n", workers] if workers != "0" else []
    env = plugin_env()
    tests = REPO / "tests" / "test_cuda_kernels.py"
    if "unit" not in skip and tests.is_file():
        results["unit"] = run_step("unit", [sys.executable, "-m", "pytest", str(tests), "-q", "-rfEs",
                                            "-p", "no:cacheprovider", *xdist, *plugin_arg], out,
                                   budget.cap(170), env=env, cwd=REPO)
        clip_file(out / "unit.log")
        save()
    profiles = [p.strip() for p in ns.profiles.split(",") if p.strip()] or ["quick"]
    for i, profile in enumerate(profiles if "conformance" not in skip else []):
        name = "conformance" if i == 0 else f"conformance-{profile}"
        report = out / f"{name}.json"
        step = run_step(name, [sys.executable, "-m", "pytest",
                               *conformance_args(workers, report, plugin_arg, profile)],
                        out, budget.cap(200 if profile == "quick" else 300), env=env, cwd=REPO)
        step["profile"] = profile
        if report.is_file():
            try:
                summary = summarize_report(report)
                with open(out / f"{name}.log", "a") as f:
                    f.write("\n\n" + summary.pop("text"))
                step.update(summary)
                if summary["failing_total"]:
                    step["status"] = "fail"
                elif step["status"] == "fail":  # pytest's own status: collection errors, plug-in errors
                    step["note"] = f"no failing case in the report; see {name}.log for pytest's errors"
            except Exception as exc:
                step["report_error"] = f"{type(exc).__name__}: {exc}"
        clip_file(out / f"{name}.log")
        results[name] = step
        save()
    if "bench" not in skip and budget.left() > 60:
        guarded("bench", step_bench, scratch)
    runs = [s.strip() for s in ns.sanitize.split(",") if s.strip() and s.strip() != "none"]
    for which in runs:
        cap = budget.cap(150 if which == "bad" else 480, reserve=10)
        name = f"sanitize-{which.replace('+', '-')}"
        if cap < 30:
            results[name] = {"status": "skipped", "why": "no time left in the budget"}
            continue
        cmd = [sys.executable, "-m", "oracle.lanes.sanitize", "--out", str(scratch / name),
               "--timeout", str(int(cap - 20))]
        cmd += ["--bad"] if which == "bad" else ["--backend", which.replace("+", ",")]
        cmd += ["--", "--continue-on-collection-errors", *plugin_arg]
        run_env = plugin_env((PLUGIN, TRITON_PLUGIN) if "triton" in which else (PLUGIN,))
        step = run_step(name, cmd, scratch, cap, env=run_env, cwd=REPO)
        summary = scratch / name / "summary.json"
        if summary.is_file():
            data = json.loads(summary.read_text())
            step.update({k: data.get(k) for k in ("verdict", "error_summary", "errors_parsed", "by_kind",
                                                  "by_kernel", "by_device_function", "case_statuses",
                                                  "timed_out", "seconds", "command", "prebuild")})
            step["first_errors"] = (data.get("errors") or [])[:5]
            if data.get("timed_out") and not data.get("errors_parsed") and which != "bad":
                step["status"] = "incomplete"  # ran out of time with no error so far: not a failure
                step["verdict"] = f"incomplete (time budget) with no memcheck error so far: {data.get('verdict')}"
        log = scratch / name / "sanitizer.log"
        if log.is_file():
            shutil.copyfile(log, out / f"{name}.log")
            with open(out / f"{name}.log", "a") as f:
                f.write("\n\n==== the sanitize command's own output ====\n")
                f.write((scratch / f"{name}.log").read_text(errors="replace")[-20000:])
            clip_file(out / f"{name}.log")
        results[name] = step
        save()
    return _finish(results, out)


def _finish(results: dict, out: Path) -> int:
    (out / "gpu_check.json").write_text(json.dumps(results, indent=2, default=str))
    print("\n================ gpu_check summary ================")
    failed = False
    for name, r in results.items():
        if not isinstance(r, dict):
            continue
        status = r.get("status", "?")
        failed |= status in ("fail", "timeout")
        extra = ""
        if name == "preflight":
            missing = [m for m, ok in r.get("modules", {}).items() if not ok]
            extra = (f"missing: {', '.join(missing) or 'nothing'}; kv-oracle installed before: "
                     f"{r.get('kv_oracle_installed_before')}, pytest plug-in: {r.get('pytest_plugin_installed')}")
        elif name == "build":
            extra = (f"{r.get('seconds')} s, built={r.get('built')}, static libstdc++ copy: "
                     f"{r.get('static_libstdcxx')} {str(r.get('reason', ''))[:300]}")
        elif name == "plans":
            extra = ", ".join(f"{k}: {v}" for k, v in r.get("plans", {}).items())
        elif name == "env":
            extra = f"{r.get('gpu')} cc {r.get('capability')}, torch {r.get('torch')}, triton {r.get('triton')}"
        elif name.startswith("conformance"):
            counts = "; ".join(f"{k}: " + ", ".join(f"{n} {s}" for s, n in v.items())
                               for k, v in r.get("counts", {}).items())
            extra = f"{r.get('seconds', '')} s; {counts}; failing {r.get('failing_total', '?')}"
            for f in r.get("failing", [])[:8]:
                extra += f"\n{'':<25}FAIL {f['kernel']} {f['case']}: {f['message'].splitlines()[0][:150] if f['message'] else ''}"
        elif name == "bench":
            extra = "; ".join(f"{x['op']}/{x['variant']} N={x['n']} {x['kernel']}: {x.get('pct_copy', 'ERR')}%"
                              + (f" [goal {x['goal_pct']}%: {'met' if x['meets_goal'] else 'MISSED'}"
                                 + ({True: ", faster than triton", False: ", SLOWER than triton"}
                                    .get(x.get("faster_than_triton"), "")) + "]"
                                 if "goal_pct" in x else "")
                              for x in r.get("rows", []) if x.get("kernel") in ("cuda", "triton"))
        elif name.startswith("sanitize"):
            extra = str(r.get("verdict") or r.get("why") or r.get("error") or "")
        else:
            extra = f"{r.get('seconds', '')} s, log {r.get('log', '')} {r.get('error', '')}"
        print(f"{name:<17} {status:<8} {extra}")
    print(f"results: {out / 'gpu_check.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
