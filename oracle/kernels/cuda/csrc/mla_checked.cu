// The validating MLA write in one grid (SlotCheck mode 3), for indices of a few thousand entries.
//
// A check grid (check.cu, mode 2) costs a dependency chain on every eager call: the writer's
// stores wait for the check grid to complete, and the check grid waits for the kernel before it.
// Here the writer checks itself. The grid is no larger than fits on the device at once, so every
// block is resident and a barrier over the grid cannot deadlock. Thread t copies 16-byte chunk
// t % chunks of rows t / chunks, t / chunks + rows_per_step, ... (rows_per_step = threads /
// chunks, so a thread's chunk, with its source base and row stride, never changes). Each thread
// loads its first kTile rows' chunks and slots into registers (safe before the verdict: they read
// the sources and the index only), scans its share of the index, and the grid meets at
// grid_verdict (slot_check.cuh) while those reads are in flight. If an entry is illegal no thread
// stores and block 0 reports it; else the grid stores the tile and copies any rows left. A block
// that waits at the barrier past LaunchTuning::mla_check_deadline_us scans the whole index itself
// instead (grid_verdict), so the grid cannot wait forever for room another grid holds.
//
// One pass (every row in the first tile) is what this shape is for: at N = 4096 and 7000 rows of
// 1152 bytes it takes 9.4 and 12.3 us eagerly on the H100, against 12.2 and 15.7 for the check
// grid and the writer, 8.0 and 9.9 unchecked (benchmarks/mla_in_grid_check.py). A longer call
// loops, and a grid looping in lock step lost to the check grid eagerly (N = 16384: 17.1-17.9
// against 15.9 us), so the binding takes this shape only up to mla_checked_rows()
// (docs/benchmarks.md).
//
// Under PDL each block waits (griddepcontrol.wait) before its first load and lets the next launch
// be scheduled only after the barrier: a dependent grid scheduled earlier could take the room a
// block of this grid still needs to reach the barrier. The launch is not cooperative: where other
// kernels share the device, the blocks that do not fit yet become resident as those kernels'
// blocks finish, as any grid's do, and the resident ones wait for them at the barrier.
#include "slot_check.cuh"

namespace kvo_cuda {
namespace {

constexpr int kCheckedThreads = 512;
constexpr int kTile = 4;

template <typename IdxT>
__global__ void __launch_bounds__(kCheckedThreads) mla_checked_kernel(const __grid_constant__ MlaArgs a,
                                                                      int64_t chunks, int64_t rows_per_step,
                                                                      int prefetch, uint64_t deadline_ns) {
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t threads = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t c = t % chunks;
  const int64_t first_row = t / chunks < rows_per_step ? t / chunks : a.n;  // the last few threads idle
  const int64_t nope_chunks = a.nope_bytes / 16;
  const unsigned char* src = c < nope_chunks ? a.nope + c * 16 : a.rope + (c - nope_chunks) * 16;
  const int64_t src_row = c < nope_chunks ? a.nope_row : a.rope_row;
  unsigned char* dst = a.dst + c * 16;  // rope follows nope in the kv_buffer row
  const int64_t step = rows_per_step * kTile;
  if (prefetch) {
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      const int64_t row = first_row + k * rows_per_step;
      if (row < a.n) asm volatile("prefetch.global.L2 [%0];" :: "l"(src + row * src_row));
    }
  }
  if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  uint4 r[kTile];
  int64_t slot[kTile];
  auto load_tile = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      const int64_t row = base + k * rows_per_step;
      if (row < a.n) {
        r[k] = load_ro<16>(src + row * src_row);
        slot[k] = load_slot<IdxT>(a.index, row, a.index_stride);
      }
    }
  };
  auto store_tile = [&](int64_t base) {
#pragma unroll
    for (int k = 0; k < kTile; ++k) {
      const int64_t row = base + k * rows_per_step;
      if (row < a.n && slot[k] >= 0 && slot[k] < a.num_slots) store_global<16>(dst + slot[k] * a.dst_row, r[k]);
    }
  };
  load_tile(first_row);
  const int64_t mine = first_illegal<IdxT>(a.index, a.index_stride, 0, a.n, t, threads, a.num_slots,
                                           a.check.negative_ok);
  int64_t verdict = grid_verdict(a.check.barrier, block_min(mine), deadline_ns);
  if (verdict == kVerdictLate)  // the whole index, by this block alone
    verdict = block_scan<IdxT>(a.index, a.index_stride, a.n, a.num_slots, a.check.negative_ok);
  if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (verdict < a.n) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      report_illegal<IdxT>(a.check, a.index, a.index_stride, verdict, a.num_slots);
    return;
  }
  store_tile(first_row);
  for (int64_t base = first_row + step; base < a.n; base += step) {
    load_tile(base);
    store_tile(base);
  }
}

// Blocks of the kernel resident at once over the device: the grid's largest size.
template <typename IdxT>
int64_t resident_blocks() {
  return static_cast<int64_t>(blocks_per_sm(mla_checked_kernel<IdxT>, 0, kCheckedThreads)) * sm_count();
}

template <typename IdxT>
cudaError_t launch_typed(const MlaArgs& a, cudaStream_t stream) {
  const int64_t chunks = (a.nope_bytes + a.rope_bytes) / 16;
  // No more blocks than the rows need (kTile rows a thread), and no more than are resident at once.
  const int64_t want_threads = (a.n + kTile - 1) / kTile * chunks;
  int64_t grid = (want_threads + kCheckedThreads - 1) / kCheckedThreads;
  const int64_t resident = resident_blocks<IdxT>();
  if (grid > resident) grid = resident;
  if (grid * kCheckedThreads < chunks) return cudaErrorInvalidValue;  // a row wider than the grid
  const int64_t rows_per_step = grid * kCheckedThreads / chunks;
  return launch_kernel(mla_checked_kernel<IdxT>, static_cast<unsigned>(grid), kCheckedThreads, 0, stream,
                       a.pdl != 0, a, chunks, rows_per_step,
                       prefetch_for(launch_tuning().mla_prefetch, a.pdl != 0),
                       static_cast<uint64_t>(launch_tuning().mla_check_deadline_us) * 1000u);
}

}  // namespace

int64_t mla_checked_rows(int64_t row_bytes) {
  const int64_t chunks = row_bytes / 16;
  if (chunks <= 0) return 0;
  const int64_t resident = std::min(resident_blocks<int32_t>(), resident_blocks<int64_t>());
  return resident * kCheckedThreads / chunks * kTile;
}

cudaError_t launch_mla_checked(const MlaArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  if (args.check.mode != 3 || args.check.barrier == nullptr) return cudaErrorInvalidValue;
  if (args.nope_bytes % 16 != 0 || args.rope_bytes % 16 != 0) return cudaErrorInvalidValue;
  return with_index(args.index_type, [&](auto idx) { return launch_typed<decltype(idx)>(args, stream); });
}

}  // namespace kvo_cuda
