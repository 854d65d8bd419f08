// gpu_core/gemv_rows8.cu: 8-bit weights (int8 or FP8 E4M3 codes, a scale per row) x fp32 activations,
// one warp per output row (see gemv.cuh), the codes in rows8_layout.h's order.
#include <cuda_runtime.h>

#include "gpu_core/block_reduce.cuh"
#include "gpu_core/fp8.cuh"
#include "gpu_core/gemv.cuh"
#include "gpu_core/int4_row.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/rows8_layout.h"

namespace tandem::gpu {

namespace {

constexpr int kRowsPerBlock = 8;  // one warp a row

// The 4 codes of w as floats (exact): signed bytes, or E4M3 values converted two at a time (fp8.cuh).
template <RowFormat F>
__device__ __forceinline__ void codes4(uint32_t w, float* f) {
  if constexpr (F == RowFormat::Int8) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = static_cast<float>(static_cast<int8_t>((w >> (8 * i)) & 0xffu));
  } else {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const float2 v = detail::fp8x2_to_float2(w >> (16 * i));
      f[2 * i] = v.x, f[2 * i + 1] = v.y;
    }
  }
}

// One warp a row. A lane's first PRE 16-code vectors are loaded before the kernel waits for the one
// before it (pdl.cuh: weights are never written; one token takes every vector of rows up to 4096
// inputs, so a warp waits for memory once), the rest in the loop; the next kernel may launch once every
// block is past its loads. SWIGLU: the input is silu(x) * u, formed as it is read.
template <RowFormat F, int TMAX, int PRE, bool SWIGLU>
__global__ void gemv_rows8_kernel(const uint8_t* __restrict__ q, const float* __restrict__ scales, int64_t N, int64_t K,
                                  const float* __restrict__ x, const float* __restrict__ u, int T, RowsOut y) {
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (row >= N) return;  // whole warps: the shuffles of warp_store_row stay full-warp
  const uint4* w = reinterpret_cast<const uint4*>(q + row * K);
  const int64_t chunks = K / 16;                 // 16 weights a load
  uint4 pre[PRE];
#pragma unroll
  for (int i = 0; i < PRE; ++i) pre[i] = lane + 32 * i < chunks ? detail::load_stream(w + lane + 32 * i) : make_uint4(0u, 0u, 0u, 0u);
  detail::pdl_wait();
  float acc[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  const int64_t whole = K / 512 * 32;  // the 16-code chunks of whole 512-input blocks (rows8_position)
  const auto chunk = [&](int64_t c, const uint4& v) {
    float wf[16];
    codes4<F>(v.x, wf), codes4<F>(v.y, wf + 4), codes4<F>(v.z, wf + 8), codes4<F>(v.w, wf + 12);
    // word i of the chunk: inputs x0 + i * step .. + 3 (in a whole block, chunk c = 32 b + lane holds
    // 512 b + 4 lane + 128 i; past them, in order)
    const int64_t x0 = c < whole ? (c - lane) * 16 + 4 * lane : c * 16;
    const int step = c < whole ? 128 : 4;
#pragma unroll
    for (int t = 0; t < TMAX; ++t) {
      if (t >= T) break;
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        float4 a = __ldg(reinterpret_cast<const float4*>(x + t * K + x0 + i * step));
        if constexpr (SWIGLU) a = detail::swiglu4(a, __ldg(reinterpret_cast<const float4*>(u + t * K + x0 + i * step)));
        acc[t] += wf[4 * i] * a.x + wf[4 * i + 1] * a.y + wf[4 * i + 2] * a.z + wf[4 * i + 3] * a.w;
      }
    }
  };
#pragma unroll
  for (int i = 0; i < PRE; ++i)
    if (lane + 32 * i < chunks) chunk(lane + 32 * i, pre[i]);
#pragma unroll 2
  for (int64_t c = lane + 32 * PRE; c < chunks; c += 32) chunk(c, detail::load_stream(w + c));  // weights: not into L1
  detail::pdl_launch_next();
  detail::warp_store_row<TMAX>(acc, T, scales[row], lane, [&](int t) { return y.at(t, row); });
}

// The kernel for W's format and T (one token: every vector of a row prefetched; several: 4).
template <bool SWIGLU>
cudaError_t launch_rows8(const Rows8View& W, const float* x, const float* u, int T, const RowsOut& y, cudaStream_t stream) {
  const bool i8 = W.format == RowFormat::Int8;
  const auto kernel = T == 1 ? (i8 ? gemv_rows8_kernel<RowFormat::Int8, 1, 8, SWIGLU> : gemv_rows8_kernel<RowFormat::Fp8, 1, 8, SWIGLU>)
                             : (i8 ? gemv_rows8_kernel<RowFormat::Int8, kMaxGemvTokens, 4, SWIGLU>
                                   : gemv_rows8_kernel<RowFormat::Fp8, kMaxGemvTokens, 4, SWIGLU>);
  const dim3 grid(static_cast<unsigned>((W.N + kRowsPerBlock - 1) / kRowsPerBlock)), block(32 * kRowsPerBlock);
  return detail::launch(kernel, grid, block, 0, stream, W.codes, W.scales, W.N, W.K, x, u, T, y);
}

bool rows8_ok(const Rows8View& W, int T) {
  return T >= 1 && T <= kMaxGemvTokens && W.K % 16 == 0 && W.N >= 1 && W.codes && W.scales && W.format != RowFormat::Bf16;
}

}  // namespace

cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, float* y, cudaStream_t stream) {
  return gemv_rows8(W, x, T, RowsOut::one(y, W.N), stream);
}

cudaError_t gemv_rows8(const Rows8View& W, const float* x, int T, const RowsOut& y, cudaStream_t stream) {
  if (!rows8_ok(W, T) || !rows_out_fits(y, W.N)) return cudaErrorInvalidValue;
  return launch_rows8<false>(W, x, nullptr, T, y, stream);
}

cudaError_t gemv_rows8_swiglu(const Rows8View& W, const float* g, const float* u, int T, float* y, cudaStream_t stream) {
  if (!rows8_ok(W, T)) return cudaErrorInvalidValue;
  return launch_rows8<true>(W, g, u, T, RowsOut::one(y, W.N), stream);
}

}  // namespace tandem::gpu
