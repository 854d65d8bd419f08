// bench/dev/moe_int4_tc_dev.cu: an experiment, not on the engine's path (bench_dev_moe_int4_tc).
//
// Question (issues 25 and 27): can the decode MoE run its products on tensor cores straight from the
// int4 row layout the engine already keeps (int4_layout.h), and beat moe_int4_decode_wide? The wide
// kernel is issue-bound at ~2 instructions a weight (ncu on the H100: 63 µs a layer at 8 tokens against
// 32 µs of bytes). Stop 44's experiment (a fragment layout of its own, bench/results/
// 2026-12-05-stop44-h100-moe-layout-rollback.md) measured 13.2 / 17.6 / 27.0 / 45.1 µs at 1 / 2 / 4 / 8
// tokens against wide's 13.5 / 22.5 / 36.9 / 62.9.
//
// How the row layout feeds the mma: a dot product does not care in which order its inputs come, so the
// 16 "columns" of an mma step are whichever inputs a lane holds. A bundle is 128 inputs of a 16-row
// block (a quantisation group of 128, 16 code words a row). Lane 4 g + q loads words 4 q .. 4 q + 3 of
// the bundle for rows g and g + 8 (16 B each: a row's 64 B contiguous across its quad). Word j gives two
// steps: step s takes its input pairs 2 s (fragment columns 2 q, 2 q + 1) and 2 s + 1 (columns 2 q + 8,
// 2 q + 9), so both the A and the B fragment of lane q are inputs 8 (4 q + j) + 4 s .. + 3 of the bundle.
// The codes become (q - z) exactly in fp16 (one LOP3 a pair under the 0x6400 magic, a subtraction or,
// for the high nibbles, an FMA), products are exact in fp32 and summed in fp32; a bundle's sum takes its
// group's scale. The token is column 0 of B (lanes 0..3); the other 7 columns are zeros.
//
// Measured (stop 45, H100, an earlier form: one chain of mma for gate then up, 4 bundles a warp in
// flight, 4 warps a block): 18.7 / 30.7 / 55.4 / 101.4 µs at 1 / 2 / 4 / 8 tokens against the wide
// kernel's 14.1 / 22.6 / 37.3 / 63.4 on the same machine kind; correct (the engine's GPU suite passed
// with it). This form (gate and up in two interleaved chains, down in two; gate/up with 2 bundles a warp
// in flight and 8 warps a block, or 4 and 4 warps: both are timed) is not yet run. Why the earlier one
// lost to the fragment-layout experiment is open. The suspects:
//   - x's staging: each of a block's 128 threads converted 16 inputs, one dependent load at a time,
//     against 4 in the wide kernel (~16 L2 latencies a block); now 4 inputs a load, 2 a thread;
//   - the one dependent chain of 64 mma a warp;
//   - two 16-byte loads a lane per bundle touching 8 rows each (8 wavefronts a load instead of 4);
//   - occupancy (181 registers).
//
// What it prints: one layer for T tokens of top-8 of 256 experts read from HBM, µs a call and GB/s, this
// kernel pair against moe_int4_decode_wide on the same experts, and rel L2 of each against a double
// reference of the same (fp16-rounded) x and of the kernel's own h (5e-3 for wide, 1e-3 for this one).
// Usage: bench_dev_moe_int4_tc (a CUDA device, sm_80+).
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "bench/dev/dev_util.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"

