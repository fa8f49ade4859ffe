// float32 -> fp8 codes, bit-exact with the reference's "ocp_satfinite" preset
// (oracle/reference/presets.py): round to nearest, ties to even, from the exact float32 value;
// overflow decided after rounding and saturated to +-max; +-inf to +-max; NaN to 0x7F|sign
// (e4m3fn, e5m2) or 0x80 (fnuz); in the fnuz formats a zero result is 0x00, never 0x80.
//
// Three implementations of one algorithm, chosen at run time (see common.cpp):
//   scalar: integer arithmetic only (also the reference for the two below);
//   AVX2 (+F16C, FMA): 8 lanes; AVX-512 (F, BW, VL, DQ): 16 lanes, masked tails, and a division
//   replaced by a checked reciprocal multiplication where that is exact (scaled_codes_avx512).
// The vector paths round fp8 subnormals with one float32 addition of 2^(24 - bias - mbits),
// whose ulp is the fp8 subnormal quantum, so the float adder's own round-to-nearest-even does the
// rounding. Each function carries its own target attribute, so the file is compiled for plain
// x86-64 and one build runs on any x86-64 CPU.
#pragma once

#include <cstdint>
#include <cstring>

#include <c10/util/Half.h>

#if defined(__x86_64__) || defined(_M_X64)
#define KVO_X86 1
#include <immintrin.h>
#define KVO_AVX2 __attribute__((target("avx2,fma,f16c")))
#define KVO_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#else
#define KVO_X86 0
#endif

namespace kvo {

// Formats, in the order of the kFormat table.
enum Fp8Format : int { kE4M3FN = 0, kE5M2 = 1, kE4M3FNUZ = 2, kE5M2FNUZ = 3 };
enum SrcType : int { kF32 = 0, kF16 = 1, kBF16 = 2 };
// How the scale is applied: x * factor (exact: scale 1 or a power of two), x / factor, or x / factor
// through the reciprocal with an exactness check (AVX-512 only; elsewhere it divides).
enum ScaleMode : int { kMul = 0, kDiv = 1, kRecip = 2 };

template <int F> struct Fmt;
template <> struct Fmt<kE4M3FN> { static constexpr int M = 3, B = 7; static constexpr uint32_t MC = 0x7E; static constexpr bool FNUZ = false; };
template <> struct Fmt<kE5M2> { static constexpr int M = 2, B = 15; static constexpr uint32_t MC = 0x7B; static constexpr bool FNUZ = false; };
template <> struct Fmt<kE4M3FNUZ> { static constexpr int M = 3, B = 8; static constexpr uint32_t MC = 0x7F; static constexpr bool FNUZ = true; };
template <> struct Fmt<kE5M2FNUZ> { static constexpr int M = 2, B = 16; static constexpr uint32_t MC = 0x7F; static constexpr bool FNUZ = true; };

// ---------------------------------------------------------------- scalar

template <int F>
static inline uint8_t fp8_scalar(float value) {
  using P = Fmt<F>;
  uint32_t u;
  std::memcpy(&u, &value, 4);
  const uint32_t mag = u & 0x7FFFFFFFu;
  const uint32_t sign = (u >> 24) & 0x80u;
  if (mag > 0x7F800000u) return P::FNUZ ? 0x80 : static_cast<uint8_t>(sign | 0x7Fu);
  uint32_t code;
  if (mag >= (uint32_t(128 - P::B) << 23)) {  // an fp8 normal (or overflow, inf)
    const uint32_t r = mag + ((1u << (22 - P::M)) - 1u) + ((mag >> (23 - P::M)) & 1u);
    code = (r >> (23 - P::M)) - (uint32_t(127 - P::B) << P::M);
  } else {  // an fp8 subnormal or zero: the quantum is 2^(1 - B - M)
    const int biased = int(mag >> 23);
    const uint32_t significand = (mag & 0x7FFFFFu) | (biased ? 0x800000u : 0u);
    const int shift = 151 - P::B - P::M - (biased ? biased : 1);  // >= 24 - M
    if (shift >= 25) {
      code = 0;  // below half the smallest subnormal (significand < 2^24)
    } else {
      const uint32_t kept = significand >> shift;
      const uint32_t rest = significand & ((1u << shift) - 1u);
      const uint32_t half = 1u << (shift - 1);
      code = kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
    }
  }
  if (code > P::MC) code = P::MC;  // overflow and inf saturate
  if (P::FNUZ && code == 0) return 0;
  return static_cast<uint8_t>(sign | code);
}

static inline float load_scalar(const void* p, int64_t i, int src) {
  if (src == kF32) return static_cast<const float*>(p)[i];
  const uint16_t bits = static_cast<const uint16_t*>(p)[i];
  if (src == kF16) return c10::detail::fp16_ieee_to_fp32_value(bits);
  const uint32_t wide = uint32_t(bits) << 16;
  float out;
  std::memcpy(&out, &wide, 4);
  return out;
}

// One run of n elements; src_stride and dst_stride in elements (the strided fallback).
template <int F>
static void quant_run_scalar(uint8_t* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                             int src_type, int64_t n, float factor, bool divide) {
  for (int64_t i = 0; i < n; ++i) {
    const float x = load_scalar(src, i * src_stride, src_type);
    dst[i * dst_stride] = fp8_scalar<F>(divide ? x / factor : x * factor);
  }
}

#if KVO_X86
// ---------------------------------------------------------------- AVX2

template <int F>
KVO_AVX2 static inline __m256i fp8_codes_avx2(__m256 q) {
  using P = Fmt<F>;
  const __m256i u = _mm256_castps_si256(q);
  const __m256i mag = _mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i sign = _mm256_and_si256(_mm256_srli_epi32(u, 24), _mm256_set1_epi32(0x80));
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(mag, 23 - P::M), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(mag, _mm256_set1_epi32((1 << (22 - P::M)) - 1));
  r = _mm256_add_epi32(r, lsb);
  const __m256i normal = _mm256_sub_epi32(_mm256_srli_epi32(r, 23 - P::M),
                                          _mm256_set1_epi32((127 - P::B) << P::M));
  const __m256 magic = _mm256_castsi256_ps(_mm256_set1_epi32((127 + 24 - P::B - P::M) << 23));
  const __m256i sub = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(mag), magic)), _mm256_castps_si256(magic));
  const __m256i is_normal = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(((128 - P::B) << 23) - 1));
  __m256i code = _mm256_blendv_epi8(sub, normal, is_normal);
  code = _mm256_min_epu32(code, _mm256_set1_epi32(P::MC));
  __m256i out = _mm256_or_si256(code, sign);
  if (P::FNUZ) out = _mm256_andnot_si256(_mm256_cmpeq_epi32(code, _mm256_setzero_si256()), out);
  const __m256i is_nan = _mm256_cmpgt_epi32(mag, _mm256_set1_epi32(0x7F800000));
  const __m256i nan = P::FNUZ ? _mm256_set1_epi32(0x80) : _mm256_or_si256(sign, _mm256_set1_epi32(0x7F));
  return _mm256_blendv_epi8(out, nan, is_nan);
}

