// --device hybrid against HF transformers on every fixture, for several placements (every routed
// expert on the CPU, half per layer, all on the GPU, embeddings in host RAM): within the GPU path's
// 2e-2 relative L2 per position with argmax agreement at decisive positions. And the planner's VRAM
// accounting equals what the GPU model allocates, component by component.
#include <algorithm>
#include <cmath>

#include "gpu_core/device.cuh"
#include "gpu_core/int4_layout.h"
#include "runtime/engine/session.h"
#include "placement/planner.h"
#include "core/error.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "runtime/format/npy.h"
#include "runtime/engine/runner.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct Placement {
  const char* name;
  const char* yaml;
};

const Placement kPlacements[] = {
    {"all_cpu", "cpu_experts: all\n"},
    {"half", "gpu_experts_per_layer: HALF\n"},
    {"all_gpu", "experts: {select: all}\n"},
    {"cpu_embed_quarter", "gpu_experts_per_layer: QUARTER\nrules:\n  - {match: embed_tokens, place: cpu}\n"},
};

std::string with_counts(std::string y, int experts) {
  for (auto [key, v] : {std::pair{"HALF", experts / 2}, std::pair{"QUARTER", experts / 4}})
    if (auto p = y.find(key); p != std::string::npos) y.replace(p, std::string(key).size(), std::to_string(v));
  return "gpu:\n  memory: 4GiB\ncontext: 256\n" + y;
}

bool int4_experts(const Qwen35Moe& model) { return model.layers()[0].moe.gate[0].kind == LinearWeight::Kind::Gptq; }

placement::Plan plan_for(const Qwen35Moe& model, const Placement& pl) {
  const auto cfg = placement::parse_placement_config(with_counts(pl.yaml, model.config().num_experts), pl.name);
  return placement::make_plan(model.config(), cfg);
}

RunnerOptions hybrid_options(const placement::Plan& plan) {
  RunnerOptions o;
  o.device = Device::Hybrid;
  o.context = plan.context;
  o.threads = 4;
  o.plan = std::make_shared<const placement::Plan>(plan);
  return o;
}

class Hybrid : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Hybrid, MatchesTransformers) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(std::get<0>(GetParam()));
  const Placement& pl = kPlacements[std::get<1>(GetParam())];
  auto model = Qwen35Moe::load(f.dir);
  const placement::Plan plan = plan_for(*model, pl);
  auto runner = make_runner(*model, hybrid_options(plan));
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  std::vector<float> got(n * V);
  runner->forward(std::span(f.ids.data(), f.prefill), got.data(), Qwen35Moe::LogitRows::All);
  for (int64_t i = f.prefill; i < n; ++i) runner->forward(std::span(f.ids.data() + i, 1), got.data() + i * V, Qwen35Moe::LogitRows::All);
  const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
  const LogitsComparison cmp = compare_logits(got.data(), ref.data.data(), n, V);
  for (int64_t t = 0; t < n; ++t) EXPECT_LT(cmp.rel_l2[t], 2e-2) << f.name << " " << pl.name << " position " << t;
  EXPECT_TRUE(cmp.argmax_misses.empty()) << f.name << " " << pl.name << ": argmax differs at " << cmp.argmax_misses.size();
  // The served share follows the placement: none on the GPU when all are on the CPU, all when all are on the GPU.
  const double share = runner->gpu_expert_share();
  if (plan.total_gpu_experts() == 0) {
    EXPECT_EQ(share, 0.0);
  } else if (!plan.any_cpu_experts()) {
    EXPECT_EQ(share, 1.0);
  } else {
    EXPECT_GT(share, 0.0);
    EXPECT_LT(share, 1.0);
  }
  std::printf("[ hybrid   ] %s %-18s GPU experts %5d, served on GPU %5.1f%%, max rel-L2 %.2e\n", f.name.c_str(), pl.name,
              plan.total_gpu_experts(), share * 100, *std::max_element(cmp.rel_l2.begin(), cmp.rel_l2.end()));
}

