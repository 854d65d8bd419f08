// GPU GEMV kernels against the CPU definition of the same weights (core/weights.h), on fresh
// random inputs at the 35B model's shapes and odd ones. Bounds follow the arithmetic: bf16 weights
// with fp32 math ~1e-6; int4 with fp16 activations and fp16 partial sums over 32 inputs: 3e-3.
#include <cmath>
#include <tuple>

#include "gpu_core/gemm.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_layout.h"
#include "gpu_core/rows8_layout.h"
#include "gpu_core/ops.cuh"
#include "core/weights.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/gpu/gptq_random.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

std::vector<double> reference(const LinearWeight& w, const std::vector<float>& x, int T) {
  std::vector<double> y(T * w.out, 0.0);
  std::vector<float> row(w.in);
  for (int64_t n = 0; n < w.out; ++n) {
    w.dequant_row(n, row.data());
    for (int t = 0; t < T; ++t)
      for (int64_t k = 0; k < w.in; ++k) y[t * w.out + n] += double(row[k]) * x[t * w.in + k];
  }
  return y;
}

// A random bf16 nn.Linear [N, K] (weights in W, which must outlive the view).
LinearWeight random_bf16_linear(int64_t N, int64_t K, std::mt19937& rng, std::vector<uint16_t>& W) {
  W.resize(N * K);
  for (auto& v : W) v = f32_to_bf16(std::normal_distribution<float>(0, 0.05f)(rng));
  LinearWeight lw;
  lw.kind = LinearWeight::Kind::Dense;
  lw.out = N;
  lw.in = K;
  lw.dense = W.data();
  lw.dense_dtype = DType::BF16;
  return lw;
}

struct Shape {
  int64_t N, K;
  int T;
};

class GpuGemvBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuGemvBf16, MatchesReference) {
  TANDEM_REQUIRE_GPU();
  const auto [N, K, T] = GetParam();
  std::mt19937 rng(test::test_seed());
  std::vector<uint16_t> W;
  const LinearWeight lw = random_bf16_linear(N, K, rng, W);
  const auto x = test::random_floats(rng, T * K);
  test::DeviceBuffer<uint16_t> dW(W);
  test::DeviceBuffer<float> dx(x), dy(T * N);
  CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr, T, dy.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dy.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), reference(lw, x, T)), 1e-5) << "seed " << test::test_seed();
}

// gemv_bf16_swiglu (the shared expert's down projection with silu(gate) * up formed as it reads):
// bit for bit silu_mul then gemv_bf16, and within 1e-5 of the double reference of the same product.
TEST_P(GpuGemvBf16, SwigluEqualsSiluMulThenGemv) {
  TANDEM_REQUIRE_GPU();
  const auto [N, K, T] = GetParam();
  std::mt19937 rng(test::test_seed() + 11);
  std::vector<uint16_t> W;
  const LinearWeight lw = random_bf16_linear(N, K, rng, W);
  const auto g = test::random_floats(rng, T * K, 4.0f), u = test::random_floats(rng, T * K);
  test::DeviceBuffer<uint16_t> dW(W);
  test::DeviceBuffer<float> dg(g), du(u), dfused(T * N), dtwo(T * N);
  CUDA_OK(gpu::gemv_bf16_swiglu(dW.ptr, N, K, dg.ptr, du.ptr, T, dfused.ptr, nullptr));
  CUDA_OK(gpu::silu_mul(dg.ptr, du.ptr, T * K, nullptr));
  CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dg.ptr, T, dtwo.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(dfused.to_host(), dtwo.to_host()) << "seed " << test::test_seed();
  std::vector<float> x(T * K);
  for (int64_t i = 0; i < T * K; ++i) x[i] = static_cast<float>(g[i] / (1.0 + std::exp(-double(g[i]))) * u[i]);
  const auto y = dfused.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), reference(lw, x, T)), 1e-5) << "seed " << test::test_seed();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGemvBf16,
                         ::testing::Values(Shape{8192, 2048, 1}, Shape{2048, 4096, 1}, Shape{512, 2048, 4}, Shape{32, 2048, 8},
                                           Shape{1031, 48, 3}, Shape{13, 8, 1}));

