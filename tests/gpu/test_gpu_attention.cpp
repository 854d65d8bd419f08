// GPU gated-attention decode against the reference ops: q/k norm, partial RoPE, cache append,
// softmax attention over the whole context (several splits), output gate, for every KV cache format.
// The reference reads the rows the GPU cache holds (bf16 values, or int8 / fp8 codes times their row's
// scale), so the bound is fp32 rounding (2e-5).
#include <algorithm>
#include <cmath>
#include <tuple>

#include "gpu_core/attention.cuh"
#include "gpu_core/attention_sizes.h"
#include "gpu_core/device.cuh"
#include "core/dtype.h"
#include "core/row_format.h"
#include "runtime/models/qwen3_5_moe/ops_ref.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct AttnCase {
  int nh, nkv, hd, rot, start_pos, steps;
};

class GpuAttention : public ::testing::TestWithParam<std::tuple<AttnCase, RowFormat>> {};

// A cache in the GPU's layout (attention.cuh) on the host: rows written from floats as the prepare
// kernel writes them, values read back as the kernels read them (times the row's scale).
struct HostCache {
  RowFormat f;
  int nkv, hd;
  int64_t rb;
  std::vector<uint8_t> bytes;
  HostCache(RowFormat f_, int nkv_, int hd_, int64_t rows, int64_t extra = 0)
      : f(f_), nkv(nkv_), hd(hd_), rb(gpu::kv_row_bytes(f_, nkv_, hd_)), bytes(static_cast<size_t>(rows * rb + extra), 0) {}
  void set(int64_t at, int64_t pos, int kvh, const float* x) {
    uint8_t* row = bytes.data() + at + pos * rb;
    if (f == RowFormat::Bf16) {
      for (int i = 0; i < hd; ++i) reinterpret_cast<uint16_t*>(row)[kvh * hd + i] = f32_to_bf16(x[i]);
      return;
    }
    reinterpret_cast<float*>(row + gpu::kv_codes_bytes(nkv, hd))[kvh] = quantize_row(x, hd, f, row + int64_t(kvh) * hd);
  }
  static float value_in(const std::vector<uint8_t>& b, RowFormat f, int nkv, int hd, int64_t rb, int64_t at, int64_t pos, int kvh, int i) {
    const uint8_t* row = b.data() + at + pos * rb;
    if (f == RowFormat::Bf16) return bf16_to_f32(reinterpret_cast<const uint16_t*>(row)[kvh * hd + i]);
    return row_decode(row[int64_t(kvh) * hd + i], f) * reinterpret_cast<const float*>(row + gpu::kv_codes_bytes(nkv, hd))[kvh];
  }
  float value(const std::vector<uint8_t>& b, int64_t at, int64_t pos, int kvh, int i) const { return value_in(b, f, nkv, hd, rb, at, pos, kvh, i); }
  // Random N(0, 1) rows 0..rows-1 of the cache at byte `at`.
  void fill(std::mt19937& rng, int64_t at, int64_t rows) {
    std::vector<float> x(hd);
    for (int64_t r = 0; r < rows; ++r)
      for (int j = 0; j < nkv; ++j) {
        for (float& e : x) e = std::normal_distribution<float>(0, 1)(rng);
        set(at, r, j, x.data());
      }
  }
};

