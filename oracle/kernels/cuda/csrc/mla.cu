// sglang's set_mla_kv_buffer on Hopper: row loc[i] of kv_buffer gets nope[i] followed by rope[i].
//
// TMA path (mla_tma_kernel): each warp takes Rows consecutive rows per iteration, in a persistent
// grid. It reads their slots and their nope and rope chunks (16-byte read-only loads, every row's
// loads issued before the first use, so Rows rows are in flight per warp) into registers, writes
// them to one of its two sets of shared-memory row buffers, fences the writes into the async proxy
// (fence.proxy.async.shared::cta, every lane), and lane 0 issues one cp.async.bulk global <- shared
// per row and commits the iteration's copies as one bulk group. The warp moves straight on: before
// reusing a set, lane 0 waits only until the group issued from it two iterations earlier has
// finished READING shared memory (cp.async.bulk.wait_group.read 1), and at exit until every group
// has (wait_group.read 0: the writes complete on their own; only the shared memory they read must
// outlive the block). No block-wide barrier anywhere.
//
// Direct path (mla_direct_kernel): the same warp-per-row loop with global -> global vector copies.
// The binding's `auto` takes it wherever it moves full-width vectors (faster on the H100) and for
// rows the bulk copy cannot take (row bytes not a multiple of 16, a destination or row stride that
// is not 16-byte aligned, or a row too large to stage); TMA where only the sources are less aligned.
//
// Both paths take `prefetch`: each warp first asks the L2 for its first rows' nope, rope and slot
// (under PDL before griddepcontrol.wait; see prefetch_l2).
//
// Slots outside [0, num_slots) are skipped, so nothing is written outside the buffer; a validating
// call first decides on the device whether every slot is legal (SlotCheck, call_is_legal) and
// stores nothing if one is not.
#include "slot_check.cuh"

namespace kvo_cuda {
namespace {

constexpr int kUnroll = 4;

// Source address of chunk c of a row: nope's chunks first, then rope's.
__device__ __forceinline__ const unsigned char* part_chunk(const unsigned char* nope, const unsigned char* rope,
                                                           int64_t c, int64_t nope_chunks, int bytes) {
  return c < nope_chunks ? nope + c * bytes : rope + (c - nope_chunks) * bytes;
}

// Ask the L2 for row `row`'s nope and rope bytes and its slot (see prefetch_l2).
template <typename IdxT>
__device__ __forceinline__ void prefetch_row(const MlaArgs& a, int64_t row, int lane) {
  prefetch_l2(a.nope + row * a.nope_row, a.nope_bytes, lane);
  prefetch_l2(a.rope + row * a.rope_row, a.rope_bytes, lane);
  if (lane == 0) prefetch_slot<IdxT>(a.index, row, a.index_stride);
}

template <typename IdxT, int Load, int Rows>
__global__ void __launch_bounds__(kThreads) mla_tma_kernel(const __grid_constant__ MlaArgs a,
                                                           int64_t stage_bytes, int evict_first, int prefetch) {
  using V = typename VecOf<Load>::type;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  unsigned char* mine = smem + static_cast<int64_t>(warp) * 2 * Rows * stage_bytes;
  const int64_t row_bytes = a.nope_bytes + a.rope_bytes;
  const int64_t nope_chunks = a.nope_bytes / Load;
  const int64_t chunks = row_bytes / Load;
  const int64_t step = static_cast<int64_t>(gridDim.x) * warps * Rows;
  const uint64_t policy = evict_first ? evict_first_policy() : 0;
  if (prefetch) {
    const int64_t row = (static_cast<int64_t>(blockIdx.x) * warps + warp) * Rows;
    for (int j = 0; j < Rows && row + j < a.n; ++j) prefetch_row<IdxT>(a, row + j, lane);
  }
  pdl_prologue(a.pdl);
  if (a.check.mode != 0 && !call_is_legal<IdxT>(a.check, a.index, a.index_stride, a.n, a.num_slots)) return;
  int set = 0;
  for (int64_t first = (static_cast<int64_t>(blockIdx.x) * warps + warp) * Rows; first < a.n; first += step) {
    int64_t slot[Rows];
    bool live[Rows], keep[Rows];
#pragma unroll
    for (int j = 0; j < Rows; ++j) {
      live[j] = first + j < a.n;
      slot[j] = live[j] ? load_slot<IdxT>(a.index, first + j, a.index_stride) : -1;
      keep[j] = slot[j] >= 0 && slot[j] < a.num_slots;
    }
    unsigned char* buf = mine + set * Rows * stage_bytes;
    bool reusable = false;
    for (int64_t base = 0; base < chunks; base += 32 * kUnroll) {
      V r[Rows][kUnroll];
#pragma unroll
      for (int j = 0; j < Rows; ++j) {
        const unsigned char* nope = a.nope + (first + j) * a.nope_row;
        const unsigned char* rope = a.rope + (first + j) * a.rope_row;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * 32 + lane;
          if (live[j] && c < chunks) {
            const unsigned char* p = part_chunk(nope, rope, c, nope_chunks, Load);
            r[j][u] = (evict_first & 1) ? load_ro_policy<Load>(p, policy) : load_ro<Load>(p);
          }
        }
      }
      if (!reusable) {
        // The group issued from this set two iterations ago must be done reading it.
        if (lane == 0) bulk_wait_read<1>();
        __syncwarp();
        reusable = true;
      }
#pragma unroll
      for (int j = 0; j < Rows; ++j) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * 32 + lane;
          if (keep[j] && c < chunks) *reinterpret_cast<V*>(buf + j * stage_bytes + c * Load) = r[j][u];
        }
      }
    }
    fence_proxy_async_smem();  // every lane, before the warp barrier
    __syncwarp();
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < Rows; ++j)
        if (keep[j]) {
          unsigned char* dst = a.dst + slot[j] * a.dst_row;
          const uint32_t src = smem_addr(buf + j * stage_bytes);
          if (evict_first & 2) bulk_store_policy(dst, src, static_cast<uint32_t>(row_bytes), policy);
          else bulk_store(dst, src, static_cast<uint32_t>(row_bytes));
        }
      bulk_commit();  // one group per iteration, empty when every row was skipped
    }
    set ^= 1;
  }
  if (lane == 0) bulk_wait_read<0>();
  __syncwarp();
}

