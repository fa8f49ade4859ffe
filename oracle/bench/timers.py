"""Timers: CPU (perf_counter around back-to-back calls) and CUDA (events around a captured graph,
inputs rotated past the L2), the sampler that interleaves them, and the copy references."""

from __future__ import annotations

import json
import os
import statistics
import time

import torch

from .workloads import Workload, make_workload

COPY_BYTES = 256 << 20  # the copy_ reference: 256 MiB read, 256 MiB written
SAMPLE_SECONDS = 2e-3  # each sample runs enough calls to last about this long
MAX_CALLS = 2000  # calls per sample at most (a CUDA graph of them)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class Disturbance:
    """Tells whether a sample was disturbed by other processes (Linux; elsewhere never): CPU time
    the rest of the machine used meanwhile (/proc/stat minus this process, in clock ticks), and
    time this process's threads spent waiting for a CPU (schedstat run delay, in ns). On a shared
    machine a parallel kernel whose second thread waits for a CPU takes milliseconds instead of
    microseconds, so ``--quiet`` keeps only undisturbed samples."""

    RUN_DELAY_NS = 100_000  # plus 2% of the sample: waking a sleeping worker thread costs a little

    def __init__(self):
        self.works = os.path.exists("/proc/self/schedstat") and os.path.exists("/proc/stat")

    @staticmethod
    def _busy() -> int:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v) - v[3] - v[4]  # all but idle and iowait

    @staticmethod
    def _own() -> tuple[int, int]:
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        delay = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/schedstat") as f:
                    delay += int(f.read().split()[1])
            except OSError:  # a thread that just ended
                pass
        return int(fields[11]) + int(fields[12]), delay

    def snapshot(self):
        if not self.works:
            return None
        own, delay = self._own()
        return self._busy(), own, delay

    def disturbed(self, before, after, seconds: float) -> bool:
        if before is None or after is None:
            return False
        foreign = (after[0] - before[0]) - (after[1] - before[1])
        return foreign > 0 or after[2] - before[2] > self.RUN_DELAY_NS + 0.02 * seconds * 1e9


class CpuTimer:
    """Samples of ``calls`` back-to-back calls timed with time.perf_counter (per-call seconds)."""

    name = "perf_counter"

    def __init__(self, fn, args, sample_seconds: float = SAMPLE_SECONDS):
        self.fn, self.args = fn, args
        for _ in range(3):  # warm-up: page faults, lazy initialisation, caches
            fn(*args)
        start = time.perf_counter()
        fn(*args)
        once = time.perf_counter() - start
        self.calls = max(1, min(10000, int(sample_seconds / max(once, 1e-7))))

    def sample(self) -> float:
        fn, args = self.fn, self.args
        start = time.perf_counter()
        for _ in range(self.calls):
            fn(*args)
        return (time.perf_counter() - start) / self.calls


