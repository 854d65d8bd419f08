// bench/dev/moe_gate_up_dev.cu: an experiment, not on the engine's path (bench_dev_moe_gate_up).
//
// Question (issue 25): the decode MoE's gate/up (moe_int4_wide.cu) at 8 tokens is the largest kernel of
// the batched step (1,323 of 6,357 us, ncu, stop 49) and runs at 53% of the H100's DRAM with 14.7 warps
// an SM: 128 registers, two blocks of 8 warps. Of a thread's registers at the 35B shape, 64 hold its
// prefetched weights and 32 its rows' scales and zero points, one each a vector it holds (a row's 16
// groups repeat over its lanes). Would fewer registers, and so more blocks an SM, help?
//   engine: the engine's kernel as it is (8 warps of 4 rows, NV 2, two blocks an SM);
//   engine/3: the same asked for three blocks an SM (85 registers: the compiler may spill);
//   packed: each lane loads one group's scale and zero point of each of its rows (lane l: group l % G,
//     G <= 32), packed in one word, and takes the group it needs from its owner with a shuffle: 8
//     registers where the engine holds 32; two and three blocks an SM.
// Compiled for sm_90: engine 128 registers, packed 124 (the compiler keeps its own schedule); at three
// blocks both fit 80 registers by spilling (204 / 268 bytes), which this measures too.
// Every variant's arithmetic is the engine's (the same values, the same order), so each is checked
// bit for bit against the engine's h (quantised bytes and scales). Times each alone at 1 / 2 / 4 / 8
// tokens, experts from HBM (32 routings cycled), x quantised once by the engine's call.
// Usage: bench_dev_moe_gate_up (a CUDA device, sm_80+).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "gpu_core/act_quant.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/workspace_sizes.h"

namespace {

using namespace tandem::gpu;
using namespace tandem::gpu::detail;
using namespace tandem::dev;

constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8, kSets = 32;
constexpr int kGshift = 2;  // group 128 = 32 << 2
constexpr int kWarps = 8, kRowsUp = 4, kBlockRows = 32;

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// The engine's wide_gate_up_kernel<NV, 8> (moe_int4_wide.cu), with its blocks an SM as MINB and, with
// PACKED, the scales and zero points loaded one group a lane and shuffled to where they are used.
template <int NV, int MINB, bool PACKED>
__global__ void __launch_bounds__(kWarps * 32, MINB)
    gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                   const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs, uint8_t* __restrict__ hq, VecScale* __restrict__ hs,
                   int gshift) {
  constexpr int RU = kRowsUp;
  __shared__ float hb[kBlockRows];
  const int G = static_cast<int>(H >> 5) >> gshift;
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (!gate.qweight) return;
  const int r0 = static_cast<int>(blockIdx.x) * kBlockRows + warp * RU, nvec = static_cast<int>(H >> 5);
  const uint4* qg = reinterpret_cast<const uint4*>(gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(up.qweight);
  uint4 wg[RU][NV], wu[RU][NV];
  uint16_t sg[RU][NV], su[RU][NV];
  uint8_t zg[RU][NV], zu[RU][NV];
  uint32_t pg[RU], pu[RU];  // PACKED: group lane % G's scale << 8 | zero point, of each row
#pragma unroll
  for (int r = 0; r < RU; ++r) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = lane + 32 * i, row = r0 + r;
      const bool ok = v < nvec;
      wg[r][i] = ok ? load_stream(qg + row * nvec + v) : zero4();
      wu[r][i] = ok ? load_stream(qu + row * nvec + v) : zero4();
      if constexpr (!PACKED) {
        const int gi = row * G + (v >> gshift);
        sg[r][i] = ok ? __ldg(gate.scales + gi) : uint16_t{0};
        su[r][i] = ok ? __ldg(up.scales + gi) : uint16_t{0};
        zg[r][i] = ok ? __ldg(gate.zeros + gi) : uint8_t{0};
        zu[r][i] = ok ? __ldg(up.zeros + gi) : uint8_t{0};
      }
    }
    if constexpr (PACKED) {
      const int gi = (r0 + r) * G + lane % G;
      pg[r] = static_cast<uint32_t>(__ldg(gate.scales + gi)) << 8 | __ldg(gate.zeros + gi);
      pu[r] = static_cast<uint32_t>(__ldg(up.scales + gi)) << 8 | __ldg(up.zeros + gi);
    }
  }
  const uint8_t* xt = xq + static_cast<int64_t>(t) * H * 2;
  float g[RU] = {}, u[RU] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = lane + 32 * i;
    if (v >= nvec) break;
    uint4 xv[4];
    load_vector(xt, v, nvec, xv);
    const VecScale s = xs[t * nvec + v];
