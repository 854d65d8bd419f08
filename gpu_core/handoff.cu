// gpu_core/handoff.cu: mapped-memory handoff kernels (see handoff.cuh).
#include <cuda_runtime.h>

#include "gpu_core/handoff.cuh"
#include "gpu_core/norm_row.cuh"
#include "gpu_core/ops.cuh"
#include "gpu_core/pdl.cuh"

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

// Thread 0 spins until *flag >= value (or the time-out, reported in *error); then the block goes on
// and reads what the host wrote before its flag.
__device__ __forceinline__ void wait_for_host(const unsigned* flag, unsigned value, unsigned* error, int64_t timeout_ns) {
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
    __threadfence_system();  // what the host wrote is read after the flag
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads) wait_add_kernel(const unsigned* flag, unsigned value, const float* src, float* __restrict__ dst,
                                                            int64_t n, unsigned* error, int64_t timeout_ns) {
  wait_for_host(flag, value, error, timeout_ns);
  const volatile float* s = src;  // host memory the host has just written: no stale cached copy
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) dst[i] += s[i];
}

// host_wait_add_rmsnorm_zc, with the norm kernel's block (ops.cu: 256 threads) and its arithmetic
// (norm_row_loaded): every load of the row, the host's included, issued before any use.
constexpr int kNormThreads = 256;

template <int PER>
__global__ void __launch_bounds__(kNormThreads) wait_add_norm_kernel(HostSum host, float* h, const float* a, const float* __restrict__ w,
                                                                     int64_t n, float eps, float* __restrict__ y) {
  detail::pdl_wait();
  detail::pdl_launch_next();  // the next kernel's blocks may load their weights while the host works
  float hv[PER], av[PER], sv[PER], wv[PER];
#pragma unroll
  for (int m = 0; m < PER; ++m) {  // what does not depend on the host first
    const int64_t i = threadIdx.x + m * blockDim.x;
    const bool in = i < n;
    hv[m] = in ? h[i] : 0.0f;
    av[m] = in ? a[i] : 0.0f;
    sv[m] = 0.0f;
    wv[m] = in ? w[i] : 0.0f;
  }
  wait_for_host(host.flag, host.value, host.error, host.timeout_ns);
  const volatile float* s = host.src;
  float sum[PER];
#pragma unroll
  for (int m = 0; m < PER; ++m) {
    const int64_t i = threadIdx.x + m * blockDim.x;
    sum[m] = i < n ? s[i] : 0.0f;
  }
#pragma unroll
  for (int m = 0; m < PER; ++m) av[m] += sum[m];  // host_wait_add's a[i] += src[i]
  detail::norm_row_loaded<PER>(
      hv, av, sv, wv, true, false, 1.0f, n, eps, [&](int64_t i, float v) { h[i] = v; }, [&](int64_t i, float v) { y[i] = v; });
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

cudaError_t host_wait_add_rmsnorm_zc(const HostSum& host, float* h, float* a, const float* w, int64_t n, float eps, float* y,
                                     cudaStream_t stream) {
  if (n < 1 || !host.flag || !host.src || !host.error || host.timeout_ns <= 0 || !h || !a || !w || !y) return cudaErrorInvalidValue;
  return detail::with_norm_per_thread(n, kNormThreads, [&](auto per) {
    if constexpr (per.value > 0) {
      return detail::launch(wait_add_norm_kernel<per.value>, dim3(1), dim3(kNormThreads), 0, stream, host, h, a, w, n, eps, y);
    } else {  // rows over 16 x 256: the two launches
      const cudaError_t e = host_wait_add(host.flag, host.value, host.src, a, n, host.error, host.timeout_ns, stream);
      return e != cudaSuccess ? e : add_rmsnorm_zc(h, a, nullptr, nullptr, w, n, 1, eps, y, stream);
    }
  });
}

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
