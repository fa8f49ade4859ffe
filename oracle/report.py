"""The conformance report: one JSON document per run, versioned, validated, and merged across
machines into one matrix (docs/report-schema.md).

A report holds the execution target (CPU, GPU, driver and library versions, kv-oracle version and
commit), the profile, each kernel's contract and availability, and each case's outcome. Reports
from several machines merge into a matrix whose columns are the targets.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import subprocess
from collections import Counter, defaultdict
from importlib import metadata
from pathlib import Path

from . import __version__

SCHEMA_VERSION = 5  # 2: each case's diagnosed "cause" and difference "pattern"; 3: the run's "limits",
# the statuses "timeout" and "not run"; 4: each case's "device" (the GPU it ran on); 5: "interrupted"
# (a run stopped from outside: what finished and what was in flight)
STATUSES = ("pass", "fail", "crashed", "timeout", "not supported", "works, not declared", "not run",
            "unavailable")
FAILING = ("fail", "crashed", "timeout")

# The schema, field by field: name -> (type or types, required). Nested objects have their own
# entries; lists name their item schema. docs/report-schema.md explains each field.
_STR, _NUM, _OPT_STR = (str,), (int, float), (str, type(None))
SCHEMA = {
    "report": {"schema_version": ((int,), True), "tool": (("tool",), True), "target": (("target",), True),
               "profile": (_STR, True), "started": (_STR, True), "duration_s": (_NUM, True),
               "command": (([str],), True), "kernels": (([("kernel",)],), True),
               "plugin_errors": (([("plugin_error",)],), True), "limits": (("limits", type(None)), True),
               "interrupted": (("interrupted", type(None)), True), "cases": (([("case",)],), True)},
    "interrupted": {"finished": ((int,), True), "collected": ((int,), True), "in_flight": (([("in_flight",)],), True)},
    "in_flight": {"kernel": (_STR, True), "case_id": (_STR, True), "case_class": (_STR, True),
                  "params": ((dict,), True), "seed": ((int, type(None)), True), "device": ((dict, type(None)), True),
                  "running_s": ((int, float, type(None)), True), "nodeid": (_STR, True), "replay": (_STR, True)},
    "limits": {"timeout_s": (_NUM, True), "memory_gb": ((int, float, type(None)), True),
               "memory_budgets": ((dict,), True)},
    "tool": {"name": (_STR, True), "version": (_STR, True), "git_commit": (_OPT_STR, True)},
    "target": {"name": (_STR, True), "hostname": (_STR, True), "platform": (_STR, True),
               "cpu": (("cpu",), True), "gpu": (("gpu", type(None)), True),
               "versions": ((dict,), True)},
    "cpu": {"model": (_STR, True), "cores": ((int,), True), "flags": (([str],), True)},
    "gpu": {"name": (_STR, True), "capability": (_STR, True), "driver": (_OPT_STR, True),
            "cuda": (_OPT_STR, True), "rocm": (_OPT_STR, True)},
    "kernel": {"name": (_STR, True), "op": (_STR, True), "backend": (_STR, True),
               "plugin": (_STR, True), "contract": ((dict,), True), "unavailable": (_OPT_STR, True)},
    "plugin_error": {"plugin": (_STR, True), "error": (_STR, True)},
    "case": {"op": (_STR, True), "kernel": (_STR, True), "case_id": (_STR, True),
             "case_class": (_STR, True), "params": ((dict,), True), "seed": ((int, type(None)), True),
             "status": (_STR, True), "seconds": (_NUM, True), "message": (_STR, True),
             "first_difference": ((dict, type(None)), True), "cause": (("cause", type(None)), True),
             "pattern": (([str],), True), "nodeid": (_STR, True), "device": (("device", type(None)), True)},
    "device": {"index": (_STR, True), "name": (_STR, True), "uuid": (_OPT_STR, True), "pci_bus_id": (_OPT_STR, True),
               "capability": (_STR, True)},
    "cause": {"id": (_STR, True), "text": (_STR, True), "class": (_STR, True),
              "also": (([("cause_also",)],), True)},
    "cause_also": {"id": (_STR, True), "text": (_STR, True)},
}


def validate(report: dict) -> list[str]:
    """Every way ``report`` departs from the schema (empty when it conforms)."""
    problems: list[str] = []
    _check(report, "report", "$", problems)
    if not problems and report["schema_version"] != SCHEMA_VERSION:
        problems.append(f"$.schema_version is {report['schema_version']}; this kv-oracle reads {SCHEMA_VERSION}")
    for i, case in enumerate(report.get("cases", []) if not problems else []):
        if case["status"] not in STATUSES:
            problems.append(f"$.cases[{i}].status {case['status']!r} is not one of {', '.join(STATUSES)}")
    return problems


def _check(value, kind, path, problems) -> None:
    if not isinstance(value, dict):
        problems.append(f"{path} is {type(value).__name__}, expected an object ({kind})")
        return
    fields = SCHEMA[kind]
    for key in sorted(set(value) - set(fields)):
        problems.append(f"{path}.{key} is not in the schema")
    for key, (types, required) in fields.items():
        if key not in value:
            if required:
                problems.append(f"{path}.{key} is missing")
            continue
        _check_value(value[key], types, f"{path}.{key}", problems)


def _check_value(value, types, path, problems) -> None:
    for t in types:
        if isinstance(t, list):  # a list of items of schema t[0]
            if isinstance(value, list):
                for i, item in enumerate(value):
                    _check_value(item, (t[0],) if not isinstance(t[0], tuple) else t[0], f"{path}[{i}]", problems)
                return
        elif isinstance(t, str):
            if isinstance(value, dict):
                _check(value, t, path, problems)
                return
        elif isinstance(value, t) and not (t in (int, float) and isinstance(value, bool)):
            return
    problems.append(f"{path} = {value!r:.60} has the wrong type")


# --- the execution target ---------------------------------------------------------------------


def describe_target(name: str | None = None) -> dict:
    """Where this run executes: CPU, GPU, driver and library versions."""
    cpu = _cpu()
    gpu = _gpu()
    versions = {"python": platform.python_version()}
    for package in ("torch", "triton", "numpy", "ml_dtypes", "pytest", "pytest-xdist", "hypothesis"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    default = f"{gpu['name']}" if gpu else f"cpu: {cpu['model']}"
    return {"name": name or default, "hostname": socket.gethostname(), "platform": platform.platform(),
            "cpu": cpu, "gpu": gpu, "versions": versions}


def _cpu() -> dict:
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = sorted(value.split())
    except OSError:
        pass
    return {"model": model or "unknown", "cores": os.cpu_count() or 0, "flags": flags}


def _gpu() -> dict | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return {"name": torch.cuda.get_device_name(), "capability": f"{major}.{minor}",
            "driver": _driver_version(), "cuda": torch.version.cuda,
            "rocm": getattr(torch.version, "hip", None)}


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError):
        return None


def describe_tool() -> dict:
    commit = None
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent,
                             capture_output=True, text=True, timeout=10)
        commit = out.stdout.strip() or None if out.returncode == 0 else None
    except (OSError, subprocess.SubprocessError):
        pass
    return {"name": "kv-oracle", "version": __version__, "git_commit": commit}


def describe_kernels(registry) -> tuple[list, list]:
    kernels = [{"name": k.name, "op": k.contract.op, "backend": k.contract.backend, "plugin": k.plugin,
                "contract": json.loads(json.dumps(k.contract.as_dict(), default=list)),
                "unavailable": k.unavailable()}
               for k in sorted(registry.kernels.values(), key=lambda k: (k.contract.op, k.name))]
    errors = [{"plugin": e.plugin, "error": e.error} for e in registry.errors]
    return kernels, errors


def write(path, report: dict) -> Path:
    problems = validate(report)
    if problems:  # never write a report that a later merge would refuse
        raise ValueError("report does not match schema: " + "; ".join(problems[:5]))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    return path


def load(path) -> dict:
    """A report, validated. Older versions are read as this one: version 1 (no diagnosis yet) with
    no cause and no pattern in any case; versions 1 and 2 (no limits yet) with ``limits: null``;
    versions 1 to 3 (no devices yet) with ``device: null`` in every case; versions 1 to 4 with
    ``interrupted: null``."""
    report = json.loads(Path(path).read_text())
    if isinstance(report, dict) and report.get("schema_version") == 1:
        report = dict(report, schema_version=2,
                      cases=[dict(c, cause=None, pattern=[]) if isinstance(c, dict) else c
                             for c in report.get("cases", [])])
    if isinstance(report, dict) and report.get("schema_version") == 2:
        report = dict(report, schema_version=3, limits=None)
    if isinstance(report, dict) and report.get("schema_version") == 3:
        report = dict(report, schema_version=4,
                      cases=[dict(c, device=None) if isinstance(c, dict) else c for c in report.get("cases", [])])
    if isinstance(report, dict) and report.get("schema_version") == 4:
        report = dict(report, schema_version=SCHEMA_VERSION, interrupted=None)
    problems = validate(report)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems[:5]))
    return report


# --- matrices ---------------------------------------------------------------------------------


def cell(statuses: Counter) -> str:
    """One matrix cell: CRASH, TIMEOUT or FAIL (with counts) beats pass; n/s, not run and
    unavailable only when nothing ran."""
    total = sum(statuses.values())
    bad = sum(statuses[s] for s in FAILING)
    for status, label in (("crashed", "CRASH"), ("timeout", "TIMEOUT"), ("fail", "FAIL")):
        if statuses[status]:
            return f"{label} {bad}/{total}"
    aside = "".join(f" ({statuses[s]} {short})" for s, short in (("not supported", "n/s"), ("not run", "not run"))
                    if statuses[s])
    ran = statuses["pass"] + statuses["works, not declared"]
    if ran:
        note = f" +{statuses['works, not declared']}wnd" if statuses["works, not declared"] else ""
        return f"pass {ran}{note}{aside}"
    if statuses["unavailable"]:
        return "unavailable"
    if statuses["not run"]:
        return "not run" + (f" ({statuses['not supported']} n/s)" if statuses["not supported"] else "")
    return "n/s" if total else ""


def _base_names(reports: list[dict]) -> list[str]:
    """Each report's target name, same-named targets told apart by host."""
    names = [r["target"]["name"] for r in reports]
    seen = Counter(names)
    out, count = [], Counter()
    for name, report in zip(names, reports):
        count[name] += 1
        out.append(name if seen[name] == 1 else f"{name} #{count[name]} ({report['target']['hostname']})")
    return out


