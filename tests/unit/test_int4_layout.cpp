// The GPU int4 layout (gpu_core/int4_layout.h) is built on the host: check it reproduces every weight
// of the runtime's GPTQ definition exactly, for each format variant (runs without a GPU).
#include <algorithm>
#include <numeric>
#include <random>

#include "gpu_core/int4_layout.h"
#include "gpu_core/rows8_layout.h"
#include "core/weights.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct Case {
  int64_t N, K, gs;
  bool sym, act_order, v1;
};

class Int4Layout : public ::testing::TestWithParam<Case> {};

TEST_P(Int4Layout, RepackIsExact) {
  const Case c = GetParam();
  std::mt19937 rng(test::test_seed());
  const int64_t G = c.K / c.gs;
  std::uniform_int_distribution<int> nib(0, 15), exp_dist(5, 9), mant(0, 1023);
  std::vector<int32_t> qweight(c.K / 8 * c.N, 0), qzeros(G * c.N / 8, 0), g_idx(c.K), perm(c.K);
  std::vector<uint16_t> scales(G * c.N);
  for (auto& w : qweight) w = static_cast<int32_t>(rng());
  for (auto& w : qzeros)
    for (int j = 0; j < 8; ++j) w |= static_cast<int32_t>(static_cast<uint32_t>(c.sym ? (c.v1 ? 7 : 8) : nib(rng)) << (4 * j));
  for (auto& s : scales) s = static_cast<uint16_t>((exp_dist(rng) << 10) | mant(rng));
  std::iota(perm.begin(), perm.end(), 0);
  if (c.act_order) std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t k = 0; k < c.K; ++k) g_idx[k] = static_cast<int32_t>(perm[k] / c.gs);
  const int32_t* gi = c.act_order ? g_idx.data() : nullptr;
  LinearWeight lw;
  lw.kind = LinearWeight::Kind::Gptq;
  lw.out = c.N;
  lw.in = c.K;
  lw.gptq = {qweight.data(), qzeros.data(), scales.data(), DType::F16, gi, c.gs, G, c.v1 ? 1 : 0};
  const gpu::Int4Host h = gpu::repack_gptq_int4({qweight.data(), qzeros.data(), scales.data(), gi, c.N, c.K, c.gs, c.v1 ? 1 : 0});
  EXPECT_EQ(h.permuted, c.act_order);
  std::vector<float> row(c.K);
  for (int64_t n = 0; n < c.N; ++n) {
    lw.dequant_row(n, row.data());
    for (int64_t k = 0; k < c.K; ++k) ASSERT_EQ(gpu::int4_host_weight(h, n, k), row[k]) << "n=" << n << " k=" << k;
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Int4Layout,
                         ::testing::Values(Case{16, 256, 128, true, false, true}, Case{24, 96, 32, false, true, false},
                                           Case{8, 48, 16, false, true, true}, Case{8, 64, 64, true, false, false}));

TEST(Int4Layout, RejectsUnevenGroups) {
  std::vector<int32_t> q(8, 0), z(2, 0), g(64, 0);  // every input in group 0 of 2
  std::vector<uint16_t> s(16, 0x3c00);
  EXPECT_THROW(gpu::repack_gptq_int4({q.data(), z.data(), s.data(), g.data(), 8, 64, 32, 1}), std::invalid_argument);
}

}  // namespace
}  // namespace tandem

