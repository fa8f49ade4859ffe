// What every op of kv_oracle_cpu shares (declared in kv_cpu.h): the argument checks, the ISA
// selection, the slot checks under a padding policy, the copy routines and their plan, and the fp8
// arguments (formats, scales, the Quantizer's choice of conversion functions, so fp8.h's kernels
// are instantiated in this file only).

#include <ATen/MemoryOverlap.h>

#include <atomic>
#include <cmath>
#include <cstdlib>

#include "kv_cpu.h"

#if KVO_X86
#include <cpuid.h>
#endif

namespace kvo {

// ================================================================ argument checks

void check_cpu(const char* name, const Tensor& t) {
  TORCH_CHECK_VALUE(t.device().is_cpu(), cat(name, " is on ", t.device().str(),
                    "; the kv_oracle_cpu kernels take CPU tensors"));
}

void check_writable(const char* name, const Tensor& t) {
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

int current_isa() {
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

Padding parse_padding(const std::string& text) {
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

void check_index(const char* name, const Tensor& index) {
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

void check_slots(const char* name, const Tensor& index, int64_t num_slots, const Padding& pad) {
  if (index.scalar_type() == at::kLong)
    check_slots_typed(name, index.data_ptr<int64_t>(), index.stride(0), index.size(0), num_slots, pad);
  else
    check_slots_typed(name, index.data_ptr<int32_t>(), index.stride(0), index.size(0), num_slots, pad);
}

// ================================================================ row copies

void copy_memcpy(char* d, const char* s, int64_t n) { std::memcpy(d, s, n); }

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

CopyPlan::CopyPlan(int64_t bytes_written, int isa) {
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

// ================================================================ fp8 arguments

int parse_format(const std::string& name, const char* arg, bool vllm_names) {
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

std::vector<Scale> read_scale(const char* name, const std::optional<Tensor>& maybe, int64_t heads) {
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

Quantizer::Quantizer(int fmt_, at::ScalarType src, int64_t bytes_written)
    : fmt(fmt_), src_type(src_type_of(src)), isa(current_isa()), plan(bytes_written, isa) {
  src_size = src_type == kF32 ? 4 : 2;
  for (int mode : {kMul, kDiv, kRecip}) runs[mode] = pick_quant_run(isa, fmt, src_type, mode);
  strided = pick_quant_strided(fmt);
}

}  // namespace kvo