template <int S>
KVO_AVX2 static inline __m256 load8_avx2(const void* p) {
  if (S == kF32) return _mm256_loadu_ps(static_cast<const float*>(p));
  const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
  if (S == kF16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

template <int F, int S, bool DIV>
KVO_AVX2 static void quant_run_avx2_impl(uint8_t* dst, const void* src, int64_t n, float factor) {
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m256 vf = _mm256_set1_ps(factor);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 a = load8_avx2<S>(s + i * kSize);
    __m256 b = load8_avx2<S>(s + (i + 8) * kSize);
    a = DIV ? _mm256_div_ps(a, vf) : _mm256_mul_ps(a, vf);
    b = DIV ? _mm256_div_ps(b, vf) : _mm256_mul_ps(b, vf);
    const __m256i ca = fp8_codes_avx2<F>(a), cb = fp8_codes_avx2<F>(b);
    const __m128i wa = _mm_packus_epi32(_mm256_castsi256_si128(ca), _mm256_extracti128_si256(ca, 1));
    const __m128i wb = _mm_packus_epi32(_mm256_castsi256_si128(cb), _mm256_extracti128_si256(cb, 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(wa, wb));
  }
  for (; i + 8 <= n; i += 8) {
    __m256 a = load8_avx2<S>(s + i * kSize);
    a = DIV ? _mm256_div_ps(a, vf) : _mm256_mul_ps(a, vf);
    const __m256i ca = fp8_codes_avx2<F>(a);
    const __m128i wa = _mm_packus_epi32(_mm256_castsi256_si128(ca), _mm256_extracti128_si256(ca, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + i), _mm_packus_epi16(wa, wa));
  }
  if (i < n) quant_run_scalar<F>(dst + i, 1, s + i * kSize, 1, S, n - i, factor, DIV);
}

// ---------------------------------------------------------------- AVX-512

template <int F>
KVO_AVX512 static inline __m512i fp8_codes_avx512(__m512 q) {
  // The same steps as fp8_codes_avx2, fused with mask registers and vpternlogd. Only the low byte
  // of each lane is kept (vpmovdb truncates, packus sees values <= 0xFF), so the sign and NaN bytes
  // need no masking above it.
  using P = Fmt<F>;
  const __m512i u = _mm512_castps_si512(q);
  const __m512i s24 = _mm512_srli_epi32(u, 24);  // low byte: sign bit, then exponent bits
  const __m512i mag = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  // normal: round to nearest even at bit 23 - M, then rebias the exponent
  const __mmask16 odd = _mm512_test_epi32_mask(mag, _mm512_set1_epi32(1 << (23 - P::M)));
  __m512i r = _mm512_add_epi32(mag, _mm512_set1_epi32((1 << (22 - P::M)) - 1));
  r = _mm512_mask_add_epi32(r, odd, r, _mm512_set1_epi32(1));
  // subnormal: the float adder rounds |q| + 2^(24 - B - M) to the fp8 quantum
  const __m512 magic = _mm512_castsi512_ps(_mm512_set1_epi32((127 + 24 - P::B - P::M) << 23));
  __m512i code = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(mag), magic)),
                                  _mm512_castps_si512(magic));
  const __mmask16 is_normal = _mm512_cmpge_epu32_mask(mag, _mm512_set1_epi32((128 - P::B) << 23));
  code = _mm512_mask_sub_epi32(code, is_normal, _mm512_srli_epi32(r, 23 - P::M),
                               _mm512_set1_epi32((127 - P::B) << P::M));
  code = _mm512_min_epu32(code, _mm512_set1_epi32(P::MC));  // overflow and inf saturate
  __m512i out = _mm512_ternarylogic_epi32(code, s24, _mm512_set1_epi32(0x80), 0xF8);  // code | (s24 & 0x80)
  if (P::FNUZ) out = _mm512_maskz_mov_epi32(_mm512_test_epi32_mask(code, code), out);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(mag, _mm512_set1_epi32(0x7F800000));
  const __m512i nan = P::FNUZ ? _mm512_set1_epi32(0x80) : _mm512_or_si512(s24, _mm512_set1_epi32(0x7F));
  return _mm512_mask_mov_epi32(out, is_nan, nan);
}

