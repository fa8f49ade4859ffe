// What the kv_oracle_cpu sources share: error-message helpers and argument checks, the ISA setting,
// slot checks under a padding policy, the row copies (CopyPlan, RowCopy), the fp8 arguments (formats,
// scales, the Quantizer) and the ops' declarations. kv_cpu.cpp registers the ops; common.cpp defines
// what is declared here and not inline; the ops live by family in flat.cpp (store_cache,
// set_mla_kv_buffer), paged.cpp (concat_and_cache_mla, reshape_and_cache_flash) and quantize.cpp
// (quantize_fp8). What runs per row (RowCopy, Index, Padding::skip, Quantizer's call) is inline here.
#pragma once

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fp8.h"
#include "messages.h"

namespace kvo {

using at::Tensor;

// ================================================================ names in messages

using kvo_messages::dtype_name;
using kvo_messages::shape_str;

// Error messages are built by plain string concatenation, numbers through std::to_string and
// snprintf, never through iostreams: where the toolchain links a private static libstdc++ into
// the extension (seen with a custom GCC), formatting a number into an ostream crashes.
inline void append(std::string& out, const char* v) { out += v; }
inline void append(std::string& out, const std::string& v) { out += v; }
inline void append(std::string& out, char v) { out += v; }
inline void append(std::string& out, double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  out += buffer;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
inline void append(std::string& out, T v) { out += std::to_string(v); }

template <typename... Args>
inline std::string cat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

inline bool is_float(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

inline int src_type_of(at::ScalarType t) { return t == at::kFloat ? kF32 : (t == at::kHalf ? kF16 : kBF16); }

// Tensors on the CPU; writable: on the CPU, no two elements sharing memory (common.cpp).
void check_cpu(const char* name, const Tensor& t);
void check_writable(const char* name, const Tensor& t);

// ================================================================ ISA selection

// The ISA the kernels run with (fp8.h's Isa): the CPU's best, capped by KV_ORACLE_CPU_ISA, until
// set_isa chooses one (common.cpp). The ops isa(), detected_isa() and set_isa(name) call these.
int current_isa();
std::string isa_op();
std::string detected_isa_op();
std::string set_isa_op(std::string name);

// ================================================================ indices and padding

struct Padding {
  int mode = 0;  // 0 none, 1 negative (slot < 0 skipped), 2 reserved (slot == reserved skipped)
  int64_t reserved = 0;
  std::string text;

  bool skip(int64_t slot) const { return mode == 1 ? slot < 0 : (mode == 2 && slot == reserved); }
};

Padding parse_padding(const std::string& text);
// A 1-D int32/int64 CPU index.
void check_index(const char* name, const Tensor& index);
// Every slot of `index` in [0, num_slots), or skipped under `pad`; else a ValueError naming the first.
void check_slots(const char* name, const Tensor& index, int64_t num_slots, const Padding& pad);

struct Index {
  const void* ptr;
  int64_t stride;
  bool wide;

  explicit Index(const Tensor& t) : ptr(t.data_ptr()), stride(t.stride(0)), wide(t.scalar_type() == at::kLong) {}

  int64_t operator[](int64_t i) const {
    return wide ? static_cast<const int64_t*>(ptr)[i * stride] : int64_t(static_cast<const int32_t*>(ptr)[i * stride]);
  }
};

// ================================================================ row copies

// Contiguous runs are copied one of three ways:
// - a call that writes at least kStreamBytes (more than the caches keep) uses non-temporal AVX2
//   stores: the destination lines are not read first (no read-for-ownership), so a big scatter
//   moves two bytes per byte copied instead of three (AVX2 because 256-bit streaming stores
//   measured faster than 512-bit ones on Cascade Lake); each worker fences them before it returns;
// - otherwise runs of at least kMovsbBytes use `rep movsb` where the CPU has ERMS (fast strings
//   write whole lines without reading them: 20-30% faster than memcpy for 0.5-4 KiB rows in cache);
// - everything else is memcpy.
static constexpr int64_t kStreamBytes = int64_t(4) << 20;
static constexpr int64_t kMovsbBytes = 512;

using CopyFn = void (*)(char* d, const char* s, int64_t n);

void copy_memcpy(char* d, const char* s, int64_t n);

// How a call copies its runs (see above). The "scalar" ISA setting uses memcpy only.
struct CopyPlan {
  CopyFn fn = &copy_memcpy;
  bool streamed = false;

  CopyPlan(int64_t bytes_written, int isa);  // common.cpp

  void fence() const {
#if KVO_X86
    if (streamed) _mm_sfence();
#endif
  }
};

// The inner layout of one row (a sub-tensor), for source and destination, in bytes, with size-1
// dimensions dropped and mergeable neighbours merged. A row whose innermost dimension is
// contiguous on both sides is copied as runs of `run` bytes (one memcpy for a dense row).
struct RowCopy {
  static constexpr int kMax = 8;
  int nd = 0;  // outer loop dimensions (outermost first), excluding the innermost run
  int64_t size[kMax] = {};
  int64_t src[kMax] = {};
  int64_t dst[kMax] = {};
  int64_t run = 0;  // bytes per contiguous run (0: no element at all)
  int64_t elem = 1;
  bool strided_inner = false;  // innermost dimension not contiguous: element by element
  int64_t inner_n = 0, inner_src = 0, inner_dst = 0;
  bool empty = false;  // a zero-sized dimension: nothing to copy
  CopyFn copy = &copy_memcpy;

  RowCopy(at::IntArrayRef sizes, at::IntArrayRef src_strides, at::IntArrayRef dst_strides, int64_t itemsize) {
    elem = itemsize;
    std::vector<int64_t> sz, ss, ds;
    for (size_t i = 0; i < sizes.size(); ++i) {
      if (sizes[i] == 0) {
        empty = true;
        return;
      }
      if (sizes[i] == 1) continue;
      const int64_t s = src_strides[i] * itemsize, d = dst_strides[i] * itemsize;
      if (!sz.empty() && ss.back() == sizes[i] * s && ds.back() == sizes[i] * d) {
        sz.back() *= sizes[i];
        ss.back() = s, ds.back() = d;
      } else {
        sz.push_back(sizes[i]), ss.push_back(s), ds.push_back(d);
      }
    }
    if (sz.empty()) {  // a single element
      run = itemsize;
      return;
    }
    TORCH_CHECK_VALUE(int(sz.size()) <= kMax + 1, cat("rows with more than ", kMax + 1, " strided dimensions are not supported"));
    if (ss.back() == itemsize && ds.back() == itemsize) {
      run = sz.back() * itemsize;
    } else {
      strided_inner = true;
      inner_n = sz.back(), inner_src = ss.back(), inner_dst = ds.back();
    }
    sz.pop_back(), ss.pop_back(), ds.pop_back();
    nd = int(sz.size());
    for (int i = 0; i < nd; ++i) size[i] = sz[i], src[i] = ss[i], dst[i] = ds[i];
  }

  int64_t bytes() const {
    if (empty) return 0;
    int64_t n = strided_inner ? inner_n * elem : run;
    for (int i = 0; i < nd; ++i) n *= size[i];
    return n;
  }

  RowCopy& with(const CopyPlan& plan) {
    copy = plan.fn;
    return *this;
  }

  void leaf(char* d, const char* s) const {
    if (!strided_inner) {
      copy(d, s, run);
      return;
    }
    switch (elem) {
      case 1:
        for (int64_t i = 0; i < inner_n; ++i) d[i * inner_dst] = s[i * inner_src];
        break;
      case 2:
        for (int64_t i = 0; i < inner_n; ++i)
          *reinterpret_cast<uint16_t*>(d + i * inner_dst) = *reinterpret_cast<const uint16_t*>(s + i * inner_src);
        break;
      case 4:
        for (int64_t i = 0; i < inner_n; ++i)
          *reinterpret_cast<uint32_t*>(d + i * inner_dst) = *reinterpret_cast<const uint32_t*>(s + i * inner_src);
        break;
      default:
        for (int64_t i = 0; i < inner_n; ++i) std::memcpy(d + i * inner_dst, s + i * inner_src, elem);
    }
  }

  void copy_dim(int dim, char* d, const char* s) const {
    if (dim == nd) return leaf(d, s);
    for (int64_t i = 0; i < size[dim]; ++i) copy_dim(dim + 1, d + i * dst[dim], s + i * src[dim]);
  }

  void operator()(char* d, const char* s) const {
    if (empty) return;
    if (nd == 0) return leaf(d, s);
    copy_dim(0, d, s);
  }
};

// Work below this many bytes (read + written) per task is not worth waking a second thread for.
static constexpr int64_t kTaskBytes = 256 * 1024;

template <typename F>
inline void parallel_rows(int64_t n, int64_t bytes_per_row, const F& f) {
  if (n <= 0) return;
  const int64_t grain = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(bytes_per_row, 1));
  at::parallel_for(0, n, grain, f);
}

inline char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// ================================================================ fp8 arguments

// The fp8 format named by `name` (fp8.h's Fp8Format); with vllm_names also 'fp8', 'fp8_e4m3',
// 'fp8_e5m2' and 'auto' (-1: no conversion). A ValueError naming `arg` otherwise.
int parse_format(const std::string& name, const char* arg, bool vllm_names);

// A scale in float32 held as what to do with it (fp8.h's ScaleMode): x * factor when that is exact
// (scale 1, or a power of two whose reciprocal is a normal float); x / factor through the checked
// reciprocal when both s and 1/s are normal floats with full significands (at least 17
// significant bits, e.g. 0.0123); plain x / factor otherwise. Short significands make x / s or
// x * (1/s) exact short numbers for many 8- and 11-bit sources (s = 0.05: 1/s rounds to 20;
// s = 3/128: every source whose significand is a multiple of 3), which land on fp8 ties so often
// that the check would send most vectors to the division anyway.
struct Scale {
  float factor;
  int mode;
};

// Checks a float32 scale tensor of shape (), [1] or [heads] (per head when heads > 0) and returns
// one Scale per head (or one).
std::vector<Scale> read_scale(const char* name, const std::optional<Tensor>& maybe, int64_t heads);

// Quantizes n elements (source stride `src_stride` elements, destination stride `dst_stride`
// bytes) with one scale: the vector path for contiguous runs, the scalar one otherwise.
// A call that writes at least kStreamBytes of codes converts each run into a small buffer (it stays
// in L1) and streams that out with non-temporal stores, as the copies do.
struct Quantizer {
  static constexpr int64_t kChunk = 2048;
  int fmt, src_type, isa;
  int64_t src_size;
  QuantRunFn runs[3];  // by ScaleMode
  QuantStridedFn strided;
  CopyPlan plan;

  // Picks the conversion functions for the ISA (common.cpp: fp8.h's kernels are instantiated there only).
  Quantizer(int fmt_, at::ScalarType src, int64_t bytes_written);

  void operator()(uint8_t* dst, int64_t dst_stride, const char* src, int64_t src_stride, int64_t n,
                  const Scale& s) const {
    if (dst_stride != 1 || src_stride != 1)
      return strided(dst, dst_stride, src, src_stride, src_type, n, s.factor, s.mode != kMul);
    const QuantRunFn run = runs[s.mode];
    if (!plan.streamed || n < 256) return run(dst, src, n, s.factor);
    alignas(64) uint8_t buffer[kChunk];
    for (int64_t i = 0; i < n; i += kChunk) {
      const int64_t len = std::min(kChunk, n - i);
      run(buffer, src + i * src_size, len, s.factor);
      plan.fn(reinterpret_cast<char*>(dst + i), reinterpret_cast<const char*>(buffer), len);
    }
  }

  void fence() const { plan.fence(); }
};

// ================================================================ the ops

// flat.cpp
void store_cache(const Tensor& k, const Tensor& v, Tensor k_cache, Tensor v_cache, const Tensor& loc,
                 std::string padding);
void set_mla_kv_buffer(Tensor kv_buffer, const Tensor& loc, const Tensor& cache_k_nope, const Tensor& cache_k_rope,
                       std::string padding);
// paged.cpp
void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, Tensor kv_cache, const Tensor& slot_mapping,
                          std::string kv_cache_dtype, const std::optional<Tensor>& scale, std::string padding);
void reshape_and_cache_flash(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                             const Tensor& slot_mapping, std::string kv_cache_dtype,
                             const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale,
                             std::string padding);
// quantize.cpp
void quantize_fp8(Tensor out, const Tensor& x, const Tensor& scale, std::string fmt_name);

}  // namespace kvo
