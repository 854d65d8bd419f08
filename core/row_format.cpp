#include "core/row_format.h"

#include <cmath>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"

namespace tandem {

const char* row_format_name(RowFormat f) {
  switch (f) {
    case RowFormat::Bf16: return "bf16";
    case RowFormat::Int8: return "int8";
    case RowFormat::Fp8: return "fp8";
  }
  return "?";
}

RowFormat parse_row_format(const std::string& s, const std::string& what) {
  for (RowFormat f : {RowFormat::Bf16, RowFormat::Int8, RowFormat::Fp8})
    if (s == row_format_name(f)) return f;
  fail(what, ": '", s, "' is not a KV cache format (bf16, int8 or fp8)");
}

float quantize_row(const float* x, int64_t n, RowFormat f, uint8_t* codes) {
  if (f == RowFormat::Bf16) fail("quantize_row: bf16 is not a coded KV format");
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(x[i]));
  float scale, inv;
  row_scale(amax, f, &scale, &inv);
  for (int64_t i = 0; i < n; ++i) codes[i] = row_encode(x[i], inv, f);
  return scale;
}

void round_row(float* x, int64_t n, RowFormat f) {
  if (f == RowFormat::Bf16) {
    for (int64_t i = 0; i < n; ++i) x[i] = bf16_to_f32(f32_to_bf16(x[i]));
    return;
  }
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  const float scale = quantize_row(x, n, f, codes.data());
  for (int64_t i = 0; i < n; ++i) x[i] = row_decode(codes[i], f) * scale;
}

}  // namespace tandem
