// The validating MLA write in one grid (SlotCheck mode 3), for indices of a few thousand to a few
// tens of thousands of entries.
//
// A check grid (check.cu, mode 2) costs a dependency chain on every eager call: the writer's
// stores wait for the check grid to complete, and the check grid waits for the kernel before it.
// Here the writer checks itself. The grid is no larger than fits on the device at once, so every
// block is resident and a barrier over the grid cannot deadlock. Thread t copies 16-byte chunk
// t % chunks of rows t / chunks, t / chunks + rows_per_step, ... (rows_per_step = threads /
// chunks, so a thread's chunk, with its source base and row stride, never changes). Each thread
// loads its first kTile rows' chunks and slots into registers and its next `staged` rows' chunks
// into shared memory (cp.async, no registers held; LaunchTuning::mla_check_in_grid 2), all safe
// before the verdict (they read the sources and the index only), scans its share of the index, and
// the grid meets at grid_verdict (slot_check.cuh) while those reads are in flight. If an entry is
// illegal no thread stores and block 0 reports it; else the grid stores the registers' rows, then
// the staged ones, and copies any rows left.
//
// One pass (every row in registers or shared memory) is what this shape is for: at N = 4096 and
// 7000 rows of 1152 bytes the register tile alone took 9.4 and 12.3 us eagerly on the H100, against
// 12.2 and 15.7 for the check grid and the writer, 8.0 and 9.9 unchecked
// (benchmarks/mla_in_grid_check.py). A longer call loops, and a grid looping in lock step lost to
// the check grid eagerly (N = 16384: 17.1-17.9 against 15.9 us), so the binding takes this shape
// only up to mla_checked_rows() (docs/benchmarks.md).
//
// Under PDL each block waits (griddepcontrol.wait) before its first load and lets the next launch
// be scheduled only after the barrier: a dependent grid scheduled earlier could take the room a
// block of this grid still needs to reach the barrier. The launch is not cooperative: where other
// kernels share the device, the blocks that do not fit yet become resident as those kernels'
// blocks finish, as any grid's do, and the resident ones wait for them at the barrier.
#include <array>
#include <mutex>

#include "slot_check.cuh"

namespace kvo_cuda {
namespace {

constexpr int kCheckedThreads = 512;
constexpr int kBlocksPerSm = 2;  // the register budget: 64 a thread
constexpr int kTile = 4;         // rows a thread holds in registers
// Rows a thread stages in shared memory at most: 16 bytes each, so 104 KiB a block, and two blocks
// an SM still fit in the H100's 228 KiB.
constexpr int kMaxStaged = 13;

__device__ __forceinline__ void cp_async_16(uint32_t smem, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(smem), "l"(src) : "memory");
}

// Every cp.async of this thread committed and complete (its shared memory written).
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

template <typename IdxT>
__global__ void __launch_bounds__(kCheckedThreads, kBlocksPerSm) mla_checked_kernel(
    const __grid_constant__ MlaArgs a, int64_t chunks, int64_t rows_per_step, int staged, int prefetch) {
  extern __shared__ uint4 stage[];  // [staged][blockDim.x]: thread t's row s at stage[s * blockDim.x + t]
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
  for (int j = 0; j < staged; ++j) {
    const int64_t row = first_row + (kTile + j) * rows_per_step;
    if (row < a.n) cp_async_16(smem_addr(stage + j * blockDim.x + threadIdx.x), src + row * src_row);
  }
  const int64_t mine = first_illegal<IdxT>(a.index, a.index_stride, 0, a.n, t, threads, a.num_slots,
                                           a.check.negative_ok);
  const int64_t verdict = grid_verdict(a.check.barrier, block_min(mine));
  if (a.pdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (verdict < a.n) {
    if (blockIdx.x == 0 && threadIdx.x == 0)
      report_illegal<IdxT>(a.check, a.index, a.index_stride, verdict, a.num_slots);
    cp_async_wait_all();  // no copy may land in shared memory the block has given back
    return;
  }
  store_tile(first_row);
  if (staged > 0) {
    cp_async_wait_all();
    for (int j0 = 0; j0 < staged; j0 += kTile) {  // kTile slot loads in flight at once
#pragma unroll
      for (int k = 0; k < kTile; ++k) {
        const int64_t row = first_row + (kTile + j0 + k) * rows_per_step;
        slot[k] = j0 + k < staged && row < a.n ? load_slot<IdxT>(a.index, row, a.index_stride) : -1;
      }
#pragma unroll
      for (int k = 0; k < kTile; ++k)
        if (slot[k] >= 0 && slot[k] < a.num_slots)
          store_global<16>(dst + slot[k] * a.dst_row, stage[(j0 + k) * blockDim.x + threadIdx.x]);
    }
  }
  for (int64_t base = first_row + (kTile + staged) * rows_per_step; base < a.n; base += step) {
    load_tile(base);
    store_tile(base);
  }
}

// Shared memory of a block staging `staged` rows a thread.
size_t stage_bytes(int staged) { return static_cast<size_t>(staged) * kCheckedThreads * sizeof(uint4); }

// Blocks of the kernel resident at once over the current device with s rows a thread staged in
// shared memory, for s = 0 .. kMaxStaged (0 where that does not fit): the grid's largest size.
// Queried once per device (occupancy queries cost microseconds, and every validating call of the
// MLA writer asks for mla_checked_rows).
template <typename IdxT>
const std::array<int64_t, kMaxStaged + 1>& resident_blocks() {
  static std::array<int64_t, kMaxStaged + 1> table[64];
  static bool known[64] = {false};
  static std::mutex lock;
  static const std::array<int64_t, kMaxStaged + 1> none{};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return none;
  std::lock_guard<std::mutex> guard(lock);
  if (!known[device]) {
    auto kernel = mla_checked_kernel<IdxT>;
    // past the default 48 KiB of dynamic shared memory; where refused, only s = 0 runs
    const bool opened = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(stage_bytes(kMaxStaged))) == cudaSuccess;
    (void)cudaGetLastError();
    for (int staged = 0; staged <= kMaxStaged; ++staged) {
      int per_sm = 0;
      const bool allowed = opened || stage_bytes(staged) <= 48 * 1024;
      if (allowed && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kCheckedThreads,
                                                                   stage_bytes(staged)) != cudaSuccess) {
        (void)cudaGetLastError();
        per_sm = 0;
      }
      table[device][staged] = static_cast<int64_t>(per_sm) * sm_count();
    }
    known[device] = true;
  }
  return table[device];
}

