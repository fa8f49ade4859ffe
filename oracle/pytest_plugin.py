"""The pytest plug-in behind ``conformance/``: options, parametrization, failure reports, summary.

Loaded through the ``pytest11`` entry point, so the suite runs from an installed kv-oracle as well
as from a clone (``pytest --pyargs conformance``). Test ids read
``test_store_cache[torch.store_cache][bf16-int32-fused_src]``: op, kernel, case.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import warnings
from collections import Counter, defaultdict

import pytest

from . import devices, limits

PROFILE_DEFAULT = "quick"


class UndeclaredCapability(UserWarning):
    """A kernel passed a case its contract does not declare: widen the contract?"""


class ToleranceUsed(UserWarning):
    """An fp8 result was accepted only through the contract's declared tolerance."""


class ConformanceFailure(AssertionError):
    """A kernel disagreed with the reference; the message is the whole report."""


def pytest_addoption(parser):
    group = parser.getgroup("oracle", "kv-oracle conformance")
    group.addoption("--oracle-backend", default=None, help="only kernels of these backends (comma-separated)")
    group.addoption("--oracle-kernel", default=None, help="only these kernels (comma-separated names)")
    group.addoption("--oracle-op", default=None, help="only these ops (comma-separated)")
    group.addoption("--oracle-profile", default=PROFILE_DEFAULT, choices=("quick", "full", "exhaustive"),
                    help="how many cases: quick (default), full, exhaustive")
    group.addoption("--oracle-dump", default=None, metavar="DIR",
                    help="write each failing case as an .npz bundle for `oracle replay`")
    group.addoption("--oracle-origin", default="all", choices=("all", "entry-points", "env"),
                    help="only kernels from installed entry points, or only from ORACLE_PLUGINS")
    group.addoption("--oracle-report", default=None, metavar="PATH",
                    help="write the JSON conformance report (docs/report-schema.md) here")
    group.addoption("--oracle-target", default=None, metavar="NAME",
                    help="the execution target's name in the report (default: GPU or CPU model)")
    limits.add_options(group)
    devices.add_options(group)


_CONFIG: list = []  # the sessions' configs, innermost last, for hooks that get none (crash reports)


def pytest_configure(config):
    devices.configure(config)
    limits.configure(config)
    limits.catch_termination(config)
    _CONFIG.append(config)


@pytest.hookimpl(optionalhook=True, tryfirst=True)  # before xdist's own count of cores
def pytest_xdist_auto_num_workers(config):
    """xdist's ``-n auto``: on several GPUs, workers per device (oracle.devices)."""
    return devices.auto_workers(config)


def pytest_unconfigure(config):
    limits.release_termination(config)
    limits.unconfigure(config)
    if config in _CONFIG:
        _CONFIG.remove(config)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist: each worker gets the limits' shared directory."""
    limits.configure_node(node.config, node)


def _kernels(config, op):
    from .registry import default_registry

    registry = default_registry.discover()
    return registry.select(backend=config.getoption("oracle_backend"),
                           kernel=config.getoption("oracle_kernel"), op=op,
                           origin=config.getoption("oracle_origin"))


def _op_selected(config, op) -> bool:
    ops = config.getoption("oracle_op")
    return ops is None or op in {s.strip() for s in ops.split(",")}


def pytest_generate_tests(metafunc):
    if "oracle_case" in metafunc.fixturenames:
        from .cases import catalogue

        op = metafunc.function.__name__.removeprefix("test_")
        params = []
        if _op_selected(metafunc.config, op):
            profile = metafunc.config.getoption("oracle_profile")
            for kernel in _kernels(metafunc.config, op):
                reason = kernel.unavailable()
                if reason:
                    params.append(pytest.param((kernel, None, reason), id=f"{kernel.name}][unavailable"))
                    continue
                for case in catalogue(op, profile, kernel.contract):
                    params.append(pytest.param((kernel, case, None), id=f"{kernel.name}][{case.id}"))
        if not params:
            params.append(pytest.param((None, None, "no kernel registered for this op matches the "
                                                    "filters"), id="no kernel"))
        metafunc.parametrize("oracle_case", params)
    if "oracle_kernel" in metafunc.fixturenames:
        kernels = [k for k in _kernels(metafunc.config, None) if _op_selected(metafunc.config, k.contract.op)]
        params = [pytest.param((k, "unavailable: " + r if (r := k.unavailable()) else None), id=k.name)
                  for k in kernels] or [pytest.param((None, "no kernel matches the filters"), id="no kernel")]
        metafunc.parametrize("oracle_kernel", params)
    if "oracle_plugin_error" in metafunc.fixturenames:
        from .registry import default_registry

        errors = default_registry.discover().errors
        metafunc.parametrize("oracle_plugin_error", errors or [None],
                             ids=[e.plugin for e in errors] or ["none broken"])


