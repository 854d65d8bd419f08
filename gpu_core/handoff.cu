// gpu_core/handoff.cu: mapped-memory handoff kernels (see handoff.cuh).
#include <cuda_runtime.h>

#include "gpu_core/handoff.cuh"

namespace tandem::gpu {

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void __launch_bounds__(kThreads) post_kernel(const float* __restrict__ x, int64_t nx, const int32_t* __restrict__ ids,
                                                        const float* __restrict__ w, int64_t nk, float* hx, int32_t* hids, float* hw,
                                                        unsigned* flag, unsigned value) {
  for (int64_t i = threadIdx.x; i < nx; i += blockDim.x) hx[i] = x[i];
  for (int64_t i = threadIdx.x; i < nk; i += blockDim.x) {
    hids[i] = ids[i];
    hw[i] = w[i];
  }
  __threadfence_system();  // this thread's writes are visible to the host before the flag
  __syncthreads();
  if (threadIdx.x == 0) *reinterpret_cast<volatile unsigned*>(flag) = value;
}

__global__ void __launch_bounds__(kThreads) wait_add_kernel(const unsigned* flag, unsigned value, const float* src, float* __restrict__ dst,
                                                            int64_t n, unsigned* error, int64_t timeout_ns) {
  if (threadIdx.x == 0) {
    const volatile unsigned* f = flag;
    const uint64_t t0 = global_ns();
    while (*f < value) {
      if (static_cast<int64_t>(global_ns() - t0) > timeout_ns) {
        *reinterpret_cast<volatile unsigned*>(error) = value;
        break;
      }
      __nanosleep(256);
    }
    __threadfence_system();  // src is read after the flag
  }
  __syncthreads();
  const volatile float* s = src;  // host memory the host has just written: no stale cached copy
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] += s[i];
}

__global__ void __launch_bounds__(256) read_probe_kernel(const uint4* __restrict__ src, int64_t n, unsigned* sink) {
  constexpr int kInFlight = 8;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  unsigned acc = 0;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; base < n; base += stride * kInFlight) {
    uint4 v[kInFlight];
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) v[j] = base + j * stride < n ? src[base + j * stride] : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int j = 0; j < kInFlight; ++j) acc ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (acc == 0x9e3779b9u) atomicAdd(sink, 1u);  // keeps the loads; almost never writes
}

}  // namespace

cudaError_t read_host_probe(const void* src, int64_t bytes, unsigned* sink, int blocks, cudaStream_t stream) {
  if (!src || bytes < 0 || bytes % 16 || blocks <= 0 || !sink) return cudaErrorInvalidValue;
  read_probe_kernel<<<blocks, 256, 0, stream>>>(static_cast<const uint4*>(src), bytes / 16, sink);
  return cudaGetLastError();
}

cudaError_t host_post(const float* x, int64_t nx, const int32_t* ids, const float* w, int64_t nk, float* hx, int32_t* hids, float* hw,
                      unsigned* flag, unsigned value, cudaStream_t stream) {
  if (nx < 0 || nk < 0 || !flag) return cudaErrorInvalidValue;
  post_kernel<<<1, kThreads, 0, stream>>>(x, nx, ids, w, nk, hx, hids, hw, flag, value);
  return cudaGetLastError();
}

cudaError_t host_wait_add(const unsigned* flag, unsigned value, const float* src, float* dst, int64_t n, unsigned* error,
                          int64_t timeout_ns, cudaStream_t stream) {
  if (n < 0 || !flag || !error || timeout_ns <= 0) return cudaErrorInvalidValue;
  wait_add_kernel<<<1, kThreads, 0, stream>>>(flag, value, src, dst, n, error, timeout_ns);
  return cudaGetLastError();
}

}  // namespace tandem::gpu
