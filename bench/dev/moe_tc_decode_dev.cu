// bench/dev/moe_tc_decode_dev.cu: an experiment, not on the engine's path (bench_dev_moe_tc_decode).
//
// Question (issues 25 and 27): can the decode MoE's gate/up products run on tensor cores straight
// from registers, with the codes laid out for the mma fragments (as Marlin lays them out), and beat
// moe_int4_decode_wide? The profile (bench/results/2026-12-05-stop44-h100-moe-layout-rollback.md) puts
// the wide kernel at ~2 instructions a weight, issue-bound: 63 µs a layer at 8 tokens on the H100
// against 32 µs of bytes. Here a weight costs ~1.1: per 16 x 16 tile a thread dequantises its 8 codes
// (one LOP3 a pair, exact as gpu_core/int4_row.cuh's word_dot_h2) and one mma.m16n8k16 does the tile's
// 256 products (the token in column 0; decode pairs rarely share an expert).
//
// Layout (made on the host here): per expert matrix [N, K], per 16-row block and 64-input block, 32
// lanes x 16 bytes; lane l (g = l / 4, t = l % 4) holds 4 words, word j for the 16-input tile j of the
// block: its pairs (row g, inputs 2t, 2t+1), (row g + 8, same), (row g, 2t + 8, 2t + 9), (row g + 8,
// same) as the A fragment wants them, pair q's codes at nibbles q and q + 4. Scales and zero points
// stay [N][K / 128] (groups of 128 only, the 35B's).
// What it measures: one layer for T tokens of top-8 of 256 experts read from HBM, µs and GB/s: gate/up
// (h = silu(gate x) * up x, fp16) alone, gate/up and down (a block per 16 output rows and token, a warp
// per expert, the route's weights), and moe_int4_decode_wide on the same shapes. Checked against double
// references: gate/up within 5e-3 (h is fp16), down over the same h within 1e-5 (fp32 accumulation).
// Usage: bench_dev_moe_tc_decode (a CUDA device, sm_80+).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace {


constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8;
constexpr int kWarps = 4;  // warps a block (one 16-row block of gate and up for one pair), a quarter of the inputs each
constexpr int kAhead = 4;  // 64-input blocks whose codes a lane has in flight

struct TcMatrix {
  const uint4* q;    // the fragment layout: [N / 16][K / 64][32 lanes]
  const __half* s;   // [N][K / 128]
  const uint8_t* z;  // [N][K / 128], 0..16
};
struct TcExpert {
  TcMatrix gate, up, down;
};

using tandem::gpu::detail::and_or;
using tandem::gpu::detail::as_half2;
using tandem::gpu::detail::load_stream;
__device__ __forceinline__ uint32_t h2u(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

// The A fragment of one word, (q - z) exactly: pairs 0 and 2 (row g) from the low nibbles less 1024 + z_g
// (lo), pairs 1 and 3 (row g + 8) from the high nibbles as 16 (1024 + q), times 1/16 less 64 + z_g8 (hi).
__device__ __forceinline__ void dequant(uint32_t w, __half2 lo, __half2 hi, uint32_t (&a)[4]) {
  const __half2 sixteenth = __half2half2(__ushort_as_half(0x2c00));
  const uint32_t w8 = w >> 8;
  a[0] = h2u(__hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(w)), lo));
  a[1] = h2u(__hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(w)), sixteenth, hi));
  a[2] = h2u(__hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(w8)), lo));
  a[3] = h2u(__hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(w8)), sixteenth, hi));
}

__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}


// A matrix's group: rows g and g + 8's scales and their zero points in dequant's two forms.
struct Group {
  float s0 = 0, s1 = 0;
  __half2 lo, hi;
};
__device__ __forceinline__ Group group_of(const TcMatrix& m, int64_t r0, int64_t r1, int grp, int G) {
  Group q;
  q.s0 = __half2float(m.s[r0 * G + grp]), q.s1 = __half2float(m.s[r1 * G + grp]);
  q.lo = __half2half2(__ushort_as_half(static_cast<unsigned short>(0x6400 + m.z[r0 * G + grp])));  // 1024 + z_g
  const __half2 z8 = __half2half2(__ushort_as_half(static_cast<unsigned short>(0x6400 + m.z[r1 * G + grp])));
  q.hi = __hneg2(__hsub2(z8, __half2half2(__ushort_as_half(0x6380))));  // -(64 + z_g8); 0x6380: fp16 960
  return q;
}

