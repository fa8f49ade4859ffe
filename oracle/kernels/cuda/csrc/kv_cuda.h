// The interface between the torch-facing binding (binding.cpp) and the CUDA kernels (*.cu).
//
// Plain C++ and the CUDA runtime only: raw pointers, 64-bit byte strides, a cudaStream_t. The
// binding validates everything and decides the vector widths; a launcher only launches (it
// returns the launch's cudaError_t). Every offset is int64 (caches past 2^31 elements work).
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace kvo_cuda {

enum IndexType : int32_t { kIndexInt32 = 0, kIndexInt64 = 1 };
enum SrcType : int32_t { kSrcFloat32 = 0, kSrcFloat16 = 1, kSrcBFloat16 = 2 };
enum Fp8Format : int32_t { kFp8None = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

// The device-side slot check of a validating call (check.cu; the binding plans it). Mode 0: none.
// Mode 1: every block scans the whole index before its first store (short indices: one launch).
// Mode 2: launch_slot_check ran first and left the first illegal entry in `verdict` (its fold of
// one word per chunk); the writer, launched with PDL after it (args.pdl set), reads it after
// griddepcontrol.wait.
// Mode 3 (launch_mla_checked only): the writer's own grid, all of it resident at once, loads its
// rows, scans the index and meets at a grid barrier before its first store.
// An entry is illegal when its slot is >= num_slots, or < 0 unless negative_ok. If any is, no block
// stores anything and block 0 writes the first one into `mailbox` (pinned host memory, zero-copy;
// layout in oracle/kernels/_deferred.py): words 1-6, a system fence, then word 0.
// "No illegal entry": the neutral value of the verdict words and of the grid barrier's minimum.
constexpr int64_t kNoEntry = INT64_MAX;

struct SlotCheck {
  const int64_t* verdict;    // mode 2: a check grid's fold (one word), or the words of an index
                             // checked beforehand (oracle.kernels.check_index: one from the CUDA
                             // library, one per chunk from the Triton kernel)
  uint64_t* barrier;         // mode 3: the stream's four grid-barrier words (grid_verdict, slot_check.cuh)
  int64_t* mailbox;          // int64[8] the host reads
  int32_t mode;
  int32_t verdict_count;
  int32_t negative_ok;
  int32_t arg_code;          // oracle.kernels._deferred.ARGUMENTS
  int32_t pad_code;          // oracle.kernels._deferred.PADDINGS
  int32_t late;              // mode 2: the check grid let the writer launch only after its own
                             // wait, so the writer may load before its wait (LaunchTuning::check_early 0)
  int64_t pad_slot;          // padding reserved:K's K (for the message)
};

// Where a check grid leaves its verdict: words[b] = the first illegal entry (see SlotCheck) among
// entries [b * chunk, (b + 1) * chunk) of the index, or n, for b < blocks; *fold = their minimum,
// written by the last block to arrive (arrivals: 0 before the grid, and again after it).
struct VerdictWords {
  int64_t* words;
  int64_t* fold;
  unsigned long long* arrivals;
};

// The check grid of mode 2. With `pdl` it waits for the previous grid first; it lets the next PDL
// launch be scheduled at once (`early`: that launch waits for this grid to complete) or after its wait.
// copy[i] = index[i * index_stride] for i < n, and the verdict as launch_slot_check's, in one plain
// launch (oracle.kernels.check_index).
cudaError_t launch_copy_check(const void* index, int32_t index_type, int64_t index_stride, int64_t n,
                              int64_t num_slots, int32_t negative_ok, void* copy, const VerdictWords& verdict,
                              int blocks, int64_t chunk, cudaStream_t stream);
cudaError_t launch_slot_check(const void* index, int32_t index_type, int64_t index_stride, int64_t n,
                              int64_t num_slots, int32_t negative_ok, const VerdictWords& verdict, int blocks,
                              int64_t chunk, bool pdl, bool early, cudaStream_t stream);

// One tensor pair a paged/flat writer copies: source rows [N, heads, head] into cache rows.
// A cache row (slot s) starts at dst + (s / block_size) * dst_block + (s % block_size) * dst_token;
// flat caches have block_size 1 and use dst_block as the slot stride. All strides in BYTES.
struct Side {
  const unsigned char* src;  // source row 0
  int64_t src_row;           // bytes between source rows (tokens)
  int64_t src_head;          // bytes between heads of a source row
  unsigned char* dst;        // the cache's slot 0
  int64_t dst_block;         // bytes between blocks (flat: between slots)
  int64_t dst_token;         // bytes between tokens of a block
  int64_t dst_head;          // bytes between heads of a cache row
  int64_t heads;             // heads per row (>= 1)
  int64_t head_chunks;       // chunks per head (a chunk: the launch's vector width / element group)
  int32_t head_shift;        // log2(head_chunks) when it is a power of two, else -1
  int32_t scale_count;       // fp8 only: the scale's elements (1 or the heads), all checked by a validating call
  const float* scale;        // fp8 only: [1] or [heads] float32 on the device
  int64_t scale_stride;      // elements between heads' scales (0: one scale for the tensor)
};

// The argument codes of K's and V's scales in a mailbox report (oracle.kernels._deferred.SCALE_ARGUMENTS).
constexpr int kScaleArgumentK = 3;
constexpr int kScaleArgumentV = 4;

struct PagedArgs {
  Side side[2];
  int32_t sides;             // 1 (one tensor) or 2 (K and V)
  int32_t index_type;        // IndexType
  const void* index;         // slot of each row
  int64_t index_stride;      // elements between index entries
  int64_t n;                 // rows per side
  int64_t num_slots;         // slots outside [0, num_slots) are skipped by the kernel
  int64_t block_size;        // slots per block (1 for flat caches)
  int32_t dense;             // every side has one head: chunk c sits at c * chunk bytes (the fast path)
  int32_t pdl;               // launched with programmatic dependent launch (see launch_kernel)
  SlotCheck check;           // the device-side slot check (mode 0: none)
};

// Every launcher honours args.pdl: when set, the kernel is launched with programmatic dependent
// launch (cudaLaunchAttributeProgrammaticStreamSerialization), so it may be scheduled while the
// previous kernel on the stream is still running; each block then waits (griddepcontrol.wait) for
// that kernel to complete and its memory to be visible before it reads or writes anything, and at
// once lets the next PDL launch be scheduled (griddepcontrol.launch_dependents). What overlaps is
// launch, block scheduling and the L2 prefetches (LaunchTuning::*_prefetch, hints), never a load
// or store.

// Bitwise copy of every row of every side; chunk = vec_bytes (16, 8, 4, 2 or 1), which must divide
// every source/cache pointer, row/head/block/token stride and head size.
cudaError_t launch_paged_copy(const PagedArgs& args, int vec_bytes, cudaStream_t stream);

// fp8 quantizing write: each chunk is `elems` source elements (of src_type) read, divided by the
// head's scale in float32 (IEEE division) and converted with cvt.rn.satfinite to `fmt`, written as
// `elems` bytes. elems is 16 / element size (the wide path) or 1.
cudaError_t launch_paged_fp8(const PagedArgs& args, int src_type, int fmt, int elems, cudaStream_t stream);

// sglang's MLA writer: row loc[i] of kv_buffer gets nope[i] (nope_bytes) then rope[i] (rope_bytes).
struct MlaArgs {
  const unsigned char* nope;
  int64_t nope_row;          // bytes between nope rows
  int64_t nope_bytes;
  const unsigned char* rope;
  int64_t rope_row;
  int64_t rope_bytes;
  unsigned char* dst;        // kv_buffer row 0
  int64_t dst_row;           // bytes between kv_buffer rows
  const void* index;
  int32_t index_type;
  int32_t pdl;               // launched with programmatic dependent launch (see launch_kernel)
  int64_t index_stride;
  int64_t n;
  int64_t num_slots;
  SlotCheck check;           // the device-side slot check (mode 0: none)
};

// TMA path: each warp stages a whole row (nope then rope) in shared memory with `load_bytes`-wide
// loads and one lane stores it with one cp.async.bulk (global <- shared). Needs
// (nope_bytes + rope_bytes) % 16 == 0 and dst, dst_row 16-byte aligned; load_bytes must divide the
// source pointers, row strides and both part sizes.
cudaError_t launch_mla_tma(const MlaArgs& args, int load_bytes, cudaStream_t stream);

// Direct path: global -> global vector copies of width vec_bytes, which must divide every pointer,
// stride and part size (the destination's rope offset, nope_bytes, included).
cudaError_t launch_mla_direct(const MlaArgs& args, int vec_bytes, cudaStream_t stream);

// Validating direct path in one grid (SlotCheck mode 3, args.check.barrier set), 16-byte vectors
// only (16 must divide every pointer, stride and part size): a grid that fits on the device at
// once loads its rows into registers, scans the index, meets at a grid barrier, then stores
// (mla_checked.cu). Any n works; the binding takes it where one pass of that grid holds the call,
// n <= mla_checked_rows(row bytes).
cudaError_t launch_mla_checked(const MlaArgs& args, cudaStream_t stream);
int64_t mla_checked_rows(int64_t row_bytes);

// Launch geometry the launchers use (for the plan strings and tests): threads per block, and the
// largest row the MLA TMA path stages (a warp holds two sets of its rows in shared memory, and a
// block stays within the 48 KiB default dynamic shared memory with at least one warp).
constexpr int kThreads = 256;
// The slot check's block reduction takes kCheckSmemBytes of static shared memory in every kernel;
// the staging buffers get the rest of the 48 KiB.
constexpr int64_t kCheckSmemBytes = 256;
constexpr int64_t kStageSmemBytes = 48 * 1024 - kCheckSmemBytes;
constexpr int64_t kMlaMaxTmaRowBytes = kStageSmemBytes / 2;

// Launch tuning, process-wide. The defaults are what the H100 sweep (benchmarks/tune_gpu.py, with
// inputs rotated past the L2; docs/benchmarks.md) measured fastest for 2 KiB MHA rows and 1152-byte
// MLA rows; the `tune` op sets them (benchmarks only).
struct LaunchTuning {
  int mla_rows = 1;         // rows a warp stages per iteration on the TMA path: 1, 2 or 4
  int mla_warps = 4;        // warps per block of the MLA kernels: 1, 2, 4 or 8
  int mla_grid = -1;        // blocks per SM of the MLA kernels: -1 one warp per row (no cap),
                            // 0 as many as fit (a persistent grid whose warps loop), k > 0 at most k
  int copy_grid = -1;       // the same for the copy kernels (one warp per row and side)
  int fp8_grid = 0;         // the same for the fp8 kernels: a persistent grid, 4-5% faster than -1
  int mla_evict_first = 0;  // TMA path: bit 0 source loads, bit 1 bulk stores marked L2 evict-first
                            // (with plain source loads, evict-first no longer helps: 0.5% slower)
  // L2 prefetch, per kernel family: 0 never, 1 under PDL (before griddepcontrol.wait, so the reads
  // start while the previous grid is still finishing), 2 always. Each warp asks for its first rows'
  // sources and slots only: a persistent warp asking for all its rows made fp8 writes 19-20% slower.
  // Measured (docs/benchmarks.md): MLA and copies gain plainly and with PDL (N = 16384: MLA direct
  // 15.9 -> 15.2 us, with PDL 15.1 -> 13.6); fp8 gains with PDL only (plainly 1-5% slower).
  int mla_prefetch = 2;
  int copy_prefetch = 2;
  int fp8_prefetch = 1;
  // When a check grid (SlotCheck mode 2) lets its writer launch: 0 after the check's own PDL wait,
  // once the kernels before the check have completed (the writer, in its full build, then loads its
  // first row before its wait); 1 at once (the writer, in its verdict-only build under
  // lean_verdict, then prefetches into the L2 before its wait and loads after it). Eagerly on the
  // H100, 1 is 2.0-2.3 us faster for fp8 and MLA at N = 4096 and as fast for MLA at 16384
  // (benchmarks/check_order.py).
  int check_early = 1;
  // How a check grid hands its verdict over, per family as lean_unchecked below: bit set, and the
  // grid has more than check_fold_blocks blocks, its last block folds the blocks' words into one,
  // which every writer warp reads (one sector: 8 bytes, where 64 words are four 128-byte lines,
  // megabytes of L2 reads over a call of one warp per row); else the writer warps read every
  // block's word, and the check grid ends without the fold's fence, atomic and reads, which lie on
  // the path to the writer's first store. The words start a 128-byte line (verdict_buffer), so up
  // to 16 of them are one read a warp. Eagerly on the H100 (benchmarks/check_order.py --switch
  // fold, the fold forced at every size): MLA (a warp per row) 16.40 us unfolded against 18.09
  // folded at N = 16384 (16 blocks: one line), 30.49 against 30.92 at 32768 (32: two lines), 59.20
  // against 57.89 at 65536 (64: four lines); the fp8 paged writer (a persistent grid, the words read
  // once a warp) unfolded faster at every size (39.88 against 41.14 at 16384, 150.35 against 151.28
  // at 65536). check_index always folds: its verdict is read by every call of a step.
  int check_fold = 2;  // MLA direct only
  int check_fold_blocks = 32;  // the words of two 128-byte lines
  // The validating MLA direct path (16-byte vectors) checks an index of kFusedCheckMax < n <=
  // mla_checked_rows entries inside its own grid (1, SlotCheck mode 3) or with a check grid (0).
  int mla_check_in_grid = 1;
  // How long a block of that grid waits at its barrier before it scans the whole index itself
  // (grid_verdict, slot_check.cuh), in microseconds: far past the few microseconds a barrier takes
  // when the grid is resident, so the scan runs only where another grid holds the room (0: every
  // block scans it at once; tests).
  int mla_check_deadline_us = 50;
  // Which build of a writer kernel a launch takes (CheckCode, slot_check.cuh), per family: bit 0 the
  // paged-row kernels (store_cache, the paged copy and fp8 writes), bit 1 the MLA direct kernel.
  // The full check's code (the scan of a short index, the loads moved before the check) keeps
  // registers: 80 against 56-64 a thread for the dense 16-byte paged kernels, 64 against 37-39 for
  // MLA direct, so the lean builds fit more blocks per SM (benchmarks/lean_kernels.py).
  // lean_unchecked: a launch that checks no slots (validate=False, or replayed from a CUDA graph,
  // where the check is left out) takes the build without any check code (bit set) or the full one
  // with its check off (bit clear).
  int lean_unchecked = 3;
  // lean_verdict: a launch that reads the verdict of an index checked beforehand
  // (oracle.kernels.check_index: SlotCheck mode 2, not late) takes the build that reads the verdict
  // and nothing more (bit set) or the full one, which loads its first row beside the verdict's read.
  int lean_verdict = 3;
};
LaunchTuning& launch_tuning();

// The writer kernel families, the bits of the per-family knobs above.
enum KernelFamily { kPagedRowsFamily = 1, kMlaDirectFamily = 2 };

}  // namespace kvo_cuda
