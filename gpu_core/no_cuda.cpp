// gpu_core/no_cuda.cpp: the device.cuh interface for builds without a CUDA compiler.
#include "gpu_core/device.cuh"

#include <cstdio>

namespace tandem::gpu {

void gpu_device_probe(DeviceProbe* out) {
  *out = DeviceProbe{};
  std::snprintf(out->reason, sizeof(out->reason), "no CUDA device (this build has no CUDA support)");
}

const DeviceCaps& gpu_device_caps() {
  static const DeviceCaps caps = [] {
    DeviceCaps c;
    std::snprintf(c.error, sizeof(c.error), "no CUDA device (this build has no CUDA support)");
    c.run_on_cpu = true;
    return c;
  }();
  return caps;
}

const char* cuda_architectures_built() { return ""; }

}  // namespace tandem::gpu
