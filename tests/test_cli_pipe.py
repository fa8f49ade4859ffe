"""``oracle ... | head``: a reader that stops early ends the command quietly, without a traceback."""

import json
import subprocess
import sys

from oracle import report


def _big_report(path, cases: int) -> None:
    """A valid report whose merged matrix runs to megabytes, far past a pipe's buffer, so the
    writer is still writing when the reader has gone."""
    target = {"name": "t", "hostname": "h", "platform": "p", "cpu": {"model": "m", "cores": 1, "flags": []},
              "gpu": None, "versions": {}}
    data = {"schema_version": report.SCHEMA_VERSION, "tool": {"name": "kv-oracle", "version": "0", "git_commit": None},
            "target": target, "profile": "quick", "started": "2025-01-01T00:00:00", "duration_s": 0.0,
            "command": [], "kernels": [], "plugin_errors": [], "limits": None, "interrupted": None,
            "cases": [{"op": "store_cache", "kernel": f"k{i}", "case_id": str(i), "case_class": "c" * 40,
                       "params": {}, "seed": None, "status": "pass", "seconds": 0.0, "message": "",
                       "first_difference": None, "cause": None, "pattern": [], "nodeid": f"n{i}", "device": None}
                      for i in range(cases)]}
    assert not report.validate(data)
    path.write_text(json.dumps(data))


def _into_early_closing_reader(*args) -> subprocess.CompletedProcess:
    """Run ``python -m oracle ARGS | (read one line; exit)`` and return the oracle process."""
    reader = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.readline()"], stdin=subprocess.PIPE,
                              stdout=subprocess.DEVNULL)
    writer = subprocess.Popen([sys.executable, "-m", "oracle", *args], stdout=reader.stdin, stderr=subprocess.PIPE,
                              text=True)
    reader.stdin.close()  # the writer holds the only write end: the pipe breaks when the reader exits
    reader.wait(timeout=120)
    _, stderr = writer.communicate(timeout=120)
    return subprocess.CompletedProcess(writer.args, writer.returncode, "", stderr)


def test_report_merge_into_a_reader_that_stops_early(tmp_path):
    _big_report(tmp_path / "a.json", 20000)
    done = _into_early_closing_reader("report", "merge", str(tmp_path / "a.json"), str(tmp_path / "a.json"))
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.stderr == ""
    assert done.returncode == 1  # as Python's own docs on SIGPIPE do: a nonzero status, no message


def test_list_into_a_reader_that_stops_early():
    done = _into_early_closing_reader("list")
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
