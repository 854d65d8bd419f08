// gpu_core/rows8_row.cuh: the 8-bit rows GEMV's one-warp-a-row dot product (device code; include from .cu
// only): gemv_rows8.cu's one-token kernel and the decode router's launch, which computes the 8-bit
// shared gate / up rows with it (gemv_bf16.cu), so that both give the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/fp8.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/load_stream.cuh"

namespace tandem::gpu::detail {

// The 4 codes of w as floats (exact). int8: each byte b + 128 (the sign bit flipped) as the low byte
// of 2^23's float, less 2^23 + 128: a byte permute and an add a code, where a conversion instruction runs
// at a quarter of the rate or less and was the 8-bit GEMVs' limit; fp8: E4M3 values converted two at a
// time (fp8.cuh).
template <RowFormat F>
__device__ __forceinline__ void codes4(uint32_t w, float* f) {
  if constexpr (F == RowFormat::Int8) {
    const uint32_t u = w ^ 0x80808080u;
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u + i)) - 8388736.0f;
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 v = fp8x2_to_float2(w >> (16 * i));
      f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
  }
}

// Where the inputs of a row's 16-code vector c are (rows8_position): word i holds inputs x0 + i * step ..
// + 3. In a whole 512-input block, vector c = 32 b + l holds 512 b + 4 l + 128 i; past them, in order.
struct ChunkInputs {
  int64_t x0;
  int step;
};
__device__ __forceinline__ ChunkInputs chunk_inputs(int64_t K, int64_t c) {
  if (c < K / 512 * 32) return {c / 32 * 512 + 4 * (c % 32), 128};
  return {c * 16, 4};
}

// The first PRE 16-code vectors of lane `lane` of row `row` (codes q [N, K]; zeros past the row's
// vectors). The caller checks row < N.
template <int PRE>
__device__ __forceinline__ void rows8_prefetch(const uint8_t* __restrict__ q, int64_t K, int64_t row, int lane, uint4 (&pre)[PRE]) {
  const uint4* w = reinterpret_cast<const uint4*>(q + row * K);
  const int64_t chunks = K / 16;  // 16 weights a load
#pragma unroll
  for (int i = 0; i < PRE; ++i) pre[i] = lane + 32 * i < chunks ? load_early(w + lane + 32 * i) : make_uint4(0u, 0u, 0u, 0u);
}

// Lane `lane`'s share of row `row` . x (one token; not reduced across the warp, not scaled) from the
// row's first vectors `pre` (rows8_prefetch) and the rest loaded in the loop. SWIGLU: the input is
// silu(x) * u, formed as it is read. X_SHARED: x is in shared memory (read plainly; the values, and so
// the arithmetic, as from global memory).
template <RowFormat F, int PRE, bool SWIGLU, bool X_SHARED>
__device__ __forceinline__ float rows8_finish(const uint8_t* __restrict__ q, int64_t K, const float* __restrict__ x,
                                              const float* __restrict__ u, int64_t row, int lane, const uint4 (&pre)[PRE]) {
  const uint4* w = reinterpret_cast<const uint4*>(q + row * K);
  const int64_t chunks = K / 16;
  float acc = 0.0f;
  const auto chunk = [&](int64_t c, const uint4& v) {
    float wf[16];
    codes4<F>(v.x, wf), codes4<F>(v.y, wf + 4), codes4<F>(v.z, wf + 8), codes4<F>(v.w, wf + 12);
    const ChunkInputs in = chunk_inputs(K, c);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float4* xp = reinterpret_cast<const float4*>(x + in.x0 + i * in.step);
      float4 a;
      if constexpr (X_SHARED) {
        a = *xp;
      } else {
        a = __ldg(xp);
      }
      if constexpr (SWIGLU) a = swiglu4(a, __ldg(reinterpret_cast<const float4*>(u + in.x0 + i * in.step)));
      acc += wf[4 * i] * a.x + wf[4 * i + 1] * a.y + wf[4 * i + 2] * a.z + wf[4 * i + 3] * a.w;
    }
  };
#pragma unroll
  for (int i = 0; i < PRE; ++i)
    if (lane + 32 * i < chunks) chunk(lane + 32 * i, pre[i]);
#pragma unroll 2
  for (int64_t c = lane + 32 * PRE; c < chunks; c += 32) chunk(c, load_stream(w + c));  // weights: not into L1
  return acc;
}

}  // namespace tandem::gpu::detail
