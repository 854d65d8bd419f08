// core/dtype.h: element types of checkpoint tensors and exact conversions to float32.
//
// Names follow the safetensors header strings ("BF16", "F16", "F32", "I32", "F8_E4M3", ...).
// bf16 -> f32 and f16 -> f32 are exact (every value is representable); no rounding happens here.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

namespace tandem {

enum class DType : uint8_t { BOOL, U8, I8, I16, U16, F16, BF16, I32, U32, F32, F64, I64, U64, F8_E4M3, F8_E5M2 };

std::optional<DType> dtype_from_name(std::string_view name);
std::string_view dtype_name(DType t);
int dtype_size(DType t);

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round-to-nearest-even, NaN kept quiet; used by tests and by tools that write checkpoints.
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

float f16_to_f32(uint16_t h);
// Round-to-nearest-even to IEEE half (overflow -> inf, tiny -> subnormal/zero); for checkpoint writers.
uint16_t f32_to_f16(float f);

// Reads element i of a buffer of a floating dtype (BF16 / F16 / F32) as float32, exactly.
inline float load_as_f32(const void* base, DType t, int64_t i) {
  switch (t) {
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::F32: return static_cast<const float*>(base)[i];
    default: return 0.0f;  // callers validate dtypes at load; hot loops never see other types
  }
}

bool is_float_dtype(DType t);

}  // namespace tandem
