// fp8 quantizing paged writes (reshape_and_cache_flash with an fp8 kv_cache_dtype): each element
// x becomes cvt.rn.satfinite.{e4m3,e5m2}(x / scale), the code of the IEEE float32 quotient, scale
// per tensor or per head: paged_rows_kernel (paged_rows.cuh) with a quantizing chunk of Elems
// source elements (16 bytes on the wide path) read with one load and written as Elems bytes with
// one store. The division's reciprocal is computed once per scale (Fp8Divisor).
#include <cuda_fp16.h>

#include "paged_rows.cuh"

namespace kvo_cuda {
namespace {

template <int Src> struct SrcInfo;
template <> struct SrcInfo<kSrcFloat32> { static constexpr int bytes = 4; };
template <> struct SrcInfo<kSrcFloat16> { static constexpr int bytes = 2; };
template <> struct SrcInfo<kSrcBFloat16> { static constexpr int bytes = 2; };

template <int Src>
__device__ __forceinline__ float widen(uint32_t bits) {
  if constexpr (Src == kSrcFloat32) {
    return __uint_as_float(bits);
  } else if constexpr (Src == kSrcBFloat16) {
    return __uint_as_float(bits << 16);  // exact
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(bits)));  // exact
  }
}

// Element e of a loaded chunk, as raw bits of the source type.
template <int Src, int Bytes>
__device__ __forceinline__ uint32_t element_bits(const typename VecOf<Bytes>::type& v, int e) {
  if constexpr (Bytes == 16) {
    const uint32_t w = e * SrcInfo<Src>::bytes / 4 == 0 ? v.x
                     : e * SrcInfo<Src>::bytes / 4 == 1 ? v.y
                     : e * SrcInfo<Src>::bytes / 4 == 2 ? v.z : v.w;
    return SrcInfo<Src>::bytes == 4 ? w : ((e & 1) ? (w >> 16) : (w & 0xFFFFu));
  } else {
    static_assert(Bytes == SrcInfo<Src>::bytes, "the narrow path loads one element");
    return static_cast<uint32_t>(v);
  }
}

// x / s for one scale s, exact wherever the fp8 code can tell, with the reciprocal computed once
// per scale rather than once per element. div.rn.f32's fast path is: r = rcp.approx(s) refined by
// one Newton step (two FMAs), q = x * r, then one correction q + r * (x - s * q) (two FMAs), taken
// where its range check (FCHK) passes and exact there; the compiler repeats all of it, the
// reciprocal on the quarter-rate MUFU pipe included, for every element. Here:
// - the scale is first brought into [2^-32, 2^32] by a power of two p (p = 1 for every scale in that
//   range; else s * p in [1, 4), or s * 2^127 for a subnormal s): x / s = (x p) / (s p), and x p
//   is exact, or overflows (then |x / s| > 2^96: saturated either way), or underflows (then
//   |x / s| < 2^-100: +-0 either way, and the product keeps x's sign);
// - r is prepared once, and each element x' = x p costs two multiplies, two FMAs, two compares and
//   a select:
//   - |x'| in [2^-60, 2^60): div.rn's fast-path operations in the moderate range where they are
//     exact: the IEEE quotient;
//   - |x'| < 2^-60 (zeros and subnormals included): |x / s| < 2^-28, far below half the smallest
//     fp8 subnormal (2^-17), so x' * r, which keeps x's sign, has the same code (+-0);
//   - |x'| >= 2^60, +-inf, NaN: |x / s| >= 2^28 or NaN, so x' * r has the same code (+-max under
//     .satfinite, NaN).
// tests/test_cuda_kernels.py (test_fp8_division_every_source_value) checks every bf16 and fp16
// value against the reference under scales inside and outside [2^-32, 2^32].
struct Fp8Divisor {
  float p, s, r;  // the power of two, the scale times it, the reciprocal of that
};

__device__ __forceinline__ Fp8Divisor fp8_divisor(float s) {
  Fp8Divisor d{1.0f, s, 1.0f};
  if (!(s >= 0x1p-32f && s <= 0x1p32f)) {
    const int e = static_cast<int>((__float_as_uint(s) >> 23) & 0xFFu) - 127;  // -127: subnormal
    const int j = e == -127 ? 127 : (-e < -126 ? -126 : -e);
    d.p = __uint_as_float(static_cast<uint32_t>(j + 127) << 23);
    d.s = s * d.p;
  }
  float r0;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r0) : "f"(d.s));
  d.r = fmaf(r0, fmaf(-d.s, r0, 1.0f), r0);
  return d;
}

