// kv-oracle's CPU KV-cache writers, registered as torch custom ops in namespace kv_oracle_cpu.
//
// Every op validates all of its arguments (dtypes, shapes, strides, every slot under the padding
// policy) before it writes a byte, so a rejected call leaves every cache unchanged. Offsets are
// int64 byte offsets computed from each tensor's own strides (caches past 2^31 elements work).
// Rows are spread over at::parallel_for; contiguous runs are copied with rep movsb, memcpy or
// non-temporal AVX2 stores (see CopyPlan), strided ones element by element. fp8 conversion goes
// through fp8.h, whose ISA (AVX-512, AVX2 or scalar) is chosen at run time.

#include <ATen/MemoryOverlap.h>
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "fp8.h"
#include "messages.h"

#if KVO_X86
#include <cpuid.h>
#endif

namespace kvo {

using at::Tensor;

// ================================================================ names in messages

using kvo_messages::dtype_name;
using kvo_messages::shape_str;

// Error messages are built by plain string concatenation, numbers through std::to_string and
// snprintf, never through iostreams: where the toolchain links a private static libstdc++ into
// the extension (seen with a custom GCC), formatting a number into an ostream crashes.
static void append(std::string& out, const char* v) { out += v; }
static void append(std::string& out, const std::string& v) { out += v; }
static void append(std::string& out, char v) { out += v; }
static void append(std::string& out, double v) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%g", v);
  out += buffer;
}
template <typename T, typename = std::enable_if_t<std::is_integral_v<T>>>
static void append(std::string& out, T v) { out += std::to_string(v); }

template <typename... Args>
static std::string cat(const Args&... args) {
  std::string out;
  (append(out, args), ...);
  return out;
}

static bool is_float(at::ScalarType t) { return t == at::kFloat || t == at::kHalf || t == at::kBFloat16; }

static int src_type_of(at::ScalarType t) { return t == at::kFloat ? kF32 : (t == at::kHalf ? kF16 : kBF16); }

static void check_cpu(const char* name, const Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), cat(name, " is on ", t.device().str(),
                    "; the kv_oracle_cpu kernels take CPU tensors"));
}

static void check_writable(const char* name, const Tensor& t) {
  check_cpu(name, t);
  TORCH_CHECK_VALUE(at::has_internal_overlap(t) != at::MemOverlap::Yes, cat(name, " has strides ",
                    shape_str(t.strides()), " for shape ", shape_str(t.sizes()),
                    ": several of its elements share memory, so it cannot be written"));
}

// ================================================================ ISA selection

static const char* kIsaNames[] = {"scalar", "avx2", "avx512"};

static int detect_isa() {
#if KVO_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
    return kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") && __builtin_cpu_supports("fma"))
    return kAvx2;
#endif
  return kScalar;
}

static int parse_isa(const std::string& name) {
  if (name == "auto") return detect_isa();
  for (int i = 0; i < 3; ++i)
    if (name == kIsaNames[i]) return i;
  TORCH_CHECK_VALUE(false, cat("isa=", name, " is not one of auto, scalar, avx2, avx512"));
  return kScalar;
}

static std::atomic<int> g_isa{-1};

static int current_isa() {
  int isa = g_isa.load(std::memory_order_relaxed);
  if (isa >= 0) return isa;
  isa = detect_isa();
  // KV_ORACLE_CPU_ISA caps the path (e.g. "scalar" to test the fallback); never above the CPU's.
  if (const char* env = std::getenv("KV_ORACLE_CPU_ISA")) {
    const std::string want(env);
    for (int i = 0; i < 3; ++i)
      if (want == kIsaNames[i]) isa = std::min(isa, i);
  }
  g_isa.store(isa, std::memory_order_relaxed);
  return isa;
}

std::string isa_op() { return kIsaNames[current_isa()]; }

std::string detected_isa_op() { return kIsaNames[detect_isa()]; }

std::string set_isa_op(std::string name) {
  const int want = parse_isa(name);
  const int have = detect_isa();
  TORCH_CHECK_VALUE(want <= have, cat("isa=", name, " is not supported by this CPU (it supports up to ",
                    kIsaNames[have], ")"));
  const int before = current_isa();
  g_isa.store(want, std::memory_order_relaxed);
  return kIsaNames[before];
}

// ================================================================ indices and padding

