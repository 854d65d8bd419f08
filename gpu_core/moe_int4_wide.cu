// gpu_core/moe_int4_wide.cu: decode MoE from integer dot products over 16-byte weight loads
// (moe_int4_decode_wide, see moe.cuh).
//
// Why this form: the fp16 form before it (each code word's 8 inputs as magic-number fp16 codes, the
// zero point subtracted, fp16 products converted to fp32: ~16 instructions a word) was issue-bound at
// several tokens: 62 us a layer at 8 tokens on the H100 against 31.5 us of bytes. Here the
// activations are quantised per 32-input vector to two int8 parts, x ~ sx (hi + lo / 254) with
// sx = max |x| / 127 (about 1.5e-5 of the vector's largest value: finer than fp16's 4.9e-4 of each
// value), and a word's 8 products are 4 dp4a on its nibbles masked in place (int4_layout.h's nibble
// order makes a word's low nibbles the inputs (0, 4, 1, 5) and its high nibbles 16 x (2, 6, 3, 7)):
// 6 instructions a word, the integer sums exact. Per vector,
//   sum (q - z)(254 hi + lo) = 254 sum q hi + sum q lo - z S,  S = sum (254 hi + lo),
// S stored with the vector's scale, then one conversion and the two scales. One layer on the H100
// (bench/results/2026-12-06-stop49-h100.md): 14.5-15.2 / 49.7-49.9 us at 1 / 8 tokens with x quantised by
// its own launch, against the fp16 form's 13.7 / 62.4; 4e-5 from the exact layer against 7e-4.
//
// Three launches: x quantised (a warp a vector; left out where the kernel that wrote x quantised it too:
// act_quant.cuh); gate/up, a block 32 rows of one (token, expert) pair so that they are one vector of
// h, quantised in the block; down, a half-warp two rows' shares of the token's experts. Every weight load
// of a thread is issued before any is used.
#include <type_traits>

#include "gpu_core/act_quant.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu {

namespace {

using namespace detail;

constexpr int kBlockRows = 32;                 // a gate/up block's rows (gate and up each): one 32-input vector of h
constexpr int kDownLanes = 16;                 // lanes per down row
constexpr int kDownRowsPer = 2;                // down rows per half-warp
constexpr int kDownRows = 4;                   // half-warps per row group: a block's rows are kDownRows x kDownRowsPer
constexpr int kDownGroups = 4;                 // half-warps per down row: group g takes the experts g, g + 4, ...
constexpr int kDownThreads = kDownRows * kDownGroups * kDownLanes;
constexpr int kMaxK = 8;                       // experts per token
constexpr int kDownPer = kMaxK / kDownGroups;  // experts per half-warp
constexpr int kQuantWarps = 8;                 // x quantisation (when its writer did not): vectors per block
static_assert(32 % (kDownRows * kDownRowsPer) == 0, "H a multiple of 32 is whole down blocks");

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// x fp32 [T, H] -> quantised rows; block (vector block, token), a warp a vector.
__global__ void __launch_bounds__(kQuantWarps * 32) quantise_x_kernel(const float* __restrict__ x, int64_t H, QuantX q) {
  pdl_enter();  // x is the kernel before's output; a few blocks: let gate/up launch
  const int t = blockIdx.y, v = static_cast<int>(blockIdx.x) * kQuantWarps + static_cast<int>(threadIdx.x >> 5);
  quantise_vectors(x + t * H, H, q, t, v, static_cast<int>(H / 32));  // this warp's vector alone
}

// gate/up: block (row block, pair p), its 32 rows r0 .. r0 + 31 of gate and up; warp w the RU = 32 / W
// rows r0 + RU w .. + RU - 1; lane l the vectors l + 32 i (i < NV) of each. h = silu(gate x) * up x of
// the 32 rows is one vector of pair p's h, quantised by the block's first warp. W is the launch's
// choice (gate_up_warps): 32 or 8 (8 with more than 2 vectors a lane).
template <int NV, int W>
__global__ void __launch_bounds__(W * 32, W == 8 && NV <= 2 ? 2 : 1)  // up to 2048 inputs: 16 or 32 warps an SM (128 / 64 registers)
    wide_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                        const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs, uint8_t* __restrict__ hq,
                        VecScale* __restrict__ hs, int gshift) {
  constexpr int RU = kBlockRows / W;
  static_assert(RU * W == kBlockRows, "a block's rows are one quantisation vector of h");
  __shared__ float hb[kBlockRows];
  const int G = static_cast<int>(H >> 5) >> gshift;
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();  // every weight address depends on the router's ids
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (!gate.qweight) return;  // not resident on the GPU (hybrid); uniform per block
  const int r0 = static_cast<int>(blockIdx.x) * kBlockRows + warp * RU, nvec = static_cast<int>(H >> 5);  // 32-bit offsets: H <= 4096, I <= 2048
  const uint4* qg = reinterpret_cast<const uint4*>(gate.qweight);
  const uint4* qu = reinterpret_cast<const uint4*>(up.qweight);
  uint4 wg[RU][NV], wu[RU][NV];
  uint16_t sg[RU][NV], su[RU][NV];
  uint8_t zg[RU][NV], zu[RU][NV];
#pragma unroll
  for (int r = 0; r < RU; ++r)
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int v = lane + 32 * i, row = r0 + r;
      const bool ok = v < nvec;
      const int gi = row * G + (v >> gshift);
      wg[r][i] = ok ? load_stream(qg + row * nvec + v) : zero4();
      wu[r][i] = ok ? load_stream(qu + row * nvec + v) : zero4();
      sg[r][i] = ok ? __ldg(gate.scales + gi) : uint16_t{0};
      su[r][i] = ok ? __ldg(up.scales + gi) : uint16_t{0};
      zg[r][i] = ok ? __ldg(gate.zeros + gi) : uint8_t{0};
      zu[r][i] = ok ? __ldg(up.zeros + gi) : uint8_t{0};
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
      g[r] += __half2float(__ushort_as_half(sg[r][i])) * vec_dot(wg[r][i], xv, 16 * zg[r][i], s);
      u[r] += __half2float(__ushort_as_half(su[r][i])) * vec_dot(wu[r][i], xv, 16 * zu[r][i], s);
    }
  }
  pdl_launch_next();  // past its loads (pdl.cuh; see gemv_bf16.cu's row_dot)
