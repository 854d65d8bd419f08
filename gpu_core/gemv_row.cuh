// gpu_core/gemv_row.cuh: the bf16 GEMV's one-warp-a-row dot product (device code; include from .cu
// only): gemv_bf16.cu's one-token kernels and the decode MoE's down launch, which computes the shared
// expert's down rows with it (moe_int4_wide.cu), so that both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/load_stream.cuh"

namespace tandem::gpu::detail {

__device__ __forceinline__ float lo_bf16(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float hi_bf16(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

// The first PRE weight vectors of lane `lane` of row `row` (row_dot's first loads; zeros past N).
// Decode takes PRE = every vector of the lane (rows up to 4096 inputs: pre_vectors), so that a warp
// waits for memory once; several tokens (more registers each) take 4 and load the rest in the loop.
template <int PRE>
__device__ __forceinline__ void row_prefetch(const uint16_t* __restrict__ W, int64_t N, int64_t K, int64_t row, int lane, uint4 (&pre)[PRE]) {
  const uint4* w = reinterpret_cast<const uint4*>(W + row * K);
  const int64_t chunks = K / 8;
#pragma unroll
  for (int i = 0; i < PRE; ++i) {
    const int64_t c = lane + 32 * i;
    pre[i] = row < N && c < chunks ? load_early(w + c) : make_uint4(0u, 0u, 0u, 0u);
  }
}

// Lane `lane`'s share of row `row` . x_t for t < T into acc (not reduced across the warp; zeros for a
// row past N), from the row's first weight vectors `pre` (row_prefetch) and the rest loaded in the loop.
// SWIGLU: the input is silu(x) * u, formed as it is read (x = gate rows, u = up rows). X_SHARED: x is
// in shared memory (read plainly; the values, and so the arithmetic, as from global memory). REST =
// false: the caller knows that `pre` holds every vector of the lane (K <= 256 PRE), and no loop is compiled.
template <int TMAX, bool SWIGLU, bool X_SHARED, int PRE, bool REST = true>
__device__ __forceinline__ void row_finish(const uint16_t* __restrict__ W, int64_t N, int64_t K, const float* __restrict__ x,
                                           const float* __restrict__ u, int T, int64_t row, int lane, const uint4 (&pre)[PRE],
                                           float (&acc)[TMAX]) {
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  const uint4* w = reinterpret_cast<const uint4*>(W + row * K);
  const int64_t chunks = K / 8;
  if (row >= N) return;
  const auto chunk = [&](int64_t c, const uint4& v) {
    const float wf[8] = {lo_bf16(v.x), hi_bf16(v.x), lo_bf16(v.y), hi_bf16(v.y),
                         lo_bf16(v.z), hi_bf16(v.z), lo_bf16(v.w), hi_bf16(v.w)};
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      if (t >= T) break;
      const float4* xp = reinterpret_cast<const float4*>(x + t * K + c * 8);
      float4 a, b;
      if constexpr (X_SHARED) {
        a = xp[0], b = xp[1];
      } else {
        a = __ldg(xp), b = __ldg(xp + 1);
      }
      if constexpr (SWIGLU) {
        const float4* up = reinterpret_cast<const float4*>(u + t * K + c * 8);
        a = detail::swiglu4(a, __ldg(up));
        b = detail::swiglu4(b, __ldg(up + 1));
      }
      acc[t] += wf[0] * a.x + wf[1] * a.y + wf[2] * a.z + wf[3] * a.w + wf[4] * b.x + wf[5] * b.y + wf[6] * b.z +
                wf[7] * b.w;
    }
  };
#pragma unroll
  for (int i = 0; i < PRE; ++i)
    if (lane + 32 * i < chunks) chunk(lane + 32 * i, pre[i]);
  if constexpr (REST) {
#pragma unroll 4
    for (int64_t c = lane + 32 * PRE; c < chunks; c += 32) chunk(c, load_stream(w + c));
  }
}

}  // namespace tandem::gpu::detail
