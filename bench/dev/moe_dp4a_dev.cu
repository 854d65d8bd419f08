// bench/dev/moe_dp4a_dev.cu: an experiment, not on the engine's path (bench_dev_moe_dp4a).
//
// Question (issues 25 and 27): the decode MoE kernel (moe_int4_decode_wide) is issue-bound on its
// dequantising arithmetic at several tokens (stop 44's ncu; 62 µs a layer at 8 tokens on the H100
// against 31.5 µs of bytes), ~16 instructions an 8-input code word: magic-number fp16 codes, the zero
// point subtracted, fp16 products, their conversion to fp32. Can integer dot products do it in fewer,
// straight from the engine's row layout (no layout of their own, which is what held the tensor-core
// forms back)?
//
// Here the activations are quantised per 32-input vector to two int8 parts, x ~ sx (hi + lo / 254)
// (sx = max |x| / 127; ~1.5e-5 of the vector's largest value, finer than fp16's 4.9e-4 of each value),
// and a code word's 8 products are 4 dp4a (hi and lo parts, its low and high nibbles as they sit in
// the word, each byte an input: int4_layout.h's nibble order makes a word's masked nibbles the inputs
// (0, 4, 1, 5) and 16 x (2, 6, 3, 7)), 6 instructions a word with the masks. Integer sums are exact;
// per vector sum (q - z)(254 hi + lo) = 254 sum q hi + sum q lo - z S, S = sum (254 hi + lo) staged
// with the vector, then one conversion and the two scales. The gate/up kernel is wide's structure (a
// warp a row pair, 8 warps a block; the token's x quantised once by a small kernel, a warp a vector,
// and read in place), h kept in fp32 and quantised the same way, and the down kernel wide's structure
// too (a half-warp a row's share of the token's experts). Four launches where wide has two: in the
// engine the quantisations would join the kernels before them.
//
// What it measures: one 35B MoE layer (2048 x 512, group 128, top-8 of 256 experts, random routing),
// 1 / 2 / 4 / 8 tokens, experts from HBM (32 routings cycled), µs a call for moe_int4_decode_wide and
// for this form (gate/up + quantise + down, and gate/up alone); checked against a double-precision
// reference of the layer on random weights (relative L2 of the output, both kernels).
// Usage: bench_dev_moe_dp4a (a CUDA device, sm_80+: the warp reductions).
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

using tandem::gpu::Int4Expert;
using tandem::gpu::Int4View;

constexpr int64_t H = 2048, I = 512, kGroup = 128;
constexpr int E = 256, K = 8;
constexpr int kWarps = 8;                              // gate/up: warps a block, a row pair each
constexpr int kDownLanes = 16, kDownRows = 4, kDownGroups = 4;
constexpr int kDownThreads = kDownRows * kDownGroups * kDownLanes;
constexpr int kDownPer = K / kDownGroups;
constexpr float kLoSteps = 254.0f;                     // lo = round((x / sx - hi) * 254), |lo| <= 127

// A quantised vector's 32 inputs: per 8-input chunk c, 16 bytes {hi of inputs (0,4,1,5), hi of
// (2,6,3,7), lo of (0,4,1,5), lo of (2,6,3,7)}; chunk-major over the row ([c][v]) so a warp's lanes
// (consecutive vectors) read 512 contiguous bytes. Per vector: {sx / (254 * 16), S}.
struct VecScale {
  float scale;
  int32_t sum;
};

__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {  // c + sum of a's unsigned bytes x b's signed bytes
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// Byte of input j (0..7) of a chunk within its word pair: word (j >> 1) & 1, byte ((j & 1) << 1) | (j >> 2).
__device__ __forceinline__ int chunk_byte(int j) { return ((j >> 1) & 1) * 4 + (((j & 1) << 1) | (j >> 2)); }

// One warp quantises vector v of a row (lane i: input 32 v + i, value x) into q (chunk-major bytes,
// nvec vectors) and vs[v].
__device__ __forceinline__ void quantise_vector(float x, int v, int nvec, uint8_t* q, VecScale* vs) {
  const int lane = threadIdx.x & 31;
  const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(x))));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float xq = x * inv;
  const float hf = rintf(xq);
  const int hi = static_cast<int>(hf), lo = static_cast<int>(rintf((xq - hf) * kLoSteps));
  const int S = __reduce_add_sync(0xffffffffu, 254 * hi + lo);
  const int c = lane >> 3, b = chunk_byte(lane & 7);
  uint8_t* chunk = q + (static_cast<int64_t>(c) * nvec + v) * 16;
  chunk[b] = static_cast<uint8_t>(static_cast<int8_t>(hi));
  chunk[8 + b] = static_cast<uint8_t>(static_cast<int8_t>(lo));
  if (lane == 0) vs[v] = {amax / (127.0f * kLoSteps * 16.0f), S};
}

