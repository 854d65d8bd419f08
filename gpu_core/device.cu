// gpu_core/device.cu: device discovery through the CUDA runtime (see device.cuh).
#include "gpu_core/device.cuh"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "gpu_core/smem.cuh"

#ifndef TANDEM_CUDA_ARCHS
#define TANDEM_CUDA_ARCHS "unknown"
#endif

namespace tandem::gpu {

namespace {

__global__ void image_probe_kernel() {}

// Shared memory one block may opt in to, by architecture (the CUDA programming guide's table).
struct ArchLimit {
  int sm, smem_per_block;
};
constexpr ArchLimit kArchLimits[] = {{80, 166912}, {86, 101376}, {87, 166912}, {89, 101376},
                                     {90, 232448}, {100, 232448}, {120, 101376}};

const ArchLimit* arch_limit(int sm) {
  for (const ArchLimit& a : kArchLimits)
    if (a.sm == sm) return &a;
  return nullptr;
}

DeviceCaps compute_caps() {
  DeviceCaps c;
  if (const char* v = std::getenv("TANDEM_MAX_SM"); v && *v) {
    char* end = nullptr;
    const long sm = std::strtol(v, &end, 10);
    if (*end || !arch_limit(static_cast<int>(sm))) {
      std::snprintf(c.error, sizeof(c.error),
                    "TANDEM_MAX_SM='%.32s' is not a CUDA architecture Tandem knows; use one of 80, 86, 87, 89, 90, 100, 120", v);
      return c;
    }
    c.max_sm = static_cast<int>(sm);
  }
  DeviceProbe p;
  gpu_device_probe(&p);
  if (p.device_count == 0) {
    std::snprintf(c.error, sizeof(c.error), "%s", p.reason);
    c.run_on_cpu = true;
    return c;
  }
  const int device_sm = p.cc_major * 10 + p.cc_minor;
  if (device_sm < 80) {
    std::snprintf(c.error, sizeof(c.error),
                  "CUDA device 0, %s, has compute capability %d.%d; Tandem's kernels need 8.0 or later (bf16 tensor cores)",
                  p.name, p.cc_major, p.cc_minor);
    c.run_on_cpu = true;
    return c;
  }
  cudaFuncAttributes fa{};
  if (const cudaError_t e = cudaFuncGetAttributes(&fa, image_probe_kernel); e != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(c.error, sizeof(c.error),
                  "this build has no CUDA kernels for device 0, %s (compute capability %d.%d): it was built for CUDA "
                  "architectures %s (%s); rebuild for this card with `make build CUDA_ARCHS=%d` (or CUDA_ARCHS=native on "
                  "the machine that has it)",
                  p.name, p.cc_major, p.cc_minor, TANDEM_CUDA_ARCHS, cudaGetErrorString(e), device_sm);
    return c;
  }
  int dev = 0, optin = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess ||
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
    cudaGetLastError();
    std::snprintf(c.error, sizeof(c.error), "cannot query CUDA device 0's shared memory per block and multiprocessors");
    return c;
  }
  c.usable = true;
  c.cc_major = p.cc_major;
  c.cc_minor = p.cc_minor;
  c.smem_per_block = optin;
  c.multiprocessors = sms;
  if (c.max_sm && c.max_sm < device_sm) {
    c.cc_major = c.max_sm / 10;
    c.cc_minor = c.max_sm % 10;
    if (arch_limit(c.max_sm)->smem_per_block < c.smem_per_block) c.smem_per_block = arch_limit(c.max_sm)->smem_per_block;
    std::snprintf(c.description, sizeof(c.description), "sm_%d capped by TANDEM_MAX_SM=%d: sm_%d, %d KiB shared memory a block",
                  device_sm, c.max_sm, c.max_sm, c.smem_per_block / 1024);
  } else {
    std::snprintf(c.description, sizeof(c.description), "sm_%d, %d KiB shared memory a block", device_sm, c.smem_per_block / 1024);
  }
  return c;
}

}  // namespace

const DeviceCaps& gpu_device_caps() {
  static const DeviceCaps caps = compute_caps();
  return caps;
}

const char* cuda_architectures_built() { return TANDEM_CUDA_ARCHS; }

cudaError_t opt_in_smem_raw(const void* kernel, size_t dynamic_bytes) {
  const DeviceCaps& caps = gpu_device_caps();
  if (!caps.usable) return cudaErrorNoDevice;
  cudaFuncAttributes fa{};
  if (const cudaError_t e = cudaFuncGetAttributes(&fa, kernel); e != cudaSuccess) return e;
  if (fa.sharedSizeBytes + dynamic_bytes > static_cast<size_t>(caps.smem_per_block)) return cudaErrorInvalidValue;
  if (dynamic_bytes <= 48 * 1024) return cudaSuccess;
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic_bytes));
}

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
