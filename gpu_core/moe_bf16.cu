// gpu_core/moe_bf16.cu: fused routed-expert SwiGLU for decode with bf16 experts (see moe.cuh).
#include <cuda_runtime.h>

#include "gpu_core/int4_row.cuh"
#include "gpu_core/moe.cuh"

namespace tandem::gpu {

namespace {

using detail::group_sum;
constexpr int kWarpsPerBlock = 8;

// LANES threads of one row: each takes 8 consecutive inputs per step (16 B of weights).
template <int LANES>
__device__ __forceinline__ float bf16_row_dot(const uint16_t* __restrict__ w, const float* __restrict__ x, int64_t K, int l) {
  float acc = 0.0f;
  const uint4* w4 = reinterpret_cast<const uint4*>(w);
  for (int64_t c = l; c < K / 8; c += LANES) {
    const uint4 v = __ldg(w4 + c);
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + c * 8)), b = __ldg(reinterpret_cast<const float4*>(x + c * 8 + 4));
    acc += __uint_as_float(v.x << 16) * a.x + __uint_as_float(v.x & 0xffff0000u) * a.y +
           __uint_as_float(v.y << 16) * a.z + __uint_as_float(v.y & 0xffff0000u) * a.w +
           __uint_as_float(v.z << 16) * b.x + __uint_as_float(v.z & 0xffff0000u) * b.y +
           __uint_as_float(v.w << 16) * b.z + __uint_as_float(v.w & 0xffff0000u) * b.w;
  }
  return acc;
}

template <int LANES>
__device__ __forceinline__ int64_t row_of_thread() {
  return (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * (32 / LANES) + (threadIdx.x & 31) / LANES;
}

template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gate_up_kernel(const Bf16Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids, int k,
                   const float* __restrict__ x, float* __restrict__ h) {
  const int p = blockIdx.y, t = p / k, l = (threadIdx.x & 31) % LANES;
  const Bf16Expert ex = experts[ids[p]];
  if (!ex.gate) return;  // not resident on the GPU (hybrid): the CPU computes it
  const int64_t row = row_of_thread<LANES>();
  const bool valid = row < I;
  float g = 0.0f, u = 0.0f;
  if (valid) {
    g = bf16_row_dot<LANES>(ex.gate + row * H, x + t * H, H, l);
    u = bf16_row_dot<LANES>(ex.up + row * H, x + t * H, H, l);
  }
  g = group_sum<LANES>(g);
  u = group_sum<LANES>(u);
  if (valid && l == 0) h[p * I + row] = g / (1.0f + expf(-g)) * u;
}

template <int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    down_kernel(const Bf16Expert* __restrict__ experts, int64_t H, int64_t I, const int32_t* __restrict__ ids,
                const float* __restrict__ weights, int k, const float* __restrict__ h, float* __restrict__ out) {
  const int t = blockIdx.y, l = (threadIdx.x & 31) % LANES;
  const int64_t row = row_of_thread<LANES>();
  const bool valid = row < H;
  float acc = 0.0f;
  if (valid)
    for (int j = 0; j < k; ++j) {
      const int p = t * k + j;
      const uint16_t* down = experts[ids[p]].down;
      if (down) acc += weights[p] * bf16_row_dot<LANES>(down + row * I, h + p * I, I, l);
    }
  acc = group_sum<LANES>(acc);
  if (valid && l == 0) out[t * H + row] = acc;
}

int lanes(int64_t K) { return K / 8 >= 32 ? 32 : K / 8 >= 16 ? 16 : 8; }

template <int LANES>
void launch_gate_up(const Bf16Expert* e, int64_t H, int64_t I, const int32_t* ids, int T, int k, const float* x, float* h,
                    cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  gate_up_kernel<LANES><<<dim3(static_cast<unsigned>((I + rows - 1) / rows), T * k), kWarpsPerBlock * 32, 0, s>>>(e, H, I, ids, k, x, h);
}

template <int LANES>
void launch_down(const Bf16Expert* e, int64_t H, int64_t I, const int32_t* ids, const float* w, int T, int k,
                 const float* h, float* out, cudaStream_t s) {
  const int64_t rows = kWarpsPerBlock * (32 / LANES);
  down_kernel<LANES><<<dim3(static_cast<unsigned>((H + rows - 1) / rows), T), kWarpsPerBlock * 32, 0, s>>>(e, H, I, ids, w, k, h, out);
}

}  // namespace

cudaError_t moe_bf16_decode(const Bf16Expert* experts, int64_t H, int64_t I, const int32_t* ids, const float* weights,
                            int T, int k, const float* x, float* h_scratch, float* out, cudaStream_t stream) {
  if (T < 1 || T > kMaxGemvTokens || k < 1 || H % 8 || I % 8) return cudaErrorInvalidValue;
  switch (lanes(H)) {
    case 32: launch_gate_up<32>(experts, H, I, ids, T, k, x, h_scratch, stream); break;
    case 16: launch_gate_up<16>(experts, H, I, ids, T, k, x, h_scratch, stream); break;
    default: launch_gate_up<8>(experts, H, I, ids, T, k, x, h_scratch, stream);
  }
  switch (lanes(I)) {
    case 32: launch_down<32>(experts, H, I, ids, weights, T, k, h_scratch, out, stream); break;
    case 16: launch_down<16>(experts, H, I, ids, weights, T, k, h_scratch, out, stream); break;
    default: launch_down<8>(experts, H, I, ids, weights, T, k, h_scratch, out, stream);
  }
  return cudaGetLastError();
}

}  // namespace tandem::gpu