def target_columns(reports: list[dict]) -> list[tuple[str, dict, list]]:
    """The matrix's columns, as (name, report, cases): one per report, except that a report whose
    cases ran on GPUs of several kinds gets one column per kind (two H200s are one kind, one
    target), plus one for its cases that ran on no GPU."""
    from .devices import kind

    out = []
    for base, report in zip(_base_names(reports), reports):
        by_kind: dict = defaultdict(list)
        for case in report["cases"]:
            by_kind[kind(case.get("device"))].append(case)
        gpu_kinds = sorted(k for k in by_kind if k is not None)
        if len(gpu_kinds) < 2:
            out.append((base, report, report["cases"]))
            continue
        for gpu in gpu_kinds:
            out.append((f"{base} / {gpu[0]} (sm {gpu[1]})", report, by_kind[gpu]))
        if by_kind.get(None):
            out.append((f"{base} / no GPU", report, by_kind[None]))
    return out


def matrix(reports: list[dict]) -> tuple[list[str], list[tuple], dict]:
    """(column names, row keys (op, kernel, case class), {(row, column): Counter})."""
    cols = target_columns(reports)
    cells: dict = defaultdict(Counter)
    rows = set()
    for column, _, cases in cols:
        for case in cases:
            row = (case["op"], case["kernel"], case["case_class"])
            rows.add(row)
            cells[(row, column)][case["status"]] += 1
    return [c[0] for c in cols], sorted(rows), cells


