// gpu_core/gemv_bf16_mma.cuh: the rows GEMV's several-token kernel on tensor cores (device code;
// include from .cu only): gemv_bf16.cu launches it (launch_mma); an experiment in bench/dev may
// instantiate it with other tile and warp counts to compare.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/load_stream.cuh"
#include "gpu_core/mma.cuh"
#include "gpu_core/pdl.cuh"

namespace tandem::gpu::detail {

// Several tokens (T = 2..8) on tensor cores (mma.cuh): W's rows are A (16 a tile), the tokens B (8
// columns, zeros past T), each x split in two bf16 parts (hi = bf16(x), lo = bf16(x - hi): x to ~2^-17,
// the prefill GEMM's split, gemm.cuh), both parts multiplied: exact products, fp32 sums, ~1e-6 of the
// fp32 reference, and the weights read once with 16-byte loads (the fp32 form above read the
// activations T times per weight vector: at T = 8, 3x the one-token time). A dot product does not care
// in which order its inputs come, so each lane takes its fragments from contiguous memory: in a chunk of
// 64 inputs, lane 4 g + q reads inputs [16 q, 16 q + 16) of rows g and g + 8 of each tile (two 16-byte
// vectors a row) and of token g, and feeds inputs 16 q + 4 s .. + 3 to step s (s < 4) as the fragment
// columns 2q, 2q + 1, 2q + 8, 2q + 9. A block's warps take interleaved chunks of the same MT tiles and
// add their partial tiles in shared memory in warp order, so a token's outputs do not depend on the
// other tokens of the launch. SWIGLU: the input is silu(x) * u, formed as it is read.
template <int MT, bool SWIGLU, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_bf16_mma_kernel(const uint16_t* __restrict__ W, int64_t N, int64_t K, const float* __restrict__ x, const float* __restrict__ u,
                         int T, RowsOut y) {
  __shared__ float part[WARPS][MT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * (16 * MT), chunks = (K + 63) / 64;
  using Tile = TileVectors<MT>;  // [tile][row g, g + 8][first, second 8 inputs]
  const auto load_w = [&](int64_t c, Tile& w) {
    w.fill([&](int mt, int h, int v) {
      const int64_t row = row0 + 16 * mt + g + 8 * h, k = c * 64 + 16 * q + 8 * v;
      return row < N && k < K ? load_stream(reinterpret_cast<const uint4*>(W + row * K + k)) : make_uint4(0u, 0u, 0u, 0u);
    });
  };
  float acc[MT][4] = {};
  stream_chunks<WARPS, Tile>(warp, chunks, load_w, [&](int64_t c, const Tile& w) {
    float xv[16] = {};
    const int64_t k = c * 64 + 16 * q;
    if (g < T) {
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        if (k + 8 * v >= K) continue;
        const float4* xp = reinterpret_cast<const float4*>(x + g * K + k + 8 * v);
        float4 a = __ldg(xp), b = __ldg(xp + 1);
        if constexpr (SWIGLU) {
          const float4* up = reinterpret_cast<const float4*>(u + g * K + k + 8 * v);
          a = swiglu4(a, __ldg(up));
          b = swiglu4(b, __ldg(up + 1));
        }
        const float e[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int i = 0; i < 8; ++i) xv[8 * v + i] = e[i];
      }
    }
    uint32_t bh[8], bl[8];  // step s: b0 = [2s], b1 = [2s + 1]
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      split_bf16(xv[2 * i], xv[2 * i + 1], bh[i], bl[i]);
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int s = 0; s < 4; ++s) {
        const uint4& r0 = w.v[mt][0][s >> 1];
        const uint4& r8 = w.v[mt][1][s >> 1];
        const uint32_t a0 = s & 1 ? r0.z : r0.x, a1 = s & 1 ? r8.z : r8.x, a2 = s & 1 ? r0.w : r0.y, a3 = s & 1 ? r8.w : r8.y;
        mma_bf16(acc[mt], a0, a1, a2, a3, bh[2 * s], bh[2 * s + 1]);
        mma_bf16(acc[mt], a0, a1, a2, a3, bl[2 * s], bl[2 * s + 1]);
      }
  });
  pdl_launch_next();
  sum_warp_tiles<WARPS, MT>(part, acc, warp, lane, [&](int r, int t, float sum) {
    const int64_t row = row0 + r;
    if (row < N && t < T) *y.at(t, row) = sum;
  });
}

}  // namespace tandem::gpu::detail