// sum over the vector's 32 inputs of (q - z) x, in units of the vector's scale: 16 (254 sum q hi +
// sum q lo - z S). w: the vector's 4 code words; xq[c]: chunk c's 16 bytes.
__device__ __forceinline__ float vec_dot(const uint4& w, const uint4 (&xq)[4], int z16, VecScale vs) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  int lh = 0, hh = 0, ll = 0, hl = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t lo_n = words[c] & 0x0F0F0F0Fu, hi_n = words[c] & 0xF0F0F0F0u;  // q(0,4,1,5); 16 q(2,6,3,7)
    lh = dp4a_us(lo_n, xq[c].x, lh);
    hh = dp4a_us(hi_n, xq[c].y, hh);
    ll = dp4a_us(lo_n, xq[c].z, ll);
    hl = dp4a_us(hi_n, xq[c].w, hl);
  }
  const int t = 254 * (16 * lh + hh) + (16 * ll + hl) - z16 * vs.sum;
  return static_cast<float>(t) * vs.scale;
}

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}

template <int W>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = W / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// gate/up: block (row block, pair p); warp w: RU rows of gate and up; lane l: vectors l + 32 i. The
// token's x comes quantised (quantise_rows_kernel) and is read in place after the weight loads are
// issued (L1-cached: every block of the token reads the same 4.5 KB). RU = 1: h fp32 [P][I] (to be
// quantised by quantise_rows_kernel); RU = 4: the block's 32 rows are one vector of h, quantised here
// (hq, hs as quantise_rows_kernel writes them): one launch fewer.
template <int NV, int RU>
__global__ void __launch_bounds__(kWarps * 32) dp4a_gate_up_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids,
                                                                    int k, const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs,
                                                                    float* __restrict__ h, uint8_t* __restrict__ hq,
                                                                    VecScale* __restrict__ hs) {
  static_assert(RU == 1 || RU * kWarps == 32, "RU 4: a block's rows are one 32-row vector of h");
  constexpr int nvec = H / 32, G = H / kGroup, gshift = 2;  // 4 vectors a group
  __shared__ float hb[kWarps * RU];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, p = blockIdx.y, t = p / k;
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  const int64_t r0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * RU;
  uint4 wg[RU][NV], wu[RU][NV];
  float sg[RU][NV], su[RU][NV];
  int zg[RU][NV], zu[RU][NV];
#pragma unroll
  for (int j = 0; j < RU; ++j)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t r = r0 + j;
      const int v = lane + 32 * i, gi = static_cast<int>(r) * G + (v >> gshift);
      wg[j][i] = load_stream(reinterpret_cast<const uint4*>(gate.qweight) + r * nvec + v);
      wu[j][i] = load_stream(reinterpret_cast<const uint4*>(up.qweight) + r * nvec + v);
      sg[j][i] = __half2float(__ushort_as_half(__ldg(gate.scales + gi)));
      su[j][i] = __half2float(__ushort_as_half(__ldg(up.scales + gi)));
      zg[j][i] = 16 * __ldg(gate.zeros + gi);
      zu[j][i] = 16 * __ldg(up.zeros + gi);
    }
  const uint8_t* xt = xq + static_cast<int64_t>(t) * H * 2;
  float g[RU] = {}, u[RU] = {};
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = lane + 32 * i;
    uint4 xv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) xv[c] = __ldg(reinterpret_cast<const uint4*>(xt + (c * nvec + v) * 16));
    const VecScale s = xs[static_cast<int64_t>(t) * nvec + v];
#pragma unroll
    for (int j = 0; j < RU; ++j) {
      g[j] += sg[j][i] * vec_dot(wg[j][i], xv, zg[j][i], s);
      u[j] += su[j][i] * vec_dot(wu[j][i], xv, zu[j][i], s);
    }
  }
#pragma unroll
  for (int j = 0; j < RU; ++j) {
    const float gs = group_sum<32>(g[j]), us = group_sum<32>(u[j]);
    const float hv = gs / (1.0f + __expf(-gs)) * us;
    if constexpr (RU == 1) {
      if (lane == 0) h[static_cast<int64_t>(p) * I + r0] = hv;
    } else {
      if (lane == 0) hb[warp * RU + j] = hv;
    }
  }
  if constexpr (RU > 1) {
    __syncthreads();
    if (warp == 0) quantise_vector(hb[lane], blockIdx.x, I / 32, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * (I / 32));
  }
}

