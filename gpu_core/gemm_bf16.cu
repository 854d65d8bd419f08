// gpu_core/gemm_bf16.cu: prefill GEMM on cuBLAS with split-bf16 activations, for bf16 weights and for
// 8-bit rows (see gemm.cuh).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "gpu_core/fp8.cuh"
#include "gpu_core/gemm.cuh"
#include "gpu_core/rows8_layout.h"

namespace tandem::gpu {

namespace {

__global__ void split_bf16_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ hi,
                                  __nv_bfloat16* __restrict__ lo) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = x[i];
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    hi[i] = h;
    lo[i] = __float2bfloat16_rn(v - __bfloat162float(h));
  }
}

// 8-bit codes [N][K] (rows8_layout.h's order) to bf16 [N][K] in input order, exactly: int8 integers
// (|c| <= 127) and E4M3 values (3 mantissa bits, |v| <= 448) are bf16 values. Four codes a thread: an
// aligned word holds four consecutive inputs.
template <bool Fp8>
__global__ void codes_to_bf16_kernel(const uint8_t* __restrict__ codes, int64_t K, int64_t n4, __nv_bfloat16* __restrict__ out) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n4; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t four = reinterpret_cast<const uint32_t*>(codes)[i];
    const int64_t p = 4 * i % K, k = 4 * i - p + rows8_input(K, p);
    for (int j = 0; j < 4; ++j) {
      const uint32_t c = (four >> (8 * j)) & 0xffu;
      const float v = Fp8 ? detail::fp8_to_float(c) : static_cast<float>(static_cast<int8_t>(c));
      out[k + j] = __float2bfloat16_rn(v);
    }
  }
}

// y [T, N] column n times scales[n].
__global__ void scale_columns_kernel(float* __restrict__ y, const float* __restrict__ scales, int64_t N, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) y[i] *= scales[i % N];
}

int grid_for(int64_t n) { return static_cast<int>((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096); }

cudaError_t status(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS ? cudaSuccess : cudaErrorUnknown; }

}  // namespace

cudaError_t blas_create(BlasHandle* handle) { return status(cublasCreate(handle)); }
cudaError_t blas_set_workspace(BlasHandle handle, void* workspace, size_t bytes) {
  return status(cublasSetWorkspace(handle, workspace, bytes));
}
void blas_destroy(BlasHandle handle) {
  if (handle) cublasDestroy(handle);
}

cudaError_t gemm_bf16(BlasHandle handle, const uint16_t* W, int64_t N, int64_t K, const float* x, int64_t T, uint16_t* x_split,
                      float* y, cudaStream_t stream) {
  if (K % 8 != 0) return cudaErrorInvalidValue;
  auto* hi = reinterpret_cast<__nv_bfloat16*>(x_split);
  auto* lo = hi + T * K;
  const int64_t n = T * K;
  split_bf16_kernel<<<grid_for(n), 256, 0, stream>>>(x, n, hi, lo);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = status(cublasSetStream(handle, stream)); e != cudaSuccess) return e;
  // Row-major Y[T,N] = X[T,K] W^T is column-major Y^T[N,T] = op_T(W: KxN) * X^T(KxT).
  const float one = 1.0f, zero = 0.0f;
  for (int part = 0; part < 2; ++part) {
    const cublasStatus_t s = cublasGemmEx(handle, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(N), static_cast<int>(T), static_cast<int>(K),
                                          &one, W, CUDA_R_16BF, static_cast<int>(K), part ? lo : hi, CUDA_R_16BF, static_cast<int>(K),
                                          part ? &one : &zero, y, CUDA_R_32F, static_cast<int>(N), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return cudaErrorUnknown;
  }
  return cudaSuccess;
}

cudaError_t gemm_rows8(BlasHandle handle, const Rows8View& W, const float* x, int64_t T, uint16_t* x_split, uint16_t* w_codes, float* y,
                       cudaStream_t stream) {
  if (W.K % 8 != 0 || (W.format != RowFormat::Int8 && W.format != RowFormat::Fp8)) return cudaErrorInvalidValue;
  const int64_t n4 = W.N * W.K / 4;  // K % 8 == 0: whole 4-byte words
  auto* wb = reinterpret_cast<__nv_bfloat16*>(w_codes);
  if (W.format == RowFormat::Fp8) codes_to_bf16_kernel<true><<<grid_for(n4), 256, 0, stream>>>(W.codes, W.K, n4, wb);
  else codes_to_bf16_kernel<false><<<grid_for(n4), 256, 0, stream>>>(W.codes, W.K, n4, wb);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  if (cudaError_t e = gemm_bf16(handle, w_codes, W.N, W.K, x, T, x_split, y, stream); e != cudaSuccess) return e;
  scale_columns_kernel<<<grid_for(T * W.N), 256, 0, stream>>>(y, W.scales, W.N, T * W.N);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
