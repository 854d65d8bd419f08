// Each reference operator against its direct mathematical definition, computed independently in
// double on fresh random inputs (seed printed on failure; TANDEM_TEST_SEED reproduces a run).
#include <algorithm>
#include <cmath>
#include <complex>
#include <numeric>

#include "runtime/models/qwen3_5_moe/ops_ref.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

using test::rel_l2;
using test::test_seed;

double dsilu(double x) { return x / (1 + std::exp(-x)); }

TEST(OpsRef, RmsNormZeroCentred) {
  std::mt19937 rng(test_seed());
  for (int n : {1, 7, 64, 2048}) {
    auto x = test::random_floats(rng, n, 3.0f), w = test::random_floats(rng, n, 0.3f);
    std::vector<float> y(n);
    ref::rmsnorm_zc(x.data(), w.data(), n, 1e-6f, y.data());
    double ms = 0;
    for (float v : x) ms += double(v) * v;
    const double r = 1 / std::sqrt(ms / n + 1e-6);
    std::vector<double> want(n), got(y.begin(), y.end());
    for (int i = 0; i < n; ++i) want[i] = x[i] * r * (1 + double(w[i]));
    EXPECT_LT(rel_l2(got, want), 1e-6) << "n=" << n << " seed=" << test_seed();
  }
}

TEST(OpsRef, RmsNormGatedNormsThenGates) {
  std::mt19937 rng(test_seed());
  const int n = 128;
  auto x = test::random_floats(rng, n, 2.0f), z = test::random_floats(rng, n, 2.0f), w = test::random_floats(rng, n, 0.5f);
  std::vector<float> y(n);
  ref::rmsnorm_gated(x.data(), z.data(), w.data(), n, 1e-6f, y.data());
  double ms = 0;
  for (float v : x) ms += double(v) * v;
  const double r = 1 / std::sqrt(ms / n + 1e-6);
  std::vector<double> want(n), got(y.begin(), y.end());
  for (int i = 0; i < n; ++i) want[i] = w[i] * x[i] * r * dsilu(z[i]);
  EXPECT_LT(rel_l2(got, want), 1e-6);
}

TEST(OpsRef, L2NormAndScalars) {
  std::vector<float> x = {3, 4};
  ref::l2norm(x.data(), 2, 0.0f);
  EXPECT_FLOAT_EQ(x[0], 0.6f);
  EXPECT_FLOAT_EQ(x[1], 0.8f);
  EXPECT_EQ(ref::softplus(25.0f), 25.0f);  // torch's threshold: identity above 20
  EXPECT_NEAR(ref::softplus(0.0f), std::log(2.0f), 1e-7);
  EXPECT_NEAR(ref::softplus(-30.0f), std::exp(-30.0), 1e-18);
  EXPECT_NEAR(ref::sigmoid(0.3f), 1 / (1 + std::exp(-0.3)), 1e-7);
}

// Partial NeoX RoPE = multiplying (x_i, x_{i+d/2}) as a complex number by e^{i pos theta^(-2i/d)}.
TEST(OpsRef, RopeIsAComplexRotationOfTheFirstDims) {
  std::mt19937 rng(test_seed());
  for (int rot : {8, 64}) {
    const int head = 256;
    std::vector<float> inv(rot / 2);
    ref::rope_inv_freq(1e7, rot, inv.data());
    for (int i = 0; i < rot / 2; ++i) EXPECT_NEAR(inv[i], std::pow(1e7, -2.0 * i / rot), 1e-6 * std::pow(1e7, -2.0 * i / rot));
    for (int64_t pos : {0, 1, 17, 4000}) {
      auto x = test::random_floats(rng, head);
      auto y = x;
      ref::rope_neox(y.data(), rot, inv.data(), pos);
      std::vector<double> got(y.begin(), y.end()), want(head);
      for (int i = 0; i < rot / 2; ++i) {
        const std::complex<double> c(x[i], x[i + rot / 2]);
        // The angle is the fp32 product, as torch forms it (pos.float() * inv_freq); the rotation is exact.
        const float angle = static_cast<float>(pos) * inv[i];
        const auto r = c * std::polar(1.0, double(angle));
        want[i] = r.real();
        want[i + rot / 2] = r.imag();
      }
      for (int i = rot; i < head; ++i) want[i] = x[i];
      EXPECT_LT(rel_l2(got, want), 2e-6) << "rot=" << rot << " pos=" << pos;
      for (int i = rot; i < head; ++i) ASSERT_EQ(y[i], x[i]);
    }
  }
}

// Causal depthwise conv over a sequence, fed in two calls (state carried), vs the direct sum.
TEST(OpsRef, CausalConvCarriesItsWindow) {
  std::mt19937 rng(test_seed());
  for (int K : {2, 4}) {
    const int C = 13, T = 9;
    auto x = test::random_floats(rng, T * C), w = test::random_floats(rng, C * K);
    std::vector<float> window((K - 1) * C, 0.0f), y(T * C);
    for (int t = 0; t < T; ++t) ref::causal_conv_step(x.data() + t * C, window.data(), w.data(), C, K, y.data() + t * C);
    std::vector<double> got(y.begin(), y.end()), want(T * C);
    for (int t = 0; t < T; ++t)
      for (int ch = 0; ch < C; ++ch) {
        double acc = 0;
        for (int j = 0; j < K; ++j) {
          const int src = t - (K - 1) + j;
          if (src >= 0) acc += double(w[ch * K + j]) * x[src * C + ch];
        }
        want[t * C + ch] = dsilu(acc);
      }
    EXPECT_LT(rel_l2(got, want), 1e-6) << "K=" << K;
  }
}

