// Experts quantized to int4 on load (core/quantize_int4.h), their disk cache (runtime/format/int4_cache.h)
// and the model running them (Qwen35Moe::quantize_experts_int4).
#include <chrono>
#include <filesystem>
#include <thread>

#include "core/dtype.h"
#include "core/quantize_int4.h"
#include "runtime/engine/logits_compare.h"
#include "runtime/engine/runner.h"
#include "runtime/format/int4_cache.h"
#include "runtime/format/npy.h"
#include "runtime/format/safetensors_writer.h"
#include "runtime/models/qwen3_5_moe/model.h"
#include "tests/unit/fixture_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

struct Quantized {
  std::vector<int32_t> qweight, qzeros;
  std::vector<uint16_t> scales;
  LinearWeight view;
};

Quantized quantize(const LinearWeight& src, int64_t group) {
  Quantized q;
  q.qweight.resize(src.in / 8 * src.out);
  q.qzeros.resize(src.in / group * src.out / 8);
  q.scales.resize(src.in / group * src.out);
  quantize_int4_gptq(src, group, q.qweight.data(), q.qzeros.data(), q.scales.data());
  q.view = int4_gptq_view(src.name, src.out, src.in, group, q.qweight.data(), q.qzeros.data(), q.scales.data());
  return q;
}

LinearWeight dense(const std::string& name, int64_t out, int64_t in, const void* data, DType t) {
  LinearWeight w;
  w.kind = LinearWeight::Kind::Dense;
  w.name = name, w.out = out, w.in = in, w.dense = data, w.dense_dtype = t;
  return w;
}

// The plain min/max quantization of one group (no clipping), as the header defines it for r = 1: the
// error the search must never exceed, and the step that bounds every weight's error there.
struct MinMax {
  double err = 0;
  float step = 0, lo = 0, hi = 0;  // the codes' range, [-z s, (15 - z) s]
  // The most a weight can be off: half a step inside the range, the distance to it outside (the
  // f16 step and the integer zero point can leave the extremes up to a step outside).
  double bound(float w) const { return 0.5 * step * (1 + 1e-6) + std::max({0.0f, lo - w, w - hi}); }
};
MinMax min_max(const float* w, int64_t n) {
  float mn = 0, mx = 0;
  for (int64_t k = 0; k < n; ++k) mn = std::min(mn, w[k]), mx = std::max(mx, w[k]);
  MinMax m;
  if (mn == 0 && mx == 0) return m;
  m.step = f16_to_f32(f32_to_f16((mx - mn) / 15.0f));
  const float z = std::clamp(std::nearbyint(-mn / m.step), 0.0f, 15.0f);
  m.lo = -z * m.step, m.hi = (15 - z) * m.step;
  for (int64_t k = 0; k < n; ++k) {
    const float c = std::clamp(std::nearbyint(w[k] / m.step) + z, 0.0f, 15.0f);
    const double d = static_cast<double>(w[k]) - static_cast<double>(m.step) * (c - z);
    m.err += d * d;
  }
  return m;
}

// A matrix whose every group is exactly representable (f16 scale, codes spanning 0..15 around an
// integer zero point) comes back bit for bit through the GPTQ reading of the tensors.
TEST(QuantizeInt4, RepresentableMatrixRoundTripsExactly) {
  std::mt19937 rng(test::test_seed());
  const int64_t N = 24, K = 256, group = 128;
  std::vector<float> w(N * K);
  std::uniform_int_distribution<int> code(0, 15), zero(1, 14);
  std::uniform_real_distribution<float> scale(1e-3f, 1e-1f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t g = 0; g < K / group; ++g) {
      const float s = f16_to_f32(f32_to_f16(scale(rng)));
      const int z = zero(rng);
      for (int64_t k = 0; k < group; ++k) {
        const int c = k == 0 ? 0 : k == 1 ? 15 : code(rng);
        w[n * K + g * group + k] = s * static_cast<float>(c - z);
      }
    }
  const LinearWeight src = dense("m", N, K, w.data(), DType::F32);
  const Quantized q = quantize(src, group);
  std::vector<float> row(K);
  for (int64_t n = 0; n < N; ++n) {
    q.view.dequant_row(n, row.data());
    for (int64_t k = 0; k < K; ++k) ASSERT_EQ(row[k], w[n * K + k]) << "row " << n << " input " << k;
  }
}

