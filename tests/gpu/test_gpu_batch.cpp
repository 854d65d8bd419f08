// The batched engine on the GPU placements (gpu, hybrid with half the experts on the host) and every
// HF fixture: batch_cases.h's contract within 5e-3 relative L2 against each sequence alone (alone its
// prompt runs the prefill path and its decode the one-token graph; in a batch both go through the
// batched walk with the decode kernels: the tolerance of prefill against decode steps), and bit for
// bit between batches that share a sequence (the same kernels on its rows whatever the others are).
// Sampling on the device in a batch draws what the host draws from the same rows.
#include <gtest/gtest.h>

#include "placement/planner.h"
#include "runtime/engine/generate.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/candidate_runner.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

constexpr double kTol = 5e-3;

// device "gpu" or "hybrid" (half of each layer's experts on the host).
RunnerOptions options(const Qwen35Moe& model, bool hybrid, int batch, int64_t verify) {
  RunnerOptions o;
  o.device = hybrid ? Device::Hybrid : Device::Gpu;
  o.context = 256;
  o.threads = 4;
  o.batch = batch;
  o.verify_tokens = verify;
  if (hybrid) {
    const std::string yaml = "gpu:\n  memory: 4GiB\ncontext: 256\ngpu_experts_per_layer: " + std::to_string(model.config().num_experts / 2) +
                             "\nbatch: " + std::to_string(batch) + "\n";
    const auto cfg = placement::parse_placement_config(yaml, "half");
    o.plan = std::make_shared<const placement::Plan>(placement::make_plan(model.config(), cfg));
  }
  return o;
}

test::RunnerFactory factory(const Qwen35Moe& model, bool hybrid) {
  return [&model, hybrid](int batch, int64_t verify) { return make_runner(model, options(model, hybrid, batch, verify)); };
}

class GpuBatch : public ::testing::TestWithParam<std::tuple<std::string, bool>> {
 protected:
  void SetUp() override {
    if (!test::have_gpu()) GTEST_SKIP() << "no CUDA device on this machine";
    fixture_ = test::load_fixture(std::get<0>(GetParam()));
    model_ = Qwen35Moe::load(fixture_.dir);
  }
  test::Fixture fixture_;
  std::unique_ptr<Qwen35Moe> model_;
};

TEST_P(GpuBatch, EverySequenceGetsItsLogitsAlone) {
  test::batch_equals_alone(factory(*model_, std::get<1>(GetParam())), fixture_.ids, fixture_.vocab, kTol);
}

TEST_P(GpuBatch, ASavedSequenceRestoresExactly) {
  test::saved_sequence_restores(factory(*model_, std::get<1>(GetParam())), fixture_.ids, fixture_.vocab);
}

// Snapshots fill the VRAM tier, then the page-locked host pool, then take plain host memory (two
// 4 MiB pages each pool: one snapshot a page here); each one restores bit for bit, and a freed
// snapshot's pages go back to its pool.
TEST_P(GpuBatch, SavedSequencesRestoreFromEveryTier) {
  RunnerOptions o = options(*model_, std::get<1>(GetParam()), 2, 0);
  o.cache_vram = o.cache_host = 2 * SnapshotPool::kPage;
  auto r = make_runner(*model_, o);
  const int64_t V = fixture_.vocab;
  const std::vector<int32_t> prompt(fixture_.ids.begin(), fixture_.ids.begin() + 5), then(fixture_.ids.begin() + 5, fixture_.ids.begin() + 8);
  std::vector<float> scratch(prompt.size() * V), want(then.size() * V), got(then.size() * V);
  const Runner::Feed p{0, prompt, scratch.data(), Qwen35Moe::LogitRows::All, false};
  r->step(std::span(&p, 1));
  std::vector<std::shared_ptr<const SequenceSnapshot>> saved;
  for (int i = 0; i < 5; ++i) saved.push_back(r->save(0));
  const Runner::Feed a{0, then, want.data(), Qwen35Moe::LogitRows::All, false};
  r->step(std::span(&a, 1));
  const char* where[] = {"device memory", "device memory", "page-locked host memory", "page-locked host memory", "host memory"};
  for (int i = 0; i < 5; ++i) {
    EXPECT_STREQ(saved[i]->where, where[i]) << "snapshot " << i;
    r->restore(1, *saved[i]);
    const Runner::Feed b{1, then, got.data(), Qwen35Moe::LogitRows::All, false};
    r->step(std::span(&b, 1));
    EXPECT_EQ(got, want) << "restored from " << saved[i]->where;
  }
  saved[0].reset();
  EXPECT_STREQ(r->save(0)->where, "device memory") << "a freed snapshot's page is taken again";
  o.cache_vram = uint64_t(1) << 50;
  test::expect_error([&] { make_runner(*model_, o); }, {"VRAM tier", "does not fit beside the model", "--cache-vram"});
}

TEST_P(GpuBatch, KeptStatesRollBack) {
  test::keep_states_and_rollback(factory(*model_, std::get<1>(GetParam())), fixture_.ids, fixture_.vocab, kTol);
}

// Sequence A decoded beside B, then (fresh runner) beside C: A's rows bit for bit the same.
TEST_P(GpuBatch, ASequencesRowsDoNotDependOnItsNeighbours) {
  const auto make = factory(*model_, std::get<1>(GetParam()));
  const int64_t V = fixture_.vocab;
  const std::vector<int32_t>& ids = fixture_.ids;
  auto run = [&](int32_t other) {
    auto r = make(2, 0);
    std::vector<float> rows, a(V), b(V);
    for (size_t t = 0; t < 4; ++t) {
      const int32_t x = ids[t], y = (other + static_cast<int32_t>(t)) % static_cast<int32_t>(V);
      const Runner::Feed feeds[2] = {{0, std::span(&x, 1), a.data()}, {1, std::span(&y, 1), b.data()}};
      r->step(feeds);
      rows.insert(rows.end(), a.begin(), a.end());
    }
    return rows;
  };
  test::expect_rows(run(ids[1]), run(ids[2] + 7), V, 0, "sequence A beside B and beside C");
}

INSTANTIATE_TEST_SUITE_P(Tandem, GpuBatch, ::testing::Combine(::testing::ValuesIn(test::fixture_names()), ::testing::Bool()),
                         [](const auto& info) { return std::get<0>(info.param) + (std::get<1>(info.param) ? "_hybrid" : "_gpu"); });

// generate_batch on the GPU: the samplers' candidates picked on the device (step_top) against the
// same steps with every row copied to the host and sampled there: the same tokens, request by request.
TEST(GpuGenerateBatch, DeviceSamplingEqualsHostSampling) {
  TANDEM_REQUIRE_GPU();
  const test::TinyModel tiny;
  const std::vector<GenerateRequest> reqs = test::mixed_requests(tiny.tok, 5, 3);
  const auto make = factory(*tiny.model, false);
  auto device = make(4, 0);
  test::RowsOnlyRunner host(make(4, 0));
  const auto a = generate_batch(*device, tiny.vocab, tiny.tok, reqs), b = generate_batch(host, tiny.vocab, tiny.tok, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i;
}

}  // namespace
}  // namespace tandem
