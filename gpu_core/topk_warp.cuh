// gpu_core/topk_warp.cuh: the router's softmax + top-k + renormalisation for one row, by one warp
// (device code; include from .cu only). Used by router_topk (ops.cu) and by the router GEMV's last
// block (gemv_bf16_router_topk_norm).
//
// Lane l holds experts l + 32 m (E <= 512). Each of the k rounds takes every lane's best remaining
// expert, then the warp's largest value with one redux (values as order-preserving integer keys, -0
// read as +0) and the lowest expert id holding it with a second: ties go to the lower id, as in
// the reference. Weights are exp(v - max) / sum over all E, renormalised over the k chosen.
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
__device__ __forceinline__ void warp_router_topk(const float* logits, int E, int k, int32_t* ids, float* weights) {
  const int lane = threadIdx.x & 31;
  float v[16];
#pragma unroll
  for (int m = 0; m < 16; ++m) v[m] = lane + 32 * m < E ? __ldcg(logits + lane + 32 * m) : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int m = 0; m < 16; ++m) mx = fmaxf(mx, v[m]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float z = 0.0f;
#pragma unroll
  for (int m = 0; m < 16; ++m)
    if (lane + 32 * m < E) z += expf(v[m] - mx);
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  uint32_t taken = 0;  // bit m: expert lane + 32 m taken
  float sum = 0.0f, mine_p = 0.0f;
  int mine_e = 0;  // lane j keeps round j's expert
  for (int j = 0; j < k; ++j) {
    uint32_t key = 0;  // below every real value's key
    int best_e = 0x7fffffff;
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int e = lane + 32 * m;
      if (e >= E || ((taken >> m) & 1u)) continue;
      const uint32_t km = order_key(v[m]);
      if (km > key) key = km, best_e = e;  // ascending e within the lane: ties keep the lower id
    }
    const uint32_t top = __reduce_max_sync(0xffffffffu, key);
    const int e = static_cast<int>(__reduce_min_sync(0xffffffffu, key == top ? static_cast<unsigned>(best_e) : 0x7fffffffu));
    if (e % 32 == lane) taken |= 1u << (e / 32);
    const float p = expf(from_key(top) - mx) / z;
    sum += p;
    if (lane == j) mine_e = e, mine_p = p;
  }
  if (lane < k) {
    ids[lane] = mine_e;
    weights[lane] = mine_p / sum;
  }
}

}  // namespace tandem::gpu::detail
