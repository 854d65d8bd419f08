// Speculative decoding on the GPU placements (gpu; hybrid with half of each layer's experts on the
// host): the MTP head on the device (GpuOptions::mtp) against its float reference on the fixtures
// that carry one (the hidden rows it gets from the main model too, by step_rows and by the prompt
// path), row by row, through the batch kernels and through the prompt kernels; greedy tokens with
// drafts are the tokens of the same runner without them (every step there goes through the same
// batched walk); a saved sequence drafts as its original; the demo model's trained head is accepted
// as on the host, its tokens those of the plain GPU runner.
#include <gtest/gtest.h>

#include <filesystem>

#include "placement/planner.h"
#include "runtime/engine/generate.h"
#include "runtime/format/npy.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "runtime/models/qwen3_5_moe/hybrid_dispatch.h"
#include "runtime/models/qwen3_5_moe/mtp.h"
#include "runtime/tokenizer/chat_template.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/candidate_runner.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// all on the GPU; hybrid with half of each layer's experts on the host; the same with the MTP head's
// experts on the host too (speculative.head_experts: cpu)
enum class Placement { Gpu, Hybrid, HeadOnHost };

RunnerOptions spec_options(const Qwen35Moe& model, Placement where, int draft, int batch = 1, const std::string& speculative_extra = "") {
  RunnerOptions o;
  o.device = where == Placement::Gpu ? Device::Gpu : Device::Hybrid;
  o.context = 256;
  o.threads = 4;
  o.batch = batch;
  o.draft = draft;
  if (where != Placement::Gpu) {
    const std::string yaml = "gpu:\n  memory: 4GiB\ncontext: 256\ngpu_experts_per_layer: " + std::to_string(model.config().num_experts / 2) +
                             "\nbatch: " + std::to_string(batch) + "\nspeculative:\n  draft: " + std::to_string(draft) +
                             (where == Placement::HeadOnHost ? "\n  head_experts: cpu\n" : "\n") + speculative_extra;
    const auto cfg = placement::parse_placement_config(yaml, "half");
    o.plan = std::make_shared<const placement::Plan>(placement::make_plan(model.config(), cfg));
  }
  return o;
}

std::vector<std::string> head_fixtures() {
  std::vector<std::string> out;
  for (const std::string& f : test::fixture_names())
    if (std::filesystem::exists(std::string(TANDEM_TEST_DATA) + "/" + f + "/mtp_logits.npy")) out.push_back(f);
  return out;
}

class GpuMtpHead : public ::testing::TestWithParam<std::string> {};

