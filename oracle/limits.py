"""Per-case time limits and the memory budget of the large case class (docs/conformance.md, "Time
limits and the memory budget"). The pytest plug-in calls in here; this module owns:

- **The time limit** (``--oracle-timeout``). Each case runs under faulthandler's watchdog: a C
  thread that needs no GIL, so it fires even while a kernel spins in C holding the GIL or blocks in
  a C-level wait, where a Python signal handler or a Python timer thread never runs again. It
  writes every thread's stack into the case's *limit file* and ends the process with
  ``os._exit(1)``. Under xdist the controller sees a crashed worker, finds the watchdog's dump in
  that file, and reports the case as timed out; xdist starts a fresh worker for the other cases.
  Without xdist (``-n 0``) there is no worker to replace: the dump goes to stderr and the run ends.
- **Ending from outside.** SIGTERM (a CI job's cancellation, ``timeout``) ends the run as Ctrl-C
  does, so the report is still written, with the cases that were in flight
  (:func:`catch_termination`, :func:`cases_in_flight`).
- **The memory budget** (``--oracle-memory``). A large case reserves its estimated bytes from its
  device's budget before it builds anything, and waits while other workers' large cases hold too
  much of it; a case that could never fit is not run, with the reason. The budget is a weighted
  semaphore of POSIX record locks, one locked byte per 64 MiB, in a file the workers share: the
  kernel drops a process's locks when it dies, so a crashed or timed-out worker frees its share.
- **The shared directory** holding both: made by the controller (or the only process), handed to
  xdist workers in ``workerinput``, removed at the end of the session.
"""

from __future__ import annotations

import argparse
import faulthandler
import gc
import hashlib
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from contextlib import ExitStack, contextmanager
from pathlib import Path

DEFAULT_TIMEOUT_S = 300.0  # ~35x a large case on a loaded 2-core machine (8 s), with its diagnosis
UNIT_BYTES = 64 << 20  # the budget's granularity: one lock byte per 64 MiB
HEADROOM = 0.9  # the share of measured free memory large cases may hold; the rest is for the
# other workers' small cases, which come and go outside the budget
OVERHEAD = 1.05  # a case's peak over its arena: the kernel's temporaries, snapshots, the reference
POLL_S = 0.1  # how often a waiting reservation looks for freed units
GB = 1e9
TIMEOUT, NOT_RUN = "timeout", "not run"  # the case statuses these limits give

_WORKER_KEY = "oracle_limits_dir"
_STATE_KEY: list = []  # the pytest.StashKey of this module's per-session state, made on first use
# (`oracle list` and the other commands import this module without pytest)


def _state(config) -> dict:
    """This session's ``directory`` (str), whether this process ``owns`` it, and the terminal's
    ``stderr`` descriptor (without xdist)."""
    if not _STATE_KEY:
        import pytest

        _STATE_KEY.append(pytest.StashKey[dict]())
    return config.stash.setdefault(_STATE_KEY[0], {})


def seconds_argument(value: str) -> float:
    """The type of ``--oracle-timeout`` (and ``oracle run --timeout``; argparse names the option in
    the error): seconds >= 0, where 0 means no time limit."""
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0 or seconds == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0: no limit), got {value!r}")
    return seconds


def gigabytes_argument(value: str) -> float:
    """The type of ``--oracle-memory`` (and ``oracle run --memory``): a positive number of GB (10^9 bytes)."""
    try:
        gigabytes = float(value)
    except ValueError:
        gigabytes = -1.0
    if not gigabytes > 0 or gigabytes == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number of GB, got {value!r}")
    return gigabytes


def add_options(group) -> None:
    group.addoption("--oracle-timeout", type=seconds_argument, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help=f"end a case that runs longer (its worker is replaced; reported TIMEOUT); 0 for no "
                         f"limit (default {DEFAULT_TIMEOUT_S:g})")
    group.addoption("--oracle-memory", type=gigabytes_argument, default=None, metavar="GB",
                    help="memory budget of the large cases on each device (default: 90%% of what is "
                         "available when the first one starts); cases that cannot fit are not run")


