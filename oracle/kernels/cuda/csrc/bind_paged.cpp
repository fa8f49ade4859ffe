// reshape_and_cache_flash: argument checks, fp8 formats and scales, and the launch plan of the
// paged K/V write (bind.h).

#include <c10/cuda/CUDAGuard.h>

#include "bind.h"

namespace kvo_bind {

// ================================================================ reshape_and_cache_flash

// kv_cache_dtype -> Fp8Format (kFp8None for "auto"); fnuz formats are refused with NotImplemented.
int parse_kv_cache_dtype(const std::string& name) {
  if (name == "auto") return kvo_cuda::kFp8None;
  if (name == "fp8" || name == "fp8_e4m3" || name == "e4m3fn") return kvo_cuda::kFp8E4M3;
  if (name == "fp8_e5m2" || name == "e5m2") return kvo_cuda::kFp8E5M2;
  if (name == "e4m3fnuz" || name == "e5m2fnuz") {
    TORCH_CHECK_NOT_IMPLEMENTED(false, "kv_cache_dtype='", name, "': the kv_oracle_cuda kernels write the OCP "
                                "formats e4m3fn and e5m2 only (cvt.rn.satfinite has no fnuz form)");
  }
  TORCH_CHECK_VALUE(false, "kv_cache_dtype='", name, "' is not one of 'auto', 'fp8', 'fp8_e4m3', 'fp8_e5m2', "
                    "'e4m3fn', 'e5m2', 'e4m3fnuz', 'e5m2fnuz'");
  return -1;
}

int src_type_of(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return kvo_cuda::kSrcFloat32;
    case at::kHalf: return kvo_cuda::kSrcFloat16;
    case at::kBFloat16: return kvo_cuda::kSrcBFloat16;
    default: return -1;
  }
}

void check_scale(const char* name, const std::optional<Tensor>& scale, int64_t heads, const Tensor& like) {
  TORCH_CHECK_TYPE(scale.has_value() && scale->defined(), name, " must be a float32 tensor, got None");
  TORCH_CHECK_TYPE(scale->scalar_type() == at::kFloat, name, " must be a float32 tensor, got ",
                   dtype_name(scale->scalar_type()));
  TORCH_CHECK_VALUE(scale->dim() == 1 && (scale->numel() == 1 || scale->numel() == heads), name, " has shape ",
                    shape_str(scale->sizes()), "; expected [1] or [", heads, "] (per head)");
  TORCH_CHECK_VALUE(scale->is_cuda() && scale->device() == like.device(), name, " is on ",
                    scale->device().str(), "; it must be on ", like.device().str(), " with the caches");
}

struct PagedPlan {
  PagedArgs args{};
  int fmt = kvo_cuda::kFp8None;
  int src_type = -1;
  int width = 1;  // copy: bytes per chunk; fp8: elements per chunk
  bool empty = false;
};