def check_case(request, oracle_case) -> None:
    """Run one (kernel, case) within the limits (time, and memory for a large case) and turn the
    outcome into a pytest outcome."""
    from .runner import FAIL, UNAVAILABLE, run_case

    kernel, case, reason = oracle_case
    if kernel is None:
        pytest.skip(reason)
    node = request.node
    node.user_properties += [("oracle_kernel", kernel.name), ("oracle_op", kernel.contract.op)]
    if case is None:
        node.user_properties += [("oracle_status", UNAVAILABLE), ("oracle_message", reason)]
        pytest.skip(f"unavailable: {reason}")
    node.user_properties += [("oracle_class", case.cls), ("oracle_case", case.id),
                             ("oracle_seed", case.seed), ("oracle_params", _jsonable_params(case))]
    device = devices.describe(kernel.contract.device)
    if device is not None:  # the record for the JSON report; the label for JUnit readers
        node.user_properties += [("oracle_device_record", device),
                                 ("oracle_device", f"{devices.label(device)} sm {device['capability']}")]
    with limits.reserve_memory(request.config, kernel, case) as refused:
        if refused:
            node.user_properties += [("oracle_status", limits.NOT_RUN), ("oracle_message", refused)]
            pytest.skip(refused)
        try:
            with limits.time_limit(request.config, node.nodeid, dict(_case_record(case), device=device)):
                outcome = run_case(kernel, case)
        except Exception as exc:
            # the oracle itself broke: the report must still count the case, as pytest does
            node.user_properties += [("oracle_status", FAIL), ("oracle_message",
                                      f"kv-oracle raised {type(exc).__name__}: {exc} (a bug in the oracle, "
                                      "not a verdict on the kernel)")]
            raise
        _judge(request, kernel, case, outcome)


def _judge(request, kernel, case, outcome) -> None:
    from .runner import FAIL, NOT_SUPPORTED, UNAVAILABLE, UNDECLARED

    node = request.node
    node.user_properties += [("oracle_status", outcome.status), ("oracle_message", outcome.message),
                             ("oracle_seconds", round(outcome.seconds, 6))]
    if kernel.contract.device.startswith("cuda"):
        node.stash[_CUDA_KERNEL] = True
    if outcome.status == UNAVAILABLE:
        pytest.skip(f"unavailable: {outcome.message}")
    if outcome.status == NOT_SUPPORTED:
        pytest.skip(f"not supported: {outcome.message}")
    if outcome.status == UNDECLARED:
        warnings.warn(UndeclaredCapability(f"{kernel.name} {case.id}: works, not declared: {outcome.message}"))
        return
    if outcome.warning:
        warnings.warn(ToleranceUsed(f"{kernel.name} {case.id}: {outcome.warning}"))
    if outcome.status == FAIL:
        node.user_properties.append(("oracle_first_difference", outcome.first))
        node.user_properties += [("oracle_cause", outcome.cause), ("oracle_pattern", list(outcome.pattern))]
        if outcome.cause:  # flat, for JUnit readers that show properties as text
            node.user_properties += [("oracle_cause_id", outcome.cause["id"]),
                                     ("oracle_cause_text", outcome.cause["text"])]
        lines = [f"{kernel.name} fails {case.op} case {case.id} (class {case.cls}, seed {case.seed})",
                 outcome.message]
        dump_dir = request.config.getoption("oracle_dump")
        if dump_dir and outcome.prepared is not None:
            from .bundle import write_bundle

            path = write_bundle(dump_dir, kernel, case, outcome)
            lines.append(f"bundle: {path}\nreplay elsewhere: oracle replay {shlex.quote(str(path))} "
                         f"--kernel {kernel.name}")
        lines.append("re-run exactly this case: " + replay_command(request))
        # the caches (GBs for a large case) go now, before the memory budget gets them back;
        # pytest keeps the exception's frames alive after the test
        outcome.prepared = outcome.expected = None
        raise ConformanceFailure("\n".join(lines))


def _case_record(case) -> dict:
    return {"case_id": case.id, "case_class": case.cls, "params": _jsonable_params(case), "seed": case.seed}


def replay_command(request) -> str:
    return _replay_line(request.config, str(request.node.path), request.node.name)


