// Probe of the warp-per-row MLA write (nope 1024 B + rope 128 B -> a 1152-byte row at a random slot) on
// the H100: which 16-byte source load is fastest cold (4 input sets rotated, CUDA graph of 200 launches,
// median of 9), next to a cudaMemcpyAsync of the same bytes. Mode 0: ld.global.nc.L1::no_allocate (what
// csrc/common.cuh used), 1: plain ld.global, 2: ld.global.L1::no_allocate. Result:
// docs/benchmarks.md (plain loads 3% faster than either no_allocate form); it made the CUDA kernels
// use plain loads.
//
//   nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -o /tmp/mla_load_probe benchmarks/mla_load_probe.cu
//   /tmp/mla_load_probe
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); return 1; } } while (0)

struct Args { const unsigned char* nope; const unsigned char* rope; unsigned char* dst; const int64_t* loc; int64_t n; };

template <int Mode>  // 0: ld.global.nc.L1::no_allocate, 1: plain ld.global, 2: ld.global.L1::no_allocate (coherent)
__device__ __forceinline__ uint4 ld16(const unsigned char* p) {
  uint4 v;
  if constexpr (Mode == 0) asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  else if constexpr (Mode == 1) v = *reinterpret_cast<const uint4*>(p);
  else asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int Mode, int Rows>
__global__ void __launch_bounds__(256) mla(Args a) {
  const int lane = threadIdx.x & 31;
  const int64_t warp = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t first = warp * Rows;
  constexpr int C = 72, U = 3;  // 72 chunks of 16 B; lane takes chunks lane, lane+32, lane+64
  uint4 r[Rows][U];
  int64_t slot[Rows];
#pragma unroll
  for (int j = 0; j < Rows; ++j) {
    const int64_t row = first + j;
    slot[j] = row < a.n ? a.loc[row] : -1;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = lane + 32 * u;
      if (row < a.n && c < C) r[j][u] = ld16<Mode>(c < 64 ? a.nope + row * 1024 + c * 16 : a.rope + row * 128 + (c - 64) * 16);
    }
  }
#pragma unroll
  for (int j = 0; j < Rows; ++j) {
    if (slot[j] < 0) continue;
    unsigned char* d = a.dst + slot[j] * 1152;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int c = lane + 32 * u;
      if (c < C) *reinterpret_cast<uint4*>(d + c * 16) = r[j][u];
    }
  }
}

template <typename F>
float time_graph(F launch_set, int sets, cudaStream_t s) {
  cudaGraph_t g; cudaGraphExec_t ge;
  const int calls = 200;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  for (int i = 0; i < calls; ++i) launch_set(i % sets);
  cudaStreamEndCapture(s, &g);
  cudaGraphInstantiate(&ge, g, 0);
  cudaGraphLaunch(ge, s); cudaStreamSynchronize(s);
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  std::vector<float> t;
  for (int k = 0; k < 9; ++k) {
    cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1);
    float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000.f / calls);
  }
  std::sort(t.begin(), t.end());
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return t[4];
}

int main() {
  cudaStream_t s; CK(cudaStreamCreate(&s));
  for (int64_t n : {16384L, 65536L}) {
    const int sets = n == 16384 ? 4 : 1;
    std::vector<Args> as(sets);
    std::vector<unsigned char*> cpy_src(sets), cpy_dst(sets);
    for (int k = 0; k < sets; ++k) {
      unsigned char *nope, *rope, *dst; int64_t* loc;
      CK(cudaMalloc(&nope, n * 1024)); CK(cudaMalloc(&rope, n * 128)); CK(cudaMalloc(&dst, 2 * n * 1152)); CK(cudaMalloc(&loc, n * 8));
      cudaMemset(nope, 1, n * 1024); cudaMemset(rope, 2, n * 128);
      std::vector<int64_t> h(2 * n); for (int64_t i = 0; i < 2 * n; ++i) h[i] = i;
      uint64_t x = 88172645463325252ULL + k;
      for (int64_t i = 2 * n - 1; i > 0; --i) { x ^= x << 13; x ^= x >> 7; x ^= x << 17; std::swap(h[i], h[x % (i + 1)]); }
      CK(cudaMemcpy(loc, h.data(), n * 8, cudaMemcpyHostToDevice));
      as[k] = Args{nope, rope, dst, loc, n};
      CK(cudaMalloc(&cpy_src[k], n * 1152)); CK(cudaMalloc(&cpy_dst[k], n * 1152));
    }
    const double bytes = n * (1152.0 * 2 + 8);
    auto report = [&](const char* what, float us) { printf("N=%-6ld %-36s %7.2f us %7.1f GB/s\n", (long)n, what, us, bytes / us / 1e3); };
    report("cudaMemcpyAsync same bytes", time_graph([&](int k) { cudaMemcpyAsync(cpy_dst[k], cpy_src[k], n * 1152, cudaMemcpyDeviceToDevice, s); }, sets, s));
#define VAR(M, R, W) report("mode " #M " rows " #R " warps/block " #W, time_graph([&](int k) { \
      const int64_t warps = (n + R - 1) / R; mla<M, R><<<(warps + W - 1) / W, 32 * W, 0, s>>>(as[k]); }, sets, s));
    VAR(0, 1, 4) VAR(1, 1, 4) VAR(2, 1, 4) VAR(0, 2, 4) VAR(1, 2, 4) VAR(0, 1, 2) VAR(1, 1, 2) VAR(1, 2, 1) VAR(1, 1, 8) VAR(0, 2, 1)
  }
  CK(cudaGetLastError());
  return 0;
}
