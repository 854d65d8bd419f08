// gpu_core/gemm.cuh: dense projections for many tokens at once (prefill), on cuBLAS tensor cores.
//
// Contract: y[t * N + n] = sum_k W[n, k] * x[t, k] for t < T; W bf16 row-major [N, K] (nn.Linear
// layout, as in the checkpoint), x and y fp32 row-major [T, K] / [T, N]; device pointers; work queued
// on `stream` through `handle` (cublasSetStream is called); never synchronizes.
// Precision: x is split into two bf16 terms, hi = bf16(x) and lo = bf16(x - hi), and the two bf16 GEMMs
// (fp32 accumulation) are summed, so activations keep ~16 mantissa bits: ~1e-5 relative to the fp32
// reference, like gemv_bf16 (one GEMM of hi alone, the activations rounded to bf16, is ~2e-3 off at
// a projection). Workspace: x_split holds 2 * T * K bf16 values. K % 8 == 0 (16-byte rows for
// tensor-core loads).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/gemv.cuh"
#include "gpu_core/workspace_sizes.h"

struct cublasContext;

namespace tandem::gpu {

using BlasHandle = cublasContext*;

// Create / destroy a cuBLAS handle (status as cudaError_t: cudaErrorUnknown on a cuBLAS failure).
cudaError_t blas_create(BlasHandle* handle);
// Gives the handle a caller-owned workspace (so its memory is inside the caller's budget).
// (kBlasWorkspaceBytes, workspace_sizes.h)
cudaError_t blas_set_workspace(BlasHandle handle, void* workspace, size_t bytes);
void blas_destroy(BlasHandle handle);

cudaError_t gemm_bf16(BlasHandle handle, const uint16_t* W, int64_t N, int64_t K, const float* x, int64_t T, uint16_t* x_split,
                      float* y, cudaStream_t stream);

// The same for 8-bit rows (gemv.cuh's Rows8View: codes [N][K] in rows8_layout.h's order, int8 or FP8
// E4M3, a scale per row):
// y[t * N + n] = scales[n] * sum_k code[n, k] * x[t, k]. Every int8 code and every finite E4M3 value is
// a bf16 value, so the codes become bf16 exactly, in input order (into w_codes, N * K bf16 scratch),
// gemm_bf16 runs on them and each output column takes its row's scale: the precision of gemm_bf16
// (~1e-5 relative to the fp32 reference of the dequantized matrix) at one extra pass over the codes.
cudaError_t gemm_rows8(BlasHandle handle, const Rows8View& W, const float* x, int64_t T, uint16_t* x_split, uint16_t* w_codes, float* y,
                       cudaStream_t stream);

}  // namespace tandem::gpu