TEST_P(Hybrid, PlannerBytesEqualTheAllocation) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(std::get<0>(GetParam()));
  const Placement& pl = kPlacements[std::get<1>(GetParam())];
  auto model = Qwen35Moe::load(f.dir);
  for (auto [chunk, deferral] : {std::pair{256, 0}, std::pair{0, 0}, std::pair{256, 1}, std::pair{0, 2}}) {
    auto cfg = placement::parse_placement_config(with_counts(pl.yaml, model->config().num_experts), pl.name);
    cfg.prefill_chunk = chunk;
    cfg.deferral = deferral;
    const placement::Plan plan = placement::make_plan(model->config(), cfg);
    struct NoHost : HostExperts {
      void run(int, const float*, int64_t, const int32_t*, const float*, int, float*) override {}
    } none;
    GpuOptions g;
    g.budget_bytes = plan.budget_bytes - plan.vram.reserve;
    g.max_context = plan.context;
    g.expert_on_gpu = &plan.expert_on_gpu;
    g.host_experts = &none;
    g.embed_on_gpu = plan.embed_on_gpu;
    g.prefill_chunk = plan.prefill_chunk;
    g.prefill_chunk_max = 0;  // the plan's chunk, as the runner asks
    g.defer_experts = plan.deferral;
    auto gpu = Qwen35MoeGpu::create(*model, g);
    EXPECT_EQ(gpu->batched_prefill_active(), chunk > 0) << pl.name;  // with the embedding in host RAM too
    const GpuMemoryPlan& m = gpu->memory();
    EXPECT_EQ(m.dense_weights, plan.vram.dense_weights) << pl.name << " chunk " << chunk << " deferral " << deferral;
    EXPECT_EQ(m.expert_weights, plan.vram.expert_weights) << pl.name << " chunk " << chunk << " deferral " << deferral;
    EXPECT_EQ(m.kv_cache, plan.vram.kv_cache) << pl.name << " chunk " << chunk << " deferral " << deferral;
    EXPECT_EQ(m.deltanet_state, plan.vram.deltanet_state) << pl.name << " chunk " << chunk << " deferral " << deferral;
    // Streamed prefill's buffers come only with a host that can stream (the runner's, below).
    const int64_t gs = model->layers()[0].moe.gate[0].kind == LinearWeight::Kind::Gptq ? model->layers()[0].moe.gate[0].gptq.group_size : 0;
    const uint64_t stream = plan.stream_experts ? gpu::stream_buffer_bytes(model->config().hidden_size, model->config().moe_intermediate_size, gs,
                                                                           static_cast<int>(model->config().num_experts),
                                                                           static_cast<int>(model->config().num_layers), plan.stream_experts,
                                                                           plan.stream_pass).total()
                                                : 0;
    EXPECT_EQ(m.workspace + stream, plan.vram.workspace) << pl.name << " chunk " << chunk << " deferral " << deferral;
    if (chunk > 0 && deferral == 0) {  // with the runner's host experts, the streamed prefill's buffers too
      auto runner = make_runner(*model, hybrid_options(plan));
      EXPECT_EQ(runner->peak_device_bytes(), plan.vram.allocated()) << pl.name << ": " << runner->describe();
      if (plan.stream_experts) {
        EXPECT_NE(runner->describe().find("streamed to the GPU"), std::string::npos) << runner->describe();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Hybrid,
                         ::testing::Combine(::testing::ValuesIn(test::fixture_names()), ::testing::Range(0, 4)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + kPlacements[std::get<1>(info.param)].name;
                         });

// Hybrid with batched prefill (half the experts on the CPU, the plan's chunk): the CPU experts of a
// whole chunk run in one call; logits as the token-by-token hybrid path.
TEST(HybridBatched, PrefillEqualsTokenByToken) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    const placement::Plan plan = plan_for(*model, kPlacements[1]);
    RunnerOptions o = hybrid_options(plan);
    auto batched = make_runner(*model, o);
    auto token_by_token = std::make_shared<placement::Plan>(*o.plan);
    token_by_token->prefill_chunk = 0;
    o.plan = token_by_token;
    auto plain = make_runner(*model, o);
    ASSERT_NE(plain->describe().find("prefill token by token"), std::string::npos) << plain->describe();
    ASSERT_NE(batched->describe().find("prefill in chunks of"), std::string::npos) << batched->describe();
    const int64_t V = f.vocab;
    // Int experts give the CPU side the same arithmetic for a chunk as for one token (cuBLAS's split-bf16
    // rounding apart, ~1e-5), but a chunk runs the GPU's experts and attention on tensor cores (fp16
    // weights; bf16 queries and softmax weights): ~1e-3 at the logits, the 5e-3 of
    // GpuModel.BatchedPrefillEqualsTokenByToken. bf16 experts of a chunk take AMX-BF16 where the CPU has
    // it, which rounds activations to bf16 (2^-9 per product, qmatmul.h), a few 1e-3 more.
    const double same_tol = plan.cpu_expert_format == "bf16" ? 1e-2 : 5e-3;
    const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
    std::vector<float> a(V), b(V);
    plain->forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);
    batched->forward(std::span(f.ids.data(), f.prefill), b.data(), Qwen35Moe::LogitRows::Last);
    EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], same_tol) << name;
    EXPECT_LT(compare_logits(b.data(), ref.data.data() + (f.prefill - 1) * V, 1, V).rel_l2[0], 2e-2) << name << " vs HF";
    plain->forward(std::span(f.ids.data() + f.prefill, 1), a.data(), Qwen35Moe::LogitRows::Last);
    batched->forward(std::span(f.ids.data() + f.prefill, 1), b.data(), Qwen35Moe::LogitRows::Last);
    EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], same_tol) << name << " (first decode step)";
    EXPECT_LT(compare_logits(b.data(), ref.data.data() + f.prefill * V, 1, V).rel_l2[0], 2e-2) << name << " (first decode step) vs HF";
  }
}