// The scoring blocks are one per KV head for hd 128 / 256 in groups of 4 / 8, one per query head
// otherwise (the cases below have both).
void decode_vs_reference(const AttnCase& c, RowFormat f) {
  std::mt19937 rng(test::test_seed());
  const int max_ctx = c.start_pos + c.steps + 3, row = c.nkv * c.hd;
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  // Context before start_pos: random rows already in the cache, mirrored on the host as values.
  HostCache kh0(f, c.nkv, c.hd, max_ctx), vh0(f, c.nkv, c.hd, max_ctx);
  kh0.fill(rng, 0, c.start_pos), vh0.fill(rng, 0, c.start_pos);
  std::vector<float> kc(int64_t(max_ctx) * row, 0.0f), vc(int64_t(max_ctx) * row, 0.0f);
  for (int64_t r = 0; r < c.start_pos; ++r)
    for (int j = 0; j < c.nkv; ++j)
      for (int i = 0; i < c.hd; ++i) kc[r * row + j * c.hd + i] = kh0.value(kh0.bytes, 0, r, j, i), vc[r * row + j * c.hd + i] = vh0.value(vh0.bytes, 0, r, j, i);
  const int splits_max = 64;
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(c.nh * 2 * c.hd), dk(row), dv(row);
  test::DeviceBuffer<float> dqr(c.nh * c.hd), dpart(int64_t(c.nh) * splits_max * (c.hd + 2)), dout(c.nh * c.hd);
  test::DeviceBuffer<uint8_t> dkc(kh0.bytes), dvc(vh0.bytes);
  test::DeviceBuffer<int32_t> dpos(1);
  gpu::AttentionDecodeArgs p;
  p.qg = dqg.ptr, p.k = dk.ptr, p.v = dv.ptr, p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.pos = dpos.ptr;
  p.k_cache = dkc.ptr, p.v_cache = dvc.ptr, p.kv = f, p.q_rot = dqr.ptr, p.partial = dpart.ptr, p.out = dout.ptr;
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

    // The appended cache row: the key within one step of the format of the reference's rounding
    // (rsqrtf may tip a rounding), the value exactly (it is stored as it comes); the attention check
    // below then uses the GPU's own rows.
    CUDA_OK(cudaDeviceSynchronize());
    const auto gk = dkc.to_host(), gv = dvc.to_host();
    for (int j = 0; j < c.nkv; ++j) {
      std::vector<float> kh(k.begin() + j * c.hd, k.begin() + (j + 1) * c.hd), vr(v.begin() + j * c.hd, v.begin() + (j + 1) * c.hd);
      ref::rmsnorm_zc(kh.data(), k_norm.data(), c.hd, 1e-6f, kh.data());
      ref::rope_neox(kh.data(), c.rot, inv.data(), pos);
      float amax = 0.0f;
      for (float x : kh) amax = std::max(amax, std::abs(x));
      std::vector<float> kr = kh;
      test::round_row(kr.data(), c.hd, f);
      test::round_row(vr.data(), c.hd, f);
      for (int i = 0; i < c.hd; ++i) {
        const float got_k = kh0.value(gk, 0, pos, j, i), got_v = vh0.value(gv, 0, pos, j, i);
        const float step_k = f == RowFormat::Bf16 ? std::abs(kh[i]) * 0.008f + 1e-6f
                             : f == RowFormat::Int8 ? amax / 127 * 1.01f + 1e-6f
                                                   : std::max(std::abs(kr[i]), std::abs(got_k)) / 8 + amax / 448 / 512 + 1e-6f;
        ASSERT_NEAR(got_k, kr[i], step_k) << "k of head " << j << " at " << i << " (" << row_format_name(f) << ")";
        ASSERT_EQ(got_v, vr[i]) << "v of head " << j << " at " << i << " (" << row_format_name(f) << ")";
        kc[int64_t(pos) * row + j * c.hd + i] = got_k;
        vc[int64_t(pos) * row + j * c.hd + i] = got_v;
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
        << "pos " << pos << " " << row_format_name(f) << " seed " << test::test_seed();
  }
}

TEST_P(GpuAttention, DecodeMatchesReference) {
  TANDEM_REQUIRE_GPU();
  decode_vs_reference(std::get<0>(GetParam()), std::get<1>(GetParam()));
}

// attention_prefill (a chunk of tokens in one call) against attention_decode run token by token on the
// same inputs: the caches end up bit-identical (the same prepare kernel) and the outputs agree within
// tol. start_pos rows of random context come first.
void prefill_vs_decode_steps(const AttnCase& c, RowFormat f, int n, double tol) {
  std::mt19937 rng(test::test_seed() + 3);
  const int max_ctx = c.start_pos + n + 3, row = c.nkv * c.hd;
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  HostCache kc0(f, c.nkv, c.hd, max_ctx), vc0(f, c.nkv, c.hd, max_ctx);
  kc0.fill(rng, 0, c.start_pos), vc0.fill(rng, 0, c.start_pos);
  const auto qg = test::random_floats(rng, n * c.nh * 2 * c.hd), k = test::random_floats(rng, n * row),
             v = test::random_floats(rng, n * row);
  std::vector<int32_t> pos(n);
  for (int t = 0; t < n; ++t) pos[t] = c.start_pos + t;
  const int splits_max = 64;
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(qg), dk(k), dv(v);
  test::DeviceBuffer<float> dqr(int64_t(n) * c.nh * c.hd), dpart(int64_t(c.nh) * splits_max * (c.hd + 2));
  test::DeviceBuffer<float> dstep(int64_t(n) * c.nh * c.hd), dchunk(int64_t(n) * c.nh * c.hd);
  test::DeviceBuffer<uint8_t> kc_a(kc0.bytes), vc_a(vc0.bytes), kc_b(kc0.bytes), vc_b(vc0.bytes);
  test::DeviceBuffer<int32_t> dpos(pos);
  gpu::AttentionDecodeArgs p;
  p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.partial = dpart.ptr, p.kv = f;
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
      << n << " tokens from " << c.start_pos << " (" << row_format_name(f) << "), seed " << test::test_seed();
}

// Tensor cores: queries and softmax weights rounded to bf16 (relative 2^-9 each; a coded cache's
// values too), so ~3e-3; the chunk spans more than one 64-query block and ends inside one.
TEST_P(GpuAttention, PrefillMatchesDecodeSteps) {
  TANDEM_REQUIRE_GPU();
  const AttnCase c = std::get<0>(GetParam());
  prefill_vs_decode_steps(c, std::get<1>(GetParam()), c.steps * 25 + 7, 1e-2);
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

// Tokens of several sequences (token t of slot[t] at pos[t]; slot s's cache, stride bytes after slot
// s - 1's, holding random rows before its first token's position) in one attention_decode call, against
// one single-token call per token in order: caches and outputs bit for bit.
void batched_vs_token_by_token(const AttnCase& c, RowFormat f, unsigned seed, const std::vector<int32_t>& slot, const std::vector<int32_t>& pos,
                               int max_ctx, int64_t stride) {
  std::mt19937 rng(seed);
  const int n = static_cast<int>(slot.size()), row = c.nkv * c.hd, slots = *std::max_element(slot.begin(), slot.end()) + 1;
  std::vector<int> context(slots, max_ctx);  // each slot's rows before its first token
  for (int t = 0; t < n; ++t) context[slot[t]] = std::min(context[slot[t]], pos[t]);
  auto q_norm = test::random_floats(rng, c.hd, 0.3f), k_norm = test::random_floats(rng, c.hd, 0.3f);
  std::vector<float> inv(c.rot / 2);
  ref::rope_inv_freq(1e7, c.rot, inv.data());
  HostCache kc0(f, c.nkv, c.hd, 0, slots * stride), vc0(f, c.nkv, c.hd, 0, slots * stride);
  for (int s = 0; s < slots; ++s) kc0.fill(rng, s * stride, context[s]), vc0.fill(rng, s * stride, context[s]);
  const auto qg = test::random_floats(rng, n * c.nh * 2 * c.hd), k = test::random_floats(rng, n * row), v = test::random_floats(rng, n * row);
  const int splits_max = static_cast<int>(gpu::attention_decode_splits(max_ctx));
  test::DeviceBuffer<float> dqn(q_norm), dkn(k_norm), dinv(inv), dqg(qg), dk(k), dv(v);
  test::DeviceBuffer<float> dqr(int64_t(n) * c.nh * c.hd), dpart(int64_t(n) * c.nh * splits_max * (c.hd + 2));
  test::DeviceBuffer<float> dstep(int64_t(n) * c.nh * c.hd), dbatch(int64_t(n) * c.nh * c.hd);
  test::DeviceBuffer<uint8_t> kc_a(kc0.bytes), vc_a(vc0.bytes), kc_b(kc0.bytes), vc_b(vc0.bytes);
  test::DeviceBuffer<int32_t> dpos(pos), dslot(slot);
  gpu::AttentionDecodeArgs p;
  p.q_norm = dqn.ptr, p.k_norm = dkn.ptr, p.inv_freq = dinv.ptr, p.partial = dpart.ptr, p.kv = f;
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
  EXPECT_EQ(dbatch.to_host(), dstep.to_host()) << "seed " << seed;
}

// A batched decode step: tokens of several sequences (slots, each with its own cache and context
// length), two of them consecutive positions of one sequence (a verification step).
TEST_P(GpuAttention, BatchedDecodeEqualsTokenByToken) {
  TANDEM_REQUIRE_GPU();
  const AttnCase c = std::get<0>(GetParam());
  const RowFormat f = std::get<1>(GetParam());
  const int max_ctx = c.start_pos + 140;
  const int64_t stride = int64_t(max_ctx) * gpu::kv_row_bytes(f, c.nkv, c.hd) + 64;  // bytes between the slots' caches
  batched_vs_token_by_token(c, f, test::test_seed() + 5, {0, 1, 2, 2}, {c.start_pos, c.start_pos + 70, c.start_pos + 130, c.start_pos + 131},
                            max_ctx, stride);
}

// A cache far longer than the scoring grid (attention_decode_split_blocks: the blocks of a batched
// step take several splits each, where one-token calls give each split its own block): 8 tokens of 4
// sequences (two consecutive positions each) at the 35B shape, contexts below, around and above the
// grid's reach.
TEST(GpuAttentionLong, BlocksTakingSeveralSplitsEqualABlockASplit) {
  TANDEM_REQUIRE_GPU();
  const AttnCase c{16, 2, 256, 64, 0, 1};
  const RowFormat f = RowFormat::Bf16;
  const int n = 8, rows = gpu::kAttnDecodeSplitRows, sms = gpu::gpu_device_caps().multiprocessors;
  const int64_t reach = gpu::attention_decode_split_blocks(int64_t{1} << 30, c.nkv, n, sms);  // splits the grid holds: its cap
  const std::vector<int> first = {static_cast<int>((reach + 40) * rows), static_cast<int>((reach + 3) * rows + 10), 100,
                                  static_cast<int>(reach * rows - 5)};
  std::vector<int32_t> slot(n), pos(n);
  for (int t = 0; t < n; ++t) slot[t] = t / 2, pos[t] = first[t / 2] + t % 2;
  const int max_ctx = static_cast<int>((reach + 48) * rows);
  const int64_t splits_max = gpu::attention_decode_splits(max_ctx);
  ASSERT_LT(gpu::attention_decode_split_blocks(splits_max, c.nkv, n, sms), (pos[0] + rows) / rows)
      << "the batched call's blocks must take several splits";
  ASSERT_EQ(gpu::attention_decode_split_blocks(splits_max, c.nkv, 1, sms), splits_max) << "one-token calls must give each split its block";
  batched_vs_token_by_token(c, f, test::test_seed() + 11, slot, pos, max_ctx, int64_t(max_ctx) * gpu::kv_row_bytes(f, c.nkv, c.hd));
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAttention,
                         ::testing::Combine(::testing::Values(AttnCase{16, 2, 256, 64, 0, 4},     // 35B: first tokens
                                           AttnCase{16, 2, 256, 64, 700, 2},   // 35B: several splits of context
                                           AttnCase{8, 2, 128, 32, 129, 3},    // hd 128, groups of 4: a split of one row, then two
                                           AttnCase{16, 2, 128, 64, 200, 2},   // hd 128, groups of 8
                                           AttnCase{8, 2, 256, 64, 62, 3},     // hd 256, groups of 4: a split ends at 64
                                           AttnCase{4, 1, 64, 64, 63, 2},      // hd 64: the per-query-head blocks
                                           AttnCase{8, 2, 32, 8, 0, 5},        // fixture bf16_fused
                                           AttnCase{4, 4, 16, 4, 300, 2}),    // GQA 1, odd sizes
                                            ::testing::Values(RowFormat::Bf16, RowFormat::Int8, RowFormat::Fp8)));

}  // namespace
}  // namespace tandem
