// Placement YAML and planner: every shipped config plans the 35B model; errors name file, line and
// key; the planner never exceeds the budget, never gives fewer GPU experts for more budget, puts every
// expert on the GPU when all fit, and refuses budgets below the minimum with the minimum.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "core/row_format.h"
#include "gpu_core/attention_sizes.h"
#include "gpu_core/int4_layout.h"
#include "gpu_core/rows8_layout.h"
#include "placement/heat.h"
#include "runtime/engine/session.h"
#include "placement/placement_config.h"
#include "placement/gpu_layout.h"
#include "placement/planner.h"
#include "core/bytes.h"
#include "runtime/format/config.h"
#include "tests/unit/placement_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem::placement {
namespace {

const std::string kConfigs = std::string(TANDEM_SOURCE_DIR) + "/configs";
using namespace test_plans;

TEST(PlacementGlob, Matches) {
  EXPECT_TRUE(glob_match("layers.*.mlp.experts.*", "layers.3.mlp.experts.17"));
  EXPECT_TRUE(glob_match("layers.3?.mlp.experts.*", "layers.31.mlp.experts.0"));
  EXPECT_FALSE(glob_match("layers.3?.mlp.experts.*", "layers.3.mlp.experts.0"));
  EXPECT_TRUE(glob_match("lm_head", "lm_head"));
  EXPECT_FALSE(glob_match("lm_head", "lm_head2"));
  EXPECT_TRUE(glob_match("*", ""));
  EXPECT_FALSE(glob_match("layers.1.*", "layers.10.mlp.gate") && !glob_match("layers.1.*", "layers.1.mlp.gate"));
}

TEST(PlacementConfigs, EveryShippedConfigPlansThe35BModel) {
  const ModelConfig m = model35();
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(kConfigs)) {
    if (e.path().extension() != ".yaml") continue;
    ++n;
    SCOPED_TRACE(e.path().string());
    const PlacementConfig c = load_placement_config(e.path().string());
    const Plan p = make_plan(m, c);
    EXPECT_LE(p.vram.total(), p.budget_bytes);
    EXPECT_GT(p.predicted.decode_tok_s, 0);
    EXPECT_LE(p.predicted.decode_tok_s, p.predicted.bound_tok_s * 1.0001);
    if (c.cpu_experts_all) {
      EXPECT_EQ(p.total_gpu_experts(), 0);
    }
  }
  EXPECT_GE(n, 5);
}

TEST(PlacementConfigs, PresetsExpandIntoRules) {
  const PlacementConfig c = yaml("cpu_experts: all\nrules:\n  - match: \"layers.3?.mlp.experts.*\"\n    place: gpu\n");
  ASSERT_EQ(c.rules.size(), 2u);
  EXPECT_EQ(c.rules[1].match, "layers.*.mlp.experts.*");  // after the user's rule: first match wins
  const Plan p = make_plan(model35(), fixed_bw(c), {.gpu_mem = 24ull << 30});
  for (int l = 0; l < 40; ++l) EXPECT_EQ(p.experts_on_gpu[l], l >= 30 ? 256 : 0) << "layer " << l;
  const PlacementConfig u = yaml("gpu_experts_per_layer: 10\n");
  EXPECT_EQ(u.select, ExpertSelection::Uniform);
  const Plan q = make_plan(model35(), fixed_bw(u), {.gpu_mem = 24ull << 30});
  for (int l = 0; l < 40; ++l) EXPECT_EQ(q.experts_on_gpu[l], 10);
}

TEST(PlacementYamlErrors, NameFileLineAndKey) {
  test::expect_error([] { yaml("gpu:\n  memroy: 8GiB\n"); }, {"test.yaml:2", "unknown key 'gpu.memroy'", "did you mean 'memory'"});
  test::expect_error([] { yaml("context: 4096\ncontxt: 5\n"); }, {"test.yaml:2", "'contxt'", "did you mean 'context'"});
  test::expect_error([] { yaml("gpu:\n  memory: 8 parsecs\n"); }, {"test.yaml:2", "key 'gpu.memory'", "unknown unit"});
  test::expect_error([] { yaml("context: lots\n"); }, {"test.yaml:1", "key 'context'", "not an integer"});
  test::expect_error([] { yaml("context: 0\n"); }, {"test.yaml:1", "key 'context'", "outside"});
  test::expect_error([] { yaml("experts:\n  select: frequncy\n"); }, {"test.yaml:2", "experts.select", "did you mean 'frequency'"});
  test::expect_error([] { yaml("experts:\n  select: layers 9-3\n"); }, {"test.yaml:2", "empty"});
  test::expect_error([] { yaml("experts:\n  cpu_format: int3\n"); }, {"test.yaml:2", "experts.cpu_format", "int4"});
  test::expect_error([] { yaml("rules:\n  - place: cpu\n"); }, {"test.yaml:2", "rules[0]", "match"});
  // A key given twice is refused (a YAML reader keeps one and drops the other silently: an override
  // appended to a shipped config would do nothing), at every level, naming both lines.
  test::expect_error([] { yaml("dense:\n  format: bf16\ndense:\n  format: int8\n"); },
                     {"test.yaml:3", "key 'dense' appears twice", "first at line 1"});
  test::expect_error([] { yaml("gpu:\n  memory: 24GiB\n  memory: 8GiB\n"); }, {"test.yaml:3", "key 'gpu.memory' appears twice", "line 2"});
  test::expect_error([] { yaml("rules:\n  - match: lm_head\n    format: bf16\n    format: int8\n"); },
                     {"test.yaml:4", "'rules[0].format' appears twice", "line 3"});
  EXPECT_EQ(yaml("gpu:\n  memory: 24GiB\n  reserve: 1GiB\n").gpu_reserve, 1ull << 30);  // different keys: fine
  test::expect_error([] { yaml("rules:\n  - match: lm_head\n"); }, {"test.yaml:2", "needs 'place' or 'format'"});
  test::expect_error([] { yaml("rules:\n  - match: x\n    place: disk\n"); }, {"test.yaml:3", "rules[0].place", "gpu, cpu"});
  test::expect_error([] { yaml("rules: lm_head\n"); }, {"test.yaml:1", "expected a list"});
  test::expect_error([] { yaml("gpu: [1, 2\n"); }, {"test.yaml:", "not valid YAML"});
  test::expect_error([] { yaml("bandwidth:\n  cpu: fast\n"); }, {"test.yaml:2", "bandwidth.cpu", "not a bandwidth"});
  test::expect_error([] { yaml("gpu:\n  memory: 1GiB\n  reserve: 2GiB\n"); }, {"gpu.reserve", "below gpu.memory"});
  test::expect_error([] { yaml("cpu_experts: all\ngpu_experts_per_layer: 4\n"); }, {"test.yaml:2", "contradicts"});
  test::expect_error([] { load_placement_config("/nonexistent/x.yaml"); }, {"/nonexistent/x.yaml", "cannot open"});
  test::expect_error([] { yaml("prefill:\n  chunk: -1\n"); }, {"test.yaml:2", "key 'prefill.chunk'", "outside"});
  test::expect_error([] { yaml("gpu:\n  memory: 1e300GiB\n"); }, {"test.yaml:2", "gpu.memory", "too large"});  // found by fuzz_placement
  test::expect_error([] { yaml("prefill:\n  chunks: 64\n"); }, {"test.yaml:2", "'prefill.chunks'", "did you mean 'chunk'"});
  // online re-placement is gone: a config that still asks for it is told so, with the line
  test::expect_error([] { yaml("experts:\n  replace: {every: 64}\n"); }, {"test.yaml:2", "key 'experts.replace'", "was removed"});
  test::expect_error([] { yaml("server:\n  port: 70000\n"); }, {"test.yaml:2", "key 'server.port'", "outside"});
  test::expect_error([] { yaml("server:\n  max_queu: 3\n"); }, {"test.yaml:2", "'server.max_queu'", "did you mean 'max_queue'"});
}