// Streamed prefill (prefill.strategy: gpu_stream): each layer's host experts cross to the GPU in the
// tile layout, are converted there and run with the GPU's own; the host computes none. Last-token
// logits as the same placement with the host experts computed on the host (GPU int4 kernels vs the
// CPU's: within the GPU path's tolerance of each other and of HF), then a decode step on the state
// it left. Chunks of 5 (the decode-kernel MoE) and of 10 (grouped, tensor cores) in passes of 10, so
// a layer sees several chunks and a prompt several passes; with the embedding table in the GPU or in
// host RAM (rows gathered on the host). Dense-expert fixtures: gpu_stream is refused.
TEST(HybridStreamed, PrefillEqualsHostExpertPrefill) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    const bool int4 = int4_experts(*model);
    const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
    const int64_t V = f.vocab;
    for (int pi : {0, 1, 3}) {  // all on the CPU, half, a quarter with the embedding table in host RAM
      for (int chunk : {5, 10}) {
        const std::string base = with_counts(kPlacements[pi].yaml, model->config().num_experts) +
                                 str_cat("prefill:\n  chunk: ", chunk, "\n  stream_pass: 10\n  strategy: ");
        const std::string what = str_cat(name, " ", kPlacements[pi].name, " chunk ", chunk);
        if (!int4) {
          test::expect_error([&] { placement::make_plan(model->config(), placement::parse_placement_config(base + "gpu_stream\n", "s.yaml")); },
                             {"gpu_stream cannot be honoured", "GPTQ int4"});
          continue;
        }
        const placement::Plan hp = placement::make_plan(model->config(), placement::parse_placement_config(base + "cpu\n", "h.yaml"));
        const placement::Plan sp = placement::make_plan(model->config(), placement::parse_placement_config(base + "gpu_stream\n", "s.yaml"));
        ASSERT_GT(sp.stream_experts, 0) << what;
        ASSERT_EQ(sp.predicted.prefill_gpu_min_tokens, 1) << what;
        auto host = make_runner(*model, hybrid_options(hp));
        auto streamed = make_runner(*model, hybrid_options(sp));
        ASSERT_NE(streamed->describe().find("streamed to the GPU"), std::string::npos) << streamed->describe();
        std::vector<float> a(V), b(V);
        host->forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);
        streamed->forward(std::span(f.ids.data(), f.prefill), b.data(), Qwen35Moe::LogitRows::Last);
        // Every layer with CPU experts crossed once per pass (ceil(prefill / 10) passes); none on the host path.
        int with_cpu = 0;
        for (int c : sp.experts_on_gpu) with_cpu += c < model->config().num_experts;
        EXPECT_EQ(streamed->streamed_layers(), static_cast<uint64_t>(with_cpu * ((f.prefill + 9) / 10))) << what;
        EXPECT_EQ(host->streamed_layers(), 0u) << what;
        EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], 1e-2) << what;
        EXPECT_LT(compare_logits(b.data(), ref.data.data() + (f.prefill - 1) * V, 1, V).rel_l2[0], 2e-2) << what << " vs HF";
        host->forward(std::span(f.ids.data() + f.prefill, 1), a.data(), Qwen35Moe::LogitRows::Last);
        streamed->forward(std::span(f.ids.data() + f.prefill, 1), b.data(), Qwen35Moe::LogitRows::Last);
        EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], 1e-2) << what << " (first decode step)";
        EXPECT_LT(compare_logits(b.data(), ref.data.data() + f.prefill * V, 1, V).rel_l2[0], 2e-2) << what << " (first decode step) vs HF";
      }
    }
  }
}

