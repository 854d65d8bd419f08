// gpu_core/gemv_rows8.cu: 8-bit weights (int8 or FP8 E4M3 codes, a scale per row) x fp32 activations
// (see gemv.cuh), the codes in rows8_layout.h's order: one token one warp a row, several on tensor cores.
#include <cuda_runtime.h>

#include <type_traits>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/fp8.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/mma.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/rows8_layout.h"
#include "gpu_core/rows8_row.cuh"

namespace tandem::gpu {

namespace {

constexpr int kRowsPerBlock = 8;  // one token: one warp a row

using detail::chunk_inputs;
using detail::ChunkInputs;
using detail::codes4;

// Codes 0, 1 and 2, 3 of w as two bf16 pairs, the lower code in the low half: every int8 and E4M3 value
// has at most 4 significant bits (E4M3) or 7 (int8), so its float's low 16 bits are zero and
// its bf16 is the float's high half, taken by a byte permute.
template <RowFormat F>
__device__ __forceinline__ void codes_bf16(uint32_t w, uint32_t& c01, uint32_t& c23) {
  float f[4];
  codes4<F>(w, f);
  c01 = __byte_perm(__float_as_uint(f[0]), __float_as_uint(f[1]), 0x7632u);
  c23 = __byte_perm(__float_as_uint(f[2]), __float_as_uint(f[3]), 0x7632u);
}

// One token, one warp a row. A lane's first PRE 16-code vectors are loaded before the kernel waits for
// the one before it (pdl.cuh: weights are never written; every vector of rows up to 4096 inputs, so a
// warp waits for memory once), the rest in the loop; the next kernel may launch once every block is past
// its loads (early_next: once every block is past its wait, gemv.cuh). SWIGLU: the input is silu(x) * u,
// formed as it is read.
template <RowFormat F, int PRE, bool SWIGLU>
__global__ void gemv_rows8_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales, int64_t N, int64_t K,
                                  const float* __restrict__ x, const float* __restrict__ u, RowsOut y, bool early_next) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps: the shuffles of warp_store_row stay full-warp
  uint4 pre[PRE];
  detail::rows8_prefetch(q, K, row, lane, pre);
  detail::pdl_wait();
  early_next = early_next && !SWIGLU;  // only the input projections ask it; constant for SwiGLU (76 registers, not 80)
  if (early_next) detail::pdl_launch_next();
  const float acc[1] = {detail::rows8_finish<F, PRE, SWIGLU, false>(q, K, x, u, row, lane, pre)};
  if (!early_next) detail::pdl_launch_next();
  detail::warp_store_row<1>(acc, 1, scales[row], lane, [&](int t) { return y.at(t, row); });
}

// Several tokens (T = 2..8) on tensor cores, as gemv_bf16_mma_kernel (gemv_bf16.cu) does for bf16
// weights: the codes are A, converted exactly to bf16 (an int8 or E4M3 value fits bf16's 8-bit
// significand and its exponent range), the tokens are B, each x split in two bf16 parts (hi = bf16(x), lo =
// bf16(x - hi)) and both multiplied: exact products, fp32 sums, the row's scale applied once to each sum.
// The weights are read once for all tokens and converted once (the one-token kernel's conversion and FMA
// a weight a token made 8 tokens 3x one token's time, slower than bf16's GEMV). A dot product does not
// care in which order its inputs come: in a pass over 128 inputs' worth of codes, lane 4 g + q reads the
// 16-code vectors 8 c + 4 v + q (v < 2) of rows g and g + 8 of each tile and token g's x at those codes'
// inputs (chunk_inputs), and feeds the vector's word i (4 codes) to step i as the fragment columns 2q,
// 2q + 1, 2q + 8, 2q + 9. A block's warps take interleaved passes over the same MT tiles and add their
// partial tiles in shared memory in warp order, so a token's outputs do not depend on the launch's other
// tokens. SWIGLU: the input is silu(x) * u, formed as it is read.
template <RowFormat F, int MT, bool SWIGLU, int WARPS>
__global__ void __launch_bounds__(WARPS * 32)
    gemv_rows8_mma_kernel(const uint8_t* __restrict__ q8, const float* __restrict__ scales, int64_t N, int64_t K, const float* __restrict__ x,
                          const float* __restrict__ u, int T, RowsOut y) {
  __shared__ float part[WARPS][MT][4][32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * (16 * MT), vecs = K / 16, passes = (vecs + 7) / 8;
  using Tile = detail::TileVectors<MT>;  // [tile][row g, g + 8][vector v]
  const auto load_w = [&](int64_t c, Tile& w) {
    w.fill([&](int mt, int h, int v) {
      const int64_t row = row0 + 16 * mt + g + 8 * h, j = 8 * c + 4 * v + q;
      return row < N && j < vecs ? detail::load_stream(reinterpret_cast<const uint4*>(q8 + row * K) + j) : make_uint4(0u, 0u, 0u, 0u);
    });
  };
  float acc[MT][4] = {};
  detail::stream_chunks<WARPS, Tile>(warp, passes, load_w, [&](int64_t c, const Tile& w) {
    uint32_t bh[2][8], bl[2][8];  // vector v, word i: b0 = [2i], b1 = [2i + 1]
#pragma unroll
    for (int v = 0; v < 2; ++v) {
      const int64_t j = 8 * c + 4 * v + q;
      float4 a[4] = {};
      if (g < T && j < vecs) {
        const ChunkInputs in = chunk_inputs(K, j);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          a[i] = __ldg(reinterpret_cast<const float4*>(x + g * K + in.x0 + i * in.step));
          if constexpr (SWIGLU) a[i] = detail::swiglu4(a[i], __ldg(reinterpret_cast<const float4*>(u + g * K + in.x0 + i * in.step)));
        }
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        detail::split_bf16(a[i].x, a[i].y, bh[v][2 * i], bl[v][2 * i]);
        detail::split_bf16(a[i].z, a[i].w, bh[v][2 * i + 1], bl[v][2 * i + 1]);
      }
    }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        const uint4 &c0 = w.v[mt][0][v], &c8 = w.v[mt][1][v];
        const uint32_t r0[4] = {c0.x, c0.y, c0.z, c0.w}, r8[4] = {c8.x, c8.y, c8.z, c8.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          uint32_t a0, a2, a1, a3;  // row g: codes 0, 1 and 2, 3 of word i; row g + 8 the same
          codes_bf16<F>(r0[i], a0, a2);
          codes_bf16<F>(r8[i], a1, a3);
          detail::mma_bf16(acc[mt], a0, a1, a2, a3, bh[v][2 * i], bh[v][2 * i + 1]);
          detail::mma_bf16(acc[mt], a0, a1, a2, a3, bl[v][2 * i], bl[v][2 * i + 1]);
        }
      }
  });
  detail::pdl_launch_next();
  detail::sum_warp_tiles<WARPS, MT>(part, acc, warp, lane, [&](int r, int t, float sum) {
    const int64_t row = row0 + r;
    if (row < N && t < T) *y.at(t, row) = sum * scales[row];
  });
}