#pragma unroll
    for (int r = 0; r < RU; ++r) {
      if constexpr (PACKED) {
        const int src = v >> gshift;  // the group's owner (lanes past the vectors hold copies; all lanes take part)
        const uint32_t a = __shfl_sync(0xffffffffu, pg[r], src), b = __shfl_sync(0xffffffffu, pu[r], src);
        g[r] += __half2float(__ushort_as_half(static_cast<uint16_t>(a >> 8))) * vec_dot(wg[r][i], xv, 16 * (a & 0xffu), s);
        u[r] += __half2float(__ushort_as_half(static_cast<uint16_t>(b >> 8))) * vec_dot(wu[r][i], xv, 16 * (b & 0xffu), s);
      } else {
        g[r] += __half2float(__ushort_as_half(sg[r][i])) * vec_dot(wg[r][i], xv, 16 * zg[r][i], s);
        u[r] += __half2float(__ushort_as_half(su[r][i])) * vec_dot(wu[r][i], xv, 16 * zu[r][i], s);
      }
    }
  }
  pdl_launch_next();
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == 0) hb[warp * RU + r] = gs / (1.0f + __expf(-gs)) * us;
  }
  __syncthreads();
  const int nh = static_cast<int>(I / 32);
  if (warp == 0) quantise_vector(hb[lane], blockIdx.x, nh, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * nh);
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

}  // namespace

int main() {
  std::mt19937 rng(49);
  const Experts ex(rng);
  Int4Expert* dexp = dev_copy(ex.table);
  std::printf("the decode MoE's gate/up alone (%lld x %lld, group %lld, top-%d of %d), us a call, experts from HBM (%d routings cycled)\n",
              static_cast<long long>(H), static_cast<long long>(I), static_cast<long long>(kGroup), K, E, kSets);
  std::printf("%6s %10s | %10s %10s %10s %10s | %s\n", "tokens", "layer", "engine", "engine/3", "packed", "packed/3",
              "checks (h bit for bit against the engine's)");
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
    float *dw = dev_copy(w), *dx = dev_copy(x), *out = nullptr;
    const WideMoeLayout lay = wide_moe_layout(T, K, H, I);
    uint8_t *ws = nullptr, *hq2 = nullptr;
    DEV_CK(cudaMalloc(&ws, lay.bytes));
    DEV_CK(cudaMalloc(&hq2, lay.bytes));  // the variants' own h (same layout)
    DEV_CK(cudaMalloc(&out, T * H * 4));
    const auto* xq = ws + lay.xq;
    const auto* xs = reinterpret_cast<const VecScale*>(ws + lay.xs);
    auto* vq = hq2 + lay.hq;
    auto* vs = reinterpret_cast<VecScale*>(hq2 + lay.hs);
    auto off = [&](int i) { return static_cast<int64_t>(i % kSets) * T * K; };
    auto layer = [&](int i) {  // the engine's whole call (x quantised, gate/up, down)
      DEV_CK(moe_int4_decode_wide(dexp, H, I, kGroup, dids + off(i), dw + off(i), T, K, dx, false, ws, out, nullptr));
    };
    layer(0);  // routing set 0: the engine's h, and x quantised for the variants
    DEV_CK(cudaDeviceSynchronize());
    const size_t hbytes = lay.hs - lay.hq + static_cast<size_t>(T) * K * (I / 32) * sizeof(VecScale);
    const auto want_h = host_copy(ws + lay.hq, hbytes);
    std::string checks;
    auto check_h = [&](const char* name) {
      DEV_CK(cudaDeviceSynchronize());
      const auto got = host_copy(hq2 + lay.hq, want_h.size());
      checks += std::string(name) + (got == want_h ? " ok " : " DIFFERS ");
      DEV_CK(cudaMemset(hq2, 0xff, lay.bytes));  // the next variant writes its own
    };
    const dim3 up_grid(I / kBlockRows, T * K);
    auto gu = [&](auto kernel, int i) {
      kernel<<<up_grid, kWarps * 32>>>(dexp, H, I, dids + off(i), K, xq, xs, vq, vs, kGshift);
    };
    const auto k_engine = gate_up_kernel<2, 2, false>, k_engine3 = gate_up_kernel<2, 3, false>;
    const auto k_packed = gate_up_kernel<2, 2, true>, k_packed3 = gate_up_kernel<2, 3, true>;
    gu(k_engine, 0), check_h("engine");
    gu(k_engine3, 0), check_h("engine/3");
    gu(k_packed, 0), check_h("packed");
    gu(k_packed3, 0), check_h("packed/3");
    const int reps = 400;
    const float t_layer = time_us(layer, reps);
    const float t_e = time_us([&](int i) { gu(k_engine, i); }, reps);
    const float t_e3 = time_us([&](int i) { gu(k_engine3, i); }, reps);
    const float t_p = time_us([&](int i) { gu(k_packed, i); }, reps);
    const float t_p3 = time_us([&](int i) { gu(k_packed3, i); }, reps);
    DEV_CK(cudaGetLastError());
    std::printf("%6d %10.1f | %10.1f %10.1f %10.1f %10.1f | %s\n", T, t_layer, t_e, t_e3, t_p, t_p3, checks.c_str());
    for (void* p : {(void*)dids, (void*)dw, (void*)dx, (void*)out, (void*)ws, (void*)hq2}) cudaFree(p);
  }
  cudaFree(dexp);
  return 0;
}
