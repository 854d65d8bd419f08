// An int8 / fp8 KV cache on the GPU (GpuOptions::kv_format): every fixture against the reference with
// the same format (Qwen35State::kv_format: its rows stored as the same codes), so what differs is
// the GPU's arithmetic, within the bf16 cache's bound against HF (2e-2 relative L2 at the median
// position; a coded row may differ by one code where the GPU's key rounds the other way, and a router at
// a near-tie then routes one expert differently, a discrete jump); the same argmax at decisive
// positions; the cache's bytes; a saved and restored sequence continuing bit for bit; batched prefill
// writing the same rows as token by token.
#include <algorithm>

#include "gpu_core/attention_sizes.h"
#include "placement/gpu_layout.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "runtime/format/npy.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

class GpuKvCache : public ::testing::TestWithParam<std::tuple<std::string, RowFormat>> {};


TEST_P(GpuKvCache, MatchesTheReferenceWithTheSameCache) {
  TANDEM_REQUIRE_GPU();
  const auto [name, kv] = GetParam();
  const auto f = test::load_fixture(name);
  auto model = Qwen35Moe::load(f.dir);
  GpuOptions g;
  g.max_context = 256;
  g.kv_format = kv;
  auto gpu = Qwen35MoeGpu::create(*model, g);
  EXPECT_EQ(gpu->memory().kv_cache, placement::kv_cache_bytes(model->config(), 256, kv) * model->config().num_full_attention_layers());
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  std::vector<float> got(n * V);
  gpu->forward(std::span(f.ids.data(), f.prefill), got.data());
  for (int64_t i = f.prefill; i < n; ++i) gpu->forward(std::span(f.ids.data() + i, 1), got.data() + i * V);
  const auto want = test::reference_logits(*model, f.ids, f.prefill, kv);
  const LogitsComparison cmp = compare_logits(got.data(), want.data(), n, V);
  std::vector<double> r = cmp.rel_l2;
  std::nth_element(r.begin(), r.begin() + n / 2, r.end());
  EXPECT_LT(r[n / 2], 2e-2) << name << " " << row_format_name(kv) << ": median relative L2";
  EXPECT_TRUE(cmp.argmax_misses.empty()) << name << " " << row_format_name(kv) << ": argmax differs at " << cmp.argmax_misses.size() << " of "
                                         << cmp.decisive << " decisive positions";
}

// A sequence saved after its prompt and restored into another slot continues with the same logits as
// the one that was never interrupted; prefill in chunks writes the rows token-by-token decode writes
// (the logits of the next step agree to the chunked kernels' rounding).
TEST_P(GpuKvCache, SavedSequencesAndChunkedPrefillKeepTheRows) {
  TANDEM_REQUIRE_GPU();
  const auto [name, kv] = GetParam();
  const auto f = test::load_fixture(name);
  auto model = Qwen35Moe::load(f.dir);
  const int64_t n = static_cast<int64_t>(f.ids.size()), V = f.vocab;
  GpuOptions g;
  g.max_context = 256;
  g.kv_format = kv;
  g.batch = 2;
  g.prefill_chunk = 16;
  g.prefill_chunk_max = 0;
  auto gpu = Qwen35MoeGpu::create(*model, g);
  GpuOptions t = g;
  t.batch = 1, t.prefill_chunk = 0;
  auto steps = Qwen35MoeGpu::create(*model, t);
  std::vector<float> a(V), b(V), c(V);
  gpu->select(0);
  gpu->forward(std::span(f.ids.data(), f.prefill), a.data(), Qwen35Moe::LogitRows::Last);  // the last row: in chunks
  steps->forward(std::span(f.ids.data(), f.prefill), c.data(), Qwen35Moe::LogitRows::Last);
  const Qwen35MoeGpu::SlotCopy saved = gpu->save_slot(0);
  gpu->load_slot(1, saved);
  for (int64_t i = f.prefill; i < n; ++i) {
    gpu->select(0);
    gpu->forward(std::span(f.ids.data() + i, 1), a.data());
    gpu->select(1);
    gpu->forward(std::span(f.ids.data() + i, 1), b.data());
    steps->forward(std::span(f.ids.data() + i, 1), c.data());
    ASSERT_EQ(a, b) << name << " " << row_format_name(kv) << " position " << i << ": the restored sequence";
    EXPECT_LT(compare_logits(a.data(), c.data(), 1, V).rel_l2[0], 5e-3) << name << " " << row_format_name(kv) << " position " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GpuKvCache,
                         ::testing::Combine(::testing::ValuesIn(test::fixture_names()), ::testing::Values(RowFormat::Int8, RowFormat::Fp8)),
                         [](const auto& info) { return std::get<0>(info.param) + "_" + row_format_name(std::get<1>(info.param)); });

}  // namespace
}  // namespace tandem