struct Padding {
  int mode = 0;  // 0 none, 1 negative (slot < 0 skipped), 2 reserved (slot == reserved skipped)
  int64_t reserved = 0;
  std::string text;

  bool skip(int64_t slot) const { return mode == 1 ? slot < 0 : (mode == 2 && slot == reserved); }
};

static Padding parse_padding(const std::string& text) {
  Padding p;
  p.text = text;
  if (text == "none") return p;
  if (text == "negative") {
    p.mode = 1;
    return p;
  }
  const std::string prefix = "reserved:";
  if (text.compare(0, prefix.size(), prefix) == 0 && text.size() > prefix.size() && text.size() < prefix.size() + 19 &&
      text.find_first_not_of("0123456789", prefix.size()) == std::string::npos) {
    p.mode = 2;
    p.reserved = std::stoll(text.substr(prefix.size()));
    return p;
  }
  TORCH_CHECK_VALUE(false, cat("padding='", text, "' is not a padding policy; expected 'none', 'negative' or 'reserved:K'"));
  return p;
}

static void check_index(const char* name, const Tensor& index) {
  check_cpu(name, index);
  TORCH_CHECK_TYPE(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong, cat(name, " has dtype ",
                   dtype_name(index.scalar_type()), "; expected torch.int32 or torch.int64"));
  TORCH_CHECK_VALUE(index.dim() == 1, cat(name, " must be 1-D, got shape ", shape_str(index.sizes())));
}

template <typename I>
static void check_slots_typed(const char* name, const I* p, int64_t stride, int64_t n, int64_t num_slots,
                              const Padding& pad) {
  int64_t lo = 0, hi = -1;
  if (n) {
    lo = hi = int64_t(p[0]);
    if (stride == 1) {
      I l = p[0], h = p[0];
      for (int64_t i = 1; i < n; ++i) {
        l = std::min(l, p[i]);
        h = std::max(h, p[i]);
      }
      lo = l, hi = h;
    } else {
      for (int64_t i = 1; i < n; ++i) {
        const int64_t v = int64_t(p[i * stride]);
        lo = std::min(lo, v), hi = std::max(hi, v);
      }
    }
  }
  const bool negatives_ok = pad.mode == 1;
  if (n == 0 || (hi < num_slots && (negatives_ok || lo >= 0))) return;
  int64_t first = -1, count = 0, value = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = int64_t(p[i * stride]);
    if (v >= num_slots || (!negatives_ok && v < 0)) {
      if (first < 0) first = i, value = v;
      ++count;
    }
  }
  const std::string more =
      count > 1 ? cat(" (", count - 1, " more position", (count > 2 ? "s are" : " is"), " out of range)") : "";
  TORCH_CHECK_VALUE(false, cat(name, "[", first, "] = ", value, " is out of range [0, ", num_slots, ") under padding='",
                    pad.text, "'", (negatives_ok ? " (negative slots are padding)" : ""), more));
}

static void check_slots(const char* name, const Tensor& index, int64_t num_slots, const Padding& pad) {
  if (index.scalar_type() == at::kLong)
    check_slots_typed(name, index.data_ptr<int64_t>(), index.stride(0), index.size(0), num_slots, pad);
  else
    check_slots_typed(name, index.data_ptr<int32_t>(), index.stride(0), index.size(0), num_slots, pad);
}

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

static void copy_memcpy(char* d, const char* s, int64_t n) { std::memcpy(d, s, n); }

#if KVO_X86
static void copy_movsb(char* d, const char* s, int64_t n) {
  if (n < kMovsbBytes) return (void)std::memcpy(d, s, n);
  asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
}

static bool cpu_has_erms() {
  unsigned a, b, c, d;
  return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & (1u << 9));
}
#endif

#if KVO_X86
KVO_AVX2 static void copy_stream_avx2(char* d, const char* s, int64_t n) {
  if (n < 256) return (void)std::memcpy(d, s, n);
  const int64_t head = (-reinterpret_cast<intptr_t>(d)) & 31;
  if (head) std::memcpy(d, s, head), d += head, s += head, n -= head;
  for (; n >= 128; n -= 128, d += 128, s += 128) {
    const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
    const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
    const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + 96), e);
  }
  for (; n >= 32; n -= 32, d += 32, s += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  if (n) std::memcpy(d, s, n);
}
#endif