// rows fp32 [rows][cols] -> quantised rows (chunk-major bytes [rows][4][cols / 32][16], scales
// [rows][cols / 32]); a warp a vector, block (vector block, row).
__global__ void quantise_rows_kernel(const float* __restrict__ src, int cols, uint8_t* __restrict__ q, VecScale* __restrict__ s) {
  const int nvec = cols / 32, row = blockIdx.y, v = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (v >= nvec) return;
  quantise_vector(src[static_cast<int64_t>(row) * cols + 32 * v + (threadIdx.x & 31)], v, nvec, q + static_cast<int64_t>(row) * cols * 2,
                  s + static_cast<int64_t>(row) * nvec);
}

// down: block (row block, token t) of kDownRows rows; half-warp (row r, group g): row r's share of the
// experts g, g + 4, weighted; lane l: vector l (I = 512: 16 vectors, one a lane).
__global__ void __launch_bounds__(kDownThreads) dp4a_down_kernel(const Int4Expert* __restrict__ experts, const int32_t* __restrict__ ids,
                                                                   const float* __restrict__ weights, int k, const uint8_t* __restrict__ hq,
                                                                   const VecScale* __restrict__ hs, float* __restrict__ out) {
  constexpr int nvec = I / 32, G = I / kGroup, gshift = 2;
  __shared__ float share[kDownGroups][kDownRows];
  const int t = blockIdx.y, hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes;
  const int r = hw % kDownRows, g = hw / kDownRows;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kDownRows + r;
  uint4 wd[kDownPer];
  float sd[kDownPer], rw[kDownPer];
  int zd[kDownPer];
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int j = g + kDownGroups * m;
    const Int4View& d = experts[ids[t * k + j]].down;
    const int gi = static_cast<int>(row) * G + (l >> gshift);
    wd[m] = load_stream(reinterpret_cast<const uint4*>(d.qweight) + row * nvec + l);
    sd[m] = __half2float(__ushort_as_half(__ldg(d.scales + gi)));
    zd[m] = 16 * __ldg(d.zeros + gi);
    rw[m] = __ldg(weights + t * k + j);
  }
  float acc = 0.0f;
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int64_t p = static_cast<int64_t>(t) * k + g + kDownGroups * m;
    const uint8_t* q = hq + p * I * 2;
    uint4 hv[4];
#pragma unroll
    for (int c = 0; c < 4; ++c) hv[c] = __ldg(reinterpret_cast<const uint4*>(q + (c * nvec + l) * 16));
    acc += rw[m] * sd[m] * vec_dot(wd[m], hv, zd[m], hs[p * nvec + l]);
  }
  acc = group_sum<kDownLanes>(acc);
  if (l == 0) share[g][r] = acc;
  __syncthreads();
  if (threadIdx.x < kDownRows) {
    float sum = share[0][threadIdx.x];
#pragma unroll
    for (int q = 1; q < kDownGroups; ++q) sum += share[q][threadIdx.x];
    out[static_cast<int64_t>(t) * H + blockIdx.x * kDownRows + threadIdx.x] = sum;
  }
}

struct Dp4aScratch {
  float* h = nullptr;
  uint8_t *xq = nullptr, *hq = nullptr;
  VecScale *xs = nullptr, *hs = nullptr;
};

// all: quantise x, gate/up (h fp32), quantise h, down; fused: quantise x, gate/up quantising h (4 rows
// a warp), down; products: gate/up and down alone (x and h already quantised).
enum class Part { all, fused, products };

void dp4a_moe(const Int4Expert* experts, const int32_t* ids, const float* weights, int T, const float* x, const Dp4aScratch& s, float* out,
              Part part) {
  if (part != Part::products) quantise_rows_kernel<<<dim3(H / 32 / 8, T), 256>>>(x, H, s.xq, s.xs);
  if (part == Part::fused) {
    dp4a_gate_up_kernel<2, 4><<<dim3(I / (kWarps * 4), T * K), kWarps * 32>>>(experts, ids, K, s.xq, s.xs, nullptr, s.hq, s.hs);
  } else {
    dp4a_gate_up_kernel<2, 1><<<dim3(I / kWarps, T * K), kWarps * 32>>>(experts, ids, K, s.xq, s.xs, s.h, nullptr, nullptr);
    if (part == Part::all) quantise_rows_kernel<<<dim3(I / 32 / 8, T * K), 256>>>(s.h, I, s.hq, s.hs);
  }
  dp4a_down_kernel<<<dim3(H / kDownRows, T), kDownThreads>>>(experts, ids, weights, K, s.hq, s.hs, out);
}

