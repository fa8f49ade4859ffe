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

A saved report (``--json``) is read back by ``saved.py``: ``oracle report bench-table`` prints it as
Markdown tables, ``oracle report bench-plot`` draws it, and ``goals.py`` judges the GPU writers'
speed goals from it (``oracle report bench-goals``); docs/benchmarks.md is made of their output.
"""

from .cli import DEFAULT_SIZES, cli, configure, main
from .output import format_table, plot
from .runner import Row, machine_info, run, select_kernels
from .timers import (COLD_FACTOR, COPY_BYTES, MAX_CALLS, MAX_SETS, SAMPLE_SECONDS, CpuTimer, CudaTimer,
                     Disturbance, Sampler, cold_sets, copy_bandwidth, make_timer, same_size_copy_timer)
from .workloads import VARIANTS, Workload, make_workload

__all__ = ["DEFAULT_SIZES", "cli", "configure", "main", "format_table", "plot", "Row", "machine_info", "run",
           "select_kernels", "COLD_FACTOR", "COPY_BYTES", "MAX_CALLS", "MAX_SETS", "SAMPLE_SECONDS", "CpuTimer",
           "CudaTimer", "Disturbance", "Sampler", "cold_sets", "copy_bandwidth", "make_timer",
           "same_size_copy_timer", "VARIANTS", "Workload", "make_workload"]
