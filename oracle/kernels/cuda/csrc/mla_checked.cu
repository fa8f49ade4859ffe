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

// The wave shape (mla_check_in_grid 2): block b holds rows [b * rows_per_block, ...) whole, its
// threads their kWaveChunks 16-byte chunks (chunk f = threadIdx.x + k * blockDim.x of the block's
// rows: row f / chunks, chunk f % chunks) and the rows' slots in shared memory, so a resident grid
// holds kWaveChunks * 16 bytes a thread of rows: 16896 rows of 1152 bytes on the H100, where the
// register pass, a slot a row a thread, holds 7508. Block b scans exactly its own rows' slots (the
// index is asked of the L2 with the rows, before the PDL wait), loads its chunks, and the grid
// meets at grid_verdict while they are in flight; then every thread stores what it holds.
constexpr int kWaveThreads = 512;
constexpr int kWaveChunks = 9;     // 36 registers of row bytes a thread, within the 64 of two blocks an SM
constexpr int kWaveRowsMax = 512;  // rows a block holds at most (its slots: 4 KiB of shared memory)

// Rows a block of the wave holds, for rows of `chunks` 16-byte chunks (0: a row is too wide).
int64_t wave_rows(int64_t chunks) {
  return std::min<int64_t>(kWaveRowsMax, static_cast<int64_t>(kWaveThreads) * kWaveChunks / chunks);
}

template <typename IdxT>
__global__ void __launch_bounds__(kWaveThreads, 2) mla_wave_kernel(const __grid_constant__ MlaArgs a, int chunks,
                                                                 int64_t rows_per_block, int prefetch,
                                                                 uint64_t deadline_ns) {
  __shared__ int64_t slots[kWaveRowsMax];
  const int tid = threadIdx.x;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * rows_per_block;
  const int64_t rows = min(rows_per_block, a.n - row0);  // >= 1: the launcher makes no empty block
  const int held = static_cast<int>(rows) * chunks;      // chunks of the block's rows
  const int nope_chunks = static_cast<int>(a.nope_bytes / 16);
  // Chunk f + kWaveThreads is kWaveThreads / chunks rows and kWaveThreads % chunks chunks on.
  const int dr = kWaveThreads / chunks, dc = kWaveThreads % chunks;
  auto source = [&](int r, int c) {
    return c < nope_chunks ? a.nope + (row0 + r) * a.nope_row + c * 16
                           : a.rope + (row0 + r) * a.rope_row + (c - nope_chunks) * 16;
  };
  auto next = [&](int& r, int& c) {
    r += dr;
    c += dc;
    if (c >= chunks) {
      c -= chunks;
      ++r;
    }
  };
  if (prefetch) {
    int r = tid / chunks, c = tid % chunks;
#pragma unroll
    for (int k = 0; k < kWaveChunks; ++k) {
      if (tid + k * kWaveThreads < held) asm volatile("prefetch.global.L2 [%0];" :: "l"(source(r, c)));
      next(r, c);
    }
    if (tid < rows) prefetch_slot<IdxT>(a.index, row0 + tid, a.index_stride);
  }
  if (a.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  // The slot first: its load is then ahead of the rows' in the memory system, and the verdict
  // waits only for it.
  const int64_t slot = tid < rows ? load_slot<IdxT>(a.index, row0 + tid, a.index_stride) : 0;
  uint4 v[kWaveChunks];
  {
    int r = tid / chunks, c = tid % chunks;
#pragma unroll
    for (int k = 0; k < kWaveChunks; ++k) {
      if (tid + k * kWaveThreads < held) v[k] = load_ro<16>(source(r, c));
      next(r, c);
    }
  }
  int64_t mine = kNoEntry;
  if (tid < rows) {
    slots[tid] = slot;
    if (slot >= a.num_slots || (!a.check.negative_ok && slot < 0)) mine = row0 + tid;
  }
  int64_t verdict = grid_verdict(a.check.barrier, block_min(mine), deadline_ns);  // block_min: slots[] visible
  if (verdict == kVerdictLate)  // the whole index, by this block alone
    verdict = block_scan<IdxT>(a.index, a.index_stride, a.n, a.num_slots, a.check.negative_ok);
  if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (verdict < a.n) {
    if (blockIdx.x == 0 && tid == 0) report_illegal<IdxT>(a.check, a.index, a.index_stride, verdict, a.num_slots);
    return;
  }
  // tid read again, opaquely: else the compiler keeps the loads' row and chunk numbers (or their
  // addresses) live across the barrier beside the rows, 114 registers a thread in all.
  unsigned t;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(t));
  int r = static_cast<int>(t) / chunks, c = static_cast<int>(t) % chunks;
#pragma unroll
  for (int k = 0; k < kWaveChunks; ++k) {
    if (static_cast<int>(t) + k * kWaveThreads < held) store_global<16>(a.dst + slots[r] * a.dst_row + c * 16, v[k]);
    next(r, c);
  }
}

// Blocks of the kernel resident at once over the device: the grid's largest size.
template <typename IdxT>
int64_t resident_blocks() {
  return static_cast<int64_t>(blocks_per_sm(mla_checked_kernel<IdxT>, 0, kCheckedThreads)) * sm_count();
}

template <typename IdxT>
int64_t wave_blocks() {
  return static_cast<int64_t>(blocks_per_sm(mla_wave_kernel<IdxT>, 0, kWaveThreads)) * sm_count();
}

// The wave's launch: the rows spread evenly over as many blocks as are resident at once (a short
// call still uses every SM), each holding at most wave_rows.
template <typename IdxT>
cudaError_t launch_wave_typed(const MlaArgs& a, cudaStream_t stream) {
  const int64_t chunks = (a.nope_bytes + a.rope_bytes) / 16;
  const int64_t most = wave_rows(chunks);
  const int64_t blocks = wave_blocks<IdxT>();
  int64_t per_block = (a.n + blocks - 1) / blocks;
  if (most < 1 || per_block > most) return cudaErrorInvalidValue;  // past one wave: the binding never asks
  const int64_t grid = (a.n + per_block - 1) / per_block;
  return launch_kernel(mla_wave_kernel<IdxT>, static_cast<unsigned>(grid), kWaveThreads, 0, stream, a.pdl != 0, a,
                       static_cast<int>(chunks), per_block, prefetch_for(launch_tuning().mla_prefetch, a.pdl != 0),
                       static_cast<uint64_t>(launch_tuning().mla_check_deadline_us) * 1000u);
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
  if (launch_tuning().mla_check_in_grid == 2)
    return std::min(wave_blocks<int32_t>(), wave_blocks<int64_t>()) * wave_rows(chunks);
  const int64_t resident = std::min(resident_blocks<int32_t>(), resident_blocks<int64_t>());
  return resident * kCheckedThreads / chunks * kTile;
}

cudaError_t launch_mla_checked(const MlaArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  if (args.check.mode != 3 || args.check.barrier == nullptr) return cudaErrorInvalidValue;
  if (args.nope_bytes % 16 != 0 || args.rope_bytes % 16 != 0) return cudaErrorInvalidValue;
  const bool wave = launch_tuning().mla_check_in_grid == 2;
  return with_index(args.index_type, [&](auto idx) {
    using IdxT = decltype(idx);
    return wave ? launch_wave_typed<IdxT>(args, stream) : launch_typed<IdxT>(args, stream);
  });
}

}  // namespace kvo_cuda
