// bench/dev/dev_util.cuh: what the standalone experiments under bench/dev share (include from .cu only):
// a CUDA call checked (exit with the call and its error), the device found or a line saying there is
// none, a host vector uploaded, and a launch timed with events.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define DEV_CK(x)                                                                                \
  do {                                                                                           \
    const cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));   \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

namespace tandem::dev {

// Device 0's properties into *prop; false (after a line naming `program`) when there is no device.
inline bool find_device(const char* program, cudaDeviceProp* prop) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("%s: no CUDA device\n", program);
    return false;
  }
  DEV_CK(cudaGetDeviceProperties(prop, 0));
  return true;
}

template <typename T>
T* upload(const std::vector<T>& v) {
  T* d = nullptr;
  DEV_CK(cudaMalloc(&d, v.size() * sizeof(T)));
  DEV_CK(cudaMemcpy(d, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// Microseconds a call of launch(i) (i = 0, 1, ...: the caller cycles its inputs past the L2), after
// `warmup` untimed calls.
template <typename Launch>
double time_us(Launch&& launch, int warmup, int calls) {
  cudaEvent_t a, b;
  DEV_CK(cudaEventCreate(&a));
  DEV_CK(cudaEventCreate(&b));
  for (int i = 0; i < warmup; ++i) launch(i);
  DEV_CK(cudaEventRecord(a));
  for (int i = 0; i < calls; ++i) launch(i);
  DEV_CK(cudaEventRecord(b));
  DEV_CK(cudaEventSynchronize(b));
  float ms = 0;
  DEV_CK(cudaEventElapsedTime(&ms, a, b));
  DEV_CK(cudaEventDestroy(a));
  DEV_CK(cudaEventDestroy(b));
  DEV_CK(cudaGetLastError());
  return 1000.0 * ms / calls;
}

}  // namespace tandem::dev
