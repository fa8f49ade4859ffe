"""A run stopped from outside still reports (oracle/limits.py, "Ending from outside").

A CI job's cancellation or ``timeout`` sends SIGTERM. Before, the run died with no report and no
word of what it was doing; now it ends as Ctrl-C does: the report is written with the cases that
finished, marked ``interrupted``, and names each case in flight (kernel, case, seed, how long it
had run, the command that re-runs it). End to end, in a real `oracle run` subprocess on a plug-in
kernel that sleeps forever on its N=7 cases (tests/plugins/hanging.py)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from oracle import report

PLUGINS = Path(__file__).parent / "plugins"


def _start(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "ORACLE_PLUGINS": "hanging:register",
           "TMPDIR": str(tmp_path)}  # the run's limit files land under tmp_path
    return subprocess.Popen([sys.executable, "-m", "oracle", "run", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)


def _wait_for_case_in_flight(tmp_path, proc, marker: str, seconds: float = 120) -> dict:
    """The header of the first limit file (a case in flight) whose case id ends with ``marker``."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and proc.poll() is None:
        for path in tmp_path.glob("kv-oracle-limits-*/*.case"):
            try:
                header = json.loads(path.read_text(errors="replace").partition("\n")[0])
            except (OSError, json.JSONDecodeError):  # ended meanwhile, or still being written
                continue
            if header["case_id"].endswith(marker):
                return header
        time.sleep(0.2)
    proc.kill()
    pytest.fail(f"no case ending in {marker} came in flight: {proc.communicate()[0][-3000:]}")


def test_sigterm_writes_the_report_with_the_cases_in_flight(tmp_path):
    path = tmp_path / "report.json"
    proc = _start(tmp_path, "--kernel", "hanging.sleeps.store_cache", "-n", "1", "--timeout", "600",
                  "--report", str(path))
    header = _wait_for_case_in_flight(tmp_path, proc, "N7")
    time.sleep(1.0)  # it has been running a while
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=90)

    assert proc.returncode == 2, out[-3000:]  # pytest's "interrupted", whatever the matrix holds
    data = report.load(path)
    stop = data["interrupted"]
    assert stop is not None
    assert stop["finished"] == len(data["cases"]) < stop["collected"]
    assert all(c["kernel"] == "hanging.sleeps.store_cache" for c in data["cases"])
    [running] = stop["in_flight"]  # one worker, asleep in its N7 case
    assert running["kernel"] == "hanging.sleeps.store_cache"
    assert (running["case_id"], running["seed"]) == (header["case_id"], header["seed"])
    assert running["running_s"] >= 1.0
    assert running["nodeid"].endswith(f"[hanging.sleeps.store_cache][{running['case_id']}]")
    assert "ORACLE_PLUGINS=hanging:register" in running["replay"] and running["case_id"] in running["replay"]
    # the terminal says so too, under the partial matrix
    assert f"INTERRUPTED (Ctrl-C or SIGTERM) with {stop['finished']} of {stop['collected']} cases" in out
    assert f"in flight for {running['running_s']:g} s: hanging.sleeps.store_cache {running['case_id']}" in out


def test_a_run_that_ends_by_itself_is_not_marked_interrupted(tmp_path):
    path = tmp_path / "report.json"
    proc = _start(tmp_path, "--kernel", "torch.store_cache", "--op", "store_cache", "-n", "0",
                  "--report", str(path), "--", "-k", "int32-N7")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-3000:]
    data = report.load(path)
    assert data["interrupted"] is None and data["cases"]
    assert "INTERRUPTED" not in out


def test_an_older_report_loads_with_interrupted_null(tmp_path):
    """Version 4 reports (before this field) still load, as not interrupted."""
    path = tmp_path / "r.json"
    proc = _start(tmp_path, "--kernel", "torch.store_cache", "--op", "store_cache", "-n", "0",
                  "--report", str(path), "--", "-k", "int32-N7")
    proc.communicate(timeout=120)
    old = json.loads(path.read_text())
    old.pop("interrupted")
    old["schema_version"] = 4
    path.write_text(json.dumps(old))
    assert report.load(path)["interrupted"] is None
