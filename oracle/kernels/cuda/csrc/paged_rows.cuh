// The one warp-per-(row, side) kernel behind the paged writers: bitwise copies (copy.cu) and fp8
// quantizing writes (fp8.cu) differ only in what happens to a chunk between its load and its
// store, so both instantiate paged_rows_kernel with a Chunk transform:
//
//   struct Chunk {
//     static constexpr int kIn;       // bytes of source read per chunk (one vector load)
//     static constexpr int kOut;      // bytes of cache written per chunk (one vector store)
//     static constexpr bool kScaled;  // whether apply() uses the head's scale
//     using Factor;                   // what apply() needs of a scale, prepared once per scale
//     __device__ static Factor factor(float scale);
//     __device__ static Out apply(const In& v, const Factor& f);
//   };
//
// Work item w in [0, sides * n): side w / n, row w % n. A warp loads the row's slot and its first
// U chunks per lane together (the data loads do not wait for the slot), then stores them, so each
// warp keeps 32 * U * kIn bytes in flight. With `prefetch` set, each warp first asks the L2 for
// its first item's source row and slot (under PDL before the wait; see prefetch_l2). Slots outside
// [0, num_slots) are skipped, so the kernel never writes outside a cache; a validating call first
// decides on the device whether every slot is legal (SlotCheck, call_is_legal) and stores nothing
// if one is not. Dense: every side's row is one head (with one scale), so chunk c sits at
// c * kIn of the source row and c * kOut of the cache row: no head split, no per-chunk offsets
// kept in registers.
#pragma once

#include "slot_check.cuh"

namespace kvo_cuda {

constexpr int kRowUnroll = 4;

// Ask the L2 for work item `item`'s source row (head by head) and its slot (see prefetch_l2).
template <typename IdxT, int In>
__device__ __forceinline__ void prefetch_item(const PagedArgs& a, int64_t item, int lane) {
  const int s = item >= a.n ? 1 : 0;
  const int64_t row = item - (s ? a.n : 0);
  const Side& d = a.side[s];
  if (a.dense || d.src_head == d.head_chunks * In) {
    prefetch_l2(d.src + row * d.src_row, d.heads * d.head_chunks * In, lane);
  } else {
    for (int64_t h = 0; h < d.heads; ++h)
      prefetch_l2(d.src + row * d.src_row + h * d.src_head, d.head_chunks * In, lane);
  }
  if (lane == 0 && s == 0) prefetch_slot<IdxT>(a.index, row, a.index_stride);
}

// Element `lane` of each side's scale (1 past its length or its sides): the first elements a lane
// checks (scales_are_legal), loaded right after the PDL wait, so the check's memory round trip
// overlaps the slot verdict's and the first rows' instead of following them.
struct ScaleProbe {
  float first[2];
};

__device__ __forceinline__ ScaleProbe probe_scales(const PagedArgs& a) {
  const int lane = threadIdx.x & 31;
  ScaleProbe p;
#pragma unroll
  for (int s = 0; s < 2; ++s)
    p.first[s] = s < a.sides && lane < a.side[s].scale_count ? __ldg(a.side[s].scale + lane * a.side[s].scale_stride)
                                                              : 1.0f;
  return p;
}

// Ask the L2 for every side's scale before the PDL wait (first warp of each block; prefetch_l2),
// as prefetch_verdict does for the verdict: the scale check's loads then find it there, where a
// scale of inputs rotated past the L2 would otherwise cost a DRAM round trip before the first store.
__device__ __forceinline__ void prefetch_scales(const PagedArgs& a) {
  if (threadIdx.x >= 32) return;
  for (int s = 0; s < a.sides; ++s) {
    const Side& d = a.side[s];
    const int64_t span = (d.scale_count - 1) * (d.scale_stride ? d.scale_stride : 1) + 1;
    prefetch_l2(reinterpret_cast<const unsigned char*>(d.scale), span * 4, static_cast<int>(threadIdx.x));
  }
}

// Whether every element of every side's scale is a finite float32 > 0 (an fp8 write of a
// validating call: the scales are checked beside the slots, as the reference rejects a NaN, inf,
// zero or negative scale). `k_first`, `v_first`: the lane's ScaleProbe. Warp-uniform: every lane
// of the warp calls it, after the slot verdict found every slot legal. Where an element is not,
// thread 0 of block 0 reports the first one (K's before V's) in the mailbox: kind 2, [1] the
// argument code, [2] the float32 bits, [3] the element, [4] the scale's length
// (oracle.kernels._deferred).
static __device__ __noinline__ bool scales_are_legal(const PagedArgs& a, float k_first, float v_first,
                                                     volatile int64_t* mailbox) {
  const int lane = threadIdx.x & 31;
  for (int s = 0; s < a.sides; ++s) {
    const Side& d = a.side[s];
    int64_t bad = kNoEntry;
    uint32_t bits = 0;
    for (int64_t h = lane; h < d.scale_count; h += 32) {
      const float v = h == lane ? (s == 0 ? k_first : v_first) : __ldg(d.scale + h * d.scale_stride);
      if (!(v > 0.0f && v <= 3.402823466e38f)) {  // NaN fails both comparisons
        bad = h;
        bits = __float_as_uint(v);
        break;
      }
    }
    int64_t first = bad;
    for (int o = 16; o > 0; o >>= 1) first = min(first, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, first, o)));
    if (first == kNoEntry) continue;
    const unsigned holder = __ffs(__ballot_sync(0xffffffffu, bad == first)) - 1;
    bits = __shfl_sync(0xffffffffu, bits, holder);
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      mailbox[1] = s == 0 ? kScaleArgumentK : kScaleArgumentV;
      mailbox[2] = bits;
      mailbox[3] = first;
      mailbox[4] = d.scale_count;
      __threadfence_system();  // the host may read word 0 without synchronizing
      mailbox[0] = 2;
    }
    return false;
  }
  return true;
}

