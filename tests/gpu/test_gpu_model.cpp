// The whole model on the GPU against HF transformers: every fixture, prefill + decode, within 2e-2
// relative L2 per position, and the same argmax wherever the reference's top-2 margin exceeds 0.1.
#include <algorithm>
#include <cmath>

#include "gpu_core/device.cuh"
#include "core/error.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "runtime/format/npy.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

class GpuModel : public ::testing::TestWithParam<std::string> {};

// The options the fixture comparisons start from: defaults with a 256-token context.
GpuOptions fixture_options() {
  GpuOptions g;
  g.max_context = 256;
  return g;
}

TEST_P(GpuModel, MatchesTransformers) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  auto gpu = Qwen35MoeGpu::create(*model, fixture_options());
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  std::vector<float> got(n * V);
  gpu->forward(std::span(f.ids.data(), f.prefill), got.data());
  for (int64_t i = f.prefill; i < n; ++i) gpu->forward(std::span(f.ids.data() + i, 1), got.data() + i * V);
  const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
  const LogitsComparison cmp = compare_logits(got.data(), ref.data.data(), n, V);
  for (int64_t t = 0; t < n; ++t) EXPECT_LT(cmp.rel_l2[t], 2e-2) << f.name << " position " << t;
  EXPECT_TRUE(cmp.argmax_misses.empty()) << f.name << ": argmax differs at " << cmp.argmax_misses.size() << " of "
                                         << cmp.decisive << " decisive positions, first " << cmp.argmax_misses[0];
  // A second sequence after reset() gives the same logits (no state leaks between sequences).
  gpu->reset();
  std::vector<float> again(V);
  gpu->forward(std::span(f.ids.data(), 1), again.data());
  EXPECT_TRUE(std::equal(again.begin(), again.end(), got.begin()));
}

// The CUDA-graph step (GpuOptions::cuda_graph) replays exactly the eager step's kernels: identical
// logits, for every position, across reset() and with and without logits rows.
TEST_P(GpuModel, CudaGraphStepEqualsEagerStep) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  GpuOptions g = fixture_options();
  auto eager = Qwen35MoeGpu::create(*model, g);
  ASSERT_FALSE(eager->cuda_graph_active());
  g.cuda_graph = true;
  auto graphed = Qwen35MoeGpu::create(*model, g);
  ASSERT_TRUE(graphed->cuda_graph_active());
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  for (int round = 0; round < 2; ++round) {
    std::vector<float> a(n * V), b(n * V);
    eager->forward(std::span(f.ids.data(), n), a.data(), Qwen35Moe::LogitRows::All);
    graphed->forward(std::span(f.ids.data(), f.prefill), b.data() + (f.prefill - 1) * V, Qwen35Moe::LogitRows::Last);
    for (int64_t i = f.prefill; i < n; ++i) graphed->forward(std::span(f.ids.data() + i, 1), b.data() + i * V);
    for (int64_t i = f.prefill - 1; i < n; ++i)
      ASSERT_TRUE(std::equal(a.begin() + i * V, a.begin() + (i + 1) * V, b.begin() + i * V)) << f.name << " round " << round << " position " << i;
    eager->reset();
    graphed->reset();
  }
}

// Decode steps of the fixture's ids (prompt token by token) on two GPU models, `rounds` times with
// reset() between: the same logits bit for bit (tol 0) or within tol relative L2 per position.
void expect_same_decode(const Qwen35Moe& model, const test::Fixture& f, const GpuOptions& a_opts, const GpuOptions& b_opts,
                        double tol, int rounds, const std::string& label) {
  auto a_model = Qwen35MoeGpu::create(model, a_opts), b_model = Qwen35MoeGpu::create(model, b_opts);
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  std::vector<float> a(V), b(V);
  for (int round = 0; round < rounds; ++round) {
    for (int64_t i = 0; i < n; ++i) {
      a_model->forward(std::span(f.ids.data() + i, 1), a.data());
      b_model->forward(std::span(f.ids.data() + i, 1), b.data());
      if (tol == 0) {
        ASSERT_EQ(a, b) << f.name << " " << label << " round " << round << " position " << i;
      } else {
        EXPECT_LT(compare_logits(b.data(), a.data(), 1, V).rel_l2[0], tol) << f.name << " " << label << " position " << i;
      }
    }
    a_model->reset();
    b_model->reset();
  }
}