// tandem serve's section: the defaults without it, each key read.
TEST(PlacementConfigs, ServerSection) {
  const ServerSection d = yaml("context: 4096\n").server;
  EXPECT_EQ(d.host, "127.0.0.1");
  EXPECT_EQ(d.port, 8080);
  const ServerSection s = yaml("server:\n  host: 0.0.0.0\n  port: 0\n  max_queue: 3\n  prefill_chunk: 0\n  timeout: 2.5\n  max_body: 1MiB\n").server;
  EXPECT_EQ(s.host, "0.0.0.0");
  EXPECT_EQ(s.port, 0);
  EXPECT_EQ(s.max_queue, 3);
  EXPECT_EQ(s.prefill_chunk, 0);
  EXPECT_DOUBLE_EQ(s.timeout_s, 2.5);
  EXPECT_EQ(s.max_body, uint64_t{1} << 20);
  EXPECT_EQ(d.cache_bytes, uint64_t{2} << 30);
  EXPECT_EQ(yaml("server:\n  cache: 0\n").server.cache_bytes, 0u);
  EXPECT_EQ(yaml("server:\n  cache: 8GiB\n").server.cache_bytes, uint64_t{8} << 30);
  EXPECT_EQ(d.cache_vram, 0u);
  EXPECT_EQ(yaml("server:\n  cache_vram: 4GiB\n").server.cache_vram, uint64_t{4} << 30);
}

// speculative: the MTP head's drafts a step.
TEST(PlacementConfigs, SpeculativeSection) {
  EXPECT_EQ(yaml("context: 4096\n").draft, 0);
  EXPECT_EQ(yaml("speculative:\n  draft: 3\n").draft, 3);
  EXPECT_EQ(yaml("speculative:\n  draft: auto\n").draft, kDraftAuto);
  test::expect_error([] { yaml("speculative:\n  draft: 17\n"); }, {"test.yaml:2", "key 'speculative.draft'", "outside"});
  test::expect_error([] { yaml("speculative:\n  drafts: 2\n"); }, {"test.yaml:2", "'speculative.drafts'", "did you mean 'draft'"});
  EXPECT_FALSE(yaml("speculative:\n  draft: 2\n").head_experts_cpu);
  EXPECT_TRUE(yaml("speculative:\n  draft: 2\n  head_experts: cpu\n").head_experts_cpu);
  test::expect_error([] { yaml("speculative:\n  head_experts: host\n"); }, {"test.yaml:2", "speculative.head_experts", "'host'"});
  EXPECT_EQ(yaml("speculative:\n  draft: 2\n").draft_lm_head_format, "");
  EXPECT_EQ(yaml("speculative:\n  draft: 2\n  lm_head: int8\n").draft_lm_head_format, "int8");
  EXPECT_EQ(yaml("speculative:\n  lm_head: fp8\n").draft_lm_head_format, "fp8");
  test::expect_error([] { yaml("speculative:\n  lm_head: int4\n"); }, {"test.yaml:2", "speculative.lm_head", "'int4'", "'bf16', 'int8' or 'fp8'"});
}

// prefill.strategy gpu_stream streams from the first prompt token, with the buffers counted; where it
// cannot be honoured (CPU experts not int4, no room for the buffers) the plan says why, never silently.
TEST(PlacementYamlErrors, GpuStreamPrefillNeedsInt4CpuExpertsAndRoom) {
  const Plan p = make_plan(model35(), fixed_bw(yaml("prefill:\n  strategy: gpu_stream\n")), {.gpu_mem = 12ull << 30});
  EXPECT_EQ(p.predicted.prefill_gpu_min_tokens, 1);
  EXPECT_GT(p.stream_experts, 0);
  EXPECT_NE(plan_table(p).find("CPU experts streamed over PCIe"), std::string::npos) << plan_table(p);
  test::expect_error([&] { make_plan(model35(), yaml("prefill:\n  strategy: gpu_stream\nexperts:\n  cpu_format: int8\n"), {.gpu_mem = 12ull << 30}); },
                     {"test.yaml", "gpu_stream cannot be honoured", "int4 CPU experts", "auto or cpu"});
  // A budget just above the minimum has no room for the buffers: auto says so in the plan, gpu_stream refuses.
  const uint64_t lo = p.min_budget_bytes + (64ull << 20);
  const Plan tight = make_plan(model35(), {}, {.gpu_mem = lo});
  EXPECT_EQ(tight.stream_experts, 0);
  EXPECT_NE(plan_table(tight).find("no room for its buffers"), std::string::npos) << plan_table(tight);
  test::expect_error([&] { make_plan(model35(), yaml("prefill:\n  strategy: gpu_stream\n"), {.gpu_mem = lo}); },
                     {"gpu_stream cannot be honoured", "no room", "strategy: cpu"});
}