// Block (row block rb of 16 rows, pair p); warp w takes inputs [w H / 4, (w + 1) H / 4) of gate and up
// (split K: 4x the warps in flight), the block adds the four partial sums.
__global__ void __launch_bounds__(kWarps * 32) tc_gate_up_kernel(const TcExpert* __restrict__ experts, const int32_t* __restrict__ ids,
                                                                  int k, const float* __restrict__ x, __half* __restrict__ h) {
  constexpr int KB = H / 64, KBW = KB / kWarps, G = H / kGroup;  // 64-input blocks: all, a warp's
  __shared__ __align__(16) __half2 xs[kWarps][KBW * 32];       // a warp's inputs as fp16 pairs
  __shared__ float part[kWarps][2][16];                          // [warp][gate, up][row]
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rb = blockIdx.x, p = blockIdx.y;
  const TcExpert& ex = experts[ids[p]];
  const int kb_first = w * KBW;
  const uint4* qg = ex.gate.q + (static_cast<int64_t>(rb) * KB + kb_first) * 32 + lane;
  const uint4* qu = ex.up.q + (static_cast<int64_t>(rb) * KB + kb_first) * 32 + lane;
  uint4 wg[kAhead], wu[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) wg[i] = load_stream(qg + i * 32), wu[i] = load_stream(qu + i * 32);
  const float* xt = x + static_cast<int64_t>(p / k) * H + kb_first * 64;
  for (int i = lane; i < KBW * 32; i += 32) xs[w][i] = __floats2half2_rn(xt[2 * i], xt[2 * i + 1]);
  __syncwarp();
  const int64_t r0 = 16 * rb + g, r1 = r0 + 8;
  float acc_g[2] = {0, 0}, acc_u[2] = {0, 0};  // rows g, g + 8 of column 0 (the token)
  float cg[4] = {0, 0, 0, 0}, cu[4] = {0, 0, 0, 0};
  Group gg, gu;
  for (int b0 = 0; b0 < KBW; b0 += kAhead) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int b = b0 + i, kb = kb_first + b;
      if ((kb * 64) % kGroup == 0) gg = group_of(ex.gate, r0, r1, kb * 64 / kGroup, G), gu = group_of(ex.up, r0, r1, kb * 64 / kGroup, G);
      const uint32_t wgw[4] = {wg[i].x, wg[i].y, wg[i].z, wg[i].w}, wuw[4] = {wu[i].x, wu[i].y, wu[i].z, wu[i].w};
      if (b + kAhead < KBW) wg[i] = load_stream(qg + (b + kAhead) * 32), wu[i] = load_stream(qu + (b + kAhead) * 32);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int k0 = b * 64 + j * 16;  // the tile's first input, within the warp's
        const uint32_t x0 = g == 0 ? h2u(xs[w][(k0 + 2 * t) / 2]) : 0u, x1 = g == 0 ? h2u(xs[w][(k0 + 2 * t + 8) / 2]) : 0u;
        uint32_t a[4];
        dequant(wgw[j], gg.lo, gg.hi, a);
        mma(cg, a, x0, x1);
        dequant(wuw[j], gu.lo, gu.hi, a);
        mma(cu, a, x0, x1);
      }
      if (((kb + 1) * 64) % kGroup == 0) {  // the group's end: its sums, scaled
        acc_g[0] += cg[0] * gg.s0, acc_g[1] += cg[2] * gg.s1, acc_u[0] += cu[0] * gu.s0, acc_u[1] += cu[2] * gu.s1;
        cg[0] = cg[1] = cg[2] = cg[3] = cu[0] = cu[1] = cu[2] = cu[3] = 0.0f;
      }
    }
  }
  if (t == 0) part[w][0][g] = acc_g[0], part[w][0][g + 8] = acc_g[1], part[w][1][g] = acc_u[0], part[w][1][g + 8] = acc_u[1];
  __syncthreads();
  if (threadIdx.x < 16) {
    float a = 0, u = 0;
#pragma unroll
    for (int q = 0; q < kWarps; ++q) a += part[q][0][threadIdx.x], u += part[q][1][threadIdx.x];
    h[static_cast<int64_t>(p) * I + 16 * rb + threadIdx.x] = __float2half_rn(a / (1.0f + __expf(-a)) * u);
  }
}

