// gpu_core/act_quant.cuh: activations quantised per 32-input vector to two int8 parts, and their
// integer dot products with int4 code words: the decode MoE's arithmetic (moe_int4_wide.cu); device
// code, include from .cu only. The kernels that write a token's x (the router GEMV with its norm, the
// norm kernel) quantise it in the same launch (QuantX, workspace_sizes.h).
//
// A vector's 32 values become x ~ sx (hi + lo / 254), sx = max |x| / 127, hi = round(x / sx),
// lo = round((x / sx - hi) * 254), both in -127..127: about 1.5e-5 of the vector's largest value.
// A quantised row of n inputs (nvec = n / 32 vectors) is chunk-major: per 8-input chunk c of vector v,
// 16 bytes at (c * nvec + v) * 16: {hi of inputs (0, 4, 1, 5), hi of (2, 6, 3, 7), lo of (0, 4, 1, 5),
// lo of (2, 6, 3, 7)} (the order in which a code word's nibbles, masked in place, meet them: int4_layout.h),
// so a warp's lanes (consecutive vectors) read 512 contiguous bytes. Per vector a VecScale.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu::detail {

constexpr int kLoSteps = 254;  // lo's steps a unit of hi

// A quantised vector's scale sx / (254 * 16) (the 16: a code word's high nibbles are summed in place,
// 16 times their value) and S = sum (254 hi + lo), which the zero point multiplies.
struct VecScale {
  float scale;
  int32_t sum;
};
static_assert(sizeof(VecScale) == kWideVectorBytes, "workspace_sizes.h counts 8 bytes a vector");

// Input j (0..7) of a chunk sits at this byte of its hi (and lo) word pair.
__device__ __forceinline__ int chunk_byte(int j) { return ((j >> 1) & 1) * 4 + (((j & 1) << 1) | (j >> 2)); }

// One warp (all 32 lanes) quantises vector v of a row (lane i: input 32 v + i, value x) into q (the
// row's chunk-major bytes, nvec vectors) and vs[v].
__device__ __forceinline__ void quantise_vector(float x, int v, int nvec, uint8_t* q, VecScale* vs) {
  const int lane = threadIdx.x & 31;
  const float amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(fabsf(x))));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  const float xq = x * inv;
  const float hf = rintf(xq);
  const int hi = static_cast<int>(hf), lo = static_cast<int>(rintf((xq - hf) * static_cast<float>(kLoSteps)));
  const int S = __reduce_add_sync(0xffffffffu, kLoSteps * hi + lo);
  uint8_t* chunk = q + (static_cast<int64_t>(lane >> 3) * nvec + v) * 16;
  const int b = chunk_byte(lane & 7);
  chunk[b] = static_cast<uint8_t>(static_cast<int8_t>(hi));
  chunk[8 + b] = static_cast<uint8_t>(static_cast<int8_t>(lo));
  if (lane == 0) vs[v] = {amax / (127.0f * static_cast<float>(kLoSteps) * 16.0f), S};
}

// Vectors first, first + stride, ... of a row of n (a multiple of 32) values quantised into q's row
// `row` (QuantX's parts and vectors), one a warp: `first` is this warp's place among the `stride` warps
// sharing the row. src: shared memory, or global memory the block has written (after a __syncthreads).
__device__ __forceinline__ void quantise_vectors(const float* src, int64_t n, const QuantX& q, int64_t row, int first, int stride) {
  const int nvec = static_cast<int>(n / 32);
  uint8_t* parts = q.parts + row * n * 2;
  VecScale* vs = static_cast<VecScale*>(q.vectors) + row * nvec;
  for (int v = first; v < nvec; v += stride) quantise_vector(src[32 * v + (threadIdx.x & 31)], v, nvec, parts, vs);
}

// The block quantises the whole row.
__device__ __forceinline__ void quantise_row(const float* src, int64_t n, const QuantX& q, int64_t row) {
  quantise_vectors(src, n, q, row, static_cast<int>(threadIdx.x >> 5), static_cast<int>(blockDim.x >> 5));
}

// ---- the consumer side: int4 code words (int4_layout.h's order) against a quantised vector ----

__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c) {  // c + a's unsigned bytes . b's signed bytes
  int d;
  asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// sum over a vector's 32 inputs of (q - z) x, in units of its VecScale: w its 4 code words, xq[c]
// chunk c's 16 bytes, z16 = 16 z. Bounds: |t| < 2^29 (codes < 16, |hi|, |lo| <= 127, z <= 16).
__device__ __forceinline__ float vec_dot(const uint4& w, const uint4 (&xq)[4], int z16, VecScale vs) {
  const uint32_t words[4] = {w.x, w.y, w.z, w.w};
  int lh = 0, hh = 0, ll = 0, hl = 0;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    const uint32_t lo_n = words[c] & 0x0F0F0F0Fu, hi_n = words[c] & 0xF0F0F0F0u;  // q (0, 4, 1, 5); 16 q (2, 6, 3, 7)
    lh = dp4a_us(lo_n, xq[c].x, lh);
    hh = dp4a_us(hi_n, xq[c].y, hh);
    ll = dp4a_us(lo_n, xq[c].z, ll);
    hl = dp4a_us(hi_n, xq[c].w, hl);
  }
  const int t = kLoSteps * (16 * lh + hh) + (16 * ll + hl) - z16 * vs.sum;
  return static_cast<float>(t) * vs.scale;
}

// Vector v's 4 chunks of a quantised row (nvec vectors), through L1 (activations are shared by blocks).
__device__ __forceinline__ void load_vector(const uint8_t* __restrict__ row, int64_t v, int64_t nvec, uint4 (&xv)[4]) {
#pragma unroll
  for (int c = 0; c < 4; ++c) xv[c] = __ldg(reinterpret_cast<const uint4*>(row + (c * nvec + v) * 16));
}

}  // namespace tandem::gpu::detail