// GpuOptions::moe_prefetch (int4 experts decoded with every weight word loaded up front) computes the
// same numbers as the plain decode kernels, act-order fixtures included; GpuOptions::moe_wide (16-byte
// loads, fp32 input read in the kernel) the same per-word arithmetic with the words' sums added in
// another order, which flips the fp16 rounding of a few h values (~1e-5 per layer; 1e-4), on the
// fixtures whose shapes it takes (multiples of 32).
TEST_P(GpuModel, MoeDecodeVariantsEqualPlainDecode) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  GpuOptions plain = fixture_options();
  GpuOptions prefetch = plain, wide = plain;
  prefetch.moe_prefetch = true;
  wide.moe_wide = true;
  expect_same_decode(*model, f, plain, prefetch, 1e-6, 1, "prefetch");
  expect_same_decode(*model, f, plain, wide, 1e-4, 1, "wide");
}

// GpuOptions::deltanet_split (decode recurrence over 32-column slices of each head's state, the gated
// norm by the head's last block) and GpuOptions::deltanet_conv_in_gemv (the conv applied by the input
// projection's GEMV) against the default kernels, eagerly and as CUDA-graph steps: the conv in the GEMV
// gives the same bits; the split recurrence fp32 rounding apart (the norms' sums in another order).
// Fixtures whose dv is not a multiple of 32 take the default recurrence either way.
TEST_P(GpuModel, DeltaNetDecodeVariantsEqualDefault) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  for (const bool graph : {false, true})
    for (const int variant : {1, 2, 3}) {  // bit 0: split recurrence, bit 1: conv in the GEMV
      GpuOptions g = fixture_options();
      g.cuda_graph = graph;
      GpuOptions other = g;
      other.deltanet_split = variant & 1;
      other.deltanet_conv_in_gemv = variant & 2;
      expect_same_decode(*model, f, g, other, variant == 2 ? 0.0 : 1e-5, 1,
                         str_cat("variant ", variant, graph ? " (graph)" : ""));
    }
}

// GpuOptions::router_norm (the post-attention norm done by the router GEMV's blocks): the same bits as
// the norm launch + router GEMV, eagerly and as CUDA-graph steps, with the product's other decode paths;
// and with GpuOptions::parallel_shared (the shared expert's down GEMV on a second stream) on top.
TEST_P(GpuModel, RouterNormEqualsNormThenRouter) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  for (const bool graph : {false, true}) {
    GpuOptions g = fixture_options();
    g.cuda_graph = graph;
    g.moe_prefetch = g.moe_wide = true;
    GpuOptions fused = g;
    fused.router_norm = true;
    expect_same_decode(*model, f, g, fused, 0.0, 2, graph ? "router norm (graph)" : "router norm");
    // and the shared expert's down GEMV beside the routed experts (GpuOptions::parallel_shared)
    GpuOptions side = fused;
    side.parallel_shared = true;
    expect_same_decode(*model, f, g, side, 0.0, 2, graph ? "shared expert beside (graph)" : "shared expert beside");
  }
}

// GpuOptions::programmatic_launch (decode kernels may start while the one before them finishes,
// loading weights and the DeltaNet state before they wait): the same bits as plain launches, eagerly and
// as CUDA-graph steps, over the runners' decode paths and the conv-in-GEMV / split-recurrence variants.
TEST_P(GpuModel, ProgrammaticLaunchEqualsPlainLaunch) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  GpuOptions on = fixture_options();
  on.programmatic_launch = true;
  // Taken on sm_90 and later, not under TANDEM_MAX_SM=89 (what an RTX 4090 would choose).
  ASSERT_EQ(Qwen35MoeGpu::create(*model, on)->programmatic_launch_active(), gpu::gpu_device_caps().cc_major >= 9)
      << gpu::gpu_device_caps().description;
  for (const bool graph : {false, true})
    for (const int variant : {0, 1, 2}) {  // 1: conv in the GEMV, 2: and the split recurrence
      GpuOptions g = fixture_options();
      g.cuda_graph = graph;
      g.moe_prefetch = g.moe_wide = g.router_norm = g.parallel_shared = true;
      g.deltanet_conv_in_gemv = variant >= 1;
      g.deltanet_split = variant >= 2;
      GpuOptions pdl = g;
      pdl.programmatic_launch = true;
      expect_same_decode(*model, f, g, pdl, 0.0, 2, str_cat("programmatic launch, variant ", variant, graph ? " (graph)" : ""));
    }
}

