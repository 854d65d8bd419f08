// gpu_core/norm_row.cuh: one row of rmsnorm_zc / add_rmsnorm_zc by one block (device code; include
// from .cu only). Used by the norm kernel (ops.cu) and by the GEMVs that normalise their own input
// (gemv_bf16_router_topk_norm): the same operations in the same order, so the same bits.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "gpu_core/block_reduce.cuh"

namespace tandem::gpu::detail {

// The block's sum of v (every thread gets it), through a shared array of its own.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float red[32];
  return block_sum(v, red);
}

// The arithmetic of norm_row on a thread's loaded elements (hv: h, av / sv: the addends, wv: the norm
// weights; elements past n zero): h' = hv (+ av (+ sv / sig) when add), store_h(i, h'_i) (only with
// add), then store_y(i, y_i). Kernels that load their row another way (from host memory too) share it.
template <int PER, typename StoreH, typename StoreY>
__device__ __forceinline__ void norm_row_loaded(float (&hv)[PER], const float (&av)[PER], const float (&sv)[PER], const float (&wv)[PER],
                                                bool add, bool shared, float sig, int64_t n, float eps, StoreH&& store_h,
                                                StoreY&& store_y) {
  float ss = 0.0f;
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int64_t i = threadIdx.x + m * blockDim.x;
    if (i >= n) continue;
    if (add) {
      hv[m] += shared ? av[m] + sv[m] / sig : av[m];
      store_h(i, hv[m]);
    }
    ss += hv[m] * hv[m];
  }
  const float r = rsqrtf(block_sum(ss) / n + eps);
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int64_t i = threadIdx.x + m * blockDim.x;
    if (i < n) store_y(i, hv[m] * r * (1.0f + wv[m]));
  }
}

// h' = hi (ar == nullptr) or hi + ar (+ sr / sig added to ar first, sig = 1 + exp(-gate[0]): the
// shared expert's gate; gate is read only with sr), y = h' * rsqrt(mean(h'^2) + eps) * (1 + w), for a
// row of n <= PER * blockDim.x: thread t holds elements t + m * blockDim.x in registers, every load
// issued before any use. sig is formed after the row's loads are out: formed before them (as the
// callers did), it held them back by one more round trip to memory. store_h(i, h'_i) (only with ar),
// then store_y(i, y_i).
template <int PER, typename StoreH, typename StoreY>
__device__ __forceinline__ void norm_row(const float* hi, const float* ar, const float* sr, const float* gate, const float* w, int64_t n,
                                         float eps, StoreH&& store_h, StoreY&& store_y) {
  const float g = sr ? *gate : 0.0f;
  float hv[PER], av[PER], sv[PER], wv[PER];
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int64_t i = threadIdx.x + m * blockDim.x;
    const bool in = i < n;
    hv[m] = in ? hi[i] : 0.0f;
    av[m] = in && ar ? ar[i] : 0.0f;
    sv[m] = in && sr ? sr[i] : 0.0f;
    wv[m] = in ? w[i] : 0.0f;
  }
  const float sig = sr ? 1.0f + expf(-g) : 1.0f;
  norm_row_loaded<PER>(hv, av, sv, wv, ar != nullptr, sr != nullptr, sig, n, eps, store_h, store_y);
}

// Host side: returns launch(std::integral_constant<int, PER>) with the elements per thread norm_row
// takes for rows of n over `threads` threads (1, 2, 4, 8 or 16; PER = 0: longer rows, which
// norm_row does not take).
template <typename Launch>
auto with_norm_per_thread(int64_t n, int threads, Launch&& launch) {
  const int64_t per = (n + threads - 1) / threads;
  if (per <= 1) return launch(std::integral_constant<int, 1>{});
  if (per <= 2) return launch(std::integral_constant<int, 2>{});
  if (per <= 4) return launch(std::integral_constant<int, 4>{});
  if (per <= 8) return launch(std::integral_constant<int, 8>{});
  if (per <= 16) return launch(std::integral_constant<int, 16>{});
  return launch(std::integral_constant<int, 0>{});
}

}  // namespace tandem::gpu::detail
