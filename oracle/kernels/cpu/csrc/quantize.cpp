// quantize_fp8: [N, H, D] float32/float16/bfloat16 to fp8 codes with a per-tensor or per-head
// scale, through the Quantizer.

#include "kv_cpu.h"

namespace kvo {

// ================================================================ quantize_fp8

void quantize_fp8(Tensor out, const Tensor& x, const Tensor& scale, std::string fmt_name) {
  const int fmt = parse_format(fmt_name, "fmt", false);
  check_cpu("x", x);
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), cat("x has dtype ", dtype_name(x.scalar_type()),
                   "; expected float32, float16 or bfloat16"));
  check_writable("out", out);
  TORCH_CHECK_TYPE(out.scalar_type() == at::kByte, cat("out has dtype ", dtype_name(out.scalar_type()),
                   "; expected torch.uint8 (fp8 codes)"));
  TORCH_CHECK_VALUE(x.dim() == 3 && out.sizes() == x.sizes(), cat("out has shape ", shape_str(out.sizes()), " and x ",
                    shape_str(x.sizes()), "; expected one [N, H, D] shape"));
  const int64_t n = x.size(0), heads = x.size(1), dim = x.size(2);
  const std::vector<Scale> scales = read_scale("scale", scale, heads);
  if (x.numel() == 0) return;

  const Quantizer quant(fmt, x.scalar_type(), x.numel());
  const char* xs = bytes_of(x);
  uint8_t* os = reinterpret_cast<uint8_t*>(out.data_ptr());
  const int64_t xe = x.element_size();
  const int64_t x0 = x.stride(0) * xe, x1 = x.stride(1) * xe, x2 = x.stride(2);
  const int64_t o0 = out.stride(0), o1 = out.stride(1), o2 = out.stride(2);
  const bool dense = scales.size() == 1 && x2 == 1 && o2 == 1 && x1 == dim * xe && o1 == dim;
  parallel_rows(n, heads * dim * (xe + 1), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (dense) {
        quant(os + i * o0, 1, xs + i * x0, 1, heads * dim, scales[0]);
        continue;
      }
      for (int64_t h = 0; h < heads; ++h)
        quant(os + i * o0 + h * o1, o2, xs + i * x0 + h * x1, x2, dim, scales[scales.size() == 1 ? 0 : h]);
    }
    quant.fence();
  });
}

}  // namespace kvo
