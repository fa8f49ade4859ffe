"""The per-case time limit and the memory budget of the large case class (oracle/limits.py).

End to end, in real `oracle run` and pytest subprocesses on plug-in kernels: three kernels that
never return (tests/plugins/hanging.py: asleep in Python, spinning in C with the GIL held, and a
CUDA-like wait in C on a flag that never flips) must each end as TIMEOUT while the run goes on; a
budget too small for any large case must report it "not run" with both sizes; a budget for one
must keep two large cases in two workers from ever overlapping (tests/plugins/recording.py). Then
the budget's cross-process semaphore, the limit file and the estimate on their own.
"""

import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import conformance
from oracle import limits, report
from oracle.cases import catalogue
from oracle.contract import Contract
from oracle.kernels.torch_native import store_cache
from oracle.ops._build import LARGE_LEAD, LARGE_STRIDE, LARGE_UNITS
from oracle.registry import Kernel, default_registry

PLUGINS = Path(__file__).parent / "plugins"
HANGING = {"hanging.sleeps.store_cache": "sleeps", "hanging.spins.store_cache": "spins",
           "hanging.waits.store_cache": "waits"}
LIMIT_S = 3


def oracle(*args, env=None, timeout=150):
    """``oracle ARGS`` in a subprocess; ``timeout`` fails the test instead of hanging it."""
    environment = {**os.environ, "PYTHONPATH": str(PLUGINS), **(env or {})}
    return subprocess.run([sys.executable, "-m", "oracle", *args], capture_output=True, text=True,
                          timeout=timeout, env=environment)


def large_case(op="store_cache"):
    kernel = default_registry.discover().kernels[f"torch.{op}"]
    return kernel, next(c for c in catalogue(op, "full", kernel.contract) if c.cls == "large")


@pytest.fixture(scope="module")
def hang_library(tmp_path_factory):
    """tests/plugins/hang.c, built with the system C compiler."""
    compiler = shutil.which("gcc") or shutil.which("cc")
    assert compiler, "the C kernels of tests/plugins/hanging.py need a C compiler (gcc or cc) on PATH"
    library = tmp_path_factory.mktemp("hang") / "libhang.so"
    subprocess.run([compiler, "-shared", "-fPIC", "-O0", "-o", str(library), str(PLUGINS / "hang.c")],
                   check=True, timeout=60)
    return library


@pytest.mark.parametrize("kernel", sorted(HANGING))
def test_a_hang_ends_as_timeout_and_the_run_goes_on(kernel, hang_library, tmp_path):
    """`oracle run` of a hanging kernel and the torch baseline, two cases each (the hanging
    kernel's int32-N7 hangs), on ONE worker, in name order: the baseline's cases can only run in
    the worker that replaced the one the hang ended. TIMEOUT in the report, the matrix, the
    Markdown, JUnit and the exit status."""
    started = time.monotonic()
    done = oracle("run", "--op", "store_cache", "--kernel", f"{kernel},torch.store_cache",
                  "-n", "1", "--timeout", str(LIMIT_S), "--report", str(tmp_path / "report.json"),
                  "--junit", str(tmp_path / "junit.xml"), "--markdown", str(tmp_path / "matrix.md"),
                  "--", "-k", "int32-N7 or bf16-int64",
                  env={"ORACLE_PLUGINS": "hanging:register", "KV_ORACLE_HANG_LIB": str(hang_library)})
    assert time.monotonic() - started < 60  # a 3 s limit and two worker starts, never a hang
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "report.json").read_text())
    assert report.validate(data) == []
    assert data["limits"]["timeout_s"] == LIMIT_S
    by_id = {(c["kernel"], c["case_id"]): c for c in data["cases"]}
    hang = next(c for c in catalogue("store_cache", "quick") if c.id == "int32-N7")
    timed_out = by_id[(kernel, "int32-N7")]
    assert timed_out["status"] == "timeout", timed_out
    assert (timed_out["case_class"], timed_out["params"], timed_out["seed"]) == ("sizes", {"index": "int32", "n": 7},
                                                                                  hang.seed)
    message = timed_out["message"]
    assert message.startswith(f"ran past the time limit of {LIMIT_S} s (--oracle-timeout): {kernel}")
    assert 'hanging.py", line' in message and f" in {HANGING[kernel]}" in message  # where it hung
    assert f"re-run exactly this case: PYTHONPATH={PLUGINS} ORACLE_PLUGINS=hanging:register " in message
    assert f"test_store_cache[{kernel}][int32-N7]' --oracle-timeout={LIMIT_S}" in message
    assert by_id[(kernel, "bf16-int64")]["status"] == "pass"
    # the worker died, and a fresh one ran the baseline's cases (they come after, by name)
    assert done.stdout.count("replacing crashed worker") == 1
    assert all(by_id[("torch.store_cache", case)]["status"] == "pass" for case in ("int32-N7", "bf16-int64"))
    assert "3 pass, 1 timeout" in done.stdout
    row = next(line for line in done.stdout.splitlines() if line.startswith(f"store_cache  {kernel}  sizes"))
    assert row.endswith("TIMEOUT 1/1"), row
    markdown = (tmp_path / "matrix.md").read_text()
    assert "**TIMEOUT b/N**" in markdown and f"| store_cache | {kernel} | sizes | TIMEOUT 1/1 |" in markdown
    junit = {c.get("name"): c for c in ET.parse(tmp_path / "junit.xml").getroot().iter("testcase")}
    case = junit[f"test_store_cache[{kernel}][int32-N7]"]
    properties = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert properties["oracle_status"] == "timeout" and properties["oracle_case"] == "int32-N7"
    assert properties["oracle_class"] == "sizes" and properties["oracle_kernel"] == kernel
    error = case.find("error")
    assert error is not None and f"TIMEOUT: ran past the time limit of {LIMIT_S} s" in error.get("message")