namespace {


using namespace tandem::gpu;
using namespace tandem::gpu::detail;

constexpr int kBundle = 128;   // inputs of one step of a lane quad: 16 code words a row, 4 a lane
constexpr int kDownAhead = 4;  // down: the same
constexpr int kMaxUpWarps = 8; // gate/up: warps a block, the bundles split between them
constexpr int kMaxK = 8;       // experts per token (down: a warp each)

__device__ __forceinline__ uint32_t h2u(__half2 h) {
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}

__device__ __forceinline__ void mma_f16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One row's zero point in dequantisation's two forms: fp16 1024 + z (the low nibbles, less it) and
// -(64 + z) (the high nibbles, x 1/16 plus it).
struct Zero {
  __half2 lo, hi;
};
__device__ __forceinline__ Zero zero_of(uint8_t z) {
  const __half2 lo = zero_1024(z);
  return {lo, __hneg2(__hsub2(lo, __half2half2(__ushort_as_half(0x6380))))};  // 0x6380: fp16 960
}

// One mma step of a bundle: the A fragment from the lane's word of row g (a) and of row g + 8 (b),
// shifted for the step (s = 1: pairs 2 and 3), dequantised with their zero points; c += A B.
__device__ __forceinline__ void step_mma(uint32_t a, uint32_t b, Zero z0, Zero z1, uint32_t x0, uint32_t x1, float (&c)[4]) {
  const __half2 sixteenth = __half2half2(__ushort_as_half(0x2c00));
  const uint32_t a0 = h2u(__hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(a)), z0.lo));
  const uint32_t a1 = h2u(__hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(b)), z1.lo));
  const uint32_t a2 = h2u(__hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(a)), sixteenth, z0.hi));
  const uint32_t a3 = h2u(__hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(b)), sixteenth, z1.hi));
  mma_f16(c, a0, a1, a2, a3, x0, x1);
}

__device__ __forceinline__ uint32_t word(const uint4& v, int j) { return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w; }

// What a lane loads of one bundle of one matrix: its words of rows g and g + 8, their scales and zeros.
struct BundleCodes {
  uint4 w0, w1;
  uint16_t s0, s1;
  uint8_t z0, z1;
};
__device__ __forceinline__ BundleCodes load_bundle(const Int4View& m, int64_t r0, int64_t b, int q, int G, int gshift) {
  const int64_t words = m.K / 8, gi = b >> gshift, at = b * 16 + 4 * q;
  const uint32_t* q0 = m.qweight + r0 * words + at;
  BundleCodes c;
  c.w0 = load_stream(reinterpret_cast<const uint4*>(q0));
  c.w1 = load_stream(reinterpret_cast<const uint4*>(q0 + 8 * words));
  c.s0 = __ldg(m.scales + r0 * G + gi), c.s1 = __ldg(m.scales + (r0 + 8) * G + gi);
  c.z0 = __ldg(m.zeros + r0 * G + gi), c.z1 = __ldg(m.zeros + (r0 + 8) * G + gi);
  return c;
}

// The bundle's sums (c's column 0, rows g and g + 8: lanes 0..3 hold it; c2 a second chain, or null)
// scaled into acc; the chains cleared for the next bundle.
__device__ __forceinline__ void add_scaled(float (&c)[4], float (*c2)[4], const BundleCodes& k, float (&acc)[2]) {
  const float s0 = c2 ? c[0] + (*c2)[0] : c[0], s1 = c2 ? c[2] + (*c2)[2] : c[2];
  acc[0] += s0 * __half2float(__ushort_as_half(k.s0));
  acc[1] += s1 * __half2float(__ushort_as_half(k.s1));
  c[0] = c[1] = c[2] = c[3] = 0.0f;
  if (c2) (*c2)[0] = (*c2)[1] = (*c2)[2] = (*c2)[3] = 0.0f;
}

// A lane's B fragment of one bundle: inputs 32 q .. 32 q + 31 of it as fp16 pairs from v (16-byte
// aligned, the matrix's input order) for the lanes of column 0, zeros for the rest.
__device__ __forceinline__ void bundle_x(const __half* v, bool col0, uint32_t (&xb)[16]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint4 u = col0 ? *reinterpret_cast<const uint4*>(v + 8 * c) : make_uint4(0u, 0u, 0u, 0u);
    xb[4 * c] = u.x, xb[4 * c + 1] = u.y, xb[4 * c + 2] = u.z, xb[4 * c + 3] = u.w;
  }
}