// 2e-2 relative L2: the GPU's bf16 weights and activations against HF's float32 (the main model's
// logits are held to the same on the GPU). head_on_host: the head's experts on the host's kernels
// (GpuOptions::mtp_host_experts; the model's all on the GPU), its layer handing over as a hybrid one.
void head_matches_reference(const std::string& fixture, bool head_on_host) {
  constexpr double kTol = 2e-2;
  const test::Fixture fx = test::load_fixture(fixture);
  auto model = Qwen35Moe::load(fx.dir);
  ASSERT_NE(model->mtp(), nullptr);
  const int64_t H = model->config().hidden_size, V = fx.vocab, n = static_cast<int64_t>(fx.ids.size());
  const NpyArray want_h = read_npy_f32(fx.dir + "/mtp_hidden.npy"), want = read_npy_f32(fx.dir + "/mtp_logits.npy");
  GpuOptions g;
  g.max_context = 256;
  g.verify_tokens = 4;
  g.mtp = true;
  const std::vector<std::vector<uint8_t>> on_gpu(static_cast<size_t>(model->config().num_layers),
                                                 std::vector<uint8_t>(static_cast<size_t>(model->config().num_experts), 1));
  std::unique_ptr<HostExperts> host;
  if (head_on_host) {
    host = make_cpu_experts(*model, on_gpu, "bf16", 4, true);
    g.host_experts = host.get();
    g.expert_on_gpu = &on_gpu;
    g.mtp_host_experts = true;
  }
  auto gpu = Qwen35MoeGpu::create(*model, g);
  ASSERT_TRUE(gpu->mtp_active());
  const int64_t R = gpu->step_rows_max();
  ASSERT_GE(R, 4);

  // The main model's hidden rows: by step_rows in steps of R tokens, then by the prompt path at once.
  std::vector<float> h(static_cast<size_t>(n * H)), hp(h.size());
  for (int64_t t = 0; t < n; t += R) {
    const int64_t len = std::min(R, n - t);
    const Qwen35MoeGpu::RowFeed f{0, std::span(fx.ids).subspan(static_cast<size_t>(t), static_cast<size_t>(len)), false};
    gpu->step_rows(std::span(&f, 1), nullptr, h.data() + t * H);
  }
  gpu->reset_slot(0);
  std::vector<float> last(static_cast<size_t>(V));
  gpu->forward(fx.ids, last.data(), Qwen35Moe::LogitRows::Last, hp.data());
  for (int64_t t = 0; t < n; ++t) {
    EXPECT_LT(test::row_rel_l2(h.data() + t * H, want_h.data.data() + t * H, H), kTol) << "step_rows' hidden row " << t;
    EXPECT_LT(test::row_rel_l2(hp.data() + t * H, want_h.data.data() + t * H, H), kTol) << "the prompt path's hidden row " << t;
  }

  // The head from HF's hidden states, one row at a time: every position's logits and argmax.
  std::vector<float> row(static_cast<size_t>(V)), state(static_cast<size_t>(H));
  for (int64_t t = 0; t + 1 < n; ++t) {
    int32_t arg = -1;
    gpu->mtp_rows(0, t, std::span(fx.ids).subspan(static_cast<size_t>(t) + 1, 1), want_h.data.data() + t * H, row.data(), &arg, state.data());
    EXPECT_LT(test::row_rel_l2(row.data(), want.data.data() + t * V, V), kTol) << "MTP logits, position " << t;
    EXPECT_EQ(arg, argmax_lowest(row)) << "position " << t;
  }
  // R rows at once (the batch kernels) and all rows at once (longer than a step: the prompt kernels).
  for (const int64_t rows : {R, n - 1}) {
    ASSERT_LE(rows, n - 1);
    gpu->mtp_rows(0, 0, std::span(fx.ids).subspan(1, static_cast<size_t>(rows)), want_h.data.data(), row.data(), nullptr, nullptr);
    EXPECT_LT(test::row_rel_l2(row.data(), want.data.data() + (rows - 1) * V, V), kTol) << rows << " rows at once: the last";
  }
  if (head_on_host) {  // the chain in one graph cannot wait for the host: the caller goes call by call
    std::vector<int32_t> drafts(2);
    EXPECT_FALSE(gpu->mtp_chain(0, 0, std::span(fx.ids).subspan(1, 1), want_h.data.data(), drafts));
  }
}

TEST_P(GpuMtpHead, MatchesTheFloatReference) {
  TANDEM_REQUIRE_GPU();
  head_matches_reference(GetParam(), false);
}

TEST_P(GpuMtpHead, MatchesTheFloatReferenceWithItsExpertsOnTheHost) {
  TANDEM_REQUIRE_GPU();
  head_matches_reference(GetParam(), true);
}

// Greedy drafts as one graph (mtp_chain) are the head's call by call (mtp_rows with the argmax and
// the output state fed back), after one row and after a step's worth.
TEST_P(GpuMtpHead, TheChainInOneGraphDraftsAsCallByCall) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(fx.dir);
  const int64_t H = model->config().hidden_size;
  const NpyArray want_h = read_npy_f32(fx.dir + "/mtp_hidden.npy");
  GpuOptions g;
  g.max_context = 256;
  g.verify_tokens = 4;
  g.mtp = true;
  auto gpu = Qwen35MoeGpu::create(*model, g);
  for (const int64_t rows : {int64_t{1}, gpu->step_rows_max()}) {
    const std::span<const int32_t> ids = std::span(fx.ids).subspan(1, static_cast<size_t>(rows));
    std::vector<int32_t> chain(3), calls(3);
    ASSERT_TRUE(gpu->mtp_chain(0, 0, ids, want_h.data.data(), chain));
    std::vector<float> h(static_cast<size_t>(H)), h_next(h.size());
    gpu->mtp_rows(0, 0, ids, want_h.data.data(), nullptr, &calls[0], h.data());
    for (int64_t i = 1; i < 3; ++i) {
      gpu->mtp_rows(0, rows + i - 1, std::span(calls).subspan(static_cast<size_t>(i) - 1, 1), h.data(), nullptr, &calls[i], h_next.data());
      h.swap(h_next);
    }
    EXPECT_EQ(chain, calls) << rows << " rows first";
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuMtpHead, ::testing::ValuesIn(head_fixtures()), [](const auto& info) { return info.param; });