def render_text(reports: list[dict]) -> str:
    columns, rows, cells = matrix(reports)
    head = ("op", "kernel", "case class")
    table = [head + tuple(columns)] + [row + tuple(cell(cells[(row, c)]) for c in columns) for row in rows]
    widths = [max(len(str(r[i])) for r in table) for i in range(len(head) + len(columns))]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(r, widths)).rstrip() for r in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines += ["", *_notes(reports)]
    return "\n".join(lines).rstrip()


def render_markdown(reports: list[dict]) -> str:
    columns, rows, cells = matrix(reports)
    out = ["# kv-oracle conformance matrix", "",
           "Legend: **pass N**: N cases passed (`+Kwnd`: K of them work but are not declared in the "
           "contract; `(M n/s)`: M more are outside the contract; `(M not run)`: M more did not fit the "
           "memory budget); **FAIL b/N**, **TIMEOUT b/N** or **CRASH b/N**: b of N cases failed, "
           "ran past the time limit, or crashed their worker; **n/s**: every case is outside the "
           "declared contract; **not run**: no case fitted the memory budget (reason below); "
           "**unavailable**: the kernel cannot run on that target (reason below); blank: no such case "
           "there.", "", "## Targets", ""]
    for column, report, _ in target_columns(reports):
        t = report["target"]
        gpu = f", GPU {t['gpu']['name']} (sm {t['gpu']['capability']}, driver {t['gpu']['driver']}, " \
              f"CUDA {t['gpu']['cuda']})" if t["gpu"] else ""
        versions = ", ".join(f"{k} {v}" for k, v in t["versions"].items() if v)
        out.append(f"- **{column}**: {t['cpu']['model']} ({t['cpu']['cores']} cores){gpu}; {versions}; "
                   f"kv-oracle {report['tool']['version']} ({(report['tool']['git_commit'] or 'no commit')[:12]}), "
                   f"profile {report['profile']}, {report['started']}")
    out += ["", "## Totals per kernel", "", "| kernel | " + " | ".join(columns) + " |",
            "| --- |" + " --- |" * len(columns)]
    for kernel in sorted({row[1] for row in rows}):
        totals = []
        for column in columns:
            counts = sum((cells[(row, column)] for row in rows if row[1] == kernel), Counter())
            totals.append(cell(counts))
        out.append(f"| {kernel} | " + " | ".join(totals) + " |")
    out += ["", "## By case class", "", "| op | kernel | case class | " + " | ".join(columns) + " |",
            "| --- | --- | --- |" + " --- |" * len(columns)]
    for row in rows:
        out.append("| " + " | ".join(row) + " | " + " | ".join(cell(cells[(row, c)]) for c in columns) + " |")
    notes = _notes(reports)
    if notes:
        out += ["", "## Notes", "", *(f"- {n}" for n in notes)]
    return "\n".join(out) + "\n"


