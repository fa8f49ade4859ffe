"""Every GPU of the host (oracle/devices.py): the visible list, the selection and the round-robin
assignment as plain functions of a fake device list; end to end, real `oracle run` subprocesses
whose xdist workers are pinned to fake GPUs (a plug-in records what each worker was allowed to
see, and crashes one worker to show that its replacement keeps the device); the report's device
records, and the matrix's columns and notes per GPU kind."""

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from oracle import devices, limits, report

PLUGINS = Path(__file__).parent / "plugins"


# --- the plain functions ---------------------------------------------------------------------


def test_the_visible_devices_come_from_the_variable_else_the_count():
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": "2, 3"}, count=8, variable="CUDA_VISIBLE_DEVICES") \
        == ["2", "3"]
    uuids = "GPU-aaaa,GPU-bbbb"
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": uuids}, variable="CUDA_VISIBLE_DEVICES") == uuids.split(",")
    assert devices.visible_devices({"CUDA_VISIBLE_DEVICES": ""}, count=8, variable="CUDA_VISIBLE_DEVICES") == []
    assert devices.visible_devices({}, count=3, variable="CUDA_VISIBLE_DEVICES") == ["0", "1", "2"]
    assert devices.visible_devices({"HIP_VISIBLE_DEVICES": "1"}, count=4, variable="HIP_VISIBLE_DEVICES") == ["1"]


def test_the_selection_takes_ordinals_among_the_visible_devices():
    visible = ["4", "5", "6"]
    assert devices.select(visible, None) == visible and devices.select(visible, "all") == visible
    assert devices.select(visible, "2,0,2") == ["6", "4"]
    for bad in ("3", "-1", "x", "0,,1"):
        with pytest.raises(ValueError, match=rf"--oracle-devices={bad!r}: .* ordinals 0..2 \(4, 5, 6\)"):
            devices.select(visible, bad)


def test_workers_go_round_robin_and_auto_shares_out_the_cores():
    assert devices.assignment(["a", "b"], 5) == ["a", "b", "a", "b", "a"]
    assert devices.assignment([], 3) == []
    assert devices.workers_for_auto(["a", "b"], None, cpus=16) == 16
    assert devices.workers_for_auto(["a", "b", "c"], None, cpus=2) == 3  # at least one per device
    assert devices.workers_for_auto(["a", "b"], 3, cpus=64) == 6


def test_the_pin_rides_on_xdists_worker_specs():
    specs = devices.pinned_specs(["popen", "popen//python=python3", "popen//env:CUDA_VISIBLE_DEVICES=9"],
                                 ["0", "1", "0"], "CUDA_VISIBLE_DEVICES")
    assert specs == ["popen//env:CUDA_VISIBLE_DEVICES=0", "popen//python=python3//env:CUDA_VISIBLE_DEVICES=1",
                     "popen//env:CUDA_VISIBLE_DEVICES=9"]  # a spec that already pins is left alone


def test_each_worker_takes_its_share_of_the_cores(monkeypatch):
    import torch

    before = torch.get_num_threads()
    monkeypatch.setattr(devices, "cores", lambda: 16)
    try:
        assert devices.share_cores({"workercount": 4}, environ={}) == 4 and torch.get_num_threads() == 4
        assert devices.share_cores({"workercount": 32}, environ={}) == 1 and torch.get_num_threads() == 1
        assert devices.share_cores({"workercount": 4}, environ={"OMP_NUM_THREADS": "8"}) is None
        assert torch.get_num_threads() == 1  # left as it was
    finally:
        torch.set_num_threads(before)


