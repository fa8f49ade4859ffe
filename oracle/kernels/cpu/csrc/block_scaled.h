// Block-scaled formats, one head row at a time: MXFP8 (e4m3fn / e5m2 elements, blocks of 32 sharing
// an E8M0 scale byte) and NVFP4 (e2m1 elements packed two per byte, blocks of 16 sharing an e4m3fn
// scale byte, one float32 global scale), bit for bit with oracle/reference/block_scaled.py's default
// presets ("ocp_mx_v1", "nvfp4_ref"); the arithmetic is spelled out in docs/semantics.md ("Block-scaled formats").
//
// A row function reads D contiguous source elements (float32, float16 or bfloat16), writes the
// codes (D bytes for MX, D / 2 for NVFP4) contiguously and one scale byte per block into a
// contiguous buffer; the caller places the scales (linear or swizzled layout, block.cpp, whose two
// ops are declared at the end of this file).
//
// Three implementations of each, chosen at run time like fp8.h's: scalar (the definition), AVX2
// (whole blocks in vectors of 8, a partial last block scalar) and AVX-512 (one block per one or two
// vectors, masked tails). Both do the same float32 operations in
// the same order, so they agree bit for bit; no FMA is formed (there is no a * b + c to contract).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kv_cpu.h"  // fp8.h, and the types of the op declarations below

namespace kvo {

enum BlockFormat : int { kMxE4M3 = 0, kMxE5M2 = 1, kNvfp4 = 2 };

inline int block_len(int fmt) { return fmt == kNvfp4 ? 16 : 32; }
inline int64_t blocks_of(int fmt, int64_t dim) { return (dim + block_len(fmt) - 1) / block_len(fmt); }
inline int64_t code_bytes(int fmt, int64_t dim) { return fmt == kNvfp4 ? dim / 2 : dim; }

// What a row needs besides its data: NVFP4's global scale gs and fl32(1 / gs) (MX ignores both).
struct BlockParams {
  float gs = 1.0f, rgs = 1.0f;
};

using BlockRowFn = void (*)(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim, const BlockParams& p);

// ---------------------------------------------------------------- shared scalar pieces

static inline uint32_t f32_bits(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  return u;
}

static inline float bits_f32(uint32_t u) {
  float v;
  std::memcpy(&v, &u, 4);
  return v;
}

// E of an MX block from its finite amax (>= 0): floor(log2(amax)) from the float32 bit fields
// (exact, subnormals included, no log2), minus emax_elem, clamped to [-127, 127]; 0 -> -127.
static inline int mx_exponent(float amax, int emax) {
  const uint32_t u = f32_bits(amax) & 0x7FFFFFFFu;
  if (u == 0) return -127;
  const int field = int(u >> 23);
  const int floor_log2 = field ? field - 127 : (31 - __builtin_clz(u)) - 149;
  return std::clamp(floor_log2 - emax, -127, 127);
}

// 2**-E as a float32 (exact: a normal power of two for every E in [-126, 127], 2**-127 subnormal).
static inline float mx_factor(int e) {
  const int biased = 127 - e;
  return bits_f32(biased >= 1 ? uint32_t(biased) << 23 : 1u << (22 + biased));
}

template <int F> struct MxElem;
template <> struct MxElem<kMxE4M3> { static constexpr int FP8 = kE4M3FN, EMAX = 8; };
template <> struct MxElem<kMxE5M2> { static constexpr int FP8 = kE5M2, EMAX = 15; };

constexpr float kSixth = 1.0f / 6.0f;  // fl32(1/6) = 0.1666666716337204, as the reference rounds it

// The value of a non-negative e4m3fn code (0..0x7E): m * 2^-9 for subnormals, else (8 + m) * 2^(e-10).
static inline float e4m3_value(uint32_t code) {
  const uint32_t e = code >> 3, m = code & 7u;
  return e ? bits_f32(((e + 120u) << 23) | (m << 20)) : float(m) * 0x1p-9f;
}

// NVFP4's block scale: the e4m3fn byte of sf = fl32(gs * fl32(amax * fl32(1/6))) (saturating RNE:
// >= 448 and inf -> 0x7E) and the multiplier out = fl32(1 / fl32(sfq * fl32(1 / gs))), 0 when sfq is 0.
static inline uint8_t nvfp4_scale(float amax, const BlockParams& p, float* out) {
  const float sf = p.gs * (amax * kSixth);
  const uint8_t byte = fp8_scalar<kE4M3FN>(sf);  // sf >= 0 and never NaN (amax ignores NaN)
  const float sfq = e4m3_value(byte);
  *out = sfq == 0.0f ? 0.0f : 1.0f / (sfq * p.rgs);
  return byte;
}

// e2m1 code of q, round to nearest even, saturating at +-6 (inf too); NaN -> 7; the sign bit of q
// (so -0 -> 8) otherwise. The thresholds are the midpoints between neighbouring values, strict
// where the lower neighbour is the even code (0.25, 1.25, 2.5, 5), inclusive where the upper one is.
static inline uint8_t e2m1_code(float q) {
  if (q != q) return 7;
  const float a = std::fabs(q);
  const uint8_t code = uint8_t((a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) +
                               (a >= 3.5f) + (a > 5.0f));
  return uint8_t(code | ((f32_bits(q) >> 28) & 8u));
}

// ---------------------------------------------------------------- scalar rows

template <int F, int S>
static void mx_row_scalar(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim, const BlockParams&) {
  using E = MxElem<F>;
  for (int64_t b0 = 0, blk = 0; b0 < dim; b0 += 32, ++blk) {
    const int64_t n = std::min<int64_t>(32, dim - b0);
    float amax = 0.0f;
    bool nonfinite = false;
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(load_scalar(src, b0 + i, S));
      if (a < INFINITY) amax = std::max(amax, a);  // finite elements only; NaN fails the test
      else nonfinite = true;
    }
    const int e = mx_exponent(amax, E::EMAX);
    scales[blk] = nonfinite ? uint8_t(0xFF) : uint8_t(e + 127);
    const float factor = mx_factor(e);
    for (int64_t i = 0; i < n; ++i) codes[b0 + i] = fp8_scalar<E::FP8>(load_scalar(src, b0 + i, S) * factor);
  }
}

