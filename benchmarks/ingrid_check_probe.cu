// Probe of where a validating MLA write (nope 1024 B + rope 128 B -> a 1152-byte row at a slot of an
// int64 index, N = 16384) loses time eagerly on the H100, next to its unchecked twin: back-to-back
// launches with programmatic dependent launch, 4 input sets rotated past the L2, CUDA events around
// 200 calls, the variants alternated round by round, median of 9 rounds. Every variant is first
// checked to write exactly the expected cache, and the checking ones to write nothing for an index
// with one illegal entry.
//
//   unchecked            one warp per row (no cap), L2 prefetch of the row before griddepcontrol.wait
//   check-grid           a check grid (16 blocks of 1024 entries) that lets the writer launch after
//                        its own wait; the writer loads its first row before its wait and reads the
//                        verdict words after it (csrc/check.cu's default order)
//   check-grid-early     the check grid lets the writer launch at once, before its own wait; the
//                        writer prefetches its row into the L2 before its wait and loads after it
//                        (csrc/check.cu with check_early = 1, and the Triton check grid's order;
//                        /64: 64 check blocks)
//   static-ingrid        one launch: blocks 0..15 check a chunk each after the wait, the last one
//                        publishes the verdict in 32 words a line apart, every block polls one
//                        (the best case of a check inside the writer; not a safe design)
//   <variant>@B          unchecked, check-grid and check-grid-early with the writer capped at B
//                        resident blocks per SM (B = 12, 8, 6)
//   persist/R            a grid of as many blocks as fit at once; each warp loads its first R rows
//                        into registers after the wait while the grid checks the index itself:
//                        blocks claim chunks from a counter (no block waits on one that is not
//                        resident), publish and count them, and poll the count before storing;
//                        persist-unchecked/R skips the check, persist-cg/R follows a check grid
//                        that launches it after its own wait (its rows loaded before its wait)
//
// The counters of a persist/R call live in one of three slots (call g uses g % 3 and clears
// (g + 1) % 3, last used by call g - 2, which has completed before call g passes its wait).
// Result on one H100 (docs/benchmarks.md), five runs, with 2 or 4 slots per row written alike:
// unchecked 15.1-15.3 us, check-grid 16.7-16.9, check-grid-early 15.7-15.9 (64 blocks: 15.7-15.8),
// static-ingrid 23.4, persist/R 20.9-21.8: polling a verdict inside the writer costs more than a
// grid boundary, and at 16 resident blocks per SM an early launch of the writer hides most of the
// check. The @B variants cap the writers at B blocks per SM (unused shared memory), as the op's
// writer is capped at 8 by its 64 registers a thread: at 8, unchecked 13.75 us, check-grid 16.77,
// check-grid-early 16.06, the op's own figures (benchmarks/check_order.py).
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/ingrid benchmarks/ingrid_check_probe.cu
//   /tmp/ingrid [slots per row written, default 4]
#include <cuda_runtime.h>

#include "../oracle/kernels/cuda/csrc/common.cuh"

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#define CK(x)                                                              \
  do {                                                                     \
    cudaError_t e = (x);                                                   \
    if (e != cudaSuccess) {                                                \
      printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      exit(1);                                                             \
    }                                                                      \
  } while (0)

constexpr int C = 72, U = 3;  // 72 chunks of 16 B a row; lane takes chunks lane, lane + 32, lane + 64
constexpr int64_t kChunk = 1024;
constexpr int kMaxChunks = 64;
constexpr int64_t kNone = INT64_MAX;

struct Args {
  const unsigned char* nope;
  const unsigned char* rope;
  unsigned char* dst;
  const int64_t* loc;
  int64_t n, slots;
  const int64_t* verdict;  // check grid's words
  int verdicts;
  unsigned long long* state;  // 3 slots x 48 words: claimed @0, checked @16, first illegal @32
  int gen, chunks;
  int64_t* bad;  // where a rejected call leaves its first illegal entry (a probe of correctness)
};

