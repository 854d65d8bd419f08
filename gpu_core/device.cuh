// gpu_core/device.cuh: which CUDA devices this process can use.
//
// Contract: plain functions, no exceptions, usable from any translation unit (C++ or CUDA).
// gpu_device_probe fills `out` with the device count and, when zero, a human-readable reason
// (no driver, no device, built without CUDA). Thread-safe; each call asks the driver afresh.
#pragma once

namespace tandem::gpu {

struct DeviceProbe {
  int device_count = 0;
  char name[256] = {0};        // name of device 0, when there is one
  unsigned long long total_bytes = 0;  // global memory of device 0
  unsigned long long free_bytes = 0;   // free now on device 0 (creates the CUDA context)
  int cc_major = 0, cc_minor = 0;
  char reason[256] = {0};      // why device_count is 0
};

void gpu_device_probe(DeviceProbe* out);

// Page-locks host memory [p, p + bytes) for DMA (cudaHostRegister). On failure returns false with the
// driver's reason in `reason` (the memory stays usable, pageable). host_unregister undoes it.
bool host_register(void* p, unsigned long long bytes, char* reason, int reason_len);
void host_unregister(void* p);
// The device's address of page-locked host memory p (registered or cudaHostAlloc'd), for kernels that
// read it in place; nullptr when p is not page-locked (or there is no device).
const void* host_device_pointer(const void* p);

// Programmatic dependent launch (gpu_core/pdl.cuh): while a ProgrammaticLaunchScope made with `on` is
// alive on this thread, the kernels that support it are launched so that each may start while the one
// before it finishes (a device of compute capability 9.0 or later; the caller checks). Scopes nest; the
// flag is per thread, so a step enqueued (or captured) on one thread does not change another's launches.
bool programmatic_launch();
class ProgrammaticLaunchScope {
 public:
  explicit ProgrammaticLaunchScope(bool on);
  ~ProgrammaticLaunchScope();
  ProgrammaticLaunchScope(const ProgrammaticLaunchScope&) = delete;
  ProgrammaticLaunchScope& operator=(const ProgrammaticLaunchScope&) = delete;

 private:
  bool previous_;
};

}  // namespace tandem::gpu