template <int S>
static void nvfp4_row_scalar(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim, const BlockParams& p) {
  for (int64_t b0 = 0, blk = 0; b0 < dim; b0 += 16, ++blk) {
    const int64_t n = std::min<int64_t>(16, dim - b0);  // even: dim is
    float amax = 0.0f;
    for (int64_t i = 0; i < n; ++i) {
      const float a = std::fabs(load_scalar(src, b0 + i, S));
      if (!(a != a)) amax = std::max(amax, a);  // NaN ignored, inf counts
    }
    float out;
    scales[blk] = nvfp4_scale(amax, p, &out);
    for (int64_t i = 0; i < n; i += 2) {
      const uint8_t lo = e2m1_code(load_scalar(src, b0 + i, S) * out);
      const uint8_t hi = e2m1_code(load_scalar(src, b0 + i + 1, S) * out);
      codes[(b0 + i) / 2] = uint8_t(lo | (hi << 4));
    }
  }
}

#if KVO_X86
// ---------------------------------------------------------------- AVX2 rows

KVO_AVX2 static inline float hmax8_avx2(__m256 v) {
  __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  h = _mm_max_ps(h, _mm_movehl_ps(h, h));
  return _mm_cvtss_f32(_mm_max_ss(h, _mm_shuffle_ps(h, h, 1)));
}

