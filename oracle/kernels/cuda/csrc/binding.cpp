// kv-oracle's Hopper KV-cache writers as torch custom ops, namespace kv_oracle_cuda.
//
// The binding (this file, bind.h and bind_*.cpp) is the only code that sees torch: it validates every argument it can see on the host
// (devices, dtypes, shapes, strides) before anything is launched; then it reduces each tensor to
// raw pointers and int64 byte strides, picks the vector width every pointer and stride allows, and
// calls a launcher from the .cu files (kv_cuda.h) on the current stream. Slots are never read on
// the host (that would synchronize, and break CUDA-graph capture): with validate=1, outside graph
// capture, the kernels check them on the device (SlotCheck: in every block for a short index, else
// a check grid whose verdict the writer reads after a PDL wait), store nothing if one is illegal,
// and leave the error in the device's mailbox (set_error_mailbox; oracle/kernels/_deferred.py raises it). The kernels
// skip any slot outside the cache in any case, so nothing is ever written outside a cache.
//
// Ops (all return nothing and write their caches in place):
//   store_cache(k, v, k_cache, v_cache, loc, max_vec=16, pdl=False, validate=1, verdict=None)
//   set_mla_kv_buffer(kv_buffer, loc, cache_k_nope, cache_k_rope, path="auto", max_vec=16, pdl=False,
//                     validate=1, verdict=None)
//   reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping, kv_cache_dtype,
//                           k_scale, v_scale, max_vec=16, pdl=False, validate=1, verdict=None)
//   set_error_mailbox(mailbox, device): the pinned int64[8] validating calls on `device` report to.
//   check_index(index, num_slots, negative_ok) -> (copy, verdict): oracle.kernels.check_index's
//                           copy and check of a CUDA index in one launch.
//   mla_plan(...) / store_plan(...) / paged_plan(...) -> str: the path and width a call would take.
//   mla_checked_rows(row_bytes) -> int: the longest index set_mla_kv_buffer checks in its own grid.
//   tune(knob, value) -> int: sets a launch-tuning knob (LaunchTuning), returns the old value.
// verdict: the int64[1] first-illegal-entry word of an index checked beforehand (a CheckedIndex of
// oracle.kernels.check_index, whose copy is then the index): a validating call reads it in place of
// checking the index. max_vec (16, 8, 4, 2 or 1) caps the vector width, so tests can run the narrow paths on aligned
// data; path forces "tma" or "direct" for set_mla_kv_buffer; pdl launches the kernel with
// programmatic dependent launch (kv_cuda.h says what that overlaps).
//
// This file registers the ops; bind_store.cpp, bind_mla.cpp and bind_paged.cpp define them,
// bind_common.cpp holds what they share.

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "bind.h"

