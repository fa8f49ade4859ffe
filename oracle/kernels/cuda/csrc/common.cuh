// Device helpers shared by the kernels: vector types, read-only loads, slot loads, the few PTX
// instructions the kernels issue, and launch sizing. CUDA and plain C++ only.
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

// ---------------------------------------------------------------- the device-side slot check

// The minimum of v over the block (every thread gets it). Call at most once per kernel, from
// every thread of the block.
__device__ __forceinline__ int64_t block_min(int64_t v) {
  __shared__ int64_t warp_min[32];
  for (int o = 16; o > 0; o >>= 1) v = min(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  const int lane = threadIdx.x & 31;
  if (lane == 0) warp_min[threadIdx.x >> 5] = v;
  __syncthreads();
  v = lane < static_cast<int>((blockDim.x + 31) >> 5) ? warp_min[lane] : kNoEntry;
  for (int o = 16; o > 0; o >>= 1) v = min(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  return v;
}

// The first illegal entry (see SlotCheck) of [start, end) scanned by this thread at `step`
// strides from start + offset, or kNoEntry. Four loads are issued before any is compared, so a
// thread waits for one memory round trip per four entries, not one per entry. With `copy`, each
// entry scanned is also stored at copy[i] (oracle.kernels.check_index's private copy).
template <typename IdxT>
__device__ __forceinline__ int64_t first_illegal(const void* index, int64_t stride, int64_t start, int64_t end,
                                                 int64_t offset, int64_t step, int64_t num_slots,
                                                 int32_t negative_ok, IdxT* copy = nullptr) {
  constexpr int kLoads = 4;
  int64_t first = kNoEntry;
  for (int64_t i = start + offset; i < end; i += kLoads * step) {
    int64_t slot[kLoads];
#pragma unroll
    for (int u = 0; u < kLoads; ++u) slot[u] = i + u * step < end ? load_slot<IdxT>(index, i + u * step, stride) : 0;
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const bool inside = i + u * step < end;
      if (copy != nullptr && inside) copy[i + u * step] = static_cast<IdxT>(slot[u]);  // exact: it was an IdxT
      const bool bad = inside && (slot[u] >= num_slots || (!negative_ok && slot[u] < 0));
      if (bad && i + u * step < first) first = i + u * step;
    }
  }
  return first;
}

// The end of a check grid (every thread of every block calls it, with its block's block_min):
// block b leaves `first` (or n) in words[b]; the last block to arrive folds words[0, gridDim.x)
// into *fold and sets *arrivals back to 0 for the next grid. A writer then reads one word where
// it would read one per check block: one warp per row reads it once per row, which at 64 words
// (512 bytes) a warp was megabytes of L2 reads over a call (2.8 us at N = 65536 on the H100).
// `arrivals` may be shared by the check grids of a stream, which never run at once. With `fold`
// null (LaunchTuning::check_fold 0) the words are left as they are, for the writer to read.
__device__ __forceinline__ void fold_verdict(int64_t first, int64_t n, int64_t* words, int64_t* fold,
                                             unsigned long long* arrivals) {
  if (threadIdx.x >= 32 || (fold == nullptr && threadIdx.x > 0)) return;
  if (fold == nullptr) {  // uniform over the grid
    words[blockIdx.x] = first < n ? first : n;
    return;
  }
  int last = 0;
  if (threadIdx.x == 0) {
    words[blockIdx.x] = first < n ? first : n;
    __threadfence();  // the word before the arrival
    last = atomicAdd(arrivals, 1ULL) == gridDim.x - 1;
  }
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();  // every block's word is visible to the last one to arrive
  int64_t m = n;
  for (unsigned b = threadIdx.x; b < gridDim.x; b += 32)
    m = min(m, *reinterpret_cast<volatile const int64_t*>(words + b));
  for (int o = 16; o > 0; o >>= 1) m = min(m, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, m, o)));
  if (threadIdx.x == 0) {
    *fold = m;
    *arrivals = 0;
  }
}

// Records the call's first illegal entry `first` in the mailbox the host reads (call it from one
// thread of one block).
template <typename IdxT>
__device__ void report_illegal(const SlotCheck& c, const void* index, int64_t stride, int64_t first,
                               int64_t num_slots) {
  volatile int64_t* box = c.mailbox;
  box[1] = first;
  box[2] = load_slot<IdxT>(index, first, stride);
  box[3] = num_slots;
  box[4] = c.arg_code;
  box[5] = c.pad_code;
  box[6] = c.pad_slot;
  __threadfence_system();  // the host may read word 0 without synchronizing
  box[0] = 1;
}

