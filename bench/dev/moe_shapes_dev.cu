// bench/dev/moe_shapes_dev.cu: an experiment, not on the engine's path (bench_dev_moe_shapes).
//
// Question (issue 25): with the decode MoE's products on dp4a (moe_int4_wide.cu, stop 48) the kernels
// are no longer issue-bound, yet one layer at 8 tokens takes ~48 us against 31.5 us of bytes (H100).
// The fp16 form spread its work thin because it was issue-bound (one gate/up row pair a warp, one down
// row a half-warp); is that still the best shape? Each kernel here is the engine's, with the work per
// thread and per block changed and every row's arithmetic kept, so each variant's output is checked
// bit for bit against the engine's (no new arithmetic to trust):
//   gate/up <W, RU>: W warps a block, RU rows of gate and up a warp (W * RU = 32: a block's rows are one
//     vector of h, quantised by its first warp). The engine: W 8, RU 4.
//   down <RPH>: a half-warp takes RPH rows (the engine: 1), a block 4 RPH rows of one token.
// The engine's kernels take the shapes at run time (128 registers in gate/up); these take them at
// compile time (80), and gate/up 8x4 also with them at run time ("rt"), which the engine is.
// It times each alone (x and h quantised once by the engine's call), experts from HBM (32 routings
// cycled), at 1 / 2 / 4 / 8 tokens, and the engine's whole call beside them.
// Usage: bench_dev_moe_shapes (a CUDA device, sm_80+).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gpu_core/act_quant.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace {

#define DEV_CK(x)                                                                                \
  do {                                                                                           \
    const cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

using namespace tandem::gpu;
using namespace tandem::gpu::detail;

constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8, kSets = 32;
constexpr int kGshift = 2;  // group 128 = 32 << 2
constexpr int kDownLanes = 16, kDownRows = 4, kDownGroups = 4, kDownPer = K / kDownGroups;

// The engine's gate/up (moe_int4_wide.cu) with W warps of RU rows: the 35B shape, NV 2; RT: the row
// stride and group count as the engine has them, run-time arguments (else compile-time constants).
template <int W, int RU, bool RT = false>
__global__ void __launch_bounds__(W * 32) gate_up_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, int k,
                                                         const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs,
                                                         uint8_t* __restrict__ hq, VecScale* __restrict__ hs, int rt_nvec, int rt_groups,
                                                         int rt_gshift) {
  static_assert(W * RU == 32, "a block's rows are one vector of h");
  constexpr int NV = 2;
  const int nvec = RT ? rt_nvec : H / 32, G = RT ? rt_groups : H / kGroup, gshift = RT ? rt_gshift : kGshift;
  __shared__ float hb[32];
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  const int r0 = static_cast<int>(blockIdx.x) * 32 + warp * RU;
  const uint4* qg = reinterpret_cast<const uint4*>(gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(up.qweight);
  uint4 wg[RU][NV], wu[RU][NV];
  uint16_t sg[RU][NV], su[RU][NV];
  uint8_t zg[RU][NV], zu[RU][NV];
#pragma unroll
  for (int r = 0; r < RU; ++r)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = lane + 32 * i, row = r0 + r, gi = row * G + (v >> gshift);
      wg[r][i] = load_stream(qg + row * nvec + v);
      wu[r][i] = load_stream(qu + row * nvec + v);
      sg[r][i] = __ldg(gate.scales + gi);
      su[r][i] = __ldg(up.scales + gi);
      zg[r][i] = __ldg(gate.zeros + gi);
      zu[r][i] = __ldg(up.zeros + gi);
    }
  const uint8_t* xt = xq + static_cast<int64_t>(t) * H * 2;
  float g[RU] = {}, u[RU] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = lane + 32 * i;
    uint4 xv[4];
    load_vector(xt, v, nvec, xv);
    const VecScale s = xs[t * nvec + v];
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      g[r] += __half2float(__ushort_as_half(sg[r][i])) * vec_dot(wg[r][i], xv, 16 * zg[r][i], s);
      u[r] += __half2float(__ushort_as_half(su[r][i])) * vec_dot(wu[r][i], xv, 16 * zu[r][i], s);
    }
  }
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == 0) hb[warp * RU + r] = gs / (1.0f + __expf(-gs)) * us;
  }
  __syncthreads();
  constexpr int nh = I / 32;
  if (warp == 0) quantise_vector(hb[lane], blockIdx.x, nh, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * nh);
}

