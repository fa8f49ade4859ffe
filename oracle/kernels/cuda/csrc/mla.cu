// sglang's set_mla_kv_buffer on Hopper: row loc[i] of kv_buffer gets nope[i] followed by rope[i].
//
// TMA path (mla_tma_kernel): one warp per row, a persistent grid of 8-warp blocks. The warp reads
// the row's slot and its nope and rope chunks (16-byte read-only loads, all issued before the first
// use) into registers, writes them to one of its kMlaStages shared-memory row buffers, fences the
// writes into the async proxy (fence.proxy.async.shared::cta, every writing lane), and lane 0
// issues ONE cp.async.bulk global <- shared for the whole row and commits it as a bulk group. The
// warp then moves straight on to its next row: before reusing a buffer, lane 0 waits only until the
// bulk copy issued from it kMlaStages rows earlier has finished READING shared memory
// (cp.async.bulk.wait_group.read), and at exit until every copy has completed. No block-wide
// barrier anywhere; a skipped row commits an empty group so the group count stays one per row.
//
// Direct path (mla_direct_kernel): the same warp-per-row loop with global -> global vector copies,
// for rows the bulk copy cannot take (row bytes not a multiple of 16, a destination or row stride
// that is not 16-byte aligned, or a row too large to stage).
//
// Slots outside [0, num_slots) are skipped; the binding rejects them before launching (except
// under CUDA-graph capture), so that is only a guard against writing outside the buffer.
#include "common.cuh"

namespace kvo_cuda {
namespace {

constexpr int kUnroll = 4;

// Source address of chunk c of a row: nope's chunks first, then rope's.
__device__ __forceinline__ const unsigned char* part_chunk(const unsigned char* nope, const unsigned char* rope,
                                                           int64_t c, int64_t nope_chunks, int bytes) {
  return c < nope_chunks ? nope + c * bytes : rope + (c - nope_chunks) * bytes;
}

template <typename IdxT, int Load>
__global__ void __launch_bounds__(kThreads) mla_tma_kernel(const __grid_constant__ MlaArgs a,
                                                           int64_t stage_bytes) {
  using V = typename VecOf<Load>::type;
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int warps = blockDim.x >> 5;
  unsigned char* mine = smem + static_cast<int64_t>(warp) * kMlaStages * stage_bytes;
  const int64_t row_bytes = a.nope_bytes + a.rope_bytes;
  const int64_t nope_chunks = a.nope_bytes / Load;
  const int64_t chunks = row_bytes / Load;
  int stage = 0;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * warps + warp; row < a.n;
       row += static_cast<int64_t>(gridDim.x) * warps) {
    const int64_t slot = load_slot<IdxT>(a.index, row, a.index_stride);
    const unsigned char* nope = a.nope + row * a.nope_row;
    const unsigned char* rope = a.rope + row * a.rope_row;
    unsigned char* buf = mine + stage * stage_bytes;
    const bool keep = slot >= 0 && slot < a.num_slots;
    bool reusable = false;
    for (int64_t base = 0; base < chunks; base += 32 * kUnroll) {
      V r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < chunks) r[u] = load_ro<Load>(part_chunk(nope, rope, c, nope_chunks, Load));
      }
      if (!keep) break;  // uniform across the warp
      if (!reusable) {
        // The copy issued from this buffer kMlaStages rows ago must be done reading it.
        if (lane == 0) bulk_wait_read<kMlaStages - 1>();
        __syncwarp();
        reusable = true;
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < chunks) *reinterpret_cast<V*>(buf + c * Load) = r[u];
      }
    }
    if (keep) fence_proxy_async_smem();  // each writing lane, before the warp barrier
    __syncwarp();
    if (lane == 0) {
      if (keep) bulk_store(a.dst + slot * a.dst_row, smem_addr(buf), static_cast<uint32_t>(row_bytes));
      bulk_commit();  // an empty group for a skipped row keeps one group per row
    }
    stage = stage + 1 == kMlaStages ? 0 : stage + 1;
  }
  // Shared memory must outlive the copies reading it; wait for full completion.
  if (lane == 0) bulk_wait_all();
  __syncwarp();
}

