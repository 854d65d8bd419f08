// Expert deferral (Qwen35State::defer_experts): off is the exact model; on, a token's lowest-weight
// routed experts join the residual one layer late, the same in one prefill call as token by token,
// and the logits move by an amount that grows with the number deferred.
#include <gtest/gtest.h>

#include <cmath>

#include "runtime/models/qwen3_5_moe/model.h"
#include "tests/unit/fixture_util.h"

namespace tandem {
namespace {

std::vector<float> run(const Qwen35Moe& m, const std::vector<int32_t>& ids, int defer, bool one_by_one,
                       const std::vector<std::vector<uint8_t>>* deferrable = nullptr) {
  Qwen35State st = m.new_state();
  st.defer_experts = defer;
  st.deferrable = deferrable;
  const int64_t V = m.config().vocab_size, n = static_cast<int64_t>(ids.size());
  std::vector<float> out(n * V);
  if (!one_by_one) {
    m.forward(st, ids, out.data());
  } else {
    for (int64_t i = 0; i < n; ++i) m.forward(st, std::span(ids.data() + i, 1), out.data() + i * V);
  }
  return out;
}

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / den);
}

TEST(ExpertDeferral, OffIsExactOnIsConsistentAndGrowsWithTheCount) {
  const auto f = test::load_fixture("gptq_sym_v1");
  auto model = Qwen35Moe::load(f.dir);
  const std::vector<int32_t> ids(f.ids.begin(), f.ids.begin() + 12);
  const auto base = run(*model, ids, 0, false);
  Qwen35State st = model->new_state();
  std::vector<float> plain(base.size());
  model->forward(st, ids, plain.data());
  EXPECT_EQ(base, plain);  // defer 0 is the model itself
  double prev = 0;
  for (int d = 1; d <= model->config().num_experts_per_tok; ++d) {
    const auto batched = run(*model, ids, d, false), stepwise = run(*model, ids, d, true);
    EXPECT_LT(rel_l2(stepwise, batched), 1e-5) << "defer " << d;  // per token, not per call
    const double moved = rel_l2(batched, base);
    EXPECT_GT(moved, prev) << "defer " << d;
    prev = moved;
  }
}

// The deferrable mask (the hybrid's CPU side): none deferrable is the exact model, all deferrable is
// plain deferral, and half of the experts lands strictly in between.
TEST(ExpertDeferral, OnlyDeferrableExpertsAreDeferred) {
  const auto f = test::load_fixture("gptq_sym_v1");
  auto model = Qwen35Moe::load(f.dir);
  const std::vector<int32_t> ids(f.ids.begin(), f.ids.begin() + 12);
  const int L = model->config().num_layers, E = model->config().num_experts;
  const std::vector<std::vector<uint8_t>> none(L, std::vector<uint8_t>(E, 0)), all(L, std::vector<uint8_t>(E, 1));
  std::vector<std::vector<uint8_t>> half(L, std::vector<uint8_t>(E, 0));
  for (auto& layer : half)
    for (int e = 0; e < E; e += 2) layer[e] = 1;
  const auto base = run(*model, ids, 0, false);
  EXPECT_EQ(run(*model, ids, 1, false, &none), base);
  EXPECT_EQ(run(*model, ids, 1, false, &all), run(*model, ids, 1, false));
  const auto some = run(*model, ids, 1, false, &half), every = run(*model, ids, 1, false);
  EXPECT_GT(rel_l2(some, base), 1e-3);
  EXPECT_GT(rel_l2(some, every), 1e-3);
  EXPECT_LT(rel_l2(run(*model, ids, 1, true, &half), some), 1e-5);  // still per token
}

}  // namespace
}  // namespace tandem
