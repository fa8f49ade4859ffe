// kv-oracle's Hopper KV-cache writers as torch custom ops, namespace kv_oracle_cuda.
//
// This file is the only one that sees torch: it validates every argument it can see on the host
// (devices, dtypes, shapes, strides) before anything is launched; then it reduces each tensor to
// raw pointers and int64 byte strides, picks the vector width every pointer and stride allows, and
// calls a launcher from the .cu files (kv_cuda.h) on the current stream. Slots are never read on
// the host (that would synchronize, and break CUDA-graph capture): with validate=1, outside graph
// capture, the kernels check them on the device (SlotCheck: in every block for a short index, else
// a check grid whose verdict the writer reads after a PDL wait), store nothing if one is illegal,
// and leave the error in the device's mailbox (set_error_mailbox; oracle/kernels/_deferred.py raises it). The kernels
// skip any slot outside the cache in any case, so nothing is ever written outside a cache.
//
// Ops (all return nothing and write their caches in place):
//   store_cache(k, v, k_cache, v_cache, loc, max_vec=16, pdl=False, validate=1)
//   set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, path="auto", max_vec=16, pdl=False,
//                     validate=1)
//   reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
//                           k_scale, v_scale, max_vec=16, pdl=False, validate=1)
//   set_error_mailbox(mailbox, device): the pinned int64[8] validating calls on `device` report to.
//   mla_plan(...) / store_plan(...) / paged_plan(...) -> str: the path and width a call would take.
// max_vec (16, 8, 4, 2 or 1) caps the vector width, so tests can run the narrow paths on aligned
// data; path forces "tma" or "direct" for set_mla_kv_buffer; pdl launches the kernel with
// programmatic dependent launch (kv_cuda.h says what that overlaps).

#include <ATen/ATen.h>
#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kv_cuda.h"
#include "messages.h"

namespace kvo_bind {

using at::Tensor;
using kvo_cuda::MlaArgs;
using kvo_cuda::PagedArgs;
using kvo_cuda::Side;

// ================================================================ messages

using kvo_messages::dtype_name;
using kvo_messages::shape_str;

// ================================================================ common checks

// Every tensor on one CUDA device (the first one's).
void check_device(const char* op, const std::vector<std::pair<const char*, const Tensor*>>& tensors) {
  const Tensor& first = *tensors.front().second;
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK_VALUE(t->is_cuda(), op, ": ", name, " is on ", t->device().str(),
                      "; the kv_oracle_cuda kernels take CUDA tensors");
    TORCH_CHECK_VALUE(t->device() == first.device(), op, ": ", name, " is on ", t->device().str(), " but ",
                      tensors.front().first, " is on ", first.device().str());
  }
}

void check_index(const char* name, const Tensor& index) {
  TORCH_CHECK_TYPE(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong, name, " has dtype ",
                   dtype_name(index.scalar_type()), "; expected torch.int32 or torch.int64");
  TORCH_CHECK_VALUE(index.dim() == 1, name, " must be 1-D, got shape ", shape_str(index.sizes()));
}

void check_writable(const char* name, const Tensor& cache) {
  TORCH_CHECK_VALUE(at::has_internal_overlap(cache) != at::MemOverlap::Yes, name, " has strides ",
                    shape_str(cache.strides()), " that make elements overlap; it cannot be written");
}

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
}

// ================================================================ the device-side slot check

constexpr int kMaxDevices = 64;
int64_t* g_mailbox[kMaxDevices] = {nullptr};  // pinned host memory, owned by oracle.kernels._deferred

void set_error_mailbox(const Tensor& mailbox, int64_t device) {
  TORCH_CHECK_VALUE(device >= 0 && device < kMaxDevices, "device=", device, " is out of range [0, ", kMaxDevices, ")");
  TORCH_CHECK_VALUE(mailbox.device().is_cpu() && mailbox.is_pinned() && mailbox.scalar_type() == at::kLong &&
                        mailbox.numel() >= 8 && mailbox.is_contiguous(),
                    "mailbox must be a pinned contiguous int64 CPU tensor of at least 8 words");
  g_mailbox[device] = mailbox.data_ptr<int64_t>();
}

constexpr int64_t kFusedCheckMax = 256;  // entries every block scans itself; above, a check grid
constexpr int64_t kCheckChunk = 1024;    // entries per check block at least: one round of 4 loads a thread
constexpr int kMaxCheckBlocks = 64;      // check blocks at most (a writer block reads one word each)