__device__ __forceinline__ void pf(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }
__device__ __forceinline__ void pdl_wait() {
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
__device__ __forceinline__ const unsigned char* src_of(const Args& a, int64_t row, int c) {
  return c < 64 ? a.nope + row * 1024 + c * 16 : a.rope + row * 128 + (c - 64) * 16;
}
__device__ __forceinline__ void prefetch_row(const Args& a, int64_t row, int lane) {
  for (int c = lane * 2; c < C; c += 64) pf(src_of(a, row, c));  // one 32-byte sector per lane
  if (lane == 0) pf(a.loc + row);
}
__device__ __forceinline__ void load_row(const Args& a, int64_t row, int lane, uint4 (&r)[U]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = lane + 32 * u;
    if (c < C) r[u] = *reinterpret_cast<const uint4*>(src_of(a, row, c));
  }
}
__device__ __forceinline__ void store_row(const Args& a, int64_t slot, int lane, const uint4 (&r)[U]) {
  unsigned char* d = a.dst + slot * 1152;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int c = lane + 32 * u;
    if (c < C) *reinterpret_cast<uint4*>(d + c * 16) = r[u];
  }
}

__device__ int64_t block_min(int64_t v) {
  __shared__ int64_t w[32];
  for (int o = 16; o > 0; o >>= 1) v = min(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  if ((threadIdx.x & 31) == 0) w[threadIdx.x >> 5] = v;
  __syncthreads();
  v = (threadIdx.x & 31) < (blockDim.x >> 5) ? w[threadIdx.x & 31] : kNone;
  for (int o = 16; o > 0; o >>= 1) v = min(v, static_cast<int64_t>(__shfl_xor_sync(0xffffffffu, v, o)));
  __syncthreads();
  return v;
}
__device__ int64_t first_illegal(const Args& a, int64_t start, int64_t end) {
  int64_t first = kNone;
  for (int64_t i = start + threadIdx.x; i < end; i += 4 * blockDim.x) {
    int64_t s[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) s[u] = i + u * blockDim.x < end ? a.loc[i + u * blockDim.x] : 0;
#pragma unroll
    for (int u = 0; u < 4; ++u)
      if (i + u * blockDim.x < end && (s[u] < 0 || s[u] >= a.slots)) first = min(first, i + u * blockDim.x);
  }
  return first;
}

// ---------------------------------------------------------------- unchecked and check grid

__global__ void __launch_bounds__(128) unchecked(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row < a.n) prefetch_row(a, row, lane);
  pdl_wait();
  if (row >= a.n) return;
  const int64_t slot = a.loc[row];
  uint4 r[U];
  load_row(a, row, lane, r);
  if (slot >= 0 && slot < a.slots) store_row(a, slot, lane, r);
}

__global__ void __launch_bounds__(256) check_grid(const __grid_constant__ Args a, int64_t* verdict, int64_t chunk) {
  const int64_t start = blockIdx.x * chunk, end = min(start + chunk, a.n);
  for (int64_t i = start + threadIdx.x * 4; i < end; i += blockDim.x * 4) pf(a.loc + i);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t first = block_min(first_illegal(a, start, end));
  if (threadIdx.x == 0) verdict[blockIdx.x] = first;
}

__device__ bool verdict_ok(const Args& a) {
  int64_t m = kNone;
  for (int i = threadIdx.x; i < a.verdicts; i += blockDim.x) m = min(m, a.verdict[i]);
  return block_min(m) >= a.n;
}

__global__ void __launch_bounds__(128) checked_writer(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  int64_t slot = -1;
  uint4 r[U];
  if (row < a.n) {  // the check grid launched this grid after the kernels before it completed
    slot = a.loc[row];
    load_row(a, row, lane, r);
  }
  pdl_wait();
  if (!verdict_ok(a)) return;
  if (row < a.n && slot >= 0 && slot < a.slots) store_row(a, slot, lane, r);
}

// ---------------------------------------------------------------- persistent writers

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The grid's own check: every block claims chunks until none is left, then waits until every
// chunk is checked. Returns whether the call is legal (every thread).
__device__ bool ingrid_ok(const Args& a) {
  __shared__ int claim;
  __shared__ int legal;
  unsigned long long* st = a.state + 48 * (a.gen % 3);
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // clear the slot of the call after next
    unsigned long long* next = a.state + 48 * ((a.gen + 1) % 3);
    next[0] = 0;
    next[16] = 0;
    next[32] = static_cast<unsigned long long>(kNone);
  }
  for (;;) {
    if (threadIdx.x == 0) claim = static_cast<int>(atomicAdd(st, 1ull));
    __syncthreads();
    const int k = claim;
    __syncthreads();
    if (k >= a.chunks) break;
    const int64_t chunk = (a.n + a.chunks - 1) / a.chunks;
    const int64_t first = block_min(first_illegal(a, k * chunk, min((k + 1) * chunk, a.n)));
    if (threadIdx.x == 0) {
      if (first < a.n) atomicMin(reinterpret_cast<long long*>(st + 32), static_cast<long long>(first));
      __threadfence();
      asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(st + 16) : "memory");
    }
  }
  if (threadIdx.x == 0) {
    while (ld_acquire(st + 16) < static_cast<unsigned long long>(a.chunks)) {
    }
    const long long first = static_cast<long long>(ld_acquire(st + 32));
    legal = first >= a.n;
    if (!legal && blockIdx.x == 0) *a.bad = first;
  }
  __syncthreads();
  return legal != 0;
}

