// The fused decode MoE (gpu_core/moe.cuh) against the runtime's definition: for each token,
// sum over its k experts of weight * down(silu(gate x) * up x), from exactly dequantised weights in
// double. Bound 5e-3 for moe_int4_decode (fp16 activations and fp16 h on top of the gemv_int4
// arithmetic), 2e-4 for moe_int4_decode_wide (activations quantised to two int8 parts, integer sums).
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>

#include "gpu_core/gemv.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/rows8_layout.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/gptq_random.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct MoeCase {
  int E, k, T;
  int64_t H, I, gs;
  bool act_order = false;
};

class GpuMoeInt4 : public ::testing::TestWithParam<MoeCase> {};

std::vector<double> matvec(const LinearWeight& w, const std::vector<double>& x) {
  std::vector<double> y(w.out, 0.0);
  std::vector<float> row(w.in);
  for (int64_t n = 0; n < w.out; ++n) {
    w.dequant_row(n, row.data());
    for (int64_t k = 0; k < w.in; ++k) y[n] += double(row[k]) * x[k];
  }
  return y;
}

// Random GPTQ experts, repacked and uploaded (device buffers live as long as the set).
struct ExpertSet {
  std::vector<test::RandomGptq> gate, up, down;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint32_t>>> qs;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint16_t>>> ss;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint8_t>>> zs;
  std::vector<std::unique_ptr<test::DeviceBuffer<int32_t>>> perms;
  std::vector<gpu::Int4Expert> experts;

  ExpertSet(std::mt19937& rng, const MoeCase& c) {
    for (int e = 0; e < c.E; ++e) {
      gate.emplace_back(rng, c.I, c.H, c.gs, true, c.act_order, true);
      up.emplace_back(rng, c.I, c.H, c.gs, false, c.act_order, false);
      down.emplace_back(rng, c.H, c.I, c.gs, true, c.act_order, true);
    }
    for (int e = 0; e < c.E; ++e) experts.push_back({upload(gate[e]), upload(up[e]), upload(down[e])});
  }
  gpu::Int4View upload(const test::RandomGptq& m) {
    const gpu::Int4Host h = gpu::repack_gptq_int4(m.source());
    qs.push_back(std::make_unique<test::DeviceBuffer<uint32_t>>(h.qweight));
    ss.push_back(std::make_unique<test::DeviceBuffer<uint16_t>>(h.scales));
    zs.push_back(std::make_unique<test::DeviceBuffer<uint8_t>>(h.zeros));
    gpu::Int4View v{qs.back()->ptr, ss.back()->ptr, zs.back()->ptr, h.N, h.K, h.group_size, nullptr};
    if (h.permuted) {
      perms.push_back(std::make_unique<test::DeviceBuffer<int32_t>>(h.perm));
      v.perm = perms.back()->ptr;
    }
    return v;
  }
  // sum over j of w * down(silu(gate x_t) * up x_t) in double, from exactly dequantised weights; pairs
  // whose expert is not resident (or id < 0) are left out, as the kernels leave them to the host.
  std::vector<double> reference(const MoeCase& c, int T, const std::vector<float>& x, const std::vector<int32_t>& ids,
                                const std::vector<float>& w, const std::vector<uint8_t>& resident) const {
    std::vector<double> want(T * c.H, 0.0);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < c.k; ++j) {
        const int e = ids[t * c.k + j];
        if (e < 0 || !resident[e]) continue;
        std::vector<double> xt(x.begin() + t * c.H, x.begin() + (t + 1) * c.H);
        const auto g = matvec(gate[e].view(), xt), u = matvec(up[e].view(), xt);
        std::vector<double> hh(c.I);
        for (int64_t i = 0; i < c.I; ++i) hh[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
        const auto d = matvec(down[e].view(), hh);
        for (int64_t n = 0; n < c.H; ++n) want[t * c.H + n] += w[t * c.k + j] * d[n];
      }
    return want;
  }
};

