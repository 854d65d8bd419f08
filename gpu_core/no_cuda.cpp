// gpu_core/no_cuda.cpp: the device.cuh interface for builds without a CUDA compiler.
#include "gpu_core/device.cuh"

#include <cstdio>

namespace tandem::gpu {

void gpu_device_probe(DeviceProbe* out) {
  *out = DeviceProbe{};
  std::snprintf(out->reason, sizeof(out->reason), "no CUDA device (this build has no CUDA support)");
}

}  // namespace tandem::gpu