namespace kvo_bind {

// Sets one launch-tuning knob (kvo_cuda::LaunchTuning) and returns its previous value.
int64_t tune(c10::string_view knob, int64_t value) {
  kvo_cuda::LaunchTuning& t = kvo_cuda::launch_tuning();
  const std::string name(knob);
  struct Knob { const char* name; int* field; int64_t low, high; bool power_of_two; };
  const Knob knobs[] = {{"mla_rows", &t.mla_rows, 1, 4, true}, {"mla_warps", &t.mla_warps, 1, 8, true},
                        {"mla_grid", &t.mla_grid, -1, 64, false}, {"copy_grid", &t.copy_grid, -1, 64, false},
                        {"fp8_grid", &t.fp8_grid, -1, 64, false},
                        {"mla_evict_first", &t.mla_evict_first, 0, 3, false},
                        {"mla_prefetch", &t.mla_prefetch, 0, 2, false},
                        {"copy_prefetch", &t.copy_prefetch, 0, 2, false},
                        {"fp8_prefetch", &t.fp8_prefetch, 0, 2, false},
                        {"check_early", &t.check_early, 0, 1, false},
                        {"check_fold", &t.check_fold, 0, 3, false},
                        {"check_fold_blocks", &t.check_fold_blocks, 0, 64, false},
                        {"mla_check_in_grid", &t.mla_check_in_grid, 0, 1, false},
                        {"mla_check_deadline_us", &t.mla_check_deadline_us, 0, 1000000, false},
                        {"lean_unchecked", &t.lean_unchecked, 0, 3, false},
                        {"lean_verdict", &t.lean_verdict, 0, 3, false}};
  for (const Knob& k : knobs) {
    if (name != k.name) continue;
    TORCH_CHECK_VALUE(value >= k.low && value <= k.high && (!k.power_of_two || (value & (value - 1)) == 0),
                      "value=", value, " is out of range for knob '", name, "' (", k.low, "..", k.high,
                      k.power_of_two ? ", a power of two)" : ")");
    const int64_t old = *k.field;
    *k.field = static_cast<int>(value);
    return old;
  }
  TORCH_CHECK_VALUE(false, "knob='", name, "' is not one of mla_rows, mla_warps, mla_grid, copy_grid, fp8_grid, "
                    "mla_evict_first, mla_prefetch, copy_prefetch, fp8_prefetch, check_early, check_fold, "
                    "check_fold_blocks, mla_check_in_grid, mla_check_deadline_us, lean_unchecked, lean_verdict");
  return 0;
}

// The longest index the validating MLA direct path checks inside its own grid (mla_checked.cu) for
// rows of `row_bytes`, on the current device.
int64_t mla_checked_rows(int64_t row_bytes) {
  TORCH_CHECK_VALUE(row_bytes > 0 && row_bytes % 16 == 0, "row_bytes=", row_bytes,
                    " must be a positive multiple of 16");
  return kvo_cuda::mla_checked_rows(row_bytes);
}

}  // namespace kvo_bind

TORCH_LIBRARY(kv_oracle_cuda, m) {
  m.set_python_module("oracle.kernels.cuda._fake");
  m.def("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, int max_vec=16, "
        "bool pdl=False, int validate=1, Tensor? verdict=None) -> ()");
  m.def("set_mla_kv_buffer(Tensor(a!) kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, "
        "str path=\"auto\", int max_vec=16, bool pdl=False, int validate=1, Tensor? verdict=None) -> ()");
  m.def("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, int max_vec=16, "
        "bool pdl=False, int validate=1, Tensor? verdict=None) -> ()");
  m.def("set_error_mailbox(Tensor mailbox, int device) -> ()", &kvo_bind::set_error_mailbox);
  m.def("store_plan(Tensor k, Tensor v, Tensor k_cache, Tensor v_cache, Tensor loc, int max_vec=16) -> str");
  m.def("mla_plan(Tensor kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, str path=\"auto\", "
        "int max_vec=16) -> str");
  m.def("paged_plan(Tensor key, Tensor value, Tensor key_cache, Tensor value_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, int max_vec=16) -> str");
  m.def("tune(str knob, int value) -> int", &kvo_bind::tune);
  m.def("check_index(Tensor index, int num_slots, bool negative_ok) -> (Tensor, Tensor)");
  m.def("mla_checked_rows(int row_bytes) -> int", &kvo_bind::mla_checked_rows);
}

TORCH_LIBRARY_IMPL(kv_oracle_cuda, CUDA, m) {
  m.impl("store_cache", &kvo_bind::store_cache);
  m.impl("set_mla_kv_buffer", &kvo_bind::set_mla_kv_buffer);
  m.impl("reshape_and_cache_flash", &kvo_bind::reshape_and_cache_flash);
  m.impl("store_plan", &kvo_bind::store_plan);
  m.impl("mla_plan", &kvo_bind::mla_plan);
  m.impl("paged_plan", &kvo_bind::paged_plan);
  m.impl("check_index", &kvo_bind::copy_and_check_index);
}

// The writers are not differentiable: an explicit Autograd kernel (torch's not-implemented
// fallback, which redispatches below autograd) says so.
TORCH_LIBRARY_IMPL(kv_oracle_cuda, Autograd, m) {
  for (const char* op : {"store_cache", "set_mla_kv_buffer", "reshape_and_cache_flash"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
