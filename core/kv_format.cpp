#include "core/kv_format.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

const char* kv_format_name(KvFormat f) {
  switch (f) {
    case KvFormat::Bf16: return "bf16";
    case KvFormat::Int8: return "int8";
    case KvFormat::Fp8: return "fp8";
  }
  return "?";
}

KvFormat parse_kv_format(const std::string& s, const std::string& what) {
  for (KvFormat f : {KvFormat::Bf16, KvFormat::Int8, KvFormat::Fp8})
    if (s == kv_format_name(f)) return f;
  fail(what, ": '", s, "' is not a KV cache format (bf16, int8 or fp8)");
}

float kv_quantize_row(const float* x, int64_t n, KvFormat f, uint8_t* codes) {
  if (f == KvFormat::Bf16) fail("kv_quantize_row: bf16 is not a coded KV format");
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  float scale, inv;
  kv_row_scale(amax, f, &scale, &inv);
  for (int64_t i = 0; i < n; ++i) codes[i] = kv_encode(x[i], inv, f);
  return scale;
}

void kv_round_row(float* x, int64_t n, KvFormat f) {
  if (f == KvFormat::Bf16) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return;
  }
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  const float scale = kv_quantize_row(x, n, f, codes.data());
  for (int64_t i = 0; i < n; ++i) x[i] = kv_decode(codes[i], f) * scale;
}

}  // namespace tandem
