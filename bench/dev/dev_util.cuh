// bench/dev/dev_util.cuh: what the bench/dev experiments share (host code of .cu programs): a CUDA
// call checked, a launch timed with events, buffers copied to and from the device.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define DEV_CK(x)                                                                                \
  do {                                                                                           \
    const cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace tandem::dev {

// Microseconds per call of f(i) over `reps` calls (i = 0, 1, ...), after 8 warm-up calls.
template <typename F>
float time_us(F&& f, int reps) {
  cudaEvent_t a, b;
  cudaEventCreate(&a), cudaEventCreate(&b);
  for (int i = 0; i < 8; ++i) f(i);
  cudaEventRecord(a);
  for (int i = 0; i < reps; ++i) f(i);
  cudaEventRecord(b);
  DEV_CK(cudaEventSynchronize(b));
  float ms = 0;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a), cudaEventDestroy(b);
  return 1000.0f * ms / reps;
}

template <typename T>
T* dev_copy(const std::vector<T>& v) {
  T* p = nullptr;
  DEV_CK(cudaMalloc(&p, v.size() * sizeof(T)));
  DEV_CK(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return p;
}

template <typename T>
std::vector<T> host_copy(const T* p, size_t n) {
  std::vector<T> v(n);
  DEV_CK(cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
  return v;
}

}  // namespace tandem::dev
