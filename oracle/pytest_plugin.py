"""The pytest plug-in behind ``conformance/``: options, parametrization, failure reports, summary.

Loaded through the ``pytest11`` entry point, so the suite runs from an installed kv-oracle as well
as from a clone (``pytest --pyargs conformance``). Test ids read
``test_store_cache[torch.store_cache][bf16-int32-fused_src]``: op, kernel, case.
"""

from __future__ import annotations

import os
import shlex
import sys
import warnings
from collections import Counter, defaultdict

import pytest

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
    """Run one (kernel, case) and turn the outcome into a pytest outcome."""
    from .runner import FAIL, NOT_SUPPORTED, UNAVAILABLE, UNDECLARED, run_case

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
    try:
        outcome = run_case(kernel, case)
    except Exception as exc:
        # the oracle itself broke: the report must still count the case, as pytest does
        node.user_properties += [("oracle_status", FAIL), ("oracle_message",
                                  f"kv-oracle raised {type(exc).__name__}: {exc} (a bug in the oracle, "
                                  "not a verdict on the kernel)")]
        raise
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
        raise ConformanceFailure("\n".join(lines))


def replay_command(request) -> str:
    path = str(request.node.path)
    name = request.node.name
    plugins = os.environ.get("ORACLE_PLUGINS")
    env = f"ORACLE_PLUGINS={shlex.quote(plugins)} " if plugins else ""
    return f"{env}{shlex.quote(sys.executable)} -m pytest {shlex.quote(path + '::' + name)}" + \
        "".join(f" {opt}={shlex.quote(str(request.config.getoption(key)))}"
                for opt, key in (("--oracle-profile", "oracle_profile"),) if request.config.getoption(key)
                != PROFILE_DEFAULT)


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


def pytest_runtest_logreport(report):
    props = dict(report.user_properties)
    if report.when == "???":  # xdist: the worker died while running this item
        record = _crash_record(report)
        if record is not None:
            _CASES[report.nodeid] = record
            _OUTCOMES[(record["op"], record["kernel"])]["crashed"] += 1
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
        "pattern": props.get("oracle_pattern", []), "nodeid": report.nodeid}


def _crash_record(report) -> dict | None:
    """The case a crashed worker was running, from its node id alone (the worker is gone):
    ``...test_<op>[<kernel>][<case id>]``."""
    from .cases import catalogue
    from .registry import default_registry

    name = report.nodeid.rpartition("::")[2]
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
    return {"op": op, "kernel": kernel, "case_id": case_id or "(property)",
            "case_class": case.cls if case else "property", "params": _jsonable_params(case) if case else {},
            "seed": case.seed if case else None, "status": "crashed", "seconds": report.duration or 0.0,
            "message": str(report.longrepr), "first_difference": None, "cause": None, "pattern": [],
            "nodeid": report.nodeid}


_STARTED: dict = {}


def pytest_sessionstart(session):
    import datetime
    import time

    _STARTED.update(wall=time.time(), iso=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))


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
        "cases": [_CASES[n] for n in sorted(_CASES)]})


def pytest_terminal_summary(terminalreporter):
    if not _OUTCOMES:
        return
    columns = ("pass", "fail", "crashed", "not supported", "works, not declared", "unavailable")
    terminalreporter.section("kv-oracle conformance")
    width = max(len(f"{op} / {kernel}") for op, kernel in _OUTCOMES) + 2
    terminalreporter.write_line(f"{'op / kernel':<{width}}" + "".join(f"{c:>21}" for c in columns))
    for (op, kernel), counts in sorted(_OUTCOMES.items()):
        terminalreporter.write_line(f"{op + ' / ' + kernel:<{width}}" +
                                    "".join(f"{counts.get(c, 0):>21}" for c in columns))
