// GPU DeltaNet decode against the reference ops (runtime/models/qwen3_5_moe/ops_ref.h) over several consecutive steps,
// carrying conv and recurrent state: outputs and both states within fp32 rounding (2e-5 relative).
#include <cmath>

#include "gpu_core/deltanet.cuh"
#include "runtime/models/qwen3_5_moe/ops_ref.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/unit/test_util.h"

namespace tandem {
namespace {

struct DnCase {
  int Hk, Hv, dk, dv, kernel;
};

// One token through exactly the per-token path of Qwen35Moe::deltanet_forward (advances window and S).
std::vector<float> reference_step(const DnCase& c, const std::vector<float>& qkv, const std::vector<float>& z, const std::vector<float>& b,
                                  const std::vector<float>& a, const std::vector<float>& conv_w, const std::vector<float>& A_log,
                                  const std::vector<float>& dt, const std::vector<float>& nw, std::vector<float>& window,
                                  std::vector<float>& S) {
  const int conv_dim = 2 * c.Hk * c.dk + c.Hv * c.dv, Vd = c.Hv * c.dv;
  std::vector<float> conv(conv_dim), out(Vd), q(c.dk), k(c.dk), o(c.dv);
  ref::causal_conv_step(qkv.data(), window.data(), conv_w.data(), conv_dim, c.kernel, conv.data());
  const int64_t Kd = int64_t(c.Hk) * c.dk;
  for (int h = 0; h < c.Hv; ++h) {
    const int kh = h / (c.Hv / c.Hk);
    std::copy_n(conv.data() + kh * c.dk, c.dk, q.data());
    std::copy_n(conv.data() + Kd + kh * c.dk, c.dk, k.data());
    ref::l2norm(q.data(), c.dk, 1e-6f);
    ref::l2norm(k.data(), c.dk, 1e-6f);
    for (auto& v : q) v /= std::sqrt(float(c.dk));
    const float beta = ref::sigmoid(b[h]), g = -std::exp(A_log[h]) * ref::softplus(a[h] + dt[h]);
    ref::delta_rule_step(S.data() + int64_t(h) * c.dk * c.dv, q.data(), k.data(), conv.data() + 2 * Kd + h * c.dv, g, beta, c.dk,
                         c.dv, o.data());
    ref::rmsnorm_gated(o.data(), z.data() + h * c.dv, nw.data(), c.dv, 1e-6f, out.data() + h * c.dv);
  }
  return out;
}

class GpuDeltaNet : public ::testing::TestWithParam<DnCase> {};

// Five decode steps against the reference.
TEST_P(GpuDeltaNet, StepsMatchReference) {
  TANDEM_REQUIRE_GPU();
  const DnCase c = GetParam();
  std::mt19937 rng(test::test_seed());
  const int conv_dim = 2 * c.Hk * c.dk + c.Hv * c.dv, Vd = c.Hv * c.dv, steps = 5;
  const auto conv_w = test::random_floats(rng, conv_dim * c.kernel, 0.5f);
  auto A_log = test::random_floats(rng, c.Hv, 1.0f), dt = test::random_floats(rng, c.Hv), nw = test::random_floats(rng, c.dv, 0.3f);
  for (auto& v : nw) v += 1.0f;
  std::vector<float> window((c.kernel - 1) * conv_dim, 0.0f), S(int64_t(c.Hv) * c.dk * c.dv, 0.0f);

  test::DeviceBuffer<float> d_conv_w(conv_w), d_A(A_log), d_dt(dt), d_nw(nw), d_window(window), d_S(S);
  test::DeviceBuffer<float> d_qkv(conv_dim), d_z(Vd), d_b(c.Hv), d_a(c.Hv), d_cout(conv_dim), d_out(Vd);
  gpu::DeltaNetDecodeArgs p;
  p.qkv = d_qkv.ptr, p.z = d_z.ptr, p.b = d_b.ptr, p.a = d_a.ptr, p.conv_w = d_conv_w.ptr, p.conv_state = d_window.ptr;
  p.conv_out = d_cout.ptr, p.A_log = d_A.ptr, p.dt_bias = d_dt.ptr, p.norm_w = d_nw.ptr, p.state = d_S.ptr, p.out = d_out.ptr;
  p.Hk = c.Hk, p.Hv = c.Hv, p.dk = c.dk, p.dv = c.dv, p.kernel = c.kernel;

  for (int step = 0; step < steps; ++step) {
    const auto qkv = test::random_floats(rng, conv_dim), z = test::random_floats(rng, Vd), b = test::random_floats(rng, c.Hv),
               a = test::random_floats(rng, c.Hv);
    CUDA_OK(cudaMemcpy(d_qkv.ptr, qkv.data(), qkv.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_z.ptr, z.data(), z.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_b.ptr, b.data(), b.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_a.ptr, a.data(), a.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(gpu::deltanet_decode(p, nullptr));

    const std::vector<float> out = reference_step(c, qkv, z, b, a, conv_w, A_log, dt, nw, window, S);
    CUDA_OK(cudaDeviceSynchronize());
    const auto got = d_out.to_host();
    EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), std::vector<double>(out.begin(), out.end())), 2e-5)
        << "step " << step << " seed " << test::test_seed();
  }
  const auto gS = d_S.to_host(), gw = d_window.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(gS.begin(), gS.end()), std::vector<double>(S.begin(), S.end())), 2e-5);
  EXPECT_EQ(gw, window);  // the conv window is a copy of inputs: exact
}

