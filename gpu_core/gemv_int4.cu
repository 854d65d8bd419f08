// gpu_core/gemv_int4.cu: GPTQ int4 (repacked, see int4_layout.h) x fp16 activations (see gemv.cuh).
//
// LANES threads share one output row; each handles 32 inputs per step (one uint4 of codes). Codes
// become fp16 with the 0x6400 magic (fp16 1024 + q), the zero point is subtracted exactly
// ((1024 + q) - (1024 + z)), products with x are summed in fp16 over those 32 inputs, then scaled
// and accumulated in fp32.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "gpu_core/gemv.cuh"

namespace tandem::gpu {

namespace {

constexpr int kWarpsPerBlock = 8;

__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ __half2 as_half2(uint32_t u) {
  __half2 h;
  static_assert(sizeof(h) == 4);
  memcpy(&h, &u, 4);
  return h;
}

// (q - z) for the input pair (2i, 2i+1) of one code word, exactly, as two fp16 lanes.
__device__ __forceinline__ __half2 dequant_pair(uint32_t word, int i, __half2 zero_1024) {
  return __hsub2(as_half2(((word >> (4 * i)) & 0x000f000fu) | 0x64006400u), zero_1024);
}

template <int TMAX, int LANES, bool kGroupHoldsChunk>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_int4_kernel(Int4View W, const __half* __restrict__ x, int T, float* __restrict__ y) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x & 31, l = lane % LANES;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kRowsPerWarp + lane / LANES;
  const bool valid = row < W.N;
  const int64_t K = W.K, G = K / W.group_size;
  float acc[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  if (valid) {
    const uint4* q = reinterpret_cast<const uint4*>(W.qweight + row * (K / 8));
    const uint16_t* sc = W.scales + row * G;
    const uint8_t* zr = W.zeros + row * G;
    if constexpr (kGroupHoldsChunk) {
      // 32 inputs (one uint4 of codes) per step, all in one group.
      for (int64_t c = l; c < K / 32; c += LANES) {
        const uint4 v = load_stream(q + c);
        const uint32_t words[4] = {v.x, v.y, v.z, v.w};
        const int64_t k0 = c * 32, g = k0 / W.group_size;
        const __half2 z = __half2half2(__ushort_as_half(static_cast<unsigned short>(0x6400 + zr[g])));
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
              const __half2 xv = reinterpret_cast<const __half2*>(x + t * K + k0 + wi * 8)[i];
              part[t] = __hfma2(wv, xv, part[t]);
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
      for (int64_t wdx = l; wdx < K / 8; wdx += LANES) {
        const uint32_t word = __ldg(qw + wdx);
        const int64_t k0 = wdx * 8, g = k0 / W.group_size;
        const __half2 z = __half2half2(__ushort_as_half(static_cast<unsigned short>(0x6400 + zr[g])));
        const float s = __half2float(__ushort_as_half(sc[g]));
#pragma unroll
        for (int t = 0; t < TMAX; ++t) {
          if (t >= T) break;
          __half2 part = __float2half2_rn(0.0f);
#pragma unroll
          for (int i = 0; i < 4; ++i)
            part = __hfma2(dequant_pair(word, i, z), reinterpret_cast<const __half2*>(x + t * K + k0)[i], part);
          const float2 f = __half22float2(part);
          acc[t] += s * (f.x + f.y);
        }
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t >= T) break;
    float v = acc[t];
#pragma unroll
    for (int o = LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (valid && l == 0) y[t * W.N + row] = v;
  }
}

template <int TMAX, int LANES>
cudaError_t launch(const Int4View& W, const __half* x, int T, float* y, cudaStream_t stream) {
  const int64_t rows_per_block = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((W.N + rows_per_block - 1) / rows_per_block)), block(kWarpsPerBlock * 32);
  if (W.group_size % 32 == 0 && W.K % 32 == 0) gemv_int4_kernel<TMAX, LANES, true><<<grid, block, 0, stream>>>(W, x, T, y);
  else gemv_int4_kernel<TMAX, LANES, false><<<grid, block, 0, stream>>>(W, x, T, y);
  return cudaGetLastError();
}

template <int TMAX>
cudaError_t launch_lanes(const Int4View& W, const __half* x, int T, float* y, cudaStream_t stream) {
  // Enough lanes per row to cover the row in few steps, few enough to keep short rows busy.
  const int64_t chunks = W.K % 32 == 0 && W.group_size % 32 == 0 ? W.K / 32 : W.K / 8;
  if (chunks >= 32) return launch<TMAX, 32>(W, x, T, y, stream);
  if (chunks >= 16) return launch<TMAX, 16>(W, x, T, y, stream);
  return launch<TMAX, 8>(W, x, T, y, stream);
}

__global__ void gather_x_half_kernel(const float* __restrict__ x, const int32_t* __restrict__ perm, int64_t K, int T,
                                     __half* __restrict__ out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= K * T) return;
  const int64_t t = i / K, k = i % K;
  out[i] = __float2half_rn(x[t * K + (perm ? perm[k] : k)]);
}

}  // namespace

cudaError_t gemv_int4(const Int4View& W, const uint16_t* x_half, int T, float* y, cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || W.K % 8 != 0 || W.N < 1 || W.group_size % 8 != 0 || W.K % W.group_size != 0)
    return cudaErrorInvalidValue;
  const __half* x = reinterpret_cast<const __half*>(x_half);
  if (T == 1) return launch_lanes<1>(W, x, T, y, stream);
  if (T <= 2) return launch_lanes<2>(W, x, T, y, stream);
  if (T <= 4) return launch_lanes<4>(W, x, T, y, stream);
  return launch_lanes<8>(W, x, T, y, stream);
}

cudaError_t gather_x_half(const float* x, const int32_t* perm, int64_t K, int T, uint16_t* x_half, cudaStream_t stream) {
  const int64_t n = K * T;
  gather_x_half_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, perm, K, T,
                                                                                    reinterpret_cast<__half*>(x_half));
  return cudaGetLastError();
}

}  // namespace tandem::gpu