# --- the shared directory ---------------------------------------------------------------------


def configure(config) -> None:
    timeout = config.getoption("oracle_timeout", DEFAULT_TIMEOUT_S)
    if timeout and float(config.getini("faulthandler_timeout") or 0):
        import pytest  # both are faulthandler's one watchdog: each would cancel the other's

        raise pytest.UsageError(f"--oracle-timeout={timeout:g} and the ini option faulthandler_timeout="
                                f"{config.getini('faulthandler_timeout')} cannot be combined: set one to 0")
    state = _state(config)
    worker = getattr(config, "workerinput", None)
    if worker is not None and _WORKER_KEY in worker:
        state.update(directory=worker[_WORKER_KEY], owns=False)
    else:
        state.update(directory=tempfile.mkdtemp(prefix="kv-oracle-limits-"), owns=True)
    if worker is None:  # the watchdog's dump must reach the terminal: capture is suspended now
        state["stderr"] = os.dup(sys.__stderr__.fileno() if sys.__stderr__ is not None else 2)


def configure_node(config, node) -> None:
    """xdist: the worker ``node`` shares this process's directory."""
    node.workerinput[_WORKER_KEY] = _state(config)["directory"]


def unconfigure(config) -> None:
    state = _state(config)
    if state.pop("owns", False):
        shutil.rmtree(state["directory"], ignore_errors=True)
    if "stderr" in state:
        os.close(state.pop("stderr"))


# --- the time limit ---------------------------------------------------------------------------


def _limit_file(config, nodeid: str) -> Path:
    return Path(_state(config)["directory"]) / (hashlib.sha1(nodeid.encode()).hexdigest()[:20] + ".case")


@contextmanager
def time_limit(config, nodeid: str, case_record: dict):
    """Run the body under the watchdog: past ``--oracle-timeout`` seconds every thread's stack is
    dumped and the process ends. In an xdist worker the dump goes to the limit file of ``nodeid``,
    after one JSON line ``case_record`` (the case, its parameters and seed), for the controller's
    :func:`case_in_flight`; without xdist, to stderr."""
    seconds = config.getoption("oracle_timeout", DEFAULT_TIMEOUT_S)
    if not seconds:
        yield
        return
    if not hasattr(config, "workerinput"):
        faulthandler.dump_traceback_later(seconds, exit=True, file=_state(config)["stderr"])
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
        return
    path = _limit_file(config, nodeid)
    with open(path, "w") as out:
        out.write(json.dumps(dict(case_record, limit_s=seconds, started=time.time(), nodeid=nodeid)) + "\n")
        out.flush()  # the watchdog writes through the descriptor, after this line
        faulthandler.dump_traceback_later(seconds, exit=True, file=out)
        interrupted = False
        try:
            yield
        except KeyboardInterrupt:  # the run is being stopped: the case stays in flight for the report
            interrupted = True
            raise
        finally:
            faulthandler.cancel_dump_traceback_later()
            if not interrupted:
                path.unlink()  # ended in time (or raised): nothing for the controller to find