// Whether every slot of the call is legal (uniform over the grid), for SlotCheck modes 1 and 2.
// Every thread of the block must call it, before the block's first store; where a slot is illegal,
// block 0 records it. Mode 2 reads the verdict within each warp, so the block's warps go on
// without waiting for one another: one word (a check grid's fold), read by every lane at once, or
// up to 64 (a Triton-checked index), two per lane, reduced across the warp.
template <typename IdxT>
__device__ bool call_is_legal(const SlotCheck& c, const void* index, int64_t stride, int64_t n, int64_t num_slots) {
  int64_t first;
  if (c.mode == 1) {
    first = block_min(first_illegal<IdxT>(index, stride, 0, n, threadIdx.x, blockDim.x, num_slots, c.negative_ok));
  } else if (c.verdict_count == 1) {
    first = c.verdict[0];  // a check grid's fold (fold_verdict): one sector, every lane the same word
  } else {
    first = kNoEntry;
    for (int i = threadIdx.x & 31; i < c.verdict_count; i += 32) first = min(first, c.verdict[i]);
    for (int o = 16; o > 0; o >>= 1) first = min(first, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, first, o)));
  }
  if (first >= n) return true;
  if (blockIdx.x == 0 && threadIdx.x == 0) report_illegal<IdxT>(c, index, stride, first, num_slots);
  return false;
}

// The verdict-only build's gate (CheckCode kCheckVerdict, SlotCheck mode 2): a warp calls it after
// issuing the loads of its first chunks and before their first store, with `judged` false until
// then, so the verdict's read and the row's loads are in flight together. Whether the warp may
// store (false: the call has an illegal entry; the warp stores nothing, and the thread that
// call_is_legal names has reported it). Warp-uniform: every lane of the warp must call it.
template <typename IdxT, typename Args>
__device__ __forceinline__ bool verdict_gate(bool& judged, const Args& a) {
  if (judged) return true;
  judged = true;
  return call_is_legal<IdxT>(a.check, a.index, a.index_stride, a.n, a.num_slots);
}

__device__ __forceinline__ uint64_t load_acquire(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The grid's verdict for SlotCheck mode 3: the minimum of every block's `first` (its first illegal
// entry, or kNoEntry), returned to every thread of every block once every block has called it. A
// barrier over the whole grid: every block of the grid must be resident at once (the launcher
// sizes the grid so) and call it exactly once, from every thread.
//
// `state` is the stream's SlotCheck::barrier: [0] the blocks arrived, [1] a generation count, [2]
// and [3] the minimum of even and odd generations, kNoEntry between calls. Thread 0 of each block
// folds its `first` into its generation's word and arrives; the last block to arrive resets the
// count and the other generation's word (no block reads it before the next call, which runs after
// this grid has completed), then bumps the generation, which releases the others. One poller per
// block, a few hundred at most.
__device__ __forceinline__ int64_t grid_verdict(uint64_t* state, int64_t first) {
  __shared__ int64_t verdict;
  if (threadIdx.x == 0) {
    const uint64_t gen = load_acquire(state + 1);
    int64_t* word = reinterpret_cast<int64_t*>(state + 2 + (gen & 1));
    if (first != kNoEntry) atomicMin(reinterpret_cast<long long*>(word), static_cast<long long>(first));
    __threadfence();  // the fold (and the generation read) before the arrival
    const uint64_t arrived = atomicAdd(reinterpret_cast<unsigned long long*>(state), 1ULL);
    if (arrived == gridDim.x - 1) {
      atomicExch(reinterpret_cast<unsigned long long*>(state), 0ULL);
      atomicExch(reinterpret_cast<unsigned long long*>(state + 2 + ((gen + 1) & 1)),
                 static_cast<unsigned long long>(kNoEntry));
      __threadfence();
      atomicAdd(reinterpret_cast<unsigned long long*>(state + 1), 1ULL);
    } else {
      while (load_acquire(state + 1) == gen) __nanosleep(32);
    }
    verdict = static_cast<int64_t>(load_acquire(reinterpret_cast<const uint64_t*>(word)));
  }
  __syncthreads();
  return verdict;
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

// Ask the L2 for a verdict-reading call's (SlotCheck mode 2) verdict before the PDL wait, from
// the block's first warp: an index checked beforehand (oracle.kernels.check_index) left them long
// ago, and they may be back in DRAM by now.
__device__ __forceinline__ void prefetch_verdict(const SlotCheck& c) {
  if (c.mode == 2 && threadIdx.x < 32)
    prefetch_l2(reinterpret_cast<const unsigned char*>(c.verdict), c.verdict_count * 8, static_cast<int>(threadIdx.x));
}

// Which build of a writer kernel a launch takes: none of the slot check's code (a launch that checks
// nothing), the verdict's read alone (an index checked beforehand: SlotCheck mode 2, not late), or
// the full check (modes 1 and 2, with the loads it moves before the check). `family` is the
// LaunchTuning::lean_unchecked / lean_verdict bit of the kernel.
enum CheckCode { kCheckNone = 0, kCheckVerdict = 1, kCheckFull = 2 };

inline int check_code(const SlotCheck& c, int family) {
  if (c.mode == 0) return (launch_tuning().lean_unchecked & family) ? kCheckNone : kCheckFull;
  if (c.mode == 2 && !c.late && (launch_tuning().lean_verdict & family)) return kCheckVerdict;
  return kCheckFull;
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

// f(std::integral_constant<int, code>{}) for a CheckCode.
template <typename F>
inline cudaError_t with_check(int code, F&& f) {
  switch (code) {
    case kCheckNone: return f(std::integral_constant<int, kCheckNone>{});
    case kCheckVerdict: return f(std::integral_constant<int, kCheckVerdict>{});
    default: return f(std::integral_constant<int, kCheckFull>{});
  }
}

}  // namespace kvo_cuda