TEST(PlacementYamlErrors, RulesTheModelCannotHonour) {
  const ModelConfig m = model35();
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nrules:\n  - match: layers.3.self_attn\n    place: cpu\n")); },
                     {"test.yaml:4", "rule (match 'layers.3.self_attn')", "stay on the GPU"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nrules:\n  - match: layers.*.mlp.expert.*\n    place: cpu\n")); },
                     {"test.yaml:4", "matches nothing"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nrules:\n  - match: norm\n    format: int8\n")); },
                     {"test.yaml:4", "'norm'", "kept as stored"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nrules:\n  - match: lm_head\n    format: int4\n")); },
                     {"test.yaml:4", "'lm_head'", "bf16 (as stored), int8 or fp8"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nexperts:\n  cpu_format: bf16\n")); },
                     {"GPTQ int4", "not bf16"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\nexperts:\n  select: layers 30-45\n")); },
                     {"layers 30-45", "0-39"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 12GiB\nexperts:\n  select: all\n")); },
                     {"needs", "budget is 12.00 GiB"});
  test::expect_error([&] { make_plan(m, yaml("gpu:\n  memory: 24GiB\ncontext: 9999999\n")); },
                     {"context 9999999", "max_position_embeddings"});
}

TEST(Planner, BelowTheMinimumSaysTheMinimum) {
  const ModelConfig m = model35();
  // (the minimum of a plan is for its prefill chunk: the smallest one auto picks is 256)
  const Plan ok = make_plan(m, yaml("prefill: {chunk: 256}"), {.gpu_mem = 24ull << 30});
  test::expect_error([&] { make_plan(m, {}, {.gpu_mem = ok.min_budget_bytes - 1}); },
                     {"below the minimum of " + format_gib(ok.min_budget_bytes), "dense weights", "KV cache"});
  const Plan at_min = make_plan(m, {}, {.gpu_mem = ok.min_budget_bytes});
  EXPECT_EQ(at_min.total_gpu_experts(), 0);
  EXPECT_LE(at_min.vram.total(), at_min.budget_bytes);
  test::expect_error([&] { make_plan(m, {}, {}); }, {"no GPU memory budget"});
}

TEST(Planner, NeverOverBudgetAndMonotoneInBudget) {
  const ModelConfig m = model35();
  const uint64_t lo = make_plan(m, {}, {.gpu_mem = 24ull << 30}).min_budget_bytes;
  for (const char* text : {"experts: {select: frequency}", "experts: {select: uniform}", "experts: {select: layers 10-19}",
                           "experts: {select: none}"}) {
    SCOPED_TRACE(text);
    std::vector<std::vector<uint8_t>> prev;
    int prev_total = -1;
    for (uint64_t b = lo; b <= (30ull << 30); b += (b < (8ull << 30) ? 97ull << 20 : 613ull << 20)) {
      const Plan p = make_plan(m, yaml(text), {.gpu_mem = b});
      ASSERT_LE(p.vram.total(), b);
      ASSERT_GE(p.total_gpu_experts(), prev_total) << "budget " << b;
      if (!prev.empty()) {
        for (int l = 0; l < 40; ++l)
          for (int e = 0; e < 256; ++e) ASSERT_GE(p.expert_on_gpu[l][e], prev[l][e]) << "budget " << b << " layer " << l;
      }
      prev = p.expert_on_gpu, prev_total = p.total_gpu_experts();
    }
  }
}

// experts.link (the GPU computes some of each token's CPU experts reading them over PCIe): the YAML
// forms and their errors; the plan counts the link's buffers (gpu::link_buffer_bytes for every layer)
// and never goes over budget with them; the cost model credits the link where host memory outruns its
// cores (the H200 machine's bandwidths) and not on a consumer PC's, and `auto` picks the best number.
TEST(Planner, LinkExperts) {
  const ModelConfig m = model35();
  EXPECT_EQ(yaml("experts:\n  link: 3\n").link_in_place, 3);
  EXPECT_EQ(yaml("experts:\n  link: {in_place: 2}\n").link_in_place, 2);
  EXPECT_EQ(yaml("experts:\n  link: off\n").link_in_place, 0);
  EXPECT_TRUE(yaml("experts:\n  link: auto\n").link_auto);
  test::expect_error([] { yaml("experts:\n  link: {inplace: 2}\n"); }, {"test.yaml:2", "experts.link.inplace", "did you mean 'in_place'"});
  test::expect_error([] { yaml("experts:\n  link: {in_place: 1, staged: 1}\n"); }, {"test.yaml:", "unknown key 'experts.link.staged'"});
  test::expect_error([] { yaml("experts:\n  link: lots\n"); }, {"test.yaml:2", "experts.link", "not an integer"});
  test::expect_error([&] { make_plan(m, yaml("cpu_experts: all\nexperts:\n  cpu_format: int8\n  link: 2\n"), {.gpu_mem = 8ull << 30}); },
                     {"test.yaml", "experts.link", "experts.cpu_format is int8: set it to int4"});
  test::expect_error([&] { make_plan(model35_bf16(), yaml("cpu_experts: all\nexperts:\n  link: 2\n"), {.gpu_mem = 80ull << 30}); },
                     {"experts.link", "bf16"});

  auto plan = [&](const std::string& extra, double cpu_bw, double pcie_bw, double memory = 0) {
    PlacementConfig c = yaml("cpu_experts: all\nexperts:\n" + extra);
    c.bw_gpu = 4000e9, c.bw_cpu = cpu_bw, c.bw_pcie = pcie_bw, c.bw_host_memory = memory;
    return make_plan(m, c, {.gpu_mem = 8ull << 30});
  };
  EXPECT_EQ(yaml("bandwidth:\n  host_memory: 120GB/s\n").bw_host_memory, 120e9);
  const Plan off = plan("  link: off\n", 88e9, 53e9, 120e9), three = plan("  link: 3\n", 88e9, 53e9, 120e9),
             two = plan("  link: {in_place: 2}\n", 88e9, 53e9, 120e9);
  const int64_t H = m.hidden_size, I = m.moe_intermediate_size, E = m.num_experts, L = m.num_layers, k = m.num_experts_per_tok;
  EXPECT_EQ(three.vram.workspace - off.vram.workspace, gpu::link_buffer_bytes(H, I, E, L, 3).total());
  EXPECT_EQ(two.vram.workspace - off.vram.workspace, gpu::link_buffer_bytes(H, I, E, L, 2).total());
  EXPECT_LE(three.vram.allocated(), three.budget_bytes);
  EXPECT_EQ(three.link_in_place, 3);
  EXPECT_EQ(nlohmann::json::parse(plan_to_json(two).dump())["link"]["in_place"], 2);
  // The H200 machine (host memory ~88 GB/s to 16 cores, ~120 to them and PCIe 5 at ~53 together): the link pays.
  EXPECT_GT(three.predicted.decode_tok_s, off.predicted.decode_tok_s * 1.05);
  // A desktop (dual-channel DDR5 ~60 GB/s, PCIe 4 ~25, host_memory unset: the cores already take what
  // memory gives): the link cannot pay.
  EXPECT_LT(plan("  link: 3\n", 60e9, 25e9).predicted.decode_tok_s, plan("  link: off\n", 60e9, 25e9).predicted.decode_tok_s);
  EXPECT_LE(plan("  link: 1\n", 60e9, 25e9).predicted.decode_tok_s, plan("  link: off\n", 60e9, 25e9).predicted.decode_tok_s);
  // auto: the best of 0..k read in place, by the same model.
  const Plan fast = plan("  link: auto\n", 88e9, 53e9, 120e9), slow = plan("  link: auto\n", 60e9, 25e9);
  EXPECT_GT(fast.link_in_place, 0);
  EXPECT_GE(fast.predicted.decode_tok_s, three.predicted.decode_tok_s);
  EXPECT_DOUBLE_EQ(fast.predicted.cpu_bytes_per_token, off.predicted.cpu_bytes_per_token);  // predicted once per candidate, not summed
  for (int n = 0; n <= k; ++n)
    EXPECT_GE(fast.predicted.decode_tok_s * 1.0001, plan("  link: " + std::to_string(n) + "\n", 88e9, 53e9, 120e9).predicted.decode_tok_s) << n;
  EXPECT_EQ(slow.link_in_place, 0);
  EXPECT_LE(fast.vram.allocated(), fast.budget_bytes);
}

// Expert deferral in the cost model: a deferred expert's host time hides behind the next layer's GPU
// work, so more deferral never predicts a slower decode with CPU experts, never above the bound, and
// changes nothing when every expert is on the GPU.
TEST(Planner, DeferralHidesHostTimeBehindTheNextLayer) {
  const ModelConfig m = model35();
  double prev = 0;
  for (int d = 0; d <= 8; ++d) {
    const Plan p = make_plan(m, yaml("cpu_experts: all\nexperts:\n  deferral: " + std::to_string(d) + "\n"), {.gpu_mem = 8ull << 30});
    EXPECT_GE(p.predicted.decode_tok_s, prev) << "deferral " << d;
    EXPECT_LE(p.predicted.decode_tok_s, p.predicted.bound_tok_s * 1.0001) << "deferral " << d;
    prev = p.predicted.decode_tok_s;
  }
  EXPECT_GT(prev, make_plan(m, yaml("cpu_experts: all\n"), {.gpu_mem = 8ull << 30}).predicted.decode_tok_s);
  const double all_gpu = make_plan(m, yaml("experts:\n  select: all\n"), {.gpu_mem = 80ull << 30}).predicted.decode_tok_s;
  EXPECT_DOUBLE_EQ(make_plan(m, yaml("experts:\n  select: all\n  deferral: 2\n"), {.gpu_mem = 80ull << 30}).predicted.decode_tok_s, all_gpu);
}

TEST(Planner, EveryExpertOnTheGpuWhenAllFit) {
  const ModelConfig m = model35();
  const Plan p = make_plan(m, {}, {.gpu_mem = 40ull << 30});
  EXPECT_EQ(p.total_gpu_experts(), 40 * 256);
  EXPECT_FALSE(p.any_cpu_experts());
  EXPECT_DOUBLE_EQ(p.expected_gpu_expert_fraction, 1.0);
  const Plan all = make_plan(m, yaml("experts: {select: all}"), {.gpu_mem = 40ull << 30});
  EXPECT_EQ(all.total_gpu_experts(), 40 * 256);
  // The smallest budget that holds everything (at a set prefill chunk) gets everything; one byte less
  // leaves experts on the CPU: one without streamed prefill, and with it (the default) as many as make
  // room for its buffers. (With the chunk on auto, a smaller chunk keeps them all: AutoPrefillChunk...)
  const uint64_t need = make_plan(m, yaml("prefill: {chunk: 256}"), {.gpu_mem = 40ull << 30}).vram.total();
  EXPECT_EQ(p.stream_experts, 0);
  EXPECT_EQ(make_plan(m, yaml("prefill: {chunk: 256}"), {.gpu_mem = need}).total_gpu_experts(), 40 * 256);
  EXPECT_EQ(make_plan(m, yaml("prefill: {strategy: cpu, chunk: 256}"), {.gpu_mem = need - 1}).total_gpu_experts(), 40 * 256 - 1);
  const Plan short1 = make_plan(m, yaml("prefill: {chunk: 256}"), {.gpu_mem = need - 1});
  EXPECT_LT(short1.total_gpu_experts(), 40 * 256 - 1);
  EXPECT_GE(short1.stream_experts, 1);
  EXPECT_LE(short1.vram.total(), need - 1);
}

// speculative.draft: the MTP head goes on the GPU whole (GpuOptions::mtp), so the plan counts it: its
// KV cache, its dense weights (fc as two [H, H] halves among them), its 256 BF16 experts (the GPTQ
// release leaves mtp.* unquantized), and the routed experts of the model make room for it.
TEST(Planner, SpeculativeDraftCountsTheMtpHead) {
  const ModelConfig m = model35();
  ASSERT_EQ(m.mtp_layers, 1);
  const std::string base = "prefill: {chunk: 256}\ncontext: 4096\n";
  const Plan off = make_plan(m, yaml(base), {.gpu_mem = 16ull << 30});  // 24 GiB holds every expert and the head
  const Plan on = make_plan(m, yaml(base + "speculative: {draft: 3}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_EQ(on.vram.kv_cache - off.vram.kv_cache, kv_cache_bytes(m, 4096, RowFormat::Bf16));
  EXPECT_GE(on.vram.dense_weights - off.vram.dense_weights, 2ull * 2048 * 2048 * 2);
  const uint64_t head_experts = 256ull * 3 * 2048 * 512 * 2;
  const int fewer = off.total_gpu_experts() - on.total_gpu_experts();
  EXPECT_GE(static_cast<uint64_t>(fewer) * on.gpu_expert_bytes, head_experts) << fewer << " fewer GPU experts";
  EXPECT_LE(on.vram.total(), 16ull << 30);
  EXPECT_GT(on.vram.workspace, off.vram.workspace);  // the verification step's rows and kept DeltaNet states
  // tandem bench --verify-cost without drafts: its kept states are counted too (PlanRequest::verify_tokens)
  const Plan verify = make_plan(m, yaml(base), {.gpu_mem = 16ull << 30, .verify_tokens = 5});
  EXPECT_GT(verify.vram.workspace, off.vram.workspace);
  EXPECT_LE(verify.vram.total(), 16ull << 30);
  // the plan's expert bytes are the model's and the head's, as the GPU allocates them
  EXPECT_EQ(on.vram.expert_weights - static_cast<uint64_t>(on.total_gpu_experts()) * on.gpu_expert_bytes - 40 * align256(256ull * 3 * 56),
            head_experts + align256(256ull * 3 * 8));
  EXPECT_NE(plan_table(on).find("and the MTP head's"), std::string::npos) << plan_table(on);

  // speculative.head_experts: cpu: the head's experts in host memory (BF16 head, CPU format int4: kept
  // as int8, 1 byte a weight and an f16 scale per 128): none in VRAM, their room to the model's experts
  const Plan host = make_plan(m, yaml(base + "speculative: {draft: 3, head_experts: cpu}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_TRUE(host.head_experts_cpu);
  EXPECT_EQ(host.head_host_expert_bytes, 256ull * 3 * (2048 * 512 + 2048 * 512 / 128 * 2));
  EXPECT_EQ(host.host_expert_bytes, static_cast<uint64_t>(40 * 256 - host.total_gpu_experts()) * host.cpu_expert_bytes + host.head_host_expert_bytes);
  EXPECT_GE(static_cast<uint64_t>(host.total_gpu_experts() - on.total_gpu_experts() + 1) * on.gpu_expert_bytes, head_experts);
  EXPECT_GT(host.total_gpu_experts(), on.total_gpu_experts());
  EXPECT_LE(host.vram.total(), 16ull << 30);
  EXPECT_GT(host.predicted.draft_ms, on.predicted.draft_ms);  // host memory and a handoff instead of HBM
  EXPECT_NE(plan_table(host).find("the MTP head's routed experts in host memory"), std::string::npos) << plan_table(host);
  EXPECT_EQ(plan_to_json(host)["speculative"]["head_experts"], "cpu");
  EXPECT_FALSE(make_plan(m, yaml(base + "speculative: {head_experts: cpu}\n"), {.gpu_mem = 16ull << 30}).head_experts_cpu) << "no drafts, no head";

  // speculative.lm_head: int8: the drafts' own copy of the lm_head as 8-bit rows, counted with the
  // dense weights; the drafts' predicted cost drops by about half the lm_head's read. No copy without
  // drafts, nor when the model's lm_head is already int8 (dense.lm_head), which the drafts then read.
  const Plan copy = make_plan(m, yaml(base + "speculative: {draft: 3, lm_head: int8}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_EQ(copy.draft_lm_head, RowFormat::Int8);
  EXPECT_EQ(copy.draft_lm_head_bytes, gpu::rows8_matrix_bytes(248320, 2048));
  EXPECT_EQ(copy.vram.dense_weights - on.vram.dense_weights, copy.draft_lm_head_bytes);
  EXPECT_LE(copy.vram.total(), 16ull << 30);
  EXPECT_LT(copy.total_gpu_experts(), on.total_gpu_experts());  // the copy's room comes from the routed experts
  EXPECT_NEAR(on.predicted.draft_ms - copy.predicted.draft_ms, 248320.0 * (2048 * 2 - 2052) / on.predicted.gpu_bw * 1e3, 1e-9);
  EXPECT_NE(plan_table(copy).find("the drafts read their own int8 copy of the lm_head"), std::string::npos) << plan_table(copy);
  EXPECT_EQ(plan_to_json(copy)["speculative"]["lm_head"], "int8");
  EXPECT_EQ(plan_to_json(on)["speculative"]["lm_head"], "model's");
  const Plan none = make_plan(m, yaml(base + "speculative: {lm_head: int8}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_EQ(none.draft_lm_head, RowFormat::Bf16);
  EXPECT_EQ(none.vram.dense_weights, off.vram.dense_weights);
  const Plan shared = make_plan(m, yaml(base + "dense: {lm_head: int8}\nspeculative: {draft: 3, lm_head: int8}\n"), {.gpu_mem = 16ull << 30});
  EXPECT_EQ(shared.draft_lm_head, RowFormat::Bf16);
  EXPECT_EQ(shared.draft_lm_head_bytes, 0u);
}

// The cost model's speculative side: verification of k + 1 tokens costs more with k (the union of the
// tokens' experts), much more where the experts are read from host memory; the speed-up formula.
TEST(Planner, PredictsTheVerificationCostAndSpeedUp) {
  const ModelConfig m = model35();
  const PlacementConfig cfg = fixed_bw(yaml("context: 4096\nspeculative: {draft: 4}\n"));
  const Plan gpu = make_plan(m, cfg, {.gpu_mem = 40ull << 30}), hy = make_plan(m, cfg, {.gpu_mem = 12ull << 30});
  EXPECT_TRUE(make_plan(m, fixed_bw(yaml("context: 4096\n")), {.gpu_mem = 40ull << 30}).predicted.verify_ms.empty());
  for (const Plan* p : {&gpu, &hy}) {
    const Prediction& pr = p->predicted;
    ASSERT_EQ(pr.verify_ms.size(), 4u);
    EXPECT_GT(pr.verify_ms[0], pr.decode_ms);
    for (int k = 1; k < 4; ++k) EXPECT_GT(pr.verify_ms[k], pr.verify_ms[k - 1]);
    EXPECT_GT(pr.draft_ms, 248320.0 * 2048 * 2 / 1000e9 * 1e3);  // at least the lm_head's read
    const double tokens = 1 + 0.8 + 0.64;  // k = 2 at acceptance 0.8
    EXPECT_NEAR(pr.speedup(2, 0.8), tokens * pr.decode_ms / (pr.verify_ms[1] + 2 * pr.draft_ms), 1e-9);
    EXPECT_EQ(pr.speedup(5, 0.8), 0);
  }
  EXPECT_GT(hy.predicted.verify_ms[0] / hy.predicted.decode_ms, gpu.predicted.verify_ms[0] / gpu.predicted.decode_ms);
  EXPECT_GT(gpu.predicted.speedup(2, 0.8), 1.2);
  EXPECT_NE(plan_table(gpu).find("speculative"), std::string::npos);
  EXPECT_TRUE(plan_to_json(gpu).contains("speculative"));
}

// The verification's cost beyond its bytes (planner.cpp's kVerifyStepUs / kVerifyTokenUs) against what
// it was fitted to: the H100 (copy bandwidth 3.0 TB/s), all on the GPU, a 1024-token prompt, measured
// 1.33 / 1.51 / 1.68 / 1.85 decode steps at k = 1..4 and 1.37x at acceptance 0.8 (k = 3)
// (bench/results/2026-12-05-stop44-h100-moe-layout-rollback.md); bytes alone said 1.05-1.20 and 1.89x.
TEST(Planner, VerificationCostMatchesTheH100) {
  PlacementConfig cfg = yaml("context: 1280\nspeculative: {draft: 4}\n");
  cfg.bw_gpu = 3.0e12, cfg.bw_pcie = 25e9, cfg.bw_cpu = 80e9;
  const Plan p = make_plan(model35(), cfg, {.gpu_mem = 64ull << 30});
  ASSERT_EQ(p.total_gpu_experts(), 40 * 256);
  const Prediction& pr = p.predicted;
  ASSERT_EQ(pr.verify_ms.size(), 4u);
  const double measured[4] = {1.33, 1.51, 1.68, 1.85};
  for (int k = 1; k <= 4; ++k) EXPECT_NEAR(pr.verify_ms[k - 1] / pr.decode_ms, measured[k - 1], 0.1) << "k = " << k;
  EXPECT_NEAR(pr.speedup(3, 0.8), 1.37, 0.1);
}

TEST(Planner, StreamedPrefillBuffersAreCountedForTheLayerWithTheMostCpuExperts) {
  const ModelConfig m = model35();
  const int64_t H = 2048, I = 512;
  for (uint64_t gib : {8ull, 12ull, 16ull}) {
    SCOPED_TRACE(gib);
    const Plan p = make_plan(m, {}, {.gpu_mem = gib << 30});
    const Plan off = make_plan(m, yaml("prefill: {strategy: cpu}"), {.gpu_mem = gib << 30});
    int most = 0;
    for (int l = 0; l < 40; ++l) most = std::max(most, 256 - p.experts_on_gpu[l]);
    EXPECT_EQ(p.stream_experts, most);
    ASSERT_GT(most, 0);
    const uint64_t buffers = gpu::stream_buffer_bytes(H, I, 128, 256, 40, most, gpu::stream_pass_tokens(p.prefill_chunk)).total();
    EXPECT_EQ(p.vram.workspace, off.vram.workspace + buffers);
    EXPECT_LE(p.vram.total(), gib << 30);
    EXPECT_GE(off.total_gpu_experts(), p.total_gpu_experts());  // the buffers take the place of some experts
    EXPECT_GT(p.predicted.prefill_gpu_min_tokens, 0);
    EXPECT_EQ(off.predicted.prefill_gpu_min_tokens, 0);
    EXPECT_EQ(off.stream_experts, 0);
  }
  // Experts the selection or the rules leave on the CPU are streamed too, whatever the budget.
  EXPECT_EQ(make_plan(m, yaml("gpu_experts_per_layer: 200"), {.gpu_mem = 40ull << 30}).stream_experts, 56);
  EXPECT_EQ(make_plan(m, yaml("cpu_experts: all"), {.gpu_mem = 24ull << 30}).stream_experts, 256);
  // The row form of one expert is the planner's GPU expert size plus the input orders it carries.
  EXPECT_EQ(2 * gpu::int4_rows_bytes(I, H, 128) + gpu::int4_rows_bytes(H, I, 128),
            make_plan(m, {}, {.gpu_mem = 24ull << 30}).gpu_expert_bytes + 2 * H * 4 + I * 4);
}

TEST(Planner, ByteAccountingMatchesTheSpecSizes) {
  // Spec §4: a 512x2048 int4 g128 matrix has 524,288 B of nibbles and 16 x 512 fp16 scales (16,384 B);
  // the GPU layout adds u8 zeros (8,192 B), the symmetric CPU layout does not. Down (2048x512) is the same.
  const Plan p = make_plan(model35(), {}, {.gpu_mem = 24ull << 30});
  EXPECT_EQ(p.gpu_expert_bytes, 3u * (524288 + 16384 + 8192));
  EXPECT_EQ(p.cpu_expert_bytes, 3u * (524288 + 16384));
  // KV: 10 layers x 2 x context x 2 heads x 256 x 2 B (spec §3.7: 20,480 B per token).
  EXPECT_EQ(p.vram.kv_cache, 20480ull * 4096);
  // DeltaNet state: 30 x (32 x 128 x 128 x 4 B + 3 x 8192 x 4 B).
  EXPECT_EQ(p.vram.deltanet_state, 30ull * (32 * 128 * 128 * 4 + 3 * 8192 * 4));
  // BF16 experts: three 512x2048 bf16 matrices, the same on both sides.
  const Plan b = make_plan(model35_bf16(), {}, {.gpu_mem = 24ull << 30});
  EXPECT_EQ(b.gpu_expert_bytes, 3u * 512 * 2048 * 2);
  EXPECT_EQ(b.cpu_expert_bytes, 3u * 512 * 2048 * 2);
  EXPECT_EQ(make_plan(model35_bf16(), yaml("experts: {cpu_format: int8}"), {.gpu_mem = 24ull << 30}).cpu_expert_bytes,
            3u * (512 * 2048 + 512 * 16 * 2));
  // Dense weights: spec §6 non-expert parameters, all bf16 (plus 256-byte alignment and fp32 norms).
  EXPECT_NEAR(static_cast<double>(p.vram.dense_weights), 2448355968.0 * 2, 0.01 * 2448355968.0 * 2);
  // Embedding table on the CPU saves exactly its bf16 bytes.
  const Plan cpu_embed = make_plan(model35(), yaml("rules:\n  - {match: embed_tokens, place: cpu}\n"), {.gpu_mem = 24ull << 30});
  EXPECT_FALSE(cpu_embed.embed_on_gpu);
  EXPECT_EQ(p.vram.dense_weights - cpu_embed.vram.dense_weights, 248320ull * 2048 * 2);
  // Batched prefill (chunk 256): chunk-sized copies of the activations (~0.2 MB per chunk token at the
  // 35B shape), for int4 experts the grouped MoE's sorted copies (8 pairs x (fp16 x twice, fp16 h, fp32
  // y) ~ 0.14 MB per token), plus the cuBLAS workspace; a chunk of 0 (token by token) drops all of it,
  // the embedding on the CPU none (its rows are gathered on the host, in host memory).
  const Plan c256 = make_plan(model35(), yaml("prefill: {chunk: 256}"), {.gpu_mem = 24ull << 30});
  const Plan tbt = make_plan(model35(), yaml("prefill: {chunk: 0}"), {.gpu_mem = 24ull << 30});
  const Plan half = make_plan(model35(), yaml("prefill: {chunk: 128}"), {.gpu_mem = 24ull << 30});
  EXPECT_EQ(c256.prefill_chunk, 256);
  EXPECT_EQ(tbt.prefill_chunk, 0);
  const double per_token = static_cast<double>(c256.vram.workspace - half.vram.workspace) / 128;
  EXPECT_GT(per_token, 300e3);
  EXPECT_LT(per_token, 450e3);
  EXPECT_NEAR(static_cast<double>(c256.vram.workspace - tbt.vram.workspace), 256 * per_token + (4 << 20), 64 << 10);
  const Plan b256 = make_plan(model35_bf16(), yaml("prefill: {chunk: 256}"), {.gpu_mem = 24ull << 30});
  const Plan b_tbt = make_plan(model35_bf16(), yaml("prefill: {chunk: 0}"), {.gpu_mem = 24ull << 30});
  const double bf16_per_token = static_cast<double>(b256.vram.workspace - b_tbt.vram.workspace - (4 << 20)) / 256;
  EXPECT_GT(bf16_per_token, 150e3);  // bf16 experts: no grouped copies
  EXPECT_LT(bf16_per_token, 300e3);
  EXPECT_EQ(cpu_embed.vram.workspace, p.vram.workspace);
}

// prefill.chunk: auto (the default): 2048 where every routed expert still fits beside it (24 GiB) or
// none goes to the GPU (cpu_experts: all); where experts compete for the room, 256 (decode keeps its
// GPU experts). "auto" may be written too.
TEST(Planner, AutoPrefillChunkCostsDecodeLittle) {
  const Plan all = make_plan(model35(), {}, {.gpu_mem = 24ull << 30});
  EXPECT_EQ(all.prefill_chunk, 2048);
  EXPECT_TRUE(all.prefill_chunk_auto);
  EXPECT_NE(plan_table(all).find("batches of 2048 tokens, auto: it costs no GPU experts"), std::string::npos) << plan_table(all);
  EXPECT_TRUE(plan_to_json(all)["prefill_chunk_auto"].get<bool>());
  EXPECT_FALSE(make_plan(model35(), yaml("prefill: {chunk: 512}"), {.gpu_mem = 24ull << 30}).prefill_chunk_auto);
  EXPECT_EQ(all.total_gpu_experts(), 256 * 40);
  EXPECT_EQ(make_plan(model35(), yaml("prefill: {chunk: auto}"), {.gpu_mem = 24ull << 30}).prefill_chunk, 2048);
  const Plan cpu = make_plan(model35(), yaml("cpu_experts: all"), {.gpu_mem = 8ull << 30});
  EXPECT_EQ(cpu.prefill_chunk, 2048);
  EXPECT_GT(cpu.stream_experts, 0) << plan_table(cpu);  // the streamed prefill's buffers still fit
  for (const uint64_t gib : {8ull, 12ull, 16ull}) {
    const Plan a = make_plan(model35(), {}, {.gpu_mem = gib << 30});
    EXPECT_EQ(a.prefill_chunk, 256) << gib << " GiB";
    EXPECT_NE(plan_table(a).find("auto: a larger one would take GPU experts"), std::string::npos) << plan_table(a);
    EXPECT_EQ(a.total_gpu_experts(), make_plan(model35(), yaml("prefill: {chunk: 256}"), {.gpu_mem = gib << 30}).total_gpu_experts());
  }
  // Just below where all experts fit with 2048 (24 GiB's plan less 1 MiB): a smaller chunk that still
  // fits them all, never fewer experts.
  const Plan near = make_plan(model35(), {}, {.gpu_mem = all.vram.total() - (1ull << 20)});
  EXPECT_LT(near.prefill_chunk, 2048);
  EXPECT_EQ(near.total_gpu_experts(), 256 * 40);
}

TEST(Planner, SaysWhenTheCpuExpertsDoNotFitInHostMemory) {
  const Plan p = make_plan(model35(), yaml("cpu_experts: all"), {.gpu_mem = 24ull << 30, .host_available_bytes = 8ull << 30});
  EXPECT_FALSE(p.host_fits());
  EXPECT_NE(plan_table(p).find("not enough host RAM"), std::string::npos);
  EXPECT_FALSE(plan_to_json(p)["host_fits"].get<bool>());
  const Plan q = make_plan(model35(), yaml("cpu_experts: all"), {.gpu_mem = 24ull << 30, .host_available_bytes = 64ull << 30});
  EXPECT_TRUE(q.host_fits());
  EXPECT_EQ(plan_table(q).find("not enough host RAM"), std::string::npos);
}

TEST(Planner, HeatMapPutsTheHottestExpertsOnTheGpu) {
  const ModelConfig m = model35();
  HeatMap h;
  h.num_experts = 256, h.top_k = 8, h.tokens = 1000;
  std::mt19937 rng(3);
  h.counts.assign(40, std::vector<uint64_t>(256));
  for (auto& row : h.counts)
    for (auto& c : row) c = rng() % 1000;
  const std::string path = (std::filesystem::temp_directory_path() / "tandem_test_heat.yaml").string();
  save_heat_map(h, path);
  const HeatMap back = load_heat_map(path);
  EXPECT_EQ(back.counts, h.counts);
  const PlacementConfig c = yaml("experts:\n  select: frequency\n  heat: " + path + "\n");
  const uint64_t lo = make_plan(m, {}, {.gpu_mem = 24ull << 30}).min_budget_bytes;
  const Plan p = make_plan(m, c, {.gpu_mem = lo + (3ull << 30)});
  ASSERT_GT(p.total_gpu_experts(), 0);
  ASSERT_TRUE(p.any_cpu_experts());
  EXPECT_TRUE(p.heat_used);
  // Every GPU expert is at least as hot (by share) as every CPU expert, across layers.
  double min_gpu = 1, max_cpu = 0;
  for (int l = 0; l < 40; ++l)
    for (int e = 0; e < 256; ++e) (p.expert_on_gpu[l][e] ? min_gpu = std::min(min_gpu, h.share(l, e)) : max_cpu = std::max(max_cpu, h.share(l, e)));
  EXPECT_GE(min_gpu, max_cpu);
  // And the expected GPU share beats the uniform expectation for the same number of experts.
  EXPECT_GT(p.expected_gpu_expert_fraction, p.total_gpu_experts() / (40.0 * 256));
  // A heat map of another shape is refused.
  h.counts.pop_back();
  save_heat_map(h, path);
  test::expect_error([&] { make_plan(m, c, {.gpu_mem = 24ull << 30}); }, {"heat map has 39 layers", "40"});
  std::filesystem::remove(path);
}

TEST(Planner, CostModelOrdersPlacementsSensibly) {
  const ModelConfig m = model35();
  const PlacementConfig c = fixed_bw({});
  double prev = 0;
  for (uint64_t gib : {6, 8, 12, 16, 24}) {
    const Plan p = make_plan(m, c, {.gpu_mem = gib << 30});
    EXPECT_GE(p.predicted.decode_tok_s, prev) << gib << " GiB";
    prev = p.predicted.decode_tok_s;
  }
  // All experts on the CPU: bound = CPU read bandwidth over 8 experts x 40 layers of bytes.
  const Plan cpu = make_plan(m, fixed_bw(yaml("cpu_experts: all")), {.gpu_mem = 24ull << 30});
  EXPECT_NEAR(cpu.predicted.bound_tok_s, 80e9 / (8.0 * 40 * cpu.cpu_expert_bytes), 1e-6);
  EXPECT_GT(cpu.predicted.prefill_gpu_min_tokens, 0);
}

// The cost model against the H200 runs it was fitted to (decode at a 4096-token context, each at its
// run's measured bandwidths): the 24 GiB step of session 10 (bench/results/2026-12-01-h200-session10.md),
// the 8 GiB all-CPU-experts steps without and with experts.link 3 of session 13 (2026-12-01-h200-
// session13.md): within 5% of the measured decode (a refit after the kernels change moves these).
TEST(Planner, CostModelMatchesTheMeasuredH200Decode) {
  const ModelConfig m = model35();
  struct Run {
    const char* yaml;
    uint64_t gib;
    double gpu_bw, cpu_bw, measured, host_memory = 0;
  };
  for (const Run& r : {Run{"experts:\n  select: all\n", 24, 4084.0e9, 83.2e9, 347.4},
                       Run{"cpu_experts: all\n", 8, 4056.0e9, 86.0e9, 119.8},
                       Run{"cpu_experts: all\nexperts:\n  link: 3\n", 8, 4119.0e9, 86.8e9, 140.4, 121e9}}) {
    PlacementConfig c = yaml(r.yaml);
    c.bw_gpu = r.gpu_bw, c.bw_pcie = 55e9, c.bw_cpu = r.cpu_bw, c.bw_host_memory = r.host_memory;
    const Plan p = make_plan(m, c, {.gpu_mem = r.gib << 30, .context = 4240});
    EXPECT_NEAR(p.predicted.decode_tok_s / r.measured, 1.0, 0.05) << r.yaml << " predicted " << p.predicted.decode_tok_s;
  }
}

}  // namespace
}  // namespace tandem::placement

namespace tandem::placement {
namespace {

// context: auto (and no YAML at all): the longest context whose KV cache and context-sized buffers take
// at most a quarter of what the budget leaves at 4096 tokens, up to max_position_embeddings, in steps of
// 1024; the plan says what it costs in GPU experts. A YAML's number (or --context) wins.
TEST(Planner, AutoContextTakesAQuarterOfTheRoomAndSaysSo) {
  const ModelConfig m = model35();
  const PlacementConfig cfg = yaml("context: auto\nprefill: {chunk: 256}\n");  // one chunk: the same workspace at every context
  for (const uint64_t gib : {8ull, 12ull, 24ull, 48ull}) {
    const Plan p = make_plan(m, cfg, {.gpu_mem = gib << 30});
    const Plan at4k = make_plan(m, cfg, {.gpu_mem = gib << 30, .context = 4096});
    EXPECT_GE(p.context, 4096) << gib;
    EXPECT_LE(p.context, m.max_position_embeddings) << gib;
    EXPECT_TRUE(p.context == m.max_position_embeddings || p.context % 1024 == 0) << p.context;
    // KV cache: 20,480 B a token at the 35B shape (spec §3.7)
    EXPECT_EQ(p.vram.kv_cache, 20480ull * p.context) << gib;
    const uint64_t room = p.budget_bytes - at4k.min_budget_bytes, grown = p.min_budget_bytes - at4k.min_budget_bytes;
    EXPECT_LE(grown, room / 4 + (1 << 20)) << gib;  // the chunk may differ: 1 MiB of slack
    if (p.context < m.max_position_embeddings) {
      EXPECT_GT(grown + 2 * 20480ull * 1024, room / 4) << gib << ": could have been longer";
    }
    EXPECT_NE(p.context_note.find("routed experts"), std::string::npos) << p.context_note;
    EXPECT_NE(plan_table(p).find("auto: the KV cache"), std::string::npos) << plan_table(p);
    EXPECT_LE(p.total_gpu_experts(), at4k.total_gpu_experts());
  }
  EXPECT_EQ(make_plan(m, default_placement_config(), {.gpu_mem = 48ull << 30}).context, m.max_position_embeddings);
  const Plan yaml_ctx = make_plan(m, yaml("context: 8192\n"), {.gpu_mem = 24ull << 30});
  EXPECT_EQ(yaml_ctx.context, 8192);
  EXPECT_TRUE(yaml_ctx.context_note.empty());
  EXPECT_EQ(yaml("context: auto\n").context, 0);
  EXPECT_EQ(make_plan(m, default_placement_config(), {.gpu_mem = 24ull << 30, .context = 6000}).context, 6000);
}

}  // namespace
}  // namespace tandem::placement