// How a call copies its runs (see above). The "scalar" ISA setting uses memcpy only.
struct CopyPlan {
  CopyFn fn = &copy_memcpy;
  bool streamed = false;

  CopyPlan(int64_t bytes_written, int isa) {
#if KVO_X86
    static const bool erms = cpu_has_erms();
    if (bytes_written >= kStreamBytes && isa >= kAvx2) {
      fn = &copy_stream_avx2;
      streamed = true;
    } else if (erms && isa >= kAvx2) {
      fn = &copy_movsb;
    }
#endif
    (void)bytes_written, (void)isa;
  }

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
static void parallel_rows(int64_t n, int64_t bytes_per_row, const F& f) {
  if (n <= 0) return;
  const int64_t grain = std::max<int64_t>(1, kTaskBytes / std::max<int64_t>(bytes_per_row, 1));
  at::parallel_for(0, n, grain, f);
}

static char* bytes_of(const Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// ================================================================ fp8 arguments

static int parse_format(const std::string& name, const char* arg, bool vllm_names) {
  if (name == "e4m3fn") return kE4M3FN;
  if (name == "e5m2") return kE5M2;
  if (name == "e4m3fnuz") return kE4M3FNUZ;
  if (name == "e5m2fnuz") return kE5M2FNUZ;
  if (vllm_names) {
    if (name == "fp8" || name == "fp8_e4m3") return kE4M3FN;
    if (name == "fp8_e5m2") return kE5M2;
    if (name == "auto") return -1;
    TORCH_CHECK_VALUE(false, cat(arg, "='", name, "' is not one of 'auto', 'e4m3fn', 'e4m3fnuz', 'e5m2', 'e5m2fnuz', ",
                      "'fp8', 'fp8_e4m3', 'fp8_e5m2'"));
  }
  TORCH_CHECK_VALUE(false, cat(arg, "='", name, "' is not one of 'e4m3fn', 'e4m3fnuz', 'e5m2', 'e5m2fnuz'"));
  return -1;
}

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

static Scale make_scale(float s) {
  uint32_t bits;
  std::memcpy(&bits, &s, 4);
  const uint32_t exponent = (bits >> 23) & 0xFF;
  if ((bits & 0x7FFFFF) == 0 && exponent >= 1 && exponent <= 253) {
    const uint32_t r = (254 - exponent) << 23;  // 1 / 2^(e - 127), exact
    float recip;
    std::memcpy(&recip, &r, 4);
    return {recip, kMul};
  }
  if (s >= 0x1p-125f && s <= 0x1p125f) {
    const float recip = 1.0f / s;
    uint32_t rbits;
    std::memcpy(&rbits, &recip, 4);
    const uint32_t rsig = (rbits & 0x7FFFFF) | 0x800000, ssig = (bits & 0x7FFFFF) | 0x800000;
    if (__builtin_ctz(rsig) <= 7 && __builtin_ctz(ssig) <= 7) return {s, kRecip};
  }
  return {s, kDiv};
}

// Checks a float32 scale tensor of shape (), [1] or [heads] (per head when heads > 0) and returns
// one Scale per head (or one).
static std::vector<Scale> read_scale(const char* name, const std::optional<Tensor>& maybe, int64_t heads) {
  TORCH_CHECK_TYPE(maybe.has_value() && maybe->defined(), cat(name, " must be a float32 tensor, got None"));
  const Tensor& scale = *maybe;
  check_cpu(name, scale);
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, cat(name, " must be a float32 tensor, got ",
                   dtype_name(scale.scalar_type())));
  const int64_t n = scale.numel();
  TORCH_CHECK_VALUE(scale.dim() <= 1 && (n == 1 || (heads > 0 && n == heads)), cat(name, " has shape ",
                    shape_str(scale.sizes()), "; expected [1]",
                    (heads > 0 ? " or [" + std::to_string(heads) + "] (per head)" : std::string())));
  std::vector<Scale> out;
  const float* p = scale.data_ptr<float>();
  const int64_t stride = scale.dim() ? scale.stride(0) : 0;
  for (int64_t i = 0; i < n; ++i) {
    const float s = p[i * stride];
    TORCH_CHECK_VALUE(std::isfinite(s) && s > 0, cat(name, " must be finite and > 0, got ", s,
                      (n > 1 ? " at head " + std::to_string(i) : std::string())));
    out.push_back(make_scale(s));
  }
  return out;
}

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