def _replay_line(config, path: str, name: str) -> str:
    """The one command that re-runs exactly the test ``name`` of file ``path``."""
    env = "".join(f"{name}={shlex.quote(os.environ[name])} " for name in ("PYTHONPATH", "ORACLE_PLUGINS")
                  if os.environ.get(name))  # a plug-in found through PYTHONPATH needs it again
    defaults = (("--oracle-profile", "oracle_profile", PROFILE_DEFAULT),
                ("--oracle-timeout", "oracle_timeout", limits.DEFAULT_TIMEOUT_S),
                ("--oracle-memory", "oracle_memory", None))
    return f"{env}{shlex.quote(sys.executable)} -m pytest {shlex.quote(path + '::' + name)}" + \
        "".join(f" {opt}={shlex.quote(f'{value:g}' if isinstance(value, float) else str(value))}"
                for opt, key, default in defaults
                if (value := config.getoption(key, default)) != default)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(ConformanceFailure):
        report.longrepr = str(call.excinfo.value)


_CUDA_KERNEL = pytest.StashKey[bool]()


def pytest_runtest_teardown(item):
    """A CUDA kernel that left a sticky error (an illegal address, say) poisons its process for
    every later case: end the worker now, so xdist reports it crashed here and starts a fresh one."""
    if item.stash.get(_CUDA_KERNEL, False) and hasattr(item.config, "workerinput"):
        import torch

        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:
            sys.stderr.write(f"kv-oracle: CUDA context poisoned after {item.nodeid}: {exc}\n")
            os._exit(70)


def _jsonable_params(case) -> dict:
    return {key: list(value) if isinstance(value, tuple) else value for key, value in case.params}


_OUTCOMES: dict = defaultdict(Counter)


_CASES: dict = {}  # nodeid -> the report's case record (controller side)


@pytest.hookimpl(tryfirst=True)  # before JUnit and the terminal read a crash report
def pytest_runtest_logreport(report):
    props = dict(report.user_properties)
    if report.when == "???":  # xdist: the worker died while running this item
        record = _crash_record(report)
        if record is not None:
            _CASES[report.nodeid] = record
            _OUTCOMES[(record["op"], record["kernel"])][record["status"]] += 1
            report.longrepr = ("TIMEOUT: " if record["status"] == limits.TIMEOUT else "") + record["message"]
            _junit_properties(report, record)
        return
    if report.when != "call" or "oracle_status" not in props:
        return
    status = "fail" if report.failed else props["oracle_status"]
    _OUTCOMES[(props["oracle_op"], props["oracle_kernel"])][status] += 1
    message = props.get("oracle_message", "")
    if report.failed and status == "fail" and not message:
        message = str(report.longrepr)
    _CASES[report.nodeid] = {
        "op": props["oracle_op"], "kernel": props["oracle_kernel"],
        "case_id": props.get("oracle_case", "(unavailable)"), "case_class": props.get("oracle_class", "-"),
        "params": props.get("oracle_params", {}), "seed": props.get("oracle_seed"), "status": status,
        "seconds": props.get("oracle_seconds", report.duration), "message": message,
        "first_difference": props.get("oracle_first_difference"), "cause": props.get("oracle_cause"),
        "pattern": props.get("oracle_pattern", []), "nodeid": report.nodeid,
        "device": props.get("oracle_device_record")}


def _crash_record(report) -> dict | None:
    """The case a dead worker was running: from its node id (``...test_<op>[<kernel>][<case
    id>]``) and the case's limit file (a property test's example; the watchdog's dump when the case
    ran past its time limit, which makes it a timeout rather than a crash)."""
    from .cases import catalogue
    from .registry import default_registry

    path, _, name = report.nodeid.rpartition("::")
    func, _, rest = name.partition("[")
    if not func.startswith("test_") or not rest.endswith("]"):
        return None
    op = func.removeprefix("test_")
    kernel, _, case_id = rest[:-1].partition("][")
    known = default_registry.discover().kernels.get(kernel)
    contract = known.contract if known else None
    cases = ({c.id: c for profile in ("quick", "full") for c in catalogue(op, profile, contract)}
             if case_id else {})
    case = cases.get(case_id)
    record = {"op": op, "kernel": kernel, "case_id": case_id or "(property)",
              "case_class": case.cls if case else "property", "params": _jsonable_params(case) if case else {},
              "seed": case.seed if case else None, "status": "crashed", "seconds": report.duration or 0.0,
              "message": str(report.longrepr), "first_difference": None, "cause": None, "pattern": [],
              "nodeid": report.nodeid, "device": None}
    config = _CONFIG[-1]
    in_flight = limits.case_in_flight(config, report.nodeid)
    if in_flight is not None:
        running, dump = in_flight
        record["device"] = running.get("device")
        if case is None:  # a property test: the example it was running
            record.update(case_id=running["case_id"], params=running["params"], seed=running["seed"])
        if dump:
            record.update(status=limits.TIMEOUT, seconds=running["limit_s"], message=(
                f"ran past the time limit of {running['limit_s']:g} s (--oracle-timeout): {kernel} on {op} case "
                f"{record['case_id']} (class {record['case_class']}, seed {record['seed']}, params "
                f"{json.dumps(record['params'])}); its worker was ended and replaced\n"
                f"where it was, most recent call first:\n{_case_stack(dump)}"))
    replay = _replay_line(config, os.path.normpath(config.rootpath / path), name)
    record["message"] += "\nre-run exactly this case: " + replay
    return record