// Several tokens (T = 2..8: gemv_bf16_mma_kernel, tensor cores on split-bf16 activations) at the
// model's shapes and ragged ones (rows not a multiple of 16, inputs not of 64, a single row): within
// 1e-5 of the double reference; the tokens' outputs within 1e-5 of the one-token launches' (exact fp32
// products there, split-bf16 here); and bit for bit the same whatever the launch's other tokens are,
// and however many (a batched step's sequences do not disturb each other).
TEST(GpuGemvBf16Tokens, MatchTheReferenceAndDoNotDependOnTheOtherTokens) {
  TANDEM_REQUIRE_GPU();
  for (const Shape sh : {Shape{8192, 2048, 8}, Shape{8192, 2048, 2}, Shape{4100, 1024, 5}, Shape{8200, 512, 3}, Shape{2048, 4096, 4},
                         Shape{1031, 48, 7}, Shape{13, 8, 2}, Shape{1, 2048, 8}}) {
    const auto [N, K, T] = sh;
    std::mt19937 rng(test::test_seed() + static_cast<unsigned>(N + T));
    std::vector<uint16_t> W;
    const LinearWeight lw = random_bf16_linear(N, K, rng, W);
    const auto x = test::random_floats(rng, T * K);
    auto others = test::random_floats(rng, T * K);  // token 0 of x, the rest redrawn
    std::copy(x.begin(), x.begin() + K, others.begin());
    test::DeviceBuffer<uint16_t> dW(W);
    test::DeviceBuffer<float> dx(x), dothers(others), dy(T * N), dy2(T * N), d1(N);
    CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr, T, dy.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto y = dy.to_host();
    EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), reference(lw, x, T)), 1e-5) << N << "x" << K << " T " << T;
    std::vector<double> alone;  // the tokens one launch each (over all of them: a single row's dot can cancel)
    for (int t = 0; t < T; ++t) {
      CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr + int64_t(t) * K, 1, d1.ptr, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto one = d1.to_host();
      alone.insert(alone.end(), one.begin(), one.end());
    }
    EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), alone), 1e-5) << N << "x" << K << " T " << T << " against one-token launches";
    const std::vector<float> first(y.begin(), y.begin() + N);
    for (const int T2 : {T, 2}) {
      CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dothers.ptr, T2, dy2.ptr, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto y2 = dy2.to_host();
      EXPECT_EQ(std::vector<float>(y2.begin(), y2.begin() + N), first) << N << "x" << K << ": token 0 with other company, T " << T2;
    }
  }
}

// Prefill GEMM (cuBLAS, split-bf16 activations): the same definition and the same 1e-5 bound.
class GpuGemmBf16 : public ::testing::TestWithParam<Shape> {};

TEST_P(GpuGemmBf16, MatchesReference) {
  TANDEM_REQUIRE_GPU();
  const auto [N, K, T] = GetParam();
  std::mt19937 rng(test::test_seed());
  std::vector<uint16_t> W;
  const LinearWeight lw = random_bf16_linear(N, K, rng, W);
  const auto x = test::random_floats(rng, T * K);
  test::DeviceBuffer<uint16_t> dW(W), split(2 * T * K);
  test::DeviceBuffer<float> dx(x), dy(T * N);
  gpu::BlasHandle h = nullptr;
  CUDA_OK(gpu::blas_create(&h));
  CUDA_OK(gpu::gemm_bf16(h, dW.ptr, N, K, dx.ptr, T, split.ptr, dy.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  gpu::blas_destroy(h);
  const auto y = dy.to_host();
  const std::vector<double> ref = reference(lw, x, T);
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), ref), 1e-5) << "seed " << test::test_seed();
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGemmBf16,
                         ::testing::Values(Shape{8192, 2048, 64}, Shape{2048, 4096, 33}, Shape{256, 2048, 512}, Shape{1031, 48, 7},
                                           Shape{13, 8, 1}));

struct Int4Case {
  int64_t N, K, gs;
  int T;
  bool sym, act_order, v1;
};