// On random weights (normal, with outliers, as bf16): each group's error is at most plain min/max
// quantization's, and where no clipping was chosen every weight is within MinMax::bound.
TEST(QuantizeInt4, NoGroupIsWorseThanMinMax) {
  std::mt19937 rng(test::test_seed());
  for (const int64_t group : {128, 64, 32}) {
    const int64_t N = 64, K = 512;
    std::vector<float> f = test::random_floats(rng, N * K, 0.02f);
    std::uniform_int_distribution<int64_t> pick(0, N * K - 1);
    for (int i = 0; i < 40; ++i) f[pick(rng)] *= 12.0f;  // outliers: where clipping pays
    for (int64_t n = 0; n < 8; ++n) std::fill_n(f.begin() + n * K, group, 0.0f);  // zero groups
    std::vector<uint16_t> b(N * K);
    for (size_t i = 0; i < f.size(); ++i) b[i] = f32_to_bf16(f[i]), f[i] = bf16_to_f32(b[i]);
    const Quantized q = quantize(dense("m", N, K, b.data(), DType::BF16), group);
    std::vector<float> row(K);
    int clipped = 0;
    for (int64_t n = 0; n < N; ++n) {
      q.view.dequant_row(n, row.data());
      for (int64_t g = 0; g < K / group; ++g) {
        const float* w = f.data() + n * K + g * group;
        const MinMax m = min_max(w, group);
        double err = 0, worst = 0;  // worst: the largest error over its bound
        for (int64_t k = 0; k < group; ++k) {
          const double d = std::fabs(static_cast<double>(w[k]) - row[g * group + k]);
          err += d * d, worst = std::max(worst, d - m.bound(w[k]));
        }
        // the search sums its errors in fp32: a clipping may win there by less than that sum's rounding
        ASSERT_LE(err, m.err * (1 + 1e-5) + 1e-30) << "group " << group << " row " << n << " group " << g;
        // Which choice it made is in its stored scale (every clipping spans at least 2.5% less than min /
        // max, far more than an f16 step): telling them apart by the error alone missed near-ties.
        if (f16_to_f32(q.scales[g * N + n]) != m.step) {
          ++clipped;
        } else {
          EXPECT_LE(worst, 0.0) << "group " << group << " row " << n << " group " << g;
        }
        if (m.step == 0) {
          EXPECT_EQ(err, 0.0);
        }
      }
    }
    EXPECT_GT(clipped, 0) << "group " << group << ": clipping never helped, even with outliers";
  }
}

TEST(QuantizeInt4, GroupsAndRefusals) {
  EXPECT_EQ(int4_group_for(2048), 128);
  EXPECT_EQ(int4_group_for(192), 64);
  EXPECT_EQ(int4_group_for(96), 32);
  EXPECT_EQ(int4_group_for(48), 0);
  std::vector<uint16_t> b(12 * 128);
  std::vector<int32_t> qw(16 * 12), qz(12);
  test::expect_error([&] { quantize_int4_gptq(dense("layers.0.x", 12, 128, b.data(), DType::BF16), 128, qw.data(), qz.data(), nullptr); },
                     {"layers.0.x", "12x128", "multiples of 8"});
  // A hostile checkpoint: NaN, inf or a weight beyond any f16 scale is an error naming where it is.
  std::vector<float> f(8 * 128, 0.01f);
  std::vector<uint16_t> sc(8);
  for (const float bad : {NAN, INFINITY, 1e30f}) {
    f[3 * 128 + 77] = bad;
    test::expect_error([&] { quantize_int4_gptq(dense("layers.1.y", 8, 128, f.data(), DType::F32), 128, qw.data(), qz.data(), sc.data()); },
                       {"layers.1.y", "row 3 input 77", "cannot represent"});
  }
}