// gate/up: block (16-row block, pair p); warp w takes bundles [w nbw, (w + 1) nbw) of gate and of up
// (split K: the warps of a block in flight together), AHEAD at a time, every load of a round issued
// before any is used; the block adds the warps' partial sums in warp order and writes
// h = fp16(silu(gate) * up) [pair, I] in input order. x staged as fp16 in shared memory in gate's input
// order (and up's, with act order).
template <int AHEAD>
__global__ void __launch_bounds__(kMaxUpWarps * 32)
    tc_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                      const float* __restrict__ x, __half* __restrict__ h, int gshift, int nbw) {
  extern __shared__ __align__(16) __half xs[];  // [H] in gate's input order, then [H] in up's (act order)
  __shared__ float part[kMaxUpWarps][2][16];    // [warp][gate, up][row]
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int p = blockIdx.y, G = static_cast<int>(H / kBundle) >> gshift;
  pdl_wait();  // every weight address depends on the router's ids
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (!gate.qweight) return;  // not resident on the GPU (hybrid); uniform per block
  const int64_t r0 = 16 * static_cast<int64_t>(blockIdx.x) + g, nb = H / kBundle;
  const int64_t b_first = static_cast<int64_t>(warp) * nbw, b_end = b_first + nbw < nb ? b_first + nbw : nb;
  BundleCodes cg[AHEAD], cu[AHEAD];
#pragma unroll
  for (int i = 0; i < AHEAD; ++i)
    if (b_first + i < b_end) cg[i] = load_bundle(gate, r0, b_first + i, q, G, gshift), cu[i] = load_bundle(up, r0, b_first + i, q, G, gshift);
  // x as fp16 in each matrix's input order, while the weights load
  const float* xt = x + static_cast<int64_t>(p / k) * H;
  const bool own_up = up.perm != gate.perm;
  if (!gate.perm && !up.perm) {  // 4 inputs a load (the first form took one: 16 dependent loads a thread)
    for (int64_t i = threadIdx.x; i < H / 4; i += blockDim.x) {
      const float4 v = __ldg(reinterpret_cast<const float4*>(xt) + i);
      __half2* d = reinterpret_cast<__half2*>(xs) + 2 * i;
      d[0] = __floats2half2_rn(v.x, v.y), d[1] = __floats2half2_rn(v.z, v.w);
    }
  } else {
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      xs[i] = __float2half_rn(__ldg(xt + (gate.perm ? gate.perm[i] : i)));
      if (own_up) xs[H + i] = __float2half_rn(__ldg(xt + (up.perm ? up.perm[i] : i)));
    }
  }
  __syncthreads();
  const __half* xu = own_up ? xs + H : xs;
  float acc_g[2] = {0.0f, 0.0f}, acc_u[2] = {0.0f, 0.0f}, c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cv[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b0 = b_first; b0 < b_end; b0 += AHEAD) {
#pragma unroll
    for (int i = 0; i < AHEAD; ++i) {
      const int64_t b = b0 + i;
      if (b >= b_end) break;
      uint32_t xg[16], xv[16];
      bundle_x(xs + b * kBundle + 32 * q, g == 0, xg);
      bundle_x(xu + b * kBundle + 32 * q, g == 0, xv);  // xu == xs but with act order
      const Zero zg0 = zero_of(cg[i].z0), zg1 = zero_of(cg[i].z1), zu0 = zero_of(cu[i].z0), zu1 = zero_of(cu[i].z1);
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int st = 0; st < 2; ++st) {  // gate and up: two chains of products in flight
          const int sh = 8 * st, e = 4 * j + 2 * st;
          step_mma(word(cg[i].w0, j) >> sh, word(cg[i].w1, j) >> sh, zg0, zg1, xg[e], xg[e + 1], c);
          step_mma(word(cu[i].w0, j) >> sh, word(cu[i].w1, j) >> sh, zu0, zu1, xv[e], xv[e + 1], cv);
        }
      add_scaled(c, nullptr, cg[i], acc_g);
      add_scaled(cv, nullptr, cu[i], acc_u);
      if (b + AHEAD < b_end) cg[i] = load_bundle(gate, r0, b + AHEAD, q, G, gshift), cu[i] = load_bundle(up, r0, b + AHEAD, q, G, gshift);
    }
  }
  pdl_launch_next();  // past its loads (pdl.cuh)
  if (q == 0) part[warp][0][g] = acc_g[0], part[warp][0][g + 8] = acc_g[1], part[warp][1][g] = acc_u[0], part[warp][1][g + 8] = acc_u[1];
  __syncthreads();
  if (threadIdx.x < 16) {
    const int warps = static_cast<int>(blockDim.x >> 5);
    float a = 0.0f, u = 0.0f;
    for (int w = 0; w < warps; ++w) a += part[w][0][threadIdx.x], u += part[w][1][threadIdx.x];
    h[static_cast<int64_t>(p) * I + 16 * blockIdx.x + threadIdx.x] = __float2half_rn(a / (1.0f + __expf(-a)) * u);
  }
}

