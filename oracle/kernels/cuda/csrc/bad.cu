// A DELIBERATELY WRONG store_cache, for the sanitizer lane only (oracle.lanes.bad_kernels).
//
// The bug is the classic one of reading the slot into a 32-bit UNSIGNED integer: a padding slot
// -1 becomes 4294967295, so the row is written (2^32 - 1) row strides past the cache instead of
// being skipped: terabytes beyond any allocation and far past the oracle's guard bands, where
// only compute-sanitizer (or a crash) can see it. Slots in range are copied correctly, so every
// case without padding passes.
#include <cstdint>

#include <cuda_runtime.h>

namespace kvo_cuda_bad {

__global__ void store_cache_u32_slot_kernel(const unsigned char* __restrict__ src, int64_t src_row,
                                            unsigned char* __restrict__ dst, int64_t dst_row, int64_t row_bytes,
                                            const void* index, int index_is_64, int64_t index_stride, int64_t n) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (row >= n) return;
  const uint32_t slot = index_is_64 ? static_cast<uint32_t>(static_cast<const int64_t*>(index)[row * index_stride])
                                    : static_cast<uint32_t>(static_cast<const int32_t*>(index)[row * index_stride]);
  // BUG: no "slot < 0: skip" (it cannot be negative any more), and the offset is unsigned.
  unsigned char* out = dst + static_cast<uint64_t>(slot) * static_cast<uint64_t>(dst_row);
  const unsigned char* in = src + row * src_row;
  for (int64_t b = lane; b < row_bytes; b += 32) out[b] = in[b];
}

cudaError_t launch_store_cache_u32_slot(const unsigned char* src, int64_t src_row, unsigned char* dst,
                                        int64_t dst_row, int64_t row_bytes, const void* index, int index_is_64,
                                        int64_t index_stride, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const int threads = 256;
  const int64_t blocks = (n * 32 + threads - 1) / threads;
  store_cache_u32_slot_kernel<<<static_cast<unsigned>(blocks), threads, 0, stream>>>(
      src, src_row, dst, dst_row, row_bytes, index, index_is_64, index_stride, n);
  return cudaGetLastError();
}

}  // namespace kvo_cuda_bad