// Top-k routing of T tokens: k distinct experts each, weights in [0.05, 0.5].
void random_routing(std::mt19937& rng, const MoeCase& c, int T, std::vector<int32_t>& ids, std::vector<float>& w) {
  ids.assign(T * c.k, 0);
  w.assign(T * c.k, 0.0f);
  for (int t = 0; t < T; ++t) {
    std::vector<int> all(c.E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < c.k; ++j) {
      ids[t * c.k + j] = all[j];
      w[t * c.k + j] = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    }
  }
}

TEST_P(GpuMoeInt4, MatchesReference) {
  TANDEM_REQUIRE_GPU();
  const MoeCase c = GetParam();
  std::mt19937 rng(test::test_seed());
  const ExpertSet set(rng, c);
  const auto x = test::random_floats(rng, c.T * c.H);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(rng, c, c.T, ids, w);
  const std::vector<double> want = set.reference(c, c.T, x, ids, w, std::vector<uint8_t>(c.E, 1));

  test::DeviceBuffer<gpu::Int4Expert> dexp(set.experts);
  test::DeviceBuffer<int32_t> dids(ids);
  test::DeviceBuffer<float> dw(w), dx(x), dout(c.T * c.H);
  test::DeviceBuffer<uint16_t> dxh(c.T * c.H), dh(c.T * c.k * c.I);
  CUDA_OK(gpu::gather_x_half(dx.ptr, nullptr, c.H, c.T, dxh.ptr, nullptr));
  CUDA_OK(gpu::moe_int4_decode(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, dxh.ptr, dh.ptr, dout.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = dout.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), want), 5e-3) << "seed " << test::test_seed();
  // The wide kernel: activations quantised per 32-input vector to two int8 parts (~1.5e-5 of the
  // vector's largest value), exact integer products: within 2e-4 of the exact layer (measured ~5e-5).
  const bool fits = gpu::moe_int4_decode_wide_fits(c.H, c.I, c.gs, c.k, c.act_order);
  EXPECT_EQ(fits, !c.act_order && c.H % 32 == 0 && c.I % 32 == 0 && c.gs % 32 == 0) << c.H << " x " << c.I << " group " << c.gs;
  test::DeviceBuffer<float> dwide(c.T * c.H);
  test::DeviceBuffer<uint8_t> ws(gpu::moe_int4_wide_workspace(c.T, c.k, c.H, c.I));
  if (!fits) {  // (act order is the caller's to know: the kernel does not read the experts' permutations)
    if (!c.act_order) {
      EXPECT_EQ(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, dx.ptr, false, ws.ptr, dwide.ptr, nullptr),
                cudaErrorInvalidValue);
    }
    return;
  }
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, dx.ptr, false, ws.ptr, dwide.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto wide = dwide.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(wide.begin(), wide.end()), want), 2e-4) << "wide variant, seed " << test::test_seed();
  // A token's arithmetic does not depend on the others in the launch (batched and verification steps
  // rely on it): each token alone gives its row of the T-token launch bit for bit.
  for (int t = 0; t < c.T; ++t) {
    test::DeviceBuffer<float> one(c.H);
    CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr + t * c.k, dw.ptr + t * c.k, 1, c.k, dx.ptr + t * c.H, false, ws.ptr,
                                      one.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto alone = one.to_host();
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), wide.begin() + t * c.H)) << "token " << t << " of " << c.T;
  }
}