Dp4aScratch make_scratch(int T) {
  Dp4aScratch s;
  DEV_CK(cudaMalloc(&s.h, T * K * I * 4));
  DEV_CK(cudaMalloc(&s.xq, T * H * 2));
  DEV_CK(cudaMalloc(&s.xs, T * (H / 32) * sizeof(VecScale)));
  DEV_CK(cudaMalloc(&s.hq, T * K * I * 2));
  DEV_CK(cudaMalloc(&s.hs, T * K * (I / 32) * sizeof(VecScale)));
  return s;
}
void free_scratch(const Dp4aScratch& s) {
  for (void* p : {(void*)s.h, (void*)s.xq, (void*)s.xs, (void*)s.hq, (void*)s.hs}) cudaFree(p);
}

// One layer's device buffers: the expert table, routings, weights, x, out, wide's h and this form's scratch.
struct Layer {
  int T;
  Int4Expert* ex = nullptr;
  int32_t* ids = nullptr;
  float *w = nullptr, *x = nullptr, *out = nullptr;
  uint16_t* h16 = nullptr;
  Dp4aScratch s;
  Layer(const std::vector<Int4Expert>& experts, const std::vector<int32_t>& routing, const std::vector<float>& weights,
        const std::vector<float>& xs, int tokens)
      : T(tokens), s(make_scratch(tokens)) {
    DEV_CK(cudaMalloc(&ex, experts.size() * sizeof(Int4Expert)));
    DEV_CK(cudaMalloc(&ids, routing.size() * 4));
    DEV_CK(cudaMalloc(&w, weights.size() * 4));
    DEV_CK(cudaMalloc(&x, xs.size() * 4));
    DEV_CK(cudaMalloc(&out, T * H * 4));
    DEV_CK(cudaMalloc(&h16, T * K * I * 2));
    DEV_CK(cudaMemcpy(ex, experts.data(), experts.size() * sizeof(Int4Expert), cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(ids, routing.data(), routing.size() * 4, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(w, weights.data(), weights.size() * 4, cudaMemcpyHostToDevice));
    DEV_CK(cudaMemcpy(x, xs.data(), xs.size() * 4, cudaMemcpyHostToDevice));
  }
  ~Layer() {
    for (void* p : {(void*)ex, (void*)ids, (void*)w, (void*)x, (void*)out, (void*)h16}) cudaFree(p);
    free_scratch(s);
  }
};

// ---- host side: random experts in the row layout, routing, the double reference ----

struct HostMatrix {  // [N][K] codes in int4_layout.h's word order, scales, zero points
  int64_t N, Kin;
  std::vector<uint32_t> q;
  std::vector<uint16_t> s;
  std::vector<uint8_t> z;
  int code(int64_t n, int64_t k) const {  // input k's code: word k / 8, nibble at 4 (j / 2) + 16 (j % 2)
    const int j = static_cast<int>(k % 8);
    return static_cast<int>((q[n * (Kin / 8) + k / 8] >> (4 * (j / 2) + 16 * (j % 2))) & 15u);
  }
  double weight(int64_t n, int64_t k) const {
    const int64_t gi = n * (Kin / kGroup) + k / kGroup;
    float sf;
    const uint32_t bits = s[gi];  // fp16 -> float on the host
    const uint32_t sign = (bits >> 15) & 1, e = (bits >> 10) & 31, m = bits & 1023;
    sf = e == 0 ? std::ldexp(static_cast<float>(m), -24) : std::ldexp(static_cast<float>(m | 1024), static_cast<int>(e) - 25);
    if (sign) sf = -sf;
    return static_cast<double>(sf) * (code(n, k) - z[gi]);
  }
};

uint16_t to_half_bits(float f) {  // positive normal values only (the scales here)
  int e;
  const float m = std::frexp(f, &e);  // f = m 2^e, m in [0.5, 1)
  const int mant = static_cast<int>(std::lround((m * 2.0f - 1.0f) * 1024.0f));
  return static_cast<uint16_t>(((e - 1 + 15) << 10) + mant);
}

HostMatrix random_matrix(std::mt19937& rng, int64_t N, int64_t Kin) {
  HostMatrix m{N, Kin, std::vector<uint32_t>(N * Kin / 8, 0u), std::vector<uint16_t>(N * (Kin / kGroup)), std::vector<uint8_t>(N * (Kin / kGroup))};
  std::uniform_int_distribution<uint32_t> word;
  for (auto& w : m.q) w = word(rng);
  std::uniform_real_distribution<float> sc(0.004f, 0.02f);
  std::uniform_int_distribution<int> zp(6, 10);
  for (auto& s : m.s) s = to_half_bits(sc(rng));
  for (auto& z : m.z) z = static_cast<uint8_t>(zp(rng));
  return m;
}

Int4View upload(const HostMatrix& m, std::vector<void*>& owned) {
  uint32_t* q;
  uint16_t* s;
  uint8_t* z;
  DEV_CK(cudaMalloc(&q, m.q.size() * 4));
  DEV_CK(cudaMalloc(&s, m.s.size() * 2));
  DEV_CK(cudaMalloc(&z, m.z.size()));
  DEV_CK(cudaMemcpy(q, m.q.data(), m.q.size() * 4, cudaMemcpyHostToDevice));
  DEV_CK(cudaMemcpy(s, m.s.data(), m.s.size() * 2, cudaMemcpyHostToDevice));
  DEV_CK(cudaMemcpy(z, m.z.data(), m.z.size(), cudaMemcpyHostToDevice));
  owned.insert(owned.end(), {q, s, z});
  return Int4View{q, s, z, m.N, m.Kin, kGroup, nullptr};
}

std::vector<int32_t> random_routing(std::mt19937& rng, int tokens, int experts) {
  std::vector<int32_t> ids(tokens * K);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(experts);
    std::iota(all.begin(), all.end(), 0);
    for (int j = 0; j < K; ++j) {
      std::swap(all[j], all[j + rng() % (experts - j)]);
      ids[t * K + j] = all[j];
    }
  }
  return ids;
}

double rel_l2(const std::vector<float>& got, const std::vector<double>& want) {
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); ++i) e += (got[i] - want[i]) * (got[i] - want[i]), n += want[i] * want[i];
  return std::sqrt(e / n);
}