template <typename IdxT, int Vec>
__global__ void __launch_bounds__(kThreads) mla_direct_kernel(const __grid_constant__ MlaArgs a) {
  using V = typename VecOf<Vec>::type;
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t nope_chunks = a.nope_bytes / Vec;
  const int64_t chunks = (a.nope_bytes + a.rope_bytes) / Vec;
  for (int64_t row = first; row < a.n; row += step) {
    const int64_t slot = load_slot<IdxT>(a.index, row, a.index_stride);
    const unsigned char* nope = a.nope + row * a.nope_row;
    const unsigned char* rope = a.rope + row * a.rope_row;
    const bool keep = slot >= 0 && slot < a.num_slots;
    for (int64_t base = 0; base < chunks; base += 32 * kUnroll) {
      V r[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = base + u * 32 + lane;
        if (c < chunks) r[u] = load_ro<Vec>(part_chunk(nope, rope, c, nope_chunks, Vec));
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

template <typename IdxT, int Load>
cudaError_t launch_tma_typed(const MlaArgs& a, cudaStream_t stream) {
  const int64_t row_bytes = a.nope_bytes + a.rope_bytes;
  if (row_bytes % 16 != 0 || row_bytes <= 0 || row_bytes > kMlaMaxTmaRowBytes) return cudaErrorInvalidValue;
  const int64_t stage_bytes = round_up(row_bytes, 128);
  int64_t warps = (48 * 1024) / (kMlaStages * stage_bytes);
  if (warps > kThreads / 32) warps = kThreads / 32;
  if (warps < 1) return cudaErrorInvalidValue;
  const int threads = static_cast<int>(warps) * 32;
  const size_t smem = static_cast<size_t>(warps * kMlaStages * stage_bytes);
  auto kernel = mla_tma_kernel<IdxT, Load>;
  const unsigned grid = grid_for(kernel, a.n, smem, threads);
  kernel<<<grid, threads, smem, stream>>>(a, stage_bytes);
  return cudaGetLastError();
}

template <typename IdxT>
cudaError_t launch_tma_index(const MlaArgs& a, int load, cudaStream_t stream) {
  switch (load) {
    case 16: return launch_tma_typed<IdxT, 16>(a, stream);
    case 8: return launch_tma_typed<IdxT, 8>(a, stream);
    case 4: return launch_tma_typed<IdxT, 4>(a, stream);
    case 2: return launch_tma_typed<IdxT, 2>(a, stream);
    case 1: return launch_tma_typed<IdxT, 1>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

template <typename IdxT, int Vec>
cudaError_t launch_direct_typed(const MlaArgs& a, cudaStream_t stream) {
  auto kernel = mla_direct_kernel<IdxT, Vec>;
  const unsigned grid = grid_for(kernel, a.n, 0, kThreads);
  kernel<<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <typename IdxT>
cudaError_t launch_direct_index(const MlaArgs& a, int vec, cudaStream_t stream) {
  switch (vec) {
    case 16: return launch_direct_typed<IdxT, 16>(a, stream);
    case 8: return launch_direct_typed<IdxT, 8>(a, stream);
    case 4: return launch_direct_typed<IdxT, 4>(a, stream);
    case 2: return launch_direct_typed<IdxT, 2>(a, stream);
    case 1: return launch_direct_typed<IdxT, 1>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_mla_tma(const MlaArgs& args, int load_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return args.index_type == kIndexInt64 ? launch_tma_index<int64_t>(args, load_bytes, stream)
                                        : launch_tma_index<int32_t>(args, load_bytes, stream);
}

cudaError_t launch_mla_direct(const MlaArgs& args, int vec_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return args.index_type == kIndexInt64 ? launch_direct_index<int64_t>(args, vec_bytes, stream)
                                        : launch_direct_index<int32_t>(args, vec_bytes, stream);
}

}  // namespace kvo_cuda