template <int Check, int R>  // Check 0: none, 1: after a check grid, 2: in-grid
__global__ void __launch_bounds__(128) persistent(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t warps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  uint4 r[R][U];
  int64_t slot[R];
  if (Check != 1)
    for (int j = 0; j < R; ++j)
      if (warp + j * warps < a.n) prefetch_row(a, warp + j * warps, lane);
  if (Check != 1) pdl_wait();
#pragma unroll
  for (int j = 0; j < R; ++j) {
    const int64_t row = warp + j * warps;
    slot[j] = row < a.n ? a.loc[row] : -1;
    if (row < a.n) load_row(a, row, lane, r[j]);
  }
  if (Check == 1) pdl_wait();
  bool ok = true;
  if (Check == 1) ok = verdict_ok(a);
  if (Check == 2) ok = ingrid_ok(a);
  if (!ok) return;
#pragma unroll
  for (int j = 0; j < R; ++j)
    if (slot[j] >= 0 && slot[j] < a.slots) store_row(a, slot[j], lane, r[j]);
  for (int64_t row = warp + R * warps; row < a.n; row += warps) {
    const int64_t s = a.loc[row];
    uint4 q[U];
    load_row(a, row, lane, q);
    if (s >= 0 && s < a.slots) store_row(a, s, lane, q);
  }
}


// ---------------------------------------------------------------- early trigger, static in-grid

// The check grid lets its dependent launch at once (before its own wait): the writer then prefetches
// its row into the L2 while the kernels before the check grid still run, and waits for the check.
__global__ void __launch_bounds__(256) check_grid_early(const __grid_constant__ Args a, int64_t* verdict, int64_t chunk) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  const int64_t start = blockIdx.x * chunk, end = min(start + chunk, a.n);
  for (int64_t i = start + threadIdx.x * 4; i < end; i += blockDim.x * 4) pf(a.loc + i);
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const int64_t first = block_min(first_illegal(a, start, end));
  if (threadIdx.x == 0) verdict[blockIdx.x] = first;
}

__global__ void __launch_bounds__(128) prefetching_writer(const __grid_constant__ Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row < a.n) prefetch_row(a, row, lane);
  pdl_wait();
  if (!verdict_ok(a)) return;
  if (row >= a.n) return;
  const int64_t slot = a.loc[row];
  uint4 r[U];
  load_row(a, row, lane, r);
  if (slot >= 0 && slot < a.slots) store_row(a, slot, lane, r);
}

// One warp per row; blocks 0..chunks-1 check chunk blockIdx after the wait (assumes they are
// resident: a probe of the best case, not a safe design); the last to finish publishes the verdict
// in 32 words a line apart, tagged with the call's generation, and every block polls one of them.
__global__ void __launch_bounds__(128) static_ingrid(const __grid_constant__ Args a) {
  __shared__ int legal;
  const int lane = threadIdx.x & 31;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  if (row < a.n) prefetch_row(a, row, lane);
  pdl_wait();
  int64_t slot = -1;
  uint4 r[U];
  if (row < a.n) {
    slot = a.loc[row];
    load_row(a, row, lane, r);
  }
  unsigned long long* st = a.state;  // [0] done count (monotonic), [32 + 16 i] ready words, [16] min
  const unsigned long long tag = static_cast<unsigned long long>(a.gen + 1) << 1;
  if (blockIdx.x < static_cast<unsigned>(a.chunks)) {
    const int64_t chunk = (a.n + a.chunks - 1) / a.chunks;
    const int64_t k = blockIdx.x;
    const int64_t first = block_min(first_illegal(a, k * chunk, min((k + 1) * chunk, a.n)));
    if (threadIdx.x == 0) {
      if (first < a.n) atomicMin(reinterpret_cast<long long*>(st + 16), static_cast<long long>(first));
      __threadfence();
      const unsigned long long done = atomicAdd(st, 1ull);
      if (done + 1 == static_cast<unsigned long long>(a.gen + 1) * a.chunks) {  // the last chunk of this call
        __threadfence();
        const long long m = static_cast<long long>(atomicExch(st + 16, static_cast<unsigned long long>(kNone)));
        if (m < a.n) *a.bad = m;
        const unsigned long long word = tag | (m < a.n ? 1ull : 0ull);
        for (int i = 0; i < 32; ++i) asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(st + 32 + 16 * i), "l"(word) : "memory");
      }
    }
  }
  if (threadIdx.x == 0) {
    unsigned long long w;
    do w = ld_acquire(st + 32 + 16 * (blockIdx.x & 31)); while ((w & ~1ull) != tag);
    legal = (w & 1ull) == 0;
  }
  __syncthreads();
  if (!legal) return;
  if (row < a.n && slot >= 0 && slot < a.slots) store_row(a, slot, lane, r);
}