// Plans the device-side slot check of a validating call (validate != 0) and, for an index longer
// than kFusedCheckMax, launches the check grid and sets `pdl` so the writer waits for it. `verdict`
// keeps the check grid's output alive (the caching allocator reuses it in stream order).
kvo_cuda::SlotCheck plan_check(int64_t validate, const Tensor& index, int64_t n, int64_t num_slots,
                               bool negative_ok, int32_t arg_code, int32_t& pdl, Tensor& verdict,
                               cudaStream_t stream) {
  kvo_cuda::SlotCheck c{};
  TORCH_CHECK_VALUE(validate == 0 || validate == 1, "validate=", validate, " must be 0 or 1");
  // Not while a CUDA graph is being captured: the replayed writer then costs what it did before
  // the check existed (a decode graph's slots are its engine's); the kernels still drop any slot
  // outside the cache.
  if (validate == 0 || n == 0 || capturing()) return c;
  const int device = index.device().index();
  TORCH_CHECK(device >= 0 && device < kMaxDevices && g_mailbox[device] != nullptr,
              "no error mailbox for cuda:", device, "; call set_error_mailbox first (oracle.kernels.cuda does)");
  c.mailbox = g_mailbox[device];
  c.negative_ok = negative_ok ? 1 : 0;
  c.arg_code = arg_code;
  c.pad_code = negative_ok ? 1 : 0;
  if (n <= kFusedCheckMax) {
    c.mode = 1;
    return c;
  }
  const int64_t want = (n + kCheckChunk - 1) / kCheckChunk;
  const int blocks = static_cast<int>(want < kMaxCheckBlocks ? want : kMaxCheckBlocks);
  const int64_t chunk = (n + blocks - 1) / blocks;
  verdict = at::empty({blocks}, index.options().dtype(at::kLong));
  check_launch("slot check", kvo_cuda::launch_slot_check(
      index.data_ptr(), index.scalar_type() == at::kLong ? kvo_cuda::kIndexInt64 : kvo_cuda::kIndexInt32,
      index.stride(0), n, num_slots, c.negative_ok, verdict.data_ptr<int64_t>(), blocks, chunk, pdl != 0, stream));
  c.mode = 2;
  c.verdict = verdict.data_ptr<int64_t>();
  c.verdict_count = blocks;
  pdl = 1;  // the writer waits for the check grid (griddepcontrol.wait) before it reads the verdict
  return c;
}


int check_max_vec(int64_t max_vec) {
  TORCH_CHECK_VALUE(max_vec == 16 || max_vec == 8 || max_vec == 4 || max_vec == 2 || max_vec == 1,
                    "max_vec=", max_vec, " must be 16, 8, 4, 2 or 1");
  return static_cast<int>(max_vec);
}

// Largest power of two <= cap dividing every value (0 divides by anything).
int widest(const std::vector<int64_t>& values, int cap) {
  int w = cap;
  for (int64_t v : values) {
    const uint64_t u = static_cast<uint64_t>(v);
    while (w > 1 && (u % static_cast<uint64_t>(w)) != 0) w >>= 1;
  }
  return w;
}

int64_t addr(const Tensor& t) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())); }