// Check: the build's CheckCode (slot_check.cuh; check_code picks it per launch).
template <typename IdxT, int Vec, int Check>
__global__ void __launch_bounds__(kThreads) mla_direct_kernel(const __grid_constant__ MlaArgs a, int prefetch) {
  using V = typename VecOf<Vec>::type;
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t nope_chunks = a.nope_bytes / Vec;
  const int64_t chunks = (a.nope_bytes + a.rope_bytes) / Vec;
  if (prefetch && first < a.n) prefetch_row<IdxT>(a, first, lane);
  if constexpr (Check != kCheckNone) prefetch_verdict(a.check);
  // Chunks [base, base + 32 * kUnroll) of a row, one per lane and unrolled step.
  auto load_chunks = [&](int64_t row, int64_t base, V (&r)[kUnroll]) {
    const unsigned char* nope = a.nope + row * a.nope_row;
    const unsigned char* rope = a.rope + row * a.rope_row;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t c = base + u * 32 + lane;
      if (c < chunks) r[u] = load_ro<Vec>(part_chunk(nope, rope, c, nope_chunks, Vec));
    }
  };
  // In the full build (CheckCode), a call that scans a short index itself (SlotCheck mode 1) loads
  // its first row right after the PDL wait, beside the scan's loads, so the row's memory round trip
  // overlaps the scan; only the stores wait for the verdict. A call that reads a verdict (mode 2)
  // loads it right after the wait too, beside the verdict's read, and nothing before the wait, as a
  // check grid may have let this grid launch while the kernels before it still run (check.cu) and an
  // index checked beforehand leaves the launch as it is; unless the check grid let it launch only
  // once they had completed (SlotCheck::late): then before the wait. The verdict-only build loads
  // nothing early: it keeps fewer registers, so more of its blocks fit on an SM.
  constexpr bool kFull = Check == kCheckFull;
  const bool before = kFull && a.check.mode == 2 && a.check.late;
  const bool early = kFull && (a.check.mode == 1 || a.check.mode == 2) && first < a.n && chunks <= 32 * kUnroll;
  int64_t early_slot = -1;
  V early_r[kUnroll];
  auto load_early = [&] {
    early_slot = load_slot<IdxT>(a.index, first, a.index_stride);
    load_chunks(first, 0, early_r);
  };
  if (early && before) load_early();
  pdl_prologue(a.pdl);
  if (early && !before) load_early();
  if (Check != kCheckNone && a.check.mode != 0 &&
      !call_is_legal<IdxT>(a.check, a.index, a.index_stride, a.n, a.num_slots))
    return;
  for (int64_t row = first; row < a.n; row += step) {
    const bool preloaded = early && row == first;  // then the row is one round of chunks, base 0
    const int64_t slot = preloaded ? early_slot : load_slot<IdxT>(a.index, row, a.index_stride);
    const bool keep = slot >= 0 && slot < a.num_slots;
    for (int64_t base = 0; base < chunks; base += 32 * kUnroll) {
      V r[kUnroll];
      if (preloaded) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) r[u] = early_r[u];
      } else {
        load_chunks(row, base, r);
      }
      if (!keep) break;
      unsigned char* dst = a.dst + slot * a.dst_row;  // rope follows nope: chunk c lands at c * Vec
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < chunks) store_global<Vec>(dst + c * Vec, r[u]);
      }
    }
  }
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows per warp iteration: the tuned value, halved while two sets of them would not fit.
int mla_rows_for(int64_t stage_bytes) {
  int rows = launch_tuning().mla_rows;
  while (rows > 1 && 2 * rows * stage_bytes > kStageSmemBytes) rows /= 2;
  return rows;
}

