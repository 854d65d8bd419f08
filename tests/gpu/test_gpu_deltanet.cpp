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

// A batched step: groups of tokens of several sequences (slots), each group's tokens in order on its
// own state, in one call, against one single-token call per token on the same state: outputs and
// states bit for bit (the same arithmetic per token). Then one group of three tokens keeping its
// states: copy 0 the state before, copy t + 1 the state after token t, bit for bit.
TEST_P(GpuDeltaNet, GroupsOfSequencesEqualSingleSteps) {
  TANDEM_REQUIRE_GPU();
  const DnCase c = GetParam();
  std::mt19937 rng(test::test_seed() + 11);
  const int conv_dim = 2 * c.Hk * c.dk + c.Hv * c.dv, Vd = c.Hv * c.dv, slots = 3;
  const int64_t conv_n = int64_t(c.kernel - 1) * conv_dim, state_n = int64_t(c.Hv) * c.dk * c.dv;
  const int64_t conv_stride = conv_n + 5, state_stride = state_n + 7;  // strides wider than a state, as the model's aligned ones
  const auto conv_w = test::random_floats(rng, conv_dim * c.kernel, 0.5f);
  auto A_log = test::random_floats(rng, c.Hv, 1.0f), dt = test::random_floats(rng, c.Hv), nw = test::random_floats(rng, c.dv, 0.3f);
  for (auto& v : nw) v += 1.0f;
  const auto window0 = test::random_floats(rng, slots * conv_stride), state0 = test::random_floats(rng, slots * state_stride, 0.1f);
  // tokens: 0 -> slot 1; 1, 2 -> slot 0 (in order); 3 -> slot 2
  const int n = 4;
  const std::vector<int32_t> group_slot = {1, 0, 2}, first = {0, 1, 3, 4};
  const auto qkv = test::random_floats(rng, n * conv_dim), z = test::random_floats(rng, n * Vd), b = test::random_floats(rng, n * c.Hv),
             a = test::random_floats(rng, n * c.Hv);
  test::DeviceBuffer<float> d_conv_w(conv_w), d_A(A_log), d_dt(dt), d_nw(nw), d_qkv(qkv), d_z(z), d_b(b), d_a(a);
  test::DeviceBuffer<float> win_a(window0), st_a(state0), win_b(window0), st_b(state0);
  test::DeviceBuffer<float> cout_a(n * conv_dim), cout_b(n * conv_dim), out_a(n * Vd), out_b(n * Vd);
  test::DeviceBuffer<int32_t> d_slot(group_slot), d_first(first);
  gpu::DeltaNetDecodeArgs p;
  p.conv_w = d_conv_w.ptr, p.A_log = d_A.ptr, p.dt_bias = d_dt.ptr, p.norm_w = d_nw.ptr;
  p.Hk = c.Hk, p.Hv = c.Hv, p.dk = c.dk, p.dv = c.dv, p.kernel = c.kernel;
  for (int g = 0; g < 3; ++g)  // one call per token, on the group's slot
    for (int t = first[g]; t < first[g + 1]; ++t) {
      gpu::DeltaNetDecodeArgs s = p;
      s.qkv = d_qkv.ptr + int64_t(t) * conv_dim, s.z = d_z.ptr + int64_t(t) * Vd, s.b = d_b.ptr + t * c.Hv, s.a = d_a.ptr + t * c.Hv;
      s.conv_state = win_a.ptr + group_slot[g] * conv_stride, s.state = st_a.ptr + group_slot[g] * state_stride;
      s.conv_out = cout_a.ptr + int64_t(t) * conv_dim, s.out = out_a.ptr + int64_t(t) * Vd;
      CUDA_OK(gpu::deltanet_decode(s, nullptr));
    }
  gpu::DeltaNetDecodeArgs m = p;
  m.qkv = d_qkv.ptr, m.z = d_z.ptr, m.b = d_b.ptr, m.a = d_a.ptr, m.conv_state = win_b.ptr, m.state = st_b.ptr;
  m.conv_out = cout_b.ptr, m.out = out_b.ptr;
  m.tokens = n, m.groups = 3, m.slot = d_slot.ptr, m.first = d_first.ptr, m.conv_stride = conv_stride, m.state_stride = state_stride;
  CUDA_OK(gpu::deltanet_decode(m, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  EXPECT_EQ(out_b.to_host(), out_a.to_host()) << "seed " << test::test_seed();
  EXPECT_EQ(st_b.to_host(), st_a.to_host());
  EXPECT_EQ(win_b.to_host(), win_a.to_host());

  // Kept states: slot 0 again, three tokens in one group (tokens 0..2 of the inputs).
  const int k = 3;
  test::DeviceBuffer<float> kept_conv((k + 1) * conv_stride), kept_state((k + 1) * state_stride);
  const std::vector<int32_t> one_slot = {0}, one_first = {0, k};
  test::DeviceBuffer<int32_t> d_one(one_slot), d_one_first(one_first);
  std::vector<std::vector<float>> want_w, want_s;  // before, then after each token, token by token on win_a / st_a
  auto snap = [&] {
    const auto w = win_a.to_host(), st = st_a.to_host();
    want_w.emplace_back(w.begin(), w.begin() + conv_n);
    want_s.emplace_back(st.begin(), st.begin() + state_n);
  };
  snap();
  for (int t = 0; t < k; ++t) {
    gpu::DeltaNetDecodeArgs s = p;
    s.qkv = d_qkv.ptr + int64_t(t) * conv_dim, s.z = d_z.ptr + int64_t(t) * Vd, s.b = d_b.ptr + t * c.Hv, s.a = d_a.ptr + t * c.Hv;
    s.conv_state = win_a.ptr, s.state = st_a.ptr, s.conv_out = cout_a.ptr, s.out = out_a.ptr + int64_t(t) * Vd;
    CUDA_OK(gpu::deltanet_decode(s, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    snap();
  }
  m.tokens = k, m.groups = 1, m.slot = d_one.ptr, m.first = d_one_first.ptr, m.kept_conv = kept_conv.ptr, m.kept_state = kept_state.ptr;
  CUDA_OK(gpu::deltanet_decode(m, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  const auto kw = kept_conv.to_host(), ks = kept_state.to_host(), ob = out_b.to_host(), oa = out_a.to_host();
  for (int j = 0; j <= k; ++j) {
    EXPECT_EQ(std::vector<float>(kw.begin() + j * conv_stride, kw.begin() + j * conv_stride + conv_n), want_w[j]) << "conv copy " << j;
    EXPECT_EQ(std::vector<float>(ks.begin() + j * state_stride, ks.begin() + j * state_stride + state_n), want_s[j]) << "state copy " << j;
  }
  EXPECT_EQ(std::vector<float>(ob.begin(), ob.begin() + k * Vd), std::vector<float>(oa.begin(), oa.begin() + k * Vd));
  m.groups = 2;  // kept states with two groups: refused
  EXPECT_EQ(gpu::deltanet_decode(m, nullptr), cudaErrorInvalidValue);
}

INSTANTIATE_TEST_SUITE_P(Shapes, GpuDeltaNet,
                         ::testing::Values(DnCase{16, 32, 128, 128, 4},  // Qwen3.5-35B-A3B
                                           DnCase{2, 4, 16, 24, 4},      // fixture bf16_fused
                                           DnCase{2, 2, 32, 32, 4}, DnCase{4, 4, 64, 8, 2},
                                           DnCase{2, 4, 32, 48, 3}));  // a head in 2 column slices

}  // namespace
}  // namespace tandem