int32_t log2_exact(int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int32_t s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

cudaStream_t stream_of(const Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// ================================================================ rows as [heads, head]

// The row of a tensor (every dim after the first `lead` dims) as [heads, head_elems]: the last dim
// contiguous, the dims between it and the lead collapsed into one head dim with one stride.
struct RowShape {
  int64_t heads = 1;
  int64_t head_elems = 1;
  int64_t head_stride = 0;  // elements
};

RowShape row_shape(const char* name, const Tensor& t, int64_t lead) {
  RowShape r;
  const int64_t dims = t.dim();
  if (dims <= lead) return r;  // rows of one element
  r.head_elems = t.size(-1);
  TORCH_CHECK_VALUE(t.stride(-1) == 1 || t.size(-1) <= 1, name, " has strides ", shape_str(t.strides()),
                    "; its last dimension must be contiguous");
  r.head_stride = r.head_elems;
  int64_t expect = -1;  // the stride the next outer non-unit head dim must have
  for (int64_t d = dims - 2; d >= lead; --d) {
    if (t.size(d) == 1) continue;
    if (expect < 0) {
      r.head_stride = t.stride(d);
    } else {
      TORCH_CHECK_VALUE(t.stride(d) == expect, name, " has shape ", shape_str(t.sizes()), " and strides ",
                        shape_str(t.strides()), "; the dims between the first and the last must collapse "
                        "into one strided dim");
    }
    r.heads *= t.size(d);
    expect = t.stride(d) * t.size(d);
  }
  return r;
}

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

// A side of a flat/paged write, in bytes, from row shapes already checked to agree.
Side make_side(const Tensor& src, int64_t src_row, const RowShape& sr, const Tensor& dst, int64_t dst_block,
               int64_t dst_token, const RowShape& dr, int64_t src_elem, int64_t dst_elem) {
  Side s{};
  s.src = static_cast<const unsigned char*>(src.data_ptr());
  s.src_row = src_row * src_elem;
  s.src_head = sr.head_stride * src_elem;
  s.dst = static_cast<unsigned char*>(dst.data_ptr());
  s.dst_block = dst_block * dst_elem;
  s.dst_token = dst_token * dst_elem;
  s.dst_head = dr.head_stride * dst_elem;
  s.heads = sr.heads;
  s.head_chunks = sr.head_elems;  // in elements until the width is chosen
  s.head_shift = -1;
  s.scale = nullptr;
  s.scale_stride = 0;
  return s;
}

// Merge the heads of a row into one when both source and cache hold the row densely.
void collapse_dense(RowShape& sr, RowShape& dr) {
  if (sr.heads > 1 && sr.head_stride == sr.head_elems && dr.head_stride == dr.head_elems) {
    sr.head_elems *= sr.heads;
    dr.head_elems = sr.head_elems;
    sr.heads = dr.heads = 1;
    sr.head_stride = dr.head_stride = sr.head_elems;
  }
}

// Chunks per head once the width is chosen: head bytes / chunk bytes (a power of two dividing them).
void finish_chunks(PagedArgs& a, const int64_t head_bytes[2], int64_t chunk_bytes) {
  for (int s = 0; s < a.sides; ++s) {
    a.side[s].head_chunks = head_bytes[s] / chunk_bytes;
    a.side[s].head_shift = log2_exact(a.side[s].head_chunks);
  }
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
  a.index_type = loc.scalar_type() == at::kLong ? kvo_cuda::kIndexInt64 : kvo_cuda::kIndexInt32;
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
                 int64_t max_vec, bool pdl, int64_t validate) {
  StorePlan plan = plan_store(k, v, k_cache, v_cache, loc, max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(k_cache.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(k_cache);
  Tensor verdict;
  plan.args.check = plan_check(validate, loc, plan.args.n, plan.args.num_slots, false, 0, plan.args.pdl, verdict,
                               stream);
  check_launch("store_cache", kvo_cuda::launch_paged_copy(plan.args, plan.vec, stream));
}

std::string store_plan(const Tensor& k, const Tensor& v, const Tensor& k_cache, const Tensor& v_cache,
                       const Tensor& loc, int64_t max_vec) {
  StorePlan plan = plan_store(k, v, k_cache, v_cache, loc, max_vec);
  return "copy vec=" + std::to_string(plan.vec) + " heads=" + std::to_string(plan.args.side[0].heads) + "/" +
         std::to_string(plan.args.side[1].heads) + (plan.args.dense ? " dense" : "") +
         (plan.empty ? " (nothing to write)" : "");
}

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
  a.index_type = loc.scalar_type() == at::kLong ? kvo_cuda::kIndexInt64 : kvo_cuda::kIndexInt32;
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
                       c10::string_view path, int64_t max_vec, bool pdl, int64_t validate) {
  MlaPlan plan = plan_mla(kv_buffer, loc, nope, rope, std::string(path), max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(kv_buffer.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(kv_buffer);
  Tensor verdict;
  plan.args.check = plan_check(validate, loc, plan.args.n, plan.args.num_slots, false, 0, plan.args.pdl, verdict,
                               stream);
  check_launch("set_mla_kv_buffer", plan.tma ? kvo_cuda::launch_mla_tma(plan.args, plan.width, stream)
                                             : kvo_cuda::launch_mla_direct(plan.args, plan.width, stream));
}

std::string mla_plan(const Tensor& kv_buffer, const Tensor& loc, const Tensor& nope, const Tensor& rope,
                     c10::string_view path, int64_t max_vec) {
  MlaPlan plan = plan_mla(kv_buffer, loc, nope, rope, std::string(path), max_vec);
  return (plan.tma ? "tma load=" : "direct vec=") + std::to_string(plan.width) +
         (plan.empty ? " (nothing to write)" : "");
}

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
  a.index_type = slot_mapping.scalar_type() == at::kLong ? kvo_cuda::kIndexInt64 : kvo_cuda::kIndexInt32;
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
                             int64_t max_vec, bool pdl, int64_t validate) {
  PagedPlan plan = plan_paged(key, value, key_cache, value_cache, slot_mapping, std::string(kv_cache_dtype), k_scale,
                              v_scale, max_vec);
  plan.args.pdl = pdl;
  c10::cuda::CUDAGuard guard(key_cache.device());
  if (plan.empty) return;
  const cudaStream_t stream = stream_of(key_cache);
  Tensor verdict;
  plan.args.check = plan_check(validate, slot_mapping, plan.args.n, plan.args.num_slots, true, 1, plan.args.pdl,
                               verdict, stream);
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

// Sets one launch-tuning knob (kvo_cuda::LaunchTuning) and returns its previous value.
int64_t tune(c10::string_view knob, int64_t value) {
  kvo_cuda::LaunchTuning& t = kvo_cuda::launch_tuning();
  const std::string name(knob);
  struct Knob { const char* name; int* field; int64_t low, high; bool power_of_two; };
  const Knob knobs[] = {{"mla_rows", &t.mla_rows, 1, 4, true}, {"mla_warps", &t.mla_warps, 1, 8, true},
                        {"mla_grid", &t.mla_grid, -1, 64, false}, {"copy_grid", &t.copy_grid, -1, 64, false},
                        {"fp8_grid", &t.fp8_grid, -1, 64, false},
                        {"mla_evict_first", &t.mla_evict_first, 0, 3, false},
                        {"mla_prefetch", &t.mla_prefetch, 0, 2, false},
                        {"copy_prefetch", &t.copy_prefetch, 0, 2, false},
                        {"fp8_prefetch", &t.fp8_prefetch, 0, 2, false}};
  for (const Knob& k : knobs) {
    if (name != k.name) continue;
    TORCH_CHECK_VALUE(value >= k.low && value <= k.high && (!k.power_of_two || (value & (value - 1)) == 0),
                      "value=", value, " is out of range for knob '", name, "' (", k.low, "..", k.high,
                      k.power_of_two ? ", a power of two)" : ")");
    const int64_t old = *k.field;
    *k.field = static_cast<int>(value);
    return old;
  }
  TORCH_CHECK_VALUE(false, "knob='", name, "' is not one of mla_rows, mla_warps, mla_grid, copy_grid, fp8_grid, "
                    "mla_evict_first, mla_prefetch, copy_prefetch, fp8_prefetch");
  return 0;
}

}  // namespace kvo_bind

TORCH_LIBRARY(kv_oracle_cuda, m) {
  m.set_python_module("oracle.kernels.cuda._fake");
  m.def("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, int max_vec=16, "
        "bool pdl=False, int validate=1) -> ()");
  m.def("set_mla_kv_buffer(Tensor(a!) kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, "
        "str path=\"auto\", int max_vec=16, bool pdl=False, int validate=1) -> ()");
  m.def("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, int max_vec=16, "
        "bool pdl=False, int validate=1) -> ()");
  m.def("set_error_mailbox(Tensor mailbox, int device) -> ()", &kvo_bind::set_error_mailbox);
  m.def("store_plan(Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor loc, int max_vec=16) -> str");
  m.def("mla_plan(Tensor kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, str path=\"auto\", "
        "int max_vec=16) -> str");
  m.def("paged_plan(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, int max_vec=16) -> str");
  m.def("tune(str knob, int value) -> int", &kvo_bind::tune);
}

TORCH_LIBRARY_IMPL(kv_oracle_cuda, CUDA, m) {
  m.impl("store_cache", &kvo_bind::store_cache);
  m.impl("set_mla_kv_buffer", &kvo_bind::set_mla_kv_buffer);
  m.impl("reshape_and_cache_flash", &kvo_bind::reshape_and_cache_flash);
  m.impl("store_plan", &kvo_bind::store_plan);
  m.impl("mla_plan", &kvo_bind::mla_plan);
  m.impl("paged_plan", &kvo_bind::paged_plan);
}

// The writers are not differentiable: an explicit Autograd kernel (torch's not-implemented
// fallback, which redispatches below autograd) says so.
TORCH_LIBRARY_IMPL(kv_oracle_cuda, Autograd, m) {
  for (const char* op : {"store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