def test_without_workers_the_watchdog_ends_the_run_with_the_stack(hang_library, tmp_path):
    """-n 0 (or a replayed case): no worker to replace, so the run ends, printing where it hung."""
    test_file = Path(conformance.__file__).parent / "test_kernels.py"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-c", str(test_file.parent / "oracle-run.ini"),
         f"{test_file}::test_store_cache[hanging.spins.store_cache][int32-N7]", f"--oracle-timeout={LIMIT_S}"],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(PLUGINS), "ORACLE_PLUGINS": "hanging:register",
             "KV_ORACLE_HANG_LIB": str(hang_library)})
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert f"Timeout (0:00:0{LIMIT_S})!" in done.stderr and " in spins" in done.stderr


def test_the_time_limits_are_checked_by_name():
    for args, problem in ((("--timeout", "-1"), "argument --timeout: must be a number of seconds >= 0"),
                          (("--timeout", "soon"), "got 'soon'"),
                          (("--memory", "0"), "argument --memory: must be a positive number of GB, got '0'")):
        done = oracle("run", *args, timeout=60)
        assert done.returncode == 2 and problem in done.stderr, done.stderr


# --- the memory budget, end to end ------------------------------------------------------------


def test_a_large_case_that_cannot_fit_is_not_run(tmp_path):
    kernel, case = large_case()
    need = limits.case_memory_bytes(kernel, case)
    done = oracle("run", "--op", "store_cache", "--kernel", "torch.store_cache", "-n", "2", "--memory", "1",
                  "--report", str(tmp_path / "report.json"), "--", "-k", "(large and not int32) or bf16-int64")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((tmp_path / "report.json").read_text())
    assert report.validate(data) == []
    by_id = {c["case_id"]: c for c in data["cases"]}
    assert by_id["bf16-int64"]["status"] == "pass"
    not_run = by_id[case.id]
    assert not_run["status"] == "not run" and not_run["case_class"] == "large"
    assert not_run["message"].startswith(f"not run: needs {need / 1e9:.1f} GB, 1.0 available")
    assert data["limits"] == {"timeout_s": limits.DEFAULT_TIMEOUT_S, "memory_gb": 1.0, "memory_budgets": {"cpu": 1.0}}
    row = next(line for line in done.stdout.splitlines() if line.startswith("store_cache  torch.store_cache  large"))
    assert row.endswith("  not run"), row
    assert f"torch.store_cache {case.id} not run: needs {need / 1e9:.1f} GB" in done.stdout
    assert "1 pass, 1 not run" in done.stdout


