// gpu_core/ops.cu: small per-row kernels (see ops.cuh).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "gpu_core/act_quant.cuh"
#include "gpu_core/norm_row.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/pdl.cuh"
#include "gpu_core/topk_warp.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 256;

using detail::block_sum;

__global__ void embed_kernel(const uint16_t* table, int64_t H, const int32_t* ids, float* out) {
  const int t = blockIdx.x;
  const uint16_t* row = table + static_cast<int64_t>(ids[t]) * H;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) out[t * H + i] = __uint_as_float(static_cast<uint32_t>(row[i]) << 16);
}

// y = rmsnorm_zc(h') per row, where h' = hin alone (a == nullptr: rmsnorm_zc) or hin + a (+ s / (1 +
// exp(-gate[row])) added to a first), stored to hout (add_rmsnorm_zc, hout == hin: add_inplace after
// gated_add, then the norm, in one launch with the same operations in the same order per element).
// Each thread holds its elements (i = threadIdx.x + m * blockDim.x, m < PER) in registers: every load
// of the row is issued before any use, so a decode step's single-block norm waits for memory once
// instead of once per element it owns (the stores to hout may alias the loads, so the compiler could
// not batch them in a loop). PER = 0: rows too long for that, plain loops; per element and per thread
// the same operations in the same order either way.
template <int PER>
__global__ void norm_kernel(const float* hin, float* hout, const float* __restrict__ a, const float* __restrict__ s,
                            const float* __restrict__ gate, const float* __restrict__ w, int64_t n, float eps, float* __restrict__ y,
                            QuantX qx) {
  // Every kernel after a norm (the projections, the router, the lm_head, prefill's GEMMs) reads only
  // weights before its wait: it may launch and load while the kernel before this one still runs.
  detail::pdl_enter_next_first();
  const float* hi = hin + blockIdx.x * n;
  float* ho = a ? hout + blockIdx.x * n : nullptr;
  const float* ar = a ? a + blockIdx.x * n : nullptr;
  const float* sr = s ? s + blockIdx.x * n : nullptr;
  float* yr = y + blockIdx.x * n;
  if constexpr (PER == 0) {
    const float sig = s ? 1.0f + expf(-gate[blockIdx.x]) : 1.0f;
    float ss = 0.0f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v = hi[i];
      if (ar) {
        v += sr ? ar[i] + sr[i] / sig : ar[i];
        ho[i] = v;
      }
      ss += v * v;
    }
    const float r = rsqrtf(block_sum(ss) / n + eps);
    const float* hv = ar ? ho : hi;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) yr[i] = hv[i] * r * (1.0f + w[i]);
  } else {
    detail::norm_row<PER>(
        hi, ar, sr, s ? gate + blockIdx.x : nullptr, w, n, eps, [&](int64_t i, float v) { ho[i] = v; }, [&](int64_t i, float v) { yr[i] = v; });
  }
  if (qx.parts) {  // the row quantised for the decode MoE from what the block wrote
    __syncthreads();
    detail::quantise_row(yr, n, qx, blockIdx.x);
  }
}

__global__ void add_kernel(float* h, const float* x, int64_t n) {
  detail::pdl_enter();
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] += x[i];
}

__global__ void silu_mul_kernel(float* g, const float* u, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

// One warp per row (gpu_core/topk_warp.cuh).
__global__ void topk_kernel(const float* logits, int E, int k, int32_t* ids, float* weights) {
  detail::pdl_enter();
  detail::warp_router_topk(logits + static_cast<int64_t>(blockIdx.x) * E, E, k, ids + blockIdx.x * k, weights + blockIdx.x * k);
}

__global__ void gated_add_kernel(float* out, const float* shared, const float* gate, int64_t n) {
  detail::pdl_enter();
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

// sm_90: bulk prefetches of 16 KB (one instruction each, the copy engine of the SM does the rest);
// earlier GPUs: a prefetch a 128-byte line.
constexpr int64_t kPrefetchChunk = 16 * 1024;

__global__ void l2_prefetch_kernel(const char* p, int64_t bytes) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  for (int64_t off = first * kPrefetchChunk; off < bytes; off += stride * kPrefetchChunk) {
    const unsigned n = static_cast<unsigned>(bytes - off < kPrefetchChunk ? bytes - off : kPrefetchChunk);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + off), "r"(n) : "memory");
  }
#else
  for (int64_t off = first * 128; off < bytes; off += stride * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(p + off));
#endif
}

struct CopyBatch {
  CopyRegion r[kCopyRegions];
};