// The token-by-token delta rule against the chunked closed form (spec §3.3, ref::delta_rule_chunk),
// in two chunks from a random state S0: two different formulations must agree.
TEST(OpsRef, DeltaRuleRecurrenceMatchesChunkedForm) {
  std::mt19937 rng(test_seed());
  const int T = 12, dk = 16, dv = 8;
  auto Q = test::random_floats(rng, T * dk), K = test::random_floats(rng, T * dk), V = test::random_floats(rng, T * dv);
  auto S0 = test::random_floats(rng, dk * dv, 0.5f);
  std::vector<float> g(T), beta(T);
  std::uniform_real_distribution<float> ug(-1.5f, -0.01f), ub(0.05f, 0.95f);
  for (int t = 0; t < T; ++t) {
    g[t] = ug(rng);
    beta[t] = ub(rng);
    ref::l2norm(Q.data() + t * dk, dk, 1e-6f);
    ref::l2norm(K.data() + t * dk, dk, 1e-6f);
  }
  // Recurrence.
  std::vector<float> S = S0, O(T * dv);
  for (int t = 0; t < T; ++t)
    ref::delta_rule_step(S.data(), Q.data() + t * dk, K.data() + t * dk, V.data() + t * dv, g[t], beta[t], dk, dv,
                         O.data() + t * dv);
  // Chunked form (ref::delta_rule_chunk, in double inside), in two chunks so the carried state counts.
  std::vector<float> S1 = S0, Ochunk(T * dv);
  const int C1 = 5;
  ref::delta_rule_chunk(S1.data(), Q.data(), K.data(), V.data(), g.data(), beta.data(), C1, dk, dv, Ochunk.data());
  ref::delta_rule_chunk(S1.data(), Q.data() + C1 * dk, K.data() + C1 * dk, V.data() + C1 * dv, g.data() + C1, beta.data() + C1, T - C1,
                        dk, dv, Ochunk.data() + C1 * dv);
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_LT(rel_l2(d(O), d(Ochunk)), 1e-5) << "seed=" << test_seed();
  EXPECT_LT(rel_l2(d(S), d(S1)), 1e-5) << "seed=" << test_seed();
}

TEST(OpsRef, AttentionIsSoftmaxWeightedValues) {
  std::mt19937 rng(test_seed());
  const int hd = 32, n = 23, stride = 3 * hd;
  auto q = test::random_floats(rng, hd), kc = test::random_floats(rng, n * stride, 2.0f), vc = test::random_floats(rng, n * stride);
  std::vector<float> scores(n), out(hd);
  const float scale = 1.0f / std::sqrt(float(hd));
  ref::attend(q.data(), kc.data() + hd, vc.data() + hd, n, stride, hd, scale, scores.data(), out.data());
  std::vector<double> s(n), want(hd, 0.0);
  double mx = -1e300, den = 0;
  for (int j = 0; j < n; ++j) {
    s[j] = 0;
    for (int i = 0; i < hd; ++i) s[j] += double(q[i]) * kc[j * stride + hd + i];
    s[j] *= scale;
    mx = std::max(mx, s[j]);
  }
  for (int j = 0; j < n; ++j) den += std::exp(s[j] - mx);
  for (int j = 0; j < n; ++j)
    for (int i = 0; i < hd; ++i) want[i] += std::exp(s[j] - mx) / den * vc[j * stride + hd + i];
  EXPECT_LT(rel_l2(std::vector<double>(out.begin(), out.end()), want), 1e-6);
}

TEST(OpsRef, RouteTopKRenormalisesAndBreaksTiesLow) {
  std::mt19937 rng(test_seed());
  for (int k : {1, 2, 8}) {
    const int E = 64;
    auto logits = test::random_floats(rng, E, 2.0f);
    std::vector<int> idx(k);
    std::vector<float> w(k);
    ref::route_topk(logits.data(), E, k, idx.data(), w.data());
    std::vector<int> order(E);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    double den = 0;
    for (int j = 0; j < k; ++j) den += std::exp(double(logits[order[j]]));
    for (int j = 0; j < k; ++j) {
      EXPECT_EQ(idx[j], order[j]);
      EXPECT_NEAR(w[j], std::exp(double(logits[order[j]])) / den, 1e-6);
    }
  }
  std::vector<float> flat(16, 0.5f);
  std::vector<int> idx(3);
  std::vector<float> w(3);
  ref::route_topk(flat.data(), 16, 3, idx.data(), w.data());
  EXPECT_EQ(idx, (std::vector<int>{0, 1, 2}));
  EXPECT_NEAR(w[0], 1.0f / 3, 1e-7);
}

}  // namespace
}  // namespace tandem