// down: block (16 output rows, token t); warp j takes the token's expert j over all I inputs of its h
// row (in down's input order: gathered with act order), kDownAhead bundles at a time, times the route's
// weight; the block adds the k experts' shares in expert order.
__global__ void __launch_bounds__(kMaxK * 32)
    tc_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                   const float* __restrict__ weights, int k, const __half* __restrict__ h, float* __restrict__ out, int gshift) {
  __shared__ float part[kMaxK][16];
  const int lane = threadIdx.x & 31, j = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int t = blockIdx.y, p = t * k + j, G = static_cast<int>(I / kBundle) >> gshift;
  const int64_t r0 = 16 * static_cast<int64_t>(blockIdx.x) + g, nb = I / kBundle;
  pdl_wait();
  const Int4View d = experts[ids[p]].down;
  float acc[2] = {0.0f, 0.0f};
  if (d.qweight) {  // null: not resident (hybrid); uniform per warp
    BundleCodes cd[kDownAhead];
#pragma unroll
    for (int i = 0; i < kDownAhead; ++i)
      if (i < nb) cd[i] = load_bundle(d, r0, i, q, G, gshift);
    const float rw = __ldg(weights + p);
    const __half* hp = h + static_cast<int64_t>(p) * I;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c2[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t b0 = 0; b0 < nb; b0 += kDownAhead) {
#pragma unroll
      for (int i = 0; i < kDownAhead; ++i) {
        const int64_t b = b0 + i;
        if (b >= nb) break;
        uint32_t xb[16];
        if (!d.perm) {
          bundle_x(hp + b * kBundle + 32 * q, g == 0, xb);
        } else {  // act order: h in down's input order, pair by pair
          const int32_t* pm = d.perm + b * kBundle + 32 * q;
#pragma unroll
          for (int e = 0; e < 16; ++e) xb[e] = g == 0 ? h2u(__halves2half2(hp[__ldg(pm + 2 * e)], hp[__ldg(pm + 2 * e + 1)])) : 0u;
        }
        const Zero z0 = zero_of(cd[i].z0), z1 = zero_of(cd[i].z1);
#pragma unroll
        for (int jj = 0; jj < 4; ++jj)
#pragma unroll
          for (int st = 0; st < 2; ++st)  // two chains of products in flight: steps of even and odd words
            step_mma(word(cd[i].w0, jj) >> (8 * st), word(cd[i].w1, jj) >> (8 * st), z0, z1, xb[4 * jj + 2 * st], xb[4 * jj + 2 * st + 1],
                     jj & 1 ? c2 : c);
        add_scaled(c, &c2, cd[i], acc);
        if (b + kDownAhead < nb) cd[i] = load_bundle(d, r0, b + kDownAhead, q, G, gshift);
      }
    }
    acc[0] *= rw, acc[1] *= rw;
  }
  pdl_launch_next();  // past its loads (pdl.cuh)
  if (q == 0) part[j][g] = acc[0], part[j][g + 8] = acc[1];
  __syncthreads();
  if (threadIdx.x < 16) {
    float sum = part[0][threadIdx.x];
    for (int e = 1; e < k; ++e) sum += part[e][threadIdx.x];
    out[static_cast<int64_t>(t) * H + 16 * blockIdx.x + threadIdx.x] = sum;
  }
}

// log2(group_size / 128), or -1 when group_size is not 128 times a power of two.
int group_shift(int64_t group_size) {
  for (int s = 0; s < 8; ++s)
    if (group_size == (int64_t{kBundle} << s)) return s;
  return -1;
}

bool tc_fits(int64_t H, int64_t I, int64_t group_size, int k) {
  return k >= 1 && k <= kMaxK && H >= kBundle && I >= kBundle && H % kBundle == 0 && I % kBundle == 0 && H <= 8192 &&
         group_shift(group_size) >= 0 && H % group_size == 0 && I % group_size == 0;
}

