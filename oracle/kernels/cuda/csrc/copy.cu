// Bitwise row copies into flat (store_cache) and paged (reshape_and_cache_flash, kv_cache_dtype
// "auto") caches: one warp per (row, side), 16-byte vector loads and stores where every pointer
// and stride allows, a persistent grid sized to the device.
//
// Work item w in [0, sides * n): side w / n, row w % n. A warp loads the row's slot and its first
// U chunks per lane together (the data loads do not wait for the slot), then stores them, so each
// warp keeps 32 * U * vec bytes in flight; with ~48 resident warps per SM that is well past what
// HBM3 needs to stay busy. Slots outside [0, num_slots) are skipped (the binding rejects them
// before launching unless a CUDA graph is being captured; the kernel never writes outside a cache).
#include "common.cuh"

namespace kvo_cuda {
namespace {

constexpr int kUnroll = 4;

// Dense: every side's row is one head, so chunk c is at byte c * Vec of both rows (no head split,
// no per-chunk offsets kept in registers).
template <typename IdxT, int Vec, bool Dense>
__global__ void __launch_bounds__(kThreads) paged_copy_kernel(const __grid_constant__ PagedArgs a) {
  using V = typename VecOf<Vec>::type;
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t items = a.n * a.sides;
  for (int64_t item = first; item < items; item += step) {
    const int s = item >= a.n ? 1 : 0;
    const int64_t row = item - (s ? a.n : 0);
    const Side& d = a.side[s];
    const int64_t slot = load_slot<IdxT>(a.index, row, a.index_stride);
    const unsigned char* src = d.src + row * d.src_row;
    const int64_t chunks = d.heads * d.head_chunks;
    const bool keep = slot >= 0 && slot < a.num_slots;
    if constexpr (Dense) {
      for (int64_t base = lane; base < chunks; base += 32 * kUnroll) {
        V r[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (base + u * 32 < chunks) r[u] = load_ro<Vec>(src + (base + u * 32) * Vec);
        if (!keep) break;  // uniform across the warp
        unsigned char* dst = row_of(a, d, slot);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (base + u * 32 < chunks) store_global<Vec>(dst + (base + u * 32) * Vec, r[u]);
      }
    } else {
      unsigned char* dst = nullptr;
      for (int64_t base = 0; base < chunks; base += 32 * kUnroll) {
        V r[kUnroll];
        int64_t out[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int64_t c = base + u * 32 + lane;
          out[u] = -1;
          if (c < chunks) {
            int64_t h, j;
            split_chunk(c, d.head_chunks, d.head_shift, h, j);
            r[u] = load_ro<Vec>(src + h * d.src_head + j * Vec);
            out[u] = h * d.dst_head + j * Vec;
          }
        }
        if (!keep) break;  // uniform across the warp
        if (dst == nullptr) dst = row_of(a, d, slot);
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
          if (out[u] >= 0) store_global<Vec>(dst + out[u], r[u]);
      }
    }
  }
}

template <typename IdxT, int Vec>
cudaError_t launch_typed(const PagedArgs& a, cudaStream_t stream) {
  auto kernel = a.dense ? paged_copy_kernel<IdxT, Vec, true> : paged_copy_kernel<IdxT, Vec, false>;
  const unsigned grid = grid_for(kernel, a.n * a.sides, 0, kThreads, launch_tuning().copy_grid);
  kernel<<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

}  // namespace

LaunchTuning& launch_tuning() {
  static LaunchTuning tuning;
  return tuning;
}

cudaError_t launch_paged_copy(const PagedArgs& args, int vec_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return with_index(args.index_type, [&](auto idx) {
    return with_vec(vec_bytes, [&](auto vec) { return launch_typed<decltype(idx), decltype(vec)::value>(args, stream); });
  });
}

}  // namespace kvo_cuda
