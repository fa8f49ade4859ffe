// Device helpers shared by the kernels: vector types, read-only loads, slot loads, the few PTX
// instructions the kernels issue, L2 prefetches, and launch sizing (the device-side slot check is
// slot_check.cuh). CUDA and plain C++ only.
#pragma once

#include <climits>
#include <cstdint>
#include <mutex>
#include <type_traits>
#include <utility>

#include <cuda_runtime.h>

#include "kv_cuda.h"

namespace kvo_cuda {

// ---------------------------------------------------------------- vectors of 1..16 bytes

template <int Bytes> struct VecOf;
template <> struct VecOf<16> { using type = uint4; };
template <> struct VecOf<8> { using type = uint2; };
template <> struct VecOf<4> { using type = uint32_t; };
template <> struct VecOf<2> { using type = uint16_t; };
template <> struct VecOf<1> { using type = uint8_t; };

// Source loads (the sources are never written during a launch), plain ld.global: on the H100 the
// L1::no_allocate variants (with or without .nc) made a cold MLA write 3% slower (15.3 vs 14.9 us
// at N = 16384, 56.7 vs 55.1 us at 65536: benchmarks/mla_load_probe.cu;
// docs/benchmarks.md).
template <int Bytes>
__device__ __forceinline__ typename VecOf<Bytes>::type load_ro(const unsigned char* p) {
  return *reinterpret_cast<const typename VecOf<Bytes>::type*>(p);
}

// An L2 eviction policy that marks lines evict-first (data touched once).
__device__ __forceinline__ uint64_t evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
  return policy;
}

// load_ro with an L2 cache-eviction policy (16-byte loads; narrower ones ignore the policy).
template <int Bytes>
__device__ __forceinline__ typename VecOf<Bytes>::type load_ro_policy(const unsigned char* p, uint64_t policy) {
  if constexpr (Bytes == 16) {
    uint4 v;
    asm("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
        : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
        : "l"(p), "l"(policy));
    return v;
  } else {
    return load_ro<Bytes>(p);
  }
}

template <int Bytes>
__device__ __forceinline__ void store_global(unsigned char* p, typename VecOf<Bytes>::type v) {
  *reinterpret_cast<typename VecOf<Bytes>::type*>(p) = v;
}

// The slot of a row: a plain load too, it is on every store's critical path.
template <typename IdxT>
__device__ __forceinline__ int64_t load_slot(const void* index, int64_t row, int64_t stride) {
  return static_cast<int64_t>(static_cast<const IdxT*>(index)[row * stride]);
}

// chunk c of a row laid out as [heads][head_chunks] -> (head, chunk within the head)
__device__ __forceinline__ void split_chunk(int64_t c, int64_t head_chunks, int shift, int64_t& h,
                                            int64_t& j) {
  if (shift >= 0) {
    h = c >> shift;
    j = c & (head_chunks - 1);
  } else {
    h = c / head_chunks;
    j = c - h * head_chunks;
  }
}

// ---------------------------------------------------------------- PTX: bulk copies, fences, fp8

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Make this thread's generic-proxy writes to shared memory visible to the async proxy (the bulk
// copy engine) before a barrier and the cp.async.bulk that reads them.
__device__ __forceinline__ void fence_proxy_async_smem() {
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

// global[dst .. dst + bytes) <- shared[src .. src + bytes); bytes % 16 == 0, both 16-byte aligned.
__device__ __forceinline__ void bulk_store(unsigned char* dst, uint32_t src_smem, uint32_t bytes) {
  const uint64_t g = static_cast<uint64_t>(__cvta_generic_to_global(dst));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;"
               :: "l"(g), "r"(src_smem), "r"(bytes) : "memory");
}

// bulk_store with an L2 cache-eviction policy for the written lines.
__device__ __forceinline__ void bulk_store_policy(unsigned char* dst, uint32_t src_smem, uint32_t bytes,
                                                  uint64_t policy) {
  const uint64_t g = static_cast<uint64_t>(__cvta_generic_to_global(dst));
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group.L2::cache_hint [%0], [%1], %2, %3;"
               :: "l"(g), "r"(src_smem), "r"(bytes), "l"(policy) : "memory");
}

__device__ __forceinline__ void bulk_commit() {
  asm volatile("cp.async.bulk.commit_group;" ::: "memory");
}

// Wait until at most N of this thread's bulk groups still READ their shared-memory source.
template <int N>
__device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;" :: "n"(N) : "memory");
}

// Wait until all of this thread's bulk groups have completed (writes performed).
__device__ __forceinline__ void bulk_wait_all() {
  asm volatile("cp.async.bulk.wait_group 0;" ::: "memory");
}

// Two float32 -> two fp8 codes with round-to-nearest-even and .satfinite (overflow and +-inf to
// +-max, NaN to NaN). PTX packs operand a into the upper byte, b into the lower one, so `lo`
// (the first element in memory) is passed as b.
template <int Fmt>
__device__ __forceinline__ uint16_t cvt_fp8x2(float lo, float hi) {
  uint16_t out;
  if constexpr (Fmt == kFp8E4M3) {
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  } else {
    static_assert(Fmt == kFp8E5M2, "unknown fp8 format");
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(out) : "f"(hi), "f"(lo));
  }
  return out;
}

// ---------------------------------------------------------------- programmatic dependent launch