def _notes(reports: list[dict]) -> list[str]:
    notes = []
    for column, report in zip(_base_names(reports), reports):
        stop = report.get("interrupted")
        if stop:
            notes.append(f"{column}: INTERRUPTED (Ctrl-C or SIGTERM) with {stop['finished']} of "
                         f"{stop['collected']} cases finished; the matrix holds only those")
            for case in stop["in_flight"]:
                ran = f" for {case['running_s']:g} s" if case["running_s"] is not None else ""
                notes.append(f"{column}: in flight{ran}: {case['kernel']} {case['case_id']} (class "
                             f"{case['case_class']}, seed {case['seed']}); re-run: {case['replay']}")
        for k in report["kernels"]:
            if k["unavailable"]:
                notes.append(f"{column}: {k['name']} unavailable: {k['unavailable']}")
        for e in report["plugin_errors"]:
            notes.append(f"{column}: plug-in {e['plugin']} failed to load: {e['error']}")
        for case in report["cases"]:
            if case["status"] == "works, not declared":
                notes.append(f"{column}: {case['kernel']} works, not declared: {case['case_id']} "
                             f"({case['message']})")
            elif case["status"] == "not run":
                notes.append(f"{column}: {case['kernel']} {case['case_id']} {case['message']}")
            elif case["status"] in FAILING:
                first = case["message"].splitlines()[0] if case["message"] else ""
                cause = f" (cause: {case['cause']['text']} [{case['cause']['id']}])" if case.get("cause") else ""
                notes.append(f"{column}: {case['status'].upper()} {case['kernel']} {case['case_id']}: "
                             f"{first}{cause}")
    return notes + device_notes(reports)



def device_notes(reports: list[dict]) -> list[str]:
    """Where the GPUs of one kind disagree: a case (kernel, case id, seed) whose status differs
    between two devices of the same kind (across the reports: two runs, two hosts, or repeats);
    and, for a report whose cases ran on several GPUs, each device's count of cases and failures,
    so that a failing card stands out."""
    from .devices import kind, label

    notes = []
    seen: dict = defaultdict(dict)  # (kind, kernel, case id, seed) -> {device identity: (label, status)}
    for report in reports:
        host = report["target"]["hostname"]
        tally: dict = defaultdict(Counter)
        for case in report["cases"]:
            device = case.get("device")
            if not device:
                continue
            ident = device.get("uuid") or f"{host}:{device['index']}"
            seen[(kind(device), case["kernel"], case["case_id"], case["seed"])][ident] = (label(device), case["status"])
            tally[(ident, label(device))]["failing" if case["status"] in FAILING else "other"] += 1
        if len(tally) > 1:
            parts = [f"{name}: {sum(c.values())} cases, {c['failing']} failing" for (_, name), c in sorted(tally.items())]
            notes.append(f"{report['target']['name']}: per device: " + "; ".join(parts))
    for (gpu, kernel, case_id, _), runs in sorted(seen.items(), key=lambda item: str(item[0])):
        if len({status for _, status in runs.values()}) > 1:
            parts = ", ".join(f"{status} on {name}" for name, status in sorted(runs.values()))
            notes.append(f"devices of one kind disagree ({gpu[0]}, sm {gpu[1]}): {kernel} {case_id}: {parts}")
    return notes
