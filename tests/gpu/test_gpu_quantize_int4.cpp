// Experts quantized to int4 on load (Qwen35Moe::quantize_experts_int4) on the GPU placements (gpu;
// hybrid with half of each layer's experts on the host): the trained demo model's logits against the
// exact reference over the same int4 weights, and its MTP head's int4 experts drafting on the device
// (greedy tokens those of the plain runner, drafts still accepted).
#include <gtest/gtest.h>

#include "placement/planner.h"
#include "runtime/engine/logits_compare.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

RunnerOptions int4_options(const Qwen35Moe& model, bool hybrid, int draft) {
  RunnerOptions o;
  o.device = hybrid ? Device::Hybrid : Device::Gpu;
  o.context = 256;
  o.threads = 4;
  o.draft = draft;
  if (hybrid) {
    const std::string yaml = "gpu:\n  memory: 4GiB\ncontext: 256\ngpu_experts_per_layer: " + std::to_string(model.config().num_experts / 2) +
                             "\nexperts: {gpu_format: int4}\nspeculative:\n  draft: " + std::to_string(draft) + "\n";
    o.plan = std::make_shared<const placement::Plan>(placement::make_plan(model.config(), placement::parse_placement_config(yaml, "half")));
    EXPECT_TRUE(o.plan->experts_int4_on_load);
  }
  return o;
}

class GpuInt4OnLoad : public ::testing::TestWithParam<bool> {};

// 2e-2 relative L2 and the same argmax at decisive positions: the GPU's tolerance against float32
// (its bf16 activations; the int4 weights are the same numbers on both sides).
TEST_P(GpuInt4OnLoad, TheDemoModelMatchesTheReferenceOverTheSameWeights) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("demo");
  test::TempDir cache;
  auto model = Qwen35Moe::load(fx.dir);
  ASSERT_NE(model->quantize_experts_int4(cache.str(), nullptr), "");
  const int64_t n = static_cast<int64_t>(fx.ids.size()), V = fx.vocab;
  auto logits = [&](const RunnerOptions& o) {
    auto r = make_runner(*model, o);
    std::vector<float> out(static_cast<size_t>(n * V));
    r->forward(fx.ids, out.data(), Qwen35Moe::LogitRows::All);
    return out;
  };
  RunnerOptions ref;
  ref.device = Device::Ref;
  const std::vector<float> want = logits(ref), got = logits(int4_options(*model, GetParam(), 0));
  const LogitsComparison cmp = compare_logits(got.data(), want.data(), n, V);
  for (int64_t t = 0; t < n; ++t) EXPECT_LT(cmp.rel_l2[t], 2e-2) << "position " << t;
  EXPECT_TRUE(cmp.argmax_misses.empty()) << cmp.argmax_misses.size() << " of " << cmp.decisive << " decisive positions";
}

TEST_P(GpuInt4OnLoad, TheHeadsInt4ExpertsDraftOnTheDevice) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_TEST_DATA) + "/demo";
  test::TempDir cache;
  auto model = Qwen35Moe::load(dir);
  ASSERT_NE(model->quantize_experts_int4(cache.str(), nullptr), "");
  ASSERT_EQ(model->mtp()->layer.moe.gate[0].kind, LinearWeight::Kind::Gptq);
  const test::DemoDrafting d = test::demo_drafting(*model, dir, [&](int draft) { return int4_options(*model, GetParam(), draft); });
  EXPECT_EQ(d.drafted.tokens, d.plain.tokens);
  EXPECT_GT(d.drafted.drafts.tokens_per_step(), 1.5) << d.drafted.drafts.summary();  // the host measures 2.03 with int4 experts
}

INSTANTIATE_TEST_SUITE_P(Placements, GpuInt4OnLoad, ::testing::Values(false, true),
                         [](const auto& info) { return std::string(info.param ? "hybrid" : "gpu"); });

}  // namespace
}  // namespace tandem