// Whole blocks of 32 as four vectors of 8; a partial last block goes to the scalar row.
template <int F, int S>
KVO_AVX2 static void mx_row_avx2(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim, const BlockParams& p) {
  using E = MxElem<F>;
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  const __m256 inf = _mm256_set1_ps(INFINITY);
  int64_t b0 = 0, blk = 0;
  for (; b0 + 32 <= dim; b0 += 32, ++blk) {
    __m256 x[4];
    __m256 m = _mm256_setzero_ps();
    int finite = 0xFF;
    for (int j = 0; j < 4; ++j) {
      x[j] = load8_avx2<S>(s + (b0 + 8 * j) * kSize);
      const __m256 a = _mm256_and_ps(x[j], abs_mask);
      const __m256 fin = _mm256_cmp_ps(a, inf, _CMP_LT_OQ);  // NaN and inf fail
      finite &= _mm256_movemask_ps(fin);
      m = _mm256_max_ps(m, _mm256_and_ps(a, fin));
    }
    const int e = mx_exponent(hmax8_avx2(m), E::EMAX);
    scales[blk] = finite == 0xFF ? uint8_t(e + 127) : uint8_t(0xFF);
    const __m256 f = _mm256_set1_ps(mx_factor(e));
    for (int j = 0; j < 4; j += 2) {
      const __m256i ca = fp8_codes_avx2<E::FP8>(_mm256_mul_ps(x[j], f));
      const __m256i cb = fp8_codes_avx2<E::FP8>(_mm256_mul_ps(x[j + 1], f));
      const __m128i wa = _mm_packus_epi32(_mm256_castsi256_si128(ca), _mm256_extracti128_si256(ca, 1));
      const __m128i wb = _mm_packus_epi32(_mm256_castsi256_si128(cb), _mm256_extracti128_si256(cb, 1));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + b0 + 8 * j), _mm_packus_epi16(wa, wb));
    }
  }
  if (b0 < dim) mx_row_scalar<F, S>(codes + b0, scales + blk, s + b0 * kSize, dim - b0, p);
}

// e2m1 codes of 8 floats, as e2m1_code: the count of thresholds below |q| (compares give -1).
KVO_AVX2 static inline __m256i e2m1_codes_avx2(__m256 q) {
  const __m256 a = _mm256_and_ps(q, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF)));
  __m256i code = _mm256_setzero_si256();
#define KVO_E2M1_COUNT(t, op) \
  code = _mm256_sub_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(a, _mm256_set1_ps(t), op)))
  KVO_E2M1_COUNT(0.25f, _CMP_GT_OQ);  // a lambda would lose the function's target attribute
  KVO_E2M1_COUNT(0.75f, _CMP_GE_OQ);
  KVO_E2M1_COUNT(1.25f, _CMP_GT_OQ);
  KVO_E2M1_COUNT(1.75f, _CMP_GE_OQ);
  KVO_E2M1_COUNT(2.5f, _CMP_GT_OQ);
  KVO_E2M1_COUNT(3.5f, _CMP_GE_OQ);
  KVO_E2M1_COUNT(5.0f, _CMP_GT_OQ);
#undef KVO_E2M1_COUNT
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(q), 28), _mm256_set1_epi32(8));
  code = _mm256_or_si256(code, sign);
  return _mm256_blendv_epi8(code, _mm256_set1_epi32(7), _mm256_castps_si256(_mm256_cmp_ps(q, q, _CMP_UNORD_Q)));
}