def _read_limit_file(path: Path) -> tuple[dict, str] | None:
    """(the case record of its first line, the watchdog's dump after it), or None when the file
    is gone or its line is not (yet) whole."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    header, _, dump = text.partition("\n")
    try:
        case = json.loads(header)
    except json.JSONDecodeError:
        return None
    return case, dump.strip()


def case_in_flight(config, nodeid: str) -> tuple[dict, str] | None:
    """Controller side, after the worker running ``nodeid`` died: (the case it was running, the
    watchdog's dump) from the limit file, or None when it died outside a case. An empty dump means
    it died some other way (a crash) inside that case."""
    return _read_limit_file(_limit_file(config, nodeid))


def cases_in_flight(config) -> list[dict]:
    """Controller side, when the run is interrupted: the case each worker was running (its record,
    with ``running_s``), from the limit files still open, longest-running first. Empty without a
    time limit (no limit files are written then)."""
    found = []
    for path in Path(_state(config)["directory"]).glob("*.case"):
        read = _read_limit_file(path)  # None: ended meanwhile, or its line is being written
        if read is None:
            continue
        case = read[0]
        started = case.pop("started", None)
        case.pop("limit_s", None)
        case["running_s"] = round(time.time() - started, 1) if started else None
        found.append(case)
    return sorted(found, key=lambda c: -(c["running_s"] or 0))


# --- ending the run from outside --------------------------------------------------------------


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def catch_termination(config) -> None:
    """Controller side: make SIGTERM (a CI job's or ``timeout``'s cancellation) end the run as
    Ctrl-C does, so pytest finishes the session and the report is written with what finished and
    what was in flight. Only where SIGTERM still has its default action (a caller's own handler
    stays), and only in the main thread."""
    if hasattr(config, "workerinput") or threading.current_thread() is not threading.main_thread():
        return
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)
        _state(config)["sigterm"] = True


def release_termination(config) -> None:
    if _state(config).pop("sigterm", False) and signal.getsignal(signal.SIGTERM) is _interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


# --- the memory budget ------------------------------------------------------------------------


def case_memory_bytes(kernel, case) -> int | None:
    """The bytes a large case holds while it runs, on its kernel's device: its arena (built on
    torch's meta device, so nothing is allocated) plus OVERHEAD; None for any other case, and for
    one that will not run (outside the contract, where large caches are never probed)."""
    if not case.p.get("large"):
        return None
    import numpy as np

    from .buffers import Arena
    from .contract import gaps
    from .ops import get_spec

    spec = get_spec(case.op)
    if any(not gap.probe for gap in gaps(kernel.contract, spec.needs(case))):
        return None
    arena = Arena("meta", case.seed)
    spec.build(case, arena, np.random.default_rng(case.seed), kernel.contract)
    return int(OVERHEAD * sum(r.tensor.numel() * r.tensor.element_size() for r in arena.regions.values()))


def available_memory_bytes(device: str = "cpu") -> int | None:
    """Free memory of ``device`` now: the host's MemAvailable (/proc/meminfo; elsewhere the free
    pages sysconf reports, a lower bound), or a CUDA device's free memory; None when unknown."""
    if device.startswith("cuda"):  # "cuda", "cuda:1", or a budget's pool "cuda-<host index>"
        import torch

        target = torch.device(device) if not device.startswith("cuda-") else torch.device("cuda")
        return int(torch.cuda.mem_get_info(target)[0])
    if device != "cpu":
        return None
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