PagedPlan plan_paged(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
                     const Tensor& slot_mapping, const std::string& kv_cache_dtype,
                     const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale, int64_t max_vec) {
  const int cap = check_max_vec(max_vec);
  PagedPlan plan;
  plan.fmt = parse_kv_cache_dtype(kv_cache_dtype);
  const bool fp8 = plan.fmt != kvo_cuda::kFp8None;
  check_device("reshape_and_cache_flash", {{"key_cache", &key_cache}, {"value_cache", &value_cache}, {"key", &key},
                                           {"value", &value}, {"slot_mapping", &slot_mapping}});
  const std::pair<const char*, const Tensor*> caches[2] = {{"key_cache", &key_cache}, {"value_cache", &value_cache}};
  for (const auto& [name, c] : caches) {
    TORCH_CHECK_VALUE(c->dim() == 4, name, " must be 4-D [num_blocks, block_size, H, D], got ", shape_str(c->sizes()));
    TORCH_CHECK_VALUE(c->stride(3) == 1 || c->size(3) <= 1, name, " has strides ", shape_str(c->strides()),
                      "; its last dimension must be contiguous");
    TORCH_CHECK_TYPE(!fp8 || c->scalar_type() == at::kByte, name, " has dtype ", dtype_name(c->scalar_type()),
                     "; kv_cache_dtype ", kv_cache_dtype, " stores uint8 codes");
    check_writable(name, *c);
  }
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), heads = key_cache.size(2);
  TORCH_CHECK_VALUE(value_cache.size(0) == num_blocks && value_cache.size(1) == block_size &&
                        value_cache.size(2) == heads,
                    "value_cache has shape ", shape_str(value_cache.sizes()), "; key_cache ",
                    shape_str(key_cache.sizes()));
  check_index("slot_mapping", slot_mapping);
  const int64_t n = slot_mapping.size(0);
  const std::pair<const char*, const Tensor*> srcs[2] = {{"key", &key}, {"value", &value}};
  for (int s = 0; s < 2; ++s) {
    const char* name = srcs[s].first;
    const Tensor& src = *srcs[s].second;
    const Tensor& cache = *caches[s].second;
    TORCH_CHECK_VALUE(src.dim() == 3 && src.size(0) >= n && src.size(1) == cache.size(2) &&
                          src.size(2) == cache.size(3),
                      name, " has shape ", shape_str(src.sizes()), "; expected [>= ", n, ", ", cache.size(2), ", ",
                      cache.size(3), "] to match ", caches[s].first);
    TORCH_CHECK_VALUE(src.stride(2) == 1 || src.size(2) <= 1, name, " has strides ", shape_str(src.strides()),
                      "; its last dimension must be contiguous");
    if (!fp8) {
      TORCH_CHECK_TYPE(src.scalar_type() == cache.scalar_type(), name, " has dtype ", dtype_name(src.scalar_type()),
                       " but ", caches[s].first, " has dtype ", dtype_name(cache.scalar_type()));
    } else {
      TORCH_CHECK_TYPE(src_type_of(src.scalar_type()) >= 0, name, " has dtype ", dtype_name(src.scalar_type()),
                       "; expected torch.float32, torch.float16 or torch.bfloat16");
    }
  }
  TORCH_CHECK_TYPE(key.scalar_type() == value.scalar_type(), "key (", dtype_name(key.scalar_type()), ") and value (",
                   dtype_name(value.scalar_type()), ") must share a dtype");
  if (fp8) {
    check_scale("k_scale", k_scale, heads, key_cache);
    check_scale("v_scale", v_scale, heads, key_cache);
    plan.src_type = src_type_of(key.scalar_type());
  }
  PagedArgs& a = plan.args;
  a.sides = 2;
  a.index = slot_mapping.data_ptr();
  a.index_type = index_type_of(slot_mapping);
  a.index_stride = slot_mapping.stride(0);
  a.n = n;
  a.num_slots = num_blocks * block_size;
  a.block_size = block_size;
  const int64_t src_elem = key.element_size(), dst_elem = key_cache.element_size();
  std::vector<int64_t> src_vals, dst_vals;  // what the source / cache side of a chunk must divide
  int64_t head_elems[2] = {0, 0};
  int empty_sides = 0;
  for (int s = 0; s < 2; ++s) {
    const Tensor& src = *srcs[s].second;
    const Tensor& cache = *caches[s].second;
    RowShape sr{src.size(1), src.size(2), src.stride(1)};
    RowShape dr{cache.size(2), cache.size(3), cache.stride(2)};
    const std::optional<Tensor>& scale = s == 0 ? k_scale : v_scale;
    const bool per_head = fp8 && scale->numel() > 1;
    // A row held densely by both sides is one long head, unless each head has its own scale.
    if (!per_head) collapse_dense(sr, dr);
    Side& d = a.side[s];
    d = make_side(src, src.stride(0), sr, cache, cache.stride(0), cache.stride(1), dr, src_elem, dst_elem);
    if (fp8) {
      d.scale = scale->data_ptr<float>();
      d.scale_stride = per_head ? scale->stride(0) : 0;
      d.scale_count = static_cast<int32_t>(scale->numel());
    }
    head_elems[s] = sr.head_elems;
    if (sr.heads * sr.head_elems == 0) ++empty_sides;
    src_vals.insert(src_vals.end(), {addr(src), d.src_row, sr.head_elems * src_elem});
    dst_vals.insert(dst_vals.end(), {addr(cache), d.dst_block, d.dst_token, sr.head_elems * dst_elem});
    if (sr.heads > 1) {
      src_vals.push_back(d.src_head);
      dst_vals.push_back(d.dst_head);
    }
  }
  if (fp8) {
    // Wide chunks: 16 source bytes (8 half-width or 4 float32 elements) read, as many bytes written.
    const int64_t wide = 16 / src_elem;
    const bool wide_ok = cap >= 16 && widest(src_vals, 16) >= 16 && widest(dst_vals, 16) >= wide;
    plan.width = wide_ok ? static_cast<int>(wide) : 1;
    const int64_t chunk_elems[2] = {head_elems[0], head_elems[1]};
    finish_chunks(a, chunk_elems, plan.width);  // heads counted in elements: chunks = elems / width
  } else {
    std::vector<int64_t> values = src_vals;
    values.insert(values.end(), dst_vals.begin(), dst_vals.end());
    plan.width = widest(values, cap);
    const int64_t head_bytes[2] = {head_elems[0] * src_elem, head_elems[1] * src_elem};
    finish_chunks(a, head_bytes, plan.width);
  }
  a.dense = a.side[0].heads <= 1 && a.side[1].heads <= 1;
  plan.empty = n == 0 || empty_sides == 2;
  return plan;
}

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, const Tensor& key_cache,
                             const Tensor& value_cache, const Tensor& slot_mapping, c10::string_view kv_cache_dtype,
                             const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale,
                             int64_t max_vec, bool pdl, int64_t validate, const std::optional<Tensor>& verdict) {
  PagedPlan plan = plan_paged(key, value, key_cache, value_cache, slot_mapping, std::string(kv_cache_dtype), k_scale,
                              v_scale, max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(key_cache.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(key_cache);
  plan.args.check =
      plan_check(validate, slot_mapping, plan.args.n, plan.args.num_slots, true, 1, plan.args.pdl, stream, verdict,
                 kvo_cuda::kPagedRowsFamily);
  if (plan.fmt == kvo_cuda::kFp8None) {
    check_launch("reshape_and_cache_flash", kvo_cuda::launch_paged_copy(plan.args, plan.width, stream));
  } else {
    check_launch("reshape_and_cache_flash",
                 kvo_cuda::launch_paged_fp8(plan.args, plan.src_type, plan.fmt, plan.width, stream));
  }
}

std::string paged_plan(const Tensor& key, const Tensor& value, const Tensor& key_cache, const Tensor& value_cache,
                       const Tensor& slot_mapping, c10::string_view kv_cache_dtype,
                       const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale, int64_t max_vec) {
  PagedPlan plan = plan_paged(key, value, key_cache, value_cache, slot_mapping, std::string(kv_cache_dtype), k_scale,
                              v_scale, max_vec);
  return (plan.fmt == kvo_cuda::kFp8None ? "copy vec=" : "fp8 elems=") + std::to_string(plan.width) +
         " heads=" + std::to_string(plan.args.side[0].heads) + "/" + std::to_string(plan.args.side[1].heads) +
         (plan.args.dense ? " dense" : "") + (plan.empty ? " (nothing to write)" : "");
}

}  // namespace kvo_bind
