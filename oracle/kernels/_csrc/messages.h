// Names in the error messages of the C++ extensions (the CPU kernels and the CUDA binding), the
// way torch prints them, so a rejected call reads the same whichever backend refused it.
//
// Plain string building (std::to_string), never iostreams: where the toolchain links a private
// static libstdc++ into an extension (seen with a custom GCC), formatting into an ostream crashes.
#pragma once

#include <string>

#include <ATen/ATen.h>

namespace kvo_messages {

inline std::string dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "torch.float32";
    case at::kHalf: return "torch.float16";
    case at::kBFloat16: return "torch.bfloat16";
    case at::kDouble: return "torch.float64";
    case at::kByte: return "torch.uint8";
    case at::kChar: return "torch.int8";
    case at::kShort: return "torch.int16";
    case at::kInt: return "torch.int32";
    case at::kLong: return "torch.int64";
    case at::kBool: return "torch.bool";
    case at::kFloat8_e4m3fn: return "torch.float8_e4m3fn";
    case at::kFloat8_e5m2: return "torch.float8_e5m2";
    case at::kFloat8_e4m3fnuz: return "torch.float8_e4m3fnuz";
    case at::kFloat8_e5m2fnuz: return "torch.float8_e5m2fnuz";
    default: return std::string("torch.") + c10::toString(t);
  }
}

// A shape or strides as Python prints the tuple: (2, 3), (4,), ().
inline std::string shape_str(at::IntArrayRef v) {
  std::string out = "(";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  return out + (v.size() == 1 ? ",)" : ")");
}

}  // namespace kvo_messages