// The shape of a launch over n rows of `chunks` 16-byte chunks: the fewest rows a thread stages
// (0 up to staged_limit()) with which one pass of a resident grid holds them all, its grid no
// larger than they need; or, where none does, the limit's resident grid, which loops.
struct CheckedShape {
  int64_t grid = 0;
  int64_t rows_per_step = 0;
  int staged = 0;
  int64_t one_pass = 0;  // rows one pass of the resident grid holds
};

int staged_limit() { return launch_tuning().mla_check_in_grid == 2 ? kMaxStaged : 0; }

template <typename IdxT>
CheckedShape checked_shape(int64_t n, int64_t chunks) {
  const auto& resident = resident_blocks<IdxT>();
  CheckedShape shape;
  for (int staged = 0; staged <= staged_limit(); ++staged) {
    const int64_t rows_per_step = resident[staged] * kCheckedThreads / chunks;
    if (rows_per_step <= 0) continue;
    shape = {resident[staged], rows_per_step, staged, rows_per_step * (kTile + staged)};
    if (n <= shape.one_pass) {
      const int64_t want_threads = (n + kTile + staged - 1) / (kTile + staged) * chunks;
      shape.grid = std::min(shape.grid, (want_threads + kCheckedThreads - 1) / kCheckedThreads);
      shape.rows_per_step = shape.grid * kCheckedThreads / chunks;
      break;
    }
  }
  return shape;
}

template <typename IdxT>
cudaError_t launch_typed(const MlaArgs& a, cudaStream_t stream) {
  const int64_t chunks = (a.nope_bytes + a.rope_bytes) / 16;
  const CheckedShape shape = checked_shape<IdxT>(a.n, chunks);
  if (shape.grid <= 0 || shape.grid * kCheckedThreads < chunks) return cudaErrorInvalidValue;  // a row wider than the grid
  const unsigned flags = (a.pdl != 0 ? kLaunchPdl : 0u) | (launch_tuning().mla_check_cooperative ? kLaunchCooperative : 0u);
  return launch_kernel(mla_checked_kernel<IdxT>, static_cast<unsigned>(shape.grid), kCheckedThreads,
                       stage_bytes(shape.staged), stream, flags, a, chunks, shape.rows_per_step, shape.staged,
                       prefetch_for(launch_tuning().mla_prefetch, a.pdl != 0));
}

}  // namespace

int64_t mla_checked_rows(int64_t row_bytes) {
  const int64_t chunks = row_bytes / 16;
  if (chunks <= 0) return 0;
  return std::min(checked_shape<int32_t>(INT64_MAX, chunks).one_pass,
                  checked_shape<int64_t>(INT64_MAX, chunks).one_pass);
}

cudaError_t launch_mla_checked(const MlaArgs& args, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  if (args.check.mode != 3 || args.check.barrier == nullptr) return cudaErrorInvalidValue;
  if (args.nope_bytes % 16 != 0 || args.rope_bytes % 16 != 0) return cudaErrorInvalidValue;
  return with_index(args.index_type, [&](auto idx) { return launch_typed<decltype(idx)>(args, stream); });
}

}  // namespace kvo_cuda
