// Block-scaled writers: quantize_block ([N, H, D] -> codes + scales) and reshape_and_cache_block
// (vLLM-style paged K/V write into code caches plus scale caches, linear or swizzled), for the
// formats "mxfp8_e4m3fn", "mxfp8_e5m2" and "nvfp4" (block_scaled.h holds the per-row arithmetic).
//
// Contract (docs/semantics.md, "Block-scaled formats"; the reference is oracle/reference/block_scaled.py):
// - blocks run along each head's D elements and never straddle heads; the last block of a head
//   may be shorter; NVFP4 needs D even;
// - every argument is checked before anything is written (a rejected call changes no byte);
// - sources may have any strides (staged through a float32 buffer when the last one is not 1);
//   code caches any strides with a contiguous last dimension; linear scale caches any strides;
//   a swizzled scale cache is [num_blocks, page_bytes >= the tiled page], contiguous pages, any
//   row stride (bytes past the tiled page, and its padding, are never written);
// - negative slots are padding: nothing at all is written for them;
// - every offset is int64 bytes from the tensors' own strides (caches past 2^31 bytes work).

#include "block_scaled.h"

namespace kvo {

namespace {

int parse_block_format(const std::string& name) {
  if (name == "mxfp8_e4m3fn") return kMxE4M3;
  if (name == "mxfp8_e5m2") return kMxE5M2;
  if (name == "nvfp4") return kNvfp4;
  TORCH_CHECK_VALUE(false, cat("fmt='", name, "' is not one of 'mxfp8_e4m3fn', 'mxfp8_e5m2', 'nvfp4'"));
  return -1;
}

// NVFP4's per-tensor scale: a float32 tensor of shape [1] (or ()), finite and > 0 (read_scale's
// checks and messages), with its reciprocal fl32(1 / gs) computed once, as the reference does.
BlockParams read_global_scale(const char* name, const std::optional<Tensor>& scale, int fmt) {
  BlockParams p;
  if (fmt != kNvfp4) return p;  // MX ignores it (None allowed)
  read_scale(name, scale, 0);
  p.gs = *scale->data_ptr<float>();
  p.rgs = 1.0f / p.gs;
  return p;
}

void check_float_source(const char* name, const Tensor& x) {
  check_cpu(name, x);
  TORCH_CHECK_TYPE(is_float(x.scalar_type()), cat(name, " has dtype ", dtype_name(x.scalar_type()),
                   "; expected float32, float16 or bfloat16"));
  TORCH_CHECK_VALUE(x.dim() == 3, cat(name, " must be 3-D [tokens, H, D], got shape ", shape_str(x.sizes())));
}

void check_even(const char* name, int64_t dim, int fmt) {
  TORCH_CHECK_VALUE(fmt != kNvfp4 || dim % 2 == 0, cat(name, " has D = ", dim,
                    "; nvfp4 packs two elements per byte, so D must be even"));
}

// A uint8 output we may write, of exactly `want` (its logical shape), last dimension contiguous
// when `inner` (the code rows are written as contiguous runs).
void check_bytes_out(const char* name, const Tensor& t, at::IntArrayRef want, const char* what, bool inner) {
  check_writable(name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, cat(name, " has dtype ", dtype_name(t.scalar_type()),
                   "; expected torch.uint8"));
  TORCH_CHECK_VALUE(t.sizes() == want, cat(name, " has shape ", shape_str(t.sizes()), "; expected ",
                    shape_str(want), " ", what));
  TORCH_CHECK_VALUE(!inner || t.stride(-1) == 1 || t.size(-1) <= 1, cat(name, " has strides ",
                    shape_str(t.strides()), "; its last dimension must be contiguous"));
}

// Where the scale bytes of one head row go: scale c of (block, off, h) in a linear cache is at
// block * st[0] + off * st[1] + h * st[2] + c * st[3]; in a swizzled one, at block * st[0] + byte *
// st[1] with byte from the 128x4 tiling of row r = off * H + h, column c.
struct ScaleSink {
  char* base = nullptr;
  bool swizzled = false;
  int64_t st[4] = {};
  int64_t heads = 0, tiles_per_row = 0;  // swizzled: H and Cp / 4