def test_the_workers_of_a_run_share_the_cores(tmp_path):
    """End to end: each of two workers on this host's cores runs torch with half of them."""
    done, calls = oracle_run(tmp_path, "-n", "2", env={"OMP_NUM_THREADS": None})
    assert calls and {c["threads"] for c in calls} == {max(1, devices.cores() // 2)}, done.stdout + done.stderr


def test_a_cpu_kernel_or_a_host_without_gpus_records_no_device():
    assert devices.describe("cpu") is None
    import torch

    if not torch.cuda.is_available():
        assert devices.describe("cuda") is None


# --- end to end ------------------------------------------------------------------------------


# the small cases of N = 7 (the plug-in crashes on the first) and 133: enough for every worker
# (the large cases of N = 7 would probe a 4.7 GB pool for a dtype the plug-in does not declare)
SMALL_CASES = "(N7 or N133) and not large"


def oracle_run(tmp_path, *args, visible="7,9", env=None):
    tmp_path.mkdir(parents=True, exist_ok=True)
    record = tmp_path / "calls.jsonl"
    env = {**os.environ, "PYTHONPATH": str(PLUGINS), "ORACLE_PLUGINS": "pinned:register",
           "CUDA_VISIBLE_DEVICES": visible, "KV_ORACLE_RECORD": str(record), **(env or {})}
    env = {name: value for name, value in env.items() if value is not None}
    done = subprocess.run([sys.executable, "-m", "oracle", "run", "--origin", "env", "--kernel", "pinned.store_cache",
                           "--report", str(tmp_path / "report.json"), *args, "--", "-k", SMALL_CASES],
                          capture_output=True, text=True, timeout=300, env=env)
    calls = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    return done, calls


def test_each_worker_is_pinned_round_robin(tmp_path):
    done, calls = oracle_run(tmp_path, "-n", "4")
    assert done.returncode == 1, done.stdout + done.stderr  # the crashed case fails the run
    data = report.load(tmp_path / "report.json")
    assert Counter(c["status"] for c in data["cases"])["crashed"] == 1
    by_worker = {}
    for call in calls:
        by_worker.setdefault(call["worker"], set()).add(call["visible"])
    first_four = {w: seen for w, seen in by_worker.items() if int(w.removeprefix("gw")) < 4}
    assert len(first_four) == 4, by_worker
    for worker, seen in first_four.items():
        assert seen == {["7", "9"][int(worker.removeprefix("gw")) % 2]}, (worker, seen)


def test_the_worker_that_replaces_a_crashed_one_keeps_its_device(tmp_path):
    """One worker on a host with two GPUs: pinned to the first; it crashes, and the one xdist
    starts in its place (another process, the only one left to run the rest) sees the same GPU."""
    done, calls = oracle_run(tmp_path, "-n", "1")
    assert done.returncode == 1, done.stdout + done.stderr
    crash = next(i for i, c in enumerate(calls) if c["n"] == 7)
    before, after = calls[:crash + 1], calls[crash + 1:]
    assert after and {c["pid"] for c in after}.isdisjoint({c["pid"] for c in before})
    assert {c["visible"] for c in calls} == {"7"}


def test_the_devices_option_picks_among_the_visible_gpus(tmp_path):
    done, calls = oracle_run(tmp_path, "-n", "2", "--devices", "1")
    assert calls and {c["visible"] for c in calls} == {"9"}, done.stdout + done.stderr
    done, calls = oracle_run(tmp_path / "bad", "-n", "2", "--devices", "2")
    assert done.returncode != 0 and "--oracle-devices='2'" in done.stdout + done.stderr
    assert "ordinals 0..1 (7, 9)" in done.stdout + done.stderr and not calls


def test_auto_starts_the_workers_per_device(tmp_path):
    done, calls = oracle_run(tmp_path, "-n", "auto", "--workers-per-device", "2")
    assert "4 workers [" in done.stdout, done.stdout + done.stderr  # 2 devices x 2
    done, calls = oracle_run(tmp_path / "one", "-n", "auto", "--workers-per-device", "3", "--devices", "1")
    assert "3 workers [" in done.stdout and {c["visible"] for c in calls} == {"9"}, done.stdout + done.stderr


# --- the report and the matrix ---------------------------------------------------------------


def gpu(index, name="NVIDIA H200", capability="9.0"):
    return {"index": str(index), "name": name, "uuid": f"GPU-{name[-4:]}-{index}", "pci_bus_id": None,
            "capability": capability}


def run_report(cases, target="host"):
    base = {"op": "store_cache", "kernel": "k", "case_class": "sizes", "params": {}, "seed": 1, "seconds": 0.1,
            "message": "", "first_difference": None, "cause": None, "pattern": [], "nodeid": "x"}
    return {"schema_version": report.SCHEMA_VERSION, "tool": report.describe_tool(),
            "target": report.describe_target(target), "profile": "quick", "started": "2026-11-25T00:00:00+00:00",
            "duration_s": 1.0, "command": [], "kernels": [], "plugin_errors": [], "limits": None, "interrupted": None,
            "cases": [dict(base, case_id=cid, status=status, device=device) for cid, status, device in cases]}


def test_two_gpus_of_one_kind_are_one_column_and_each_device_is_counted():
    run = run_report([("a", "pass", gpu(0)), ("b", "fail", gpu(1)), ("c", "pass", gpu(1))])
    assert report.validate(run) == []
    names, rows, cells = report.matrix([run])
    assert names == ["host"] and cells[(rows[0], "host")] == Counter({"pass": 2, "fail": 1})
    notes = report.device_notes([run])
    assert notes == ["host: per device: cuda:0 (NVIDIA H200, GPU-H200-0): 1 cases, 0 failing; "
                     "cuda:1 (NVIDIA H200, GPU-H200-1): 2 cases, 1 failing"]


def test_gpus_of_several_kinds_are_one_column_each():
    run = run_report([("a", "pass", gpu(0, "NVIDIA H100")), ("b", "fail", gpu(1, "NVIDIA A100", "8.0")),
                      ("c", "pass", None)])
    names, rows, cells = report.matrix([run])
    assert names == ["host / NVIDIA A100 (sm 8.0)", "host / NVIDIA H100 (sm 9.0)", "host / no GPU"]
    assert [cells[(rows[0], n)] for n in names] == [Counter(fail=1), Counter({"pass": 1}), Counter({"pass": 1})]
    text = report.render_text([run])
    assert "host / NVIDIA A100 (sm 8.0)" in text and "FAIL 1/1" in text


def test_a_case_that_two_devices_of_one_kind_judge_differently_is_named():
    first = run_report([("a", "pass", gpu(0)), ("b", "pass", gpu(0))], target="run 1")
    second = run_report([("a", "fail", gpu(1)), ("b", "pass", gpu(1))], target="run 2")
    notes = report.device_notes([first, second])
    assert notes == ["devices of one kind disagree (NVIDIA H200, sm 9.0): k a: pass on cuda:0 (NVIDIA H200, "
                     "GPU-H200-0), fail on cuda:1 (NVIDIA H200, GPU-H200-1)"]
    other_kind = run_report([("a", "fail", gpu(1, "NVIDIA H100"))], target="run 3")
    assert report.device_notes([first, other_kind]) == []  # another kind may differ: not a disagreement


# --- the memory budget per device ------------------------------------------------------------


def test_a_gpu_kernels_large_case_draws_on_the_host_and_its_own_gpu(tmp_path, monkeypatch):
    """A GPU kernel's large case reserves from the host's budget and from its GPU's, which is
    named by the GPU's host index: workers on different GPUs never share one."""
    from types import SimpleNamespace

    monkeypatch.setattr(limits, "case_memory_bytes", lambda kernel, case: 3 * limits.UNIT_BYTES)
    monkeypatch.setattr(devices, "describe", lambda device: gpu(5) if device.startswith("cuda") else None)
    config = SimpleNamespace(getoption=lambda name, default=None: {"oracle_memory": 1.0}.get(name, default))
    monkeypatch.setattr(limits, "_state", lambda config: {"directory": str(tmp_path)})
    kernel = SimpleNamespace(contract=SimpleNamespace(device="cuda"))
    with limits.reserve_memory(config, kernel, None) as refused:
        assert refused is None
        held = sorted(p.name for p in tmp_path.glob("memory-*.units"))
    assert held == ["memory-cpu.units", "memory-cuda-5.units"]
    monkeypatch.setattr(limits, "case_memory_bytes", lambda kernel, case: int(2e9))
    with limits.reserve_memory(config, kernel, None) as refused:
        assert refused.startswith("not run: needs 2.0 GB, 1.0 available") and "on cpu" in refused
