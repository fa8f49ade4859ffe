"""Every GPU of the host: which one each xdist worker uses, and what a case ran on.

- **Pinning.** On a host with several visible GPUs, each xdist worker is pinned to one of them,
  round-robin by worker index: its process starts with ``CUDA_VISIBLE_DEVICES`` (ROCm:
  ``HIP_VISIBLE_DEVICES``) naming that one device, set through xdist's own worker specs
  (``popen//env:NAME=VALUE``), so it holds before the worker imports torch, and a worker that
  xdist replaces after a crash or a time-out starts on the same device. The selection is
  ``--oracle-devices`` (ordinals among the visible devices; default every one), and ``-n auto``
  starts ``--oracle-workers-per-device`` workers per selected device (default: the cores shared
  out evenly, at least one each).
- **Cores.** Each xdist worker runs torch's CPU operations on its share of the cores (the
  cores this process may use over the workers, at least one), not on all of them: N workers of
  C threads each on C cores oversubscribe the machine, and the idle OpenMP threads' spin-waiting
  slows every worker several-fold. ``OMP_NUM_THREADS``, where set, is left to rule.
- **Recording.** A case that ran on a GPU records that device: its index on the host, name, UUID,
  PCI bus id and compute capability (:func:`describe`), in the JSON report and in JUnit.

Nothing here initializes CUDA in the controlling process beyond counting devices, and nothing
needs a GPU to be tested: the visible list, the selection and the assignment are plain functions
of the environment and a device count.
"""

from __future__ import annotations

import os

CUDA_VAR, HIP_VAR = "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"


def visibility_variable() -> str:
    """The variable that restricts a process's GPUs: HIP_VISIBLE_DEVICES under a ROCm build of
    torch, else CUDA_VISIBLE_DEVICES."""
    try:
        import torch

        return HIP_VAR if getattr(torch.version, "hip", None) else CUDA_VAR
    except ImportError:
        return CUDA_VAR


def device_count() -> int:
    """GPUs torch can see here (0 without torch or a GPU build)."""
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def visible_devices(env=None, count: int | None = None, variable: str | None = None) -> list[str]:
    """The host's names of the GPUs this process may use, in ordinal order: the entries of the
    visibility variable where it is set (indices or UUIDs, as the driver takes them), else
    ``0 .. count - 1`` (``count``: :func:`device_count` when not given)."""
    env = os.environ if env is None else env
    variable = variable or visibility_variable()
    listed = env.get(variable)
    if listed is not None:
        return [name.strip() for name in listed.split(",") if name.strip()]
    count = device_count() if count is None else count
    return [str(i) for i in range(count)]


def select(visible: list[str], spec: str | None) -> list[str]:
    """The devices ``spec`` picks (comma-separated ordinals among ``visible``; None: all of them).
    Raises ValueError naming the option and the value for an entry that is not a visible ordinal."""
    if spec is None or spec.strip() in ("", "all"):
        return list(visible)
    picked = []
    for entry in spec.split(","):
        entry = entry.strip()
        if not entry.isdigit() or int(entry) >= len(visible):
            raise ValueError(f"--oracle-devices={spec!r}: {entry!r} is not one of the visible GPUs' ordinals "
                             f"0..{len(visible) - 1} ({', '.join(visible) or 'none visible'})")
        if visible[int(entry)] not in picked:
            picked.append(visible[int(entry)])
    return picked


