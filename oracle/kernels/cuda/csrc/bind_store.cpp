// store_cache: argument checks and the launch plan of the flat K/V scatter (bind.h).

#include <c10/cuda/CUDAGuard.h>

#include "bind.h"

namespace kvo_bind {

// ================================================================ store_cache

struct FlatPair {
  const char* src_name;
  const Tensor* src;
  const char* cache_name;
  const Tensor* cache;
};

void check_flat_rows(const FlatPair& p, int64_t n) {
  TORCH_CHECK_TYPE(p.src->scalar_type() == p.cache->scalar_type(), p.src_name, " has dtype ",
                   dtype_name(p.src->scalar_type()), " but ", p.cache_name, " has dtype ",
                   dtype_name(p.cache->scalar_type()));
  std::vector<int64_t> want{n};
  for (int64_t d = 1; d < p.cache->dim(); ++d) want.push_back(p.cache->size(d));
  TORCH_CHECK_VALUE(p.src->sizes().vec() == want, p.src_name, " has shape ", shape_str(p.src->sizes()),
                    "; expected ", shape_str(want));
}

struct StorePlan {
  PagedArgs args{};
  int vec = 16;
  bool empty = false;
};

StorePlan plan_store(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                     const Tensor& loc, int64_t max_vec) {
  const int cap = check_max_vec(max_vec);
  check_device("store_cache", {{"k_cache", &k_cache}, {"v_cache", &v_cache}, {"k", &k}, {"v", &v}, {"loc", &loc}});
  check_index("loc", loc);
  TORCH_CHECK_VALUE(k_cache.dim() >= 1 && v_cache.dim() >= 1, "k_cache and v_cache must have a slot dimension");
  const int64_t num_slots = k_cache.size(0), n = loc.size(0);
  TORCH_CHECK_VALUE(v_cache.size(0) == num_slots, "v_cache has ", v_cache.size(0), " slots but k_cache has ",
                    num_slots);
  const FlatPair pairs[2] = {{"k", &k, "k_cache", &k_cache}, {"v", &v, "v_cache", &v_cache}};
  for (const auto& p : pairs) check_flat_rows(p, n);
  StorePlan plan;
  PagedArgs& a = plan.args;
  a.sides = 2;
  a.index = loc.data_ptr();
  a.index_type = index_type_of(loc);
  a.index_stride = loc.stride(0);
  a.n = n;
  a.num_slots = num_slots;
  a.block_size = 1;
  std::vector<int64_t> values;  // everything the chunk width must divide
  int64_t head_bytes[2] = {0, 0};
  int empty_sides = 0;
  for (int s = 0; s < 2; ++s) {
    const Tensor& src = *pairs[s].src;
    const Tensor& cache = *pairs[s].cache;
    check_writable(pairs[s].cache_name, cache);
    RowShape sr = row_shape(pairs[s].src_name, src, 1);
    RowShape dr = row_shape(pairs[s].cache_name, cache, 1);
    collapse_dense(sr, dr);
    const int64_t elem = cache.element_size();
    Side& d = a.side[s];
    d = make_side(src, src.stride(0), sr, cache, cache.stride(0), 0, dr, elem, elem);
    head_bytes[s] = sr.head_elems * elem;
    if (sr.heads * sr.head_elems == 0) ++empty_sides;
    values.insert(values.end(), {addr(src), addr(cache), d.src_row, d.dst_block, head_bytes[s]});
    if (sr.heads > 1) values.insert(values.end(), {d.src_head, d.dst_head});
  }
  plan.vec = widest(values, cap);
  finish_chunks(a, head_bytes, plan.vec);
  a.dense = a.side[0].heads <= 1 && a.side[1].heads <= 1;
  plan.empty = n == 0 || empty_sides == 2;
  return plan;
}

void store_cache(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache, const Tensor& loc,
                 int64_t max_vec, bool pdl, int64_t validate, const std::optional<Tensor>& verdict) {
  StorePlan plan = plan_store(k, v, k_cache, v_cache, loc, max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(k_cache.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(k_cache);
  plan.args.check = plan_check(validate, loc, plan.args.n, plan.args.num_slots, false, 0, plan.args.pdl, stream,
                               verdict, kvo_cuda::kPagedRowsFamily);
  check_launch("store_cache", kvo_cuda::launch_paged_copy(plan.args, plan.vec, stream));
}

std::string store_plan(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& loc, int64_t max_vec) {
  StorePlan plan = plan_store(k, v, k_cache, v_cache, loc, max_vec);
  return "copy vec=" + std::to_string(plan.vec) + " heads=" + std::to_string(plan.args.side[0].heads) + "/" +
         std::to_string(plan.args.side[1].heads) + (plan.args.dense ? " dense" : "") +
         (plan.empty ? " (nothing to write)" : "");
}

}  // namespace kvo_bind
