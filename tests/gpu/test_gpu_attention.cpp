// GPU gated-attention decode against the reference ops: q/k norm, partial RoPE, cache append,
// softmax attention over the whole context (several splits), output gate. The reference reads the
// same bf16-rounded K/V rows the GPU cache holds, so the bound is fp32 rounding (2e-5).
#include <cmath>

#include "gpu_core/attention.cuh"
#include "gpu_core/attention_sizes.h"
#include "core/dtype.h"
#include "runtime/models/qwen3_5_moe/ops_ref.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct AttnCase {
  int nh, nkv, hd, rot, start_pos, steps;
};

class GpuAttention : public ::testing::TestWithParam<AttnCase> {};

float bf16_round(float x) { return bf16_to_f32(f32_to_bf16(x)); }

// The scoring blocks are one per KV head for hd 128 / 256 in groups of 4 / 8, one per query head
// otherwise (the cases below have both).
void decode_vs_reference(const AttnCase& c) {
  std::mt19937 rng(test::test_seed());
  const int max_ctx = c.start_pos + c.steps + 3, row = c.nkv * c.hd;
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  // Context before start_pos: random rows already in the cache (bf16), mirrored on the host.
  std::vector<float> kc(int64_t(max_ctx) * row, 0.0f), vc(int64_t(max_ctx) * row, 0.0f);
  std::vector<uint16_t> kc16(kc.size(), 0), vc16(vc.size(), 0);
  for (int64_t i = 0; i < int64_t(c.start_pos) * row; ++i) {
    kc16[i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
    vc16[i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
    kc[i] = bf16_to_f32(kc16[i]);
    vc[i] = bf16_to_f32(vc16[i]);
  }
  const int splits_max = 64;
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(c.nh * 2 * c.hd), dk(row), dv(row);
  test::DeviceBuffer<float> dqr(c.nh * c.hd), dpart(int64_t(c.nh) * splits_max * (c.hd + 2)), dout(c.nh * c.hd);
  test::DeviceBuffer<uint16_t> dkc(kc16), dvc(vc16);
  test::DeviceBuffer<int32_t> dpos(1);
  gpu::AttentionDecodeArgs p;
  p.qg = dqg.ptr, p.k = dk.ptr, p.v = dv.ptr, p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.pos = dpos.ptr;
  p.k_cache = dkc.ptr, p.v_cache = dvc.ptr, p.q_rot = dqr.ptr, p.partial = dpart.ptr, p.out = dout.ptr;
  p.nh = c.nh, p.nkv = c.nkv, p.hd = c.hd, p.rotary_dim = c.rot, p.max_ctx = max_ctx, p.max_splits = splits_max;
  p.scale = 1.0f / std::sqrt(float(c.hd));

  for (int step = 0; step < c.steps; ++step) {
    const int pos = c.start_pos + step;
    const auto qg = test::random_floats(rng, c.nh * 2 * c.hd), k = test::random_floats(rng, row), v = test::random_floats(rng, row);
    CUDA_OK(cudaMemcpy(dqg.ptr, qg.data(), qg.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dk.ptr, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv.ptr, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos.ptr, &pos, 4, cudaMemcpyHostToDevice));
    CUDA_OK(gpu::attention_decode(p, nullptr));

    // The appended cache row: within one bf16 rounding step of the reference (rsqrtf may tip a
    // rounding); the attention check below then uses the GPU's own rows.
    CUDA_OK(cudaDeviceSynchronize());
    const auto gk = dkc.to_host(), gv = dvc.to_host();
    for (int j = 0; j < c.nkv; ++j) {
      std::vector<float> kh(k.begin() + j * c.hd, k.begin() + (j + 1) * c.hd);
      ref::rmsnorm_zc(kh.data(), k_norm.data(), c.hd, 1e-6f, kh.data());
      ref::rope_neox(kh.data(), c.rot, inv.data(), pos);
      for (int i = 0; i < c.hd; ++i) {
        const int64_t at = int64_t(pos) * row + j * c.hd + i;
        ASSERT_NEAR(bf16_to_f32(gk[at]), bf16_round(kh[i]), std::abs(kh[i]) * 0.008f + 1e-6f) << "k at " << at;
        ASSERT_EQ(bf16_to_f32(gv[at]), bf16_round(v[j * c.hd + i])) << "v at " << at;
        kc[at] = bf16_to_f32(gk[at]);
        vc[at] = bf16_to_f32(gv[at]);
      }
    }
    std::vector<float> want(c.nh * c.hd), q(c.hd), scores(pos + 1);
    for (int h = 0; h < c.nh; ++h) {
      ref::rmsnorm_zc(qg.data() + h * 2 * c.hd, q_norm.data(), c.hd, 1e-6f, q.data());
      ref::rope_neox(q.data(), c.rot, inv.data(), pos);
      const int kvh = h / (c.nh / c.nkv);
      ref::attend(q.data(), kc.data() + kvh * c.hd, vc.data() + kvh * c.hd, pos + 1, row, c.hd, p.scale, scores.data(),
                  want.data() + h * c.hd);
      for (int i = 0; i < c.hd; ++i) want[h * c.hd + i] *= ref::sigmoid(qg[h * 2 * c.hd + c.hd + i]);
    }
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = dout.to_host();
    EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), std::vector<double>(want.begin(), want.end())), 2e-5)
        << "pos " << pos << " seed " << test::test_seed();
  }
}

