// Sampling on the GPU (gpu_core/sampling.cuh) against the host sampler's definition: penalties as
// LogitPenalty::apply, the k best (id, value) by decreasing value with ties to the lower id; then the
// whole path through Qwen35MoeGpu::forward_top on the HF fixtures, down to the drawn ids.
#include <algorithm>
#include <random>

#include "gpu_core/sampling.cuh"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "runtime/engine/sampling.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

// The definition: penalise a copy, sort by (value desc, id asc), keep k.
std::vector<std::pair<int32_t, float>> expected_top(std::vector<float> l, const std::vector<LogitPenalty>& pen, int k) {
  for (const auto& p : pen)
    if (p.id >= 0 && p.id < static_cast<int32_t>(l.size())) l[p.id] = p.apply(l[p.id]);
  std::vector<int32_t> order(l.size());
  for (size_t i = 0; i < l.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return l[a] != l[b] ? l[a] > l[b] : a < b; });
  std::vector<std::pair<int32_t, float>> top;
  for (int i = 0; i < k; ++i) top.push_back({order[i], l[order[i]]});
  return top;
}

std::vector<LogitPenalty> random_penalties(std::mt19937& rng, int V, int n) {
  SamplingParams p;
  p.repetition_penalty = 1.3f, p.presence_penalty = 1.5f, p.frequency_penalty = 0.25f;
  std::vector<int32_t> ctx(n), gen(n / 2);
  for (auto& x : ctx) x = static_cast<int32_t>(rng() % V);
  for (auto& x : gen) x = static_cast<int32_t>(rng() % V);
  ctx.insert(ctx.end(), gen.begin(), gen.end());
  return Sampler(p).penalties(ctx, gen);
}

// Rows of one launch: each row's k best as the definition gives them alone (the rows differ: their own
// values and penalties), for one row and for several.
TEST(GpuSampling, TopKMatchesTheDefinition) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed());
  for (int V : {248320, 1000, 64}) {
    for (int rows : {1, 3}) {
      std::vector<float> l(static_cast<size_t>(rows) * V);
      for (auto& x : l) x = static_cast<float>(static_cast<int>(std::normal_distribution<float>(0, 3)(rng) * 8)) / 8;  // ties
      std::vector<std::vector<LogitPenalty>> pen(rows);
      test::DeviceBuffer<float> dl(l), dv(rows * gpu::kMaxTopK);
      test::DeviceBuffer<int32_t> di(rows * gpu::kMaxTopK);
      test::DeviceBuffer<uint8_t> ws(rows * gpu::kTopKWorkspaceBytes);
      for (int r = 0; r < rows; ++r) {
        pen[r] = random_penalties(rng, V, 300);
        std::vector<gpu::Penalty> gp;
        for (const auto& p : pen[r]) gp.push_back({p.id, p.rep, p.sub});
        test::DeviceBuffer<gpu::Penalty> dp(gp);
        CUDA_OK(gpu::penalise(dl.ptr + static_cast<int64_t>(r) * V, V, dp.ptr, static_cast<int>(gp.size()), nullptr));
        CUDA_OK(cudaDeviceSynchronize());
      }
      for (int k : {1, 20, 40, 64}) {
        if (k > V) continue;
        CUDA_OK(gpu::top_k_rows(dl.ptr, V, rows, k, ws.ptr, di.ptr, dv.ptr, nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::vector<int32_t> ids = di.to_host();
        const std::vector<float> vals = dv.to_host();
        for (int r = 0; r < rows; ++r) {
          const auto want = expected_top(std::vector<float>(l.begin() + static_cast<int64_t>(r) * V, l.begin() + static_cast<int64_t>(r + 1) * V), pen[r], k);
          for (int i = 0; i < k; ++i) {
            ASSERT_EQ(ids[r * k + i], want[i].first) << "V " << V << " rows " << rows << " row " << r << " k " << k << " rank " << i;
            ASSERT_EQ(vals[r * k + i], want[i].second) << "V " << V << " row " << r << " rank " << i;  // the host's penalty arithmetic, bit for bit
          }
        }
      }
    }
  }
  EXPECT_NE(gpu::top_k_rows(nullptr, 100, 1, 0, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_NE(gpu::top_k_rows(nullptr, 100, 1, gpu::kMaxTopK + 1, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
  EXPECT_NE(gpu::top_k_rows(nullptr, 100, 0, 1, nullptr, nullptr, nullptr, nullptr), cudaSuccess);
}

// forward_top on the whole model: the same candidates as the host selection on the logits forward()
// returns, and the same drawn ids, for greedy and a preset.
class GpuModelSampling : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuModelSampling, ForwardTopEqualsHostSelection) {
  TANDEM_REQUIRE_GPU();
  const auto f = test::load_fixture(GetParam());
  auto model = Qwen35Moe::load(f.dir);
  const int64_t V = f.vocab;
  GpuOptions g;
  g.max_context = 256;
  auto a = Qwen35MoeGpu::create(*model, g), b = Qwen35MoeGpu::create(*model, g);
  std::mt19937 rng(test::test_seed());
  for (bool greedy : {true, false}) {
    SamplingParams p = sampling_preset("instruct");
    if (greedy) p.temperature = 0.0f;
    p.seeded = true;
    p.seed = 11;
    Sampler host(p), device(p);
    const std::vector<int32_t> prompt(f.ids.begin(), f.ids.begin() + f.prefill);
    std::vector<int32_t> context = prompt, generated;
    std::vector<float> logits(V);
    std::vector<std::pair<int32_t, float>> top;
    a->reset();
    b->reset();
    a->forward(prompt, logits.data(), Qwen35Moe::LogitRows::Last);
    std::vector<gpu::Penalty> gp;
    auto penalties = [&] {
      gp.clear();
      for (const auto& q : device.penalties(context, generated)) gp.push_back({q.id, q.rep, q.sub});
      return std::span<const gpu::Penalty>(gp);
    };
    ASSERT_TRUE(b->forward_top(prompt, penalties(), device.candidates_needed(), top));
    for (int step = 0; step < 6; ++step) {
      const auto want = expected_top(logits, host.penalties(context, generated), device.candidates_needed());
      ASSERT_EQ(top.size(), want.size());
      for (size_t i = 0; i < top.size(); ++i) ASSERT_EQ(top[i].first, want[i].first) << f.name << " step " << step << " rank " << i;
      const int32_t x = host.sample(logits, context, generated), y = device.sample_top(top);
      ASSERT_EQ(x, y) << f.name << " step " << step;
      context.push_back(x);
      generated.push_back(x);
      a->forward(std::span(&x, 1), logits.data(), Qwen35Moe::LogitRows::Last);
      ASSERT_TRUE(b->forward_top(std::span(&x, 1), penalties(), device.candidates_needed(), top));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuModelSampling, ::testing::ValuesIn(test::fixture_names()));

}  // namespace
}  // namespace tandem
