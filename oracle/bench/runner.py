"""``run``: every op, variant and N timed for every selected kernel next to its torch baseline, the
caches checked against the baseline's, the copy ceilings measured before and after."""

from __future__ import annotations

import datetime
import os
import platform
import statistics
import sys
from dataclasses import asdict, dataclass, field
from types import SimpleNamespace

import torch

from ..reference.fp8 import FORMATS as FP8_FORMATS
from .goals import FRESH
from .output import format_table, groups
from .timers import (COPY_BYTES, SAMPLE_SECONDS, Sampler, _sync, cold_sets, copy_bandwidth, make_timer,
                     same_size_copy_timer)
from .references import index_put, load_peers, seed_mla_writer
from .workloads import VARIANTS, Workload, make_workload

MODES = ("eager", "graph")  # how CUDA calls are timed: launched one by one, or replayed from a CUDA graph
L2_STATES = ("cold", "hot")  # inputs rotated past the L2, or the same inputs every call


@dataclass
class Row:
    op: str
    variant: str
    kernel: str
    backend: str
    device: str
    n: int
    us: float  # median microseconds per call
    gbps: float
    x_baseline: float | None
    pct_copy: float | None
    bytes_read: int
    bytes_written: int
    samples: int
    calls_per_sample: int
    min_us: float
    check: str
    timer: str
    samples_us: list = field(default_factory=list)
    dropped: int = 0  # samples dropped as disturbed (--quiet)
    baseline: str = ""  # the kernel "x baseline" and "check" compare with (same device)
    pct_same_copy: float | None = None  # % of a copy_ of the same bytes, timed in the same cell
    mode: str = "eager"  # CUDA: "eager" (launched call by call) or "graph" (replayed); CPU: eager
    l2: str = "hot"  # CUDA: "cold" (inputs rotated past the L2) or "hot"; CPU: hot
    rounds: list = field(default_factory=list)  # the sampling round of each of samples_us (Sampler)


def _baseline(op: str, device: str = "cpu"):
    """The torch baseline kernel of ``op`` on ``device`` ("cpu": ``torch.<op>``, registered here
    if no plug-in did; "cuda": a backend-"torch" kernel on CUDA, or None)."""
    from ..registry import Registry, default_registry

    candidates = [k for k in default_registry.select(backend="torch", op=op)
                  if _device_of(k) == device and k.unavailable() is None]
    candidates.sort(key=lambda k: k.name != f"torch.{op}")
    if candidates or device != "cpu":
        return candidates[0] if candidates else None
    from ..kernels import torch_native

    registry = Registry()
    registry.load_plugin("oracle.kernels.torch_native:register", torch_native.register)
    return registry.kernels[f"torch.{op}"]


def select_kernels(op: str, backend: str | None) -> tuple[list, list[str]]:
    """(kernels to time: the baselines first, the CPU one then the CUDA one if any CUDA kernel is
    timed; notes on the kernels left out)."""
    from ..registry import default_registry

    registry = default_registry.discover()
    chosen, notes = [], []
    for kernel in registry.select(backend=backend, op=op):
        if kernel.contract.backend == "torch":
            continue  # the baselines are added below
        if _device_of(kernel) == "cuda" and not torch.cuda.is_available():
            notes.append(f"{kernel.name}: skipped (device {kernel.contract.device}, CUDA not available)")
            continue
        reason = kernel.unavailable()
        if reason:
            notes.append(f"{kernel.name}: unavailable: {reason.splitlines()[0][:200]}")
            continue
        chosen.append(kernel)
    baselines = [_baseline(op, "cpu")]
    if any(_device_of(k) == "cuda" for k in chosen):
        cuda_baseline = _baseline(op, "cuda")
        if cuda_baseline is not None:
            baselines.append(cuda_baseline)
        else:
            notes.append("no torch baseline on CUDA: CUDA kernels are compared with the CPU baseline")
    return baselines + chosen, notes