TEST_P(GpuAttention, DecodeMatchesReference) {
  TANDEM_REQUIRE_GPU();
  decode_vs_reference(GetParam());
}

// attention_prefill (a chunk of tokens in one call) against attention_decode run token by token on the
// same inputs: the caches end up bit-identical (the same prepare kernel) and the outputs agree within
// tol. start_pos rows of random context come first.
void prefill_vs_decode_steps(const AttnCase& c, int n, double tol) {
  std::mt19937 rng(test::test_seed() + 3);
  const int max_ctx = c.start_pos + n + 3, row = c.nkv * c.hd;
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  std::vector<uint16_t> kc0(int64_t(max_ctx) * row, 0), vc0(kc0.size(), 0);
  for (int64_t i = 0; i < int64_t(c.start_pos) * row; ++i) {
    kc0[i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
    vc0[i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
  }
  const auto qg = test::random_floats(rng, n * c.nh * 2 * c.hd), k = test::random_floats(rng, n * row),
             v = test::random_floats(rng, n * row);
  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = c.start_pos + t;
  const int splits_max = 64;
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(qg), dk(k), dv(v);
  test::DeviceBuffer<float> dqr(int64_t(n) * c.nh * c.hd), dpart(int64_t(c.nh) * splits_max * (c.hd + 2));
  test::DeviceBuffer<float> dstep(int64_t(n) * c.nh * c.hd), dchunk(int64_t(n) * c.nh * c.hd);
  test::DeviceBuffer<uint16_t> kc_a(kc0), vc_a(vc0), kc_b(kc0), vc_b(vc0);
  test::DeviceBuffer<int32_t> dpos(pos);
  gpu::AttentionDecodeArgs p;
  p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.partial = dpart.ptr;
  p.nh = c.nh, p.nkv = c.nkv, p.hd = c.hd, p.rotary_dim = c.rot, p.max_ctx = max_ctx, p.max_splits = splits_max;
  p.scale = 1.0f / std::sqrt(float(c.hd));
  for (int t = 0; t < n; ++t) {  // token by token through the decode kernels
    gpu::AttentionDecodeArgs s = p;
    s.qg = dqg.ptr + int64_t(t) * c.nh * 2 * c.hd, s.k = dk.ptr + int64_t(t) * row, s.v = dv.ptr + int64_t(t) * row;
    s.pos = dpos.ptr + t, s.k_cache = kc_a.ptr, s.v_cache = vc_a.ptr, s.q_rot = dqr.ptr, s.out = dstep.ptr + int64_t(t) * c.nh * c.hd;
    CUDA_OK(gpu::attention_decode(s, nullptr));
  }
  p.qg = dqg.ptr, p.k = dk.ptr, p.v = dv.ptr, p.pos = dpos.ptr, p.k_cache = kc_b.ptr, p.v_cache = vc_b.ptr;
  p.q_rot = dchunk.ptr, p.out = dchunk.ptr;  // q_rot may alias out (the model does this)
  CUDA_OK(gpu::attention_prefill(p, n, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(kc_a.to_host(), kc_b.to_host());
  EXPECT_EQ(vc_a.to_host(), vc_b.to_host());
  const auto a = dstep.to_host(), b = dchunk.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(b.begin(), b.end()), std::vector<double>(a.begin(), a.end())), tol)
      << n << " tokens from " << c.start_pos << ", seed " << test::test_seed();
}

// Tensor cores: queries and softmax weights rounded to bf16 (relative 2^-9 each), so ~3e-3; the chunk
// spans more than one 64-query block and ends inside one.
TEST_P(GpuAttention, PrefillMatchesDecodeSteps) {
  TANDEM_REQUIRE_GPU();
  const AttnCase c = GetParam();
  prefill_vs_decode_steps(c, c.steps * 25 + 7, 1e-2);
}

// Head sizes the prefill kernel is not built for are refused (the GPU model prefills those token by token).
TEST(GpuAttentionPrefill, RefusesOtherHeadSizes) {
  TANDEM_REQUIRE_GPU();
  for (const int hd : {16, 32, 64, 128, 256}) EXPECT_TRUE(gpu::attention_prefill_fits(hd)) << hd;
  EXPECT_FALSE(gpu::attention_prefill_fits(48));
  gpu::AttentionDecodeArgs p;
  p.nh = 4, p.nkv = 2, p.hd = 48, p.rotary_dim = 16, p.max_ctx = 8;
  EXPECT_EQ(gpu::attention_prefill(p, 4, nullptr), cudaErrorInvalidValue);
}

// A batched decode step: tokens of several sequences (slots, each with its own cache and context
// length), two of them consecutive positions of one sequence (a verification step), in one call,
// against one single-token call per token in order: caches and outputs bit for bit.
TEST_P(GpuAttention, BatchedDecodeEqualsTokenByToken) {
  TANDEM_REQUIRE_GPU();
  const AttnCase c = GetParam();
  std::mt19937 rng(test::test_seed() + 5);
  const int row = c.nkv * c.hd, slots = 3, n = 4;
  const std::vector<int32_t> slot = {0, 1, 2, 2}, pos = {c.start_pos, c.start_pos + 70, c.start_pos + 130, c.start_pos + 131};
  const int max_ctx = c.start_pos + 140;
  const int64_t stride = int64_t(max_ctx) * row + 64;
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  std::vector<uint16_t> kc0(slots * stride, 0), vc0(kc0.size(), 0);
  for (int s = 0; s < slots; ++s)
    for (int64_t i = 0; i < int64_t(pos[s]) * row; ++i) {  // each slot's context before its first token
      kc0[s * stride + i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
      vc0[s * stride + i] = f32_to_bf16(std::normal_distribution<float>(0, 1)(rng));
    }
  const auto qg = test::random_floats(rng, n * c.nh * 2 * c.hd), k = test::random_floats(rng, n * row), v = test::random_floats(rng, n * row);
  const int splits_max = static_cast<int>(gpu::attention_decode_splits(max_ctx));
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(qg), dk(k), dv(v);
  test::DeviceBuffer<float> dqr(int64_t(n) * c.nh * c.hd), dpart(int64_t(n) * c.nh * splits_max * (c.hd + 2));
  test::DeviceBuffer<float> dstep(int64_t(n) * c.nh * c.hd), dbatch(int64_t(n) * c.nh * c.hd);
  test::DeviceBuffer<uint16_t> kc_a(kc0), vc_a(vc0), kc_b(kc0), vc_b(vc0);
  test::DeviceBuffer<int32_t> dpos(pos), dslot(slot);
  gpu::AttentionDecodeArgs p;
  p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.partial = dpart.ptr;
  p.nh = c.nh, p.nkv = c.nkv, p.hd = c.hd, p.rotary_dim = c.rot, p.max_ctx = max_ctx, p.max_splits = splits_max;
  p.scale = 1.0f / std::sqrt(float(c.hd));
  for (int t = 0; t < n; ++t) {
    gpu::AttentionDecodeArgs s = p;
    s.qg = dqg.ptr + int64_t(t) * c.nh * 2 * c.hd, s.k = dk.ptr + int64_t(t) * row, s.v = dv.ptr + int64_t(t) * row;
    s.pos = dpos.ptr + t, s.k_cache = kc_a.ptr + slot[t] * stride, s.v_cache = vc_a.ptr + slot[t] * stride;
    s.q_rot = dqr.ptr, s.out = dstep.ptr + int64_t(t) * c.nh * c.hd;
    CUDA_OK(gpu::attention_decode(s, nullptr));
  }
  p.qg = dqg.ptr, p.k = dk.ptr, p.v = dv.ptr, p.pos = dpos.ptr, p.k_cache = kc_b.ptr, p.v_cache = vc_b.ptr;
  p.q_rot = dbatch.ptr, p.out = dbatch.ptr;  // q_rot may alias out (the model does this)
  p.tokens = n, p.slot = dslot.ptr, p.cache_stride = stride;
  CUDA_OK(gpu::attention_decode(p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(kc_b.to_host(), kc_a.to_host());
  EXPECT_EQ(vc_b.to_host(), vc_a.to_host());
  EXPECT_EQ(dbatch.to_host(), dstep.to_host()) << "seed " << test::test_seed();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Values(AttnCase{16, 2, 256, 64, 0, 4},     // 35B: first tokens
                                           AttnCase{16, 2, 256, 64, 700, 2},   // 35B: several splits of context
                                           AttnCase{8, 2, 128, 32, 129, 3},    // hd 128, groups of 4: a split of one row, then two
                                           AttnCase{16, 2, 128, 64, 200, 2},   // hd 128, groups of 8
                                           AttnCase{8, 2, 256, 64, 62, 3},     // hd 256, groups of 4: a split ends at 64
                                           AttnCase{4, 1, 64, 64, 63, 2},      // hd 64: the per-query-head blocks
                                           AttnCase{8, 2, 32, 8, 0, 5},        // fixture bf16_fused
                                           AttnCase{4, 4, 16, 4, 300, 2}));    // GQA 1, odd sizes

}  // namespace
}  // namespace tandem