// down: block (row block rb of 16 output rows, token t); warp j takes the token's expert j (k warps),
// its I inputs of h (fp16 [pair, I], gate/up's output), weighted by the route; the block adds them.
__global__ void __launch_bounds__(K * 32) tc_down_kernel(const TcExpert* __restrict__ experts, const int32_t* __restrict__ ids,
                                                         const float* __restrict__ weights, const __half* __restrict__ h, float* __restrict__ out) {
  constexpr int KB = I / 64, G = I / kGroup;
  __shared__ float part[K][16];
  const int lane = threadIdx.x & 31, j = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int rb = blockIdx.x, tok = blockIdx.y, p = tok * K + j;
  const TcMatrix& m = experts[ids[p]].down;
  const uint4* q = m.q + static_cast<int64_t>(rb) * KB * 32 + lane;
  uint4 w[kAhead];
#pragma unroll
  for (int i = 0; i < kAhead; ++i) w[i] = load_stream(q + i * 32);
  const __half2* hp = reinterpret_cast<const __half2*>(h + static_cast<int64_t>(p) * I);
  const int64_t r0 = 16 * rb + g, r1 = r0 + 8;
  float acc[2] = {0, 0}, c[4] = {0, 0, 0, 0};
  Group gr;
  for (int b0 = 0; b0 < KB; b0 += kAhead) {
#pragma unroll
    for (int i = 0; i < kAhead; ++i) {
      const int kb = b0 + i;
      if ((kb * 64) % kGroup == 0) gr = group_of(m, r0, r1, kb * 64 / kGroup, G);
      const uint32_t ww[4] = {w[i].x, w[i].y, w[i].z, w[i].w};
      if (kb + kAhead < KB) w[i] = load_stream(q + (kb + kAhead) * 32);
#pragma unroll
      for (int jj = 0; jj < 4; ++jj) {
        const int k0 = kb * 64 + jj * 16;
        const uint32_t x0 = g == 0 ? h2u(hp[(k0 + 2 * t) / 2]) : 0u, x1 = g == 0 ? h2u(hp[(k0 + 2 * t + 8) / 2]) : 0u;
        uint32_t a[4];
        dequant(ww[jj], gr.lo, gr.hi, a);
        mma(c, a, x0, x1);
      }
      if (((kb + 1) * 64) % kGroup == 0) {
        acc[0] += c[0] * gr.s0, acc[1] += c[2] * gr.s1;
        c[0] = c[1] = c[2] = c[3] = 0.0f;
      }
    }
  }
  const float rw = weights[p];
  if (t == 0) part[j][g] = rw * acc[0], part[j][g + 8] = rw * acc[1];
  __syncthreads();
  if (threadIdx.x < 16) {
    float sum = 0;
#pragma unroll
    for (int q2 = 0; q2 < K; ++q2) sum += part[q2][threadIdx.x];
    out[static_cast<int64_t>(tok) * H + 16 * rb + threadIdx.x] = sum;
  }
}

// A random GPTQ-like matrix [N, Kin]: codes 0..15, fp16 scales, zero points 0..16 per group of 128.
struct HostMatrix {
  int64_t N, Kin;
  std::vector<uint8_t> q, z;
  std::vector<__half> s;
  HostMatrix(std::mt19937& rng, int64_t n, int64_t kin) : N(n), Kin(kin), q(n * kin), z(n * (kin / kGroup)), s(n * (kin / kGroup)) {
    for (auto& v : q) v = static_cast<uint8_t>(rng() & 15);
    for (auto& v : z) v = static_cast<uint8_t>(rng() % 17);
    for (auto& v : s) v = __float2half(std::uniform_real_distribution<float>(0.002f, 0.02f)(rng));
  }
  double w(int64_t n, int64_t k) const { return (double(q[n * Kin + k]) - z[n * (Kin / kGroup) + k / kGroup]) * double(__half2float(s[n * (Kin / kGroup) + k / kGroup])); }
  std::vector<uint4> fragments() const {  // the layout above
    std::vector<uint4> out(N / 16 * (Kin / 64) * 32);
    for (int64_t rb = 0; rb < N / 16; ++rb)
      for (int64_t kb = 0; kb < Kin / 64; ++kb)
        for (int lane = 0; lane < 32; ++lane) {
          const int g = lane >> 2, t = lane & 3;
          uint32_t words[4];
          for (int j = 0; j < 4; ++j) {
            const int64_t k0 = kb * 64 + j * 16;
            const int64_t rows[4] = {16 * rb + g, 16 * rb + g + 8, 16 * rb + g, 16 * rb + g + 8};
            const int64_t ks[4] = {k0 + 2 * t, k0 + 2 * t, k0 + 2 * t + 8, k0 + 2 * t + 8};
            uint32_t w = 0;
            for (int pq = 0; pq < 4; ++pq) {
              w |= uint32_t(q[rows[pq] * Kin + ks[pq]]) << (4 * pq);
              w |= uint32_t(q[rows[pq] * Kin + ks[pq] + 1]) << (4 * pq + 16);
            }
            words[j] = w;
          }
          out[(rb * (Kin / 64) + kb) * 32 + lane] = make_uint4(words[0], words[1], words[2], words[3]);
        }
    return out;
  }
};

