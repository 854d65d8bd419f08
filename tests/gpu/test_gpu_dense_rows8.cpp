// Dense projections quantized on load (GpuOptions::dense, W8A16): the demo model's logits against HF's
// float32 reference within what the accuracy study measured for int8 and fp8 rows
// (bench/results/2026-12-03-dense-quant-accuracy-devbox.md: mean KL 4e-4 nats and 98% argmax for int8,
// 1.1e-2 and 90% for fp8), with margin; and half the projections' bytes on the device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "runtime/engine/runner.h"
#include "runtime/format/npy.h"
#include "runtime/models/qwen3_5_moe/gpu.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/batch_cases.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

TEST(GpuDenseRows8, TheDemoModelStaysCloseToItsReference) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("demo");
  auto model = Qwen35Moe::load(fx.dir);
  const NpyArray want = read_npy_f32(fx.dir + "/logits.npy");
  const int64_t V = fx.vocab, n = static_cast<int64_t>(fx.ids.size());
  uint64_t dense[4] = {}, per_token[4] = {};
  for (const int mode : {0, 1, 2, 3}) {  // bf16; int8 projections; and the lm_head; fp8 projections
    const bool q8 = mode > 0;
    GpuOptions g;
    g.max_context = 256;
    g.dense = mode == 3 ? RowFormat::Fp8 : q8 ? RowFormat::Int8 : RowFormat::Bf16;
    g.lm_head = mode == 2 ? RowFormat::Int8 : RowFormat::Bf16;
    auto gpu = Qwen35MoeGpu::create(*model, g);
    dense[mode] = gpu->memory().dense_weights;
    per_token[mode] = gpu->dense_bytes_per_token();
    std::vector<float> got(static_cast<size_t>(n * V));
    gpu->forward(std::span(fx.ids).first(static_cast<size_t>(fx.prefill)), got.data(), Qwen35Moe::LogitRows::All);
    for (int64_t t = fx.prefill; t < n; ++t) gpu->forward(std::span(fx.ids).subspan(static_cast<size_t>(t), 1), got.data() + t * V, Qwen35Moe::LogitRows::Last);
    double mean_kl = 0;
    int agree = 0;
    for (int64_t t = 0; t < n; ++t) {
      const float* w = want.data.data() + t * V;
      const float* q = got.data() + t * V;
      mean_kl += test::kl_nats(w, q, V) / static_cast<double>(n);
      agree += std::max_element(w, w + V) - w == std::max_element(q, q + V) - q;
    }
    EXPECT_LT(mean_kl, mode == 3 ? 3e-2 : mode == 2 ? 4e-3 : q8 ? 2e-3 : 1e-4) << "mode " << mode << " (0 bf16, 1 int8 projections, 2 and lm_head, 3 fp8)";
    EXPECT_GE(agree, n * (mode == 3 ? 0.85 : q8 ? 0.9 : 0.97)) << agree << " of " << n << " argmax agree";
  }
  EXPECT_LT(dense[1], dense[0]);  // the projections at 1 byte a weight (+ a scale a row) instead of 2
  EXPECT_LT(dense[2], dense[1]);
  EXPECT_EQ(dense[3], dense[1]);  // fp8 rows: int8's bytes
  // what a decode token reads (the bench's bound): bf16 as the checkpoint stores it (its norms in fp32
  // on the device: within 1%), then fewer bytes with each 8-bit choice
  const WeightBytes wb = model->weight_bytes();
  EXPECT_NEAR(static_cast<double>(per_token[0]) / static_cast<double>(wb.per_token_active - wb.routed_active), 1.0, 0.01);
  EXPECT_LT(per_token[1], per_token[0]);
  EXPECT_LT(per_token[2], per_token[1]);
  EXPECT_EQ(per_token[3], per_token[1]);
}

// Unit by unit (GpuOptions::mixer / shared, from a plan's rules): only the DeltaNet layers' projections
// as 8-bit rows (int8, and fp8 for the shared experts of the attention layers): fewer dense bytes than
// bf16, more than int8 everywhere.
TEST(GpuDenseRows8, LayersChosenOneByOne) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("demo");
  auto model = Qwen35Moe::load(fx.dir);
  const ModelConfig& c = model->config();
  auto dense_bytes = [&](int mode) {  // 0 bf16, 1 int8 everywhere, 2 the DeltaNet mixers and the attention layers' shared experts
    GpuOptions g;
    g.max_context = 256;
    g.dense = mode == 1 ? RowFormat::Int8 : RowFormat::Bf16;
    if (mode == 2) {
      for (int l = 0; l < c.num_layers; ++l) {
        const bool deltanet = c.layer_types[l] == LayerKind::LinearAttention;
        g.mixer.push_back(deltanet ? RowFormat::Int8 : RowFormat::Bf16);
        g.shared.push_back(deltanet ? RowFormat::Bf16 : RowFormat::Fp8);
      }
    }
    auto gpu = Qwen35MoeGpu::create(*model, g);
    std::vector<float> last(static_cast<size_t>(fx.vocab));
    gpu->forward(fx.ids, last.data(), Qwen35Moe::LogitRows::Last);
    EXPECT_TRUE(std::all_of(last.begin(), last.end(), [](float x) { return std::isfinite(x); })) << "mode " << mode;
    return gpu->memory().dense_weights;
  };
  const uint64_t bf16 = dense_bytes(0), all = dense_bytes(1), deltanet = dense_bytes(2);
  EXPECT_LT(deltanet, bf16);
  EXPECT_GT(deltanet, all);
}

// A batched step with 8-bit shared-expert projections (no x_proj stack beside the bf16 router: the shared
// expert's gate, up and gate logit go beside the routed experts on the side stream, as its down projection
// does): every sequence's rows as alone, within the batch tolerance (test_gpu_batch.cpp's 5e-3).
TEST(GpuDenseRows8, ABatchGivesEachSequenceItsRowsAlone) {
  TANDEM_REQUIRE_GPU();
  const test::Fixture fx = test::load_fixture("demo");
  auto model = Qwen35Moe::load(fx.dir);
  test::batch_equals_alone(
      [&](int batch, int64_t verify) {
        RunnerOptions o;
        o.device = Device::Gpu;
        o.context = 256;
        o.batch = batch;
        o.verify_tokens = verify;
        o.dense_format = "int8";
        return make_runner(*model, o);
      },
      fx.ids, fx.vocab, 5e-3);
}

}  // namespace
}  // namespace tandem
