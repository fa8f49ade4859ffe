// The device-side slot check of the validating writers (SlotCheck, kv_cuda.h): the scan of an
// index, the verdict a check grid leaves and its fold, the grid barrier of the in-grid check, the
// mailbox report, and CheckCode, the build of a writer kernel a launch takes.
#pragma once

#include "common.cuh"

namespace kvo_cuda {

// The minimum of v over the block (every thread gets it). Call from every thread of the block;
// two calls must be separated by a __syncthreads (they share one shared array).
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

// The first illegal entry of the whole index [0, n), or kNoEntry, scanned by this block alone;
// every thread of the block gets it (called as block_min is).
template <typename IdxT>
__device__ __forceinline__ int64_t block_scan(const void* index, int64_t stride, int64_t n, int64_t num_slots,
                                              int32_t negative_ok) {
  return block_min(first_illegal<IdxT>(index, stride, 0, n, threadIdx.x, blockDim.x, num_slots, negative_ok));
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
  if (threadIdx.x >= 32) return;
  if (threadIdx.x == 0) words[blockIdx.x] = first < n ? first : n;
  if (fold == nullptr) return;  // uniform over the grid
  int last = 0;
  if (threadIdx.x == 0) {
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
    first = block_scan<IdxT>(index, stride, n, num_slots, c.negative_ok);
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

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// What grid_verdict returns to a block that waited past its deadline.
constexpr int64_t kVerdictLate = -1;

// The grid's verdict for SlotCheck mode 3: the minimum of every block's `first` (its first illegal
// entry, or kNoEntry), returned to every thread of every block once every block has called it. A
// barrier over the grid: the launcher sizes the grid so every block can be resident at once, and
// every block must call it exactly once, from every thread.
//
// Where blocks of the grid cannot all be resident (another grid on another stream holds part of
// the device, and may itself be waiting for room this grid holds: two barrier grids under stream
// priorities, or under MPS), a block that has waited `deadline_ns` stops waiting and gets
// kVerdictLate: it then scans the whole index itself (the same verdict, a few microseconds of L2
// reads) and goes on, so it leaves the device in time and no grid waits forever.
//
// `state` is the stream's SlotCheck::barrier: [0] the blocks arrived, [1] a generation count, [2]
// and [3] the minimum of even and odd generations, kNoEntry between calls. Thread 0 of each block
// folds its `first` into its generation's word and arrives; the last block to arrive resets the
// count and the other generation's word (no block reads it before the next call, which runs after
// this grid has completed), then bumps the generation, which releases the others (a block gone
// past its deadline has arrived, so the count still reaches the grid). One poller per block, a
// few hundred at most.
__device__ __forceinline__ int64_t grid_verdict(uint64_t* state, int64_t first, uint64_t deadline_ns) {
  __shared__ int64_t verdict;
  if (threadIdx.x == 0) {
    const uint64_t gen = load_acquire(state + 1);
    int64_t* word = reinterpret_cast<int64_t*>(state + 2 + (gen & 1));
    if (first != kNoEntry) atomicMin(reinterpret_cast<long long*>(word), static_cast<long long>(first));
    __threadfence();  // the fold (and the generation read) before the arrival
    const uint64_t arrived = atomicAdd(reinterpret_cast<unsigned long long*>(state), 1ULL);
    bool late = false;
    if (arrived == gridDim.x - 1) {
      atomicExch(reinterpret_cast<unsigned long long*>(state), 0ULL);
      atomicExch(reinterpret_cast<unsigned long long*>(state + 2 + ((gen + 1) & 1)),
                 static_cast<unsigned long long>(kNoEntry));
      __threadfence();
      atomicAdd(reinterpret_cast<unsigned long long*>(state + 1), 1ULL);
    } else {
      const uint64_t start = global_ns();
      while (load_acquire(state + 1) == gen) {
        if (global_ns() - start >= deadline_ns) {
          late = true;
          break;
        }
        __nanosleep(32);
      }
    }
    verdict = late ? kVerdictLate : static_cast<int64_t>(load_acquire(reinterpret_cast<const uint64_t*>(word)));
  }
  __syncthreads();
  return verdict;
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
