// core/row_format.h: how a row of values is stored -- bf16, or 8-bit codes with one fp32 scale for the
// row -- and the one definition of the rounding, shared by host code and the GPU kernels (both include
// this header, so host and device round alike). Two users: the KV cache (a row is one KV head of one
// token: the host placements and the GPU store the codes) and dense weights quantized on load (a row is
// one output channel of a projection).
//
// bf16 stores each value rounded to bf16. int8 and fp8 store a code per value and the row's scale, the
// row's largest magnitude mapped to the format's largest code (no calibration; an outlier costs only
// its own row):
//   int8: scale = amax / 127, code = round_half_even(x * (127 / amax)) in -127..127, value = code * scale
//   fp8:  scale = amax / 448, code = E4M3(x * (448 / amax)) rounded to nearest even (OCP E4M3: bias 7,
//         no infinities, 448 the largest finite), value = E4M3 value * scale
// A row of zeros has scale 0 and codes 0. A row with a NaN or an infinity has no meaningful codes (nor
// has the model's output then).
#pragma once

#include <cmath>
#include <cstdint>
#include <string>

#ifdef __CUDACC__
#define TANDEM_HD __host__ __device__ __forceinline__
#else
#define TANDEM_HD inline
#endif

namespace tandem {

enum class RowFormat : uint8_t { Bf16, Int8, Fp8 };

const char* row_format_name(RowFormat f);  // "bf16", "int8", "fp8"
// Parses "bf16" / "int8" / "fp8" ("": bf16, the default of every option that takes one); tandem::Error
// naming `what` (a flag or a YAML key) and the choices.
RowFormat parse_row_format(const std::string& s, const std::string& what);
// Bytes a cached value takes, its row's scale aside (2 or 1).
TANDEM_HD int row_value_bytes(RowFormat f) { return f == RowFormat::Bf16 ? 2 : 1; }

// The largest code's magnitude: 127 (int8) or 448 (fp8).
TANDEM_HD float row_code_max(RowFormat f) { return f == RowFormat::Int8 ? 127.0f : 448.0f; }

// E4M3 with saturation to +-448 (a value beyond it, after rounding, is 448), ties to even.
TANDEM_HD uint8_t fp8_e4m3_encode(float x) {
  const uint8_t sign = copysignf(1.0f, x) < 0.0f ? 0x80 : 0x00;
  const float f = fabsf(x);
  if (f != f) return sign | 0x7f;  // NaN
  if (f >= 448.0f) return sign | 0x7e;
  if (f < 0.015625f) return sign | static_cast<uint8_t>(rintf(f * 512.0f));  // subnormal steps of 2^-9 (8 steps: 2^-6, code 8)
  const int e = ilogbf(f);                                                    // -6 .. 8
  const int q = static_cast<int>(rintf((ldexpf(f, -e) - 1.0f) * 8.0f));      // 0 .. 8: 8 carries into the exponent
  return sign | static_cast<uint8_t>(((e + 7) << 3) + q);
}

TANDEM_HD float fp8_e4m3_decode(uint8_t c) {
  const int e = (c >> 3) & 15, m = c & 7;
  float v;
  if (e == 0) v = ldexpf(static_cast<float>(m), -9);
  else if (e == 15 && m == 7) v = NAN;
  else v = ldexpf(static_cast<float>(8 + m), e - 10);
  return c & 0x80 ? -v : v;
}

// The code of x for a row whose largest magnitude makes `inv` (row_code_max / amax; 0 for a zero row).
TANDEM_HD uint8_t row_encode(float x, float inv, RowFormat f) {
  if (f == RowFormat::Int8) {
    const float q = fminf(fmaxf(rintf(x * inv), -127.0f), 127.0f);
    return static_cast<uint8_t>(static_cast<int8_t>(q));
  }
  return fp8_e4m3_encode(x * inv);
}
// A code's value before the row's scale.
TANDEM_HD float row_decode(uint8_t c, RowFormat f) {
  return f == RowFormat::Int8 ? static_cast<float>(static_cast<int8_t>(c)) : fp8_e4m3_decode(c);
}
// The row's scale and the factor its values are multiplied by before rounding.
TANDEM_HD void row_scale(float amax, RowFormat f, float* scale, float* inv) {
  const float top = row_code_max(f);
  *scale = amax / top;
  *inv = amax > 0.0f ? top / amax : 0.0f;
}

// Host: the row x[0..n) quantized into codes[0..n); returns its scale. Bf16 is not a coded format.
float quantize_row(const float* x, int64_t n, RowFormat f, uint8_t* codes);

}  // namespace tandem