def test_large_cases_never_overlap_under_a_budget_for_one(tmp_path):
    _, case = large_case()
    need = limits.case_memory_bytes(default_registry.discover().kernels["torch.store_cache"], case)
    budget = round(1.5 * need / 1e9, 2)  # room for one, never two
    record = tmp_path / "calls.jsonl"
    done = oracle("run", "--op", "store_cache", "--kernel", "recording.first.store_cache,recording.second.store_cache",
                  "-n", "2", "--memory", str(budget), "--report", str(tmp_path / "report.json"), "--", "-k", "large and not int32",
                  env={"ORACLE_PLUGINS": "recording:register", "KV_ORACLE_RECORD": str(record)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert sorted(c["kernel"] for c in calls) == ["recording.first.store_cache", "recording.second.store_cache"]
    first, second = sorted(calls, key=lambda c: c["start"])
    assert first["pid"] != second["pid"]  # two workers, each free to start at once: only the budget held one back
    assert second["start"] >= first["end"], calls
    data = json.loads((tmp_path / "report.json").read_text())
    assert data["limits"]["memory_budgets"] == {"cpu": budget}
    assert [c["status"] for c in data["cases"]] == ["pass", "pass"]


# --- the budget's semaphore, the limit file and the estimate ----------------------------------

UNIT_GB = limits.UNIT_BYTES / 1e9
FORK = multiprocessing.get_context("fork")


def _hold(directory, gigabytes, seconds, log, inside=None, barrier=None, die=False):
    """A process that reserves one unit of a budget, logs when it held it, and lets it go."""
    with limits.MemoryBudget(directory, "cpu", gigabytes).reserve(limits.UNIT_BYTES) as refused:
        assert refused is None
        start = time.time()
        if inside is not None:
            inside.set()
        if die:
            os._exit(0)  # no release: the kernel must drop the locks of a dead process
        if barrier is not None:
            barrier.wait(timeout=20)  # passes only if the other process is inside at the same time
        time.sleep(seconds)
        with open(log, "a") as out:
            out.write(json.dumps({"pid": os.getpid(), "start": start, "end": time.time()}) + "\n")


def _run(*processes):
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout=30)
    assert [p.exitcode for p in processes] == [0] * len(processes)


def test_a_budget_for_two_units_lets_two_holders_in_at_once(tmp_path):
    barrier = FORK.Barrier(2)
    _run(*(FORK.Process(target=_hold, args=(tmp_path, 2.5 * UNIT_GB, 0.0, tmp_path / "log"),
                        kwargs={"barrier": barrier}) for _ in range(2)))


def test_a_budget_for_one_unit_holds_the_second_until_the_first_is_done(tmp_path):
    inside = FORK.Event()
    first = FORK.Process(target=_hold, args=(tmp_path, 1.5 * UNIT_GB, 1.0, tmp_path / "log"), kwargs={"inside": inside})
    first.start()
    assert inside.wait(timeout=20)
    _run(FORK.Process(target=_hold, args=(tmp_path, 1.5 * UNIT_GB, 0.0, tmp_path / "log")))
    first.join(timeout=30)
    a, b = sorted((json.loads(line) for line in (tmp_path / "log").read_text().splitlines()),
                  key=lambda r: r["start"])
    assert b["start"] >= a["end"]


def test_a_holder_that_dies_frees_its_share(tmp_path):
    _run(FORK.Process(target=_hold, args=(tmp_path, 1.5 * UNIT_GB, 0.0, tmp_path / "log"), kwargs={"die": True}))
    _run(FORK.Process(target=_hold, args=(tmp_path, 1.5 * UNIT_GB, 0.0, tmp_path / "log")))
    assert len((tmp_path / "log").read_text().splitlines()) == 1


def test_a_case_larger_than_the_budget_is_refused_with_both_sizes(tmp_path):
    with limits.MemoryBudget(tmp_path, "cpu", 1.0).reserve(int(4.7e9)) as refused:
        assert refused.startswith("not run: needs 4.7 GB, 1.0 available")


def test_the_first_reservation_fixes_the_budget_from_free_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "available_memory_bytes", lambda device: 10 * 10**9)
    budget = limits.MemoryBudget(tmp_path, "cpu")
    with budget.reserve(10**9) as refused:
        assert refused is None
    monkeypatch.setattr(limits, "available_memory_bytes", lambda device: 10**9)  # others hold memory now
    with budget.reserve(5 * 10**9) as refused:
        assert refused is None  # still measured against the first reading
    assert budget.recorded_gigabytes() == 10 * limits.HEADROOM
    with limits.MemoryBudget(tmp_path, "cpu").reserve(10 * 10**9) as refused:
        assert refused.startswith(f"not run: needs 10.0 GB, {10 * limits.HEADROOM:.1f} available")


