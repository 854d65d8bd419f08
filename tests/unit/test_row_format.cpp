// The KV cache formats' rounding (core/row_format.h), the definition the GPU kernels share: E4M3 codes
// against the format's value table (every code, and the nearest-value rule on random and boundary
// inputs), int8 codes, and the row quantizer's error bound per format.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/row_format.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// E4M3's finite values from the definition (bias 7, 3 mantissa bits, exponent 0 subnormal, S.1111.111
// NaN), independent of the decoder.
double e4m3_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  const double v = e == 0 ? m / 8.0 * std::ldexp(1.0, -6) : (1 + m / 8.0) * std::ldexp(1.0, e - 7);
  return c & 0x80 ? -v : v;
}

TEST(RowFormat, Fp8DecodesEveryCode) {
  for (int c = 0; c < 256; ++c) {
    const float v = fp8_e4m3_decode(static_cast<uint8_t>(c));
    if ((c & 0x7f) == 0x7f) {
      EXPECT_TRUE(std::isnan(v)) << c;
      continue;
    }
    EXPECT_EQ(v, static_cast<float>(e4m3_value(c))) << c;
    if ((c & 0x7f) != 0) EXPECT_EQ(fp8_e4m3_encode(v), c) << "round trip of code " << c;  // +-0 aside
  }
  EXPECT_EQ(fp8_e4m3_decode(0x7e), 448.0f);
  EXPECT_EQ(fp8_e4m3_decode(0x01), std::ldexp(1.0f, -9));
}

// The encoder picks the nearest finite value, the even code on a tie, and saturates at 448.
uint8_t nearest_e4m3(float x) {
  int best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7f) == 0x7f) continue;
    const double d = std::abs(e4m3_value(c) - x);
    if (d < best_d || (d == best_d && (c & 1) == 0 && (e4m3_value(c) != 0 || std::signbit(x) == bool(c & 0x80)))) best = c, best_d = d;
  }
  return static_cast<uint8_t>(best);
}

TEST(RowFormat, Fp8EncodesToTheNearestValue) {
  std::mt19937 rng(test::test_seed());
  std::vector<float> xs;
  for (int i = 0; i < 20000; ++i) xs.push_back(std::ldexp(std::uniform_real_distribution<float>(-1, 1)(rng), std::uniform_int_distribution<int>(-12, 9)(rng)));
  for (int c = 1; c < 0x7e; ++c) {  // every midpoint between neighbours (ties), and just either side
    const float mid = static_cast<float>((e4m3_value(c) + e4m3_value(c + 1)) / 2);
    for (const float x : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f)}) xs.push_back(x), xs.push_back(-x);
  }
  for (const float x : xs) {
    const float clamped = std::min(std::abs(x), 448.0f);
    EXPECT_EQ(fp8_e4m3_encode(x), nearest_e4m3(std::copysign(clamped, x))) << x;
  }
  EXPECT_EQ(fp8_e4m3_encode(1e6f), 0x7e);
  EXPECT_EQ(fp8_e4m3_encode(-1e6f), 0xfe);
  EXPECT_EQ(fp8_e4m3_encode(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(fp8_e4m3_encode(464.0f), 0x7e);  // the tie above 448 saturates instead of becoming NaN
  EXPECT_EQ(fp8_e4m3_encode(0.0f), 0x00);
  EXPECT_EQ(fp8_e4m3_encode(std::ldexp(1.0f, -11)), 0x00);  // a quarter of the smallest step: zero
}

TEST(RowFormat, Int8CodesRoundHalfToEven) {
  float scale, inv;
  row_scale(127.0f, RowFormat::Int8, &scale, &inv);
  EXPECT_EQ(scale, 1.0f);
  EXPECT_EQ(static_cast<int8_t>(row_encode(2.5f, inv, RowFormat::Int8)), 2);
  EXPECT_EQ(static_cast<int8_t>(row_encode(-3.5f, inv, RowFormat::Int8)), -4);
  EXPECT_EQ(static_cast<int8_t>(row_encode(127.0f, inv, RowFormat::Int8)), 127);
  EXPECT_EQ(static_cast<int8_t>(row_encode(-200.0f, inv, RowFormat::Int8)), -127);  // beyond the row's amax: clamped
  EXPECT_EQ(row_decode(row_encode(-57.0f, inv, RowFormat::Int8), RowFormat::Int8), -57.0f);
}

// A row's error after test::round_row (quantize_row, then the codes times the scale): int8 at most
// half a step (amax / 254) a value; fp8 at most 1/16 of the value relative (half a mantissa step) plus
// half the smallest step; bf16 2^-8 relative. The largest magnitude is kept exactly by both coded
// formats (it is the top code).
TEST(RowFormat, RoundedRowsStayWithinHalfAStep) {
  std::mt19937 rng(test::test_seed() + 1);
  for (const RowFormat f : {RowFormat::Bf16, RowFormat::Int8, RowFormat::Fp8}) {
    for (int trial = 0; trial < 50; ++trial) {
      const int n = 256;
      std::vector<float> x(n);
      const float spread = std::ldexp(1.0f, std::uniform_int_distribution<int>(-8, 8)(rng));
      for (float& e : x) e = std::normal_distribution<float>(0, spread)(rng);
      x[trial % n] *= 20;  // an outlier
      std::vector<float> r = x;
      test::round_row(r.data(), n, f);
      float amax = 0;
      for (float e : x) amax = std::max(amax, std::abs(e));
      for (int i = 0; i < n; ++i) {
        const double err = std::abs(double(r[i]) - x[i]);
        const double bound = f == RowFormat::Int8  ? amax / 254.0 * 1.0001
                             : f == RowFormat::Fp8 ? std::abs(x[i]) / 16.0 * 1.0001 + amax / 448 * std::ldexp(1.0, -10) * 1.0001
                                                  : std::abs(x[i]) * std::ldexp(1.0, -8);
        ASSERT_LE(err, bound) << row_format_name(f) << " value " << x[i] << " -> " << r[i] << " (amax " << amax << ")";
        if (f != RowFormat::Bf16 && std::abs(x[i]) == amax) EXPECT_NEAR(r[i], x[i], amax * 1e-6) << row_format_name(f);
      }
    }
  }
}

TEST(RowFormat, ZeroRowsAndNames) {
  std::vector<float> z(64, 0.0f);
  std::vector<uint8_t> codes(64, 0xaa);
  EXPECT_EQ(quantize_row(z.data(), 64, RowFormat::Int8, codes.data()), 0.0f);
  for (uint8_t c : codes) EXPECT_EQ(c, 0);
  test::round_row(z.data(), 64, RowFormat::Fp8);
  for (float v : z) EXPECT_EQ(v, 0.0f);
  for (const RowFormat f : {RowFormat::Bf16, RowFormat::Int8, RowFormat::Fp8}) EXPECT_EQ(parse_row_format(row_format_name(f), "x"), f);
  try {
    parse_row_format("fp16", "--kv-format");
    FAIL() << "fp16 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--kv-format: 'fp16' must be bf16, int8 or fp8"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace tandem