class GpuGemvInt4 : public ::testing::TestWithParam<Int4Case> {};

TEST_P(GpuGemvInt4, MatchesDequantizedReference) {
  TANDEM_REQUIRE_GPU();
  const Int4Case c = GetParam();
  std::mt19937 rng(test::test_seed());
  const test::RandomGptq m(rng, c.N, c.K, c.gs, c.sym, c.act_order, c.v1);
  const LinearWeight lw = m.view();
  const gpu::Int4Host h = gpu::repack_gptq_int4(m.source());
  EXPECT_EQ(h.permuted, c.act_order);  // the host layout itself is checked in tests/unit/test_int4_layout.cpp
  const auto x = test::random_floats(rng, c.T * c.K);
  test::DeviceBuffer<uint32_t> dq(h.qweight);
  test::DeviceBuffer<uint16_t> ds(h.scales), dxh(c.T * c.K);
  test::DeviceBuffer<uint8_t> dz(h.zeros);
  test::DeviceBuffer<int32_t> dperm(h.perm);
  test::DeviceBuffer<float> dx(x), dy(c.T * c.N);
  CUDA_OK(gpu::gather_x_half(dx.ptr, h.permuted ? dperm.ptr : nullptr, c.K, c.T, dxh.ptr, nullptr));
  gpu::Int4View v{dq.ptr, ds.ptr, dz.ptr, c.N, c.K, c.gs, nullptr};
  CUDA_OK(gpu::gemv_int4(v, dxh.ptr, c.T, dy.ptr, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dy.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), reference(lw, x, c.T)), 3e-3) << "seed " << test::test_seed();
}

// W8A16: the 8-bit rows (int8 and fp8) with their scales against the dequantized weights' fp64 product
// (fp32 sums: 1e-5), one token (fp32 products) and several (tensor cores), the 35B's dense shapes and
// small odd ones; several tokens within 1e-5 of one-token launches, and a token's outputs do not depend
// on the others.
struct Rows8Case {
  int64_t N, K;
};

// y [T, N] of 8-bit rows in double: each code's value times its row's scale, times x (with `magnitude`:
// the sum of the products' absolute values instead, the scale a dot's rounding errors are bounded by).
std::vector<double> rows8_reference(const gpu::Rows8Host& h, const std::vector<float>& x, int64_t N, int64_t K, int64_t T, bool magnitude = false) {
  std::vector<double> y(T * N, 0.0);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(row_decode(h.codes[n * K + gpu::rows8_position(K, k)], h.format)) * h.scales[n] * x[t * K + k];
        y[t * N + n] += magnitude ? std::abs(p) : p;
      }
  return y;
}

// ||y - want|| over ||magnitude||: the error against the size of the products summed, which a dot that
// cancels (a single short row) does not inflate as a relative error does.
double error_over_magnitude(const std::vector<float>& y, const std::vector<double>& want, const std::vector<double>& magnitude) {
  double e = 0, m = 0;
  for (size_t i = 0; i < y.size(); ++i) e += (y[i] - want[i]) * (y[i] - want[i]), m += magnitude[i] * magnitude[i];
  return std::sqrt(e / m);
}

// A random bf16 [N, K] matrix quantized to 8-bit rows of f, on the device.
struct DeviceRows8 {
  gpu::Rows8Host h;
  test::DeviceBuffer<uint8_t> dq;
  test::DeviceBuffer<float> ds;
  gpu::Rows8View v;
  DeviceRows8(std::mt19937& rng, int64_t N, int64_t K, RowFormat f) : h(quantized(rng, N, K, f)), dq(h.codes), ds(h.scales), v{dq.ptr, ds.ptr, N, K, f} {}
  static gpu::Rows8Host quantized(std::mt19937& rng, int64_t N, int64_t K, RowFormat f) {
    std::vector<uint16_t> W;
    random_bf16_linear(N, K, rng, W);
    return gpu::quantize_rows8(W.data(), N, K, f);
  }
};

class GpuGemvRows8 : public ::testing::TestWithParam<std::tuple<Rows8Case, RowFormat>> {};

