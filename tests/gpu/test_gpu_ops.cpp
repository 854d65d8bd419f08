// GPU add_rmsnorm_zc (the residual add, optionally with the gated shared-expert term, fused with the
// next RMSNorm) against the reference ops on fresh random rows: h exactly as add then add, y within
// fp32 rounding of ref::rmsnorm_zc (the same operations per element; the block reduction orders the
// sum of squares differently from the sequential reference).
#include <cmath>

#include "gpu_core/gemv.cuh"
#include "gpu_core/handoff.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/rows8_layout.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/row_format.h"
#include "runtime/models/qwen3_5_moe/ops_ref.h"
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
                                           std::make_tuple(int64_t{17}, 4, false),
                                           std::make_tuple(int64_t{5000}, 2, true),  // past the register-held form
                                           std::make_tuple(int64_t{5000}, 1, false)));

// router_topk against ref::route_topk (softmax, top-k with ties to the lower id, renormalised): the
// same experts in the same order, weights within fp32 rounding; with exact ties in half the cases.
struct RouteCase {
  int E, k, rows;
  bool ties;
};
class GpuRouter : public ::testing::TestWithParam<RouteCase> {};

TEST_P(GpuRouter, TopkMatchesReference) {
  TANDEM_REQUIRE_GPU();
  const RouteCase c = GetParam();
  std::mt19937 rng(test::test_seed());
  auto logits = test::random_floats(rng, c.E * c.rows, 3.0f);
  if (c.ties)
    for (auto& v : logits) v = std::round(v * 2.0f) / 2.0f;  // ~13 distinct values: many exact ties, -0 among them
  test::DeviceBuffer<float> dl(logits), dw(c.rows * c.k);
  test::DeviceBuffer<int32_t> di(c.rows * c.k);
  CUDA_OK(gpu::router_topk(dl.ptr, c.E, c.k, c.rows, di.ptr, dw.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto ids = di.to_host();
  const auto w = dw.to_host();
  std::vector<int> want_i(c.k);
  std::vector<float> want_w(c.k);
  for (int r = 0; r < c.rows; ++r) {
    ref::route_topk(logits.data() + r * c.E, c.E, c.k, want_i.data(), want_w.data());
    for (int j = 0; j < c.k; ++j) {
      ASSERT_EQ(ids[r * c.k + j], want_i[j]) << "row " << r << " slot " << j << " seed " << test::test_seed();
      EXPECT_NEAR(w[r * c.k + j], want_w[j], 2e-6f) << "row " << r << " slot " << j;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuRouter,
                         ::testing::Values(RouteCase{256, 8, 1, false}, RouteCase{256, 8, 1, true}, RouteCase{256, 8, 37, false},
                                           RouteCase{512, 16, 3, true}, RouteCase{10, 3, 5, true}, RouteCase{8, 4, 1, false},
                                           RouteCase{33, 2, 1, true}));

// gemv_bf16_router_topk_norm (the decode step's router, the norm before it in the same launch): h, x,
// y, ids and weights bit for bit what the norm launch (add_rmsnorm_zc with a residual, with a residual
// and a gated shared expert, rmsnorm_zc without) followed by gemv_bf16 and router_topk gives, at the
// 35B stacked shapes (router rows first, then other stacked rows: x_proj's 1281, router_gate's 257) and
// odd ones (rows per thread 1..8, a partial last pass), three launches in a row (the ticket re-arms
// itself), the second with the rows after the logits stored to a buffer of their own (a two-part
// RowsOut, as router_gate's gate logit goes to sgate); the last two with a
// HostPost (handoff.cuh): the host gets x, ids and weights as host_post after those launches gives
// them, and the flag, with the device outputs unchanged. Where K is whole 32-input vectors, x quantised
// for the decode MoE (QuantX) is the same bytes as the norm kernel's.
TEST(GpuRouterFused, WithItsNormEqualsNormThenRouter) {
  TANDEM_REQUIRE_GPU();
  struct Case {
    int64_t N, K;
    int E, k;
  };
  for (const Case c : {Case{1281, 2048, 256, 8}, Case{257, 2048, 256, 8}, Case{40, 64, 8, 4}, Case{300, 520, 33, 2}, Case{96, 256, 64, 8}})
    for (int form = 0; form < 3; ++form) {  // 0: h += a; 1: h += a + sigmoid(g) * shared; 2: no residual
      std::mt19937 rng(test::test_seed() + 11 + form);
      std::vector<uint16_t> W(c.N * c.K);
      for (auto& v : W) v = f32_to_bf16(std::normal_distribution<float>(0, 0.2f)(rng));
      const auto norm_w = test::random_floats(rng, c.K);
      test::DeviceBuffer<uint16_t> dW(W);
      test::DeviceBuffer<float> dnw(norm_w);
      test::DeviceBuffer<unsigned> t1(std::vector<unsigned>{0u});
      test::Pinned<float> px(c.K), pw(c.k), rx(c.K), rw(c.k);
      test::Pinned<int32_t> pids(c.k), rids(c.k);
      test::Pinned<unsigned> pflag(1), rflag(1);
      ASSERT_TRUE(px.ptr && pw.ptr && rx.ptr && rw.ptr && pids.ptr && rids.ptr && pflag.ptr && rflag.ptr);
      for (int launch = 0; launch < 3; ++launch) {
        const auto h = test::random_floats(rng, c.K), a = test::random_floats(rng, c.K), sh = test::random_floats(rng, c.K);
        const auto g = test::random_floats(rng, 1);
        test::DeviceBuffer<float> h1(h), h2(h), da(a), dsh(sh), dg(g), x1(c.K), x2(c.K), y1(c.N), y2(c.N), w1(c.k), w2(c.k);
        test::DeviceBuffer<int32_t> i1(c.k), i2(c.k);
        const float* av = form < 2 ? da.ptr : nullptr;
        const float* sv = form == 1 ? dsh.ptr : nullptr;
        const float* gv = form == 1 ? dg.ptr : nullptr;
        const gpu::HostPost post{px.ptr, pids.ptr, pw.ptr, pflag.ptr, static_cast<unsigned>(launch)};
        // rows of whole 32-input vectors: x quantised for the decode MoE too (QuantX), the same bytes
        const bool quant = c.K % 32 == 0;
        test::DeviceBuffer<uint8_t> q1(quant ? c.K * 2 + c.K / 4 : 1), q2(quant ? c.K * 2 + c.K / 4 : 1);
        const gpu::QuantX qx1 = quant ? gpu::QuantX{q1.ptr, q1.ptr + c.K * 2} : gpu::QuantX{};
        const gpu::QuantX qx2 = quant ? gpu::QuantX{q2.ptr, q2.ptr + c.K * 2} : gpu::QuantX{};
        const bool split = launch == 1 && c.N > c.E;  // rows E.. to their own buffer
        test::DeviceBuffer<float> tail(split ? c.N - c.E : 1);
        gpu::RowsOut y1_out = gpu::RowsOut::one(y1.ptr, c.N);
        if (split) y1_out.dst[1] = tail.ptr, y1_out.end[0] = c.E, y1_out.end[1] = c.N, y1_out.parts = 2;
        CUDA_OK(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h1.ptr, av, sv, gv, dnw.ptr, 1e-6f, x1.ptr, y1_out, c.E, c.k, t1.ptr,
                                                i1.ptr, w1.ptr, nullptr, launch > 0 ? &post : nullptr, qx1));
        if (av) CUDA_OK(gpu::add_rmsnorm_zc(h2.ptr, av, sv, gv, dnw.ptr, c.K, 1, 1e-6f, x2.ptr, nullptr, qx2));
        else CUDA_OK(gpu::rmsnorm_zc(h2.ptr, dnw.ptr, c.K, 1, 1e-6f, x2.ptr, nullptr, qx2));
        CUDA_OK(gpu::gemv_bf16(dW.ptr, c.N, c.K, x2.ptr, 1, y2.ptr, nullptr));
        CUDA_OK(gpu::router_topk(y2.ptr, c.E, c.k, 1, i2.ptr, w2.ptr, nullptr));
        CUDA_OK(gpu::host_post(x2.ptr, c.K, i2.ptr, w2.ptr, c.k, rx.ptr, rids.ptr, rw.ptr, rflag.ptr, static_cast<unsigned>(launch), nullptr));
        CUDA_OK(cudaDeviceSynchronize());
        const std::string what = str_cat(c.N, " x ", c.K, " form ", form, " launch ", launch);
        EXPECT_EQ(*pflag.ptr, static_cast<unsigned>(launch)) << what;  // launch 0 posts nothing: still 0
        if (launch > 0) {
          EXPECT_EQ(std::vector<float>(px.ptr, px.ptr + c.K), std::vector<float>(rx.ptr, rx.ptr + c.K)) << what;
          EXPECT_EQ(std::vector<int32_t>(pids.ptr, pids.ptr + c.k), std::vector<int32_t>(rids.ptr, rids.ptr + c.k)) << what;
          EXPECT_EQ(std::vector<float>(pw.ptr, pw.ptr + c.k), std::vector<float>(rw.ptr, rw.ptr + c.k)) << what;
        }
        EXPECT_EQ(h1.to_host(), h2.to_host()) << what;
        EXPECT_EQ(x1.to_host(), x2.to_host()) << what;
        if (quant) {
          EXPECT_EQ(q1.to_host(), q2.to_host()) << what << " (x quantised)";
        }
        std::vector<float> y = y1.to_host();
        if (split) {  // the logits from y1, the rows after them from tail
          const std::vector<float> t = tail.to_host();
          std::copy(t.begin(), t.end(), y.begin() + c.E);
        }
        EXPECT_EQ(y, y2.to_host()) << what;
        EXPECT_EQ(i1.to_host(), i2.to_host()) << what;
        EXPECT_EQ(w1.to_host(), w2.to_host()) << what;
        EXPECT_EQ(t1.to_host()[0], 0u) << what;
      }
    }
}

// gemv_bf16_router_topk_norm with 8-bit rows after its bf16 ones (w8: the 8-bit shared expert's gate and
// up in the router's launch): the bf16 rows, ids, weights, h and x as without them, and the 8-bit rows bit
// for bit what gemv_rows8 gives from the norm launch's x, for int8 and fp8 codes, at the 35B shape
// (router and gate logit, 2 x 512 shared rows) and an odd one (a partial 512-input block, 40 rows);
// mismatched inputs and a y too short for them refused.
TEST(GpuRouterFused, EightBitRowsAsTheirOwnLaunch) {
  TANDEM_REQUIRE_GPU();
  struct Case {
    int64_t N, N8, K;
    int E, k;
  };
  for (const Case c : {Case{257, 1024, 2048, 256, 8}, Case{33, 40, 528, 32, 4}})
    for (const RowFormat f : {RowFormat::Int8, RowFormat::Fp8}) {
      std::mt19937 rng(test::test_seed() + 31 + static_cast<int>(f));
      std::vector<uint16_t> W(c.N * c.K), W8(c.N8 * c.K);
      for (auto& v : W) v = f32_to_bf16(std::normal_distribution<float>(0, 0.2f)(rng));
      for (auto& v : W8) v = f32_to_bf16(std::normal_distribution<float>(0, 0.2f)(rng));
      const gpu::Rows8Host h8 = gpu::quantize_rows8(W8.data(), c.N8, c.K, f);
      const auto norm_w = test::random_floats(rng, c.K), h = test::random_floats(rng, c.K), a = test::random_floats(rng, c.K);
      test::DeviceBuffer<uint16_t> dW(W);
      test::DeviceBuffer<uint8_t> dq(h8.codes);
      test::DeviceBuffer<float> ds(h8.scales), dnw(norm_w), h1(h), h2(h), da(a), x1(c.K), x2(c.K), y1(c.E), g1(c.N - c.E), r1(c.N8);
      test::DeviceBuffer<float> y2(c.N), r2(c.N8), w1(c.k), w2(c.k);
      test::DeviceBuffer<int32_t> i1(c.k), i2(c.k);
      test::DeviceBuffer<unsigned> t1(std::vector<unsigned>{0u});
      const gpu::Rows8View v8{dq.ptr, ds.ptr, c.N8, c.K, f};
      gpu::RowsOut y;  // logits | the other bf16 rows | the 8-bit rows, each part a buffer of its own
      y.dst[0] = y1.ptr, y.end[0] = c.E, y.dst[1] = g1.ptr, y.end[1] = c.N, y.dst[2] = r1.ptr, y.end[2] = c.N + c.N8, y.parts = 3;
      CUDA_OK(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h1.ptr, da.ptr, nullptr, nullptr, dnw.ptr, 1e-6f, x1.ptr, y, c.E, c.k, t1.ptr,
                                              i1.ptr, w1.ptr, nullptr, nullptr, {}, &v8));
      CUDA_OK(gpu::add_rmsnorm_zc(h2.ptr, da.ptr, nullptr, nullptr, dnw.ptr, c.K, 1, 1e-6f, x2.ptr, nullptr));
      CUDA_OK(gpu::gemv_bf16(dW.ptr, c.N, c.K, x2.ptr, 1, y2.ptr, nullptr));
      CUDA_OK(gpu::router_topk(y2.ptr, c.E, c.k, 1, i2.ptr, w2.ptr, nullptr));
      CUDA_OK(gpu::gemv_rows8(v8, x2.ptr, 1, r2.ptr, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::string what = str_cat(c.N, " + ", c.N8, " x ", c.K, " ", row_format_name(f));
      std::vector<float> bf = y1.to_host();
      const std::vector<float> g = g1.to_host();
      bf.insert(bf.end(), g.begin(), g.end());
      EXPECT_EQ(bf, y2.to_host()) << what;
      EXPECT_EQ(r1.to_host(), r2.to_host()) << what << " (8-bit rows)";
      EXPECT_EQ(i1.to_host(), i2.to_host()) << what;
      EXPECT_EQ(w1.to_host(), w2.to_host()) << what;
      EXPECT_EQ(h1.to_host(), h2.to_host()) << what;
      EXPECT_EQ(x1.to_host(), x2.to_host()) << what;
      EXPECT_EQ(t1.to_host()[0], 0u) << what;
      const gpu::Rows8View other_k{dq.ptr, ds.ptr, c.N8, c.K + 16, f};
      EXPECT_EQ(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h1.ptr, da.ptr, nullptr, nullptr, dnw.ptr, 1e-6f, x1.ptr, y, c.E, c.k,
                                                t1.ptr, i1.ptr, w1.ptr, nullptr, nullptr, {}, &other_k),
                cudaErrorInvalidValue)
          << what;
      gpu::RowsOut short_y = y;
      short_y.end[2] = c.N + c.N8 - 1;
      EXPECT_EQ(gpu::gemv_bf16_router_topk_norm(dW.ptr, c.N, c.K, h1.ptr, da.ptr, nullptr, nullptr, dnw.ptr, 1e-6f, x1.ptr, short_y, c.E,
                                                c.k, t1.ptr, i1.ptr, w1.ptr, nullptr, nullptr, {}, &v8),
                cudaErrorInvalidValue)
          << what;
    }
}

// l2_prefetch is a hint: any range (odd bounds, empty, the last bytes of a buffer) launches, completes
// and leaves the memory as it was; a null pointer is refused.
TEST(GpuOps, L2PrefetchChangesNothing) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed() + 21);
  const auto v = test::random_floats(rng, (3 << 20) + 5);
  test::DeviceBuffer<float> d(v);
  const int64_t bytes = static_cast<int64_t>(v.size() * sizeof(float));
  const char* p = reinterpret_cast<const char*>(d.ptr);
  for (const auto& [off, n] : {std::pair<int64_t, int64_t>{0, bytes}, {3, bytes - 3}, {bytes - 17, 17}, {5, 7}, {100, 0}, {4096, 1 << 20}})
    EXPECT_EQ(gpu::l2_prefetch(p + off, n, nullptr), cudaSuccess) << off << " + " << n;
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(d.to_host(), v);
  EXPECT_EQ(gpu::l2_prefetch(nullptr, 16, nullptr), cudaErrorInvalidValue);
}

// copy_regions does what one cudaMemcpy a region does: 16-byte and odd regions, empty ones, more
// regions than one launch takes; the bytes between the regions stay as they were; bad input is refused.
TEST(GpuOps, CopyRegionsCopiesEachRegion) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed() + 22);
  constexpr int64_t kBytes = 8 << 20;
  std::vector<uint8_t> src(kBytes), dst(kBytes);
  for (auto& b : src) b = static_cast<uint8_t>(rng());
  for (auto& b : dst) b = static_cast<uint8_t>(rng());
  test::DeviceBuffer<uint8_t> dsrc(src), ddst(dst);
  std::vector<gpu::CopyRegion> regions;
  std::vector<uint8_t> want = dst;
  int64_t at = 0;
  for (int i = 0; i < gpu::kCopyRegions + 9; ++i) {  // disjoint destinations, each from a random source offset
    const int64_t n = i % 7 == 0 ? 0 : i % 3 == 0 ? std::uniform_int_distribution<int64_t>(1, 5000)(rng) : 16 * std::uniform_int_distribution<int64_t>(1, 4096)(rng);
    const int64_t from = i % 3 == 0 ? std::uniform_int_distribution<int64_t>(0, kBytes - n)(rng) : 16 * std::uniform_int_distribution<int64_t>(0, (kBytes - n) / 16)(rng);
    at = i % 3 == 0 ? at + 3 : (at + 15) / 16 * 16;
    ASSERT_LE(at + n, kBytes);
    regions.push_back({ddst.ptr + at, dsrc.ptr + from, n});
    std::copy(src.begin() + from, src.begin() + from + n, want.begin() + at);
    at += n;
  }
  CUDA_OK(gpu::copy_regions(regions.data(), static_cast<int>(regions.size()), nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(ddst.to_host(), want);
  EXPECT_EQ(gpu::copy_regions(nullptr, 0, nullptr), cudaSuccess);
  EXPECT_EQ(gpu::copy_regions(nullptr, 1, nullptr), cudaErrorInvalidValue);
  const gpu::CopyRegion negative{ddst.ptr, dsrc.ptr, -1}, null_src{ddst.ptr, nullptr, 16};
  EXPECT_EQ(gpu::copy_regions(&negative, 1, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(gpu::copy_regions(&null_src, 1, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace tandem
