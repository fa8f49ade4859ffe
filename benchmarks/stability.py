"""Is the quick profile deterministic? Rerun it N times and list every case whose outcome changes.

Each run is ``python -m oracle run --profile quick --report runK.json --junit runK.xml``, seeded as
CI runs it and nothing more: every catalogue case builds its inputs from a seed derived from its id
(``oracle.ops.base.Case.seed``), the property tests and the SWA pool state machine are
hypothesis-derandomized under the quick profile with no example database
(``conformance/test_properties.py``, ``conformance/test_swa_pool.py``), pytest's cache is off
(``conformance/oracle-run.ini``) and ``TRITON_INTERPRET=1`` is set unless the environment sets it.
PYTHONHASHSEED is left as the environment has it (unset: random per process, as in CI), so an
outcome that depends on string-hash order shows up as a difference.

A case's outcome is its report record's status, case id (for a property test: the last example
hypothesis drew), diagnosed cause and message; the per-case time is not compared. Pytest items
that are not oracle cases (the SWA pool state machine, the reference self-check) are compared by
their JUnit result. The run's exit status is compared too.

``--snapshot REV`` runs a clean ``git archive`` export of REV instead of the working tree, so that
edits made while the runs go on cannot masquerade as nondeterminism.

    python benchmarks/stability.py --runs 20 [--snapshot HEAD] [--out DIR] [--summary OUT.json]
                                   [-- more oracle run arguments]

Exit status: 0 when every run wrote a report and no outcome differs, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def case_outcomes(report: dict) -> dict:
    """nodeid -> (status, case id, cause id, message) for every case record of a report."""
    out = {}
    for case in report["cases"]:
        cause = case["cause"]["id"] if case.get("cause") else None
        out[case["nodeid"]] = (case["status"], case["case_id"], cause, case["message"])
    return out


def junit_outcomes(path: Path) -> dict:
    """Each JUnit test case, keyed "junit:<class>::<name>": passed, failure, error or skipped."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        kinds = [child.tag for child in case if child.tag in ("failure", "error", "skipped")]
        out[f"junit:{case.get('classname')}::{case.get('name')}"] = kinds[0] if kinds else "passed"
    return out


def differences(runs: list[dict]) -> dict:
    """key -> [outcome in run 1, run 2, ...] (None where a run lacks the key), for every key
    whose outcome is not the same in all runs."""
    keys = set().union(*runs) if runs else set()
    out = {}
    for key in sorted(keys):
        seen = [run.get(key) for run in runs]
        if any(outcome != seen[0] for outcome in seen[1:]):
            out[key] = seen
    return out


def export_snapshot(rev: str, into: Path) -> str:
    """Write ``git archive rev`` of this repository into ``into``; return the full commit."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--verify", rev + "^{commit}"],
                            check=True, capture_output=True, text=True).stdout.strip()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", "--format=tar", commit],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return commit


def run_once(source: Path, report: Path, junit: Path, extra: list[str], env: dict) -> tuple[int, float]:
    """One quick-profile run of the code under ``source``; (exit status, wall seconds)."""
    command = [sys.executable, "-m", "oracle", "run", "--profile", "quick", "--report", str(report),
               "--junit", str(junit), *extra]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=source, env=env, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    if done.returncode not in (0, 1):  # 1: some case failed, which is an outcome like any other
        sys.stderr.write(done.stderr[-4000:])
    return done.returncode, time.perf_counter() - started


def _short(outcome) -> str:
    if outcome is None:
        return "(absent)"
    if isinstance(outcome, tuple):
        status, case_id, cause, message = outcome
        return f"{status} {case_id}" + (f" cause={cause}" if cause else "") + \
            (f" | {message[:100]}" if message else "")
    return str(outcome)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="how many quick-profile runs (>= 2)")
    parser.add_argument("--snapshot", metavar="REV", help="run a clean export of this commit")
    parser.add_argument("--out", metavar="DIR", help="keep each run's report and JUnit XML here")
    parser.add_argument("--summary", metavar="PATH", help="write the result as JSON here")
    parser.add_argument("oracle_args", nargs="*", help="more `oracle run` arguments, after --")
    args = parser.parse_args(argv)
    if args.runs < 2:
        parser.error("--runs must be at least 2 to compare anything")

    env = dict(os.environ)
    env.setdefault("TRITON_INTERPRET", "1")
    with tempfile.TemporaryDirectory(prefix="kv-oracle-stability-") as scratch:
        out = Path(args.out) if args.out else Path(scratch) / "runs"
        out.mkdir(parents=True, exist_ok=True)
        source, commit = REPO, None
        if args.snapshot:
            source = Path(scratch) / "tree"
            source.mkdir()
            commit = export_snapshot(args.snapshot, source)
            # the snapshot's packages shadow the editable install of the working tree
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(source), env.get("PYTHONPATH")]))
        outcomes, walls, statuses, sizes = [], [], [], []
        for k in range(1, args.runs + 1):
            report_path, junit_path = out / f"run{k:02d}.json", out / f"run{k:02d}.xml"
            rc, wall = run_once(source, report_path, junit_path, args.oracle_args, env)
            if not report_path.exists() or not junit_path.exists():
                print(f"run {k}: exit status {rc} and no report; stopping", file=sys.stderr)
                return 1
            report = json.loads(report_path.read_text())
            ran_from = Path(report["command"][1]).resolve()  # -c <the ini of the oracle package used>
            if not ran_from.is_relative_to(source.resolve()):
                print(f"run {k} ran {ran_from}, not the code under {source}", file=sys.stderr)
                return 1
            commit = commit or report["tool"]["git_commit"]
            cases = case_outcomes(report)
            items = junit_outcomes(junit_path)
            # JUnit names a case "test_kernels::test_x[...]" where the report says
            # "test_kernels.py::test_x[...]": keep only the items the report does not hold
            reported = {"junit:" + nodeid.replace(".py::", "::", 1) for nodeid in cases}
            run = {**cases, **{key: v for key, v in items.items() if key not in reported},
                   "(exit status)": rc}
            outcomes.append(run)
            walls.append(wall)
            sizes.append((len(cases), len(items)))
            statuses.append(Counter(status for status, *_ in cases.values()))
            print(f"run {k}/{args.runs}: exit {rc}, {wall:.1f} s, {len(cases)} cases, {len(items)} "
                  f"pytest items; " + ", ".join(f"{n} {s}" for s, n in sorted(statuses[-1].items())),
                  flush=True)

        differing = differences(outcomes)
        for key, seen in differing.items():
            print(f"DIFFERS {key}")
            for k, outcome in enumerate(seen, 1):
                print(f"    run {k}: {_short(outcome)}")
        result = {"runs": args.runs, "commit": commit, "snapshot": bool(args.snapshot),
                  "cases_per_run": sorted({n for n, _ in sizes}),
                  "pytest_items_per_run": sorted({n for _, n in sizes}),
                  "statuses": dict(statuses[0]), "differences": len(differing),
                  "differing": sorted(differing), "run_wall_s": [round(w, 1) for w in walls],
                  "median_run_wall_s": round(statistics.median(walls), 1),
                  "total_wall_s": round(sum(walls), 1), "oracle_args": args.oracle_args,
                  "TRITON_INTERPRET": env.get("TRITON_INTERPRET"),
                  "PYTHONHASHSEED": env.get("PYTHONHASHSEED", "unset (random per process)")}
        print(json.dumps(result, indent=1))
        if args.summary:
            Path(args.summary).write_text(json.dumps(result, indent=1) + "\n")
        return 1 if differing else 0


if __name__ == "__main__":
    sys.exit(main())