class GpuSpeculative : public ::testing::TestWithParam<Placement> {};

TEST_P(GpuSpeculative, GreedyTokensAreTheTokensWithoutDrafts) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : head_fixtures()) {
    const test::Fixture fx = test::load_fixture(name);
    auto model = Qwen35Moe::load(fx.dir);
    // the demo model's tokenizer (the tiny preset's) writes the replies' text: the fixtures' vocabularies are no larger
    const Tokenizer tok = Tokenizer::from_model_dir(std::string(TANDEM_TEST_DATA) + "/demo");
    for (int k : {1, 2, 3}) {
      auto r = make_runner(*model, spec_options(*model, GetParam(), k));
      ASSERT_EQ(r->max_draft(), k);
      for (const std::vector<int32_t>& prompt : {std::vector<int32_t>(fx.ids.begin(), fx.ids.begin() + 3), fx.ids}) {
        GenerateRequest q;
        q.prompt = prompt;
        q.max_new_tokens = 20;
        q.sampling.temperature = 0;
        const GenerateResult want = generate(*r, fx.vocab, tok, q);
        q.draft = k;
        const GenerateResult got = generate(*r, fx.vocab, tok, q);
        EXPECT_EQ(got.tokens, want.tokens) << name << ", draft " << k << ", prompt of " << prompt.size();
        EXPECT_GT(got.drafts.verify_steps, 0) << name;
      }
    }
  }
}

// Verification from each row's candidates picked on the device (step_top) against the same steps with
// every row's logits on the host: the same tokens for greedy and seeded sampled requests with
// penalties (a verification row's penalties count the drafts before it), each alone and in a batch
// (where a sequence drafts only once it is alone in flight: here the longest).
TEST_P(GpuSpeculative, DeviceCandidatesVerifyAsHostRows) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("gptq_sym_v1");
  auto model = Qwen35Moe::load(fx.dir);
  const Tokenizer tok = Tokenizer::from_model_dir(std::string(TANDEM_TEST_DATA) + "/demo");
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 4; ++i) {
    GenerateRequest q;
    q.prompt.assign(fx.ids.begin(), fx.ids.begin() + 3 + i);
    q.max_new_tokens = 12 + 4 * i;
    q.draft = 1 + i % 3;
    q.sampling.temperature = i % 2 ? 0.8f : 0.0f;
    q.sampling.top_k = 5;
    q.sampling.presence_penalty = 1.5f;
    q.sampling.repetition_penalty = 1.1f;
    q.sampling.seeded = true;
    q.sampling.seed = 11 + static_cast<uint64_t>(i);
    reqs.push_back(q);
  }
  auto device = make_runner(*model, spec_options(*model, GetParam(), 3, 4));
  test::RowsOnlyRunner host(make_runner(*model, spec_options(*model, GetParam(), 3, 4)));
  for (size_t i = 0; i < reqs.size(); ++i) {
    const GenerateResult a = generate(*device, fx.vocab, tok, reqs[i]), b = generate(host, fx.vocab, tok, reqs[i]);
    EXPECT_EQ(a.tokens, b.tokens) << "request " << i << " alone";
    EXPECT_GT(a.drafts.verify_steps, 0) << "request " << i << " alone";
  }
  const auto a = generate_batch(*device, fx.vocab, tok, reqs), b = generate_batch(host, fx.vocab, tok, reqs);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(a[i].tokens, b[i].tokens) << "request " << i << " in the batch";
  EXPECT_GT(a.back().drafts.verify_steps, 0);
}