// The engine's down with RPH rows a half-warp: half-warp (r, g) takes rows (4 b + r) RPH + j, j < RPH,
// each row's experts g, g + 4 weighted, summed over its lanes; the block adds the 4 shares of each
// row in group order (every row's arithmetic the engine's). I = 512: one vector a lane.
template <int RPH>
__global__ void __launch_bounds__(kDownRows * kDownGroups * kDownLanes)
    down_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids, const float* __restrict__ weights, int k,
                const uint8_t* __restrict__ hq, const VecScale* __restrict__ hs, float* __restrict__ out) {
  constexpr int nvec = I / 32, G = I / kGroup;
  __shared__ float share[kDownGroups][kDownRows * RPH];
  const int t = blockIdx.y, hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes;
  const int r = hw % kDownRows, g = hw / kDownRows;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kDownRows + r) * RPH;
  const Int4View* d[kDownPer];
  uint4 wd[RPH][kDownPer];
  uint16_t sd[RPH][kDownPer];
  uint8_t zd[RPH][kDownPer];
  float rw[kDownPer];
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int j = g + kDownGroups * m;
    d[m] = &experts[ids[t * k + j]].down;
    rw[m] = __ldg(weights + t * k + j);
  }
#pragma unroll
  for (int j = 0; j < RPH; ++j)
#pragma unroll
    for (int m = 0; m < kDownPer; ++m) {
      const int64_t row = row0 + j, gi = row * G + (l >> kGshift);
      wd[j][m] = load_stream(reinterpret_cast<const uint4*>(d[m]->qweight) + row * nvec + l);
      sd[j][m] = __ldg(d[m]->scales + gi);
      zd[j][m] = __ldg(d[m]->zeros + gi);
    }
  float acc[RPH];
#pragma unroll
  for (int j = 0; j < RPH; ++j) acc[j] = 0.0f;
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int64_t p = static_cast<int64_t>(t) * k + g + kDownGroups * m;
    uint4 hv[4];
    load_vector(hq + p * I * 2, l, nvec, hv);
    const VecScale s = hs[p * nvec + l];
#pragma unroll
    for (int j = 0; j < RPH; ++j) acc[j] += rw[m] * (__half2float(__ushort_as_half(sd[j][m])) * vec_dot(wd[j][m], hv, 16 * zd[j][m], s));
  }
#pragma unroll
  for (int j = 0; j < RPH; ++j) {
    const float a = group_sum<kDownLanes>(acc[j]);
    if (l == 0) share[g][r * RPH + j] = a;
  }
  __syncthreads();
  if (threadIdx.x < kDownRows * RPH) {
    float sum = share[0][threadIdx.x];
#pragma unroll
    for (int q = 1; q < kDownGroups; ++q) sum += share[q][threadIdx.x];
    out[static_cast<int64_t>(t) * H + static_cast<int64_t>(blockIdx.x) * kDownRows * RPH + threadIdx.x] = sum;
  }
}

// ---- host side ----

uint16_t half_bits(float f) {  // positive normal values only
  const __half h = __float2half_rn(f);
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}

// Random experts in the engine's row layout (codes, fp16 scales, zero points 0..15), one pool.
struct Experts {
  std::vector<Int4Expert> table;
  char* pool = nullptr;
  explicit Experts(std::mt19937& rng) {
    auto bytes_of = [](int64_t N, int64_t Kin) { return N * Kin / 2 + N * (Kin / kGroup) * 3 + 256; };
    const int64_t per = 2 * bytes_of(I, H) + bytes_of(H, I);
    DEV_CK(cudaMalloc(&pool, E * per));
    std::vector<char> host(static_cast<size_t>(per));
    char* dev = pool;
    table.resize(E);
    for (int e = 0; e < E; ++e) {
      char* h = host.data();
      int64_t off = 0;
      auto carve = [&](int64_t N, int64_t Kin) {
        Int4View v{};
        v.N = N, v.K = Kin, v.group_size = kGroup;
        auto* q = reinterpret_cast<uint32_t*>(h + off);
        for (int64_t i = 0; i < N * Kin / 8; ++i) q[i] = static_cast<uint32_t>(rng());
        v.qweight = reinterpret_cast<const uint32_t*>(dev + off);
        off += N * Kin / 2;
        auto* s = reinterpret_cast<uint16_t*>(h + off);
        for (int64_t i = 0; i < N * (Kin / kGroup); ++i) s[i] = half_bits(std::uniform_real_distribution<float>(0.002f, 0.02f)(rng));
        v.scales = reinterpret_cast<const uint16_t*>(dev + off);
        off += N * (Kin / kGroup) * 2;
        auto* z = reinterpret_cast<uint8_t*>(h + off);
        for (int64_t i = 0; i < N * (Kin / kGroup); ++i) z[i] = static_cast<uint8_t>(rng() % 16);
        v.zeros = reinterpret_cast<const uint8_t*>(dev + off);
        off = (off + N * (Kin / kGroup) + 255) / 256 * 256;
        return v;
      };
      table[e] = {carve(I, H), carve(I, H), carve(H, I)};
      DEV_CK(cudaMemcpy(dev, host.data(), static_cast<size_t>(off), cudaMemcpyHostToDevice));
      dev += per;
    }
  }
  ~Experts() { cudaFree(pool); }
};

