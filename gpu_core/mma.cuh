// gpu_core/mma.cuh: the tensor-core instruction the kernels share (mma.sync m16n8k16, bf16 inputs,
// fp32 accumulation) and the bf16 pair packing its fragments use. Fragment layouts are PTX's: lane
// 4 g + q holds A rows g and g + 8 at columns 2q, 2q + 1 (a0, a1) and 2q + 8, 2q + 9 (a2, a3), B column g
// at rows 2q, 2q + 1 (b0) and 2q + 8, 2q + 9 (b1), and C rows g, g + 8 at columns 2q, 2q + 1.
// Then what the several-token GEMVs on tensor cores (gemv_bf16_mma.cuh, gemv_rows8.cu) share: their
// weights in flight, their chunk loop, their warps' sum and their launch shape.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu_core/device.cuh"
#include "gpu_core/pdl.cuh"

namespace tandem::gpu::detail {

// c += A B for one 16 x 8 tile over 16 inputs; a0..a3: A's registers (rows g / g + 8 at columns 2q.. /
// 2q + 8..: a0 = row g cols 2q.., a1 = row g + 8 cols 2q.., a2 = row g cols 2q + 8.., a3 = row g + 8
// cols 2q + 8..), b0, b1: B's.
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Two bf16 (round to nearest) in one word, `lo` in the low half (the lower column / row of a fragment).
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// x0, x1 as two bf16 pairs whose sum is them to ~2^-17 (the split-bf16 activations of gemm.cuh): hi =
// bf16(x), lo = bf16(x - hi); multiplied by exact bf16 weights on the tensor cores, the products are exact.
__device__ __forceinline__ void split_bf16(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  const float h0 = __bfloat162float(__float2bfloat16_rn(x0)), h1 = __bfloat162float(__float2bfloat16_rn(x1));
  hi = pack_bf16(h0, h1);
  lo = pack_bf16(x0 - h0, x1 - h1);
}

// The same in three pairs, whose sum is x0, x1 to about 2^-27 (x - hi is exact in fp32 and split_bf16
// takes it apart again): times exact bf16 values, fp32's rounding whatever x's size.
__device__ __forceinline__ void split3_bf16(float x0, float x1, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const float h0 = __bfloat162float(__float2bfloat16_rn(x0)), h1 = __bfloat162float(__float2bfloat16_rn(x1));
  hi = pack_bf16(h0, h1);
  split_bf16(x0 - h0, x1 - h1, mid, lo);
}

// The several-token GEMVs' weights in flight (gemv_bf16.cu, gemv_rows8.cu): per 16-row tile, rows g and
// g + 8, two 16-byte vectors each (a struct, so the next pass's copy is one assignment).
template <int MT>
struct TileVectors {
  uint4 v[MT][2][2];  // [tile][row g, g + 8][vector]
  // v[mt][h][j] = at(mt, h, j) for every tile, row and vector
  template <typename At>
  __device__ __forceinline__ void fill(At&& at) {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int j = 0; j < 2; ++j) v[mt][h][j] = at(mt, h, j);
  }
};

// Their loop: a warp's chunks c = warp, warp + WARPS, ... (< chunks) through two register buffers, the
// first two loaded before the PDL wait (weights are never written: they stream while the kernel before
// ends), each refilled with the chunk two on once used; use(c, tile) in chunk order. (Unrolled by two, so
// the buffers stay registers without a copy a chunk: 2-8% on the tall matrices against the copying
// double buffer, bench/results/2026-12-06-stop50-h100.md. Four buffers for the short matrices were 3%
// slower alone and no faster in the step.)
template <int WARPS, typename Tile, typename Load, typename Use>
__device__ __forceinline__ void stream_chunks(int warp, int64_t chunks, Load&& load, Use&& use) {
  Tile w[2];
#pragma unroll
  for (int j = 0; j < 2; ++j)
    if (warp + j * WARPS < chunks) load(warp + j * WARPS, w[j]);
  pdl_wait();
  for (int64_t c0 = warp; c0 < chunks; c0 += 2 * WARPS) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int64_t c = c0 + j * WARPS;
      if (c >= chunks) break;
      use(c, w[j]);
      if (c + 2 * WARPS < chunks) load(c + 2 * WARPS, w[j]);
    }
  }
}

// Their end: a block's WARPS warps each hold partial 16 x 8 tiles acc[MT] (C fragments) over their share of
// the inputs; through shared memory `part`, warp mt sums tile mt's in warp order (so a token's outputs do
// not depend on the launch's other tokens) and calls store(row in the block's rows, token, sum) for each of
// its fragment's four values (rows g, g + 8; tokens 2q, 2q + 1). Ends with the block's barrier behind it.
template <int WARPS, int MT, typename Store>
__device__ __forceinline__ void sum_warp_tiles(float (&part)[WARPS][MT][4][32], const float (&acc)[MT][4], int warp, int lane, Store&& store) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp][mt][i][lane] = acc[mt][i];
  __syncthreads();
  if (warp >= MT) return;
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // c0, c1: row g, tokens 2q, 2q + 1; c2, c3: row g + 8
    float sum = part[0][warp][i][lane];
#pragma unroll
    for (int w2 = 1; w2 < WARPS; ++w2) sum += part[w2][warp][i][lane];
    store(16 * warp + (lane >> 2) + (i >= 2 ? 8 : 0), 2 * (lane & 3) + (i & 1), sum);
  }
}

// Their launch shape for a matrix of N rows, the same for every T (a row's sum order depends on the
// warps, so a token's outputs do not depend on the launch's other tokens): calls launch(tiles a block,
// warps a block) as integral constants. Measured on the 35B's matrices at 2 / 4 / 8 tokens
// (bench/results/2026-12-06-stop50-h100.md, H100):
// - under 8192 rows (the output projections, 128 blocks): one tile a block of 16 warps; 8 warps kept
//   one block an SM and 30% of the DRAM busy;
// - two tiles a block of 8 warps (116-126 registers: two blocks an SM) where those blocks fit one wave of the
//   device (8192 rows: 256 blocks on 132 SMs; 15.8 us against 16.7 for 1 x 16);
// - else one tile a block of 8 warps, which leaves a smaller last wave: DeltaNet's in_proj (12352 rows,
//   1.46 waves of two-tile blocks) 25.0 -> 22.5 us, attention's q/k/v (9216, 1.09 waves) 22.3 -> 20.0,
//   lm_head 338 -> 336 us.
template <typename Launch>
cudaError_t with_mma_shape(int64_t N, Launch&& launch) {
  using One = std::integral_constant<int, 1>;
  using Two = std::integral_constant<int, 2>;
  if (N < 8192) return launch(One{}, std::integral_constant<int, 16>{});
  if ((N + 31) / 32 <= 2 * int64_t{gpu_device_caps().multiprocessors}) return launch(Two{}, std::integral_constant<int, 8>{});
  return launch(One{}, std::integral_constant<int, 8>{});
}

}  // namespace tandem::gpu::detail