def test_free_memory_is_read_at_run_time():
    free = limits.available_memory_bytes("cpu")
    assert isinstance(free, int) and free > 0
    assert limits.available_memory_bytes("xpu") is None


@pytest.mark.parametrize("op", ["store_cache", "reshape_and_cache_flash", "set_mla_kv_buffer", "concat_and_cache_mla"])
def test_a_large_case_is_estimated_from_its_inputs_without_allocating_them(op):
    kernel, case = large_case(op)
    started = time.perf_counter()
    need = limits.case_memory_bytes(kernel, case)
    assert time.perf_counter() - started < 2  # built on the meta device: nothing was filled
    floor = LARGE_LEAD + (LARGE_UNITS - 1) * LARGE_STRIDE  # the sparse region's payload alone
    assert floor < need < 1.1 * floor


def test_only_large_cases_that_will_run_need_memory():
    kernel, case = large_case()
    small = next(c for c in catalogue("store_cache", "quick", kernel.contract) if c.cls == "dtypes")
    assert limits.case_memory_bytes(kernel, small) is None
    declines = Kernel(Contract(op="store_cache", name="no_large", backend="test", dtypes=("uint8",),
                               large_caches=False), store_cache, "test")
    assert limits.case_memory_bytes(declines, case) is None  # not supported: never built


class _Config:
    """What limits reads of a pytest config, in a worker."""

    def __init__(self, directory, timeout):
        self.workerinput = {"oracle_limits_dir": str(directory)}
        self.stash, self._timeout = {}, timeout
        limits.configure(self)

    def getoption(self, name, default=None):
        return {"oracle_timeout": self._timeout, "oracle_memory": None}.get(name, default)

    def getini(self, name):
        return 0.0


def test_the_limit_file_names_the_case_while_it_runs_and_is_gone_after(tmp_path):
    config = _Config(tmp_path, 7.0)
    record = {"case_id": "int32-N7", "case_class": "sizes", "params": {"n": 7}, "seed": 5}
    before = time.time()
    with limits.time_limit(config, "t.py::test_x[k][int32-N7]", record):
        case, dump = limits.case_in_flight(config, "t.py::test_x[k][int32-N7]")
        assert dump == ""
        assert before <= case.pop("started") <= time.time()  # for an interrupted run's running_s
        assert case == dict(record, limit_s=7.0, nodeid="t.py::test_x[k][int32-N7]")
    assert limits.case_in_flight(config, "t.py::test_x[k][int32-N7]") is None
    assert list(tmp_path.iterdir()) == []


def test_a_dump_after_the_case_line_is_a_timeout(tmp_path):
    config = _Config(tmp_path, 7.0)
    with limits.time_limit(config, "n", {"case_id": "c"}):
        path = next(tmp_path.iterdir())
        text = path.read_text()
    path.write_text(text + "Timeout (0:00:07)!\nThread 0x1 (most recent call first):\n  File \"k.py\", line 3 in k\n")
    case, dump = limits.case_in_flight(config, "n")
    case.pop("started")
    assert case == {"case_id": "c", "limit_s": 7.0, "nodeid": "n"} and dump.startswith("Timeout (0:00:07)!")


def test_no_time_limit_arms_no_watchdog(tmp_path, monkeypatch):
    def armed(*args, **kwargs):
        raise AssertionError("the watchdog was armed under --oracle-timeout 0")

    monkeypatch.setattr(limits.faulthandler, "dump_traceback_later", armed)
    with limits.time_limit(_Config(tmp_path, 0.0), "n", {"case_id": "c"}):
        pass
    assert list(tmp_path.iterdir()) == []