template <typename F>
float time_us(F&& f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 8; ++i) f(i);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f(i);
  cudaEventRecord(b);
  DEV_CK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return 1000.0f * ms / reps;
}

template <typename T>
T* dev_copy(const std::vector<T>& v) {
  T* p = nullptr;
  DEV_CK(cudaMalloc(&p, v.size() * sizeof(T)));
  DEV_CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  DEV_CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace

int main() {
  std::mt19937 rng(48);
  const Experts ex(rng);
  Int4Expert* dexp = dev_copy(ex.table);
  std::printf("one 35B MoE layer (%lld x %lld, group %lld, top-%d of %d), us a call, experts from HBM (%d routings cycled)\n",
              static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(kGroup), K, E, kSets);
  std::printf("%6s %10s | %10s %10s %10s %10s | %10s %10s %10s | %s\n", "tokens", "engine", "g/u 8x4", "8x4 rt", "g/u 16x2", "g/u 32x1",
              "down 1", "down 2", "down 4", "checks (bit for bit against the engine)");
  for (int T : {1, 2, 4, 8}) {
    std::vector<int32_t> ids(static_cast<size_t>(kSets) * T * K);
    for (int s = 0; s < kSets * T; ++s) {  // k distinct experts a token
      std::vector<int32_t> all(E);
      for (int e = 0; e < E; ++e) all[e] = e;
      for (int j = 0; j < K; ++j) {
        std::swap(all[j], all[j + rng() % (E - j)]);
        ids[static_cast<size_t>(s) * K + j] = all[j];
      }
    }
    std::vector<float> w(ids.size()), x(static_cast<size_t>(T) * H);
    for (auto& v : w) v = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    for (auto& v : x) v = std::normal_distribution<float>(0.0f, 1.0f)(rng);
    int32_t* dids = dev_copy(ids);
    float *dw = dev_copy(w), *dx = dev_copy(x), *out = nullptr, *out2 = nullptr;
    const WideMoeLayout lay = wide_moe_layout(T, K, H, I);
    uint8_t *ws = nullptr, *hq2 = nullptr;
    DEV_CK(cudaMalloc(&ws, lay.bytes));
    DEV_CK(cudaMalloc(&hq2, lay.bytes));  // the variants' own h (same layout)
    DEV_CK(cudaMalloc(&out, T * H * 4));
    DEV_CK(cudaMalloc(&out2, T * H * 4));
    const auto* xq = ws + lay.xq;
    const auto* xs = reinterpret_cast<const VecScale*>(ws + lay.xs);
    const auto* hq = ws + lay.hq;
    const auto* hs = reinterpret_cast<const VecScale*>(ws + lay.hs);
    auto* vq = hq2 + lay.hq;
    auto* vs = reinterpret_cast<VecScale*>(hq2 + lay.hs);
    auto off = [&](int i) { return static_cast<int64_t>(i % kSets) * T * K; };
    auto engine = [&](int i) {
      DEV_CK(moe_int4_decode_wide(dexp, H, I, kGroup, dids + off(i), dw + off(i), T, K, dx, false, ws, out, nullptr));
    };
    // checks on routing set 0: the engine's h and output, then each variant's
    engine(0);
    DEV_CK(cudaDeviceSynchronize());
    const auto want_h = host_copy(ws + lay.hq, lay.hs - lay.hq + static_cast<size_t>(T) * K * (I / 32) * sizeof(VecScale));
    const auto want_out = host_copy(out, static_cast<size_t>(T) * H);
    std::string checks;
    auto check_h = [&](const char* name) {
      DEV_CK(cudaDeviceSynchronize());
      const auto got = host_copy(hq2 + lay.hq, want_h.size());
      checks += std::string(name) + (got == want_h ? " ok " : " DIFFERS ");
    };
    auto check_out = [&](const char* name) {
      DEV_CK(cudaDeviceSynchronize());
      const auto got = host_copy(out2, want_out.size());
      if (std::memcmp(got.data(), want_out.data(), got.size() * 4) == 0) {
        checks += std::string(name) + " ok ";
        return;
      }
      double d = 0, n = 0;  // how far, when not the same bits
      for (size_t i = 0; i < got.size(); ++i) d += (got[i] - want_out[i]) * double(got[i] - want_out[i]), n += want_out[i] * double(want_out[i]);
      char buf[64];
      std::snprintf(buf, sizeof buf, " DIFFERS (rel L2 %.1e) ", std::sqrt(d / n));
      checks += name + std::string(buf);
    };
    const dim3 up_grid(I / 32, T * K);
    auto gu = [&](auto wv, auto ru, int i, bool rt = false) {
      constexpr int Wn = decltype(wv)::value, RUn = decltype(ru)::value;
      const int nvec = static_cast<int>(H / 32), groups = static_cast<int>(H / kGroup);
      if (rt) gate_up_kernel<Wn, RUn, true><<<up_grid, Wn * 32>>>(dexp, dids + off(i), K, xq, xs, vq, vs, nvec, groups, kGshift);
      else gate_up_kernel<Wn, RUn><<<up_grid, Wn * 32>>>(dexp, dids + off(i), K, xq, xs, vq, vs, nvec, groups, kGshift);
    };
    using C8 = std::integral_constant<int, 8>;
    using C4 = std::integral_constant<int, 4>;
    using C16 = std::integral_constant<int, 16>;
    using C2 = std::integral_constant<int, 2>;
    using C32 = std::integral_constant<int, 32>;
    using C1 = std::integral_constant<int, 1>;
    gu(C8{}, C4{}, 0), check_h("g/u 8x4");
    gu(C8{}, C4{}, 0, true), check_h("8x4 rt");
    gu(C16{}, C2{}, 0), check_h("16x2");
    gu(C32{}, C1{}, 0), check_h("32x1");
    auto dn = [&](auto rph, int i) {
      constexpr int R = decltype(rph)::value;
      down_kernel<R><<<dim3(H / (kDownRows * R), T), kDownRows * kDownGroups * kDownLanes>>>(dexp, dids + off(i), dw + off(i), K, hq, hs, out2);
    };
    dn(C1{}, 0), check_out("down 1");
    dn(C2{}, 0), check_out("2");
    dn(C4{}, 0), check_out("4");
    // timings: each alone, routings cycled (x and h as the engine's set-0 call left them: the same work)
    const int reps = 400;
    const float t_engine = time_us(engine, reps);
    const float t_gu84 = time_us([&](int i) { gu(C8{}, C4{}, i); }, reps);
    const float t_gu84rt = time_us([&](int i) { gu(C8{}, C4{}, i, true); }, reps);
    const float t_gu162 = time_us([&](int i) { gu(C16{}, C2{}, i); }, reps);
    const float t_gu321 = time_us([&](int i) { gu(C32{}, C1{}, i); }, reps);
    const float t_d1 = time_us([&](int i) { dn(C1{}, i); }, reps);
    const float t_d2 = time_us([&](int i) { dn(C2{}, i); }, reps);
    const float t_d4 = time_us([&](int i) { dn(C4{}, i); }, reps);
    DEV_CK(cudaGetLastError());
    std::printf("%6d %10.1f | %10.1f %10.1f %10.1f %10.1f | %10.1f %10.1f %10.1f | %s\n", T, t_engine, t_gu84, t_gu84rt, t_gu162, t_gu321, t_d1,
                t_d2, t_d4, checks.c_str());
    for (void* p : {(void*)dids, (void*)dw, (void*)dx, (void*)out, (void*)out2, (void*)ws, (void*)hq2}) cudaFree(p);
  }
  cudaFree(dexp);
  return 0;
}