template <int S>
KVO_AVX512 static inline __m512 load16_avx512(const void* p, __mmask16 m) {
  if (S == kF32) return _mm512_maskz_loadu_ps(m, p);
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  if (S == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

template <int S>
KVO_AVX512 static inline __m512 load16_avx512(const void* p) {
  if (S == kF32) return _mm512_loadu_ps(p);
  const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
  if (S == kF16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// The codes of x * factor (kMul), x / factor (kDiv), or x / factor computed as x * recip (kRecip).
//
// kRecip: q = RN(x * r) with r = RN(1/s) a normal float is within 2^-23 |x/s| of x/s, so within
// 3 units in the last place of RN(x/s), counted on the bit patterns. The code is a step function
// of the quotient whose steps (the ties between neighbouring codes, the tie above max, the tie
// between 0 and the smallest subnormal) all have at most M + 2 significant bits: their low 22 - M
// bits are zero. So unless q's low bits lie within [-4, +3] of such a pattern, no step lies between
// q and RN(x/s) and both give the same code. A vector with such a lane (+-inf included; zeros are
// exact either way) is divided after all: for calibrated scales (r with a full significand) that is
// about 8 quotients in 2^(22 - M). For scales like 0.05 (r = 20) exact short products would hit
// those patterns too often, so the caller uses kDiv for them.
template <int F, int MODE>
KVO_AVX512 static inline __m512i scaled_codes_avx512(__m512 x, __m512 factor, __m512 recip) {
  if (MODE == kMul) return fp8_codes_avx512<F>(_mm512_mul_ps(x, factor));
  if (MODE == kDiv) return fp8_codes_avx512<F>(_mm512_div_ps(x, factor));
  __m512 q = _mm512_mul_ps(x, recip);
  const __m512i u = _mm512_castps_si512(q);
  const __mmask16 nonzero = _mm512_test_epi32_mask(u, _mm512_set1_epi32(0x7FFFFFFF));
  const __mmask16 near = _mm512_mask_testn_epi32_mask(
      nonzero, _mm512_add_epi32(u, _mm512_set1_epi32(4)), _mm512_set1_epi32(((1 << (22 - Fmt<F>::M)) - 1) & ~7));
  if (__builtin_expect(near != 0, 0)) q = _mm512_div_ps(x, factor);
  return fp8_codes_avx512<F>(q);
}

template <int F, int S, int MODE>
KVO_AVX512 static void quant_run_avx512_impl(uint8_t* dst, const void* src, int64_t n, float factor) {
  constexpr int64_t kSize = S == kF32 ? 4 : 2;
  const char* s = static_cast<const char*>(src);
  const __m512 vf = _mm512_set1_ps(factor);
  const __m512 vr = _mm512_set1_ps(MODE == kRecip ? 1.0f / factor : 0.0f);
  int64_t i = 0;
  if (S == kBF16) {
    // 32 bf16 at a time, widened by interleaving with zero words (one uop per 16, where
    // zero-extend + shift take two) and narrowed back by packus + vpmovwb, which undoes the
    // interleaving lane by lane; the codes are at most 0xFF, so nothing saturates.
    const __m512i zero = _mm512_setzero_si512();
    for (; i + 32 <= n; i += 32) {
      const __m512i raw = _mm512_loadu_si512(s + i * kSize);
      const __m512 a = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, raw));
      const __m512 b = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, raw));
      const __m512i words = _mm512_packus_epi32(scaled_codes_avx512<F, MODE>(a, vf, vr),
                                                scaled_codes_avx512<F, MODE>(b, vf, vr));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), _mm512_cvtepi16_epi8(words));
    }
  }
  for (; i + 32 <= n; i += 32) {
    const __m512 a = load16_avx512<S>(s + i * kSize);
    const __m512 b = load16_avx512<S>(s + (i + 16) * kSize);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), _mm512_cvtepi32_epi8(scaled_codes_avx512<F, MODE>(a, vf, vr)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i + 16),
                     _mm512_cvtepi32_epi8(scaled_codes_avx512<F, MODE>(b, vf, vr)));
  }
  for (; i < n; i += 16) {
    const int64_t left = n - i;
    const __mmask16 m = left >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << left) - 1u);
    const __m512 a = load16_avx512<S>(s + i * kSize, m);
    _mm512_mask_cvtepi32_storeu_epi8(dst + i, m, scaled_codes_avx512<F, MODE>(a, vf, vr));
  }
}
#endif  // KVO_X86

