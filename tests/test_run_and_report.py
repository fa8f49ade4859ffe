"""`oracle list`, `oracle run` and `oracle report merge`, end to end in subprocesses, and the report
schema's validator against reports it must accept and reject."""

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracle import report

PLUGINS = str(Path(__file__).parent / "plugins")


def oracle(*args, env=None, timeout=300):
    environment = {**os.environ, "PYTHONPATH": PLUGINS, **(env or {})}
    return subprocess.run([sys.executable, "-m", "oracle", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


@pytest.fixture(scope="module")
def crashing_run(tmp_path_factory):
    """One `oracle run` over a kernel that segfaults on N == 7 and the torch baseline."""
    out = tmp_path_factory.mktemp("run")
    done = oracle("run", "--op", "store_cache", "--kernel", "crashing.store_cache,torch.store_cache",
                  "-n", "2", "--report", str(out / "cpu.json"), "--junit", str(out / "junit.xml"),
                  "--markdown", str(out / "matrix.md"), "--target", "test-cpu",
                  "--", "-k", "int32-N7 or bf16-int64 or fp16-int32 or unavailable",
                  env={"ORACLE_PLUGINS": "crashing:register"})
    return done, out


def test_list_names_every_kernel_its_contract_and_broken_plugins():
    done = oracle("list", env={"ORACLE_PLUGINS": "crashing:register,no_such_module:register"})
    assert done.returncode == 1  # a broken plug-in is an error, and says which
    assert "BROKEN plug-in ORACLE_PLUGINS no_such_module:register: ModuleNotFoundError" in done.stdout
    line = next(l for l in done.stdout.splitlines() if l.startswith("crashing.store_cache"))
    assert "[crashing] store_cache on cpu, bfloat16" in line and "available" in line
    assert "torch.reshape_and_cache_flash" in done.stdout


def test_run_reports_the_crashed_case_and_goes_on(crashing_run):
    done, out = crashing_run
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((out / "cpu.json").read_text())
    assert report.validate(data) == []
    by_id = {(c["kernel"], c["case_id"]): c for c in data["cases"]}
    crashed = by_id[("crashing.store_cache", "int32-N7")]
    assert crashed["status"] == "crashed" and "crashed while running" in crashed["message"]
    assert crashed["case_class"] == "sizes" and crashed["seed"] is not None
    assert by_id[("crashing.store_cache", "bf16-int64")]["status"] == "pass"
    assert by_id[("crashing.store_cache", "fp16-int32")]["status"] == "works, not declared"
    for case_id in ("int32-N7", "bf16-int64", "fp16-int32"):  # the baseline ran every case, after the crash too
        assert by_id[("torch.store_cache", case_id)]["status"] == "pass"
    assert "CRASH 1/1" in done.stdout and "sizes" in done.stdout
    assert data["target"]["name"] == "test-cpu" and data["profile"] == "quick"
    assert {k["name"] for k in data["kernels"]} >= {"crashing.store_cache", "torch.store_cache"}


def test_run_writes_junit_and_markdown(crashing_run):
    _, out = crashing_run
    junit = (out / "junit.xml").read_text()
    assert "crashing.store_cache" in junit and "<testsuite" in junit
    markdown = (out / "matrix.md").read_text()
    assert "Legend" in markdown and "| crashing.store_cache |" in markdown


def test_merge_puts_targets_side_by_side(crashing_run, tmp_path):
    _, out = crashing_run
    data = json.loads((out / "cpu.json").read_text())
    other = copy.deepcopy(data)
    other["target"]["name"] = "H100 80GB HBM3"
    for case in other["cases"]:
        if case["status"] == "crashed":
            case["status"], case["message"] = "pass", ""
    (tmp_path / "gpu.json").write_text(json.dumps(other))
    done = oracle("report", "merge", str(out / "cpu.json"), str(tmp_path / "gpu.json"),
                  "--markdown", str(tmp_path / "merged.md"))
    assert done.returncode == 0, done.stderr
    header = done.stdout.splitlines()[0]
    assert "test-cpu" in header and "H100 80GB HBM3" in header
    row = next(l for l in done.stdout.splitlines() if "crashing.store_cache" in l and " sizes " in l)
    assert "CRASH 1/1" in row and "pass 1" in row
    merged = (tmp_path / "merged.md").read_text()
    assert "| kernel | test-cpu | H100 80GB HBM3 |" in merged


def test_merge_refuses_a_report_that_breaks_the_schema(tmp_path):
    (tmp_path / "bad.json").write_text(json.dumps({"schema_version": 1}))
    done = oracle("report", "merge", str(tmp_path / "bad.json"))
    assert done.returncode != 0
    assert "$.tool is missing" in done.stderr


def minimal_report():
    return {"schema_version": report.SCHEMA_VERSION, "tool": report.describe_tool(),
            "target": report.describe_target("t"), "profile": "quick", "started": "2026-11-22T00:00:00+00:00",
            "duration_s": 1.5, "command": ["--pyargs", "conformance"], "kernels": [], "plugin_errors": [],
            "limits": {"timeout_s": 300.0, "memory_gb": None, "memory_budgets": {"cpu": 19.5}},
            "interrupted": None,
            "cases": [{"op": "store_cache", "kernel": "k", "case_id": "N7", "case_class": "sizes",
                       "params": {"n": 7}, "seed": 3, "status": "pass", "seconds": 0.1, "message": "",
                       "first_difference": None, "cause": None, "pattern": [], "nodeid": "x",
                       "device": None}]}


@pytest.mark.parametrize("mutate, problem", [
    (lambda r: r.pop("cases"), "$.cases is missing"),
    (lambda r: r.update(schema_version=99), "$.schema_version is 99"),
    (lambda r: r["cases"][0].update(status="ok"), "$.cases[0].status 'ok'"),
    (lambda r: r["cases"][0].update(seed="3"), "$.cases[0].seed"),
    (lambda r: r["target"]["cpu"].update(cores=True), "$.target.cpu.cores"),
    (lambda r: r.update(extra=1), "$.extra is not in the schema"),
    (lambda r: r["command"].append(3), "$.command[2]"),
    (lambda r: r["limits"].update(timeout_s="3"), "$.limits.timeout_s"),
    (lambda r: r.pop("limits"), "$.limits is missing"),
    (lambda r: r["cases"][0].pop("device"), "$.cases[0].device is missing"),
    (lambda r: r.pop("interrupted"), "$.interrupted is missing"),
    (lambda r: r.update(interrupted={"finished": 1, "collected": "9", "in_flight": []}), "$.interrupted.collected"),
    (lambda r: r.update(interrupted={"finished": 1, "collected": 9, "in_flight": [{"kernel": "k"}]}),
     "$.interrupted.in_flight[0].case_id is missing"),
    (lambda r: r["cases"][0].update(device={"index": 0, "name": "H", "uuid": None, "pci_bus_id": None,
                                            "capability": "9.0"}), "$.cases[0].device.index"),
])
def test_validator_names_what_is_wrong(mutate, problem):
    good = minimal_report()
    assert report.validate(good) == []
    mutate(good)
    problems = report.validate(good)
    assert any(problem in p for p in problems), problems


def test_a_version_1_report_is_read_as_version_4_without_causes_limits_or_devices(tmp_path):
    old = minimal_report()
    old["schema_version"] = 1
    del old["limits"]
    for case in old["cases"]:
        del case["cause"], case["pattern"], case["device"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    loaded = report.load(path)
    assert loaded["schema_version"] == report.SCHEMA_VERSION == 5
    assert [(c["cause"], c["pattern"], c["device"]) for c in loaded["cases"]] == [(None, [], None)]
    assert loaded["limits"] is None


def test_a_version_2_report_is_read_as_version_4_without_limits_or_devices(tmp_path):
    old = minimal_report()
    old["schema_version"] = 2
    del old["limits"]
    for case in old["cases"]:
        del case["device"]
    path = tmp_path / "v2.json"
    path.write_text(json.dumps(old))
    loaded = report.load(path)
    assert loaded["schema_version"] == 5 and loaded["limits"] is None
    assert loaded["cases"] == [dict(c, device=None) for c in old["cases"]]


def test_a_version_3_report_is_read_as_version_4_without_devices(tmp_path):
    old = minimal_report()
    old["schema_version"] = 3
    for case in old["cases"]:
        del case["device"]
    path = tmp_path / "v3.json"
    path.write_text(json.dumps(old))
    loaded = report.load(path)
    assert loaded["schema_version"] == 5 and loaded["limits"] == old["limits"]
    assert [c["device"] for c in loaded["cases"]] == [None]


# committed conformance reports -> the GPU ordinals their cases ran on (empty: a CPU run)
COMMITTED = {"cpu.json": set(), "h100.json": {"0"}, "h100x2.json": {"0", "1"}, "h100-block.json": {"0", "1"}}
INTERRUPTED = {"h100-block.json"}  # stopped at its call's time limit


@pytest.mark.parametrize("name", sorted(COMMITTED))
def test_the_committed_reports_still_load(name):
    path = Path(__file__).parent.parent / "reports" / name
    written_as = json.loads(path.read_text())["schema_version"]
    loaded = report.load(path)
    assert loaded["schema_version"] == 5 and loaded["cases"]
    assert report.validate(loaded) == []
    on_gpu = [c for c in loaded["cases"] if c["device"] is not None]
    # the CPU kernels' cases record no GPU; every other case the GPU it ran on, one of the run's
    assert all(c["device"] is None for c in loaded["cases"] if c["kernel"].startswith(("torch.", "cpu.")))
    assert {c["device"]["index"] for c in on_gpu} == COMMITTED[name]
    assert all(c["device"]["capability"] == "9.0" and c["device"]["uuid"] for c in on_gpu)
    # h100-block.json was stopped by its call's limit (docs/benchmarks.md says so),
    # and says so with the cases in flight
    assert (loaded["interrupted"] is not None) == (name in INTERRUPTED)
    if name in INTERRUPTED:
        stop = loaded["interrupted"]
        assert stop["in_flight"] and stop["finished"] < stop["collected"]
    if written_as < 3:  # limits were first recorded in version 3
        assert loaded["limits"] is None
    else:
        assert loaded["limits"]["timeout_s"] >= 0


def test_a_cause_must_name_its_id_and_text():
    good = minimal_report()
    good["cases"][0].update(status="fail", cause={"id": "slot_zero_skipped", "text": "slot 0 skipped",
                                                   "class": "c", "also": []}, pattern=["k_cache: 1 of 7"])
    assert report.validate(good) == []
    good["cases"][0]["cause"] = {"id": "x"}
    assert any("$.cases[0].cause.text is missing" in p for p in report.validate(good))