def _case_stack(dump: str, limit: int = 40) -> str:
    """From the watchdog's dump (every thread's stack), the stack of the thread that ran the case,
    down to the test function (pytest's own frames below it say nothing about the kernel)."""
    threads = [[line for line in block.splitlines() if line.startswith("  ")] for block in dump.split("\n\n")]
    ran = next((t for t in threads if any(" in check_case" in line for line in t)), sum(threads, []))
    end = next((i for i, line in enumerate(ran) if " in check_case" in line), len(ran) - 2) + 2
    kept = ran[:min(end, limit)]
    return "\n".join(kept + ([f"  ... ({len(ran) - len(kept)} more frames)"] if len(ran) > len(kept) else []))


def _junit_properties(report, record: dict) -> None:
    """A dead worker's case in JUnit, with the properties a living one would have had."""
    from _pytest.junitxml import xml_key

    xml = _CONFIG[-1].stash.get(xml_key, None)
    if xml is None:
        return
    reporter = xml.node_reporter(report)
    for key in ("kernel", "op", "case_class", "case_id", "seed", "params", "status", "message"):
        reporter.add_property("oracle_" + {"case_class": "class", "case_id": "case"}.get(key, key),
                              str(record[key]))
    if record.get("device"):
        device = record["device"]
        reporter.add_property("oracle_device", f"{devices.label(device)} sm {device['capability']}")


_STARTED: dict = {}


def pytest_sessionstart(session):
    import datetime
    import time

    _STARTED.update(wall=time.time(), iso=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which ends the workers (and their cases in flight)
def pytest_sessionfinish(session, exitstatus):
    config = session.config
    path = config.getoption("oracle_report", None)
    if not path or hasattr(config, "workerinput"):  # workers forward their results to the controller
        return
    import time

    from . import report
    from .registry import default_registry

    kernels, errors = report.describe_kernels(default_registry.discover())
    selected = {k.name for k in _kernels(config, None)}
    report.write(path, {
        "schema_version": report.SCHEMA_VERSION, "tool": report.describe_tool(),
        "target": report.describe_target(config.getoption("oracle_target")),
        "profile": config.getoption("oracle_profile"), "started": _STARTED.get("iso", ""),
        "duration_s": round(time.time() - _STARTED.get("wall", time.time()), 3),
        "command": list(config.invocation_params.args),
        "kernels": [k for k in kernels if k["name"] in selected], "plugin_errors": errors,
        "limits": {"timeout_s": config.getoption("oracle_timeout"), "memory_gb": config.getoption("oracle_memory"),
                   "memory_budgets": limits.budgets(config)},
        "interrupted": _interruption(session, exitstatus),
        "cases": [_CASES[n] for n in sorted(_CASES)]})


def _interruption(session, exitstatus) -> dict | None:
    """None for a run that ended by itself; for one stopped from outside (Ctrl-C, SIGTERM): how
    many of the collected cases finished and which were in flight (oracle.limits)."""
    if exitstatus != pytest.ExitCode.INTERRUPTED:
        return None
    config = session.config
    in_flight = []
    for running in limits.cases_in_flight(config):
        nodeid = running.pop("nodeid", "")
        path, _, name = nodeid.rpartition("::")
        kernel = name.partition("[")[2].partition("]")[0]
        in_flight.append(dict(running, kernel=kernel, nodeid=nodeid,
                              replay=_replay_line(config, os.path.normpath(config.rootpath / path), name)))
    return {"finished": len(_CASES), "collected": session.testscollected, "in_flight": in_flight}


def pytest_terminal_summary(terminalreporter):
    if not _OUTCOMES:
        return
    columns = ("pass", "fail", "crashed", "timeout", "not supported", "works, not declared", "not run",
               "unavailable")
    terminalreporter.section("kv-oracle conformance")
    width = max(len(f"{op} / {kernel}") for op, kernel in _OUTCOMES) + 2
    terminalreporter.write_line(f"{'op / kernel':<{width}}" + "".join(f"{c:>21}" for c in columns))
    for (op, kernel), counts in sorted(_OUTCOMES.items()):
        terminalreporter.write_line(f"{op + ' / ' + kernel:<{width}}" +
                                    "".join(f"{counts.get(c, 0):>21}" for c in columns))