// Expert deferral in the dispatcher (experts.deferral = 1, half the experts on the CPU): the host-
// resident one among each token's lowest-weight experts joins a layer later, on the batched prefill
// path and token by token, exactly as the model definition with deferrable = the CPU side says
// (within the hybrid's usual 2e-2 of the fp32 reference); and it does change the output, which the
// reference without deferral shows.
TEST(HybridDeferral, MatchesTheDefinitionWithTheSameRule) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    const placement::Plan plan = plan_for(*model, kPlacements[1]);
    RunnerOptions o = hybrid_options(plan);
    auto hp = std::make_shared<placement::Plan>(*o.plan);
    hp->deferral = 1;
    o.plan = hp;
    std::vector<std::vector<uint8_t>> cpu_side = plan.expert_on_gpu;
    for (auto& layer : cpu_side)
      for (auto& e : layer) e = !e;
    const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
    auto reference = [&](int defer) {
      Qwen35State st = model->new_state();
      st.defer_experts = defer;
      st.deferrable = &cpu_side;
      std::vector<float> out(n * V);
      model->forward(st, std::span(f.ids.data(), f.prefill), out.data());
      for (int64_t i = f.prefill; i < n; ++i) model->forward(st, std::span(f.ids.data() + i, 1), out.data() + i * V);
      return out;
    };
    const std::vector<float> want = reference(1), exact = reference(0);
    for (bool batched : {true, false}) {
      auto runner = make_runner(*model, o);
      std::vector<float> got(n * V);
      if (batched) runner->forward(std::span(f.ids.data(), f.prefill), got.data() + (f.prefill - 1) * V, Qwen35Moe::LogitRows::Last);
      else runner->forward(std::span(f.ids.data(), f.prefill), got.data(), Qwen35Moe::LogitRows::All);
      for (int64_t i = f.prefill; i < n; ++i) runner->forward(std::span(f.ids.data() + i, 1), got.data() + i * V, Qwen35Moe::LogitRows::Last);
      const int64_t first = batched ? f.prefill - 1 : 0;
      const LogitsComparison same = compare_logits(got.data() + first * V, want.data() + first * V, n - first, V);
      const LogitsComparison moved = compare_logits(got.data() + first * V, exact.data() + first * V, n - first, V);
      double most = 0, closest = 0;
      for (int64_t t = 0; t < n - first; ++t) {
        EXPECT_LT(same.rel_l2[t], 2e-2) << name << (batched ? " batched" : " token by token") << " position " << first + t;
        most = std::max(most, moved.rel_l2[t]);
        closest = std::max(closest, same.rel_l2[t]);
      }
      // Deferral moves the logits well beyond the hybrid's own rounding: the run follows the deferred
      // definition, not the exact one (bf16_text_only moves least, 4.6e-2 against ~1e-3).
      EXPECT_GT(most, std::max(1e-2, 4 * closest)) << name << ": deferral changed nothing (moved " << most << ", matched within " << closest << ")";
    }
  }
}