  Quantizer(int fmt_, at::ScalarType src, int64_t bytes_written)
      : fmt(fmt_), src_type(src_type_of(src)), isa(current_isa()), plan(bytes_written, isa) {
    src_size = src_type == kF32 ? 4 : 2;
    for (int mode : {kMul, kDiv, kRecip}) runs[mode] = pick_quant_run(isa, fmt, src_type, mode);
    strided = pick_quant_strided(fmt);
  }

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

// ================================================================ store_cache

void store_cache(const Tensor& k, const Tensor& v, Tensor k_cache, Tensor v_cache, const Tensor& loc,
                 std::string padding) {
  const Padding pad = parse_padding(padding);
  check_index("loc", loc);
  TORCH_CHECK_VALUE(k_cache.dim() >= 1 && v_cache.dim() >= 1, cat("k_cache and v_cache must have a slot dimension"));
  const int64_t n = loc.size(0), num_slots = k_cache.size(0);
  const struct { const char* name; const Tensor& src; const char* cache_name; const Tensor& cache; } pairs[] = {
      {"k", k, "k_cache", k_cache}, {"v", v, "v_cache", v_cache}};
  for (const auto& p : pairs) {
    check_cpu(p.name, p.src);
    check_writable(p.cache_name, p.cache);
    TORCH_CHECK_TYPE(p.src.scalar_type() == p.cache.scalar_type(), cat(p.name, " has dtype ",
                     dtype_name(p.src.scalar_type()), " but ", p.cache_name, " has dtype ",
                     dtype_name(p.cache.scalar_type())));
    std::vector<int64_t> want{n};
    want.insert(want.end(), p.cache.sizes().begin() + 1, p.cache.sizes().end());
    TORCH_CHECK_VALUE(p.src.sizes().vec() == want, cat(p.name, " has shape ", shape_str(p.src.sizes()), "; expected ",
                      shape_str(want)));
  }
  TORCH_CHECK_VALUE(v_cache.size(0) == num_slots, cat("v_cache has ", v_cache.size(0), " slots but k_cache has ", num_slots));
  check_slots("loc", loc, num_slots, pad);
  if (n == 0) return;

  RowCopy kcopy(k.sizes().slice(1), k.strides().slice(1), k_cache.strides().slice(1), k.element_size());
  RowCopy vcopy(v.sizes().slice(1), v.strides().slice(1), v_cache.strides().slice(1), v.element_size());
  const CopyPlan plan(n * (kcopy.bytes() + vcopy.bytes()), current_isa());
  kcopy.with(plan), vcopy.with(plan);
  const Index index(loc);
  char *kc = bytes_of(k_cache), *vc = bytes_of(v_cache);
  const char *ks = bytes_of(k), *vs = bytes_of(v);
  const int64_t kc0 = k_cache.stride(0) * k_cache.element_size(), vc0 = v_cache.stride(0) * v_cache.element_size();
  const int64_t ks0 = k.stride(0) * k.element_size(), vs0 = v.stride(0) * v.element_size();
  // Each worker writes its K rows, then its V rows: two streams at a time instead of four
  // (measured a few % faster for scatters that do not fit in the caches).
  parallel_rows(n, 2 * (kcopy.bytes() + vcopy.bytes()), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (!pad.skip(slot)) kcopy(kc + slot * kc0, ks + i * ks0);
    }
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (!pad.skip(slot)) vcopy(vc + slot * vc0, vs + i * vs0);
    }
    plan.fence();
  });
}

// ================================================================ set_mla_kv_buffer

// [S, W] or [S, 1, W] as a 2-D view.
static Tensor as_rows(const char* name, const Tensor& t, const char* what) {
  if (t.dim() == 3 && t.size(1) == 1) return t.select(1, 0);
  TORCH_CHECK_VALUE(t.dim() == 2, cat(name, " must be ", what, ", got shape ", shape_str(t.sizes())));
  return t;
}