// Whole blocks of 16 as two vectors of 8; a partial last block goes to the scalar row.
template <int S>
KVO_AVX2 static void nvfp4_row_avx2(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim,
                                    const BlockParams& p) {
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  int64_t b0 = 0, blk = 0;
  for (; b0 + 16 <= dim; b0 += 16, ++blk) {
    const __m256 x0 = load8_avx2<S>(s + b0 * kSize), x1 = load8_avx2<S>(s + (b0 + 8) * kSize);
    const __m256 a0 = _mm256_and_ps(x0, abs_mask), a1 = _mm256_and_ps(x1, abs_mask);
    const __m256 m0 = _mm256_and_ps(a0, _mm256_cmp_ps(a0, a0, _CMP_ORD_Q));  // NaN ignored, inf counts
    const __m256 m1 = _mm256_and_ps(a1, _mm256_cmp_ps(a1, a1, _CMP_ORD_Q));
    float out;
    scales[blk] = nvfp4_scale(hmax8_avx2(_mm256_max_ps(m0, m1)), p, &out);
    const __m256 vo = _mm256_set1_ps(out);
    const __m256i c0 = e2m1_codes_avx2(_mm256_mul_ps(x0, vo)), c1 = e2m1_codes_avx2(_mm256_mul_ps(x1, vo));
    // each 64-bit lane holds codes 2j (low half) and 2j+1 (high half): its low byte becomes the pair
    alignas(32) uint64_t pairs[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs), _mm256_or_si256(c0, _mm256_srli_epi64(c0, 28)));
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs + 4), _mm256_or_si256(c1, _mm256_srli_epi64(c1, 28)));
    for (int j = 0; j < 8; ++j) codes[b0 / 2 + j] = uint8_t(pairs[j]);
  }
  if (b0 < dim) nvfp4_row_scalar<S>(codes + b0 / 2, scales + blk, s + b0 * kSize, dim - b0, p);
}

// ---------------------------------------------------------------- AVX-512 rows

static inline __mmask16 lanes16(int64_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : (n <= 0 ? __mmask16(0) : __mmask16((1u << n) - 1u));
}

template <int F, int S>
KVO_AVX512 static void mx_row_avx512(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim,
                                     const BlockParams&) {
  using E = MxElem<F>;
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  const __m512 inf = _mm512_set1_ps(INFINITY);
  for (int64_t b0 = 0, blk = 0; b0 < dim; b0 += 32, ++blk) {
    const int64_t n = std::min<int64_t>(32, dim - b0);
    const __mmask16 m0 = lanes16(n), m1 = lanes16(n - 16);
    const __m512 x0 = load16_avx512<S>(s + b0 * kSize, m0);  // lanes past the row load as 0
    const __m512 x1 = load16_avx512<S>(s + (b0 + 16) * kSize, m1);
    const __m512 a0 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x0), abs_mask));
    const __m512 a1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x1), abs_mask));
    const __mmask16 f0 = _mm512_cmp_ps_mask(a0, inf, _CMP_LT_OQ), f1 = _mm512_cmp_ps_mask(a1, inf, _CMP_LT_OQ);
    const bool nonfinite = ((m0 & ~f0) | (m1 & ~f1)) & 0xFFFF;
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_maskz_mov_ps(f0, a0), _mm512_maskz_mov_ps(f1, a1)));
    const int e = mx_exponent(amax, E::EMAX);
    scales[blk] = nonfinite ? uint8_t(0xFF) : uint8_t(e + 127);
    const __m512 factor = _mm512_set1_ps(mx_factor(e));
    _mm512_mask_cvtepi32_storeu_epi8(codes + b0, m0, fp8_codes_avx512<E::FP8>(_mm512_mul_ps(x0, factor)));
    if (m1) _mm512_mask_cvtepi32_storeu_epi8(codes + b0 + 16, m1, fp8_codes_avx512<E::FP8>(_mm512_mul_ps(x1, factor)));
  }
}

// e2m1 codes of 16 quotients (one per 32-bit lane), as scalar e2m1_code computes them.
KVO_AVX512 static inline __m512i e2m1_codes_avx512(__m512 q) {
  const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(q), _mm512_set1_epi32(0x7FFFFFFF)));
  const __m512i one = _mm512_set1_epi32(1);
  __m512i code = _mm512_setzero_si512();
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.25f), _CMP_GT_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(0.75f), _CMP_GE_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.25f), _CMP_GT_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(1.75f), _CMP_GE_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(2.5f), _CMP_GT_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(3.5f), _CMP_GE_OQ), code, one);
  code = _mm512_mask_add_epi32(code, _mm512_cmp_ps_mask(a, _mm512_set1_ps(5.0f), _CMP_GT_OQ), code, one);
  const __mmask16 negative = _mm512_movepi32_mask(_mm512_castps_si512(q));  // the sign bit, -0 included
  code = _mm512_mask_or_epi32(code, negative, code, _mm512_set1_epi32(8));
  return _mm512_mask_mov_epi32(code, _mm512_cmp_ps_mask(q, q, _CMP_UNORD_Q), _mm512_set1_epi32(7));
}

