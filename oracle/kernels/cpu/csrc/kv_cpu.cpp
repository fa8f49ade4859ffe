// kv-oracle's CPU KV-cache writers, registered as torch custom ops in namespace kv_oracle_cpu.
//
// Every op validates all of its arguments (dtypes, shapes, strides, every slot under the padding
// policy) before it writes a byte, so a rejected call leaves every cache unchanged. Offsets are
// int64 byte offsets computed from each tensor's own strides (caches past 2^31 elements work).
// Rows are spread over at::parallel_for; contiguous runs are copied with rep movsb, memcpy or
// non-temporal AVX2 stores (see CopyPlan), strided ones element by element. fp8 conversion goes
// through fp8.h, whose ISA (AVX-512, AVX2 or scalar) is chosen at run time.
//
// The sources: kv_cpu.h (what they share), common.cpp (argument and slot checks, the ISA setting,
// the copy routines, the fp8 arguments), flat.cpp (store_cache, set_mla_kv_buffer), paged.cpp
// (concat_and_cache_mla, reshape_and_cache_flash), quantize.cpp (quantize_fp8), block.cpp with
// block_scaled.h (quantize_block, reshape_and_cache_block: MXFP8 and NVFP4), and this file, which
// registers the ops.

#include <torch/csrc/autograd/autograd_not_implemented_fallback.h>
#include <torch/library.h>

#include "block_scaled.h"  // includes kv_cpu.h

TORCH_LIBRARY(kv_oracle_cpu, m) {
  m.set_python_module("oracle.kernels.cpu._fake");
  m.def("store_cache(Tensor k, Tensor v, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor loc, "
        "str padding=\"none\") -> ()");
  m.def("set_mla_kv_buffer(Tensor(a!) kv_buffer, Tensor loc, Tensor cache_k_nope, Tensor cache_k_rope, "
        "str padding=\"none\") -> ()");
  m.def("concat_and_cache_mla(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor? scale, str padding=\"negative\") -> ()");
  m.def("reshape_and_cache_flash(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor slot_mapping, str kv_cache_dtype, Tensor? k_scale, Tensor? v_scale, "
        "str padding=\"negative\") -> ()");
  m.def("quantize_fp8(Tensor(a!) out, Tensor x, Tensor scale, str fmt) -> ()");
  m.def("quantize_block(Tensor(a!) codes, Tensor(b!) scales, Tensor x, str fmt, Tensor? global_scale) -> ()");
  m.def("reshape_and_cache_block(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(b!) value_cache, "
        "Tensor(c!) key_scale_cache, Tensor(d!) value_scale_cache, Tensor slot_mapping, str fmt, "
        "Tensor? k_global_scale, Tensor? v_global_scale) -> ()");
  m.def("isa() -> str", &kvo::isa_op);
  m.def("detected_isa() -> str", &kvo::detected_isa_op);
  m.def("set_isa(str isa) -> str", &kvo::set_isa_op);
}

TORCH_LIBRARY_IMPL(kv_oracle_cpu, CPU, m) {
  m.impl("store_cache", &kvo::store_cache);
  m.impl("set_mla_kv_buffer", &kvo::set_mla_kv_buffer);
  m.impl("concat_and_cache_mla", &kvo::concat_and_cache_mla);
  m.impl("reshape_and_cache_flash", &kvo::reshape_and_cache_flash);
  m.impl("quantize_fp8", &kvo::quantize_fp8);
  m.impl("quantize_block", &kvo::quantize_block);
  m.impl("reshape_and_cache_block", &kvo::reshape_and_cache_block);
}

// The writers are not differentiable. An explicit Autograd kernel (torch's not-implemented
// fallback, which redispatches below autograd) says so, instead of leaving the op to the global
// autograd fallback.
TORCH_LIBRARY_IMPL(kv_oracle_cpu, Autograd, m) {
  for (const char* op : {"store_cache", "set_mla_kv_buffer", "concat_and_cache_mla", "reshape_and_cache_flash",
                         "quantize_fp8", "quantize_block", "reshape_and_cache_block"})
    m.impl(op, torch::autograd::autogradNotImplementedFallback());
}
