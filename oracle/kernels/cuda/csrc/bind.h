// The torch-facing binding of kv_oracle_cuda, shared by its source files: the host-side argument
// checks, the device-side slot check's plan and mailbox, the vector width and row-shape helpers
// (bind_common.cpp), and the ops each family file defines (bind_store.cpp, bind_mla.cpp,
// bind_paged.cpp), which binding.cpp registers with torch. Only these files include torch.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kv_cuda.h"
#include "messages.h"

namespace kvo_bind {

using at::Tensor;
using kvo_cuda::MlaArgs;
using kvo_cuda::PagedArgs;
using kvo_cuda::Side;
using kvo_messages::dtype_name;
using kvo_messages::shape_str;

// ---------------------------------------------------------------- checks (bind_common.cpp)

// Every tensor on one CUDA device (the first one's).
void check_device(const char* op, const std::vector<std::pair<const char*, const Tensor*>>& tensors);
void check_index(const char* name, const Tensor& index);
int32_t index_type_of(const Tensor& index);  // kvo_cuda::kIndexInt64 or kIndexInt32
void check_writable(const char* name, const Tensor& cache);
bool capturing();
void check_launch(const char* op, cudaError_t err);

// ---------------------------------------------------------------- the device-side slot check

void set_error_mailbox(const Tensor& mailbox, int64_t device);
std::tuple<Tensor, Tensor> copy_and_check_index(const Tensor& index, int64_t num_slots, bool negative_ok);
kvo_cuda::SlotCheck plan_check(int64_t validate, const Tensor& index, int64_t n, int64_t num_slots,
                               bool negative_ok, int32_t arg_code, int32_t& pdl, cudaStream_t stream,
                               const std::optional<Tensor>& verdict, int family, bool in_grid = false);

// ---------------------------------------------------------------- widths, addresses, rows

int check_max_vec(int64_t max_vec);
int widest(const std::vector<int64_t>& values, int cap);
int64_t addr(const Tensor& t);
int32_t log2_exact(int64_t v);
cudaStream_t stream_of(const Tensor& t);

// The row of a tensor (every dim after the first `lead` dims) as [heads, head_elems]: the last dim
// contiguous, the dims between it and the lead collapsed into one head dim with one stride.
struct RowShape {
  int64_t heads = 1;
  int64_t head_elems = 1;
  int64_t head_stride = 0;  // elements
};

RowShape row_shape(const char* name, const Tensor& t, int64_t lead);
Side make_side(const Tensor& src, int64_t src_row, const RowShape& sr, const Tensor& dst, int64_t dst_block,
               int64_t dst_token, const RowShape& dr, int64_t src_elem, int64_t dst_elem);
void collapse_dense(RowShape& sr, RowShape& dr);
void finish_chunks(PagedArgs& a, const int64_t head_bytes[2], int64_t chunk_bytes);

// ---------------------------------------------------------------- the ops

void store_cache(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache, const Tensor& loc,
                 int64_t max_vec, bool pdl, int64_t validate, const std::optional<Tensor>& verdict);
std::string store_plan(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& loc, int64_t max_vec);
void set_mla_kv_buffer(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                       c10::string_view path, int64_t max_vec, bool pdl, int64_t validate,
                       const std::optional<Tensor>& verdict);
std::string mla_plan(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                     c10::string_view path, int64_t max_vec);
void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, c10::string_view kv_cache_dtype,
                             const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale,
                             int64_t max_vec, bool pdl, int64_t validate, const std::optional<Tensor>& verdict);
std::string paged_plan(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
                       const Tensor& slot_mapping, c10::string_view kv_cache_dtype,
                       const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale, int64_t max_vec);

}  // namespace kvo_bind