// A saved sequence takes its head's cache (in the slot's copy) and host side along.
TEST_P(GpuSpeculative, ASavedSequenceDraftsAsItsOriginal) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("gptq_sym_v1");
  auto model = Qwen35Moe::load(fx.dir);
  auto r = make_runner(*model, spec_options(*model, GetParam(), 3, 2));
  test::saved_sequence_drafts_alike(*r, fx.ids, fx.vocab);
}

// The demo model (models/demo): the tokens of the plain GPU runner (its one-token graph and prompt
// path), and its trained head accepted as on the host (test_speculative.cpp: DemoModel).
TEST_P(GpuSpeculative, TheDemoModelsDraftsAreAccepted) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_TEST_DATA) + "/demo";
  auto model = Qwen35Moe::load(dir);
  const test::DemoDrafting d = test::demo_drafting(*model, dir, [&](int draft) { return spec_options(*model, GetParam(), draft); });
  const GenerateResult& got = d.drafted;
  EXPECT_EQ(got.tokens, d.plain.tokens);
  const std::vector<double> acc = got.drafts.acceptance();
  ASSERT_EQ(acc.size(), 2u);
  EXPECT_GT(acc[0], 0.5) << got.drafts.summary();
  EXPECT_GT(got.drafts.tokens_per_step(), 1.6) << got.drafts.summary();
}

// speculative.lm_head: int8: the drafts read their own int8 copy of the lm_head (the model's logits keep
// the bf16 one): the tokens are the plain runner's, and the trained head is accepted about as often
// (its argmax through 8-bit rows; within 0.1 a position of the bf16 head's acceptance).
TEST(GpuSpeculative, DraftsThroughAnInt8LmHeadCopy) {
  TANDEM_REQUIRE_GPU();
  const std::string dir = std::string(TANDEM_TEST_DATA) + "/demo";
  auto model = Qwen35Moe::load(dir);
  const test::DemoDrafting bf16 = test::demo_drafting(*model, dir, [&](int draft) { return spec_options(*model, Placement::Hybrid, draft); });
  const test::DemoDrafting int8 = test::demo_drafting(*model, dir, [&](int draft) {
    RunnerOptions o = spec_options(*model, Placement::Hybrid, draft, 1, "  lm_head: int8\n");
    EXPECT_EQ(o.plan->draft_lm_head, draft > 0 ? RowFormat::Int8 : RowFormat::Bf16);
    return o;
  });
  EXPECT_EQ(int8.drafted.tokens, bf16.plain.tokens);
  const std::vector<double> a = int8.drafted.drafts.acceptance(), b = bf16.drafted.drafts.acceptance();
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 0.1) << int8.drafted.drafts.summary() << " | " << bf16.drafted.drafts.summary();
}

TEST(GpuSpeculative, RefusesWhatItCannotDo) {
  TANDEM_REQUIRE_GPU();
  auto no_head = Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/bf16_fused");
  test::expect_error([&] { make_runner(*no_head, spec_options(*no_head, Placement::Gpu, 2)); }, {"--draft 2", "no MTP head"});
  auto model = Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/gptq_sym_v1");
  test::expect_error([&] { make_runner(*model, spec_options(*model, Placement::Gpu, 8)); }, {"--draft 8", "at most 7 drafts"});
  GpuOptions g;
  g.mtp = true;
  g.verify_tokens = 1;
  test::expect_error([&] { Qwen35MoeGpu::create(*model, g); }, {"verify_tokens >= 2"});
  g.verify_tokens = 4;
  g.mtp_host_experts = true;  // without a host side
  test::expect_error([&] { Qwen35MoeGpu::create(*model, g); }, {"MTP head's experts in host memory", "hybrid placement"});
}

INSTANTIATE_TEST_SUITE_P(Placements, GpuSpeculative, ::testing::Values(Placement::Gpu, Placement::Hybrid, Placement::HeadOnHost), [](const auto& info) {
  return info.param == Placement::Gpu ? "gpu" : info.param == Placement::Hybrid ? "hybrid" : "hybrid_head_on_host";
});

}  // namespace
}  // namespace tandem