// The wide kernel with some experts not resident (hybrid): they contribute nothing, the rest as usual.
TEST(GpuMoeInt4Wide, SkipsNonResidentExperts) {
  TANDEM_REQUIRE_GPU();
  for (const MoeCase c : {MoeCase{16, 8, 1, 2048, 512, 128}, MoeCase{16, 8, 3, 2048, 512, 128}}) {
    ASSERT_TRUE(gpu::moe_int4_decode_wide_fits(c.H, c.I, c.gs, c.k, c.act_order));
    std::mt19937 rng(test::test_seed() + 3);
    const ExpertSet set(rng, c);
    const auto x = test::random_floats(rng, c.T * c.H);
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(rng, c, c.T, ids, w);
    std::vector<uint8_t> resident(c.E, 1);
    std::vector<gpu::Int4Expert> table = set.experts;
    for (int e = 0; e < c.E; e += 2) resident[e] = 0, table[e] = gpu::Int4Expert{};
    const std::vector<double> want = set.reference(c, c.T, x, ids, w, resident);
    test::DeviceBuffer<gpu::Int4Expert> dexp(table);
    test::DeviceBuffer<int32_t> dids(ids);
    test::DeviceBuffer<float> dw(w), dx(x), dout(c.T * c.H);
    test::DeviceBuffer<uint8_t> ws(gpu::moe_int4_wide_workspace(c.T, c.k, c.H, c.I));
    CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, dx.ptr, false, ws.ptr, dout.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = dout.to_host();
    EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), want), 2e-4) << c.T << " tokens, seed " << test::test_seed();
  }
}

// x quantised by the norm that writes it (QuantX: the decode step's form) gives the wide kernel's output
// bit for bit as the kernel's own quantisation launch does.
TEST(GpuMoeInt4Wide, NormQuantisedXGivesTheSameBits) {
  TANDEM_REQUIRE_GPU();
  const MoeCase c{16, 8, 3, 2048, 512, 128};
  std::mt19937 rng(test::test_seed() + 5);
  const ExpertSet set(rng, c);
  const auto h = test::random_floats(rng, c.T * c.H), nw = test::random_floats(rng, c.H);
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(rng, c, c.T, ids, w);
  test::DeviceBuffer<gpu::Int4Expert> dexp(set.experts);
  test::DeviceBuffer<int32_t> dids(ids);
  test::DeviceBuffer<float> dw(w), dh(h), dnw(nw), x1(c.T * c.H), x2(c.T * c.H), o1(c.T * c.H), o2(c.T * c.H);
  test::DeviceBuffer<uint8_t> ws1(gpu::moe_int4_wide_workspace(c.T, c.k, c.H, c.I)), ws2(gpu::moe_int4_wide_workspace(c.T, c.k, c.H, c.I));
  CUDA_OK(gpu::rmsnorm_zc(dh.ptr, dnw.ptr, c.H, c.T, 1e-6f, x1.ptr, nullptr));
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, x1.ptr, false, ws1.ptr, o1.ptr, nullptr));
  CUDA_OK(gpu::rmsnorm_zc(dh.ptr, dnw.ptr, c.H, c.T, 1e-6f, x2.ptr, nullptr, gpu::wide_moe_x(ws2.ptr, c.T, c.k, c.H, c.I)));
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, x2.ptr, true, ws2.ptr, o2.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(x1.to_host(), x2.to_host());
  EXPECT_EQ(o1.to_host(), o2.to_host());
  EXPECT_EQ(gpu::rmsnorm_zc(dh.ptr, dnw.ptr, 48, 1, 1e-6f, x2.ptr, nullptr, gpu::wide_moe_x(ws2.ptr, 1, c.k, 48, c.I)), cudaErrorInvalidValue)
      << "rows that are not whole vectors";
}