// 16 random experts, T tokens: both kernels against the double reference.
void check(int T) {
  constexpr int Ec = 16;
  std::mt19937 rng(100 + T);
  std::vector<HostMatrix> gate, up, down;
  std::vector<void*> owned;
  std::vector<Int4Expert> ex(Ec);
  for (int e = 0; e < Ec; ++e) {
    gate.push_back(random_matrix(rng, I, H)), up.push_back(random_matrix(rng, I, H)), down.push_back(random_matrix(rng, H, I));
    ex[e] = {upload(gate[e], owned), upload(up[e], owned), upload(down[e], owned)};
  }
  const std::vector<int32_t> ids = random_routing(rng, T, Ec);
  std::vector<float> w(T * K), x(T * H);
  std::uniform_real_distribution<float> uw(0.05f, 0.2f), ux(-1.0f, 1.0f);
  for (auto& v : w) v = uw(rng);
  for (auto& v : x) v = ux(rng);
  std::vector<double> want(T * H, 0.0);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < K; ++j) {
      const int e = ids[t * K + j];
      std::vector<double> hh(I);
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, u = 0;
        for (int64_t c = 0; c < H; ++c) g += gate[e].weight(i, c) * x[t * H + c], u += up[e].weight(i, c) * x[t * H + c];
        hh[i] = g / (1 + std::exp(-g)) * u;
      }
      for (int64_t n = 0; n < H; ++n) {
        double y = 0;
        for (int64_t i = 0; i < I; ++i) y += down[e].weight(n, i) * hh[i];
        want[t * H + n] += w[t * K + j] * y;
      }
    }
  const Layer L(ex, ids, w, x, T);
  std::vector<float> got(T * H);
  DEV_CK(tandem::gpu::moe_int4_decode_wide(L.ex, H, I, kGroup, L.ids, L.w, T, K, L.x, L.h16, L.out, nullptr));
  DEV_CK(cudaMemcpy(got.data(), L.out, got.size() * 4, cudaMemcpyDeviceToHost));
  const double e_wide = rel_l2(got, want);
  double err[2];
  for (int f = 0; f < 2; ++f) {
    DEV_CK(cudaMemset(L.out, 0, T * H * 4));
    dp4a_moe(L.ex, L.ids, L.w, T, L.x, L.s, L.out, f ? Part::fused : Part::all);
    DEV_CK(cudaGetLastError());
    DEV_CK(cudaMemcpy(got.data(), L.out, got.size() * 4, cudaMemcpyDeviceToHost));
    err[f] = rel_l2(got, want);
  }
  const bool ok = err[0] < 1e-3 && err[1] < 1e-3 && err[0] == err[0] && err[1] == err[1];
  std::printf("check T=%d: relative L2 error against double: wide %.2e, dp4a %.2e, dp4a fused %.2e  %s\n", T, e_wide, err[0], err[1],
              ok ? "ok" : "FAIL");
  for (void* p : owned) cudaFree(p);
}