// The prompt, then every decode step, twice (reset() between): the same logits bit for bit.
void expect_same_steps(Runner& eager, Runner& graphed, const test::Fixture& f, const std::string& label) {
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> a(V), b(V);
    eager.forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);
    graphed.forward(std::span(f.ids.data(), f.prefill), b.data(), Qwen35Moe::LogitRows::Last);
    ASSERT_EQ(a, b) << label << " prompt";
    for (int64_t i = f.prefill; i < n; ++i) {
      eager.forward(std::span(f.ids.data() + i, 1), a.data(), Qwen35Moe::LogitRows::Last);
      graphed.forward(std::span(f.ids.data() + i, 1), b.data(), Qwen35Moe::LogitRows::Last);
      ASSERT_EQ(a, b) << label << " round " << round << " position " << i;
    }
    eager.reset();
    graphed.reset();
  }
}

// The hybrid decode step as one CUDA graph with the host handoffs inside it (mapped-memory flags; the
// router's launch posts its result, the next norm's launch waits for the host's sum, the next layer's
// input projection fetched into L2 while the host works) replays exactly the eager step (--eager), for
// placements with host experts in every layer and in some, across prompts, decode steps and reset().
TEST(HybridGraph, OneGraphStepEqualsEagerStep) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    for (const Placement& pl : {kPlacements[0], kPlacements[1]}) {
      RunnerOptions o = hybrid_options(plan_for(*model, pl));
      auto graphed = make_runner(*model, o);
      o.eager = true;
      auto eager = make_runner(*model, o);
      ASSERT_NE(eager->describe().find("launched eagerly"), std::string::npos) << eager->describe();
      ASSERT_NE(graphed->describe().find("one CUDA graph each"), std::string::npos) << graphed->describe();
      ASSERT_NE(graphed->describe().find("folded into the router's and the next norm's launches"), std::string::npos) << graphed->describe();
      ASSERT_NE(graphed->describe().find("fetched into L2 during each host layer"), std::string::npos) << graphed->describe();
      ASSERT_EQ(graphed->describe().find("programmatic dependent launch") != std::string::npos, gpu::gpu_device_caps().cc_major >= 9)
          << graphed->describe();
      expect_same_steps(*eager, *graphed, f, name + " " + pl.name);
    }
  }
}