// The verdict-only build's gate (verdict_gate) with its scale check: the lane's first scale
// elements are loaded just before the verdict, so the two memory round trips overlap, and judged
// after it (scales_are_legal). Copies and the other builds (the full one checks before its loop)
// take the slot verdict alone.
template <typename IdxT, typename Chunk, int Check>
__device__ __forceinline__ bool gate_with_scales(bool& judged, const PagedArgs& a) {
  if constexpr (Chunk::kScaled && Check == kCheckVerdict) {
    const ScaleProbe p = probe_scales(a);
    return verdict_gate<IdxT>(judged, a) && scales_are_legal(a, p.first[0], p.first[1], a.check.mailbox);
  }
  return verdict_gate<IdxT>(judged, a);
}

// Check: the build's CheckCode (slot_check.cuh; check_code picks it per launch).
template <typename IdxT, typename Chunk, bool Dense, int Check>
__global__ void __launch_bounds__(kThreads) paged_rows_kernel(const __grid_constant__ PagedArgs a, int prefetch) {
  using In = typename VecOf<Chunk::kIn>::type;
  const int lane = threadIdx.x & 31;
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t step = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  const int64_t items = a.n * a.sides;
  if (prefetch && first < items) prefetch_item<IdxT, Chunk::kIn>(a, first, lane);
  // A dense row's chunks base, base + 32, ... (base: the lane's first) of one round of loads.
  auto load_dense = [&](const unsigned char* src, int64_t chunks, int64_t base, In (&r)[kRowUnroll]) {
#pragma unroll
    for (int u = 0; u < kRowUnroll; ++u)
      if (base + u * 32 < chunks) r[u] = load_ro<Chunk::kIn>(src + (base + u * 32) * Chunk::kIn);
  };
  // In the full build (CheckCode), a call that scans a short index itself (SlotCheck mode 1) loads
  // a dense row that fits one round of loads right after the PDL wait, beside the scan's loads, so
  // the row's memory round trip overlaps the scan; only the stores wait for the verdict. A call
  // that reads a verdict (mode 2) loads it right after the wait too, beside the verdict's read, and
  // nothing before the wait, as a check grid may have let this grid launch while the kernels before
  // it still run (check.cu) and an index checked beforehand leaves the launch as it is; unless the
  // check grid let it launch only once they had completed (SlotCheck::late): then before the wait.
  // The verdict-only build loads nothing early, as it keeps fewer registers (more of its blocks fit
  // on an SM), and reads the verdict inside the loop instead (verdict_gate), once per warp, right
  // after its first item's loads: the two memory round trips overlap, for every wave of warps.
  bool early = false;
  int64_t early_slot = -1;
  In early_r[kRowUnroll];
  auto load_early = [&] {
    if constexpr (Dense) {
      if (first < items) {
        const int s = first >= a.n ? 1 : 0;
        const int64_t row = first - (s ? a.n : 0);
        const Side& d = a.side[s];
        const int64_t chunks = d.heads * d.head_chunks;
        early = chunks <= 32 * kRowUnroll;
        if (early) {
          early_slot = load_slot<IdxT>(a.index, row, a.index_stride);
          load_dense(d.src + row * d.src_row, chunks, lane, early_r);
        }
      }
    }
  };
  if constexpr (Chunk::kScaled && Check != kCheckNone) {
    if (a.check.mode != 0) prefetch_scales(a);
  }
  if constexpr (Check == kCheckFull) {
    prefetch_verdict(a.check);
    if (a.check.mode == 2 && a.check.late) load_early();
    pdl_prologue(a.pdl);
    if (a.check.mode == 1 || (a.check.mode == 2 && !a.check.late)) load_early();
    if constexpr (Chunk::kScaled) {
      if (a.check.mode != 0) {  // the scales' loads beside the slot check's
        const ScaleProbe p = probe_scales(a);
        if (!call_is_legal<IdxT>(a.check, a.index, a.index_stride, a.n, a.num_slots) ||
            !scales_are_legal(a, p.first[0], p.first[1], a.check.mailbox))
          return;
      }
    } else {
      if (a.check.mode != 0 && !call_is_legal<IdxT>(a.check, a.index, a.index_stride, a.n, a.num_slots)) return;
    }
  } else if constexpr (Check == kCheckVerdict) {
    prefetch_verdict(a.check);
    pdl_prologue(a.pdl);
  } else {
    pdl_prologue(a.pdl);
  }
  bool judged = Check != kCheckVerdict;
  for (int64_t item = first; item < items; item += step) {
    const int s = item >= a.n ? 1 : 0;
    const int64_t row = item - (s ? a.n : 0);
    const Side& d = a.side[s];
    const bool preloaded = early && item == first;  // then the row is one round of loads
    const int64_t slot = preloaded ? early_slot : load_slot<IdxT>(a.index, row, a.index_stride);
    const unsigned char* src = d.src + row * d.src_row;
    const int64_t chunks = d.heads * d.head_chunks;
    const bool keep = slot >= 0 && slot < a.num_slots;
    if constexpr (Dense) {
      const typename Chunk::Factor f = Chunk::factor(Chunk::kScaled ? __ldg(d.scale) : 1.0f);
      // A lane past a short row's chunks still takes one round in the verdict-only build, loading
      // nothing: verdict_gate needs the whole warp.
      for (int64_t base = lane; base < chunks || !judged; base += 32 * kRowUnroll) {
        In r[kRowUnroll];
        if (preloaded) {
#pragma unroll
          for (int u = 0; u < kRowUnroll; ++u) r[u] = early_r[u];
        } else {
          load_dense(src, chunks, base, r);
        }
        if (!judged && !gate_with_scales<IdxT, Chunk, Check>(judged, a)) return;
        if (!keep) break;  // uniform across the warp
        unsigned char* dst = row_of(a, d, slot);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u)
          if (base + u * 32 < chunks)
            store_global<Chunk::kOut>(dst + (base + u * 32) * Chunk::kOut, Chunk::apply(r[u], f));
      }
    } else {
      // The verdict before the loads here: read after them, it cost this path up to 24 registers a
      // thread (ptxas: 96 against 72 for the 16-byte fp8 build, two blocks an SM instead of three).
      if (!judged && !gate_with_scales<IdxT, Chunk, Check>(judged, a)) return;
      unsigned char* dst = nullptr;
      for (int64_t base = 0; base < chunks; base += 32 * kRowUnroll) {
        In r[kRowUnroll];
        int64_t head[kRowUnroll];
        int64_t out[kRowUnroll];
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
          const int64_t c = base + u * 32 + lane;
          out[u] = -1;
          head[u] = 0;
          if (c < chunks) {
            int64_t h, j;
            split_chunk(c, d.head_chunks, d.head_shift, h, j);
            r[u] = load_ro<Chunk::kIn>(src + h * d.src_head + j * Chunk::kIn);
            out[u] = h * d.dst_head + j * Chunk::kOut;
            head[u] = h;
          }
        }
        if (!keep) break;  // uniform across the warp
        if (dst == nullptr) dst = row_of(a, d, slot);
#pragma unroll
        for (int u = 0; u < kRowUnroll; ++u) {
          if (out[u] >= 0) {
            const typename Chunk::Factor f =
                Chunk::factor(Chunk::kScaled ? __ldg(d.scale + head[u] * d.scale_stride) : 1.0f);
            store_global<Chunk::kOut>(dst + out[u], Chunk::apply(r[u], f));
          }
        }
      }
    }
  }
}

// One launch of paged_rows_kernel over every (row, side), with at most `per_sm` blocks per SM
// (see grid_for; LaunchTuning::copy_grid or fp8_grid) and L2 prefetch mode `prefetch`
// (LaunchTuning::copy_prefetch or fp8_prefetch).
template <typename IdxT, typename Chunk>
cudaError_t launch_paged_rows(const PagedArgs& a, int per_sm, int prefetch, cudaStream_t stream) {
  return with_check(check_code(a.check, kPagedRowsFamily), [&](auto check) {
    constexpr int Check = decltype(check)::value;
    auto kernel = a.dense ? paged_rows_kernel<IdxT, Chunk, true, Check> : paged_rows_kernel<IdxT, Chunk, false, Check>;
    const unsigned grid = grid_for(kernel, a.n * a.sides, 0, kThreads, per_sm);
    return launch_kernel(kernel, grid, kThreads, 0, stream, a.pdl != 0, a, prefetch_for(prefetch, a.pdl != 0));
  });
}

}  // namespace kvo_cuda