// ahead: gate/up's bundles a warp has in flight, 2 (8 warps a block at the 35B's H) or 4 (4 warps).
cudaError_t tc_decode(int ahead, const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                               const float* weights, int T, int k, const float* x, uint16_t* h_scratch, float* out, cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || !tc_fits(H, I, group_size, k)) return cudaErrorInvalidValue;
  auto* h = reinterpret_cast<__half*>(h_scratch);
  const int gs = group_shift(group_size);
  const int nb = static_cast<int>(H / kBundle);
  const int warps = (nb + ahead - 1) / ahead < kMaxUpWarps ? (nb + ahead - 1) / ahead : kMaxUpWarps;
  const int nbw = (nb + warps - 1) / warps;
  const dim3 up_grid(static_cast<unsigned>(I / 16), static_cast<unsigned>(T * k));
  if (cudaError_t e = launch(ahead == 4 ? tc_gate_up_kernel<4> : tc_gate_up_kernel<2>, up_grid, dim3(32 * warps), 2 * H * sizeof(__half), stream,
                             experts, H, I, ids, k, x, h, gs, nbw);
      e != cudaSuccess)
    return e;
  const dim3 down_grid(static_cast<unsigned>(H / 16), static_cast<unsigned>(T));
  return launch(tc_down_kernel, down_grid, dim3(32 * k), 0, stream, experts, H, I, ids, weights, k, h, out, gs);
}


constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8, kSets = 32;

// A random matrix in the row layout (int4_layout.h, no act order): codes, fp16 scales, zero points.
struct HostMatrix {
  int64_t N, Kin;
  std::vector<uint32_t> q;
  std::vector<uint16_t> s;
  std::vector<uint8_t> z;
  HostMatrix(std::mt19937& rng, int64_t n, int64_t kin) : N(n), Kin(kin), q(n * kin / 8), s(n * (kin / kGroup)), z(n * (kin / kGroup)) {
    for (auto& v : q) v = static_cast<uint32_t>(rng());
    for (auto& v : z) v = static_cast<uint8_t>(rng() % 17);
    for (auto& v : s) v = __half_as_ushort(__float2half(std::uniform_real_distribution<float>(0.002f, 0.02f)(rng)));
  }
  double w(int64_t n, int64_t k) const {  // input k's nibble: word k / 8, bit 4 ((k % 8) / 2) + 16 (k % 2)
    const int j = static_cast<int>(k % 8), code = (q[n * (Kin / 8) + k / 8] >> (4 * (j / 2) + 16 * (j % 2))) & 15;
    const int64_t g = n * (Kin / kGroup) + k / kGroup;
    return (code - double(z[g])) * double(__half2float(__ushort_as_half(s[g])));
  }
  Int4View view() const { return {tandem::dev::upload(q), tandem::dev::upload(s), tandem::dev::upload(z), N, Kin, kGroup, nullptr}; }
};

// rel L2 of y [T, H] against sum_j w * down(h_p) over double products, h_p = silu(gate x) * up x (x fp16).
double check(const std::vector<float>& y, const std::vector<HostMatrix>& gate, const std::vector<HostMatrix>& up,
             const std::vector<HostMatrix>& down, const std::vector<int32_t>& ids, const std::vector<float>& rw,
             const std::vector<float>& x, int T) {
  double num = 0, den = 0;
  for (int t = 0; t < T; ++t) {
    std::vector<double> want(H, 0.0);
    for (int j = 0; j < K; ++j) {
      const int e = ids[t * K + j];
      std::vector<double> h(I);
      for (int64_t n = 0; n < I; ++n) {
        double a = 0, b = 0;
        for (int64_t k = 0; k < H; ++k) {
          const double xv = double(__half2float(__float2half_rn(x[t * H + k])));
          a += gate[e].w(n, k) * xv, b += up[e].w(n, k) * xv;
        }
        h[n] = a / (1 + std::exp(-a)) * b;
      }
      for (int64_t n = 0; n < H; ++n) {
        double d = 0;
        for (int64_t k = 0; k < I; ++k) d += down[e].w(n, k) * h[k];
        want[n] += rw[t * K + j] * d;
      }
    }
    for (int64_t n = 0; n < H; ++n) num += (y[t * H + n] - want[n]) * (y[t * H + n] - want[n]), den += want[n] * want[n];
  }
  return std::sqrt(num / den);
}

}  // namespace