// The cache: built once, then read; a changed checkpoint or an unfinished folder builds anew; a root
// that cannot be made is an error naming it and the flag.
TEST(Int4Cache, BuildsOnceAndRebuildsWhenTheCheckpointChanges) {
  std::mt19937 rng(test::test_seed());
  test::TempDir model, root;
  const int64_t N = 32, K = 256;
  std::vector<uint16_t> b(N * K);
  const std::vector<float> f = test::random_floats(rng, b.size(), 0.05f);
  for (size_t i = 0; i < b.size(); ++i) b[i] = f32_to_bf16(f[i]);
  SafetensorsWriter wr;
  wr.add("x", DType::BF16, {N, K}, b.data(), b.size() * 2);
  wr.write(model.file("model.safetensors"));
  const LinearWeight a = dense("layers.0.mlp.experts.0.gate_proj", N, K, b.data(), DType::BF16);
  const LinearWeight c = dense("layers.0.mlp.experts.0.down_proj", N, K / 2, b.data(), DType::BF16);

  EXPECT_EQ(default_int4_cache_root(model.str()), model.str() + "/.tandem-cache");  // beside the checkpoint where it can be written
  const Int4Cache first = open_int4_cache(model.str(), root.str(), {&a, &c}, 128, nullptr);
  EXPECT_TRUE(first.built);
  const Int4Cache again = open_int4_cache(model.str(), root.str(), {&a, &c}, 128, nullptr);
  EXPECT_FALSE(again.built);
  EXPECT_EQ(again.dir, first.dir);
  EXPECT_EQ(again.bytes, first.bytes);
  const Quantized direct = quantize(a, 128), direct_c = quantize(c, 128);
  std::vector<float> r1(K), r2(K);
  for (int64_t n = 0; n < N; ++n) {
    again.view(a.name, N, K).dequant_row(n, r1.data());
    direct.view.dequant_row(n, r2.data());
    ASSERT_EQ(r1, r2) << "row " << n;
    again.view(c.name, N, K / 2).dequant_row(n, r1.data());
    direct_c.view.dequant_row(n, r2.data());
    ASSERT_TRUE(std::equal(r1.begin(), r1.begin() + K / 2, r2.begin())) << "row " << n;
  }

  // An unfinished folder of the same key (no stamp) is rebuilt, not read.
  fs::remove(fs::path(first.dir) / "tandem-int4.json");
  EXPECT_TRUE(open_int4_cache(model.str(), root.str(), {&a, &c}, 128, nullptr).built);
  // A damaged cache (a file cut short, a tensor missing) is quantized again, not read.
  const std::string st = (fs::path(first.dir) / "model.safetensors").string();
  fs::resize_file(st, fs::file_size(st) / 2);
  const Int4Cache repaired = open_int4_cache(model.str(), root.str(), {&a, &c}, 128, nullptr);
  EXPECT_TRUE(repaired.built);
  EXPECT_EQ(repaired.bytes, first.bytes);
  EXPECT_TRUE(open_int4_cache(model.str(), root.str(), {&a}, 128, nullptr).built);  // another set of matrices: another key
  // A changed checkpoint file is a new key.
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  wr.add("y", DType::BF16, {1, 8}, b.data(), 16);
  wr.write(model.file("model.safetensors"));
  const Int4Cache changed = open_int4_cache(model.str(), root.str(), {&a, &c}, 128, nullptr);
  EXPECT_TRUE(changed.built);
  EXPECT_NE(changed.dir, first.dir);
  EXPECT_FALSE(fs::exists(first.dir)) << "the cache of the checkpoint as it was is removed";
  EXPECT_TRUE(fs::exists(changed.dir));
  // Nothing left half-made under the root.
  for (const auto& e : fs::directory_iterator(root.str())) EXPECT_EQ(e.path().string().find(".partial"), std::string::npos) << e.path();

  test::expect_error([&] { open_int4_cache(model.str(), model.file("model.safetensors") + "/cache", {&a}, 128, nullptr); },
                     {"model.safetensors/cache", "--quant-cache"});
  const LinearWeight odd = dense("layers.1.mlp.experts.3.up_proj", N, 48, b.data(), DType::BF16);
  test::expect_error([&] { open_int4_cache(model.str(), root.str(), {&odd}, 32, nullptr); },
                     {"layers.1.mlp.experts.3.up_proj", "32x48", "groups of 32"});
  EXPECT_EQ(int4_expert_group(2048, 512), 128);
  EXPECT_EQ(int4_expert_group(128, 64), 64);  // the demo model: gate, up and down alike
  EXPECT_EQ(int4_expert_group(48, 32), 0);
}

