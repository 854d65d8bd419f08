#include <cmath>

#include "core/dtype.h"
#include "tests/unit/test_util.h"

namespace tandem {

// Every one of the 65536 f16 encodings, against the IEEE 754 binary16 definition computed in double.
TEST(DType, F16ToF32IsExactForEveryEncoding) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const int sign = (h >> 15) & 1, exp = (h >> 10) & 31, mant = h & 1023;
    double want;
    if (exp == 0) want = std::ldexp(double(mant), -24);
    else if (exp == 31) want = mant ? NAN : INFINITY;
    else want = std::ldexp(1.0 + mant / 1024.0, exp - 15);
    if (sign) want = -want;
    const float got = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(want)) EXPECT_TRUE(std::isnan(got)) << h;
    else EXPECT_EQ(double(got), want) << "f16 bits " << h;
  }
}

TEST(DType, Bf16RoundTripsAndRoundsToNearestEven) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = bf16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    EXPECT_EQ(f32_to_bf16(f), h);
  }
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties go to even (1.0).
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + std::ldexp(1.0f, -8))), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8))), 1.015625f);
}

TEST(DType, NamesAndSizes) {
  EXPECT_EQ(dtype_from_name("BF16"), DType::BF16);
  EXPECT_EQ(dtype_from_name("F8_E4M3"), DType::F8_E4M3);
  EXPECT_FALSE(dtype_from_name("bf16").has_value());
  EXPECT_EQ(dtype_size(DType::I32), 4);
  EXPECT_EQ(dtype_name(DType::F16), "F16");
}

}  // namespace tandem