  void put(int64_t block, int64_t off, int64_t h, const uint8_t* scales, int64_t nb) const {
    if (!swizzled) {
      char* p = base + block * st[0] + off * st[1] + h * st[2];
      for (int64_t c = 0; c < nb; ++c) p[c * st[3]] = char(scales[c]);
      return;
    }
    const int64_t r = off * heads + h;
    char* page = base + block * st[0];
    const int64_t row_at = (r / 128) * tiles_per_row * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4;
    for (int64_t c = 0; c < nb; ++c) page[(row_at + (c / 4) * 512 + c % 4) * st[1]] = char(scales[c]);
  }
};

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Checks a scale cache of either layout (told apart by rank) and returns where its bytes go.
ScaleSink scale_sink(const char* name, const Tensor& t, int64_t num_blocks, int64_t block_size, int64_t heads,
                     int64_t nb) {
  ScaleSink s;
  check_writable(name, t);
  TORCH_CHECK_TYPE(t.scalar_type() == at::kByte, cat(name, " has dtype ", dtype_name(t.scalar_type()),
                   "; expected torch.uint8 (scale bytes)"));
  if (t.dim() == 4) {
    const int64_t want[] = {num_blocks, block_size, heads, nb};
    TORCH_CHECK_VALUE(t.sizes() == at::IntArrayRef(want), cat(name, " has shape ", shape_str(t.sizes()),
                      "; a linear scale cache is [num_blocks, block_size, H, nb] = ", shape_str(want)));
    for (int i = 0; i < 4; ++i) s.st[i] = t.stride(i);
  } else {
    TORCH_CHECK_VALUE(t.dim() == 2, cat(name, " must be 4-D [num_blocks, block_size, H, nb] (linear) or 2-D ",
                      "[num_blocks, page_bytes] (swizzled), got shape ", shape_str(t.sizes())));
    const int64_t rows = block_size * heads, page = round_up(rows, 128) * round_up(nb, 4);
    // page_bytes may exceed the tiled page (the reference accepts that; the tail is never written)
    TORCH_CHECK_VALUE(t.size(0) == num_blocks && t.size(1) >= page, cat(name, " has shape ", shape_str(t.sizes()),
                      "; a swizzled scale cache is [num_blocks = ", num_blocks, ", page_bytes >= ", page, "] (",
                      rows, " rows = block_size * H by ", nb, " scales, in 128x4 tiles)"));
    TORCH_CHECK_VALUE((t.stride(1) == 1 || page <= 1) && (t.stride(0) >= page || num_blocks <= 1),
                      cat(name, " has strides ", shape_str(t.strides()), "; a swizzled page must be contiguous ",
                          "and pages must not overlap (row stride >= ", page, ")"));
    s.swizzled = true;
    s.st[0] = t.stride(0), s.st[1] = 1;
    s.heads = heads, s.tiles_per_row = round_up(nb, 4) / 4;
  }
  s.base = bytes_of(t);
  return s;
}

// One source head row -> its codes (contiguous) and scales (into `scales`, nb bytes): the row
// function straight from the source when its elements are contiguous, else through `stage`
// (float32; exact for every source type, so the codes are the same).
struct RowQuantizer {
  BlockRowFn direct, staged;
  int src_type;
  int64_t dim, stride;  // source element stride (elements)
  BlockParams params;

  RowQuantizer(int fmt, at::ScalarType src, int64_t dim_, int64_t stride_, BlockParams p)
      : src_type(src_type_of(src)), dim(dim_), stride(stride_), params(p) {
    const int isa = current_isa();
    direct = pick_block_row(isa, fmt, src_type);
    staged = pick_block_row(isa, fmt, kF32);
  }

  bool needs_stage() const { return stride != 1 && dim > 1; }

  void operator()(uint8_t* codes, uint8_t* scales, const char* src, float* stage) const {
    if (!needs_stage()) return direct(codes, scales, src, dim, params);
    for (int64_t i = 0; i < dim; ++i) stage[i] = load_scalar(src, i * stride, src_type);
    staged(codes, scales, stage, dim, params);
  }
};

}  // namespace

// ================================================================ quantize_block

void quantize_block(Tensor codes, Tensor scales, const Tensor& x, std::string fmt_name,
                    const std::optional<Tensor>& global_scale) {
  const int fmt = parse_block_format(fmt_name);
  check_float_source("x", x);
  const int64_t n = x.size(0), heads = x.size(1), dim = x.size(2);
  check_even("x", dim, fmt);
  const int64_t nb = blocks_of(fmt, dim);
  check_bytes_out("codes", codes, {n, heads, code_bytes(fmt, dim)}, fmt == kNvfp4 ? "[N, H, D // 2]" : "[N, H, D]",
                  true);
  check_bytes_out("scales", scales, {n, heads, nb}, "[N, H, ceil(D / block)]", false);
  const BlockParams params = read_global_scale("global_scale", global_scale, fmt);
  if (x.numel() == 0) return;

  const RowQuantizer quant(fmt, x.scalar_type(), dim, x.stride(2), params);
  ScaleSink sink;  // scales as a linear cache with block = token and one token per block
  sink.base = bytes_of(scales);
  sink.st[0] = scales.stride(0), sink.st[2] = scales.stride(1), sink.st[3] = scales.stride(2);
  const char* xs = bytes_of(x);
  uint8_t* cs = reinterpret_cast<uint8_t*>(codes.data_ptr());
  const int64_t xe = x.element_size(), x0 = x.stride(0) * xe, x1 = x.stride(1) * xe;
  const int64_t c0 = codes.stride(0), c1 = codes.stride(1);
  parallel_rows(n, heads * dim * (xe + 1), [&](int64_t begin, int64_t end) {
    std::vector<float> stage(quant.needs_stage() ? dim : 0);
    std::vector<uint8_t> buf(nb);
    for (int64_t i = begin; i < end; ++i)
      for (int64_t h = 0; h < heads; ++h) {
        quant(cs + i * c0 + h * c1, buf.data(), xs + i * x0 + h * x1, stage.data());
        sink.put(i, 0, h, buf.data(), nb);
      }
  });
}

// ================================================================ reshape_and_cache_block

void reshape_and_cache_block(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                             Tensor key_scale_cache, Tensor value_scale_cache, const Tensor& slot_mapping,
                             std::string fmt_name, const std::optional<Tensor>& k_global_scale,
                             const std::optional<Tensor>& v_global_scale) {
  const int fmt = parse_block_format(fmt_name);
  const Padding pad = parse_padding("negative");
  check_index("slot_mapping", slot_mapping);
  const int64_t n = slot_mapping.size(0);
  check_float_source("key", key);
  check_float_source("value", value);
  TORCH_CHECK_TYPE(key.scalar_type() == value.scalar_type(), cat("value has dtype ", dtype_name(value.scalar_type()),
                   " but key has dtype ", dtype_name(key.scalar_type())));
  TORCH_CHECK_VALUE(value.size(1) == key.size(1) && value.size(2) == key.size(2), cat("value has shape ",
                    shape_str(value.sizes()), "; expected [T, ", key.size(1), ", ", key.size(2),
                    "] (heads and head size from key)"));
  check_writable("key_cache", key_cache);
  TORCH_CHECK_VALUE(key_cache.dim() == 4, cat("key_cache must be 4-D [num_blocks, block_size, H, Dc], got ",
                    shape_str(key_cache.sizes())));
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), heads = key_cache.size(2);