// The trained demo model (BF16, with its MTP head) with every expert quantized on load: the GPTQ
// paths run it (the CPU's kernels within their int4 tolerance of the reference over the same
// weights), and its logits stay near the BF16 model's (the accuracy price, bounded loosely here; the
// measured figures are in docs/usage.md).
TEST(QuantizeOnLoad, TheDemoModelRunsItsExpertsAsInt4) {
  const test::Fixture fx = test::load_fixture("demo");
  test::TempDir root;
  auto bf16 = Qwen35Moe::load(fx.dir), q = Qwen35Moe::load(fx.dir);
  ASSERT_FALSE(q->gptq_experts());
  const std::string line = q->quantize_experts_int4(root.str(), nullptr);
  EXPECT_NE(line.find("routed experts and the MTP head's as int4"), std::string::npos) << line;
  EXPECT_TRUE(q->gptq_experts());
  EXPECT_TRUE(q->experts_quantized_on_load());
  EXPECT_EQ(q->mtp()->layer.moe.gate[0].kind, LinearWeight::Kind::Gptq);
  EXPECT_NE(q->layout_description().find("quantized on load to int4 (asym, group 64)"), std::string::npos)
      << q->layout_description();
  EXPECT_EQ(q->quantize_experts_int4(root.str(), nullptr), "");  // once
  EXPECT_LT(q->weight_bytes().routed_experts * 3, bf16->weight_bytes().routed_experts);

  const int64_t n = std::min<int64_t>(static_cast<int64_t>(fx.ids.size()), 24), V = fx.vocab;
  const std::span<const int32_t> ids(fx.ids.data(), n);
  auto logits = [&](const Qwen35Moe& m, Device d) {
    RunnerOptions o;
    o.device = d;
    o.threads = 2;
    auto r = make_runner(m, o);
    std::vector<float> out(n * V);
    r->forward(ids, out.data(), Qwen35Moe::LogitRows::All);
    return out;
  };
  const auto ref = logits(*q, Device::Ref), cpu = logits(*q, Device::Cpu), exact = logits(*bf16, Device::Ref);
  const LogitsComparison kernels = compare_logits(cpu.data(), ref.data(), n, V), price = compare_logits(ref.data(), exact.data(), n, V);
  for (int64_t t = 0; t < n; ++t) EXPECT_LT(kernels.rel_l2[t], 3e-2) << "position " << t;
  // The price: ~10% relative error per weight gives 2-25% on most positions' logits; a position whose
  // router flips an expert moves more (one of the 24 reaches 0.98), so the median is what is bounded.
  std::vector<double> rel = price.rel_l2;
  std::nth_element(rel.begin(), rel.begin() + n / 2, rel.end());
  EXPECT_LT(rel[n / 2], 0.2);
  EXPECT_GT(price.decisive, 0);
  EXPECT_LE(static_cast<int64_t>(price.argmax_misses.size()) * 4, price.decisive)
      << "int4 experts changed the argmax at " << price.argmax_misses.size() << " of " << price.decisive << " decisive positions";
}

}  // namespace
}  // namespace tandem
