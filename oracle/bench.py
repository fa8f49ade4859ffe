"""``oracle bench``: time every available registered kernel of an op against the torch baseline
and against the machine's copy bandwidth.

For each op (and fp8 variant) and each N (rows; default 1, 16, 256, 4096, 16384) every kernel is
timed on the same inputs: a few warm-up calls, then ``--repeats`` samples of enough back-to-back
calls to last a few milliseconds each; the figure is the median per call. CPU kernels are timed with
``time.perf_counter``, CUDA kernels (only when CUDA is available) with CUDA events, replaying a
CUDA graph of the calls where one can be captured (small N is dominated by launch overhead
otherwise; the graph holds enough calls, sized from its own replay time, for a sample to last
about 2 ms, so the replay's launch does not weigh on each call), rotating among several input sets (other slots, other data) that together span four
times the GPU's L2 cache, so that a batch which fits in L2 is timed against memory, not the cache.

Bytes are counted honestly, per call: every source element read, the index tensor read, every cache
byte written (the caches are never read; the scales, a few bytes, count as read). GB/s is that over
the median time. "x baseline" is the torch baseline's time (on the kernel's device) over the
kernel's; "% of copy" compares with a large ``copy_`` on the same device (its bytes read plus
written, the same accounting), the bandwidth ceiling; "% of same-size copy" with a ``copy_`` that
moves the call's own bytes, timed the same way in the same cell (on CUDA rotated past the L2 too):
the ceiling at this N, which pays the launch, the first memory round trip and the drain that a
large copy amortizes.

Workloads (8 heads x 128 = 2 KiB bf16 rows for MHA, 512 + 64 bf16 for MLA, slots a random
permutation of a cache twice the batch):

- ``store_cache``: K and V rows into [S, 8, 128] bf16 caches.
- ``set_mla_kv_buffer``: nope 512 + rope 64 into a [S, 576] bf16 buffer.
- ``concat_and_cache_mla``: ``auto`` (bf16 copy) and ``e4m3fn`` (bf16 -> fp8) into
  [blocks, 16, 576] pages.
- ``reshape_and_cache_flash``: ``auto`` and ``e4m3fn`` into NHD [blocks, 16, 8, 128] caches.
- ``quantize_fp8``: [N, 8, 128] bf16 -> e4m3fn.

Sources are normal with sigma 2; fp8 scales are per tensor and calibrated, amax / 448 of the
source (float32, not a power of two: the kernels really divide), so no quotient overflows.

After timing, each kernel's caches are compared byte for byte with the baseline's on the same
inputs ("check" column: ``ok``, or ``DIFF`` with the count of differing bytes). The baseline is the
torch baseline on the kernel's own device (``torch-cuda.*`` for CUDA kernels where registered,
else the CPU one).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from .reference.fp8 import FORMATS as FP8_FORMATS

DEFAULT_SIZES = (1, 16, 256, 4096, 16384)
HEADS, HEAD_DIM = 8, 128
MLA_NOPE, MLA_ROPE = 512, 64
BLOCK_SIZE = 16
COPY_BYTES = 256 << 20  # the copy_ reference: 256 MiB read, 256 MiB written
SAMPLE_SECONDS = 2e-3  # each sample runs enough calls to last about this long
MAX_CALLS = 2000  # calls per sample at most (a CUDA graph of them)


@dataclass
class Workload:
    op: str
    variant: str  # "bf16", "auto", "e4m3fn"
    args: tuple
    caches: tuple  # indices into args of the written tensors
    bytes_read: int
    bytes_written: int

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written


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


VARIANTS = {
    "store_cache": ("bf16",),
    "set_mla_kv_buffer": ("bf16",),
    "concat_and_cache_mla": ("auto", "e4m3fn"),
    "reshape_and_cache_flash": ("auto", "e4m3fn"),
    "quantize_fp8": ("e4m3fn",),
}


def _slots(n: int, num_slots: int, gen: torch.Generator, device) -> torch.Tensor:
    """n distinct random slots in [1, num_slots): slot 0 stays free, as sglang keeps it for padding,
    so kernels that skip it (reserved:0) write exactly what the others write."""
    return (torch.randperm(num_slots - 1, generator=gen)[:n] + 1).to(torch.int64).to(device)


def _randn(shape, gen, device, dtype=torch.bfloat16) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * 2).to(dtype).to(device)


def _calibrated_scale(*sources: torch.Tensor) -> torch.Tensor:
    """The per-tensor scale a dynamic calibration picks (vLLM's calculate_kv_scales): amax / 448
    (e4m3fn's max), the amax taken on the bf16 source, the division in float32."""
    if not all(s.numel() for s in sources):
        return torch.ones(1, dtype=torch.float32, device=sources[0].device)
    amax = torch.stack([s.abs().max().float() for s in sources]).max().reshape(1)
    return (amax / 448.0).to(torch.float32)


def make_workload(op: str, variant: str, n: int, device: str = "cpu", seed: int = 0) -> Workload:
    """Inputs for one timing cell; ``args`` are in the op's calling convention."""
    gen = torch.Generator().manual_seed(seed * 1000003 + n)
    bf16 = torch.bfloat16
    num_slots = max(2 * n, 64) + 1
    index_bytes = n * 8
    if op == "store_cache":
        k, v = (_randn((n, HEADS, HEAD_DIM), gen, device) for _ in range(2))
        caches = tuple(torch.zeros((num_slots, HEADS, HEAD_DIM), dtype=bf16, device=device) for _ in range(2))
        loc = _slots(n, num_slots, gen, device)
        row = HEADS * HEAD_DIM * 2
        return Workload(op, variant, (k, v, *caches, loc), (2, 3), 2 * n * row + index_bytes, 2 * n * row)
    if op == "set_mla_kv_buffer":
        nope, rope = _randn((n, MLA_NOPE), gen, device), _randn((n, MLA_ROPE), gen, device)
        buffer = torch.zeros((num_slots, MLA_NOPE + MLA_ROPE), dtype=bf16, device=device)
        loc = _slots(n, num_slots, gen, device)
        row = (MLA_NOPE + MLA_ROPE) * 2
        return Workload(op, variant, (buffer, loc, nope, rope), (0,), n * row + index_bytes, n * row)
    num_blocks = -(-num_slots // BLOCK_SIZE)
    fp8 = variant != "auto"
    cache_dtype, cache_size = (torch.uint8, 1) if fp8 else (bf16, 2)
    if op == "concat_and_cache_mla":
        kv_c, k_pe = _randn((n, MLA_NOPE), gen, device), _randn((n, MLA_ROPE), gen, device)
        cache = torch.zeros((num_blocks, BLOCK_SIZE, MLA_NOPE + MLA_ROPE), dtype=cache_dtype, device=device)
        slots = _slots(n, num_blocks * BLOCK_SIZE, gen, device)
        scale = _calibrated_scale(kv_c, k_pe)
        width = MLA_NOPE + MLA_ROPE
        return Workload(op, variant, (kv_c, k_pe, cache, slots, variant, scale), (2,),
                        n * width * 2 + index_bytes + (4 if fp8 else 0), n * width * cache_size)
    if op == "reshape_and_cache_flash":
        key, value = (_randn((n, HEADS, HEAD_DIM), gen, device) for _ in range(2))
        caches = tuple(torch.zeros((num_blocks, BLOCK_SIZE, HEADS, HEAD_DIM), dtype=cache_dtype, device=device)
                       for _ in range(2))
        slots = _slots(n, num_blocks * BLOCK_SIZE, gen, device)
        k_scale, v_scale = _calibrated_scale(key), _calibrated_scale(value)
        row = HEADS * HEAD_DIM
        return Workload(op, variant, (key, value, *caches, slots, variant, k_scale, v_scale), (2, 3),
                        2 * n * row * 2 + index_bytes + (8 if fp8 else 0), 2 * n * row * cache_size)
    if op == "quantize_fp8":
        x = _randn((n, HEADS, HEAD_DIM), gen, device)
        out = torch.zeros((n, HEADS, HEAD_DIM), dtype=torch.uint8, device=device)
        scale = _calibrated_scale(x)
        return Workload(op, variant, (out, x, scale, variant), (0,), n * HEADS * HEAD_DIM * 2 + 4,
                        n * HEADS * HEAD_DIM)
    raise ValueError(f"op={op!r} has no bench workload; ops: {', '.join(VARIANTS)}")


# ---- timing ------------------------------------------------------------------------------------

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
    :func:`cold_sets`)."""

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


def same_size_copy_timer(nbytes: int, device: str, sample_seconds: float = SAMPLE_SECONDS):
    """A timer of ``copy_`` moving ``nbytes`` (read + written, so ``nbytes // 2`` copied), timed
    like the kernels on ``device``: on CUDA rotating among buffers that span COLD_FACTOR x the L2."""
    half = max(1, nbytes // 2)

    def pair():
        return (torch.empty(half, dtype=torch.uint8, device=device),
                torch.randint(0, 255, (half,), dtype=torch.uint8, device=device))
    if not device.startswith("cuda"):
        return CpuTimer(_copy_into, pair(), sample_seconds)
    l2 = getattr(torch.cuda.get_device_properties(torch.cuda.current_device()), "L2_cache_size", 50 << 20)
    sets = min(MAX_SETS, -(-COLD_FACTOR * l2 // (2 * half)))
    return CudaTimer(_copy_into, pair(), rotation=tuple(pair() for _ in range(1, sets)))


def make_timer(fn, args, device: str, sample_seconds: float = SAMPLE_SECONDS, rotation: tuple = ()):
    if device.startswith("cuda"):
        return CudaTimer(fn, args, rotation=rotation)
    return CpuTimer(fn, args, sample_seconds)


class Sampler:
    """Collects the samples of several timers round-robin (so that load from other processes hits
    them alike) until each has ``repeats``. With ``quiet``, samples disturbed by other processes
    (see Disturbance) are dropped and retaken, for at most ``patience`` seconds per cell; then the
    cell keeps what it has (all samples if none was clean) and says so."""

    def __init__(self, repeats: int, quiet: bool = False, patience: float = 120.0):
        self.repeats, self.quiet, self.patience = repeats, quiet, patience
        self.disturbance = Disturbance() if quiet else None

    def collect(self, timers: list) -> tuple[list[list[float]], list[int], bool]:
        """(samples per timer, samples dropped per timer, whether every timer got clean ones)."""
        clean = [[] for _ in timers]
        every = [[] for _ in timers]
        dropped = [0 for _ in timers]
        deadline = time.monotonic() + self.patience
        while any(len(c) < self.repeats for c in clean):
            for i, timer in enumerate(timers):
                if len(clean[i]) >= self.repeats:
                    continue
                before = self.disturbance.snapshot() if self.quiet else None
                value = timer.sample()
                every[i].append(value)
                if self.quiet and self.disturbance.disturbed(before, self.disturbance.snapshot(),
                                                             value * timer.calls):
                    dropped[i] += 1
                else:
                    clean[i].append(value)
            if self.quiet and time.monotonic() > deadline:
                break
        complete = all(len(c) >= self.repeats for c in clean)
        samples = [c if len(c) >= max(1, self.repeats // 3) else e for c, e in zip(clean, every)]
        return samples, dropped, complete


def copy_bandwidth(device: str = "cpu", nbytes: int = COPY_BYTES, repeats: int = 10,
                   sampler: Sampler | None = None) -> dict:
    """GB/s of ``dst.copy_(src)`` on ``nbytes`` (bytes read + written, i.e. 2 * nbytes per copy)."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = CudaTimer(dst.copy_, (src,), use_graph=False) if device.startswith("cuda") else CpuTimer(dst.copy_, (src,))
    sampler = sampler or Sampler(repeats)
    (samples,), (dropped,), complete = sampler.collect([timer])
    median = statistics.median(samples)
    return {"device": device, "bytes": nbytes, "seconds": median, "gbps": 2 * nbytes / median / 1e9,
            "best_gbps": 2 * nbytes / min(samples) / 1e9, "samples": len(samples), "dropped": dropped,
            "clean": complete, "timer": timer.name}


# ---- kernels -----------------------------------------------------------------------------------

def _baseline(op: str, device: str = "cpu"):
    """The torch baseline kernel of ``op`` on ``device`` ("cpu": ``torch.<op>``, registered here
    if no plug-in did; "cuda": a backend-"torch" kernel on CUDA, or None)."""
    from .registry import Registry, default_registry

    candidates = [k for k in default_registry.select(backend="torch", op=op)
                  if _device_of(k) == device and k.unavailable() is None]
    candidates.sort(key=lambda k: k.name != f"torch.{op}")
    if candidates or device != "cpu":
        return candidates[0] if candidates else None
    from .kernels import torch_native

    registry = Registry()
    registry.load_plugin("oracle.kernels.torch_native:register", torch_native.register)
    return registry.kernels[f"torch.{op}"]


def select_kernels(op: str, backend: str | None) -> tuple[list, list[str]]:
    """(kernels to time: the baselines first, the CPU one then the CUDA one if any CUDA kernel is
    timed; notes on the kernels left out)."""
    from .registry import default_registry

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


def _device_of(kernel) -> str:
    return "cuda" if kernel.contract.device.startswith("cuda") else "cpu"


def run(ops: list[str], sizes: list[int], repeats: int, backend: str | None, variants: dict | None = None,
        quiet: bool = False, log=print) -> dict:
    """Time every op (its variants: ``variants[op]`` or all) at every size; the JSON-able result.

    Within one (op, variant, N) cell the kernels' samples are interleaved (baseline, kernel 1,
    kernel 2, baseline, ...), so load from other processes hits them alike; ``quiet`` drops the
    samples other processes disturbed (see Sampler). The copy bandwidth is measured before and
    after everything; the reference is the higher of the two medians (the conservative choice for
    "% of copy")."""
    load_before = _loadavg()
    sampler = Sampler(repeats, quiet=quiet)
    sample_seconds = 10 * SAMPLE_SECONDS if quiet else SAMPLE_SECONDS  # long enough for tick accounting
    first_copy = {"cpu": copy_bandwidth("cpu", sampler=Sampler(10, quiet=quiet))}
    log(f"copy bandwidth (cpu): {first_copy['cpu']['gbps']:.1f} GB/s (torch copy_ of {COPY_BYTES >> 20} MiB, "
        f"bytes read + written)")
    cells = []  # (op, variant, n, [(kernel, workload, samples, dropped, calls, timer name, check)], clean)
    notes: dict[str, list[str]] = {}
    for op in ops:
        kernels, left_out = select_kernels(op, backend)
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
                kernels_here = declared
                workloads = [make_workload(op, variant, n, device=_device_of(k)) for k in kernels_here]
                cuda_first = next((w for k, w in zip(kernels_here, workloads) if _device_of(k) == "cuda"), None)
                rotation = cold_sets(op, variant, n, cuda_first) if cuda_first is not None else ()
                timers = [make_timer(k.fn, w.args, _device_of(k), sample_seconds,
                                     rotation if _device_of(k) == "cuda" else ())
                          for k, w in zip(kernels_here, workloads)]
                devices = list(dict.fromkeys(_device_of(k) for k in kernels_here))
                timers += [same_size_copy_timer(workloads[0].bytes, d, sample_seconds) for d in devices]
                samples, dropped, clean = sampler.collect(timers)
                same_copy = {d: statistics.median(s) for d, s in zip(devices, samples[len(kernels_here):])}
                base = _baseline_index(kernels_here)
                checks = ["baseline" if base[i] == i else _check(k, kernels_here[base[i]], w)
                          for i, (k, w) in enumerate(zip(kernels_here, workloads))]
                cells.append((op, variant, n, list(zip(kernels_here, workloads, samples, dropped,
                                                       [t.calls for t in timers], [t.name for t in timers],
                                                       checks, [kernels_here[b].name for b in base],
                                                       [statistics.median(samples[b]) for b in base])),
                              same_copy, clean))
                if sys.stderr.isatty():
                    print(f"  timed {op} [{variant}] N={n}      ", end="\r", file=sys.stderr, flush=True)
    copies = {}
    for device, first in first_copy.items():
        again = copy_bandwidth(device, nbytes=first["bytes"], sampler=Sampler(10, quiet=quiet))
        best = max((first, again), key=lambda c: c["gbps"])
        copies[device] = dict(best, runs_gbps=[first["gbps"], again["gbps"]])
    rows: list[Row] = []
    for op, variant, n, entries, same_copy, clean in cells:
        for kernel, workload, samples, dropped, calls, timer, check, base_name, base_seconds in entries:
            base_us = base_seconds * 1e6
            median = statistics.median(samples)
            gbps = workload.bytes / median / 1e9
            copy = copies[_device_of(kernel)]
            rows.append(Row(op, variant, kernel.name, kernel.contract.backend, kernel.contract.device, n,
                            median * 1e6, gbps, base_us / (median * 1e6), 100 * gbps / copy["gbps"],
                            workload.bytes_read, workload.bytes_written, len(samples), calls,
                            min(samples) * 1e6, check if clean or not quiet else check + " (noisy)", timer,
                            [x * 1e6 for x in samples], dropped, base_name,
                            100 * same_copy[_device_of(kernel)] / median))
    for device, copy in copies.items():
        log(f"copy bandwidth ({device}), the reference for % of copy: {copy['gbps']:.1f} GB/s "
            f"(runs: {', '.join(f'{g:.1f}' for g in copy['runs_gbps'])})")
    for op, variant in dict.fromkeys((r.op, r.variant) for r in rows):
        log("")
        log(format_table([r for r in rows if r.op == op and r.variant == variant], op, variant))
    machine = machine_info()
    machine["loadavg_before"], machine["loadavg_after"] = load_before, _loadavg()
    return {"machine": machine, "copy": copies, "rows": [asdict(r) for r in rows], "notes": notes,
            "sizes": sizes, "repeats": repeats, "quiet": quiet}


def _loadavg():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def format_table(rows: list[Row], op: str, variant: str) -> str:
    header = f"{op} [{variant}]"
    cols = ("kernel", "N", "us", "GB/s", "x baseline", "% of copy", "% of same-size copy", "check")
    body = [(r.kernel, str(r.n), f"{r.us:.1f}", f"{r.gbps:.2f}",
             "-" if r.x_baseline is None else f"{r.x_baseline:.2f}",
             "-" if r.pct_copy is None else f"{r.pct_copy:.0f}%",
             "-" if r.pct_same_copy is None else f"{r.pct_same_copy:.0f}%", r.check) for r in rows]
    widths = [max(len(c), *(len(b[i]) for b in body)) if body else len(c) for i, c in enumerate(cols)]
    lines = [header, "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths)))]
    for b in body:
        lines.append("  ".join(v.rjust(w) if i else v.ljust(w) for i, (v, w) in enumerate(zip(b, widths))))
    return "\n".join(lines)


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
        from .kernels import cpu as cpu_kernels

        info["kv_oracle_cpu_isa"] = cpu_kernels.isa() if cpu_kernels.available() is None else None
    except Exception:  # the CPU kernels are optional here
        info["kv_oracle_cpu_isa"] = None
    return info


def plot(result: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    panels = list(dict.fromkeys((r["op"], r["variant"]) for r in rows))
    cols = min(3, len(panels))
    nrows = -(-len(panels) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5.2 * cols, 3.8 * nrows), squeeze=False)
    for ax, (op, variant) in zip(axes.flat, panels):
        mine = [r for r in rows if r["op"] == op and r["variant"] == variant]
        for kernel in dict.fromkeys(r["kernel"] for r in mine):
            pts = sorted((r["n"], r["gbps"]) for r in mine if r["kernel"] == kernel)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=kernel)
        for device, copy in result["copy"].items():
            ax.axhline(copy["gbps"], linestyle="--", color="grey", linewidth=1)
            ax.annotate(f"copy_ ({device})", (1, copy["gbps"]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=7, color="grey")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("N (rows)")
        ax.set_ylabel("GB/s (read + written)")
        ax.set_title(f"{op} [{variant}]", fontsize=9)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(panels):]:
        ax.set_visible(False)
    machine = result["machine"]
    fig.suptitle(f"oracle bench: {machine['cpu']}, torch {machine['torch']}, {machine['date'][:10]}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ---- command line ------------------------------------------------------------------------------

def configure(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--backend", default=None, metavar="B",
                        help="time only kernels of these backends (comma-separated); the torch baseline "
                             "is always timed")
    parser.add_argument("--op", default=None, metavar="OP",
                        help=f"ops to time (comma-separated; default all: {', '.join(VARIANTS)}); "
                             "OP:VARIANT picks one variant, e.g. reshape_and_cache_flash:e4m3fn")
    parser.add_argument("--json", default=None, metavar="OUT", help="write every row and the machine info as JSON")
    parser.add_argument("--plot", default=None, metavar="OUT.png", help="write GB/s against N as a PNG (matplotlib)")
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)),
                        help="comma-separated row counts N (default %(default)s)")
    parser.add_argument("--repeats", type=int, default=15,
                        help="timed samples per kernel and N; the median is reported (default %(default)s)")
    parser.add_argument("--quiet", action="store_true",
                        help="on a shared machine: keep only samples during which no other process ran "
                             "(Linux /proc accounting), retaking the others for up to 2 minutes per cell")
    return parser


def _parse_ops(spec: str | None) -> tuple[list[str], dict]:
    if not spec:
        return list(VARIANTS), {}
    ops, only = [], {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        op, _, variant = item.partition(":")
        if op not in VARIANTS:
            raise ValueError(f"--op {op!r} has no bench workload; ops: {', '.join(VARIANTS)}")
        if variant and variant not in VARIANTS[op]:
            raise ValueError(f"--op {item!r}: {op} variants are {', '.join(VARIANTS[op])}")
        if op not in ops:
            ops.append(op)
        if variant:
            only.setdefault(op, []).append(variant)
    return ops, only


def main(args: argparse.Namespace) -> int:
    try:
        ops, only = _parse_ops(args.op)
        sizes = [int(s) for s in str(args.sizes).split(",") if s.strip()]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"--sizes {args.sizes!r}: expected positive integers")
        if args.repeats < 1:
            raise ValueError(f"--repeats {args.repeats}: expected at least 1")
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: --plot needs matplotlib (pip install matplotlib)", file=sys.stderr)
            return 2
    result = run(ops, sizes, args.repeats, args.backend, only, quiet=getattr(args, "quiet", False))
    result["command"] = " ".join(sys.argv)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}")
    if args.plot:
        plot(result, args.plot)
        print(f"wrote {args.plot}")
    return 0


def cli(argv: list[str] | None = None) -> int:
    """Stand-alone entry point (``python -m oracle.bench``, benchmarks/bench_kernels.py)."""
    parser = configure(argparse.ArgumentParser(prog="oracle bench", description=__doc__.split("\n\n")[0]))
    return main(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(cli())