// ---------------------------------------------------------------- dispatch tables

enum Isa : int { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };

// A contiguous run: n source elements of type src_type -> n codes.
using QuantRunFn = void (*)(uint8_t* dst, const void* src, int64_t n, float factor);

template <int F, int S, int MODE>
static void quant_run_scalar_impl(uint8_t* dst, const void* src, int64_t n, float factor) {
  quant_run_scalar<F>(dst, 1, src, 1, S, n, factor, MODE != kMul);
}

template <int F, int S, int MODE>
static QuantRunFn pick_run(int isa) {
#if KVO_X86
  if (isa == kAvx512) return &quant_run_avx512_impl<F, S, MODE>;
  if (isa == kAvx2) return &quant_run_avx2_impl<F, S, MODE != kMul>;
#endif
  (void)isa;
  return &quant_run_scalar_impl<F, S, MODE == kMul ? kMul : kDiv>;
}

template <int F, int S>
static QuantRunFn pick_run_mode(int isa, int mode) {
  switch (mode) {
    case kMul: return pick_run<F, S, kMul>(isa);
    case kDiv: return pick_run<F, S, kDiv>(isa);
    default: return pick_run<F, S, kRecip>(isa);
  }
}

template <int F>
static QuantRunFn pick_run_fmt(int isa, int src_type, int mode) {
  switch (src_type) {
    case kF32: return pick_run_mode<F, kF32>(isa, mode);
    case kF16: return pick_run_mode<F, kF16>(isa, mode);
    default: return pick_run_mode<F, kBF16>(isa, mode);
  }
}

static inline QuantRunFn pick_quant_run(int isa, int fmt, int src_type, int mode) {
  switch (fmt) {
    case kE4M3FN: return pick_run_fmt<kE4M3FN>(isa, src_type, mode);
    case kE5M2: return pick_run_fmt<kE5M2>(isa, src_type, mode);
    case kE4M3FNUZ: return pick_run_fmt<kE4M3FNUZ>(isa, src_type, mode);
    default: return pick_run_fmt<kE5M2FNUZ>(isa, src_type, mode);
  }
}

using QuantStridedFn = void (*)(uint8_t* dst, int64_t dst_stride, const void* src, int64_t src_stride,
                                int src_type, int64_t n, float factor, bool divide);

static inline QuantStridedFn pick_quant_strided(int fmt) {
  switch (fmt) {
    case kE4M3FN: return &quant_run_scalar<kE4M3FN>;
    case kE5M2: return &quant_run_scalar<kE5M2>;
    case kE4M3FNUZ: return &quant_run_scalar<kE4M3FNUZ>;
    default: return &quant_run_scalar<kE5M2FNUZ>;
  }
}

}  // namespace kvo
