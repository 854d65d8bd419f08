// gpu_core/sampling.cu: penalties and top-k of a logits row on the device (see sampling.cuh).
#include <climits>
#include <cmath>

#include "gpu_core/sampling.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;

__global__ void penalise_kernel(float* logits, int64_t V, const Penalty* pen, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const Penalty p = pen[i];
  if (p.id < 0 || p.id >= V) return;
  // LogitPenalty::apply's arithmetic, each step rounded on its own as the host rounds it: a product
  // and difference the compiler fuses into one multiply-add would differ in the last bit.
  const float l = logits[p.id];
  const float scaled = p.rep == 1.0f ? l : l > 0 ? __fdiv_rn(l, p.rep) : __fmul_rn(l, p.rep);
  logits[p.id] = __fsub_rn(scaled, p.sub);
}

// (value, id) a is better than b: larger value, or the same value and a lower id. Taken entries have
// id INT_MAX and lose to everything.
__device__ __forceinline__ bool better(float va, int ia, float vb, int ib) {
  if (ia == INT_MAX) return false;
  if (ib == INT_MAX) return true;
  return va > vb || (va == vb && ia < ib);
}

// Block (b, r) takes entries [b * per, min(n, (b + 1) * per)) of row r of (vals, ids), rows `stride`
// apart (ids == nullptr: the index in the row), and writes its k best, best first, to out_vals /
// out_ids [(r * gridDim.x + b) * k ..); missing ones as (-inf, INT_MAX).
__global__ void __launch_bounds__(kThreads)
    select_kernel(const float* __restrict__ vals, const int32_t* __restrict__ ids, int64_t n, int64_t stride, int64_t per, int k,
                  float* __restrict__ out_vals, int32_t* __restrict__ out_ids) {
  extern __shared__ float sv[];
  auto* si = reinterpret_cast<int32_t*>(sv + per);
  __shared__ float wv[kThreads / 32];
  __shared__ int wi[kThreads / 32], wp[kThreads / 32];
  vals += blockIdx.y * stride;
  if (ids) ids += blockIdx.y * stride;
  const int64_t out = (static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x) * k;
  const int64_t b0 = static_cast<int64_t>(blockIdx.x) * per;
  const int64_t cnt = n - b0 < per ? (n - b0 > 0 ? n - b0 : 0) : per;
  for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x) {
    sv[i] = vals[b0 + i];
    si[i] = ids ? ids[b0 + i] : static_cast<int32_t>(b0 + i);
  }
  __syncthreads();
  for (int r = 0; r < k; ++r) {
    float bv = -INFINITY;
    int bi = INT_MAX, bp = -1;
    for (int64_t i = threadIdx.x; i < cnt; i += blockDim.x)
      if (better(sv[i], si[i], bv, bi)) bv = sv[i], bi = si[i], bp = static_cast<int>(i);
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o), op = __shfl_xor_sync(0xffffffffu, bp, o);
      if (better(ov, oi, bv, bi)) bv = ov, bi = oi, bp = op;
    }
    if ((threadIdx.x & 31) == 0) wv[threadIdx.x >> 5] = bv, wi[threadIdx.x >> 5] = bi, wp[threadIdx.x >> 5] = bp;
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < kThreads / 32; ++w)
        if (better(wv[w], wi[w], bv, bi)) bv = wv[w], bi = wi[w], bp = wp[w];
      out_vals[out + r] = bv;
      out_ids[out + r] = bi;
      if (bp >= 0) si[bp] = INT_MAX;  // taken
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t penalise(float* logits, int64_t V, const Penalty* pen, int n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  penalise_kernel<<<(n + kThreads - 1) / kThreads, kThreads, 0, stream>>>(logits, V, pen, n);
  return cudaGetLastError();
}

cudaError_t top_k_rows(const float* logits, int64_t V, int rows, int k, void* workspace, int32_t* ids, float* vals, cudaStream_t stream) {
  if (k < 1 || k > kMaxTopK || V < k || rows < 1 || rows > kMaxTopKRows) return cudaErrorInvalidValue;
  const int64_t per = (V + kTopKBlocks - 1) / kTopKBlocks;
  if (per * 8 > 48 * 1024) return cudaErrorInvalidValue;  // the slice lives in shared memory
  auto* cand_vals = static_cast<float*>(workspace);  // [rows][kTopKBlocks][k]
  auto* cand_ids = reinterpret_cast<int32_t*>(cand_vals + static_cast<int64_t>(rows) * kTopKBlocks * kMaxTopK);
  select_kernel<<<dim3(kTopKBlocks, rows), kThreads, per * 8, stream>>>(logits, nullptr, V, V, per, k, cand_vals, cand_ids);
  const int64_t n2 = static_cast<int64_t>(kTopKBlocks) * k;
  select_kernel<<<dim3(1, rows), kThreads, n2 * 8, stream>>>(cand_vals, cand_ids, n2, n2, n2, k, vals, ids);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
