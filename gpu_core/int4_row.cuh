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
#include "gpu_core/load_stream.cuh"

namespace tandem::gpu::detail {

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

__device__ __forceinline__ uint32_t load_stream(const uint32_t* p) {
  uint32_t v;
  asm("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(v) : "l"(p));  // not volatile: free to hoist
  return v;
}

// (a & mask) | magic in one LOP3 (the compiler emits two: an instruction takes one immediate).
template <uint32_t kMask, uint32_t kMagic>
__device__ __forceinline__ uint32_t and_or(uint32_t a) {
  uint32_t r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(r) : "r"(a), "n"(kMask), "n"(kMagic));
  return r;
}

// sum over the word's 8 inputs of (q - z) * x (x: the 8 inputs as 4 fp16 pairs): fp16 products summed
// in fp16 pairs, the two halves added in fp32 (the caller applies the group's scale). The pairs are
// dequant_pair's values in fewer instructions: pairs 2 and 3 come from the word shifted by 8 once;
// pairs 1 and 3 are not shifted down: their nibbles sit in bits 4-7 under the magic, fp16 1024 + 16 q,
// and one fused multiply-add (x 1/16, less 64 + z) gives q - z exactly (codes and zeros below 16).
// z: fp16 1024 + zero in both halves (zero_1024).
__device__ __forceinline__ float word_dot_h2(uint32_t word, const __half2* x, __half2 z) {
  const __half2 sixteenth = __half2half2(__ushort_as_half(0x2c00));                     // fp16 1/16
  const __half2 hi_zero = __hneg2(__hsub2(z, __half2half2(__ushort_as_half(0x6380))));  // -(64 + zero); 0x6380: fp16 960
  const uint32_t shifted = word >> 8;
  const __half2 p0 = __hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(word)), z);
  const __half2 p1 = __hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(word)), sixteenth, hi_zero);
  const __half2 p2 = __hsub2(as_half2(and_or<0x000f000fu, 0x64006400u>(shifted)), z);
  const __half2 p3 = __hfma2(as_half2(and_or<0x00f000f0u, 0x64006400u>(shifted)), sixteenth, hi_zero);
  __half2 part = __hmul2(p0, x[0]);
  part = __hfma2(p1, x[1], part);
  part = __hfma2(p2, x[2], part);
  part = __hfma2(p3, x[3], part);
  const float2 f = __half22float2(part);
  return f.x + f.y;
}

// The same with x read from memory (8 fp16 inputs, 16-byte aligned).
__device__ __forceinline__ float word_dot(uint32_t word, const __half* x, __half2 z) {
  const uint4 xv = *reinterpret_cast<const uint4*>(x);
  const __half2 xh[4] = {as_half2(xv.x), as_half2(xv.y), as_half2(xv.z), as_half2(xv.w)};
  return word_dot_h2(word, xh, z);
}

// Consecutive lanes take consecutive 8-input code words, so both the codes (4 B a lane) and the
// activations (16 B a lane) are contiguous across the warp: few L1 wavefronts per load. (Giving
// each lane 32 inputs instead made activation loads stride 64 B across lanes, and the kernel ran
// at a tenth of the bandwidth.)
template <int TMAX, int LANES>
__device__ __forceinline__ void int4_row_dot(const Int4View& W, int64_t row, int l, const __half* __restrict__ x,
                                             int64_t x_stride, int T, float (&acc)[TMAX]) {
  const int64_t K = W.K, G = K / W.group_size, words = K / 8;
  const uint32_t* qw = W.qweight + row * words;
  const uint16_t* sc = W.scales + row * G;
  const uint8_t* zr = W.zeros + row * G;
  // Issue a batch of code loads before using any, so each lane keeps kBatch requests in flight.
  constexpr int kBatch = 8;
  for (int64_t w0 = l; w0 < words; w0 += kBatch * LANES) {
    uint32_t wd[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t w = w0 + u * LANES;
      wd[u] = w < words ? load_stream(qw + w) : 0u;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t w = w0 + u * LANES;
      if (w >= words) break;
      const int64_t g = (w * 8) / W.group_size;
      const __half2 z = zero_1024(zr[g]);
      const float s = __half2float(__ushort_as_half(sc[g]));
#pragma unroll
      for (int t = 0; t < TMAX; ++t) {
        if (t >= T) break;
        acc[t] += s * word_dot(wd[u], x + t * x_stride + w * 8, z);
      }
    }
  }
}

// Row of the calling thread when a block of WARPS warps covers WARPS * (32 / LANES) consecutive rows.
template <int LANES, int WARPS>
__device__ __forceinline__ int64_t row_of_thread() {
  return (static_cast<int64_t>(blockIdx.x) * WARPS + (threadIdx.x >> 5)) * (32 / LANES) + (threadIdx.x & 31) / LANES;
}

// Sum over the LANES consecutive lanes of a group (all 32 lanes of the warp must call it).
template <int LANES>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Lanes per row: a full warp for real rows, fewer for short ones so lanes are not left idle.
inline int lanes_for(int64_t K) {
  const int64_t words = K / 8;
  return words >= 32 ? 32 : words >= 16 ? 16 : 8;
}

}  // namespace tandem::gpu::detail