def workers_for_auto(selected: list[str], per_device: int | None, cpus: int) -> int:
    """``-n auto`` on several GPUs: ``per_device`` workers on each (default the cores shared out
    evenly, at least one per device)."""
    per_device = per_device if per_device is not None else max(1, cpus // max(1, len(selected)))
    return per_device * len(selected)


def assignment(selected: list[str], workers: int) -> list[str]:
    """The device of each worker, round-robin by worker index."""
    return [selected[i % len(selected)] for i in range(workers)] if selected else []


def pinned_specs(specs: list[str], devices: list[str], variable: str) -> list[str]:
    """xdist's worker specs (``--tx``), each started with its device's visibility variable; a
    spec that already sets the variable is left as it is."""
    out = []
    for spec, device in zip(specs, devices):
        if f"env:{variable}=" in spec:
            out.append(spec)
            continue
        out.append(f"{spec}//env:{variable}={device}")
    return out + list(specs[len(devices):])


_described: dict = {}


def describe(kernel_device: str) -> dict | None:
    """The GPU a kernel on ``kernel_device`` ran on in this process ("cuda", "cuda:1"): ``index``
    (its name on the host, as the visibility variable names it: an index or a UUID), ``name``, ``uuid``,
    ``pci_bus_id``, ``capability`` ("9.0"); None for a CPU kernel or where torch sees no GPU."""
    if not kernel_device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    ordinal = torch.device(kernel_device).index
    ordinal = torch.cuda.current_device() if ordinal is None else ordinal
    found = _described.get(ordinal)
    if found is None:
        props = torch.cuda.get_device_properties(ordinal)
        visible = visible_devices(count=torch.cuda.device_count())
        index = visible[ordinal] if ordinal < len(visible) else str(ordinal)
        uuid = getattr(props, "uuid", None)
        bus = getattr(props, "pci_bus_id", None)
        domain = getattr(props, "pci_domain_id", None)
        device = getattr(props, "pci_device_id", None)
        found = _described[ordinal] = {
            "index": str(index), "name": props.name, "uuid": str(uuid) if uuid is not None else None,
            "pci_bus_id": (f"{domain:04x}:{bus:02x}:{device:02x}" if None not in (bus, domain, device) else None),
            "capability": f"{props.major}.{props.minor}"}
    return dict(found)


def kind(device: dict | None) -> tuple | None:
    """What makes two GPUs the same target: (name, capability); None for no GPU."""
    return None if not device else (device["name"], device["capability"])


def label(device: dict) -> str:
    """``cuda:1 (NVIDIA H200, GPU-1234abcd)``: a device as the notes name it."""
    ident = device.get("uuid") or device.get("pci_bus_id")
    return f"cuda:{device['index']} ({device['name']}" + (f", {ident[:12]}" if ident else "") + ")"


# --- the pytest side (called by oracle.pytest_plugin) -------------------------------------------


def add_options(group) -> None:
    group.addoption("--oracle-devices", default=None, metavar="LIST",
                    help="GPUs the xdist workers are pinned to, round-robin: comma-separated ordinals among "
                         "the visible devices (default: every visible GPU, when there are several)")
    group.addoption("--oracle-workers-per-device", default=None, type=_positive_int, metavar="N",
                    help="with -n auto on several GPUs: N workers per device (default: the cores shared out)")


def _positive_int(value: str) -> int:
    import argparse

    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number >= 1")
    return number


def _selected(config) -> list[str]:
    import pytest

    try:
        return select(visible_devices(), config.getoption("oracle_devices"))
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def auto_workers(config) -> int | None:
    """``-n auto`` on several selected GPUs (or with ``--oracle-workers-per-device``): the workers
    to start; None leaves xdist's own count."""
    selected = _selected(config)
    per_device = config.getoption("oracle_workers_per_device")
    if len(selected) < 2 and not (per_device and selected):
        return None
    return workers_for_auto(selected, per_device, os.cpu_count() or 1)


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def share_cores(workerinput: dict, environ=None) -> int | None:
    """In an xdist worker (``workerinput``: xdist's, with ``workercount``): set torch's CPU
    threads to this worker's share of the cores, and return it; None where ``OMP_NUM_THREADS``
    is set (the user's choice stands)."""
    if "OMP_NUM_THREADS" in (os.environ if environ is None else environ):
        return None
    threads = max(1, cores() // max(1, int(workerinput.get("workercount", 1))))
    import torch

    torch.set_num_threads(threads)
    return threads


def configure(config) -> None:
    """In the controlling process: pin xdist's workers to the selected GPUs (several visible, or
    ``--oracle-devices`` given). Without xdist, ``--oracle-devices`` may name one device, which
    this process then uses (set before CUDA starts)."""
    import pytest

    if hasattr(config, "workerinput"):
        share_cores(config.workerinput)
        return
    spec = config.getoption("oracle_devices")
    selected = _selected(config)
    specs = list(config.getoption("tx", None) or [])
    if not specs:
        if spec is None:
            return
        if len(selected) != 1:
            raise pytest.UsageError(f"--oracle-devices={spec!r} names {len(selected)} devices; without xdist "
                                    "workers (-n) a run uses one")
        import torch

        if torch.cuda.is_initialized():
            raise pytest.UsageError(f"--oracle-devices={spec!r}: CUDA is already initialized in this process")
        os.environ[visibility_variable()] = selected[0]
        return
    if spec is None and len(selected) < 2:
        return
    config.option.tx = pinned_specs(specs, assignment(selected, len(specs)), visibility_variable())