template <int S>
KVO_AVX512 static void nvfp4_row_avx512(uint8_t* codes, uint8_t* scales, const void* src, int64_t dim,
                                        const BlockParams& p) {
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  for (int64_t b0 = 0, blk = 0; b0 < dim; b0 += 16, ++blk) {
    const int64_t n = std::min<int64_t>(16, dim - b0);  // even: dim is
    const __mmask16 m = lanes16(n);
    const __m512 x = load16_avx512<S>(s + b0 * kSize, m);  // lanes past the row load as 0
    const __m512 a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), abs_mask));
    const __mmask16 ordered = _mm512_cmp_ps_mask(a, a, _CMP_ORD_Q);  // NaN ignored, inf counts
    const float amax = _mm512_reduce_max_ps(_mm512_maskz_mov_ps(ordered, a));
    float out;
    scales[blk] = nvfp4_scale(amax, p, &out);
    const __m512i c = e2m1_codes_avx512(_mm512_mul_ps(x, _mm512_set1_ps(out)));
    // lane pair (2j, 2j+1) is one 64-bit lane: code[2j] | code[2j+1] << 4 in its low byte
    const __m512i packed = _mm512_or_si512(c, _mm512_srli_epi64(c, 28));
    _mm512_mask_cvtepi64_storeu_epi8(codes + b0 / 2, __mmask8(lanes16(n / 2)), packed);
  }
}
#endif  // KVO_X86

// ---------------------------------------------------------------- dispatch

template <int S>
static BlockRowFn pick_block_row_src(int isa, int fmt) {
#if KVO_X86
  if (isa == kAvx512) {
    if (fmt == kMxE4M3) return &mx_row_avx512<kMxE4M3, S>;
    if (fmt == kMxE5M2) return &mx_row_avx512<kMxE5M2, S>;
    return &nvfp4_row_avx512<S>;
  }
  if (isa == kAvx2) {
    if (fmt == kMxE4M3) return &mx_row_avx2<kMxE4M3, S>;
    if (fmt == kMxE5M2) return &mx_row_avx2<kMxE5M2, S>;
    return &nvfp4_row_avx2<S>;
  }
#endif
  (void)isa;
  if (fmt == kMxE4M3) return &mx_row_scalar<kMxE4M3, S>;
  if (fmt == kMxE5M2) return &mx_row_scalar<kMxE5M2, S>;
  return &nvfp4_row_scalar<S>;
}

// The row function for format fmt, source type src_type (fp8.h's SrcType) and ISA isa.
static inline BlockRowFn pick_block_row(int isa, int fmt, int src_type) {
  switch (src_type) {
    case kF32: return pick_block_row_src<kF32>(isa, fmt);
    case kF16: return pick_block_row_src<kF16>(isa, fmt);
    default: return pick_block_row_src<kBF16>(isa, fmt);
  }
}

// ---------------------------------------------------------------- the ops (block.cpp)

void quantize_block(Tensor codes, Tensor scales, const Tensor& x, std::string fmt_name,
                    const std::optional<Tensor>& global_scale);
void reshape_and_cache_block(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                             Tensor key_scale_cache, Tensor value_scale_cache, const Tensor& slot_mapping,
                             std::string fmt_name, const std::optional<Tensor>& k_global_scale,
                             const std::optional<Tensor>& v_global_scale);

}  // namespace kvo