// First thing every kernel does when launched with PDL (`pdl` is uniform across the grid): wait
// until the grids this one depends on have completed and their writes are visible, then allow the
// next PDL launch on the stream to be scheduled (it waits in turn, so nothing it reads can be
// stale). Without PDL nothing is waited for or allowed early: a later kernel launched with PDL but
// without a wait of its own then still starts after this one ends.
__device__ __forceinline__ void pdl_prologue(int32_t pdl) {
  if (pdl) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  }
}

// Ask the L2 for bytes [p, p + bytes): one prefetch per 32-byte sector, spread over the warp's
// lanes. A hint with no effect on what any load returns, so it may run before griddepcontrol.wait:
// the L2 is the device's point of coherence, and a line the previous grid writes after being
// prefetched is simply updated there.
__device__ __forceinline__ void prefetch_l2(const unsigned char* p, int64_t bytes, int lane) {
  const uint64_t start = static_cast<uint64_t>(__cvta_generic_to_global(p));
  const uint64_t end = start + static_cast<uint64_t>(bytes);
  for (uint64_t q = (start & ~uint64_t{31}) + 32u * lane; q < end; q += 32u * 32u)
    asm volatile("prefetch.global.L2 [%0];" :: "l"(q));
}

// prefetch_l2 of the index entry load_slot reads for `row` (one lane's worth: call it from one).
template <typename IdxT>
__device__ __forceinline__ void prefetch_slot(const void* index, int64_t row, int64_t stride) {
  prefetch_l2(reinterpret_cast<const unsigned char*>(static_cast<const IdxT*>(index) + row * stride), sizeof(IdxT), 0);
}

// Whether a launch prefetches its sources into the L2 first, by a LaunchTuning *_prefetch mode.
inline int prefetch_for(int mode, bool pdl) { return mode == 2 || (mode == 1 && pdl) ? 1 : 0; }

// kernel<<<grid, threads, smem, stream>>>(args...), with programmatic stream serialization when
// `pdl` (the kernel must start with pdl_prologue(pdl)).
template <typename... Params, typename... Args>
inline cudaError_t launch_kernel(void (*kernel)(Params...), unsigned grid, int threads, size_t smem,
                                 cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(grid);
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attribute[1];
  attribute[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attribute;
  config.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

// ---------------------------------------------------------------- launch sizing

// Multiprocessor count of the current device (cached per device).
inline int sm_count() {
  static int cached[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 132;
  if (device < 0 || device >= 64) return 132;
  if (cached[device] == 0) {
    int count = 0;
    if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || count <= 0)
      count = 132;
    cached[device] = count;
  }
  return cached[device];
}

// Blocks of `kernel` that fit on one multiprocessor with `smem` bytes of dynamic shared memory,
// cached per (kernel, smem, threads): the occupancy query costs microseconds of host time.
template <typename Kernel>
inline int blocks_per_sm(Kernel kernel, size_t smem, int threads) {
  struct Entry { const void* fn; size_t smem; int threads; int blocks; };
  static std::mutex lock;
  static Entry cache[32];
  static int used = 0;
  const void* fn = reinterpret_cast<const void*>(kernel);
  std::lock_guard<std::mutex> guard(lock);
  for (int i = 0; i < used; ++i)
    if (cache[i].fn == fn && cache[i].smem == smem && cache[i].threads == threads) return cache[i].blocks;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem) != cudaSuccess ||
      per_sm <= 0) {
    (void)cudaGetLastError();  // clear it: the launch itself reports real problems
    return 1;                  // not cached: a transient failure is retried next time
  }
  if (used < 32) cache[used++] = Entry{fn, smem, threads, per_sm};
  return per_sm;
}

// The grid for `work_warps` warps of work: enough blocks for all of it, capped by `per_sm` (see
// LaunchTuning): 0 what fits on the device at once (a persistent grid whose warps loop), -1 no cap
// (one warp per item), k > 0 at most k blocks per multiprocessor.
template <typename Kernel>
inline unsigned grid_for(Kernel kernel, int64_t work_warps, size_t smem, int threads, int per_sm = 0) {
  const int64_t warps_per_block = threads / 32;
  int64_t want = (work_warps + warps_per_block - 1) / warps_per_block;
  if (per_sm >= 0) {
    const int fit = blocks_per_sm(kernel, smem, threads);
    const int64_t cap = static_cast<int64_t>(per_sm > 0 && per_sm < fit ? per_sm : fit) * sm_count();
    if (want > cap) want = cap;
  }
  if (want < 1) want = 1;
  if (want > 0x7fffffff) want = 0x7fffffff;
  return static_cast<unsigned>(want);
}

// ---------------------------------------------------------------- rows and dispatch

// Cache row of `slot` for one side: block slot / block_size, token slot % block_size.
__device__ __forceinline__ unsigned char* row_of(const PagedArgs& a, const Side& d, int64_t slot) {
  int64_t block = slot, token = 0;
  if (a.block_size != 1) {
    block = slot / a.block_size;
    token = slot - block * a.block_size;
  }
  return d.dst + block * d.dst_block + token * d.dst_token;
}

// f(IdxT{}) with the index tensor's element type.
template <typename F>
inline cudaError_t with_index(int32_t index_type, F&& f) {
  return index_type == kIndexInt64 ? f(int64_t{}) : f(int32_t{});
}

// f(std::integral_constant<int, bytes>{}) for a vector width of 16, 8, 4, 2 or 1 bytes.
template <typename F>
inline cudaError_t with_vec(int bytes, F&& f) {
  switch (bytes) {
    case 16: return f(std::integral_constant<int, 16>{});
    case 8: return f(std::integral_constant<int, 8>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 1: return f(std::integral_constant<int, 1>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace kvo_cuda