class CudaTimer:
    """Samples timed with CUDA events, replaying a CUDA graph of ``calls`` launches when the calls
    can be captured (kernels that check on the host or synchronize cannot), else launching them.
    Call ``i`` uses input set ``i % len(sets)`` of ``args`` followed by ``rotation`` (see
    :func:`cold_sets`).

    Each sample is taken in steady state: the same ``calls`` are first issued untimed (not waited
    for), so the timed calls queue behind them and the GPU never idles while the host issues the
    sample's first call. Sampled from an idle GPU instead, a sample of a few dozen calls would also
    time the host's issue of the first one and the PDL pipeline filling up: at N = 16384 on an
    H100, 0.5-1.5 us more per call for the validating writers (two launches a call), 0.2-0.8 us
    for their unchecked twins (docs/benchmarks.md). Serving engines call a writer while the GPU is
    busy with the layer before it, which is what the steady state times."""

    def __init__(self, fn, args, use_graph: bool = True, rotation: tuple = ()):
        sets = (args,) + tuple(rotation)
        self.sets = len(sets)
        for _ in range(3):
            fn(*args)
        torch.cuda.synchronize()
        self.start, self.end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        self.start.record()
        fn(*args)
        self.end.record()
        self.end.synchronize()
        once = self.start.elapsed_time(self.end) / 1e3
        self.calls = max(1, min(MAX_CALLS, int(SAMPLE_SECONDS / max(once, 1e-7))))
        self.name, self.replay = "cuda events", None
        if use_graph:
            try:
                self._capture(fn, args, sets, self.calls)
                # The eager call above includes host work that a replay does not (validation, the
                # launcher), so a replay of `calls` can be far shorter than a sample should be,
                # and the replay's own launch (microseconds) would weigh on every call: size the
                # graph again from the replay's time.
                per_call = self._replay_seconds() / self.calls
                wanted = max(1, min(MAX_CALLS, int(SAMPLE_SECONDS / max(per_call, 1e-8))))
                if 4 * wanted > 5 * self.calls:  # more than 25% short of a full sample
                    self._capture(fn, args, sets, wanted)
                self.name = "cuda events + graph"
            except Exception:
                torch.cuda.synchronize()
                self.replay = None
        if self.replay is None:
            calls = self.calls

            def launch():
                for i in range(calls):
                    fn(*sets[i % len(sets)])
            self.replay = launch
        if self.sets > 1:
            self.name += f", {self.sets} input sets"
        self.replay()
        torch.cuda.synchronize()

    def _capture(self, fn, args, sets, calls: int) -> None:
        """Replay a CUDA graph of ``calls`` calls from now on."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            fn(*args)  # warm-up on the capture stream
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for i in range(calls):
                fn(*sets[i % len(sets)])
        self.graph, self.replay, self.calls = graph, graph.replay, calls
        self.replay()  # the first replay uploads the graph
        torch.cuda.synchronize()

    def _replay_seconds(self) -> float:
        self.replay()  # untimed: the timed calls queue behind these (see the class docstring)
        self.start.record()
        self.replay()
        self.end.record()
        self.end.synchronize()
        return self.start.elapsed_time(self.end) / 1e3

    def sample(self) -> float:
        return self._replay_seconds() / self.calls


COLD_FACTOR = 4  # rotate among input sets until they span this many times the GPU's L2 cache
MAX_SETS = 8


def _footprint(args: tuple) -> int:
    return sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))


def cold_sets(op: str, variant: str, n: int, first: Workload) -> tuple:
    """Extra input sets (other seeds: other slots, other data) for a CUDA timer to rotate among,
    so that together with ``first`` they span at least COLD_FACTOR x the L2 cache (at most
    MAX_SETS sets). Replaying one set measures the cache, not memory: a 16384-row MLA write fits
    in an H100's 50 MB L2 and would time at 110-140% of the copy ceiling."""
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    footprint = max(1, _footprint(first.args))
    sets = min(MAX_SETS, -(-COLD_FACTOR * l2 // footprint))
    return tuple(make_workload(op, variant, n, "cuda", seed=seed).args for seed in range(1, sets))


def _copy_into(dst: torch.Tensor, src: torch.Tensor) -> None:
    dst.copy_(src)


def same_size_copy_timer(nbytes: int, device: str, sample_seconds: float = SAMPLE_SECONDS, cold: bool = True,
                         graph: bool = True):
    """A timer of ``copy_`` moving ``nbytes`` (read + written, so ``nbytes // 2`` copied), timed
    like the kernels on ``device``: on CUDA replayed from a graph or launched eagerly (``graph``),
    rotating among buffers that span COLD_FACTOR x the L2 where ``cold``."""
    half = max(1, nbytes // 2)

    def pair():
        return (torch.empty(half, dtype=torch.uint8, device=device),
                torch.randint(0, 255, (half,), dtype=torch.uint8, device=device))
    if not device.startswith("cuda"):
        return CpuTimer(_copy_into, pair(), sample_seconds)
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    sets = min(MAX_SETS, -(-COLD_FACTOR * l2 // (2 * half))) if cold else 1
    return CudaTimer(_copy_into, pair(), use_graph=graph, rotation=tuple(pair() for _ in range(1, sets)))


def make_timer(fn, args, device: str, sample_seconds: float = SAMPLE_SECONDS, rotation: tuple = (),
               graph: bool = True):
    """A CudaTimer (``graph``: replayed from a CUDA graph, else launched call by call, as a user
    calls the kernel eagerly) on CUDA, else a CpuTimer."""
    if device.startswith("cuda"):
        return CudaTimer(fn, args, use_graph=graph, rotation=rotation)
    return CpuTimer(fn, args, sample_seconds)


def alternated(variants: dict, args: tuple, device: str, rotation: tuple = (), rounds: int = 7,
               samples: int = 3, graph: bool = False) -> dict:
    """A/B timing in one process: ``variants`` maps a label to ``(setup, fn)`` or ``(setup, fn,
    its_args, its_rotation)``; each round runs every variant in turn, calling its ``setup()`` (a knob
    to set) and timing ``fn(*args)`` eagerly (``make_timer(..., graph=False)``) or replayed from a
    CUDA graph captured after ``setup()`` (``graph``), inputs rotated through ``rotation`` (a
    variant's own, where it has them), so a host's drift hits them alike. Returns each label's
    per-round medians of ``samples`` samples, in microseconds."""
    times = {label: [] for label in variants}
    for _ in range(rounds):
        for label, (setup, fn, *own) in variants.items():
            setup()
            first, sets = own if own else (args, rotation)
            timer = make_timer(fn, first, device, rotation=sets, graph=graph)
            times[label].append(statistics.median(timer.sample() for _ in range(samples)) * 1e6)
    return times


def medians(times: dict) -> dict:
    """Each label's median over the rounds of :func:`alternated`."""
    return {label: statistics.median(v) for label, v in times.items()}


def save_alternated(path: str, rounds: int, rows: list, **extra) -> None:
    """Write an A/B script's rows (each with its :func:`alternated` samples) as JSON, with the
    device, torch version and rounds, and any ``extra`` fields (nothing where ``path`` is empty)."""
    if not path:
        return
    with open(path, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rounds": rounds, **extra,
                   "rows": rows}, f, indent=1)


class Sampler:
    """Collects the samples of several timers round-robin (so that load from other processes hits
    them alike) until each has ``repeats``. With ``quiet``, samples disturbed by other processes
    (see Disturbance) are dropped and retaken, for at most ``patience`` seconds per cell; then the
    cell keeps what it has (all samples if none was clean) and says so.

    Each kept sample also keeps the number of its round: the timers' samples of one round were
    taken back to back, so a difference between two kernels can be taken round by round
    (:func:`oracle.bench.goals.gap`), which the host's slow and fast spells hit alike."""

    def __init__(self, repeats: int, quiet: bool = False, patience: float = 120.0):
        self.repeats, self.quiet, self.patience = repeats, quiet, patience
        self.disturbance = Disturbance() if quiet else None

    def collect(self, timers: list) -> tuple[list[list[float]], list[int], bool, list[list[int]]]:
        """(samples per timer, samples dropped per timer, whether every timer got clean ones, the
        round of each sample kept, per timer)."""
        clean, clean_rounds = [[] for _ in timers], [[] for _ in timers]
        every, every_rounds = [[] for _ in timers], [[] for _ in timers]
        dropped = [0 for _ in timers]
        deadline = time.monotonic() + self.patience
        round_number = 0
        while any(len(c) < self.repeats for c in clean):
            for i, timer in enumerate(timers):
                if len(clean[i]) >= self.repeats:
                    continue
                before = self.disturbance.snapshot() if self.quiet else None
                value = timer.sample()
                every[i].append(value)
                every_rounds[i].append(round_number)
                if self.quiet and self.disturbance.disturbed(before, self.disturbance.snapshot(),
                                                             value * timer.calls):
                    dropped[i] += 1
                else:
                    clean[i].append(value)
                    clean_rounds[i].append(round_number)
            round_number += 1
            if self.quiet and time.monotonic() > deadline:
                break
        complete = all(len(c) >= self.repeats for c in clean)
        enough = [len(c) >= max(1, self.repeats // 3) for c in clean]
        samples = [c if ok else e for c, e, ok in zip(clean, every, enough)]
        rounds = [c if ok else e for c, e, ok in zip(clean_rounds, every_rounds, enough)]
        return samples, dropped, complete, rounds


def copy_bandwidth(device: str = "cpu", nbytes: int = COPY_BYTES, repeats: int = 10,
                   sampler: Sampler | None = None) -> dict:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` (bytes read + written, i.e. 2 * nbytes per copy)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = CudaTimer(dst.copy_, (src,), use_graph=False) if device.startswith("cuda") else CpuTimer(dst.copy_, (src,))
    sampler = sampler or Sampler(repeats)
    (samples,), (dropped,), complete, _ = sampler.collect([timer])
    median = statistics.median(samples)
    return {"device": device, "bytes": nbytes, "seconds": median, "gbps": 2 * nbytes / median / 1e9,
            "best_gbps": 2 * nbytes / min(samples) / 1e9, "samples": len(samples), "dropped": dropped,
            "clean": complete, "timer": timer.name}