void set_mla_kv_buffer(Tensor kv_buffer, const Tensor& loc, const Tensor& cache_k_nope, const Tensor& cache_k_rope,
                       std::string padding) {
  const Padding pad = parse_padding(padding);
  check_index("loc", loc);
  check_writable("kv_buffer", kv_buffer);
  const Tensor buffer = as_rows("kv_buffer", kv_buffer, "2-D [S, W] (or [S, 1, W])");
  const int64_t n = loc.size(0);
  const struct { const char* name; const Tensor& t; } srcs[] = {{"cache_k_nope", cache_k_nope}, {"cache_k_rope", cache_k_rope}};
  for (const auto& s : srcs) {
    check_cpu(s.name, s.t);
    TORCH_CHECK_TYPE(s.t.scalar_type() == buffer.scalar_type(), cat(s.name, " has dtype ", dtype_name(s.t.scalar_type()),
                     " but kv_buffer has dtype ", dtype_name(buffer.scalar_type())));
    TORCH_CHECK_VALUE((s.t.dim() == 2 || (s.t.dim() == 3 && s.t.size(1) == 1)) && s.t.size(0) == n, cat(s.name,
                      " has shape ", shape_str(s.t.sizes()), "; expected [", n, ", width]"));
  }
  const Tensor nope = as_rows("cache_k_nope", cache_k_nope, "2-D"), rope = as_rows("cache_k_rope", cache_k_rope, "2-D");
  const int64_t nw = nope.size(1), rw = rope.size(1);
  TORCH_CHECK_VALUE(buffer.size(1) >= nw + rw, cat("kv_buffer rows have ", buffer.size(1),
                    " elements, fewer than nope (", nw, ") + rope (", rw, ") = ", nw + rw));
  check_slots("loc", loc, buffer.size(0), pad);
  if (n == 0) return;

  const int64_t es = buffer.element_size();
  RowCopy ncopy(nope.sizes().slice(1), nope.strides().slice(1), buffer.strides().slice(1), es);
  RowCopy rcopy(rope.sizes().slice(1), rope.strides().slice(1), buffer.strides().slice(1), es);
  const CopyPlan plan(n * (nw + rw) * es, current_isa());
  ncopy.with(plan), rcopy.with(plan);
  const Index index(loc);
  char* base = bytes_of(buffer);
  const int64_t b0 = buffer.stride(0) * es, rope_at = nw * buffer.stride(1) * es;
  const char *ns = bytes_of(nope), *rs = bytes_of(rope);
  const int64_t n0 = nope.stride(0) * es, r0 = rope.stride(0) * es;
  parallel_rows(n, 2 * (nw + rw) * es, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;
      char* row = base + slot * b0;
      ncopy(row, ns + i * n0);
      rcopy(row + rope_at, rs + i * r0);
    }
    plan.fence();
  });
}