TEST_P(GpuGemvRows8, MatchesDequantizedReference) {
  TANDEM_REQUIRE_GPU();
  const Rows8Case c = std::get<0>(GetParam());
  const RowFormat f = std::get<1>(GetParam());
  std::mt19937 rng(test::test_seed());
  const DeviceRows8 m(rng, c.N, c.K, f);
  const gpu::Rows8Host& h = m.h;
  const gpu::Rows8View& v = m.v;
  for (int T : {1, 2, 3, 8}) {
    const auto x = test::random_floats(rng, T * c.K);
    test::DeviceBuffer<float> dx(x), dy(T * c.N);
    CUDA_OK(gpu::gemv_rows8(v, dx.ptr, T, dy.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const auto y = dy.to_host();
    const std::vector<double> want = rows8_reference(h, x, c.N, c.K, T);
    if (T == 1) {  // exact products, fp32 sums
      EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), want), 1e-5) << row_format_name(f) << ", seed " << test::test_seed();
      continue;
    }
    // several tokens on tensor cores: x to ~2^-17 (split bf16), then exact products and fp32 sums, so
    // within 1e-5 of the products' magnitude (a relative error of a 16-input row that cancels can pass
    // 1e-5: 1.1e-5 was seen); against one-token launches (fp32 products) the same; token 0 bit for bit
    // the same whatever its company and however much of it
    const std::vector<double> magnitude = rows8_reference(h, x, c.N, c.K, T, true);
    EXPECT_LT(error_over_magnitude(y, want, magnitude), 1e-5) << row_format_name(f) << " T " << T << ", seed " << test::test_seed();
    std::vector<double> alone;
    test::DeviceBuffer<float> d1(c.N), d2(c.N);
    for (int t = 0; t < T; ++t) {
      CUDA_OK(gpu::gemv_rows8(v, dx.ptr + int64_t(t) * c.K, 1, d1.ptr, nullptr));
      CUDA_OK(gpu::gemv_rows8(v, dx.ptr + int64_t(t) * c.K, 1, d2.ptr, nullptr, true));
      CUDA_OK(cudaDeviceSynchronize());
      const auto one = d1.to_host();
      EXPECT_EQ(d2.to_host(), one) << "early_next changes when the next kernel may launch, not the sums";
      alone.insert(alone.end(), one.begin(), one.end());
    }
    EXPECT_LT(error_over_magnitude(y, alone, magnitude), 1e-5) << row_format_name(f) << " T " << T << " against one-token launches";
    auto others = test::random_floats(rng, 8 * c.K);
    std::copy(x.begin(), x.begin() + c.K, others.begin());
    test::DeviceBuffer<float> dothers(others), dy2(8 * c.N);
    for (const int T2 : {T, 2, 8}) {
      CUDA_OK(gpu::gemv_rows8(v, dothers.ptr, T2, dy2.ptr, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto y2 = dy2.to_host();
      EXPECT_TRUE(std::equal(y.begin(), y.begin() + c.N, y2.begin())) << row_format_name(f) << ": token 0 with other company, T " << T2;
    }
  }
  test::DeviceBuffer<float> dx(c.K), dy(c.N);
  EXPECT_EQ(gpu::gemv_rows8(v, dx.ptr, gpu::kMaxGemvTokens + 1, dy.ptr, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
}

// gemv_rows8_swiglu (the shared expert's down projection as 8-bit rows, silu(gate) * up formed as it
// reads): bit for bit silu_mul then gemv_rows8, at one token and several.
TEST_P(GpuGemvRows8, SwigluEqualsSiluMulThenGemv) {
  TANDEM_REQUIRE_GPU();
  const Rows8Case c = std::get<0>(GetParam());
  const RowFormat f = std::get<1>(GetParam());
  std::mt19937 rng(test::test_seed() + 11);
  const DeviceRows8 m(rng, c.N, c.K, f);
  const gpu::Rows8View& v = m.v;
  for (int T : {1, 5}) {
    const auto g = test::random_floats(rng, T * c.K, 4.0f), u = test::random_floats(rng, T * c.K);
    test::DeviceBuffer<float> dg(g), du(u), dfused(T * c.N), dtwo(T * c.N);
    CUDA_OK(gpu::gemv_rows8_swiglu(v, dg.ptr, du.ptr, T, dfused.ptr, nullptr));
    CUDA_OK(gpu::silu_mul(dg.ptr, du.ptr, T * c.K, nullptr));
    CUDA_OK(gpu::gemv_rows8(v, dg.ptr, T, dtwo.ptr, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(dfused.to_host(), dtwo.to_host()) << row_format_name(f) << " T " << T << ", seed " << test::test_seed();
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGemvRows8,
                         ::testing::Combine(::testing::Values(Rows8Case{8192, 2048}, Rows8Case{2048, 4096}, Rows8Case{256, 2048}, Rows8Case{40, 1552}, Rows8Case{37, 64},
                                                              Rows8Case{1, 16}),
                                            ::testing::Values(RowFormat::Int8, RowFormat::Fp8)));

// A stacked matrix's outputs split by member (gpu::RowsOut: a step's stacked projections, qkv|z|b|a,
// router|shared gate|up|gate logit) are bit for bit what each member's own launch writes, at one token
// (the one-warp-a-row kernels) and several (bf16 on tensor cores, 8-bit rows); layouts that do not cover
// the matrix are refused.
TEST(GpuGemvStacked, PartsEqualTheMembersAlone) {
  TANDEM_REQUIRE_GPU();
  std::mt19937 rng(test::test_seed());
  const int64_t K = 512;
  const std::vector<int64_t> members = {384, 96, 32, 1};  // rows; the last as the shared expert's gate logit
  int64_t N = 0;
  for (int64_t m : members) N += m;
  std::vector<uint16_t> W;
  random_bf16_linear(N, K, rng, W);
  const gpu::Rows8Host h8 = gpu::quantize_rows8(W.data(), N, K, RowFormat::Int8);
  test::DeviceBuffer<uint16_t> dW(W);
  test::DeviceBuffer<uint8_t> dq(h8.codes);
  test::DeviceBuffer<float> ds(h8.scales);
  for (bool rows8 : {false, true}) {
    for (int T : {1, 3, 8}) {
      const auto x = test::random_floats(rng, T * K);
      test::DeviceBuffer<float> dx(x), dparts(T * N), dalone(T * N);
      gpu::RowsOut out;
      int64_t row = 0, at = 0;
      for (int64_t m : members) {  // member s's rows [T, m] at dparts + at, and alone at dalone + at
        out.dst[out.parts] = dparts.ptr + at;
        out.end[out.parts++] = row + m;
        if (rows8) {
          const gpu::Rows8View part{dq.ptr + row * K, ds.ptr + row, m, K, RowFormat::Int8};
          CUDA_OK(gpu::gemv_rows8(part, dx.ptr, T, dalone.ptr + at, nullptr));
        } else {
          CUDA_OK(gpu::gemv_bf16(dW.ptr + row * K, m, K, dx.ptr, T, dalone.ptr + at, nullptr));
        }
        row += m, at += T * m;
      }
      if (rows8) CUDA_OK(gpu::gemv_rows8(gpu::Rows8View{dq.ptr, ds.ptr, N, K, RowFormat::Int8}, dx.ptr, T, out, nullptr));
      else CUDA_OK(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr, T, out, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const auto got = dparts.to_host(), want = dalone.to_host();
      EXPECT_EQ(got, want) << (rows8 ? "8-bit rows" : "bf16") << ", T " << T << ", seed " << test::test_seed();
      if (rows8 || T != 3) continue;
      gpu::RowsOut short_of = out;  // the parts end before the matrix does
      short_of.end[short_of.parts - 1] = N - 1;
      EXPECT_EQ(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr, T, short_of, nullptr), cudaErrorInvalidValue);
      gpu::RowsOut no_dst = out;
      no_dst.dst[1] = nullptr;
      EXPECT_EQ(gpu::gemv_bf16(dW.ptr, N, K, dx.ptr, T, no_dst, nullptr), cudaErrorInvalidValue);
      gpu::RowsOut backwards = out;
      backwards.end[1] = backwards.end[0];
      EXPECT_EQ(gpu::gemv_rows8(gpu::Rows8View{dq.ptr, ds.ptr, N, K, RowFormat::Int8}, dx.ptr, T, backwards, nullptr), cudaErrorInvalidValue);
      cudaGetLastError();
    }
  }
}

// A prompt chunk's 8-bit projection (gemm_rows8: the codes as bf16, exactly, on cuBLAS with split-bf16
// activations, each output times its row's scale): the GEMV's definition and gemm_bf16's 1e-5 bound,
// and within 2e-5 of the GEMV itself 8 tokens at a time; a K the GEMM cannot take is refused.
class GpuGemmRows8 : public ::testing::TestWithParam<std::tuple<Shape, RowFormat>> {};

TEST_P(GpuGemmRows8, MatchesDequantizedReferenceAndTheGemv) {
  TANDEM_REQUIRE_GPU();
  const auto [N, K, T] = std::get<0>(GetParam());
  const RowFormat f = std::get<1>(GetParam());
  std::mt19937 rng(test::test_seed());
  std::vector<uint16_t> W;
  random_bf16_linear(N, K, rng, W);
  const gpu::Rows8Host h = gpu::quantize_rows8(W.data(), N, K, f);
  test::DeviceBuffer<uint8_t> dq(h.codes);
  test::DeviceBuffer<float> ds(h.scales);
  const gpu::Rows8View v{dq.ptr, ds.ptr, N, K, f};
  const auto x = test::random_floats(rng, T * K);
  test::DeviceBuffer<float> dx(x), dy(T * N), dg(T * N);
  test::DeviceBuffer<uint16_t> split(2 * T * K), codes(N * K);
  gpu::BlasHandle blas = nullptr;
  CUDA_OK(gpu::blas_create(&blas));
  CUDA_OK(gpu::gemm_rows8(blas, v, dx.ptr, T, split.ptr, codes.ptr, dy.ptr, nullptr));
  for (int64_t t = 0; t < T; t += gpu::kMaxGemvTokens)
    CUDA_OK(gpu::gemv_rows8(v, dx.ptr + t * K, static_cast<int>(std::min<int64_t>(gpu::kMaxGemvTokens, T - t)), dg.ptr + t * N, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto y = dy.to_host(), g = dg.to_host();
  const std::vector<double> want = rows8_reference(h, x, N, K, T);
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), want), 1e-5) << row_format_name(f) << ", seed " << test::test_seed();
  EXPECT_LT(test::rel_l2(std::vector<double>(y.begin(), y.end()), std::vector<double>(g.begin(), g.end())), 2e-5) << "against the GEMV";
  const gpu::Rows8View odd{dq.ptr, ds.ptr, 1, 12, f};
  EXPECT_EQ(gpu::gemm_rows8(blas, odd, dx.ptr, 1, split.ptr, codes.ptr, dy.ptr, nullptr), cudaErrorInvalidValue);
  cudaGetLastError();
  gpu::blas_destroy(blas);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuGemmRows8,
                         ::testing::Combine(::testing::Values(Shape{8192, 2048, 64}, Shape{2048, 4096, 33}, Shape{256, 2048, 300}, Shape{40, 1552, 17}, Shape{37, 64, 5}),
                                            ::testing::Values(RowFormat::Int8, RowFormat::Fp8)));

INSTANTIATE_TEST_SUITE_P(Formats, GpuGemvInt4,
                         ::testing::Values(Int4Case{512, 2048, 128, 1, true, false, true},   // 35B gate/up, official format
                                           Int4Case{2048, 512, 128, 1, true, false, true},   // 35B down
                                           Int4Case{512, 2048, 128, 4, false, false, false},
                                           Int4Case{256, 1024, 32, 8, false, true, true},    // act-order, asym, v1
                                           Int4Case{48, 48, 16, 3, false, true, false},      // the fixtures' odd sizes
                                           Int4Case{64, 96, 32, 2, true, false, false}));    // K not a multiple of 32

}  // namespace
}  // namespace tandem
