// gpu_core/gemv_int4.cu: GPTQ int4 (repacked, see int4_layout.h) x fp16 activations (see gemv.cuh).
#include "gpu_core/int4_row.cuh"

namespace tandem::gpu {

namespace {

using namespace detail;
constexpr int kWarpsPerBlock = 8;

template <int TMAX, int LANES>
__global__ void __launch_bounds__(kWarpsPerBlock * 32)
    gemv_int4_kernel(Int4View W, const __half* __restrict__ x, int T, float* __restrict__ y) {
  constexpr int kRowsPerWarp = 32 / LANES;
  const int lane = threadIdx.x & 31, l = lane % LANES;
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + (threadIdx.x >> 5)) * kRowsPerWarp + lane / LANES;
  const bool valid = row < W.N;
  float acc[TMAX];
#pragma unroll
  for (int t = 0; t < TMAX; ++t) acc[t] = 0.0f;
  if (valid) int4_row_dot<TMAX, LANES>(W, row, l, x, W.K, T, acc);
#pragma unroll
  for (int t = 0; t < TMAX; ++t) {
    if (t >= T) break;
    const float v = group_sum<LANES>(acc[t]);
    if (valid && l == 0) y[t * W.N + row] = v;
  }
}

template <int TMAX, int LANES>
void launch(const Int4View& W, const __half* x, int T, float* y, cudaStream_t stream) {
  const int64_t rows_per_block = kWarpsPerBlock * (32 / LANES);
  const dim3 grid(static_cast<unsigned>((W.N + rows_per_block - 1) / rows_per_block)), block(kWarpsPerBlock * 32);
  gemv_int4_kernel<TMAX, LANES><<<grid, block, 0, stream>>>(W, x, T, y);
}

template <int TMAX>
void launch_lanes(const Int4View& W, const __half* x, int T, float* y, cudaStream_t stream) {
  switch (lanes_for(W.K)) {
    case 32: return launch<TMAX, 32>(W, x, T, y, stream);
    case 16: return launch<TMAX, 16>(W, x, T, y, stream);
    default: return launch<TMAX, 8>(W, x, T, y, stream);
  }
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
  if (T == 1) launch_lanes<1>(W, x, T, y, stream);
  else if (T <= 2) launch_lanes<2>(W, x, T, y, stream);
  else if (T <= 4) launch_lanes<4>(W, x, T, y, stream);
  else launch_lanes<8>(W, x, T, y, stream);
  return cudaGetLastError();
}

cudaError_t gather_x_half(const float* x, const int32_t* perm, int64_t K, int T, uint16_t* x_half, cudaStream_t stream) {
  const int64_t n = K * T;
  gather_x_half_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(x, perm, K, T, reinterpret_cast<__half*>(x_half));
  return cudaGetLastError();
}

}  // namespace tandem::gpu