// ================================================================ concat_and_cache_mla

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, Tensor kv_cache, const Tensor& slot_mapping,
                          std::string kv_cache_dtype, const std::optional<Tensor>& scale, std::string padding) {
  const Padding pad = parse_padding(padding);
  check_writable("kv_cache", kv_cache);
  TORCH_CHECK_VALUE(kv_cache.dim() == 3, cat("kv_cache must be 3-D [num_blocks, block_size, entry], got ",
                    shape_str(kv_cache.sizes())));
  const int64_t num_blocks = kv_cache.size(0), block_size = kv_cache.size(1), width = kv_cache.size(2);
  check_cpu("slot_mapping", slot_mapping);
  TORCH_CHECK_TYPE((slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong) &&
                       slot_mapping.dim() == 1, cat("slot_mapping must be 1-D int32/int64, got ", dtype_name(slot_mapping.scalar_type()), " ",
                   shape_str(slot_mapping.sizes())));
  const int64_t n = slot_mapping.size(0);
  check_cpu("kv_c", kv_c);
  check_cpu("k_pe", k_pe);
  TORCH_CHECK_TYPE(kv_c.scalar_type() == k_pe.scalar_type() && is_float(kv_c.scalar_type()), cat("kv_c (",
                   dtype_name(kv_c.scalar_type()), ") and k_pe (", dtype_name(k_pe.scalar_type()),
                   ") must share a float dtype"));
  for (const auto& s : {std::make_pair("kv_c", &kv_c), std::make_pair("k_pe", &k_pe)}) {
    TORCH_CHECK_VALUE(s.second->dim() == 2 && s.second->size(0) >= n, cat(s.first, " has shape ",
                      shape_str(s.second->sizes()), "; expected [>= ", n, ", width]"));
  }
  const int64_t rank = kv_c.size(1), rope = k_pe.size(1);
  TORCH_CHECK_VALUE(width == rank + rope, cat("kv_cache entries have ", width, " elements; expected kv_c + k_pe = ",
                    rank + rope));
  const int fmt = parse_format(kv_cache_dtype, "kv_cache_dtype", true);
  std::vector<Scale> scales;
  if (fmt < 0) {
    TORCH_CHECK_TYPE(kv_cache.scalar_type() == kv_c.scalar_type(), cat("kv_cache has dtype ",
                     dtype_name(kv_cache.scalar_type()), " but kv_c has dtype ", dtype_name(kv_c.scalar_type())));
  } else {
    TORCH_CHECK_TYPE(kv_cache.scalar_type() == at::kByte, cat("kv_cache has dtype ", dtype_name(kv_cache.scalar_type()),
                     "; kv_cache_dtype ", kv_cache_dtype, " needs uint8"));
    scales = read_scale("scale", scale, 0);
  }
  check_slots("slot_mapping", slot_mapping, num_blocks * block_size, pad);
  if (n == 0) return;

  const Index index(slot_mapping);
  char* base = bytes_of(kv_cache);
  const int64_t ce = kv_cache.element_size();
  const int64_t c0 = kv_cache.stride(0) * ce, c1 = kv_cache.stride(1) * ce, c2 = kv_cache.stride(2);
  const int64_t se = kv_c.element_size();
  const char *cs = bytes_of(kv_c), *ps = bytes_of(k_pe);
  const int64_t cs0 = kv_c.stride(0) * se, ps0 = k_pe.stride(0) * se;
  const int64_t row_bytes = (rank + rope) * (se + ce);
  if (fmt < 0) {
    RowCopy ccopy(kv_c.sizes().slice(1), kv_c.strides().slice(1), kv_cache.strides().slice(2), se);
    RowCopy pcopy(k_pe.sizes().slice(1), k_pe.strides().slice(1), kv_cache.strides().slice(2), se);
    const CopyPlan plan(n * (rank + rope) * se, current_isa());
    ccopy.with(plan), pcopy.with(plan);
    const int64_t pe_at = rank * c2 * ce;
    parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t slot = index[i];
        if (pad.skip(slot)) continue;
        char* row = base + (slot / block_size) * c0 + (slot % block_size) * c1;
        ccopy(row, cs + i * cs0);
        pcopy(row + pe_at, ps + i * ps0);
      }
      plan.fence();
    });
    return;
  }
  const Quantizer quant(fmt, kv_c.scalar_type(), n * (rank + rope));
  const Scale s = scales[0];
  const int64_t cs1 = kv_c.stride(1), ps1 = k_pe.stride(1);
  parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;
      uint8_t* row = reinterpret_cast<uint8_t*>(base + (slot / block_size) * c0 + (slot % block_size) * c1);
      quant(row, c2, cs + i * cs0, cs1, rank, s);
      quant(row + rank * c2, c2, ps + i * ps0, ps1, rope, s);
    }
    quant.fence();
  });
}

