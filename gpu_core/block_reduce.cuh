// gpu_core/block_reduce.cuh: block-wide sum and max over blockDim.x threads (a multiple of 32, at most
// 1024) through shared memory `red` (blockDim.x / 32 floats); every thread gets the result. Device code,
// include from .cu only. Two barriers each; the first also orders the caller's earlier shared writes.
// Also what the one-warp-a-row GEMVs share: their epilogue (warp_store_row) and the SwiGLU input (swiglu4).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace tandem::gpu::detail {

__device__ __forceinline__ float block_sum(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) s += red[i];
  return s;
}

__device__ __forceinline__ float block_max(float v, float* red) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float m = -INFINITY;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) m = fmaxf(m, red[i]);
  return m;
}

// A warp's partial dot products of one output row for T tokens: each acc[t] summed over the warp, and
// lane 0 stores the sum times `scale` at at(t) (the GEMVs' one-warp-a-row epilogue).
template <int TMAX, typename At>
__device__ __forceinline__ void warp_store_row(const float (&acc)[TMAX], int T, float scale, int lane, At&& at) {
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t >= T) break;
    float v = acc[t];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) *at(t) = v * scale;
  }
}

// silu(g) * u for 4 inputs, as silu_mul (ops.cu) computes it: the GEMVs that form their input as they
// read it give silu_mul's numbers.
__device__ __forceinline__ float4 swiglu4(float4 g, float4 u) {
  return make_float4(g.x / (1.0f + expf(-g.x)) * u.x, g.y / (1.0f + expf(-g.y)) * u.y, g.z / (1.0f + expf(-g.z)) * u.z,
                     g.w / (1.0f + expf(-g.w)) * u.w);
}

}  // namespace tandem::gpu::detail
