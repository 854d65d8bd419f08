// gpu_core/gemm_bf16.cu: prefill GEMM on cuBLAS with split-bf16 activations (see gemm.cuh).
#include <cublas_v2.h>
#include <cuda_bf16.h>

#include "gpu_core/gemm.cuh"

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
  const int blocks = static_cast<int>((n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096);
  split_bf16_kernel<<<blocks, 256, 0, stream>>>(x, n, hi, lo);
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

}  // namespace tandem::gpu