// Prompts of the given lengths through `prefill` (one call each, states carried) beside the reference
// steps; check(T, got, want) judges each prompt's outputs ([T][Hv*dv]), and the final recurrent state
// must agree within state_tol, the conv window exactly (it is a copy of inputs).
template <typename Prefill, typename Check>
void prefill_vs_reference(const DnCase& c, unsigned seed, std::initializer_list<int> lengths, Prefill&& prefill, Check&& check,
                          double state_tol) {
  std::mt19937 rng(seed);
  const int conv_dim = 2 * c.Hk * c.dk + c.Hv * c.dv, Vd = c.Hv * c.dv;
  const auto conv_w = test::random_floats(rng, conv_dim * c.kernel, 0.5f);
  auto A_log = test::random_floats(rng, c.Hv, 1.0f), dt = test::random_floats(rng, c.Hv), nw = test::random_floats(rng, c.dv, 0.3f);
  for (auto& v : nw) v += 1.0f;
  std::vector<float> window((c.kernel - 1) * conv_dim, 0.0f), S(int64_t(c.Hv) * c.dk * c.dv, 0.0f);
  test::DeviceBuffer<float> d_conv_w(conv_w), d_A(A_log), d_dt(dt), d_nw(nw), d_window(window), d_S(S);
  for (const int T : lengths) {
    const auto qkv = test::random_floats(rng, T * conv_dim), z = test::random_floats(rng, T * Vd), b = test::random_floats(rng, T * c.Hv),
               a = test::random_floats(rng, T * c.Hv);
    test::DeviceBuffer<float> d_qkv(qkv), d_z(z), d_b(b), d_a(a), d_cout(T * conv_dim), d_out(T * Vd);
    gpu::DeltaNetDecodeArgs p;
    p.qkv = d_qkv.ptr, p.z = d_z.ptr, p.b = d_b.ptr, p.a = d_a.ptr, p.conv_w = d_conv_w.ptr, p.conv_state = d_window.ptr;
    p.conv_out = d_cout.ptr, p.A_log = d_A.ptr, p.dt_bias = d_dt.ptr, p.norm_w = d_nw.ptr, p.state = d_S.ptr, p.out = d_out.ptr;
    p.Hk = c.Hk, p.Hv = c.Hv, p.dk = c.dk, p.dv = c.dv, p.kernel = c.kernel;
    CUDA_OK(prefill(p, T));
    std::vector<float> want;
    for (int t = 0; t < T; ++t) {
      auto slice = [&](const std::vector<float>& v, int64_t n) { return std::vector<float>(v.begin() + t * n, v.begin() + (t + 1) * n); };
      const auto o = reference_step(c, slice(qkv, conv_dim), slice(z, Vd), slice(b, c.Hv), slice(a, c.Hv), conv_w, A_log, dt, nw, window, S);
      want.insert(want.end(), o.begin(), o.end());
    }
    CUDA_OK(cudaDeviceSynchronize());
    check(T, d_out.to_host(), want);
  }
  const auto gS = d_S.to_host(), gw = d_window.to_host();
  EXPECT_LT(test::rel_l2(std::vector<double>(gS.begin(), gS.end()), std::vector<double>(S.begin(), S.end())), state_tol);
  EXPECT_EQ(gw, window);
}

// Prefill (deltanet_prefill_chunked, the chunk terms computed first into DeltaNetDecodeArgs::
// chunk_terms): prompts of 300, 100, 37, 5 and 2 tokens in one call each (ten chunks of 32 through the
// state, a partial one, fewer tokens than the conv history), every token's output and the final states
// against the reference's token-by-token steps. Another summation order (small matrix products over a
// chunk, cumulative log decays, the forward substitution as an explicit inverse): 1e-4. Without the
// scratch it refuses. With one chunk buffer in shared memory
// (what a 99 KB-a-block card gets) and with the device's choice (two on the H200).
TEST_P(GpuDeltaNet, ChunkedPrefillMatchesReference) {
  TANDEM_REQUIRE_GPU();
  const DnCase c = GetParam();
  for (const int buffers : {1, 0}) {
    prefill_vs_reference(
        c, test::test_seed() + 3, {300, 100, 37, 5, 2},
        [&](gpu::DeltaNetDecodeArgs p, int T) {
          p.wy_buffers = buffers;
          p.chunk_terms = nullptr;
          EXPECT_EQ(gpu::deltanet_prefill_chunked(p, T, nullptr), cudaErrorInvalidValue) << "no chunk-terms scratch";
          test::DeviceBuffer<float> terms(gpu::deltanet_chunk_terms_floats(T, c.Hv));
          cudaMemset(terms.ptr, 0xff, terms.n * sizeof(float));  // NaN: a term read before it is written shows
          p.chunk_terms = terms.ptr;
          const cudaError_t rc = gpu::deltanet_prefill_chunked(p, T, nullptr);
          const cudaError_t done = cudaDeviceSynchronize();  // before the scratch is freed
          return rc != cudaSuccess ? rc : done;
        },
        [&](int T, const std::vector<float>& got, const std::vector<float>& want) {
          EXPECT_LT(test::rel_l2(std::vector<double>(got.begin(), got.end()), std::vector<double>(want.begin(), want.end())), 1e-4)
              << T << " tokens, " << buffers << " buffers (0: the device's choice), seed " << test::test_seed();
        },
        1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuDeltaNet,
                         ::testing::Values(DnCase{16, 32, 128, 128, 4},  // Qwen3.5-35B-A3B
                                           DnCase{2, 4, 16, 24, 4},      // fixture bf16_fused
                                           DnCase{2, 2, 32, 32, 4}, DnCase{4, 4, 64, 8, 2}));

}  // namespace
}  // namespace tandem
