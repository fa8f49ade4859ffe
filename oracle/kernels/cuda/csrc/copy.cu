// Bitwise row copies into flat (store_cache) and paged (reshape_and_cache_flash, kv_cache_dtype
// "auto") caches: paged_rows_kernel (paged_rows.cuh) with the identity chunk, 16-byte vector loads
// and stores where every pointer and stride allows.
#include "paged_rows.cuh"

namespace kvo_cuda {
namespace {

template <int Vec>
struct CopyChunk {
  static constexpr int kIn = Vec;
  static constexpr int kOut = Vec;
  static constexpr bool kScaled = false;
  using Factor = float;
  __device__ __forceinline__ static Factor factor(float scale) { return scale; }
  __device__ __forceinline__ static typename VecOf<Vec>::type apply(const typename VecOf<Vec>::type& v, Factor) {
    return v;
  }
};

}  // namespace

LaunchTuning& launch_tuning() {
  static LaunchTuning tuning;
  return tuning;
}

cudaError_t launch_paged_copy(const PagedArgs& args, int vec_bytes, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return with_index(args.index_type, [&](auto idx) {
    return with_vec(vec_bytes, [&](auto vec) {
      return launch_paged_rows<decltype(idx), CopyChunk<decltype(vec)::value>>(args, launch_tuning().copy_grid,
                                                                              launch_tuning().copy_prefetch, stream);
    });
  });
}

}  // namespace kvo_cuda
