// set_mla_kv_buffer: argument checks and the launch plan (TMA bulk or direct copies) of the MLA
// latent write (bind.h).

#include <c10/cuda/CUDAGuard.h>

#include "bind.h"

namespace kvo_bind {

// ================================================================ set_mla_kv_buffer

struct MlaPlan {
  MlaArgs args{};
  bool tma = false;
  int width = 1;
  bool empty = false;
};

// [N, w] or [N, 1, w] -> (row stride, width), last dim contiguous.
std::pair<int64_t, int64_t> mla_rows(const char* name, const Tensor& t, const char* what) {
  TORCH_CHECK_VALUE(t.dim() == 2 || (t.dim() == 3 && t.size(1) == 1), name, " must be ", what, ", got shape ",
                    shape_str(t.sizes()));
  TORCH_CHECK_VALUE(t.stride(-1) == 1 || t.size(-1) <= 1, name, " has strides ", shape_str(t.strides()),
                    "; its last dimension must be contiguous");
  return {t.size(0) > 0 ? t.stride(0) : 0, t.size(-1)};
}

MlaPlan plan_mla(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                 const std::string& path, int64_t max_vec) {
  const int cap = check_max_vec(max_vec);
  TORCH_CHECK_VALUE(path == "auto" || path == "tma" || path == "direct", "path='", path,
                    "' is not 'auto', 'tma' or 'direct'");
  check_device("set_mla_kv_buffer",
               {{"kv_buffer", &kv_buffer}, {"loc", &loc}, {"cache_k_nope", &nope}, {"cache_k_rope", &rope}});
  check_index("loc", loc);
  const auto [dst_row, width] = mla_rows("kv_buffer", kv_buffer, "[S, W] or [S, 1, W]");
  const int64_t n = loc.size(0);
  const std::pair<const char*, const Tensor*> parts[2] = {{"cache_k_nope", &nope}, {"cache_k_rope", &rope}};
  for (const auto& [name, t] : parts) {
    TORCH_CHECK_TYPE(t->scalar_type() == kv_buffer.scalar_type(), name, " has dtype ", dtype_name(t->scalar_type()),
                     " but kv_buffer has dtype ", dtype_name(kv_buffer.scalar_type()));
    TORCH_CHECK_VALUE((t->dim() == 2 || (t->dim() == 3 && t->size(1) == 1)) && t->size(0) == n, name,
                      " has shape ", shape_str(t->sizes()), "; expected [", n, ", width] (one row per loc entry)");
  }
  const auto [nope_row, nope_w] = mla_rows("cache_k_nope", nope, "[N, nope] or [N, 1, nope]");
  const auto [rope_row, rope_w] = mla_rows("cache_k_rope", rope, "[N, rope] or [N, 1, rope]");
  TORCH_CHECK_VALUE(width >= nope_w + rope_w, "kv_buffer rows have ", width, " elements, fewer than nope (", nope_w,
                    ") + rope (", rope_w, ") = ", nope_w + rope_w);
  check_writable("kv_buffer", kv_buffer);
  const int64_t elem = kv_buffer.element_size();
  MlaPlan plan;
  MlaArgs& a = plan.args;
  a.nope = static_cast<const unsigned char*>(nope.data_ptr());
  a.nope_row = nope_row * elem;
  a.nope_bytes = nope_w * elem;
  a.rope = static_cast<const unsigned char*>(rope.data_ptr());
  a.rope_row = rope_row * elem;
  a.rope_bytes = rope_w * elem;
  a.dst = static_cast<unsigned char*>(kv_buffer.data_ptr());
  a.dst_row = dst_row * elem;
  a.index = loc.data_ptr();
  a.index_type = index_type_of(loc);
  a.index_stride = loc.stride(0);
  a.n = n;
  a.num_slots = kv_buffer.size(0);
  const int64_t row_bytes = a.nope_bytes + a.rope_bytes;
  plan.empty = n == 0 || row_bytes == 0;
  // Sources: what the loads into shared memory (TMA) or registers (direct) need.
  const std::vector<int64_t> src_values{addr(nope), a.nope_row, a.nope_bytes, addr(rope), a.rope_row, a.rope_bytes};
  const bool tma_ok = row_bytes > 0 && row_bytes % 16 == 0 && addr(kv_buffer) % 16 == 0 && a.dst_row % 16 == 0 &&
                      row_bytes <= kvo_cuda::kMlaMaxTmaRowBytes;
  if (path == "tma") {
    TORCH_CHECK_VALUE(tma_ok, "path='tma': the bulk copy needs row bytes (", row_bytes,
                      ") a multiple of 16 and at most ", kvo_cuda::kMlaMaxTmaRowBytes,
                      ", and kv_buffer's address and row stride (", a.dst_row, " bytes) 16-byte aligned");
  }
  std::vector<int64_t> direct_values = src_values;
  direct_values.insert(direct_values.end(), {addr(kv_buffer), a.dst_row});
  const int direct_width = widest(direct_values, cap);
  // auto: the direct path wherever it moves vectors as wide as max_vec allows (at 16 bytes 2-3%
  // faster than the bulk copy on the H100 once each warp prefetches its row, docs/benchmarks.md);
  // else the bulk copy, whose stores stay whole-row copies whatever the sources' alignment.
  plan.tma = path == "tma" || (path == "auto" && direct_width < cap && tma_ok);
  plan.width = plan.tma ? widest(src_values, cap) : direct_width;
  return plan;
}

void set_mla_kv_buffer(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                       c10::string_view path, int64_t max_vec, bool pdl, int64_t validate,
                       const std::optional<Tensor>& verdict) {
  MlaPlan plan = plan_mla(kv_buffer, loc, nope, rope, std::string(path), max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(kv_buffer.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(kv_buffer);
  // The direct path with 16-byte vectors checks an index that one pass of a resident grid holds
  // inside its own grid (mla_checked.cu); a longer one with a check grid first; an index checked
  // beforehand not at all (its verdict is read).
  const int64_t row_bytes = plan.args.nope_bytes + plan.args.rope_bytes;
  const bool in_grid = !verdict.has_value() && !plan.tma && plan.width == 16 &&
                       kvo_cuda::launch_tuning().mla_check_in_grid != 0 &&
                       plan.args.n <= kvo_cuda::mla_checked_rows(row_bytes);
  plan.args.check =
      plan_check(validate, loc, plan.args.n, plan.args.num_slots, false, 0, plan.args.pdl, stream, verdict,
                 kvo_cuda::kMlaDirectFamily, in_grid);
  cudaError_t err;
  if (plan.args.check.mode == 3) err = kvo_cuda::launch_mla_checked(plan.args, stream);
  else if (plan.tma) err = kvo_cuda::launch_mla_tma(plan.args, plan.width, stream);
  else err = kvo_cuda::launch_mla_direct(plan.args, plan.width, stream);
  check_launch("set_mla_kv_buffer", err);
}

std::string mla_plan(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                     c10::string_view path, int64_t max_vec) {
  MlaPlan plan = plan_mla(kv_buffer, loc, nope, rope, std::string(path), max_vec);
  return (plan.tma ? "tma load=" : "direct vec=") + std::to_string(plan.width) +
         (plan.empty ? " (nothing to write)" : "");
}

}  // namespace kvo_bind