  struct Side {
    const char* src_name;
    const Tensor& src;
    const char* cache_name;
    const Tensor& cache;
    const char* scale_name;
    const Tensor& scale_cache;
    const char* gs_name;
    const std::optional<Tensor>& gs;
  };
  const Side sides[2] = {
      {"key", key, "key_cache", key_cache, "key_scale_cache", key_scale_cache, "k_global_scale", k_global_scale},
      {"value", value, "value_cache", value_cache, "value_scale_cache", value_scale_cache, "v_global_scale",
       v_global_scale}};
  ScaleSink sinks[2];
  BlockParams params[2];
  int64_t dims[2], nbs[2];
  for (int c = 0; c < 2; ++c) {
    const Side& s = sides[c];
    const int64_t dim = s.src.size(2);
    TORCH_CHECK_VALUE(s.src.size(0) >= n && s.src.size(1) == heads, cat(s.src_name, " has shape ",
                      shape_str(s.src.sizes()), "; expected [>= ", n, " (len(slot_mapping)), ", heads,
                      " (H of key_cache), D]"));
    check_even(s.src_name, dim, fmt);
    dims[c] = dim, nbs[c] = blocks_of(fmt, dim);
    check_bytes_out(s.cache_name, s.cache, {num_blocks, block_size, heads, code_bytes(fmt, dim)},
                    cat("[num_blocks, block_size, H, ", (fmt == kNvfp4 ? "D // 2" : "D"), "] (block geometry of ",
                        "key_cache, D of ", s.src_name, ")").c_str(), true);
    sinks[c] = scale_sink(s.scale_name, s.scale_cache, num_blocks, block_size, heads, nbs[c]);
    params[c] = read_global_scale(s.gs_name, s.gs, fmt);
  }
  check_slots("slot_mapping", slot_mapping, num_blocks * block_size, pad);  // reads every slot: last
  if (n == 0) return;

  const RowQuantizer quants[2] = {RowQuantizer(fmt, key.scalar_type(), dims[0], key.stride(2), params[0]),
                                  RowQuantizer(fmt, value.scalar_type(), dims[1], value.stride(2), params[1])};
  struct Geometry {
    const char* src;
    int64_t s0, s1;  // source strides in bytes: token, head
    uint8_t* cache;
    int64_t c0, c1, c2;  // code cache strides in bytes: block, token, head
  };
  const int64_t se = key.element_size();
  Geometry geo[2];
  for (int c = 0; c < 2; ++c) {
    const Tensor &src = sides[c].src, &cache = sides[c].cache;
    geo[c] = {bytes_of(src), src.stride(0) * se, src.stride(1) * se, reinterpret_cast<uint8_t*>(bytes_of(cache)),
              cache.stride(0), cache.stride(1), cache.stride(2)};
  }
  const Index index(slot_mapping);
  parallel_rows(n, heads * (dims[0] + dims[1]) * (se + 1), [&](int64_t begin, int64_t end) {
    std::vector<float> stage(std::max(dims[0], dims[1]));
    std::vector<uint8_t> buf(std::max(nbs[0], nbs[1]));
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;  // padding: neither codes nor scales
      const int64_t block = slot / block_size, off = slot % block_size;
      for (int c = 0; c < 2; ++c) {
        const Geometry& g = geo[c];
        const char* row = g.src + i * g.s0;
        uint8_t* dst = g.cache + block * g.c0 + off * g.c1;
        for (int64_t h = 0; h < heads; ++h) {
          quants[c](dst + h * g.c2, buf.data(), row + h * g.s1, stage.data());
          sinks[c].put(block, off, h, buf.data(), nbs[c]);
        }
      }
    }
  });
}

}  // namespace kvo