#pragma unroll
  for (int r = 0; r < RU; ++r) {
    const float gs = group_sum<32>(g[r]), us = group_sum<32>(u[r]);
    if (lane == 0) hb[warp * RU + r] = gs / (1.0f + __expf(-gs)) * us;
  }
  __syncthreads();
  const int nh = static_cast<int>(I / 32);
  if (warp == 0) quantise_vector(hb[lane], blockIdx.x, nh, hq + static_cast<int64_t>(p) * I * 2, hs + static_cast<int64_t>(p) * nh);
}

// down: block (row group, token t) of kDownRows x kDownRowsPer rows; half-warp (r, g) computes the
// rows r kDownRowsPer + j (j < kDownRowsPer) of the group, each row's share of the experts
// j = g + kDownGroups m (m < kDownPer, j < k) weighted and summed over its lanes; the block adds the
// kDownGroups shares of each row in group order. The weight loads go out before h is read.
template <int NV>
__global__ void __launch_bounds__(kDownThreads)
    wide_down_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                     const float* __restrict__ weights, int k, const uint8_t* __restrict__ hq, const VecScale* __restrict__ hs,
                     float* __restrict__ out, int gshift) {
  constexpr int RPH = kDownRowsPer, kRows = kDownRows * RPH;
  __shared__ float share[kDownGroups][kRows];
  const int G = static_cast<int>(I >> 5) >> gshift;
  const int t = blockIdx.y, hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes;
  const int r = hw % kDownRows, g = hw / kDownRows;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows + r * RPH, nvec = I / 32;
  pdl_wait();
  const Int4View* d[kDownPer];
  const uint32_t* q[kDownPer];  // null: no such expert, or not resident (hybrid)
  uint4 wd[RPH][kDownPer][NV];
  uint16_t sd[RPH][kDownPer][NV];
  uint8_t zd[RPH][kDownPer][NV];
  float rw[kDownPer];
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int j = g + kDownGroups * m;
    d[m] = j < k ? &experts[ids[t * k + j]].down : nullptr;
    q[m] = d[m] ? d[m]->qweight : nullptr;
    rw[m] = j < k ? __ldg(weights + t * k + j) : 0.0f;
  }
#pragma unroll
  for (int o = 0; o < RPH; ++o)
#pragma unroll
    for (int m = 0; m < kDownPer; ++m)
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int64_t v = l + kDownLanes * i, row = row0 + o;
        const bool ok = q[m] && v < nvec;
        const int64_t gi = row * G + (static_cast<int>(v) >> gshift);
        wd[o][m][i] = ok ? load_stream(reinterpret_cast<const uint4*>(q[m]) + row * nvec + v) : zero4();
        sd[o][m][i] = ok ? __ldg(d[m]->scales + gi) : uint16_t{0};
        zd[o][m][i] = ok ? __ldg(d[m]->zeros + gi) : uint8_t{0};
      }
  float acc[RPH] = {};
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    if (!q[m]) continue;
    const int64_t p = static_cast<int64_t>(t) * k + g + kDownGroups * m;
    float a[RPH] = {};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      const int64_t v = l + kDownLanes * i;
      if (v >= nvec) break;
      uint4 hv[4];
      load_vector(hq + p * I * 2, v, nvec, hv);
      const VecScale s = hs[p * nvec + v];
#pragma unroll
      for (int o = 0; o < RPH; ++o) a[o] += __half2float(__ushort_as_half(sd[o][m][i])) * vec_dot(wd[o][m][i], hv, 16 * zd[o][m][i], s);
    }
#pragma unroll
    for (int o = 0; o < RPH; ++o) acc[o] += rw[m] * a[o];
  }
  pdl_launch_next();  // past its loads (pdl.cuh)