template <typename IdxT, int Load, int Rows>
cudaError_t launch_tma_typed(const MlaArgs& a, int64_t stage_bytes, cudaStream_t stream) {
  int64_t warps = kStageSmemBytes / (2 * Rows * stage_bytes);
  if (warps > launch_tuning().mla_warps) warps = launch_tuning().mla_warps;
  if (warps < 1) return cudaErrorInvalidValue;
  const int threads = static_cast<int>(warps) * 32;
  const size_t smem = static_cast<size_t>(warps * 2 * Rows * stage_bytes);
  auto kernel = mla_tma_kernel<IdxT, Load, Rows>;
  const unsigned grid = grid_for(kernel, (a.n + Rows - 1) / Rows, smem, threads, launch_tuning().mla_grid);
  return launch_kernel(kernel, grid, threads, smem, stream, a.pdl != 0, a, stage_bytes,
                       launch_tuning().mla_evict_first, prefetch_for(launch_tuning().mla_prefetch, a.pdl != 0));
}

template <typename IdxT, int Vec>
cudaError_t launch_direct_typed(const MlaArgs& a, cudaStream_t stream) {
  return with_check(check_code(a.check, kMlaDirectFamily), [&](auto check) {
    auto kernel = mla_direct_kernel<IdxT, Vec, decltype(check)::value>;
    const int threads = 32 * launch_tuning().mla_warps;
    const unsigned grid = grid_for(kernel, a.n, 0, threads, launch_tuning().mla_grid);
    return launch_kernel(kernel, grid, threads, 0, stream, a.pdl != 0, a,
                         prefetch_for(launch_tuning().mla_prefetch, a.pdl != 0));
  });
}

}  // namespace

cudaError_t launch_mla_tma(const MlaArgs& args, int load_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  const int64_t row_bytes = args.nope_bytes + args.rope_bytes;
  if (row_bytes % 16 != 0 || row_bytes <= 0 || row_bytes > kMlaMaxTmaRowBytes) return cudaErrorInvalidValue;
  const int64_t stage_bytes = round_up(row_bytes, 128);
  const int rows = mla_rows_for(stage_bytes);
  return with_index(args.index_type, [&](auto idx) {
    using IdxT = decltype(idx);
    return with_vec(load_bytes, [&](auto load) {
      constexpr int Load = decltype(load)::value;
      switch (rows) {
        case 4: return launch_tma_typed<IdxT, Load, 4>(args, stage_bytes, stream);
        case 2: return launch_tma_typed<IdxT, Load, 2>(args, stage_bytes, stream);
        default: return launch_tma_typed<IdxT, Load, 1>(args, stage_bytes, stream);
      }
    });
  });
}

cudaError_t launch_mla_direct(const MlaArgs& args, int vec_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return with_index(args.index_type, [&](auto idx) {
    return with_vec(vec_bytes, [&](auto vec) {
      return launch_direct_typed<decltype(idx), decltype(vec)::value>(args, stream);
    });
  });
}

}  // namespace kvo_cuda
