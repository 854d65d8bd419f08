// Whole model against HF transformers: every committed fixture through the reference forward, prefill
// then single-token decode through the cache, within 1e-4 relative L2 error at every position.
#include <cmath>

#include "runtime/models/qwen3_5_moe.h"
#include "runtime/npy.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::vector<float> run_logits(const Qwen35Moe& m, const std::vector<int32_t>& ids, int64_t prefill) {
  const int64_t n = static_cast<int64_t>(ids.size()), V = m.config().vocab_size;
  std::vector<float> out(n * V);
  Qwen35State st = m.new_state();
  if (prefill > 0) m.forward(st, std::span(ids.data(), prefill), out.data());
  for (int64_t i = prefill; i < n; ++i) m.forward(st, std::span(ids.data() + i, 1), out.data() + i * V);
  return out;
}

double row_rel_l2(const float* a, const float* b, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    num += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    den += double(b[i]) * b[i];
  }
  return std::sqrt(num / den);
}

TEST(Fixtures, AllExpectedFixturesArePresent) {
  const auto names = test::fixture_names();
  for (const char* want : {"bf16_fused", "bf16_text_only", "gptq_sym_v1", "gptq_asym_actorder"})
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << "missing fixture " << want;
}

class HfReference : public ::testing::TestWithParam<std::string> {};

TEST_P(HfReference, RefDeviceMatchesTransformers) {
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  ASSERT_EQ(model->config().vocab_size, f.vocab);
  const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
  const int64_t n = static_cast<int64_t>(f.ids.size());
  ASSERT_EQ(ref.shape, (std::vector<int64_t>{n, f.vocab}));
  const auto got = run_logits(*model, f.ids, f.prefill);
  for (int64_t t = 0; t < n; ++t) {
    const double err = row_rel_l2(got.data() + t * f.vocab, ref.data.data() + t * f.vocab, f.vocab);
    EXPECT_LT(err, 1e-4) << f.name << " position " << t << (t < f.prefill ? " (prefill)" : " (decode)");
  }
}

// Prefill in one call and token-by-token decode are the same function of the ids.
TEST_P(HfReference, PrefillEqualsStepByStep) {
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  const int64_t n = std::min<int64_t>(static_cast<int64_t>(f.ids.size()), 12);
  std::vector<int32_t> ids(f.ids.begin(), f.ids.begin() + n);
  const auto all = run_logits(*model, ids, n), steps = run_logits(*model, ids, 0);
  for (int64_t t = 0; t < n; ++t)
    EXPECT_LT(row_rel_l2(steps.data() + t * f.vocab, all.data() + t * f.vocab, f.vocab), 1e-5) << "position " << t;
}

INSTANTIATE_TEST_SUITE_P(Tandem, HfReference, ::testing::ValuesIn(test::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