// 256 experts (contents a fixed pattern), 32 routings cycled so the experts come from HBM.
void timing(int T) {
  constexpr int sets = 32, reps = 400;
  auto bytes_of = [](int64_t N, int64_t Kin) { return N * Kin / 2 + N * (Kin / kGroup) * 3; };
  const int64_t per_expert = 2 * bytes_of(I, H) + bytes_of(H, I);
  char* pool;
  DEV_CK(cudaMalloc(&pool, E * per_expert + 4096));
  DEV_CK(cudaMemset(pool, 0x37, E * per_expert));
  std::vector<Int4Expert> ex(E);
  char* p = pool;
  auto carve = [&](int64_t N, int64_t Kin) {
    Int4View v{reinterpret_cast<uint32_t*>(p), nullptr, nullptr, N, Kin, kGroup, nullptr};
    p += N * Kin / 2;
    v.scales = reinterpret_cast<uint16_t*>(p);
    p += N * (Kin / kGroup) * 2;
    v.zeros = reinterpret_cast<uint8_t*>(p);
    p += (N * (Kin / kGroup) + 15) / 16 * 16;
    return v;
  };
  for (auto& e : ex) e = {carve(I, H), carve(I, H), carve(H, I)};
  std::mt19937 rng(7);
  const std::vector<int32_t> ids = random_routing(rng, sets * T, E);
  std::vector<int32_t> first(ids.begin(), ids.begin() + T * K);
  std::sort(first.begin(), first.end());
  const double bytes = double(std::unique(first.begin(), first.end()) - first.begin()) * per_expert;
  const Layer L(ex, ids, std::vector<float>(ids.size(), 0.125f), std::vector<float>(T * H, 0.5f), T);
  cudaEvent_t a, b;
  DEV_CK(cudaEventCreate(&a));
  DEV_CK(cudaEventCreate(&b));
  auto time_us = [&](auto&& launch) {
    for (int i = 0; i < 20; ++i) launch(i);
    DEV_CK(cudaEventRecord(a));
    for (int i = 0; i < reps; ++i) launch(i);
    DEV_CK(cudaEventRecord(b));
    DEV_CK(cudaEventSynchronize(b));
    DEV_CK(cudaGetLastError());
    float ms = 0;
    DEV_CK(cudaEventElapsedTime(&ms, a, b));
    return ms * 1e3 / reps;
  };
  const double wide = time_us([&](int i) {
    const int off = (i % sets) * T * K;
    tandem::gpu::moe_int4_decode_wide(L.ex, H, I, kGroup, L.ids + off, L.w + off, T, K, L.x, L.h16, L.out, nullptr);
  });
  const double full = time_us([&](int i) {
    const int off = (i % sets) * T * K;
    dp4a_moe(L.ex, L.ids + off, L.w + off, T, L.x, L.s, L.out, Part::all);
  });
  const double fused = time_us([&](int i) {
    const int off = (i % sets) * T * K;
    dp4a_moe(L.ex, L.ids + off, L.w + off, T, L.x, L.s, L.out, Part::fused);
  });
  const double products = time_us([&](int i) {
    const int off = (i % sets) * T * K;
    dp4a_moe(L.ex, L.ids + off, L.w + off, T, L.x, L.s, L.out, Part::products);
  });
  std::printf("T=%d: wide %.1f us; dp4a %.1f (4 launches), fused %.1f (3), gate/up + down alone %.1f; bound %.1f us at 3.03 TB/s "
              "(%.1f MB distinct)\n", T, wide, full, fused, products, bytes / 3.03e12 * 1e6, bytes / 1e6);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  cudaFree(pool);
}

}  // namespace

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::fprintf(stderr, "bench_dev_moe_dp4a: no CUDA device\n");
    return 1;
  }
  for (int T : {1, 4}) check(T);
  for (int T : {1, 2, 4, 8}) timing(T);
  return 0;
}