// The kernel for W's format and T: one token one warp a row (every vector of rows up to 4096 inputs
// prefetched), several on tensor cores in mma.cuh's with_mma_shape (SwiGLU's too: the fused and the
// two-launch forms sum in one order).
template <bool SWIGLU>
cudaError_t launch_rows8(const Rows8View& W, const float* x, const float* u, int T, const RowsOut& y, cudaStream_t stream,
                         bool early_next = false) {
  const bool i8 = W.format == RowFormat::Int8;
  if (T == 1) {
    const auto kernel = i8 ? gemv_rows8_kernel<RowFormat::Int8, 8, SWIGLU> : gemv_rows8_kernel<RowFormat::Fp8, 8, SWIGLU>;
    const dim3 grid(static_cast<unsigned>((W.N + kRowsPerBlock - 1) / kRowsPerBlock)), block(32 * kRowsPerBlock);
    return detail::launch(kernel, grid, block, 0, stream, W.codes, W.scales, W.N, W.K, x, u, y, early_next);
  }
  return detail::with_mma_shape(W.N, [&](auto mt, auto warps) {
    const auto kernel = i8 ? gemv_rows8_mma_kernel<RowFormat::Int8, mt(), SWIGLU, warps()> : gemv_rows8_mma_kernel<RowFormat::Fp8, mt(), SWIGLU, warps()>;
    const dim3 grid(static_cast<unsigned>((W.N + 16 * mt() - 1) / (16 * mt()))), block(warps() * 32);
    return detail::launch(kernel, grid, block, 0, stream, W.codes, W.scales, W.N, W.K, x, u, T, y);
  });
}

bool rows8_ok(const Rows8View& W, int T) {
  return T >= 1 && T <= kMaxGemvTokens && W.K % 16 == 0 && W.N >= 1 && W.codes && W.scales && W.format != RowFormat::Bf16;
}

}  // namespace

cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, float* y, cudaStream_t stream, bool early_next) {
  return gemv_rows8(W, x, T, RowsOut::one(y, W.N), stream, early_next);
}

cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, const RowsOut& y, cudaStream_t stream, bool early_next) {
  if (!rows8_ok(W, T) || !rows_out_fits(y, W.N)) return cudaErrorInvalidValue;
  return launch_rows8<false>(W, x, nullptr, T, y, stream, early_next);
}

cudaError_t gemv_rows8_swiglu(const Rows8View& W, const float* g, const float* u, int T, float* y, cudaStream_t stream) {
  if (!rows8_ok(W, T)) return cudaErrorInvalidValue;
  return launch_rows8<true>(W, g, u, T, RowsOut::one(y, W.N), stream);
}

}  // namespace tandem::gpu