// GpuOptions::link_experts (experts.link: N): the GPU computes the first N of each token's host experts
// itself, reading their weights in place from the host's page-locked memory over PCIe. On the int4
// fixtures, host experts in every layer and in half: every decode position within the hybrid's 2e-2
// of HF and 1e-2 of the same placement without the link; with every expert on the host the host
// computes exactly k - N of each token's k (none at N >= k); the eager step and the one graph agree
// bit for bit. Dense fixtures say why the link is off.
TEST(HybridLink, MatchesTransformersAndTheHostPath) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
    const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
    const int k = model->config().num_experts_per_tok, layers = static_cast<int>(model->config().num_layers);
    for (const Placement& pl : {kPlacements[0], kPlacements[1]}) {
      RunnerOptions o = hybrid_options(plan_for(*model, pl));
      auto plain = make_runner(*model, o);
      for (const int N : {1, 8}) {
        const std::string what = str_cat(name, " ", pl.name, " link ", N);
        auto hp = std::make_shared<placement::Plan>(*o.plan);
        hp->link_in_place = N;
        RunnerOptions lo = o;
        lo.plan = hp;
        auto linked = make_runner(*model, lo);
        lo.eager = true;
        auto eager = make_runner(*model, lo);
        if (!int4_experts(*model)) {
          EXPECT_NE(linked->describe().find("no link experts: the link takes GPTQ int4 experts"), std::string::npos) << linked->describe();
          continue;
        }
        ASSERT_NE(linked->describe().find("over PCIe"), std::string::npos) << linked->describe();
        ASSERT_NE(linked->describe().find("one CUDA graph each"), std::string::npos) << linked->describe();
        std::vector<float> a(V), b(V);
        plain->forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);
        linked->forward(std::span(f.ids.data(), f.prefill), b.data(), Qwen35Moe::LogitRows::Last);
        const uint64_t plain0 = plain->host_split().host_activations, linked0 = linked->host_split().host_activations;
        for (int64_t i = f.prefill; i < n; ++i) {
          plain->forward(std::span(f.ids.data() + i, 1), a.data(), Qwen35Moe::LogitRows::Last);
          linked->forward(std::span(f.ids.data() + i, 1), b.data(), Qwen35Moe::LogitRows::Last);
          EXPECT_LT(compare_logits(b.data(), ref.data.data() + i * V, 1, V).rel_l2[0], 2e-2) << what << " position " << i << " vs HF";
          EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], 1e-2) << what << " position " << i << " vs no link";
        }
        const uint64_t steps = static_cast<uint64_t>(n - f.prefill), on_host = plain->host_split().host_activations - plain0,
                       linked_host = linked->host_split().host_activations - linked0;
        if (std::string(pl.name) == "all_cpu") {
          EXPECT_EQ(on_host, steps * layers * k) << what;
          EXPECT_EQ(linked_host, steps * layers * std::max(0, k - N)) << what;
        } else {
          EXPECT_LT(linked_host, on_host) << what;
        }
        plain->reset();
        linked->reset();
        expect_same_steps(*eager, *linked, f, what + " eager vs one graph");
      }
    }
  }
}

// Expert deferral inside the one graph (experts.deferral = 1 and 2): the host runs a layer's deferred
// experts right after releasing its other experts, into a row of mapped memory by layer parity, and the
// graph adds it at the end of the next layer after a wait on hflags[3]: exactly the eager deferral step
// (which runs them while it enqueues the next layer), for host experts in every layer and in half.
TEST(HybridGraph, OneGraphDeferralEqualsEagerDeferral) {
  TANDEM_REQUIRE_GPU();
  for (const std::string& name : test::fixture_names()) {
    const auto f = test::load_fixture(name);
    auto model = Qwen35Moe::load(f.dir);
    for (const Placement& pl : {kPlacements[0], kPlacements[1]})
      for (int deferral : {1, 2}) {
        RunnerOptions o = hybrid_options(plan_for(*model, pl));
        auto hp = std::make_shared<placement::Plan>(*o.plan);
        hp->deferral = deferral;
        o.plan = hp;
        auto graphed = make_runner(*model, o);
        o.eager = true;
        auto eager = make_runner(*model, o);
        ASSERT_NE(eager->describe().find("launched eagerly"), std::string::npos) << eager->describe();
        ASSERT_NE(graphed->describe().find("one CUDA graph each"), std::string::npos) << graphed->describe();
        expect_same_steps(*eager, *graphed, f, str_cat(name, " ", pl.name, " deferral ", deferral));
      }
  }
}

}  // namespace
}  // namespace tandem
