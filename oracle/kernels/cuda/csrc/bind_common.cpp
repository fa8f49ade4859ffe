// What every op of the binding shares: host-side argument checks, the device-side slot check's
// plan (and the mailboxes it reports to), vector widths, addresses and row shapes (bind.h).

#include <ATen/MemoryOverlap.h>
#include <c10/cuda/CUDAGraphsC10Utils.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <map>
#include <mutex>
#include <tuple>

#include "bind.h"

namespace kvo_bind {

// ================================================================ common checks

// Every tensor on one CUDA device (the first one's).
void check_device(const char* op, const std::vector<std::pair<const char*, const Tensor*>>& tensors) {
  const Tensor& first = *tensors.front().second;
  for (const auto& [name, t] : tensors) {
    TORCH_CHECK_VALUE(t->is_cuda(), op, ": ", name, " is on ", t->device().str(),
                      "; the kv_oracle_cuda kernels take CUDA tensors");
    TORCH_CHECK_VALUE(t->device() == first.device(), op, ": ", name, " is on ", t->device().str(), " but ",
                      tensors.front().first, " is on ", first.device().str());
  }
}

void check_index(const char* name, const Tensor& index) {
  TORCH_CHECK_TYPE(index.scalar_type() == at::kInt || index.scalar_type() == at::kLong, name, " has dtype ",
                   dtype_name(index.scalar_type()), "; expected torch.int32 or torch.int64");
  TORCH_CHECK_VALUE(index.dim() == 1, name, " must be 1-D, got shape ", shape_str(index.sizes()));
}

void check_writable(const char* name, const Tensor& cache) {
  TORCH_CHECK_VALUE(at::has_internal_overlap(cache) != at::MemOverlap::Yes, name, " has strides ",
                    shape_str(cache.strides()), " that make elements overlap; it cannot be written");
}

bool capturing() {
  return c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None;
}

void check_launch(const char* op, cudaError_t err) {
  TORCH_CHECK(err == cudaSuccess, op, ": kernel launch failed: ", cudaGetErrorName(err), ": ",
              cudaGetErrorString(err));
}

// ================================================================ the device-side slot check

constexpr int kMaxDevices = 64;
int64_t* g_mailbox[kMaxDevices] = {nullptr};  // pinned host memory, owned by oracle.kernels._deferred

void set_error_mailbox(const Tensor& mailbox, int64_t device) {
  TORCH_CHECK_VALUE(device >= 0 && device < kMaxDevices, "device=", device, " is out of range [0, ", kMaxDevices, ")");
  TORCH_CHECK_VALUE(mailbox.device().is_cpu() && mailbox.is_pinned() && mailbox.scalar_type() == at::kLong &&
                        mailbox.numel() >= 8 && mailbox.is_contiguous(),
                    "mailbox must be a pinned contiguous int64 CPU tensor of at least 8 words");
  g_mailbox[device] = mailbox.data_ptr<int64_t>();
}

constexpr int64_t kFusedCheckMax = 256;  // entries every block scans itself; above, a check grid
constexpr int64_t kCheckChunk = 1024;    // entries per check block at least: one round of 4 loads a thread
constexpr int kMaxCheckBlocks = 64;      // check blocks at most (a writer block reads one word each)

// The int64 buffer of one kind of device-side check for calls on `stream` of `like`'s device: one
// per stream, kept for the process (allocating one per call cost host time), made by `make` (on
// this stream) on the stream's first call. Calls on one stream run in order, so each call's kernels
// find the buffer as the previous call's left it. Each kind passes its own lambda, so each
// instantiation keeps its own map.
template <typename Make>
int64_t* per_stream_buffer(const Tensor& like, cudaStream_t stream, Make make) {
  static std::mutex lock;
  static auto* buffers = new std::map<std::pair<int, cudaStream_t>, Tensor>();  // never freed: no exit-time teardown
  const std::pair<int, cudaStream_t> key{like.device().index(), stream};
  std::lock_guard<std::mutex> guard(lock);
  auto found = buffers->find(key);
  if (found == buffers->end()) found = buffers->emplace(key, make(like.options().dtype(at::kLong))).first;
  return found->second.data_ptr<int64_t>();
}

// The check grid's verdict (kvo_cuda::VerdictWords) for calls on `stream`: a word per check block
// from the start of the buffer (a 128-byte line holds 16: a writer warp reads those in one
// request), then the fold and the arrivals (0; every check grid on the stream leaves it 0,
// check_index's too) on lines of their own. With the words 16 bytes on (after the fold and the
// arrivals), 16 of them spanned two lines, and the validating MLA write at N = 16384 took 1.5-1.8
// us longer on the H100 (docs/benchmarks.md). Zeroed on the device, as barrier_buffer's words are
// filled. A check grid touches them only after the kernel before it has completed (it is launched
// plainly after it, or with PDL and griddepcontrol.wait first), so the grids of a stream never
// share them at once.
kvo_cuda::VerdictWords verdict_buffer(const Tensor& like, cudaStream_t stream) {
  constexpr int64_t kLine = 16;  // words
  int64_t* w = per_stream_buffer(like, stream, [](const at::TensorOptions& o) {
    return at::zeros({kMaxCheckBlocks + 2 * kLine}, o);
  });
  return {w, w + kMaxCheckBlocks, reinterpret_cast<unsigned long long*>(w + kMaxCheckBlocks + kLine)};
}

// The grid-barrier words (grid_verdict in slot_check.cuh): [0] arrivals 0, [1] generation 0, [2] and
// [3] kNoEntry; a call's grid leaves them so for the next. Filled on the device: a copy from the
// host would synchronize the first call on each stream.
uint64_t* barrier_buffer(const Tensor& like, cudaStream_t stream) {
  return reinterpret_cast<uint64_t*>(per_stream_buffer(like, stream, [](const at::TensorOptions& o) {
    Tensor words = at::empty({4}, o);
    words.fill_(kvo_cuda::kNoEntry);
    words.narrow(0, 0, 2).zero_();
    return words;
  }));
}

int32_t index_type_of(const Tensor& index) {
  return index.scalar_type() == at::kLong ? kvo_cuda::kIndexInt64 : kvo_cuda::kIndexInt32;
}

// How a check over n entries splits them: blocks (kMaxCheckBlocks at most) of `chunk` entries,
// kCheckChunk or more each; one block for an empty index. A check grid and check_index's copy
// split alike (and fold alike: fold_verdict).
struct CheckBlocks {
  int blocks;
  int64_t chunk;
};

CheckBlocks check_blocks(int64_t n) {
  const int64_t want = (n + kCheckChunk - 1) / kCheckChunk;
  const int blocks = static_cast<int>(want < 1 ? 1 : (want < kMaxCheckBlocks ? want : kMaxCheckBlocks));
  return {blocks, (n + blocks - 1) / blocks};
}

// Plans the device-side slot check of a validating call (validate != 0): with `verdict` (an index
// checked beforehand) the writer reads that word (mode 2); else, for an index longer than
// kFusedCheckMax, launches the check grid and sets `pdl` so the writer waits for it, unless
// `in_grid`: then the writer checks inside its own grid (mode 3, launch_mla_checked). When the
// check grid lets the writer launch, and so whether the writer may load before its own wait, is
// LaunchTuning::check_early (check.cu); whether it folds its verdict for the writer, check_fold's
// bit of the writer's kernel `family` (kvo_cuda::KernelFamily), past check_fold_blocks blocks.
kvo_cuda::SlotCheck plan_check(int64_t validate, const Tensor& index, int64_t n, int64_t num_slots,
                               bool negative_ok, int32_t arg_code, int32_t& pdl, cudaStream_t stream,
                               const std::optional<Tensor>& verdict, int family, bool in_grid) {
  kvo_cuda::SlotCheck c{};
  TORCH_CHECK_VALUE(validate == 0 || validate == 1, "validate=", validate, " must be 0 or 1");
  if (verdict.has_value()) {
    const Tensor& v = *verdict;
    TORCH_CHECK_VALUE(v.scalar_type() == at::kLong && v.dim() == 1 && v.numel() >= 1 &&
                          v.numel() <= kMaxCheckBlocks && v.is_contiguous() && v.device() == index.device(),
                      "verdict must be the int64[1..", kMaxCheckBlocks, "] verdict of an index checked on ",
                      index.device().str(),
                      " (oracle.kernels.check_index), got ", dtype_name(v.scalar_type()), " ",
                      shape_str(v.sizes()), " on ", v.device().str());
  }
  // Not while a CUDA graph is being captured: the replayed writer then costs what it did before
  // the check existed (a decode graph's slots are its engine's); the kernels still drop any slot
  // outside the cache.
  if (validate == 0 || n == 0 || capturing()) return c;
  const int device = index.device().index();
  TORCH_CHECK(device >= 0 && device < kMaxDevices && g_mailbox[device] != nullptr,
              "no error mailbox for cuda:", device, "; call set_error_mailbox first (oracle.kernels.cuda does)");
  c.mailbox = g_mailbox[device];
  c.negative_ok = negative_ok ? 1 : 0;
  c.arg_code = arg_code;
  c.pad_code = negative_ok ? 1 : 0;
  // Checked beforehand: read its verdict, as a check grid's, with nothing launched; a short index is
  // scanned by every block (mode 1) all the same, a few L2 reads beside the block's own slot load,
  // where the verdict words, written long before, may take a trip to DRAM.
  if (verdict.has_value() && n > kFusedCheckMax) {
    c.mode = 2;
    c.late = 0;  // the launch is left as it is: the kernels before may still run when it starts
    c.verdict = verdict->data_ptr<int64_t>();
    c.verdict_count = static_cast<int32_t>(verdict->numel());
    return c;
  }
  if (n <= kFusedCheckMax) {
    c.mode = 1;
    return c;
  }
  if (in_grid) {
    c.mode = 3;
    c.barrier = barrier_buffer(index, stream);
    return c;
  }
  const CheckBlocks split = check_blocks(n);
  kvo_cuda::VerdictWords words = verdict_buffer(index, stream);
  const bool early = kvo_cuda::launch_tuning().check_early != 0;
  const bool fold = (kvo_cuda::launch_tuning().check_fold & family) != 0 &&
                    split.blocks > kvo_cuda::launch_tuning().check_fold_blocks;
  if (!fold) words.fold = nullptr;
  check_launch("slot check", kvo_cuda::launch_slot_check(index.data_ptr(), index_type_of(index), index.stride(0), n,
                                                         num_slots, c.negative_ok, words, split.blocks, split.chunk,
                                                         pdl != 0, early, stream));
  c.mode = 2;
  c.late = early ? 0 : 1;
  c.verdict = fold ? words.fold : words.words;
  c.verdict_count = fold ? 1 : split.blocks;
  pdl = 1;  // the writer waits for the check grid (griddepcontrol.wait) before it reads the verdict
  return c;
}


// oracle.kernels.check_index on a CUDA index: (a contiguous copy of `index`, its verdict), in one
// launch on the current stream. The verdict is one word, the fold of a word per chunk of
// kCheckChunk entries or more (kMaxCheckBlocks at most), as a check grid's: a view of the private
// [fold, chunk words...] it was folded from; the arrivals count is the stream's (verdict_buffer).
std::tuple<Tensor, Tensor> copy_and_check_index(const Tensor& index, int64_t num_slots, bool negative_ok) {
  check_index("index", index);
  TORCH_CHECK_VALUE(index.is_cuda(), "index is on ", index.device().str(), "; expected a CUDA tensor");
  TORCH_CHECK_VALUE(num_slots >= 0, "num_slots=", num_slots, " must be >= 0");
  c10::cuda::CUDAGuard guard(index.device());
  const int64_t n = index.size(0);
  Tensor copy = at::empty({n}, index.options());
  if (n == 0) return {copy, at::zeros({1}, index.options().dtype(at::kLong))};
  const CheckBlocks split = check_blocks(n);
  Tensor words = at::empty({split.blocks + 1}, index.options().dtype(at::kLong));
  const cudaStream_t stream = stream_of(index);
  const kvo_cuda::VerdictWords verdict{words.data_ptr<int64_t>() + 1, words.data_ptr<int64_t>(),
                                       verdict_buffer(index, stream).arrivals};
  check_launch("check_index", kvo_cuda::launch_copy_check(index.data_ptr(), index_type_of(index), index.stride(0), n,
                                                          num_slots, negative_ok ? 1 : 0, copy.data_ptr(), verdict,
                                                          split.blocks, split.chunk, stream));
  return {copy, words.narrow(0, 0, 1)};
}

int check_max_vec(int64_t max_vec) {
  TORCH_CHECK_VALUE(max_vec == 16 || max_vec == 8 || max_vec == 4 || max_vec == 2 || max_vec == 1,
                    "max_vec=", max_vec, " must be 16, 8, 4, 2 or 1");
  return static_cast<int>(max_vec);
}

// Largest power of two <= cap dividing every value (0 divides by anything).
int widest(const std::vector<int64_t>& values, int cap) {
  int w = cap;
  for (int64_t v : values) {
    const uint64_t u = static_cast<uint64_t>(v);
    while (w > 1 && (u % static_cast<uint64_t>(w)) != 0) w >>= 1;
  }
  return w;
}

int64_t addr(const Tensor& t) { return static_cast<int64_t>(reinterpret_cast<uintptr_t>(t.data_ptr())); }

int32_t log2_exact(int64_t v) {
  if (v <= 0 || (v & (v - 1)) != 0) return -1;
  int32_t s = 0;
  while ((int64_t{1} << s) < v) ++s;
  return s;
}

cudaStream_t stream_of(const Tensor& t) { return c10::cuda::getCurrentCUDAStream(t.device().index()).stream(); }

// ================================================================ rows as [heads, head]

// The row of a tensor (every dim after the first `lead` dims) as [heads, head_elems]: the last dim
// contiguous, the dims between it and the lead collapsed into one head dim with one stride.
RowShape row_shape(const char* name, const Tensor& t, int64_t lead) {
  RowShape r;
  const int64_t dims = t.dim();
  if (dims <= lead) return r;  // rows of one element
  r.head_elems = t.size(-1);
  TORCH_CHECK_VALUE(t.stride(-1) == 1 || t.size(-1) <= 1, name, " has strides ", shape_str(t.strides()),
                    "; its last dimension must be contiguous");
  r.head_stride = r.head_elems;
  int64_t expect = -1;  // the stride the next outer non-unit head dim must have
  for (int64_t d = dims - 2; d >= lead; --d) {
    if (t.size(d) == 1) continue;
    if (expect < 0) {
      r.head_stride = t.stride(d);
    } else {
      TORCH_CHECK_VALUE(t.stride(d) == expect, name, " has shape ", shape_str(t.sizes()), " and strides ",
                        shape_str(t.strides()), "; the dims between the first and the last must collapse "
                        "into one strided dim");
    }
    r.heads *= t.size(d);
    expect = t.stride(d) * t.size(d);
  }
  return r;
}

// A side of a flat/paged write, in bytes, from row shapes already checked to agree.
Side make_side(const Tensor& src, int64_t src_row, const RowShape& sr, const Tensor& dst, int64_t dst_block,
               int64_t dst_token, const RowShape& dr, int64_t src_elem, int64_t dst_elem) {
  Side s{};
  s.src = static_cast<const unsigned char*>(src.data_ptr());
  s.src_row = src_row * src_elem;
  s.src_head = sr.head_stride * src_elem;
  s.dst = static_cast<unsigned char*>(dst.data_ptr());
  s.dst_block = dst_block * dst_elem;
  s.dst_token = dst_token * dst_elem;
  s.dst_head = dr.head_stride * dst_elem;
  s.heads = sr.heads;
  s.head_chunks = sr.head_elems;  // in elements until the width is chosen
  s.head_shift = -1;
  s.scale_count = 0;
  s.scale = nullptr;
  s.scale_stride = 0;
  return s;
}

// Merge the heads of a row into one when both source and cache hold the row densely.
void collapse_dense(RowShape& sr, RowShape& dr) {
  if (sr.heads > 1 && sr.head_stride == sr.head_elems && dr.head_stride == dr.head_elems) {
    sr.head_elems *= sr.heads;
    dr.head_elems = sr.head_elems;
    sr.heads = dr.heads = 1;
    sr.head_stride = dr.head_stride = sr.head_elems;
  }
}

// Chunks per head once the width is chosen: head bytes / chunk bytes (a power of two dividing them).
void finish_chunks(PagedArgs& a, const int64_t head_bytes[2], int64_t chunk_bytes) {
  for (int s = 0; s < a.sides; ++s) {
    a.side[s].head_chunks = head_bytes[s] / chunk_bytes;
    a.side[s].head_shift = log2_exact(a.side[s].head_chunks);
  }
}

}  // namespace kvo_bind
