// The fused decode MoE (gpu_core/moe.cuh) against the runtime's definition: for each token,
// sum over its k experts of weight * down(silu(gate x) * up x), from exactly dequantised weights in
// double. Bound 5e-3: fp16 activations and fp16 h on top of the gemv_int4 arithmetic.
#include <cmath>
#include <memory>
#include <numeric>

#include "gpu_core/moe.cuh"
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

TEST_P(GpuMoeInt4, MatchesReference) {
  TANDEM_REQUIRE_GPU();
  const MoeCase c = GetParam();
  std::mt19937 rng(test::test_seed());
  std::vector<test::RandomGptq> gate, up, down;
  for (int e = 0; e < c.E; ++e) {
    gate.emplace_back(rng, c.I, c.H, c.gs, true, c.act_order, true);
    up.emplace_back(rng, c.I, c.H, c.gs, false, c.act_order, false);
    down.emplace_back(rng, c.H, c.I, c.gs, true, c.act_order, true);
  }
  // Device copies of each expert's repacked matrices, kept alive for the test.
  std::vector<std::unique_ptr<test::DeviceBuffer<uint32_t>>> qs;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint16_t>>> ss;
  std::vector<std::unique_ptr<test::DeviceBuffer<uint8_t>>> zs;
  std::vector<std::unique_ptr<test::DeviceBuffer<int32_t>>> perms;
  auto upload = [&](const test::RandomGptq& m) {
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
  };
  std::vector<gpu::Int4Expert> experts;
  for (int e = 0; e < c.E; ++e) experts.push_back({upload(gate[e]), upload(up[e]), upload(down[e])});

  const auto x = test::random_floats(rng, c.T * c.H);
  std::vector<int32_t> ids(c.T * c.k);
  std::vector<float> w(c.T * c.k);
  for (int t = 0; t < c.T; ++t) {
    std::vector<int> all(c.E);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    for (int j = 0; j < c.k; ++j) {
      ids[t * c.k + j] = all[j];
      w[t * c.k + j] = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    }
  }
  std::vector<double> want(c.T * c.H, 0.0);
  for (int t = 0; t < c.T; ++t)
    for (int j = 0; j < c.k; ++j) {
      const int e = ids[t * c.k + j];
      std::vector<double> xt(x.begin() + t * c.H, x.begin() + (t + 1) * c.H);
      const auto g = matvec(gate[e].view(), xt), u = matvec(up[e].view(), xt);
      std::vector<double> hh(c.I);
      for (int64_t i = 0; i < c.I; ++i) hh[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
      const auto d = matvec(down[e].view(), hh);
      for (int64_t n = 0; n < c.H; ++n) want[t * c.H + n] += w[t * c.k + j] * d[n];
    }

  test::DeviceBuffer<gpu::Int4Expert> dexp(experts);
  test::DeviceBuffer<int32_t> dids(ids);
  test::DeviceBuffer<float> dw(w), dx(x), dout(c.T * c.H);
  test::DeviceBuffer<uint16_t> dxh(c.T * c.H), dh(c.T * c.k * c.I);
  CUDA_OK(gpu::gather_x_half(dx.ptr, nullptr, c.H, c.T, dxh.ptr, nullptr));
  CUDA_OK(gpu::moe_int4_decode(dexp.ptr, c.H, c.I, c.gs, dids.ptr, dw.ptr, c.T, c.k, dxh.ptr, dh.ptr, dout.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto got = dout.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), want), 5e-3) << "seed " << test::test_seed();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuMoeInt4,
                         ::testing::Values(MoeCase{16, 8, 1, 2048, 512, 128},  // the 35B layer shape, 16 of 256 experts
                                           MoeCase{16, 8, 4, 2048, 512, 128},
                                           MoeCase{10, 3, 3, 48, 48, 16},      // fixture-sized, small groups
                                           MoeCase{8, 2, 1, 256, 96, 32},
                                           MoeCase{10, 3, 2, 48, 48, 16, true},  // act-order experts (fixture)
                                           MoeCase{16, 8, 1, 2048, 512, 128, true}));

}  // namespace
}  // namespace tandem
