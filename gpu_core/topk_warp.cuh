// gpu_core/topk_warp.cuh: the router's softmax + top-k + renormalisation for one row, by one warp
// (device code; include from .cu only). Used by router_topk (ops.cu) and by the router GEMV's last
// block (gemv_bf16_router_topk_norm).
//
// Lane l holds experts l + 32 m (E <= 512). Each of the k rounds takes the warp's largest remaining
// value with one redux over the lanes' best (values as order-preserving integer keys, -0 read as +0)
// and the lowest expert id holding it with a second: ties go to the lower id, as in the reference.
// Weights are exp(v - max) / sum over all E, renormalised over the k chosen.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace tandem::gpu::detail {

constexpr int kRouterMaxExperts = 512, kRouterMaxTopK = 16;

__device__ __forceinline__ uint32_t order_key(float v) {
  const uint32_t b = __float_as_uint(v + 0.0f);  // -0 -> +0: equal values, equal keys
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float from_key(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
}

// logits are read with ld.global.cg (L2): they may have been written by other blocks of the calling
// kernel. Writes ids[0..k) and weights[0..k). All 32 lanes of the warp must call it.
// Each lane's keys are formed once and each lane keeps its best remaining one: a round's two reduxes
// pick the winner, and only the lane that held it scans again. The weights come after the rounds, lane
// j's from round j's value, summed in round order: the numbers a round-by-round exp and sum give.
__device__ __forceinline__ void warp_router_topk(const float* logits, int E, int k, int32_t* ids, float* weights) {
  constexpr unsigned kAll = 0xffffffffu;
  const int lane = threadIdx.x & 31;
  float v[16];
#pragma unroll
  for (int m = 0; m < 16; ++m) v[m] = lane + 32 * m < E ? __ldcg(logits + lane + 32 * m) : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int m = 0; m < 16; ++m) mx = fmaxf(mx, v[m]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kAll, mx, o));
  float z = 0.0f;
#pragma unroll
  for (int m = 0; m < 16; ++m)
    if (lane + 32 * m < E) z += expf(v[m] - mx);
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(kAll, z, o);
  uint32_t key[16];  // 0: no such expert (below every real value's key)
#pragma unroll
  for (int m = 0; m < 16; ++m) key[m] = lane + 32 * m < E ? order_key(v[m]) : 0u;
  uint32_t taken = 0, best = 0;  // bit m: expert lane + 32 m taken; the lane's largest remaining key
  int best_m = 0;
  const auto scan = [&] {  // ascending m: ties keep the lower id
    best = 0;
#pragma unroll
    for (int m = 0; m < 16; ++m)
      if (!((taken >> m) & 1u) && key[m] > best) best = key[m], best_m = m;
  };
  scan();
  uint32_t mine_key = 0;
  int mine_e = 0;  // lane j keeps round j's expert
  for (int j = 0; j < k; ++j) {
    const uint32_t top = __reduce_max_sync(kAll, best);
    const int e = static_cast<int>(__reduce_min_sync(kAll, best == top && best ? static_cast<unsigned>(lane + 32 * best_m) : 0x7fffffffu));
    if (lane == j) mine_key = top, mine_e = e;
    if (e % 32 == lane) {
      taken |= 1u << (e / 32);
      scan();
    }
  }
  const float p = expf(from_key(mine_key) - mx) / z;
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) sum += __shfl_sync(kAll, p, j);
  if (lane < k) {
    ids[lane] = mine_e;
    weights[lane] = p / sum;
  }
}

}  // namespace tandem::gpu::detail