int main() {
  cudaDeviceProp prop{};
  if (!tandem::dev::find_device("bench_dev_moe_int4_tc", &prop)) return 0;
  std::mt19937 rng(13);
  std::vector<HostMatrix> gate, up, down;
  std::vector<Int4Expert> table(E);
  for (int e = 0; e < E; ++e) {  // 1.5 MB an expert, 0.4 GB in all: past the L2
    gate.emplace_back(rng, I, H), up.emplace_back(rng, I, H), down.emplace_back(rng, H, I);
    table[e] = {gate[e].view(), up[e].view(), down[e].view()};
  }
  Int4Expert* dtable = tandem::dev::upload(table);
  std::printf("%s; one MoE layer, top-8 of 256, experts from HBM; us a call (GB/s of the distinct experts' bytes)\n", prop.name);
  std::printf("%6s %22s %22s %22s   %s\n", "tokens", "tc, 2 ahead x 8 warps", "tc, 4 ahead x 4 warps", "moe_int4_decode_wide",
              "rel L2 vs double: tc 2, tc 4, wide");
  for (int T : {1, 2, 4, 8}) {
    std::vector<int32_t> ids(kSets * T * K);
    for (int s = 0; s < kSets * T; ++s) {
      std::vector<int> all(E);
      std::iota(all.begin(), all.end(), 0);
      std::shuffle(all.begin(), all.end(), rng);
      for (int j = 0; j < K; ++j) ids[s * K + j] = all[j];
    }
    std::vector<float> x(T * H), rw(kSets * T * K);
    for (auto& v : x) v = std::uniform_real_distribution<float>(-1.0f, 1.0f)(rng);
    for (auto& v : rw) v = std::uniform_real_distribution<float>(0.05f, 0.5f)(rng);
    int32_t* dids = tandem::dev::upload(ids);
    float *dx = tandem::dev::upload(x), *drw = tandem::dev::upload(rw), *dout = nullptr;
    uint16_t* dh = nullptr;
    DEV_CK(cudaMalloc(&dout, T * H * sizeof(float)));
    DEV_CK(cudaMalloc(&dh, T * K * I * sizeof(uint16_t)));
    std::vector<float> y(T * H);
    double rel_tc[2], tc[2];
    for (int v = 0; v < 2; ++v) {
      DEV_CK(tc_decode(2 + 2 * v, dtable, H, I, kGroup, dids, drw, T, K, dx, dh, dout, nullptr));
      DEV_CK(cudaMemcpy(y.data(), dout, y.size() * 4, cudaMemcpyDeviceToHost));
      rel_tc[v] = check(y, gate, up, down, ids, rw, x, T);
    }
    DEV_CK(moe_int4_decode_wide(dtable, H, I, kGroup, dids, drw, T, K, dx, dh, dout, nullptr));
    DEV_CK(cudaMemcpy(y.data(), dout, y.size() * 4, cudaMemcpyDeviceToHost));
    const double rel_wide = check(y, gate, up, down, ids, rw, x, T);
    std::vector<int32_t> first(ids.begin(), ids.begin() + T * K);
    std::sort(first.begin(), first.end());
    const double distinct = double(std::unique(first.begin(), first.end()) - first.begin());
    const double bytes = distinct * 3 * (I * H / 2 + I * (H / kGroup) * 3);
    auto time = [&](auto&& launch) { return tandem::dev::time_us([&](int i) { launch((i % kSets) * T * K); }, 20, 320); };
    for (int v = 0; v < 2; ++v)
      tc[v] = time([&](int o) { tc_decode(2 + 2 * v, dtable, H, I, kGroup, dids + o, drw + o, T, K, dx, dh, dout, nullptr); });
    const double wide = time([&](int o) { moe_int4_decode_wide(dtable, H, I, kGroup, dids + o, drw + o, T, K, dx, dh, dout, nullptr); });
    std::printf("%6d %12.1f (%7.0f) %12.1f (%7.0f) %12.1f (%7.0f)   %.1e%s, %.1e%s, %.1e%s\n", T, tc[0], bytes / tc[0] / 1e3, tc[1],
                bytes / tc[1] / 1e3, wide, bytes / wide / 1e3, rel_tc[0], rel_tc[0] < 1e-3 ? "" : " FAIL", rel_tc[1],
                rel_tc[1] < 1e-3 ? "" : " FAIL", rel_wide, rel_wide < 5e-3 ? "" : " FAIL");
    cudaFree(dids), cudaFree(dx), cudaFree(drw), cudaFree(dout), cudaFree(dh);
  }
  return 0;
}