def _baseline_index(kernels: list) -> list[int]:
    """For each kernel, the index of the baseline it is compared with: the torch baseline on its
    own device, else the CPU one (index 0)."""
    first = {}
    for i, kernel in enumerate(kernels):
        if kernel.contract.backend == "torch":
            first.setdefault(_device_of(kernel), i)
    return [first.get(_device_of(k), 0) for k in kernels]


def _fresh_copy(args: tuple, caches: tuple) -> tuple:
    return tuple(a.clone() if i in caches else a for i, a in enumerate(args))


def _check(kernel, baseline, workload: Workload) -> str:
    """Compare the kernel's written caches with the baseline's, byte for byte."""
    mine = _fresh_copy(workload.args, workload.caches)
    ref = _fresh_copy(workload.args, workload.caches)
    try:
        kernel.fn(*mine)
        baseline.fn(*ref)
        _sync(kernel.contract.device)
    except Exception as exc:
        return f"ERROR {type(exc).__name__}"
    differ = 0
    for i in workload.caches:
        a = mine[i].contiguous().view(torch.uint8).cpu()
        b = ref[i].contiguous().view(torch.uint8).cpu()
        differ += int((a != b).sum())
    return "ok" if differ == 0 else f"DIFF {differ} B"


def prepared(kernel, args: tuple, rotation: tuple) -> tuple:
    """(function, args, rotation) as ``kernel`` is timed: for a kernel whose function has
    ``prepare`` (a ``<name>.checked_index`` writer: oracle.kernels.checked_index.CheckedIndexWriter),
    each input set prepared once, outside the timed calls, as a step checks its index once for all
    its layers, and the writer it wraps called on them, as each layer calls it."""
    prepare = getattr(kernel.fn, "prepare", None)
    if prepare is None:
        return kernel.fn, args, rotation
    return kernel.fn.fn, prepare(args), tuple(prepare(r) for r in rotation)


def _device_of(kernel) -> str:
    return "cuda" if kernel.contract.device.startswith("cuda") else "cpu"


def _reference(name: str, backend: str, fn) -> SimpleNamespace:
    """A reference writer (index_put_, the seed's writer, a peer) shaped like a registered CUDA
    kernel, so it is timed and checked like one."""
    return SimpleNamespace(name=name, fn=fn, unavailable=lambda: None,
                           contract=SimpleNamespace(backend=backend, device="cuda", fp8_formats=("e4m3fn", "e5m2")))


def references(op: str, peers: list) -> list:
    """The CUDA references of ``op``: index_put_, the seed's MLA writer, the peers' writers."""
    out = []
    fn = index_put(op)
    if fn is not None:
        out.append(_reference("ref:index_put_", "reference", fn))
    if op == "set_mla_kv_buffer":
        try:
            out.append(_reference("ref:seed 1-D Triton BLOCK=128", "reference", seed_mla_writer()))
        except ImportError:
            pass
    out += [_reference(f"peer:{name}", "peer", fn) for name, peer_op, fn in peers if peer_op == op]
    return out


def fresh_index_rows(kernels: list) -> list:
    """For each CUDA writer that reuses its index's check while the index is unchanged
    (oracle.kernels.check_reuse: the bench's input sets keep their index tensors, as the layers of
    a step do), the same writer timed with reuse off: the check on every call, as a writer given
    a new index tensor each time pays it. Timed eagerly only (a graph leaves the check out)."""
    from ..kernels import check_reuse

    def fresh(fn):
        def call(*args):
            check_reuse.ENABLED = False
            try:
                fn(*args)
            finally:
                check_reuse.ENABLED = True
        return call

    return [SimpleNamespace(name=k.name + FRESH, fn=fresh(k.fn), unavailable=k.unavailable, contract=k.contract)
            for k in kernels if _device_of(k) == "cuda" and getattr(k.fn, "reuses_checks", False)
            and check_reuse.ENABLED]


