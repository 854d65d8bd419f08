// gpu_core/conv_step.cuh: one token of the DeltaNet's causal depthwise conv + SiLU for one channel
// (device code; include from .cu only). Shared by the DeltaNet's decode and prefill conv kernels
// (deltanet.cu), so both give the same bits.
#pragma once

#include <cuda_runtime.h>

namespace tandem::gpu::detail {

constexpr int kConvMaxHist = 7;  // kernel <= 8

// silu(w[kernel-1] * xc + sum_j w[j] * win[j]) for channel weights w (kernel taps, oldest first) and the
// hist = kernel - 1 inputs before this one in win (oldest first); then win moves on by xc.
// The loops run over constant indices, guarded by hist, so that win stays in registers (indexed by hist
// it went to local memory): the same operations in the same order.
__device__ __forceinline__ float conv_step(const float* __restrict__ w, int kernel, float (&win)[kConvMaxHist], float xc) {
  const int hist = kernel - 1;
  float acc = w[hist] * xc;
#pragma unroll
  for (int j = 0; j < kConvMaxHist; ++j)
    if (j < hist) acc += w[j] * win[j];
#pragma unroll
  for (int j = 0; j < kConvMaxHist; ++j)
    if (j < hist) win[j] = j + 1 < hist ? win[j + 1] : xc;
  return acc / (1.0f + expf(-acc));
}

}  // namespace tandem::gpu::detail
