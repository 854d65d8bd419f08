// gpu_core/moe_int4_wide.cuh: the decode MoE's kernels from integer dot products (device code; include
// from .cu only): moe_int4_wide.cu launches them (moe_int4_decode_wide, see moe.cuh and that file's
// notes); an experiment in bench/dev may instantiate them to time and check other forms against them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_core/act_quant.cuh"
#include "gpu_core/gemv_row.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/rows8_row.cuh"
#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu::detail {

constexpr int kBlockRows = 32;                 // a gate/up block's rows (gate and up each): one 32-input vector of h
constexpr int kDownLanes = 16;                 // lanes per down row
constexpr int kDownRowsPer = 2;                // down rows per half-warp
constexpr int kDownRows = 4;                   // half-warps per row group: a block's rows are kDownRows x kDownRowsPer
constexpr int kDownGroups = 4;                 // half-warps per down row: group g takes the experts g, g + 4, ...
constexpr int kDownThreads = kDownRows * kDownGroups * kDownLanes;
constexpr int kMaxK = 8;                       // experts per token
constexpr int kDownPer = kMaxK / kDownGroups;  // experts per half-warp
static_assert(32 % (kDownRows * kDownRowsPer) == 0, "H a multiple of 32 is whole down blocks");

__device__ __forceinline__ uint4 zero4() { return make_uint4(0u, 0u, 0u, 0u); }

// A pair's down weights, written by its gate/up blocks' first block for the down launch: there they are
// one load after the wait, where ids[] then experts[id] were two (null qweight: not resident).
struct DownRef {
  const uint32_t* qweight;
  const uint16_t* scales;
  const uint8_t* zeros;
};
static_assert(sizeof(DownRef) == kWideDownRefBytes, "workspace_sizes.h carves kWideDownRefBytes a pair");

// gate/up: block (row block, pair p), its 32 rows r0 .. r0 + 31 of gate and up (block (0, p) also
// hands the pair's down weights to the down launch: down[p]); warp w the RU = 32 / W
// rows r0 + RU w .. + RU - 1; lane l the vectors l + 32 i (i < NV) of each. h = silu(gate x) * up x of
// the 32 rows is one vector of pair p's h, quantised by the block's first warp. W is the launch's
// choice (gate_up_warps): 32 or 8 (8 with more than 2 vectors a lane).
template <int NV, int W>
__global__ void __launch_bounds__(W * 32, W == 8 && NV <= 2 ? 2 : 1)  // up to 2048 inputs: 16 or 32 warps an SM (128 / 64 registers)
    wide_gate_up_kernel(const Int4Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                        const uint8_t* __restrict__ xq, const VecScale* __restrict__ xs, uint8_t* __restrict__ hq,
                        VecScale* __restrict__ hs, DownRef* __restrict__ down, int gshift) {
  constexpr int RU = kBlockRows / W;
  static_assert(RU * W == kBlockRows, "a block's rows are one quantisation vector of h");
  __shared__ float hb[kBlockRows];
  const int G = static_cast<int>(H >> 5) >> gshift;
  const int p = blockIdx.y, t = p / k, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  pdl_wait();  // every weight address depends on the router's ids
  const Int4Expert* ex = experts + ids[p];
  const Int4View gate = ex->gate, up = ex->up;
  if (blockIdx.x == 0 && threadIdx.x == 0) down[p] = {ex->down.qweight, ex->down.scales, ex->down.zeros};
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

// What a down launch computes besides the routed experts (moe.cuh's SharedDown): nothing, a bf16 shared
// down (sh.w) or an int8 one (sh.w8).
enum SharedKind : int { kNoShared = 0, kSharedBf16 = 1, kSharedInt8 = 2 };

// The shared expert's down rows of a one-token down launch (moe.cuh's SharedDown): block x's warps take
// the rows kDownThreads / 32 x + warp, each as gemv_bf16_swiglu's / gemv_rows8_swiglu's one-token kernel
// computes a row (gemv_row.cuh, rows8_row.cuh: the same loads, order and sums). g and u were written
// before gate/up, so they are read before the wait (pdl.cuh); the store comes after it.
template <int KIND>
__device__ __forceinline__ void shared_down_row(const SharedDown& sh, int64_t H) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (kDownThreads / 32) + (threadIdx.x >> 5);
  float acc[1] = {0.0f};
  float scale = 1.0f;
  if constexpr (KIND == kSharedBf16) {
    constexpr int PRE = 4;  // gemv_bf16's for rows of up to 1024 inputs (with_pre), all of sh.in (checked at the launch)
    uint4 pre[PRE];
    row_prefetch(sh.w, H, sh.in, row, lane, pre);
    row_finish<1, true, false, PRE, false>(sh.w, H, sh.in, sh.g, sh.u, 1, row, lane, pre, acc);
  } else {
    constexpr int PRE = 2;  // every 16-code vector of rows up to 1024 inputs
    if (row < H) {
      uint4 pre[PRE];
      rows8_prefetch(sh.w8.codes, sh.in, row, lane, pre);
      acc[0] = rows8_finish<RowFormat::Int8, PRE, true, false>(sh.w8.codes, sh.in, sh.g, sh.u, row, lane, pre);
      scale = sh.w8.scales[row];
    }
  }
  pdl_wait();
  pdl_launch_next();
  if (row >= H) return;
  warp_store_row<1>(acc, 1, scale, lane, [&](int) { return sh.out + row; });
}

