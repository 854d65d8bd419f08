#include "core/row_format.h"

#include <cmath>

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
  if (s.empty()) return RowFormat::Bf16;
  for (RowFormat f : {RowFormat::Bf16, RowFormat::Int8, RowFormat::Fp8})
    if (s == row_format_name(f)) return f;
  fail(what, ": '", s, "' must be bf16, int8 or fp8");
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

}  // namespace tandem
