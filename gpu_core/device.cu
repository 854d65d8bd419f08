// gpu_core/device.cu: device discovery through the CUDA runtime (see device.cuh).
#include "gpu_core/device.cuh"

#include <cuda_runtime.h>
#include <cstdio>

namespace tandem::gpu {

void gpu_device_probe(DeviceProbe* out) {
  *out = DeviceProbe{};
  int n = 0;
  cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    std::snprintf(out->reason, sizeof(out->reason), "no CUDA device (%s)", cudaGetErrorString(err));
    cudaGetLastError();  // clear the sticky error so later probes start clean
    return;
  }
  if (n == 0) {
    std::snprintf(out->reason, sizeof(out->reason), "no CUDA device found");
    return;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::snprintf(out->reason, sizeof(out->reason), "cannot query CUDA device 0");
    cudaGetLastError();
    return;
  }
  out->device_count = n;
  std::snprintf(out->name, sizeof(out->name), "%s", prop.name);
  out->total_bytes = prop.totalGlobalMem;
  out->cc_major = prop.major;
  out->cc_minor = prop.minor;
  size_t free_b = 0, total_b = 0;
  if (cudaMemGetInfo(&free_b, &total_b) == cudaSuccess) out->free_bytes = free_b;
  else cudaGetLastError();
}

bool host_register(void* p, unsigned long long bytes, char* reason, int reason_len) {
  const cudaError_t e = cudaHostRegister(p, static_cast<size_t>(bytes), cudaHostRegisterDefault);
  if (e == cudaSuccess) return true;
  if (reason && reason_len > 0) std::snprintf(reason, static_cast<size_t>(reason_len), "%s", cudaGetErrorString(e));
  cudaGetLastError();  // not sticky: clear it
  return false;
}

void host_unregister(void* p) {
  if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
}

const void* host_device_pointer(const void* p) {
  void* d = nullptr;
  if (!p || cudaHostGetDevicePointer(&d, const_cast<void*>(p), 0) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return d;
}

}  // namespace tandem::gpu
