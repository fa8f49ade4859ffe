// vLLM's paged writers: concat_and_cache_mla and reshape_and_cache_flash, a slot is (block,
// offset) in a cache view; a bitwise copy for kv_cache_dtype "auto", else fp8 codes through the
// Quantizer.

#include "kv_cpu.h"

namespace kvo {

// ================================================================ concat_and_cache_mla

void concat_and_cache_mla(const Tensor& kv_c, const Tensor& k_pe, Tensor kv_cache, const Tensor& slot_mapping,
                          std::string kv_cache_dtype, const std::optional<Tensor>& scale, std::string padding) {
  const Padding pad = parse_padding(padding);
  check_writable("kv_cache", kv_cache);
  TORCH_CHECK_VALUE(kv_cache.dim() == 3, cat("kv_cache must be 3-D [num_blocks, block_size, entry], got ",
                    shape_str(kv_cache.sizes())));
  const int64_t num_blocks = kv_cache.size(0), block_size = kv_cache.size(1), width = kv_cache.size(2);
  check_cpu("slot_mapping", slot_mapping);
  TORCH_CHECK_TYPE((slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong) &&
                       slot_mapping.dim() == 1, cat("slot_mapping must be 1-D int32/int64, got ", dtype_name(slot_mapping.scalar_type()), " ",
                   shape_str(slot_mapping.sizes())));
  const int64_t n = slot_mapping.size(0);
  check_cpu("kv_c", kv_c);
  check_cpu("k_pe", k_pe);
  TORCH_CHECK_TYPE(kv_c.scalar_type() == k_pe.scalar_type() && is_float(kv_c.scalar_type()), cat("kv_c (",
                   dtype_name(kv_c.scalar_type()), ") and k_pe (", dtype_name(k_pe.scalar_type()),
                   ") must share a float dtype"));
  for (const auto& s : {std::make_pair("kv_c", &kv_c), std::make_pair("k_pe", &k_pe)}) {
    TORCH_CHECK_VALUE(s.second->dim() == 2 && s.second->size(0) >= n, cat(s.first, " has shape ",
                      shape_str(s.second->sizes()), "; expected [>= ", n, ", width]"));
  }
  const int64_t rank = kv_c.size(1), rope = k_pe.size(1);
  TORCH_CHECK_VALUE(width == rank + rope, cat("kv_cache entries have ", width, " elements; expected kv_c + k_pe = ",
                    rank + rope));
  const int fmt = parse_format(kv_cache_dtype, "kv_cache_dtype", true);
  std::vector<Scale> scales;
  if (fmt < 0) {
    TORCH_CHECK_TYPE(kv_cache.scalar_type() == kv_c.scalar_type(), cat("kv_cache has dtype ",
                     dtype_name(kv_cache.scalar_type()), " but kv_c has dtype ", dtype_name(kv_c.scalar_type())));
  } else {
    TORCH_CHECK_TYPE(kv_cache.scalar_type() == at::kByte, cat("kv_cache has dtype ", dtype_name(kv_cache.scalar_type()),
                     "; kv_cache_dtype ", kv_cache_dtype, " needs uint8"));
    scales = read_scale("scale", scale, 0);
  }
  check_slots("slot_mapping", slot_mapping, num_blocks * block_size, pad);
  if (n == 0) return;

  const Index index(slot_mapping);
  char* base = bytes_of(kv_cache);
  const int64_t ce = kv_cache.element_size();
  const int64_t c0 = kv_cache.stride(0) * ce, c1 = kv_cache.stride(1) * ce, c2 = kv_cache.stride(2);
  const int64_t se = kv_c.element_size();
  const char *cs = bytes_of(kv_c), *ps = bytes_of(k_pe);
  const int64_t cs0 = kv_c.stride(0) * se, ps0 = k_pe.stride(0) * se;
  const int64_t row_bytes = (rank + rope) * (se + ce);
  if (fmt < 0) {
    RowCopy ccopy(kv_c.sizes().slice(1), kv_c.strides().slice(1), kv_cache.strides().slice(2), se);
    RowCopy pcopy(k_pe.sizes().slice(1), k_pe.strides().slice(1), kv_cache.strides().slice(2), se);
    const CopyPlan plan(n * (rank + rope) * se, current_isa());
    ccopy.with(plan), pcopy.with(plan);
    const int64_t pe_at = rank * c2 * ce;
    parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const int64_t slot = index[i];
        if (pad.skip(slot)) continue;
        char* row = base + (slot / block_size) * c0 + (slot % block_size) * c1;
        ccopy(row, cs + i * cs0);
        pcopy(row + pe_at, ps + i * ps0);
      }
      plan.fence();
    });
    return;
  }
  const Quantizer quant(fmt, kv_c.scalar_type(), n * (rank + rope));
  const Scale s = scales[0];
  const int64_t cs1 = kv_c.stride(1), ps1 = k_pe.stride(1);
  parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;
      uint8_t* row = reinterpret_cast<uint8_t*>(base + (slot / block_size) * c0 + (slot % block_size) * c1);
      quant(row, c2, cs + i * cs0, cs1, rank, s);
      quant(row + rank * c2, c2, ps + i * ps0, ps1, rope, s);
    }
    quant.fence();
  });
}

