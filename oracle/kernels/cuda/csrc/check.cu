// The check grid of a validating call on a long index (SlotCheck mode 2): block b finds the first
// illegal entry of its chunk and leaves it in words[b], and the last block folds them into one
// word (fold_verdict); the writer that follows, launched with programmatic dependent launch, reads
// that word after griddepcontrol.wait. Launched
// with PDL itself, the check asks the L2 for its share of the index before it waits for the kernel
// before it. It lets the writer launch either at once (`early` = 1, the default), so the writer is
// scheduled and asks the L2 for its sources while the kernels before the check still run, as an
// unchecked writer does after the writer before it, and loads nothing before its wait; or after
// that wait (`early` = 0), once the kernels before the check have completed, so the writer may load
// its first row before its own wait (SlotCheck::late) (LaunchTuning::check_early). The early order
// gains where many writer blocks fit on an SM: the verdict-only builds the writers take after an
// early check (CheckCode, slot_check.cuh) keep 40-64 registers a thread against the full build's 64-80,
// and are 2.0-2.3 us faster eagerly (benchmarks/check_order.py; docs/benchmarks.md).
#include "slot_check.cuh"

namespace kvo_cuda {
namespace {

// At most 32 registers a thread (8 blocks of 256 threads an SM): a block then needs 8192, which an
// SM full of the MLA writer's verdict-only blocks (40 registers, 128 threads) has once one of them
// has left; the fold's code took the kernel to 34, rounded up to 40, which needs two gone. Eagerly
// on the H100 the validating MLA write at N = 16384 took 16.21-16.25 us against 16.35-17.00
// (docs/benchmarks.md).
constexpr int kCheckBlocksPerSm = 8;

template <typename IdxT>
__global__ void __launch_bounds__(kThreads, kCheckBlocksPerSm)
    slot_check_kernel(const void* index, int64_t stride, int64_t n, int64_t num_slots, int32_t negative_ok,
                      int64_t chunk, int64_t* words, int64_t* fold, unsigned long long* arrivals, int32_t pdl,
                      int32_t early) {
  if (early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t start = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = start + chunk < n ? start + chunk : n;
  if (pdl && stride == 1 && start < end) {
    // While the kernel before it finishes, ask the L2 for this block's entries (a hint: see
    // prefetch_l2), each warp for its share, so the scan after the wait reads the L2, not DRAM.
    const int64_t warps = blockDim.x >> 5;
    const int64_t share = (end - start + warps - 1) / warps;
    const int64_t from = start + (threadIdx.x >> 5) * share;
    const int64_t to = from + share < end ? from + share : end;
    if (from < to)
      prefetch_l2(reinterpret_cast<const unsigned char*>(static_cast<const IdxT*>(index) + from),
                  (to - from) * static_cast<int64_t>(sizeof(IdxT)), threadIdx.x & 31);
  }
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (!early) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t first = block_min(first_illegal<IdxT>(index, stride, start, end, threadIdx.x, blockDim.x, num_slots,
                                                      negative_ok));
  fold_verdict(first, n, words, fold, arrivals);
}

// oracle.kernels.check_index on a CUDA index: block b copies entries [b * chunk, (b + 1) * chunk)
// into `copy` (contiguous) and leaves the first illegal one among them in words[b] (or n), folded
// into *fold as a check grid's, in one plain launch; the writers given the copy read that word.
template <typename IdxT>
__global__ void __launch_bounds__(kThreads) copy_check_kernel(const IdxT* index, int64_t stride, int64_t n,
                                                              int64_t num_slots, int32_t negative_ok, int64_t chunk,
                                                              IdxT* copy, int64_t* words, int64_t* fold,
                                                              unsigned long long* arrivals) {
  const int64_t start = static_cast<int64_t>(blockIdx.x) * chunk;
  const int64_t end = start + chunk < n ? start + chunk : n;
  const int64_t first = block_min(first_illegal<IdxT>(index, stride, start, end, threadIdx.x, blockDim.x, num_slots,
                                                      negative_ok, copy));
  fold_verdict(first, n, words, fold, arrivals);
}

}  // namespace

cudaError_t launch_copy_check(const void* index, int32_t index_type, int64_t index_stride, int64_t n,
                              int64_t num_slots, int32_t negative_ok, void* copy, const VerdictWords& verdict,
                              int blocks, int64_t chunk, cudaStream_t stream) {
  return with_index(index_type, [&](auto idx) {
    using IdxT = decltype(idx);
    return launch_kernel(copy_check_kernel<IdxT>, static_cast<unsigned>(blocks), kThreads, 0, stream, false,
                         static_cast<const IdxT*>(index), index_stride, n, num_slots, negative_ok, chunk,
                         static_cast<IdxT*>(copy), verdict.words, verdict.fold, verdict.arrivals);
  });
}

cudaError_t launch_slot_check(const void* index, int32_t index_type, int64_t index_stride, int64_t n,
                              int64_t num_slots, int32_t negative_ok, const VerdictWords& verdict, int blocks,
                              int64_t chunk, bool pdl, bool early, cudaStream_t stream) {
  return with_index(index_type, [&](auto idx) {
    return launch_kernel(slot_check_kernel<decltype(idx)>, static_cast<unsigned>(blocks), kThreads, 0, stream, pdl,
                         index, index_stride, n, num_slots, negative_ok, chunk, verdict.words, verdict.fold,
                         verdict.arrivals, static_cast<int32_t>(pdl),
                         static_cast<int32_t>(early));
  });
}

}  // namespace kvo_cuda