namespace tandem {
namespace {

// rows8_layout.h, int8: every row's scale is its max |w| / 127 (0 for a zero row), every weight within
// half a step of code * s, the extremes at +-127. fp8: scale max |w| / 448, every weight within half a
// mantissa step (1/16 relative, s * 2^-10 near zero), the extreme at 448.
TEST(Rows8Layout, RowsQuantizeWithinHalfAStep) {
  std::mt19937 rng(test::test_seed());
  const int64_t N = 33, K = 96;
  std::vector<uint16_t> w(N * K);
  for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0, 0.05f)(rng));
  for (int64_t k = 0; k < K; ++k) w[5 * K + k] = 0;  // a zero row
  for (const RowFormat f : {RowFormat::Int8, RowFormat::Fp8}) {
    const gpu::Rows8Host h = gpu::quantize_rows8(w.data(), N, K, f);
    ASSERT_EQ(h.codes.size(), static_cast<size_t>(N * K));
    ASSERT_EQ(h.scales.size(), static_cast<size_t>(N));
    const float top_code = f == RowFormat::Int8 ? 127.0f : 448.0f;
    for (int64_t n = 0; n < N; ++n) {
      float m = 0, top = 0;
      for (int64_t k = 0; k < K; ++k) m = std::max(m, std::fabs(bf16_to_f32(w[n * K + k])));
      EXPECT_FLOAT_EQ(h.scales[n], m / top_code) << row_format_name(f) << " row " << n;
      for (int64_t k = 0; k < K; ++k) {
        const float x = bf16_to_f32(w[n * K + k]), v = row_decode(h.codes[n * K + gpu::rows8_position(K, k)], f);
        const float bound = f == RowFormat::Int8 ? h.scales[n] * (0.5f + 1e-5f) : std::fabs(x) / 16 * 1.0001f + h.scales[n] * std::ldexp(1.0f, -10);
        EXPECT_LE(std::fabs(x - v * h.scales[n]), bound) << row_format_name(f) << " " << n << ", " << k;
        top = std::max(top, std::fabs(v));
      }
      EXPECT_EQ(top, m > 0 ? top_code : 0.0f) << row_format_name(f) << " row " << n;
    }
  }
  EXPECT_EQ(gpu::rows8_matrix_bytes(N, K), 3328u + 256u);  // codes 3168 -> 3328, scales 132 -> 256 (each 256-byte aligned)
  test::expect_error([&] { gpu::quantize_rows8(w.data(), N, K, RowFormat::Bf16); }, {"bf16 is not an 8-bit format"});
}

// rows8_position: a permutation of each row (rows8_input its inverse) that keeps 4-input words whole;
// in a whole 512-input block lane l's 16 codes (positions 16 l ..) are inputs 4 l + 128 m + e, past the
// whole blocks the order is kept; quantize_rows8 stores input k's code (quantize_row's) there.
TEST(Rows8Layout, CodesInTheGemvsOrder) {
  for (const int64_t K : {16, 96, 512, 1040, 2048}) {
    std::vector<int> seen(K, 0);
    for (int64_t k = 0; k < K; ++k) {
      const int64_t p = gpu::rows8_position(K, k);
      ASSERT_TRUE(p >= 0 && p < K) << K << ": " << k << " -> " << p;
      ++seen[p];
      EXPECT_EQ(gpu::rows8_input(K, p), k) << K << ": " << k;
      EXPECT_EQ(p % 4, k % 4) << K << ": " << k;
      if (k >= K / 512 * 512) EXPECT_EQ(p, k) << K << ": past the whole blocks";
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), K) << K;
  }
  for (int l = 0; l < 32; ++l)
    for (int m = 0; m < 4; ++m)
      for (int e = 0; e < 4; ++e) EXPECT_EQ(gpu::rows8_input(1040, 512 + 16 * l + 4 * m + e), 512 + 4 * l + 128 * m + e);
  std::mt19937 rng(test::test_seed());
  const int64_t N = 3, K = 1040;
  std::vector<uint16_t> w(N * K);
  for (auto& v : w) v = f32_to_bf16(std::normal_distribution<float>(0, 0.05f)(rng));
  for (const RowFormat f : {RowFormat::Int8, RowFormat::Fp8}) {
    const gpu::Rows8Host h = gpu::quantize_rows8(w.data(), N, K, f);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<float> row(K);
      std::vector<uint8_t> codes(K);
      for (int64_t k = 0; k < K; ++k) row[k] = bf16_to_f32(w[n * K + k]);
      EXPECT_EQ(quantize_row(row.data(), K, f, codes.data()), h.scales[n]);
      for (int64_t k = 0; k < K; ++k) ASSERT_EQ(h.codes[n * K + gpu::rows8_position(K, k)], codes[k]) << row_format_name(f) << " " << n << ", " << k;
    }
  }
}

}  // namespace
}  // namespace tandem
