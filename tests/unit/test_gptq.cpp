// GPTQ int4 unpacking against the format's definition, on fresh random codes: packing is done here
// independently (spec §4), then LinearWeight::dequant_row and linear_ref must reproduce W exactly.
#include <algorithm>
#include <numeric>

#include "core/weights.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct Packed {
  int64_t out, in, gs, groups;
  std::vector<int> q, zero;  // q[k][n], zero[g][n] (actual zero point)
  std::vector<uint16_t> scales;  // f16 bits [g][n]
  std::vector<int32_t> g_idx, qweight, qzeros;
};

Packed make(std::mt19937& rng, int64_t out, int64_t in, int64_t gs, bool sym, bool act_order, bool v1) {
  Packed p{out, in, gs, in / gs, {}, {}, {}, {}, {}, {}};
  std::uniform_int_distribution<int> nib(0, 15), zero_dist(0, 15);
  p.q.resize(in * out);
  for (auto& v : p.q) v = nib(rng);
  p.zero.resize(p.groups * out);
  for (auto& z : p.zero) z = sym ? 8 : zero_dist(rng);
  p.scales.resize(p.groups * out);
  // f16 scales drawn as bit patterns: normal numbers between 2^-10 and 2^-3 with random mantissas.
  std::uniform_int_distribution<int> exp_dist(5, 12), mant_dist(0, 1023);
  for (auto& s : p.scales) s = static_cast<uint16_t>((exp_dist(rng) << 10) | mant_dist(rng));
  p.g_idx.resize(in);
  std::vector<int> perm(in);
  std::iota(perm.begin(), perm.end(), 0);
  if (act_order) std::shuffle(perm.begin(), perm.end(), rng);
  for (int64_t k = 0; k < in; ++k) p.g_idx[k] = static_cast<int32_t>(perm[k] / gs);
  p.qweight.assign(in / 8 * out, 0);
  for (int64_t k = 0; k < in; ++k)
    for (int64_t n = 0; n < out; ++n)
      p.qweight[(k / 8) * out + n] |= static_cast<int32_t>(static_cast<uint32_t>(p.q[k * out + n]) << (4 * (k % 8)));
  // v2 words hold the zero points; v1 words are written as GPTQModel writes them: the v2 word minus
  // 0x11111111 (a zero point of 0 borrows from the next nibble).
  p.qzeros.assign(p.groups * (out / 8), 0);
  for (int64_t g = 0; g < p.groups; ++g)
    for (int64_t n = 0; n < out; ++n)
      p.qzeros[g * (out / 8) + n / 8] |= static_cast<int32_t>(static_cast<uint32_t>(p.zero[g * out + n]) << (4 * (n % 8)));
  if (v1)
    for (auto& w : p.qzeros) w = static_cast<int32_t>(static_cast<uint32_t>(w) - 0x11111111u);
  return p;
}

LinearWeight view(const Packed& p, bool v1, bool with_g_idx) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Gptq;
  w.out = p.out;
  w.in = p.in;
  w.gptq.qweight = p.qweight.data();
  w.gptq.qzeros = p.qzeros.data();
  w.gptq.scales = p.scales.data();
  w.gptq.scales_dtype = DType::F16;
  w.gptq.g_idx = with_g_idx ? p.g_idx.data() : nullptr;
  w.gptq.group_size = p.gs;
  w.gptq.num_groups = p.groups;
  w.gptq.zero_offset = v1 ? 1 : 0;
  return w;
}

struct Case {
  int64_t out, in, gs;
  bool sym, act_order, v1;
};

class GptqDequant : public ::testing::TestWithParam<Case> {};

TEST_P(GptqDequant, MatchesDefinitionExactly) {
  const Case c = GetParam();
  std::mt19937 rng(test::test_seed());
  const Packed p = make(rng, c.out, c.in, c.gs, c.sym, c.act_order, c.v1);
  const LinearWeight w = view(p, c.v1, c.act_order);
  std::vector<float> row(c.in);
  for (int64_t n = 0; n < c.out; ++n) {
    w.dequant_row(n, row.data());
    for (int64_t k = 0; k < c.in; ++k) {
      const int g = p.g_idx[k];
      const double want = double(f16_to_f32(p.scales[g * c.out + n])) * (p.q[k * c.out + n] - p.zero[g * c.out + n]);
      ASSERT_EQ(double(row[k]), want) << "n=" << n << " k=" << k << " seed=" << test::test_seed();
    }
  }
  // The reference matmul on top of it: fp32 accumulation against a double-precision product.
  const int64_t T = 3;
  const auto x = test::random_floats(rng, T * c.in);
  std::vector<float> y(T * c.out);
  linear_ref(w, x.data(), T, y.data());
  std::vector<double> got(y.begin(), y.end()), want(T * c.out, 0.0);
  for (int64_t n = 0; n < c.out; ++n) {
    w.dequant_row(n, row.data());
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < c.in; ++k) want[t * c.out + n] += double(row[k]) * x[t * c.in + k];
  }
  EXPECT_LT(test::rel_l2(got, want), 1e-6) << "seed=" << test::test_seed();
}

INSTANTIATE_TEST_SUITE_P(Formats, GptqDequant,
                         ::testing::Values(Case{64, 128, 32, true, false, true},    // official: sym, v1 (stored 7)
                                           Case{64, 128, 32, true, false, false},   // sym, v2 (stored 8)
                                           Case{40, 96, 16, false, true, false},    // asym, act-order, v2
                                           Case{24, 256, 128, false, true, true},   // asym, act-order, v1
                                           Case{8, 64, 64, false, false, true}));   // one group

TEST(GptqDequant, V1ZeroPointsOfZeroBorrowAsGptqModelWritesThem) {
  // Zero points 0, 5, 0, 5, ... are the v2 word 0x50505050; GPTQModel writes v1 as 0x50505050 - 0x11111111
  // = 0x3f3f3f3f. Read back word-wise they are 0 and 5 again; nibble by nibble (+1 each) they would
  // read as 16 and 4.
  std::vector<int32_t> qweight(8, 0x33333333), qzeros(1, static_cast<int32_t>(0x3f3f3f3fu));
  std::vector<uint16_t> scales(8, 0x3c00);  // 1.0
  LinearWeight w;
  w.kind = LinearWeight::Kind::Gptq;
  w.out = 8;
  w.in = 8;
  w.gptq = {qweight.data(), qzeros.data(), scales.data(), DType::F16, nullptr, 8, 1, 1};
  std::vector<float> row(8);
  for (int64_t n = 0; n < 8; ++n) {
    w.dequant_row(n, row.data());
    EXPECT_EQ(row[0], n % 2 ? -2.0f : 3.0f) << "column " << n;  // q = 3 minus zero 5 or 0
  }
  // The top nibble's borrow leaves the word (mod 2^32): v2 0x0..., v1 0xf... + 0x11111111 wraps to 0x0...
  qzeros[0] = static_cast<int32_t>(0x05050505u - 0x11111111u);
  w.dequant_row(7, row.data());
  EXPECT_EQ(row[0], 3.0f);
  w.dequant_row(6, row.data());
  EXPECT_EQ(row[0], -2.0f);
}

}  // namespace
}  // namespace tandem