// ---------------------------------------------------------------- host

// Every launch asks for programmatic dependent launch, through the project's own launcher. `smem`:
// unused dynamic shared memory, which caps the blocks resident per SM (the op's writer, at 64
// registers a thread, fits 8 blocks of 128 threads per SM; this probe's, at 22, 16).
template <typename K, typename... P>
void launch_smem(K kernel, unsigned grid, int threads, size_t smem, cudaStream_t s, P... args) {
  CK(kvo_cuda::launch_kernel(kernel, grid, threads, smem, s, true, args...));
}

template <typename K, typename... P>
void launch(K kernel, unsigned grid, int threads, cudaStream_t s, P... args) {
  launch_smem(kernel, grid, threads, 0, s, args...);
}

int main(int argc, char** argv) {
  // argv[1]: the cache's slots per row written (4 by default; oracle bench's workload has 2)
  const int64_t n = 16384, slots = (argc > 1 ? atoi(argv[1]) : 4) * n;
  printf("N = %lld rows into a cache of %lld slots\n", (long long)n, (long long)slots);
  const int sets = 4, calls = 200, rounds = 9;
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::vector<Args> as(sets);
  std::mt19937_64 rng(7);
  std::vector<unsigned char*> cs(sets), cd(sets);
  int64_t *verdict, *bad;
  unsigned long long* state;
  CK(cudaMalloc(&verdict, 64 * 8));
  CK(cudaMalloc(&bad, 8));
  CK(cudaMalloc(&state, 3 * 48 * 8));
  unsigned long long* sstate;
  CK(cudaMalloc(&sstate, 48 * 16 * 8));
  {
    std::vector<unsigned long long> z(48 * 16, 0);
    z[16] = static_cast<unsigned long long>(kNone);
    CK(cudaMemcpy(sstate, z.data(), z.size() * 8, cudaMemcpyHostToDevice));
  }
  std::vector<unsigned long long> init(3 * 48, 0);
  for (int g = 0; g < 3; ++g) init[48 * g + 32] = static_cast<unsigned long long>(kNone);
  CK(cudaMemcpy(state, init.data(), init.size() * 8, cudaMemcpyHostToDevice));
  for (int k = 0; k < sets; ++k) {
    Args& a = as[k];
    unsigned char *nope, *rope, *dst;
    int64_t* loc;
    CK(cudaMalloc(&nope, n * 1024));
    CK(cudaMalloc(&rope, n * 128));
    CK(cudaMalloc(&dst, slots * 1152));
    CK(cudaMalloc(&loc, n * 8));
    CK(cudaMemset(nope, 0x11 + k, n * 1024));
    CK(cudaMemset(rope, 0x22 + k, n * 128));
    std::vector<int64_t> perm(slots);
    for (int64_t i = 0; i < slots; ++i) perm[i] = i;
    std::shuffle(perm.begin(), perm.end(), rng);
    CK(cudaMemcpy(loc, perm.data(), n * 8, cudaMemcpyHostToDevice));
    a = Args{nope, rope, dst, loc, n, slots, verdict, 0, state, 0, 0, bad};
    CK(cudaMalloc(&cs[k], n * 1152));
    CK(cudaMalloc(&cd[k], n * 1152));
  }
  CK(cudaDeviceSynchronize());
  const int64_t chunks = std::min<int64_t>((n + kChunk - 1) / kChunk, kMaxChunks);
  const int64_t cchunk = (n + chunks - 1) / chunks;
  int gen = 0;
  auto occupancy = [&](auto kernel) {
    int b = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, kernel, 128, 0));
    return static_cast<unsigned>(b * sms);
  };
  const unsigned rows_grid = static_cast<unsigned>((n * 32 + 127) / 128);
  struct Variant {
    std::string name;
    std::function<void(int)> call;
  };
  std::vector<Variant> vs;
  vs.push_back({"copy (cudaMemcpyAsync)", [&](int k) { CK(cudaMemcpyAsync(cd[k], cs[k], n * 1152, cudaMemcpyDeviceToDevice, s)); }});
  vs.push_back({"unchecked", [&](int k) { launch(unchecked, rows_grid, 128, s, as[k]); }});
  vs.push_back({"check-grid", [&](int k) {
                  Args a = as[k];
                  a.verdicts = static_cast<int>(chunks);
                  launch(check_grid, static_cast<unsigned>(chunks), 256, s, a, verdict, cchunk);
                  launch(checked_writer, rows_grid, 128, s, a);
                }});
  vs.push_back({"check-grid-early", [&](int k) {
                  Args a = as[k];
                  a.verdicts = static_cast<int>(chunks);
                  launch(check_grid_early, static_cast<unsigned>(chunks), 256, s, a, verdict, cchunk);
                  launch(prefetching_writer, rows_grid, 128, s, a);
                }});
  for (int bps : {12, 8, 6}) {  // writers capped at bps resident blocks per SM
    const size_t smem = static_cast<size_t>(228 * 1024 / bps - 1024) / 128 * 128;
    int got = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&got, unchecked, 128, smem));
    printf("writers at %d blocks per SM: %zu bytes of shared memory each, %d fit\n", bps, smem, got);
    const std::string at = "@" + std::to_string(bps);
    vs.push_back({"unchecked" + at, [=, &as](int k) { launch_smem(unchecked, rows_grid, 128, smem, s, as[k]); }});
    vs.push_back({"check-grid" + at, [=, &as](int k) {
                    Args a = as[k];
                    a.verdicts = static_cast<int>(chunks);
                    launch(check_grid, static_cast<unsigned>(chunks), 256, s, a, verdict, cchunk);
                    launch_smem(checked_writer, rows_grid, 128, smem, s, a);
                  }});
    vs.push_back({"check-grid-early" + at, [=, &as](int k) {
                    Args a = as[k];
                    a.verdicts = static_cast<int>(chunks);
                    launch(check_grid_early, static_cast<unsigned>(chunks), 256, s, a, verdict, cchunk);
                    launch_smem(prefetching_writer, rows_grid, 128, smem, s, a);
                  }});
  }
  const int64_t chunks64 = 64, cchunk64 = (n + 63) / 64;
  vs.push_back({"check-grid-early/64", [&](int k) {
                  Args a = as[k];
                  a.verdicts = static_cast<int>(chunks64);
                  launch(check_grid_early, static_cast<unsigned>(chunks64), 256, s, a, verdict, cchunk64);
                  launch(prefetching_writer, rows_grid, 128, s, a);
                }});
  int sgen = 0;
  vs.push_back({"static-ingrid", [&](int k) {
                  Args a = as[k];
                  a.state = sstate;
                  a.gen = sgen++;
                  a.chunks = static_cast<int>(chunks);
                  launch(static_ingrid, rows_grid, 128, s, a);
                }});
  auto add_persist = [&](auto r_tag) {
    constexpr int R = decltype(r_tag)::value;
    const unsigned g0 = occupancy(persistent<0, R>), g1 = occupancy(persistent<1, R>), g2 = occupancy(persistent<2, R>);
    printf("persistent R=%d grids: %u %u %u blocks\n", R, g0, g1, g2);
    vs.push_back({"persist-unchecked/" + std::to_string(R), [=, &as](int k) { launch(persistent<0, R>, g0, 128, s, as[k]); }});
    vs.push_back({"persist-cg/" + std::to_string(R), [=, &as](int k) {
                    Args a = as[k];
                    a.verdicts = static_cast<int>(chunks);
                    launch(check_grid, static_cast<unsigned>(chunks), 256, s, a, verdict, cchunk);
                    launch(persistent<1, R>, g1, 128, s, a);
                  }});
    vs.push_back({"persist/" + std::to_string(R), [=, &as, &gen](int k) {
                    Args a = as[k];
                    a.gen = gen++;
                    a.chunks = static_cast<int>(chunks);
                    launch(persistent<2, R>, g2, 128, s, a);
                  }});
  };
  add_persist(std::integral_constant<int, 1>{});
  add_persist(std::integral_constant<int, 4>{});

  // Correctness: each variant writes set 0's rows exactly; an illegal slot stops the in-grid one.
  {
    std::vector<unsigned char> want(slots * 1152), got(slots * 1152);
    for (auto& v : vs) {
      if (v.name.rfind("copy", 0) == 0) continue;
      CK(cudaMemsetAsync(as[0].dst, 0xEE, slots * 1152, s));
      v.call(0);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), as[0].dst, slots * 1152, cudaMemcpyDeviceToHost));
      std::vector<int64_t> loc(n);
      CK(cudaMemcpy(loc.data(), const_cast<int64_t*>(as[0].loc), n * 8, cudaMemcpyDeviceToHost));
      std::fill(want.begin(), want.end(), 0xEE);
      for (int64_t i = 0; i < n; ++i) {
        std::fill(want.begin() + loc[i] * 1152, want.begin() + loc[i] * 1152 + 1024, 0x11);
        std::fill(want.begin() + loc[i] * 1152 + 1024, want.begin() + loc[i] * 1152 + 1152, 0x22);
      }
      printf("%-24s writes %s\n", v.name.c_str(), want == got ? "exactly" : "WRONG");
    }
    // an illegal entry at 9999: nothing written
    std::vector<int64_t> loc(n);
    CK(cudaMemcpy(loc.data(), const_cast<int64_t*>(as[0].loc), n * 8, cudaMemcpyDeviceToHost));
    const int64_t keep = loc[9999];
    loc[9999] = slots + 5;
    CK(cudaMemcpy(const_cast<int64_t*>(as[0].loc), loc.data(), n * 8, cudaMemcpyHostToDevice));
    CK(cudaDeviceSynchronize());
    for (auto& v : vs) {
      if (v.name.rfind("persist/", 0) != 0 && v.name.rfind("check-grid", 0) != 0 && v.name != "static-ingrid" && v.name.rfind("persist-cg", 0) != 0) continue;
      CK(cudaMemsetAsync(as[0].dst, 0xEE, slots * 1152, s));
      CK(cudaMemsetAsync(bad, 0xFF, 8, s));
      v.call(0);
      CK(cudaStreamSynchronize(s));
      CK(cudaMemcpy(got.data(), as[0].dst, slots * 1152, cudaMemcpyDeviceToHost));
      int64_t b = 0;
      CK(cudaMemcpy(&b, bad, 8, cudaMemcpyDeviceToHost));
      const bool untouched = std::all_of(got.begin(), got.end(), [](unsigned char c) { return c == 0xEE; });
      printf("%-24s illegal entry: %s (reported %lld)\n", v.name.c_str(), untouched ? "nothing written" : "WROTE", (long long)b);
    }
    loc[9999] = keep;
    CK(cudaMemcpy(const_cast<int64_t*>(as[0].loc), loc.data(), n * 8, cudaMemcpyHostToDevice));
  }

  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<std::vector<float>> us(vs.size());
  for (int round = 0; round < rounds; ++round)
    for (size_t v = 0; v < vs.size(); ++v) {
      for (int i = 0; i < 20; ++i) vs[v].call(i % sets);
      CK(cudaEventRecord(e0, s));
      for (int i = 0; i < calls; ++i) vs[v].call(i % sets);
      CK(cudaEventRecord(e1, s));
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      us[v].push_back(ms * 1000.f / calls);
    }
  const double ceiling_bytes = 2.0 * n * 1152;
  for (size_t v = 0; v < vs.size(); ++v) {
    auto x = us[v];
    std::sort(x.begin(), x.end());
    printf("%-24s median %6.2f us  (min %6.2f, max %6.2f)  %5.0f GB/s\n", vs[v].name.c_str(), x[x.size() / 2], x.front(),
           x.back(), ceiling_bytes / (x[x.size() / 2] * 1e3));
  }
  return 0;
}