// ================================================================ reshape_and_cache_flash

void reshape_and_cache_flash(const Tensor& key, const Tensor& value, Tensor key_cache, Tensor value_cache,
                             const Tensor& slot_mapping, std::string kv_cache_dtype,
                             const std::optional<Tensor>& k_scale, const std::optional<Tensor>& v_scale,
                             std::string padding) {
  const Padding pad = parse_padding(padding);
  const int fmt = parse_format(kv_cache_dtype, "kv_cache_dtype", true);
  const struct { const char* name; const Tensor& cache; } caches[] = {{"key_cache", key_cache}, {"value_cache", value_cache}};
  for (const auto& c : caches) {
    check_writable(c.name, c.cache);
    TORCH_CHECK_VALUE(c.cache.dim() == 4, cat(c.name, " must be 4-D [num_blocks, block_size, H, D], got ",
                      shape_str(c.cache.sizes())));
    TORCH_CHECK_VALUE(c.cache.stride(3) == 1 || c.cache.size(3) <= 1, cat(c.name, " has strides ",
                      shape_str(c.cache.strides()), "; its last dimension must be contiguous"));
    TORCH_CHECK_TYPE(fmt < 0 || c.cache.scalar_type() == at::kByte, cat(c.name, " has dtype ",
                     dtype_name(c.cache.scalar_type()), "; kv_cache_dtype ", kv_cache_dtype, " stores uint8 codes"));
  }
  const int64_t num_blocks = key_cache.size(0), block_size = key_cache.size(1), heads = key_cache.size(2);
  TORCH_CHECK_VALUE(value_cache.size(0) == num_blocks && value_cache.size(1) == block_size && value_cache.size(2) == heads, cat("value_cache has shape ", shape_str(value_cache.sizes()), "; key_cache ", shape_str(key_cache.sizes())));
  check_cpu("slot_mapping", slot_mapping);
  TORCH_CHECK_TYPE((slot_mapping.scalar_type() == at::kInt || slot_mapping.scalar_type() == at::kLong) &&
                       slot_mapping.dim() == 1, cat("slot_mapping must be 1-D int32/int64, got ", dtype_name(slot_mapping.scalar_type()), " ",
                   shape_str(slot_mapping.sizes())));
  const int64_t n = slot_mapping.size(0);
  const struct { const char* name; const Tensor& src; const char* cache_name; const Tensor& cache; } pairs[] = {
      {"key", key, "key_cache", key_cache}, {"value", value, "value_cache", value_cache}};
  for (const auto& p : pairs) {
    check_cpu(p.name, p.src);
    TORCH_CHECK_VALUE(p.src.dim() == 3 && p.src.size(0) >= n && p.src.size(1) == p.cache.size(2) &&
                          p.src.size(2) == p.cache.size(3), cat(p.name, " has shape ", shape_str(p.src.sizes()), "; expected [>= ", n, ", ", p.cache.size(2),
                      ", ", p.cache.size(3), "] to match ", p.cache_name));
    TORCH_CHECK_TYPE(fmt >= 0 || p.src.scalar_type() == p.cache.scalar_type(), cat(p.name, " has dtype ",
                     dtype_name(p.src.scalar_type()), " but ", p.cache_name, " has dtype ",
                     dtype_name(p.cache.scalar_type())));
    TORCH_CHECK_TYPE(fmt < 0 || is_float(p.src.scalar_type()), cat(p.name, " has dtype ", dtype_name(p.src.scalar_type()),
                     "; expected float32, float16 or bfloat16"));
  }
  std::vector<Scale> kscales, vscales;
  if (fmt >= 0) {
    kscales = read_scale("k_scale", k_scale, heads);
    vscales = read_scale("v_scale", v_scale, heads);
  }
  check_slots("slot_mapping", slot_mapping, num_blocks * block_size, pad);
  if (n == 0) return;

  const Index index(slot_mapping);
  struct Side {
    const char* src;
    int64_t s0, s1, s2;  // source strides: token, head (bytes), dim (elements)
    char* cache;
    int64_t c0, c1, c2;  // cache strides in bytes: block, token, head
    int64_t dim;
  };
  auto side = [&](const Tensor& src, const Tensor& cache) {
    const int64_t se = src.element_size(), ce = cache.element_size();
    return Side{bytes_of(src), src.stride(0) * se, src.stride(1) * se, src.stride(2),
                bytes_of(cache), cache.stride(0) * ce, cache.stride(1) * ce, cache.stride(2) * ce, src.size(2)};
  };
  const Side sides[2] = {side(key, key_cache), side(value, value_cache)};
  const int64_t row_bytes = heads * (key.size(2) + value.size(2)) *
                            (key.element_size() + key_cache.element_size());
  if (fmt < 0) {
    RowCopy copies[2] = {
        RowCopy(key.sizes().slice(1), key.strides().slice(1), key_cache.strides().slice(2), key.element_size()),
        RowCopy(value.sizes().slice(1), value.strides().slice(1), value_cache.strides().slice(2), value.element_size())};
    const CopyPlan plan(n * (copies[0].bytes() + copies[1].bytes()), current_isa());
    copies[0].with(plan), copies[1].with(plan);
    parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
      for (int c = 0; c < 2; ++c) {  // K rows, then V rows (see store_cache)
        const Side& s = sides[c];
        for (int64_t i = begin; i < end; ++i) {
          const int64_t slot = index[i];
          if (pad.skip(slot)) continue;
          copies[c](s.cache + (slot / block_size) * s.c0 + (slot % block_size) * s.c1, s.src + i * s.s0);
        }
      }
      plan.fence();
    });
    return;
  }
  const Quantizer quant(fmt, key.scalar_type(), n * heads * (key.size(2) + value.size(2)));
  const std::vector<Scale>* scales[2] = {&kscales, &vscales};
  parallel_rows(n, row_bytes, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t slot = index[i];
      if (pad.skip(slot)) continue;
      const int64_t block = slot / block_size, offset = slot % block_size;
      for (int c = 0; c < 2; ++c) {
        const Side& s = sides[c];
        const std::vector<Scale>& sc = *scales[c];
        uint8_t* dst = reinterpret_cast<uint8_t*>(s.cache + block * s.c0 + offset * s.c1);
        const char* src = s.src + i * s.s0;
        // One run over all heads when heads are dense on both sides and the scale is shared.
        if (sc.size() == 1 && s.c2 == s.dim && s.s1 == s.dim * quant.src_size && s.s2 == 1) {
          quant(dst, 1, src, 1, heads * s.dim, sc[0]);
          continue;
        }
        for (int64_t h = 0; h < heads; ++h)
          quant(dst + h * s.c2, 1, src + h * s.s1, s.s2, s.dim, sc[sc.size() == 1 ? 0 : h]);
      }
    }
    quant.fence();
  });
}

}  // namespace kvo