def run(ops: list[str], sizes: list[int], repeats: int, backend: str | None, variants: dict | None = None,
        quiet: bool = False, log=print, modes: tuple = MODES, l2_states: tuple = ("cold",),
        peer_files: tuple = ()) -> dict:
    """Time every op (its variants: ``variants[op]`` or all) at every size; the JSON-able result.
    CUDA kernels are timed in every mode of ``modes`` (eager, graph) and L2 state of ``l2_states``
    (cold, hot), beside the references (:func:`references`: index_put_, the seed's MLA writer, the
    writers of ``peer_files``); CPU kernels once, eagerly.

    Within one (op, variant, N) cell the kernels' samples are interleaved (baseline, kernel 1,
    kernel 2, baseline, ...), so load from other processes hits them alike; ``quiet`` drops the
    samples other processes disturbed (see Sampler). The copy bandwidth is measured before and
    after everything; the reference is the higher of the two medians (the conservative choice for
    "% of copy")."""
    peers = [p for path in peer_files for p in load_peers(path)]  # a bad file fails before any timing
    load_before = _loadavg()
    sampler = Sampler(repeats, quiet=quiet)
    sample_seconds = 10 * SAMPLE_SECONDS if quiet else SAMPLE_SECONDS  # long enough for tick accounting
    first_copy = {"cpu": copy_bandwidth("cpu", sampler=Sampler(10, quiet=quiet))}
    log(f"copy bandwidth (cpu): {first_copy['cpu']['gbps']:.1f} GB/s (torch copy_ of {COPY_BYTES >> 20} MiB, "
        f"bytes read + written)")
    cells = []  # (op, variant, n, mode, l2, [(kernel, workload, samples, ...)], same-size copy, clean)
    notes: dict[str, list[str]] = {}
    for op in ops:
        kernels, left_out = select_kernels(op, backend)
        if torch.cuda.is_available() and any(_device_of(k) == "cuda" for k in kernels):
            kernels = kernels + fresh_index_rows(kernels) + references(op, peers)
        notes[op] = left_out
        for line in left_out:
            log(f"note: {line}")
        if any(_device_of(k) == "cuda" for k in kernels) and "cuda" not in first_copy:
            first_copy["cuda"] = copy_bandwidth("cuda", nbytes=1 << 30)
            log(f"copy bandwidth (cuda): {first_copy['cuda']['gbps']:.1f} GB/s")
        for variant in (variants or {}).get(op, VARIANTS[op]):
            declared = [k for k in kernels if variant not in FP8_FORMATS or variant in k.contract.fp8_formats
                        or k.contract.backend == "torch"]
            for k in kernels:
                if k not in declared:
                    notes[op].append(f"{k.name}: [{variant}] skipped (its contract declares no {variant})")
                    log(f"note: {notes[op][-1]}")
            for n in sizes:
                all_here = declared
                workloads_all = [make_workload(op, variant, n, device=_device_of(k)) for k in all_here]
                base_all = _baseline_index(all_here)
                checks_all = {k.name: "baseline" if base_all[i] == i else _check(k, all_here[base_all[i]], w)
                              for i, (k, w) in enumerate(zip(all_here, workloads_all))}
                cuda_first = next((w for k, w in zip(all_here, workloads_all) if _device_of(k) == "cuda"), None)
                rotation = cold_sets(op, variant, n, cuda_first) if cuda_first is not None else ()
                for mode, l2, devices in _passes(all_here, modes, l2_states):
                    picked = [i for i, k in enumerate(all_here) if _device_of(k) in devices
                              and not (mode == "graph" and k.name.endswith(FRESH))]
                    kernels_here = [all_here[i] for i in picked]
                    workloads = [workloads_all[i] for i in picked]
                    timers = []
                    for k, w in zip(kernels_here, workloads):
                        fn, args, sets = prepared(k, w.args, rotation if l2 == "cold" else ())
                        timers.append(make_timer(fn, args, _device_of(k), sample_seconds, sets,
                                                 graph=mode == "graph"))
                    timers += [same_size_copy_timer(workloads[0].bytes, d, sample_seconds, cold=l2 == "cold",
                                                    graph=mode == "graph") for d in devices]
                    samples, dropped, clean, rounds = sampler.collect(timers)
                    same_copy = {d: statistics.median(s) for d, s in zip(devices, samples[len(kernels_here):])}
                    base = _baseline_index(kernels_here)
                    cells.append((op, variant, n, mode, l2, list(zip(
                        kernels_here, workloads, samples, rounds, dropped, [t.calls for t in timers],
                        [t.name for t in timers], [checks_all[k.name] for k in kernels_here],
                        [kernels_here[b].name for b in base], [statistics.median(samples[b]) for b in base])),
                        same_copy, clean))
                if sys.stderr.isatty():
                    print(f"  timed {op} [{variant}] N={n}      ", end="\r", file=sys.stderr, flush=True)
    copies = {}
    for device, first in first_copy.items():
        again = copy_bandwidth(device, nbytes=first["bytes"], sampler=Sampler(10, quiet=quiet))
        best = max((first, again), key=lambda c: c["gbps"])
        copies[device] = dict(best, runs_gbps=[first["gbps"], again["gbps"]])
    rows: list[Row] = []
    for op, variant, n, mode, l2, entries, same_copy, clean in cells:
        for kernel, workload, samples, rounds, dropped, calls, timer, check, base_name, base_seconds in entries:
            base_us = base_seconds * 1e6
            median = statistics.median(samples)
            gbps = workload.bytes / median / 1e9
            copy = copies[_device_of(kernel)]
            rows.append(Row(op, variant, kernel.name, kernel.contract.backend, kernel.contract.device, n,
                            median * 1e6, gbps, base_us / (median * 1e6), 100 * gbps / copy["gbps"],
                            workload.bytes_read, workload.bytes_written, len(samples), calls,
                            min(samples) * 1e6, check if clean or not quiet else check + " (noisy)", timer,
                            [x * 1e6 for x in samples], dropped, base_name,
                            100 * same_copy[_device_of(kernel)] / median,
                            *((mode, l2) if _device_of(kernel) == "cuda" else ("eager", "hot")), rounds))
    for device, copy in copies.items():
        log(f"copy bandwidth ({device}), the reference for % of copy: {copy['gbps']:.1f} GB/s "
            f"(runs: {', '.join(f'{g:.1f}' for g in copy['runs_gbps'])})")
    for op, variant, how, group in groups(rows):
        log("")
        log(format_table(group, op, variant, how))
    machine = machine_info()
    machine["loadavg_before"], machine["loadavg_after"] = load_before, _loadavg()
    return {"machine": machine, "copy": copies, "rows": [asdict(r) for r in rows], "notes": notes,
            "sizes": sizes, "repeats": repeats, "quiet": quiet, "modes": list(modes), "l2": list(l2_states),
            "peer_files": [os.path.basename(p) for p in peer_files]}


def _passes(kernels: list, modes: tuple, l2_states: tuple):
    """(mode, l2, devices) for each timing pass of one cell: the CPU kernels once (eager, hot), in
    a pass of their own; the CUDA kernels in every mode and L2 state asked for. A CPU kernel keeps
    every core busy (its thread pool spins on after each call), so sampled in turn with eager CUDA
    calls it would slow the host side of their launches (on an H100 host, a validating block-scaled
    write at N = 16384 timed 0.5-1 us slower in that company)."""
    if any(_device_of(k) == "cpu" for k in kernels):
        yield "eager", "hot", ["cpu"]
    if any(_device_of(k) == "cuda" for k in kernels):
        for mode in modes:
            for l2 in l2_states:
                yield mode, l2, ["cuda"]


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def machine_info() -> dict:
    model = platform.processor()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "host": platform.node(), "platform": platform.platform(), "cpu": model,
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(), "python": sys.version.split()[0],
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        from ..kernels import cpu as cpu_kernels

        info["kv_oracle_cpu_isa"] = cpu_kernels.isa() if cpu_kernels.available() is None else None
    except Exception:  # the CPU kernels are optional here
        info["kv_oracle_cpu_isa"] = None
    return info
