// gpu_core/ops.cuh: the small element-wise and per-row kernels of the decoder (fp32 activations).
//
// All take device pointers, launch on `stream`, return the launch status. Shapes are [rows, n].
//  embed_bf16:     out[t, :] = fp32(table[ids[t], :])                       (bf16 table [V, H])
//  rmsnorm_zc:     y = x * rsqrt(mean(x^2) + eps) * (1 + w), per row         (y may alias x)
//  add_inplace:    h += x
//  add_rmsnorm_zc: h += a (a + sigmoid(gate[t]) * shared when shared is given), then y = rmsnorm_zc(h):
//                  the residual add (after gated_add) and the next norm in one launch, same numbers
//                  (both: with qx.parts, n a multiple of 32, y also quantised per row for the decode
//                  MoE: workspace_sizes.h's QuantX)
//  silu_mul:       g = silu(g) * u
//  router_topk:    softmax over E logits, top-k (ties to the lower id), renormalised, per row
//  gated_add:      out[t, :] += sigmoid(gate[t]) * shared[t, :]
//  argmax_rows:    ids[t] = argmax(logits[t, :]) (lowest id on ties)
//  l2_prefetch:    asks the L2 cache to load [p, p + bytes) of device memory (reads nothing back, writes
//                  nothing): weights a later kernel streams, fetched while the device waits on something
//                  else. p and bytes are trimmed inward to 16-byte bounds. A hint: the cache may drop it.
//  copy_regions:   n device-to-device copies (non-overlapping) in one launch per kCopyRegions of them:
//                  what n cudaMemcpyAsync calls do, without n launches (a rollback's per-layer states)
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "gpu_core/workspace_sizes.h"

namespace tandem::gpu {

cudaError_t embed_bf16(const uint16_t* table, int64_t H, const int32_t* ids, int T, float* out, cudaStream_t stream);
cudaError_t rmsnorm_zc(const float* x, const float* w, int64_t n, int rows, float eps, float* y, cudaStream_t stream, QuantX qx = {});
cudaError_t add_rmsnorm_zc(float* h, const float* a, const float* shared, const float* gate, const float* w, int64_t n, int rows,
                           float eps, float* y, cudaStream_t stream, QuantX qx = {});
cudaError_t add_inplace(float* h, const float* x, int64_t n, cudaStream_t stream);
cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t stream);
cudaError_t router_topk(const float* logits, int E, int k, int rows, int32_t* ids, float* weights, cudaStream_t stream);
cudaError_t gated_add(float* out, const float* shared, const float* gate, int64_t n, int rows, cudaStream_t stream);
cudaError_t argmax_rows(const float* logits, int64_t V, int rows, int32_t* ids, cudaStream_t stream);
cudaError_t l2_prefetch(const void* p, int64_t bytes, cudaStream_t stream);
struct CopyRegion {
  void* dst;
  const void* src;
  int64_t bytes;
};
inline constexpr int kCopyRegions = 64;
cudaError_t copy_regions(const CopyRegion* regions, int n, cudaStream_t stream);  // regions: a host array

}  // namespace tandem::gpu