#pragma unroll
  for (int o = 0; o < RPH; ++o) {
    const float a = group_sum<kDownLanes>(acc[o]);
    if (l == 0) share[g][r * RPH + o] = a;
  }
  __syncthreads();
  if (threadIdx.x < kRows) {
    float sum = share[0][threadIdx.x];
#pragma unroll
    for (int q = 1; q < kDownGroups; ++q) sum += share[q][threadIdx.x];
    out[t * H + static_cast<int64_t>(blockIdx.x) * kRows + threadIdx.x] = sum;
  }
}

// gate/up's warps a block for a launch of `blocks` blocks (stop 49, bench/results/2026-12-06-stop49-h100.md):
// up to about one block an SM, 32 warps of one row each keep more loads in flight; beyond, 8 of four
// (two blocks an SM). 16 of two, faster in the experiment's compile-time form, needs 104 registers here
// (one block an SM) and lost.
int gate_up_warps(int64_t blocks) { return blocks <= 128 ? 32 : 8; }

int vectors_per_lane(int64_t K, int lanes) { return static_cast<int>((K / 32 + lanes - 1) / lanes); }

// Returns launch(std::integral_constant<int, NV>) with the 16-byte vectors a lane holds (1, 2 or 4;
// the shapes moe_int4_decode_wide_fits takes need no more).
template <typename Launch>
cudaError_t with_vectors(int nv, Launch&& launch) {
  if (nv <= 1) return launch(std::integral_constant<int, 1>{});
  if (nv <= 2) return launch(std::integral_constant<int, 2>{});
  return launch(std::integral_constant<int, 4>{});
}

// log2(group_size / 32), or -1 when group_size is not 32 times a power of two.
int group_shift(int64_t group_size) {
  for (int s = 0; s < 8; ++s)
    if (group_size == (int64_t{32} << s)) return s;
  return -1;
}

}  // namespace

bool moe_int4_decode_wide_fits(int64_t H, int64_t I, int64_t group_size, int k, bool act_order) {
  return !act_order && k >= 1 && k <= kMaxK && H >= 32 && I >= 32 && H % 32 == 0 && I % 32 == 0 && group_shift(group_size) >= 0 &&
         H % group_size == 0 && I % group_size == 0 && vectors_per_lane(H, 32) <= 4 && vectors_per_lane(I, kDownLanes) <= 4;
}

cudaError_t moe_int4_decode_wide(const Int4Expert* experts, int64_t H, int64_t I, int64_t group_size, const int32_t* ids,
                                 const float* weights, int T, int k, const float* x, bool x_quantised, void* workspace, float* out,
                                 cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || !moe_int4_decode_wide_fits(H, I, group_size, k, false)) return cudaErrorInvalidValue;
  const WideMoeLayout lay = wide_moe_layout(T, k, H, I);
  auto* base = static_cast<uint8_t*>(workspace);
  const QuantX q = wide_moe_x(workspace, T, k, H, I);
  const auto* xs = static_cast<const VecScale*>(q.vectors);
  auto* hq = base + lay.hq;
  auto* hs = reinterpret_cast<VecScale*>(base + lay.hs);
  const int gs = group_shift(group_size);
  cudaError_t err = cudaSuccess;
  if (!x_quantised) {
    const int nvx = static_cast<int>(H / 32);
    err = launch(quantise_x_kernel, dim3(static_cast<unsigned>((nvx + kQuantWarps - 1) / kQuantWarps), static_cast<unsigned>(T)),
                 dim3(kQuantWarps * 32), 0, stream, x, H, q);
    if (err != cudaSuccess) return err;
  }
  const dim3 up_grid(static_cast<unsigned>(I / kBlockRows), static_cast<unsigned>(T * k));
  const int warps = gate_up_warps(int64_t{up_grid.x} * up_grid.y);
  err = with_vectors(vectors_per_lane(H, 32), [&](auto nv) {
    auto go = [&](auto kernel, int w) {
      return launch(kernel, up_grid, dim3(w * 32), 0, stream, experts, H, I, ids, k, static_cast<const uint8_t*>(q.parts), xs, hq,
                    hs, gs);
    };
    if constexpr (nv.value <= 2) {  // 4 vectors a lane would spill at 32 warps' 64 registers
      if (warps == 32) return go(wide_gate_up_kernel<nv.value, 32>, 32);
    }
    return go(wide_gate_up_kernel<nv.value, 8>, 8);
  });
  if (err != cudaSuccess) return err;
  const dim3 down_grid(static_cast<unsigned>(H / (kDownRows * kDownRowsPer)), static_cast<unsigned>(T));
  return with_vectors(vectors_per_lane(I, kDownLanes), [&](auto nv) {
    return launch(wide_down_kernel<nv.value>, down_grid, dim3(kDownThreads), 0, stream, experts, H, I, ids, weights, k, hq, hs, out, gs);
  });
}

}  // namespace tandem::gpu
