#include "core/dtype.h"

#include <array>
#include <cmath>
#include <limits>
#include <utility>

namespace tandem {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  int size;
};
constexpr std::array<DTypeInfo, 15> kDTypes{{
    {DType::BOOL, "BOOL", 1},   {DType::U8, "U8", 1},       {DType::I8, "I8", 1},
    {DType::I16, "I16", 2},     {DType::U16, "U16", 2},     {DType::F16, "F16", 2},
    {DType::BF16, "BF16", 2},   {DType::I32, "I32", 4},     {DType::U32, "U32", 4},
    {DType::F32, "F32", 4},     {DType::F64, "F64", 8},     {DType::I64, "I64", 8},
    {DType::U64, "U64", 8},     {DType::F8_E4M3, "F8_E4M3", 1}, {DType::F8_E5M2, "F8_E5M2", 1},
}};
}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

std::string_view dtype_name(DType t) { return kDTypes[static_cast<int>(t)].name; }
int dtype_size(DType t) { return kDTypes[static_cast<int>(t)].size; }

bool is_float_dtype(DType t) { return t == DType::BF16 || t == DType::F16 || t == DType::F32; }

float f16_to_f32(uint16_t h) {
  const uint32_t sign = (h >> 15) & 1u, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  float v;
  if (exp == 0) {
    v = std::ldexp(static_cast<float>(mant), -24);  // subnormal (or zero)
  } else if (exp == 31) {
    v = mant ? std::numeric_limits<float>::quiet_NaN() : std::numeric_limits<float>::infinity();
  } else {
    v = std::ldexp(static_cast<float>(mant | 0x400u), static_cast<int>(exp) - 25);
  }
  return sign ? -v : v;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) return sign | 0x7e00u;   // NaN
  if (ax >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: inf
  if (ax < 0x38800000u) {                        // below 2^-14: subnormal half (or zero)
    const float a = std::fabs(f) * 16777216.0f;  // in units of 2^-24, exact
    return sign | static_cast<uint16_t>(std::nearbyint(a));  // default rounding mode: to nearest even
  }
  const uint32_t rounded = ax + 0xfffu + ((ax >> 13) & 1u);  // RNE on the 13 dropped bits
  return sign | static_cast<uint16_t>((rounded - 0x38000000u) >> 13);
}

}  // namespace tandem