class MemoryBudget:
    """The budget of one device (``pool``: "cpu", "cuda-<host index>"), shared by every process of the session
    through ``directory``. Its capacity is ``gigabytes`` when given, else fixed by the first
    reservation: HEADROOM of the device's free memory then, before any large case holds any."""

    def __init__(self, directory, pool: str, gigabytes: float | None = None):
        self.directory, self.pool, self.gigabytes = Path(directory), pool, gigabytes
        self._units = self.directory / f"memory-{pool}.units"  # byte i locked: unit i is held

    @contextmanager
    def _gate(self):
        """One reservation is made at a time; holders release without it."""
        import fcntl

        with open(self.directory / f"memory-{self.pool}.gate", "a") as gate:
            fcntl.flock(gate, fcntl.LOCK_EX)
            yield

    def capacity_bytes(self) -> int | None:
        """The budget in bytes (None: free memory unknown here). Call under the gate."""
        if self.gigabytes is not None:
            return int(self.gigabytes * GB)
        recorded = self.directory / f"memory-{self.pool}.capacity"
        if recorded.exists():
            value = recorded.read_text().strip()
            return int(value) if value else None
        free = available_memory_bytes(self.pool)
        capacity = int(free * HEADROOM) if free is not None else None
        recorded.write_text("" if capacity is None else str(capacity))
        return capacity

    def recorded_gigabytes(self) -> float | None:
        """The capacity in GB, if a reservation fixed one (for the report)."""
        if self.gigabytes is not None:
            return self.gigabytes
        recorded = self.directory / f"memory-{self.pool}.capacity"
        value = recorded.read_text().strip() if recorded.exists() else ""
        return round(int(value) / GB, 3) if value else None

    @contextmanager
    def reserve(self, need: int):
        """Hold ``need`` bytes of the budget for the body, waiting until they are free. Yields
        None, or the reason the case is not run: it needs more than the whole budget. One
        reservation per process at a time (closing the file drops all of its locks)."""
        refused, units = None, None
        with self._gate():
            capacity = self.capacity_bytes()
            if capacity is not None and need > capacity:
                refused = (f"not run: needs {need / GB:.1f} GB, {capacity / GB:.1f} available "
                           f"(the memory budget of large cases on {self.pool}; --oracle-memory)")
            else:
                # free memory unknown: every reservation takes the one unit, one case at a time
                total = max(1, capacity // UNIT_BYTES) if capacity is not None else 1
                # need <= capacity, so a need within a unit of the whole budget takes all of it
                wanted = max(1, min(total, -(-need // UNIT_BYTES))) if capacity is not None else 1
                units = os.open(self._units, os.O_RDWR | os.O_CREAT, 0o600)
                held: set[int] = set()
                while len(held) < wanted:
                    for unit in range(total):
                        if unit not in held and len(held) < wanted and _try_lock(units, unit):
                            held.add(unit)
                    if len(held) < wanted:
                        time.sleep(POLL_S)
        if refused:
            yield refused
            return
        try:
            yield None
        finally:
            gc.collect()  # a reference cycle must not keep an arena alive past its reservation
            os.close(units)


def _try_lock(fd: int, unit: int) -> bool:
    import fcntl

    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, unit)
        return True
    except OSError:
        return False


def _pool(device: str) -> str:
    """The budget a kernel on ``device`` draws from: "cpu", or one per GPU of the host, named
    by its host index ("cuda-0", "cuda-3"): workers pinned to different GPUs (oracle.devices)
    never wait for each other, and those sharing one share its budget."""
    if not device.startswith("cuda"):
        return device
    from .devices import describe

    found = describe(device)
    name = found["index"] if found else "0"
    return "cuda-" + "".join(c if c.isalnum() or c in "-_" else "_" for c in name)


@contextmanager
def reserve_memory(config, kernel, case):
    """The memory budget around one case: yields None once the case may run (immediately for a
    case outside the large class), or why it is not run. A GPU kernel's large case holds its
    bytes on its GPU and as much again of the host's memory (the inputs, snapshots and the
    reference's arrays live there too); the host's budget is reserved first, always in that order."""
    need = case_memory_bytes(kernel, case)
    if need is None:
        yield None
        return
    directory, gigabytes = _state(config)["directory"], config.getoption("oracle_memory")
    pools = ["cpu"] + ([_pool(kernel.contract.device)] if kernel.contract.device != "cpu" else [])
    with ExitStack() as stack:
        for pool in pools:
            refused = stack.enter_context(MemoryBudget(directory, pool, gigabytes).reserve(need))
            if refused:
                break
        yield refused


def budgets(config) -> dict:
    """{device: GB} of every budget that large cases used in this session (for the report)."""
    directory = Path(_state(config)["directory"])
    pools = sorted(p.name.split("-", 1)[1].rsplit(".", 1)[0] for p in directory.glob("memory-*.gate"))
    out = {pool: MemoryBudget(directory, pool, config.getoption("oracle_memory")).recorded_gigabytes()
           for pool in pools}
    return {pool: gigabytes for pool, gigabytes in out.items() if gigabytes is not None}