using tandem::dev::upload;

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (!tandem::dev::find_device("bench_dev_moe_tc_decode", &prop)) return 0;
  std::mt19937 rng(11);
  // 256 experts' gate and up (random codes: checked), 256 MB: each launch's experts come from HBM
  std::vector<HostMatrix> gate, up, down;
  std::vector<TcExpert> table(E);
  for (int e = 0; e < E; ++e) {
    gate.emplace_back(rng, I, H);
    up.emplace_back(rng, I, H);
    down.emplace_back(rng, H, I);
    table[e].gate = {upload(gate[e].fragments()), upload(gate[e].s), upload(gate[e].z)};
    table[e].up = {upload(up[e].fragments()), upload(up[e].s), upload(up[e].z)};
    table[e].down = {upload(down[e].fragments()), upload(down[e].s), upload(down[e].z)};
  }
  TcExpert* dtable = upload(table);
  constexpr int kSets = 32;
  std::printf("%s; one MoE layer, top-8 of 256, experts from HBM; us a call (GB/s of the distinct experts' bytes)\n", prop.name);
  std::printf("%6s %18s %24s %24s   %s\n", "tokens", "tc gate/up", "tc gate/up + down", "moe_int4_decode_wide", "checks (rel L2 vs double)");
  for (int T : {1, 2, 4, 8}) {
    std::vector<int32_t> ids(kSets * T * K);
    for (int s = 0; s < kSets; ++s)
      for (int tt = 0; tt < T; ++tt) {
        std::vector<int> all(E);
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        for (int j = 0; j < K; ++j) ids[(s * T + tt) * K + j] = all[j];
      }
    std::vector<float> x(T * H), rw(kSets * T * K);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    for (auto& v : rw) v = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    int32_t* dids = upload(ids);
    float *dx = upload(x), *drw = upload(rw), *dout = nullptr;
    DEV_CK(cudaMalloc(&dout, T * H * sizeof(float)));
    const dim3 down_grid(static_cast<unsigned>(H / 16), static_cast<unsigned>(T));
    __half* dh = nullptr;
    DEV_CK(cudaMalloc(&dh, T * K * I * sizeof(__half)));
    const dim3 grid(static_cast<unsigned>(I / 16), static_cast<unsigned>(T * K));
    tc_gate_up_kernel<<<grid, kWarps * 32>>>(dtable, dids, K, dx, dh);
    DEV_CK(cudaDeviceSynchronize());
    // check set 0 against the double reference
    std::vector<__half> got(T * K * I);
    DEV_CK(cudaMemcpy(got.data(), dh, got.size() * sizeof(__half), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (int pp = 0; pp < T * K; ++pp) {
      const int e = ids[pp];
      const float* xt = x.data() + (pp / K) * H;
      for (int64_t n = 0; n < I; ++n) {
        double a = 0, b = 0;
        for (int64_t kk = 0; kk < H; ++kk) {
          const double xv = double(__half2float(__float2half_rn(xt[kk])));
          a += gate[e].w(n, kk) * xv, b += up[e].w(n, kk) * xv;
        }
        const double want = a / (1 + std::exp(-a)) * b, d = double(__half2float(got[pp * I + n])) - want;
        num += d * d, den += want * want;
      }
    }
    const double rel = std::sqrt(num / den);
    // down over gate/up's own h (its fp16 values), against the double products of the same h
    tc_down_kernel<<<down_grid, K * 32>>>(dtable, dids, drw, dh, dout);
    DEV_CK(cudaDeviceSynchronize());
    std::vector<float> y(T * H);
    DEV_CK(cudaMemcpy(y.data(), dout, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double dnum = 0, dden = 0;
    for (int tt = 0; tt < T; ++tt)
      for (int64_t n = 0; n < H; ++n) {
        double want = 0;
        for (int j = 0; j < K; ++j) {
          const int pp = tt * K + j, e = ids[pp];
          double a = 0;
          for (int64_t kk = 0; kk < I; ++kk) a += down[e].w(n, kk) * double(__half2float(got[pp * I + kk]));
          want += rw[pp] * a;
        }
        dnum += (y[tt * H + n] - want) * (y[tt * H + n] - want), dden += want * want;
      }
    const double drel = std::sqrt(dnum / dden);
    // distinct experts of a set: the bytes the launch must read
    std::vector<int32_t> first(ids.begin(), ids.begin() + T * K);
    std::sort(first.begin(), first.end());
    const double distinct = double(std::unique(first.begin(), first.end()) - first.begin());
    const double bytes = distinct * 2 * (I * H / 2 + I * (H / kGroup) * 3), all_bytes = bytes * 1.5;
    auto time = [&](auto&& launch) { return tandem::dev::time_us([&](int i) { launch(i % kSets); }, 20, 320); };
    const double tc = time([&](int s) { tc_gate_up_kernel<<<grid, kWarps * 32>>>(dtable, dids + s * T * K, K, dx, dh); });
    const double tc_all = time([&](int s) {
      tc_gate_up_kernel<<<grid, kWarps * 32>>>(dtable, dids + s * T * K, K, dx, dh);
      tc_down_kernel<<<down_grid, K * 32>>>(dtable, dids + s * T * K, drw + s * T * K, dh, dout);
    });
    DEV_CK(cudaGetLastError());
    // the production kernel on the same shapes (zeroed weights of its own layout: timing only)
    static tandem::gpu::Int4Expert* pexp = nullptr;
    static float *pw = nullptr, *pout = nullptr;
    static uint16_t* ph = nullptr;
    if (!pexp) {
      std::vector<tandem::gpu::Int4Expert> pt(E);
      auto carve = [&](int64_t N, int64_t Kin) {
        uint32_t* q = nullptr;
        uint16_t* s = nullptr;
        uint8_t* z = nullptr;
        DEV_CK(cudaMalloc(&q, N * Kin / 2));
        DEV_CK(cudaMalloc(&s, N * (Kin / kGroup) * 2));
        DEV_CK(cudaMalloc(&z, N * (Kin / kGroup)));
        DEV_CK(cudaMemset(q, 0x11, N * Kin / 2));
        DEV_CK(cudaMemset(s, 0, N * (Kin / kGroup) * 2));
        DEV_CK(cudaMemset(z, 8, N * (Kin / kGroup)));
        return tandem::gpu::Int4View{q, s, z, N, Kin, kGroup, nullptr};
      };
      for (auto& e : pt) e = {carve(I, H), carve(I, H), carve(H, I)};
      pexp = upload(pt);
      DEV_CK(cudaMalloc(&pw, kSets * 8 * K * 4));
      DEV_CK(cudaMemset(pw, 0, kSets * 8 * K * 4));
      DEV_CK(cudaMalloc(&pout, 8 * H * 4));
      DEV_CK(cudaMalloc(&ph, 8 * K * I * 2));
    }
    const double wide = time([&](int s) {
      tandem::gpu::moe_int4_decode_wide(pexp, H, I, kGroup, dids + s * T * K, pw + s * T * K, T, K, dx, ph, pout, nullptr);
    });
    DEV_CK(cudaGetLastError());
    std::printf("%6d %8.1f (%6.0f) %12.1f (%7.0f) %12.1f (%7.0f)   gate/up %.1e%s, down %.1e%s\n", T, tc, bytes / tc / 1e3, tc_all,
                all_bytes / tc_all / 1e3, wide, all_bytes / wide / 1e3, rel, rel < 5e-3 ? "" : " FAIL", drel, drel < 1e-5 ? "" : " FAIL");
    cudaFree(dids), cudaFree(dx), cudaFree(dh), cudaFree(drw), cudaFree(dout);
  }
  return 0;
}