// ================================================================ reshape_and_cache_flash

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                             const Tensor& slot_mapping, std::string kv_cache_dtype,
                             const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale,
                             std::string padding) {
  const Padding pad = parse_padding(padding);
  const int fmt = parse_format(kv_cache_dtype, "kv_cache_dtype", true);
  const struct { const char* name; const Tensor& cache; } caches[] = {{"key_cache", key_cache}, {"value_cache", value_cache}};
  for (const auto& c : caches) {
    check_writable(c.name, c.cache);
    TORCH_CHECK_VALUE(c.cache.dim() == 4, cat(c.name, " must be 4-D [num_blocks, block_size, H, D], got ",
                      shape_str(c.cache.sizes())));
    TORCH_CHECK_VALUE(c.cache.stride(3) == 1 || c.cache.size(3) <= 1, cat(c.name, " has strides ",
                      shape_str(c.cache.strides()), "; its last dimension must be contiguous"));
    TORCH_CHECK_TYPE(fmt < 0 || c.cache.scalar_type() == at::kByte, cat(c.name, " has dtype ",
                     dtype_name(c.cache.scalar_type()), "; kv_cache_dtype ", kv_cache_dtype, " stores uint8 codes"));
  }
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), heads = key_cache.size(2);
  TORCH_CHECK_VALUE(value_cache.size(0) == num_blocks && value_cache.size(1) == block_size && value_cache.size(2) == heads, cat("value_cache has shape ", shape_str(value_cache.sizes()), "; key_cache ", shape_str(key_cache.sizes())));
  check_cpu("slot_mapping", slot_mapping);
  TORCH_CHECK_TYPE((slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong) &&
                       slot_mapping.dim() == 1, cat("slot_mapping must be 1-D int32/int64, got ", dtype_name(slot_mapping.scalar_type()), " ",
                   shape_str(slot_mapping.sizes())));
  const int64_t n = slot_mapping.size(0);
  const struct { const char* name; const Tensor& src; const char* cache_name; const Tensor& cache; } pairs[] = {
      {"key", key, "key_cache", key_cache}, {"value", value, "value_cache", value_cache}};
  for (const auto& p : pairs) {
    check_cpu(p.name, p.src);
    TORCH_CHECK_VALUE(p.src.dim() == 3 && p.src.size(0) >= n && p.src.size(1) == p.cache.size(2) &&
                          p.src.size(2) == p.cache.size(3), cat(p.name, " has shape ", shape_str(p.src.sizes()), "; expected [>= ", n, ", ", p.cache.size(2),
                      ", ", p.cache.size(3), "] to match ", p.cache_name));
    TORCH_CHECK_TYPE(fmt >= 0 || p.src.scalar_type() == p.cache.scalar_type(), cat(p.name, " has dtype ",
                     dtype_name(p.src.scalar_type()), " but ", p.cache_name, " has dtype ",
                     dtype_name(p.cache.scalar_type())));
    TORCH_CHECK_TYPE(fmt < 0 || is_float(p.src.scalar_type()), cat(p.name, " has dtype ", dtype_name(p.src.scalar_type()),
                     "; expected float32, float16 or bfloat16"));
  }
  std::vector<Scale> kscales, vscales;
  if (fmt >= 0) {
    kscales = read_scale("k_scale", k_scale, heads);
    vscales = read_scale("v_scale", v_scale, heads);
  }
  check_slots("slot_mapping", slot_mapping, num_blocks * block_size, pad);
  if (n == 0) return;

  const Index index(slot_mapping);
  struct Side {
    const char* src;
    int64_t s0, s1, s2;  // source strides: token, head (bytes), dim (elements)
    char* cache;
    int64_t c0, c1, c2;  // cache strides in bytes: block, token, head
    int64_t dim;
  };
  auto side = [&](const Tensor& src, const Tensor& cache) {
    const int64_t se = src.element_size(), ce = cache.element_size();
    return Side{bytes_of(src), src.stride(0) * se, src.stride(1) * se, src.stride(2),
                bytes_of(cache), cache.stride(0) * ce, cache.stride(1) * ce, cache.stride(2) * ce, src.size(2)};
  };
  const Side sides[2] = {side(key, key_cache), side(value, value_cache)};
  const int64_t row_bytes = heads * (key.size(2) + value.size(2)) *
                            (key.element_size() + key_cache.element_size());
  if (fmt < 0) {
    RowCopy copies[2] = {
        RowCopy(key.sizes().slice(1), key.strides().slice(1), key_cache.strides().slice(2), key.element_size()),
        RowCopy(value.sizes().slice(1), value.strides().slice(1), value_cache.strides().slice(2), value.element_size())};
    const CopyPlan plan(n * (copies[0].bytes() + copies[1].bytes()), current_isa());
    copies[0].with(plan), copies[1].with(plan);
    parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
      for (int c = 0; c < 2; ++c) {  // K rows, then V rows (see store_cache)
        const Side& s = sides[c];
        for (int64_t i = begin; i < end; ++i) {
          const int64_t slot = index[i];
          if (pad.skip(slot)) continue;
          copies[c](s.cache + (slot / block_size) * s.c0 + (slot % block_size) * s.c1, s.src + i * s.s0);
        }
      }
      plan.fence();
    });
    return;
  }
  const Quantizer quant(fmt, key.scalar_type(), n * heads * (key.size(2) + value.size(2)));
  const std::vector<Scale>* scales[2] = {&kscales, &vscales};
  parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;
      const int64_t block = slot / block_size, offset = slot % block_size;
      for (int c = 0; c < 2; ++c) {
        const Side& s = sides[c];
        const std::vector<Scale>& sc = *scales[c];
        uint8_t* dst = reinterpret_cast<uint8_t*>(s.cache + block * s.c0 + offset * s.c1);
        const char* src = s.src + i * s.s0;
        // One run over all heads when heads are dense on both sides and the scale is shared.
        if (sc.size() == 1 && s.c2 == s.dim && s.s1 == s.dim * quant.src_size && s.s2 == 1) {
          quant(dst, 1, src, 1, heads * s.dim, sc[0]);
          continue;
        }
        for (int64_t h = 0; h < heads; ++h)
          quant(dst + h * s.c2, 1, src + h * s.s1, s.s2, s.dim, sc[sc.size() == 1 ? 0 : h]);
      }
    }
    quant.fence();
  });
}