__device__ __forceinline__ float fp8_quotient(float x, const Fp8Divisor& d) {
  const float xp = x * d.p;
  const float q = xp * d.r;
  const float exact = fmaf(d.r, fmaf(-d.s, q, xp), q);
  const float m = fabsf(xp);
  return m >= 0x1p-60f && m < 0x1p60f ? exact : q;
}

template <int Src, int Fmt, int Elems>
__device__ __forceinline__ typename VecOf<Elems>::type quantize_chunk(
    const typename VecOf<Elems * SrcInfo<Src>::bytes>::type& v, const Fp8Divisor& d) {
  constexpr int LoadBytes = Elems * SrcInfo<Src>::bytes;
  float q[Elems];
#pragma unroll
  for (int e = 0; e < Elems; ++e) q[e] = fp8_quotient(widen<Src>(element_bits<Src, LoadBytes>(v, e)), d);
  if constexpr (Elems == 1) {
    return static_cast<uint8_t>(cvt_fp8x2<Fmt>(q[0], 0.0f) & 0xFFu);
  } else if constexpr (Elems == 4) {
    const uint32_t lo = cvt_fp8x2<Fmt>(q[0], q[1]);
    const uint32_t hi = cvt_fp8x2<Fmt>(q[2], q[3]);
    return lo | (hi << 16);
  } else {
    static_assert(Elems == 8, "chunks of 1, 4 or 8 elements");
    uint2 out;
    out.x = static_cast<uint32_t>(cvt_fp8x2<Fmt>(q[0], q[1])) | (static_cast<uint32_t>(cvt_fp8x2<Fmt>(q[2], q[3])) << 16);
    out.y = static_cast<uint32_t>(cvt_fp8x2<Fmt>(q[4], q[5])) | (static_cast<uint32_t>(cvt_fp8x2<Fmt>(q[6], q[7])) << 16);
    return out;
  }
}

template <int Src, int Fmt, int Elems>
struct Fp8Chunk {
  static constexpr int kIn = Elems * SrcInfo<Src>::bytes;
  static constexpr int kOut = Elems;
  static constexpr bool kScaled = true;
  using Factor = Fp8Divisor;
  __device__ __forceinline__ static Factor factor(float scale) { return fp8_divisor(scale); }
  __device__ __forceinline__ static typename VecOf<Elems>::type apply(const typename VecOf<kIn>::type& v,
                                                                      const Factor& d) {
    return quantize_chunk<Src, Fmt, Elems>(v, d);
  }
};

template <typename IdxT, int Src, int Fmt>
cudaError_t launch_elems(const PagedArgs& a, int elems, cudaStream_t stream) {
  constexpr int Wide = 16 / SrcInfo<Src>::bytes;
  const int per_sm = launch_tuning().fp8_grid, prefetch = launch_tuning().fp8_prefetch;
  if (elems == Wide) return launch_paged_rows<IdxT, Fp8Chunk<Src, Fmt, Wide>>(a, per_sm, prefetch, stream);
  if (elems == 1) return launch_paged_rows<IdxT, Fp8Chunk<Src, Fmt, 1>>(a, per_sm, prefetch, stream);
  return cudaErrorInvalidValue;
}

template <typename IdxT, int Src>
cudaError_t launch_fmt(const PagedArgs& a, int fmt, int elems, cudaStream_t stream) {
  switch (fmt) {
    case kFp8E4M3: return launch_elems<IdxT, Src, kFp8E4M3>(a, elems, stream);
    case kFp8E5M2: return launch_elems<IdxT, Src, kFp8E5M2>(a, elems, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

cudaError_t launch_paged_fp8(const PagedArgs& args, int src_type, int fmt, int elems, cudaStream_t stream) {
  if (args.n <= 0) return cudaSuccess;
  return with_index(args.index_type, [&](auto idx) {
    using IdxT = decltype(idx);
    switch (src_type) {
      case kSrcFloat32: return launch_fmt<IdxT, kSrcFloat32>(args, fmt, elems, stream);
      case kSrcFloat16: return launch_fmt<IdxT, kSrcFloat16>(args, fmt, elems, stream);
      case kSrcBFloat16: return launch_fmt<IdxT, kSrcBFloat16>(args, fmt, elems, stream);
      default: return cudaErrorInvalidValue;
    }
  });
}

}  // namespace kvo_cuda
