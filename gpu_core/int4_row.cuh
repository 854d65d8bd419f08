// gpu_core/int4_row.cuh: device-side building blocks shared by the int4 kernels (include from .cu only).
//
// int4_row_dot: LANES threads cooperate on one output row of an Int4View (lane `l` of the group);
// each adds its share of sum_k W[row, k] * x_t[k] for t < T into acc[t] (not yet reduced across the
// group: call group_sum). Codes become fp16 with the 0x6400 magic (fp16 1024 + q); the zero point is
// removed exactly ((1024 + q) - (1024 + z)); products with fp16 x are summed in fp16 over at most 32
// inputs, then scaled and accumulated in fp32.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu_core/gemv.cuh"

namespace tandem::gpu::detail {

// Weights are read once: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, 4);
  return h;
}

// (q - z) for the input pair (2i, 2i+1) of one code word, exactly, as two fp16 lanes.
__device__ __forceinline__ __half2 dequant_pair(uint32_t word, int i, __half2 zero_1024) {
  return __hsub2(as_half2(((word >> (4 * i)) & 0x000f000fu) | 0x64006400u), zero_1024);
}

__device__ __forceinline__ __half2 zero_1024(uint8_t z) {
  return __half2half2(__ushort_as_half(static_cast<unsigned short>(0x6400 + z)));
}

// kChunk32: group_size and K are multiples of 32, so one uint4 of codes (32 inputs) has one scale.
template <int TMAX, int LANES, bool kChunk32>
__device__ __forceinline__ void int4_row_dot(const Int4View& W, int64_t row, int l, const __half* __restrict__ x,
                                             int64_t x_stride, int T, float (&acc)[TMAX]) {
  const int64_t K = W.K, G = K / W.group_size;
  const uint16_t* sc = W.scales + row * G;
  const uint8_t* zr = W.zeros + row * G;
  if constexpr (kChunk32) {
    const uint4* q = reinterpret_cast<const uint4*>(W.qweight + row * (K / 8));
    for (int64_t c = l; c < K / 32; c += LANES) {
      const uint4 v = load_stream(q + c);
      const uint32_t words[4] = {v.x, v.y, v.z, v.w};
      const int64_t k0 = c * 32, g = k0 / W.group_size;
      const __half2 z = zero_1024(zr[g]);
      const float s = __half2float(__ushort_as_half(sc[g]));
      __half2 part[TMAX];
#pragma unroll
      for (int t = 0; t < TMAX; ++t) part[t] = __float2half2_rn(0.0f);
#pragma unroll
      for (int wi = 0; wi < 4; ++wi) {
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const __half2 wv = dequant_pair(words[wi], i, z);
#pragma unroll
          for (int t = 0; t < TMAX; ++t) {
            if (t >= T) break;
            part[t] = __hfma2(wv, reinterpret_cast<const __half2*>(x + t * x_stride + k0 + wi * 8)[i], part[t]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        const float2 f = __half22float2(part[t]);
        acc[t] += s * (f.x + f.y);
      }
    }
  } else {
    // Small groups or K not a multiple of 32: one 8-input word per step, scaled per word.
    const uint32_t* qw = W.qweight + row * (K / 8);
    for (int64_t w = l; w < K / 8; w += LANES) {
      const uint32_t word = __ldg(qw + w);
      const int64_t k0 = w * 8, g = k0 / W.group_size;
      const __half2 z = zero_1024(zr[g]);
      const float s = __half2float(__ushort_as_half(sc[g]));
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        __half2 part = __float2half2_rn(0.0f);
#pragma unroll
        for (int i = 0; i < 4; ++i)
          part = __hfma2(dequant_pair(word, i, z), reinterpret_cast<const __half2*>(x + t * x_stride + k0)[i], part);
        const float2 f = __half22float2(part);
        acc[t] += s * (f.x + f.y);
      }
    }
  }
}

// Sum over the LANES consecutive lanes of a group (all 32 lanes of the warp must call it).
template <int LANES>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

inline bool chunk32(int64_t K, int64_t group_size) { return K % 32 == 0 && group_size % 32 == 0; }

// Lanes per row: enough to cover a row in few steps, few enough to keep short rows busy.
inline int lanes_for(int64_t K, int64_t group_size) {
  const int64_t steps = chunk32(K, group_size) ? K / 32 : K / 8;
  return steps >= 32 ? 32 : steps >= 16 ? 16 : 8;
}

}  // namespace tandem::gpu::detail