// ================================================================ quantize_fp8

void quantize_fp8(Tensor out, const Tensor& x, const Tensor& scale, std::string fmt_name) {
  const int fmt = parse_format(fmt_name, "fmt", false);
  check_cpu("x", x);
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), cat("x has dtype ", dtype_name(x.scalar_type()),
                   "; expected float32, float16 or bfloat16"));
  check_writable("out", out);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kByte, cat("out has dtype ", dtype_name(out.scalar_type()),
                   "; expected torch.uint8 (fp8 codes)"));
  TORCH_CHECK_VALUE(x.dim() == 3 && out.sizes() == x.sizes(), cat("out has shape ", shape_str(out.sizes()), " and x ",
                    shape_str(x.sizes()), "; expected one [N, H, D] shape"));
  const int64_t n = x.size(0), heads = x.size(1), dim = x.size(2);
  const std::vector<Scale> scales = read_scale("scale", scale, heads);
  if (x.numel() == 0) return;

  const Quantizer quant(fmt, x.scalar_type(), x.numel());
  const char* xs = bytes_of(x);
  uint8_t* os = reinterpret_cast<uint8_t*>(out.data_ptr());
  const int64_t xe = x.element_size();
  const int64_t x0 = x.stride(0) * xe, x1 = x.stride(1) * xe, x2 = x.stride(2);
  const int64_t o0 = out.stride(0), o1 = out.stride(1), o2 = out.stride(2);
  const bool dense = scales.size() == 1 && x2 == 1 && o2 == 1 && x1 == dim * xe && o1 == dim;
  parallel_rows(n, heads * dim * (xe + 1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (dense) {
        quant(os + i * o0, 1, xs + i * x0, 1, heads * dim, scales[0]);
        continue;
      }
      for (int64_t h = 0; h < heads; ++h)
        quant(os + i * o0 + h * o1, o2, xs + i * x0 + h * x1, x2, dim, scales[scales.size() == 1 ? 0 : h]);
    }
    quant.fence();
  });
}

}  // namespace kvo

TORCH_LIBRARY(kv_oracle_cpu, m) {
  m.set_python_module("oracle.kernels.cpu._fake");
  m.def("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, "
        "str padding=\"none\") -> ()");
  m.def("set_mla_kv_buffer(Tensor(a!) kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, "
        "str padding=\"none\") -> ()");
  m.def("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor? scale, str padding=\"negative\") -> ()");
  m.def("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, "
        "str padding=\"negative\") -> ()");
  m.def("quantize_fp8(Tensor(a!) out, Tensor x, Tensor scale, str fmt) -> ()");
  m.def("isa() -> str", &kvo::isa_op);
  m.def("detected_isa() -> str", &kvo::detected_isa_op);
  m.def("set_isa(str isa) -> str", &kvo::set_isa_op);
}

TORCH_LIBRARY_IMPL(kv_oracle_cpu, CPU, m) {
  m.impl("store_cache", &kvo::store_cache);
  m.impl("set_mla_kv_buffer", &kvo::set_mla_kv_buffer);
  m.impl("concat_and_cache_mla", &kvo::concat_and_cache_mla);
  m.impl("reshape_and_cache_flash", &kvo::reshape_and_cache_flash);
  m.impl("quantize_fp8", &kvo::quantize_fp8);
}

// The writers are not differentiable. An explicit Autograd kernel (torch's not-implemented
// fallback, which redispatches below autograd) says so, instead of leaving the op to the global
// autograd fallback.
TORCH_LIBRARY_IMPL(kv_oracle_cpu, Autograd, m) {
  for (const char* op : {"store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash",
                         "quantize_fp8"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
