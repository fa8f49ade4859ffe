// Binding of the DELIBERATELY WRONG store_cache (bad.cu): torch op kv_oracle_cuda_bad::store_cache.
// It checks shapes and dtypes like the real one but reads no slot on the host and requires
// contiguous rows; the bug is in the kernel.
#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace kvo_cuda_bad {

cudaError_t launch_store_cache_u32_slot(const unsigned char* src, int64_t src_row, unsigned char* dst,
                                        int64_t dst_row, int64_t row_bytes, const void* index, int index_is_64,
                                        int64_t index_stride, int64_t n, cudaStream_t stream);

void store_cache(const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache, const at::Tensor& v_cache,
                 const at::Tensor& loc) {
  TORCH_CHECK_TYPE(loc.scalar_type() == at::kInt || loc.scalar_type() == at::kLong, "loc must be int32 or int64");
  TORCH_CHECK_VALUE(loc.dim() == 1, "loc must be 1-D");
  if (loc.size(0) == 0) return;
  const at::Tensor* pairs[2][2] = {{&k, &k_cache}, {&v, &v_cache}};
  for (auto& p : pairs) {
    const at::Tensor& src = *p[0];
    const at::Tensor& cache = *p[1];
    TORCH_CHECK_VALUE(src.is_cuda() && cache.is_cuda() && loc.is_cuda(), "CUDA tensors only");
    TORCH_CHECK_TYPE(src.scalar_type() == cache.scalar_type(), "source and cache dtypes differ");
    TORCH_CHECK_VALUE(src.dim() >= 1 && src.size(0) == loc.size(0) && src.sizes().slice(1) == cache.sizes().slice(1),
                      "source and cache rows differ");
    TORCH_CHECK_VALUE(src[0].is_contiguous() && cache[0].is_contiguous(), "rows must be contiguous");
  }
  c10::cuda::CUDAGuard guard(k_cache.device());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(k_cache.device().index()).stream();
  for (auto& p : pairs) {
    const at::Tensor& src = *p[0];
    const at::Tensor& cache = *p[1];
    const int64_t elem = cache.element_size();
    const int64_t row_bytes = (src.dim() > 1 ? src[0].numel() : 1) * elem;
    const cudaError_t err = launch_store_cache_u32_slot(
        static_cast<const unsigned char*>(src.data_ptr()), src.stride(0) * elem,
        static_cast<unsigned char*>(cache.data_ptr()), cache.stride(0) * elem, row_bytes, loc.data_ptr(),
        loc.scalar_type() == at::kLong, loc.stride(0), loc.size(0), stream);
    TORCH_CHECK(err == cudaSuccess, "launch failed: ", cudaGetErrorString(err));
  }
}

}  // namespace kvo_cuda_bad

TORCH_LIBRARY(kv_oracle_cuda_bad, m) {
  m.def("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc) -> ()");
}

TORCH_LIBRARY_IMPL(kv_oracle_cuda_bad, CUDA, m) { m.impl("store_cache", &kvo_cuda_bad::store_cache); }