// down: block (row group, token t) of kDownRows x kDownRowsPer rows; half-warp (r, g) computes the
// rows r kDownRowsPer + j (j < kDownRowsPer) of the group, each row's share of the experts
// j = g + kDownGroups m (m < kDownPer, j < k) weighted and summed over its lanes; the block adds the
// kDownGroups shares of each row in group order. The experts' weights come from the gate/up launch's
// DownRef of each pair; the weight loads go out before h is read.
// SHARED (a SharedKind; one token): blocks (x, 0) compute the shared expert's rows (shared_down_row),
// and the token's blocks are (x, 1).
template <int NV, int SHARED>
__global__ void __launch_bounds__(kDownThreads)
    wide_down_kernel(const DownRef* __restrict__ down, int64_t H, int64_t I, const float* __restrict__ weights, int k,
                     const uint8_t* __restrict__ hq, const VecScale* __restrict__ hs, float* __restrict__ out, int gshift, SharedDown sh) {
  if constexpr (SHARED != kNoShared) {
    if (blockIdx.y == 0) {
      shared_down_row<SHARED>(sh, H);
      return;
    }
  }
  constexpr int RPH = kDownRowsPer, kRows = kDownRows * RPH;
  __shared__ float share[kDownGroups][kRows];
  const int G = static_cast<int>(I >> 5) >> gshift;
  const int t = static_cast<int>(blockIdx.y) - (SHARED != kNoShared ? 1 : 0), hw = threadIdx.x / kDownLanes, l = threadIdx.x % kDownLanes;
  const int r = hw % kDownRows, g = hw / kDownRows;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kRows + r * RPH, nvec = I / 32;
  pdl_wait();
  DownRef d[kDownPer];  // the gate/up launch's (qweight null: no such expert, or not resident: hybrid)
  uint4 wd[RPH][kDownPer][NV];
  uint16_t sd[RPH][kDownPer][NV];
  uint8_t zd[RPH][kDownPer][NV];
  float rw[kDownPer];
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    const int j = g + kDownGroups * m;
    d[m] = j < k ? down[t * k + j] : DownRef{nullptr, nullptr, nullptr};
    rw[m] = j < k ? __ldg(weights + t * k + j) : 0.0f;
  }
#pragma unroll
  for (int o = 0; o < RPH; ++o)
#pragma unroll
    for (int m = 0; m < kDownPer; ++m)
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int64_t v = l + kDownLanes * i, row = row0 + o;
        const bool ok = d[m].qweight && v < nvec;
        const int64_t gi = row * G + (static_cast<int>(v) >> gshift);
        wd[o][m][i] = ok ? load_stream(reinterpret_cast<const uint4*>(d[m].qweight) + row * nvec + v) : zero4();
        sd[o][m][i] = ok ? __ldg(d[m].scales + gi) : uint16_t{0};
        zd[o][m][i] = ok ? __ldg(d[m].zeros + gi) : uint8_t{0};
      }
  float acc[RPH] = {};
#pragma unroll
  for (int m = 0; m < kDownPer; ++m) {
    if (!d[m].qweight) continue;
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

}  // namespace tandem::gpu::detail
