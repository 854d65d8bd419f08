// gpu_core/ops.cu: small per-row kernels (see ops.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "gpu_core/ops.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;

__device__ float block_sum(float v) {
  __shared__ float red[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
  __syncthreads();
  float s = 0.0f;
  for (int i = 0; i < static_cast<int>(blockDim.x >> 5); ++i) s += red[i];
  return s;
}

__global__ void embed_kernel(const uint16_t* table, int64_t H, const int32_t* ids, float* out) {
  const int t = blockIdx.x;
  const uint16_t* row = table + static_cast<int64_t>(ids[t]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = __uint_as_float(static_cast<uint32_t>(row[i]) << 16);
}

__global__ void rmsnorm_kernel(const float* x, const float* w, int64_t n, float eps, float* y) {
  const float* xr = x + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
  const float r = rsqrtf(block_sum(ss) / n + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = xr[i] * r * (1.0f + w[i]);
}

// h += a (+ s / (1 + exp(-gate[row])) added to a first), then y = rmsnorm_zc(h): add_inplace (after
// gated_add) and rmsnorm_kernel in one launch, with the same operations in the same order per element.
__global__ void add_rmsnorm_kernel(float* h, const float* a, const float* s, const float* gate, const float* w, int64_t n, float eps,
                                   float* y) {
  float* hr = h + blockIdx.x * n;
  const float* ar = a + blockIdx.x * n;
  float* yr = y + blockIdx.x * n;
  float ss = 0.0f;
  if (s) {
    const float* sr = s + blockIdx.x * n;
    const float g = gate[blockIdx.x];
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      const float t = ar[i] + sr[i] / (1.0f + expf(-g));
      hr[i] += t;
      ss += hr[i] * hr[i];
    }
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      hr[i] += ar[i];
      ss += hr[i] * hr[i];
    }
  }
  const float r = rsqrtf(block_sum(ss) / n + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = hr[i] * r * (1.0f + w[i]);
}

__global__ void add_kernel(float* h, const float* x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] += x[i];
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// One warp per row; k rounds of warp-wide argmax over the remaining experts.
__global__ void topk_kernel(const float* logits, int E, int k, int32_t* ids, float* weights) {
  const float* l = logits + static_cast<int64_t>(blockIdx.x) * E;
  const int lane = threadIdx.x;
  float v[16];  // this lane's logits (experts lane + 32 m, E <= 512), read once
#pragma unroll
  for (int m = 0; m < 16; ++m) v[m] = lane + 32 * m < E ? l[lane + 32 * m] : -INFINITY;
  float mx = -INFINITY;
#pragma unroll
  for (int m = 0; m < 16; ++m) mx = fmaxf(mx, v[m]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float z = 0.0f;
#pragma unroll
  for (int m = 0; m < 16; ++m)
    if (lane + 32 * m < E) z += expf(v[m] - mx);
  for (int o = 16; o > 0; o >>= 1) z += __shfl_xor_sync(0xffffffffu, z, o);
  uint32_t taken = 0;  // bit m: expert lane + 32 m taken
  float sum = 0.0f, chosen_p[16];
  int chosen[16];
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int best_e = 0x7fffffff;
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int e = lane + 32 * m;
      if (e >= E || ((taken >> m) & 1u)) continue;
      if (v[m] > best || (v[m] == best && e < best_e)) best = v[m], best_e = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oe = __shfl_xor_sync(0xffffffffu, best_e, o);
      if (ob > best || (ob == best && oe < best_e)) best = ob, best_e = oe;
    }
    if (best_e % 32 == lane) taken |= 1u << (best_e / 32);
    chosen[j] = best_e;
    chosen_p[j] = expf(best - mx) / z;
    sum += chosen_p[j];
  }
  if (lane == 0)
    for (int j = 0; j < k; ++j) {
      ids[blockIdx.x * k + j] = chosen[j];
      weights[blockIdx.x * k + j] = chosen_p[j] / sum;
    }
}

__global__ void gated_add_kernel(float* out, const float* shared, const float* gate, int64_t n) {
  const int t = blockIdx.y;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[t * n + i] += shared[t * n + i] / (1.0f + expf(-gate[t]));
}

__global__ void argmax_kernel(const float* logits, int64_t V, int32_t* ids) {
  __shared__ float bv[32];
  __shared__ int bi[32];
  const float* l = logits + blockIdx.x * V;
  float best = -INFINITY;
  int best_i = 0x7fffffff;
  for (int64_t i = threadIdx.x; i < V; i += blockDim.x)
    if (l[i] > best) best = l[i], best_i = static_cast<int>(i);  // ascending i: ties keep the lower id
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int oi = __shfl_xor_sync(0xffffffffu, best_i, o);
    if (ob > best || (ob == best && oi < best_i)) best = ob, best_i = oi;
  }
  if ((threadIdx.x & 31) == 0) bv[threadIdx.x >> 5] = best, bi[threadIdx.x >> 5] = best_i;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w)
      if (bv[w] > best || (bv[w] == best && bi[w] < best_i)) best = bv[w], best_i = bi[w];
    ids[blockIdx.x] = best_i;
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t embed_bf16(const uint16_t* table, int64_t H, const int32_t* ids, int T, float* out, cudaStream_t s) {
  embed_kernel<<<T, kThreads, 0, s>>>(table, H, ids, out);
  return cudaGetLastError();
}
cudaError_t rmsnorm_zc(const float* x, const float* w, int64_t n, int rows, float eps, float* y, cudaStream_t s) {
  rmsnorm_kernel<<<rows, kThreads, 0, s>>>(x, w, n, eps, y);
  return cudaGetLastError();
}
cudaError_t add_rmsnorm_zc(float* h, const float* a, const float* shared, const float* gate, const float* w, int64_t n, int rows,
                           float eps, float* y, cudaStream_t s) {
  if (!a || (shared && !gate)) return cudaErrorInvalidValue;
  add_rmsnorm_kernel<<<rows, kThreads, 0, s>>>(h, a, shared, gate, w, n, eps, y);
  return cudaGetLastError();
}
cudaError_t add_inplace(float* h, const float* x, int64_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n), kThreads, 0, s>>>(h, x, n);
  return cudaGetLastError();
}
cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t s) {
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, u, n);
  return cudaGetLastError();
}
cudaError_t router_topk(const float* logits, int E, int k, int rows, int32_t* ids, float* weights, cudaStream_t s) {
  if (E > 512 || k > 16 || k < 1 || k > E) return cudaErrorInvalidValue;
  topk_kernel<<<rows, 32, 0, s>>>(logits, E, k, ids, weights);
  return cudaGetLastError();
}
cudaError_t gated_add(float* out, const float* shared, const float* gate, int64_t n, int rows, cudaStream_t s) {
  gated_add_kernel<<<dim3(blocks_for(n), rows), kThreads, 0, s>>>(out, shared, gate, n);
  return cudaGetLastError();
}
cudaError_t argmax_rows(const float* logits, int64_t V, int rows, int32_t* ids, cudaStream_t s) {
  argmax_kernel<<<rows, 1024, 0, s>>>(logits, V, ids);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
