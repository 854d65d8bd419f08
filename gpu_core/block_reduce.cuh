// gpu_core/block_reduce.cuh: block-wide sum and max over blockDim.x threads (a multiple of 32, at most
// 1024) through shared memory `red` (blockDim.x / 32 floats); every thread gets the result. Device code,
// include from .cu only. Two barriers each; the first also orders the caller's earlier shared writes.
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

}  // namespace tandem::gpu::detail
