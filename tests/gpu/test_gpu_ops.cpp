// GPU add_rmsnorm_zc (the residual add, optionally with the gated shared-expert term, fused with the
// next RMSNorm) against the reference ops on fresh random rows: h exactly as add then add, y within
// fp32 rounding of ref::rmsnorm_zc (the same operations per element; the block reduction orders the
// sum of squares differently from the sequential reference).
#include <cmath>

#include "gpu_core/ops.cuh"
#include "runtime/ops_ref.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

class GpuAddRmsNorm : public ::testing::TestWithParam<std::tuple<int64_t, int, bool>> {};

TEST_P(GpuAddRmsNorm, MatchesAddThenNorm) {
  TANDEM_REQUIRE_GPU();
  const auto [n, rows, gated] = GetParam();
  std::mt19937 rng(test::test_seed());
  auto h = test::random_floats(rng, n * rows), a = test::random_floats(rng, n * rows), s = test::random_floats(rng, n * rows),
       g = test::random_floats(rng, rows, 2.0f), w = test::random_floats(rng, n, 0.3f);
  test::DeviceBuffer<float> dh(h), da(a), ds(s), dg(g), dw(w), dy(n * rows);
  CUDA_OK(gpu::add_rmsnorm_zc(dh.ptr, da.ptr, gated ? ds.ptr : nullptr, gated ? dg.ptr : nullptr, dw.ptr, n, rows, 1e-6f, dy.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto gh = dh.to_host(), gy = dy.to_host();
  std::vector<float> y(n);
  for (int r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < n; ++i) {
      float t = a[r * n + i];
      if (gated) t += s[r * n + i] / (1.0f + std::exp(-g[r]));
      h[r * n + i] += t;
    }
    ref::rmsnorm_zc(h.data() + r * n, w.data(), n, 1e-6f, y.data());
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(gh[r * n + i], h[r * n + i], 1e-6f * (1.0f + std::fabs(h[r * n + i]))) << "h, row " << r << " i " << i;
    const std::vector<double> want(y.begin(), y.end()), got(gy.begin() + r * n, gy.begin() + (r + 1) * n);
    EXPECT_LT(test::rel_l2(got, want), 1e-5) << "row " << r << " seed " << test::test_seed();
  }
  // Without the gated term the kernel is add_inplace + rmsnorm_zc, bit for bit.
  if (!gated) {
    test::DeviceBuffer<float> dy2(n * rows);
    std::vector<float> h0 = test::random_floats(rng, n * rows);
    test::DeviceBuffer<float> p(h0), q(h0);
    CUDA_OK(gpu::add_inplace(p.ptr, da.ptr, n * rows, nullptr));
    CUDA_OK(gpu::rmsnorm_zc(p.ptr, dw.ptr, n, rows, 1e-6f, dy2.ptr, nullptr));
    CUDA_OK(gpu::add_rmsnorm_zc(q.ptr, da.ptr, nullptr, nullptr, dw.ptr, n, rows, 1e-6f, dy.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(p.to_host(), q.to_host());
    EXPECT_EQ(dy2.to_host(), dy.to_host());
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuAddRmsNorm,
                         ::testing::Values(std::make_tuple(int64_t{2048}, 1, false), std::make_tuple(int64_t{2048}, 3, true),
                                           std::make_tuple(int64_t{48}, 2, true), std::make_tuple(int64_t{1000}, 1, false),
                                           std::make_tuple(int64_t{17}, 4, false)));

}  // namespace
}  // namespace tandem