// Batched prefill (GpuOptions::batched_prefill, chunks of 16 so that prompts span several): the last
// prompt row and every following decode step agree with the token-by-token path (the projections differ
// only by cuBLAS's split-bf16 rounding, ~1e-5) and with HF within the GPU tolerance.
TEST_P(GpuModel, BatchedPrefillEqualsTokenByToken) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  const NpyArray ref = read_npy_f32(f.dir + "/logits.npy");
  // 1: int4 experts grouped by expert; 2: and flash attention prefill; 3: and the grouped experts on
  // tensor cores (fp16 weights, fp32 sums: ~1e-3 from the decode kernel's arithmetic, not ~1e-5);
  // 4: and DeltaNet in the chunked form; 5: and the attention prefill on tensor cores (bf16 queries and
  // softmax weights) -- the runners' defaults; 6: and the projections as one GEMM of bf16-rounded
  // activations (GpuOptions::prefill_gemm_split off: ~2e-3 a projection, held to the HF bound)
  for (int variant = 0; variant < 7; ++variant) {
    const bool grouped = variant >= 1;
    GpuOptions g = fixture_options();
    auto plain = Qwen35MoeGpu::create(*model, g);
    g.batched_prefill = true;
    g.prefill_chunk = 16;
    g.grouped_moe = grouped;
    g.attention_prefill = variant >= 2;
    g.grouped_moe_tc = variant >= 3;
    g.deltanet_chunked = variant >= 4;
    g.attention_prefill_tc = variant >= 5;
    g.prefill_gemm_split = variant < 6;
    auto batched = Qwen35MoeGpu::create(*model, g);
    ASSERT_FALSE(plain->batched_prefill_active());
    ASSERT_TRUE(batched->batched_prefill_active());
    std::vector<float> a(V), b(V);
    plain->forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);
    batched->forward(std::span(f.ids.data(), f.prefill), b.data(), Qwen35Moe::LogitRows::Last);
    for (int64_t i = f.prefill - 1; i < n; ++i) {
      if (i >= f.prefill) {
        plain->forward(std::span(f.ids.data() + i, 1), a.data());
        batched->forward(std::span(f.ids.data() + i, 1), b.data());
      }
      const LogitsComparison same = compare_logits(b.data(), a.data(), 1, V);
      EXPECT_LT(same.rel_l2[0], variant >= 6 ? 2e-2 : variant >= 3 ? 5e-3 : 1e-3) << f.name << " position " << i << " variant " << variant;
      const LogitsComparison hf = compare_logits(b.data(), ref.data.data() + i * V, 1, V);
      EXPECT_LT(hf.rel_l2[0], 2e-2) << f.name << " position " << i << " variant " << variant;
      EXPECT_TRUE(hf.argmax_misses.empty()) << f.name << " position " << i << " variant " << variant;
    }
  }
}

TEST(GpuModelBudget, TooSmallBudgetSaysWhatItNeeds) {
  TANDEM_REQUIRE_GPU();
  auto model = Qwen35Moe::load(std::string(TANDEM_TEST_DATA) + "/bf16_fused");
  GpuOptions tiny = fixture_options();
  tiny.budget_bytes = 4096;
  test::expect_error([&] { Qwen35MoeGpu::create(*model, tiny); },
                     {"needs", "dense weights", "KV cache", "budget is 0.00 GiB (--gpu-mem)"});
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuModel, ::testing::ValuesIn(test::fixture_names()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tandem