// The shared expert's down in the routed down launch (SharedDown, one token): its rows bit for bit as
// gemv_bf16_swiglu (bf16) and gemv_rows8_swiglu (int8 rows) give them, the routed sum as without it;
// several tokens and shapes or formats it does not take refused.
TEST(GpuMoeInt4Wide, SharedDownInTheDownLaunch) {
  TANDEM_REQUIRE_GPU();
  const MoeCase c{16, 8, 1, 2048, 512, 128};
  const int64_t Is = 512;
  std::mt19937 rng(test::test_seed() + 7);
  const ExpertSet set(rng, c);
  const auto x = test::random_floats(rng, c.H), g = test::random_floats(rng, Is), u = test::random_floats(rng, Is);
  std::vector<uint16_t> wsh(c.H * Is);
  for (uint16_t& v : wsh) v = f32_to_bf16(std::normal_distribution<float>(0.0f, 0.05f)(rng));
  std::vector<int32_t> ids;
  std::vector<float> w;
  random_routing(rng, c, 1, ids, w);
  test::DeviceBuffer<gpu::Int4Expert> dexp(set.experts);
  test::DeviceBuffer<int32_t> dids(ids);
  test::DeviceBuffer<uint16_t> dwsh(wsh);
  test::DeviceBuffer<float> dw(w), dx(x), dg(g), du(u), plain(c.H), routed(c.H), sd(c.H), want(c.H);
  test::DeviceBuffer<uint8_t> ws(gpu::moe_int4_wide_workspace(2, c.k, c.H, c.I));
  gpu::SharedDown sh;
  sh.w = dwsh.ptr, sh.in = Is, sh.g = dg.ptr, sh.u = du.ptr, sh.out = sd.ptr;
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, 1, c.k, dx.ptr, false, ws.ptr, plain.ptr, nullptr));
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, 1, c.k, dx.ptr, false, ws.ptr, routed.ptr, nullptr, sh));
  CUDA_OK(gpu::gemv_bf16_swiglu(dwsh.ptr, c.H, Is, dg.ptr, du.ptr, 1, want.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(routed.to_host(), plain.to_host()) << "the routed sum";
  EXPECT_EQ(sd.to_host(), want.to_host()) << "the shared expert's rows";
  const auto refused = [&](const gpu::SharedDown& b, int T) {
    return gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, T, c.k, dx.ptr, false, ws.ptr, routed.ptr, nullptr, b) ==
           cudaErrorInvalidValue;
  };
  EXPECT_TRUE(refused(sh, 2)) << "two tokens";
  gpu::SharedDown bad = sh;
  bad.in = 1032;
  EXPECT_TRUE(refused(bad, 1)) << "more inputs than the launch holds in registers";
  bad = sh, bad.out = nullptr;
  EXPECT_TRUE(refused(bad, 1)) << "no output";

  // The same with the shared down as int8 rows (the 8-bit dense format's): its rows bit for bit as
  // gemv_rows8_swiglu's, the routed sum unchanged; fp8 rows, both forms at once and rows of another
  // shape refused.
  const gpu::Rows8Host h8 = gpu::quantize_rows8(wsh.data(), c.H, Is, RowFormat::Int8);
  test::DeviceBuffer<uint8_t> dq(h8.codes);
  test::DeviceBuffer<float> dsc(h8.scales), sd8(c.H), want8(c.H);
  gpu::SharedDown sh8 = sh;
  sh8.w = nullptr, sh8.w8 = gpu::Rows8View{dq.ptr, dsc.ptr, c.H, Is, RowFormat::Int8}, sh8.out = sd8.ptr;
  CUDA_OK(gpu::moe_int4_decode_wide(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, 1, c.k, dx.ptr, false, ws.ptr, routed.ptr, nullptr, sh8));
  CUDA_OK(gpu::gemv_rows8_swiglu(sh8.w8, dg.ptr, du.ptr, 1, want8.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(routed.to_host(), plain.to_host()) << "the routed sum (int8 shared rows)";
  EXPECT_EQ(sd8.to_host(), want8.to_host()) << "the shared expert's int8 rows";
  bad = sh8, bad.w8.format = RowFormat::Fp8;
  EXPECT_TRUE(refused(bad, 1)) << "fp8 rows";
  bad = sh8, bad.w = dwsh.ptr;
  EXPECT_TRUE(refused(bad, 1)) << "bf16 and int8 rows at once";
  bad = sh8, bad.w8.N = c.H / 2;
  EXPECT_TRUE(refused(bad, 1)) << "rows of another shape";
}

// The grouped prefill kernel (moe_int4_grouped_tc, tensor cores) for a chunk of tokens: against the
// double reference (5e-3, as decode) and against moe_int4_decode run on blocks of 8 tokens (2e-3: fp16
// weights and fp32 accumulation instead of the decode kernel's fp16 partial sums). Every third expert
// is not resident (null pointers, as in a hybrid placement): it contributes nothing on either path.
TEST_P(GpuMoeInt4, GroupedPrefillMatchesDecode) {
  TANDEM_REQUIRE_GPU();
  const MoeCase c = GetParam();
  std::mt19937 rng(test::test_seed() + 7);
  const ExpertSet set(rng, c);
  for (int T : {9, 3 * c.E + 5}) {  // just above one decode block; and enough for experts with 8+ tokens
    const auto x = test::random_floats(rng, T * c.H);
    std::vector<int32_t> ids;
    std::vector<float> w;
    random_routing(rng, c, T, ids, w);
    std::vector<uint8_t> resident(c.E, 1);
    std::vector<gpu::Int4Expert> table = set.experts;
    for (int e = 1; e < c.E; e += 3) resident[e] = 0, table[e] = gpu::Int4Expert{};
    const std::vector<double> want = set.reference(c, T, x, ids, w, resident);

    test::DeviceBuffer<gpu::Int4Expert> dexp(table);
    test::DeviceBuffer<int32_t> dids(ids);
    test::DeviceBuffer<float> dw(w), dx(x), dblocks(T * c.H);
    test::DeviceBuffer<uint8_t> ws(gpu::moe_int4_grouped_workspace(T, c.k, c.H, c.I, c.E));
    test::DeviceBuffer<uint16_t> dxh(gpu::kMaxGemvTokens * c.H), dh(gpu::kMaxGemvTokens * c.k * c.I);
    for (int t = 0; t < T; t += gpu::kMaxGemvTokens) {
      const int m = std::min(gpu::kMaxGemvTokens, T - t);
      CUDA_OK(gpu::gather_x_half(dx.ptr + t * c.H, nullptr, c.H, m, dxh.ptr, nullptr));
      CUDA_OK(gpu::moe_int4_decode(dexp.ptr, c.H, c.I, c.gs, dids.ptr + t * c.k, dw.ptr + t * c.k, m, c.k, dxh.ptr, dh.ptr,
                                   dblocks.ptr + t * c.H, nullptr));
    }
    CUDA_OK(cudaDeviceSynchronize());
    const auto blocks = dblocks.to_host();
    const std::vector<double> b(blocks.begin(), blocks.end());
    EXPECT_LT(test::rel_l2(b, want), 5e-3) << T << " tokens (decode kernel in blocks), seed " << test::test_seed();
    test::DeviceBuffer<float> dtc(T * c.H);
    CUDA_OK(gpu::moe_int4_grouped_tc(dexp.ptr, c.E, c.H, c.I, c.gs, dids.ptr, dw.ptr, T, c.k, dx.ptr, ws.ptr, dtc.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto tc = dtc.to_host();
    const std::vector<double> t(tc.begin(), tc.end());
    EXPECT_LT(test::rel_l2(t, want), 5e-3) << T << " tokens (tensor cores), seed " << test::test_seed();
    EXPECT_LT(test::rel_l2(t, b), 2e-3) << T << " tokens (tensor cores), seed " << test::test_seed();
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuMoeInt4,
                         ::testing::Values(MoeCase{16, 8, 1, 2048, 512, 128},  // the 35B layer shape, 16 of 256 experts
                                           MoeCase{16, 8, 4, 2048, 512, 128},
                                           MoeCase{10, 3, 3, 48, 48, 16},      // fixture-sized, small groups
                                           MoeCase{8, 2, 1, 256, 96, 32},
                                           MoeCase{10, 3, 2, 48, 48, 16, true},  // act-order experts (fixture)
                                           MoeCase{16, 8, 1, 2048, 512, 128, true},  // act order: the plain kernel only
                                           MoeCase{12, 8, 8, 2048, 512, 128},    // a block of 8 tokens
                                           MoeCase{6, 2, 2, 4096, 2048, 64},   // the widest the wide kernel takes
                                           MoeCase{10, 5, 3, 1088, 160, 32},     // odd vector counts: partial lanes
                                           MoeCase{8, 3, 1, 64, 64, 32}));       // gptq_sym_v1's shape

}  // namespace
}  // namespace tandem