// blockIdx.y: the region; the blocks along x stride over it, 16 bytes a thread where the region's
// addresses and size allow it (uniform per block), else byte by byte.
__global__ void copy_regions_kernel(CopyBatch batch) {
  const CopyRegion& c = batch.r[blockIdx.y];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  if (((reinterpret_cast<uintptr_t>(c.dst) | reinterpret_cast<uintptr_t>(c.src) | static_cast<uintptr_t>(c.bytes)) & 15) == 0) {
    auto* d = static_cast<uint4*>(c.dst);
    const auto* s = static_cast<const uint4*>(c.src);
    for (int64_t i = first; i < c.bytes / 16; i += stride) d[i] = s[i];
  } else {
    auto* d = static_cast<char*>(c.dst);
    const auto* s = static_cast<const char*>(c.src);
    for (int64_t i = first; i < c.bytes; i += stride) d[i] = s[i];
  }
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t embed_bf16(const uint16_t* table, int64_t H, const int32_t* ids, int T, float* out, cudaStream_t s) {
  embed_kernel<<<T, kThreads, 0, s>>>(table, H, ids, out);
  return cudaGetLastError();
}
cudaError_t rmsnorm_zc(const float* x, const float* w, int64_t n, int rows, float eps, float* y, cudaStream_t s, QuantX qx) {
  if (qx.parts && (n % 32 != 0 || !qx.vectors)) return cudaErrorInvalidValue;
  float* none = nullptr;
  return detail::with_norm_per_thread(n, kThreads, [&](auto per) {
    return detail::launch(norm_kernel<per.value>, dim3(rows), dim3(kThreads), 0, s, x, none, none, none, none, w, n, eps, y, qx);
  });
}
cudaError_t add_rmsnorm_zc(float* h, const float* a, const float* shared, const float* gate, const float* w, int64_t n, int rows,
                           float eps, float* y, cudaStream_t s, QuantX qx) {
  if (!a || (shared && !gate) || (qx.parts && (n % 32 != 0 || !qx.vectors))) return cudaErrorInvalidValue;
  return detail::with_norm_per_thread(n, kThreads, [&](auto per) {
    return detail::launch(norm_kernel<per.value>, dim3(rows), dim3(kThreads), 0, s, h, h, a, shared, gate, w, n, eps, y, qx);
  });
}
cudaError_t add_inplace(float* h, const float* x, int64_t n, cudaStream_t s) {
  return detail::launch(add_kernel, dim3(blocks_for(n)), dim3(kThreads), 0, s, h, x, n);
}
cudaError_t silu_mul(float* g, const float* u, int64_t n, cudaStream_t s) {
  silu_mul_kernel<<<blocks_for(n), kThreads, 0, s>>>(g, u, n);
  return cudaGetLastError();
}
cudaError_t router_topk(const float* logits, int E, int k, int rows, int32_t* ids, float* weights, cudaStream_t s) {
  if (E > detail::kRouterMaxExperts || k > detail::kRouterMaxTopK || k < 1 || k > E) return cudaErrorInvalidValue;
  return detail::launch(topk_kernel, dim3(rows), dim3(32), 0, s, logits, E, k, ids, weights);
}
cudaError_t gated_add(float* out, const float* shared, const float* gate, int64_t n, int rows, cudaStream_t s) {
  return detail::launch(gated_add_kernel, dim3(blocks_for(n), rows), dim3(kThreads), 0, s, out, shared, gate, n);
}
cudaError_t argmax_rows(const float* logits, int64_t V, int rows, int32_t* ids, cudaStream_t s) {
  argmax_kernel<<<rows, 1024, 0, s>>>(logits, V, ids);
  return cudaGetLastError();
}

cudaError_t l2_prefetch(const void* p, int64_t bytes, cudaStream_t s) {
  if (!p || bytes < 0) return cudaErrorInvalidValue;
  const auto a = reinterpret_cast<uintptr_t>(p), begin = (a + 15) / 16 * 16, end = (a + static_cast<uintptr_t>(bytes)) / 16 * 16;
  if (end <= begin) return cudaSuccess;
  const int64_t n = static_cast<int64_t>(end - begin);
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(8, (n + 128 * kPrefetchChunk - 1) / (128 * kPrefetchChunk)));
  l2_prefetch_kernel<<<blocks, 128, 0, s>>>(reinterpret_cast<const char*>(begin), n);
  return cudaGetLastError();
}

cudaError_t copy_regions(const CopyRegion* regions, int n, cudaStream_t s) {
  if (n < 0 || (n > 0 && !regions)) return cudaErrorInvalidValue;
  for (int first = 0; first < n; first += kCopyRegions) {
    CopyBatch batch{};
    const int m = std::min(kCopyRegions, n - first);
    int64_t largest = 0;
    for (int i = 0; i < m; ++i) {
      const CopyRegion& c = regions[first + i];
      if (c.bytes < 0 || (c.bytes > 0 && (!c.dst || !c.src))) return cudaErrorInvalidValue;
      batch.r[i] = c;
      largest = std::max(largest, c.bytes);
    }
    if (largest == 0) continue;
    // ~4 blocks of 256 threads a megabyte of the largest region, at most 64 a region
    const unsigned bx = static_cast<unsigned>(std::clamp<int64_t>(largest >> 18, 1, 64));
    copy_regions_kernel<<<dim3(bx, static_cast<unsigned>(m)), kThreads, 0, s>>>(batch);
    if (const cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace tandem::gpu
