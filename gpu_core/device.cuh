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

// What this process may use of device 0, decided once (the first call creates the CUDA context) and
// read by every launcher and by the runtime's choices (programmatic launch, shared-memory buffers).
// TANDEM_MAX_SM=86 | 89 | ... caps it at that architecture, as TANDEM_MAX_ISA caps the CPU's level: on
// an H200 the runtime then chooses exactly what it would on an RTX 3090 (86) or 4090 (89). What the
// cap cannot change is the instruction set compiled in: for that, build PTX for the smaller
// architecture alone (`make build CUDA_ARCHS=compute_89`; the driver compiles it for the device).
struct DeviceCaps {
  bool usable = false;           // a device this build can run kernels on
  bool run_on_cpu = false;       // not usable, and nothing to rebuild: no device, or one older than sm_80
  int cc_major = 0, cc_minor = 0;  // effective: the device's own, or TANDEM_MAX_SM's when lower
  int smem_per_block = 0;        // largest shared memory one block may use (static + dynamic), bytes, effective
  int multiprocessors = 0;       // the device's SMs (launch shapes that fill a wave)
  int max_sm = 0;                // TANDEM_MAX_SM as read; 0 when unset
  char error[512] = {0};         // when not usable: why, in one line a user can act on
  char description[256] = {0};   // e.g. "sm_90 (capped by TANDEM_MAX_SM=89: sm_89, 99 KiB shared memory a block)"
};
const DeviceCaps& gpu_device_caps();

// The CUDA architectures this build compiled (CMAKE_CUDA_ARCHITECTURES, comma-separated; "" without CUDA).
const char* cuda_architectures_built();

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
